"""Forward-backward schedules of one training iteration: no pipelining, 1F1B, interleaved 1F1B.

The three schedules follow Megatron-LM's ``megatron/core/pipeline_parallel/schedules.py``
(``forward_backward_no_pipelining``, ``forward_backward_pipelining_without_interleaving``,
``forward_backward_pipelining_with_interleaving``) and its ``p2p_communication.py``: the same
warm-up / steady / cool-down counts, the same virtual-stage order, the same p2p pairs issued with
``batch_isend_irecv`` and waited at once, and ``finalize`` (DP reduction, tied embeddings, SP
norms) at the end. Overlapped DP reduction follows Megatron's default ``align_grad_reduce``:
grad hooks reduce buckets during the last micro-batch's backward without pipelining and on the
first 1F1B stage; later stages launch it after their backward, and the interleaved schedule
launches chunk c's reduction ``pp_rank`` backward steps after c's last one, so that all stages
launch it together. Overlapped parameter all-gathers follow ``align_param_gather`` the same way:
the interleaved schedule dispatches chunks 0 and 1 before its first step and chunk c + 1 at the
step where chunk c's first micro-batch runs on stage 0 (``forward_step_helper_preprocess``).

A schedule knows nothing about the model: it calls ``forward_step(chunk, mb, input)`` which
returns the chunk's output (hidden states, or the mean loss on the last virtual stage) and runs
autograd itself. Every micro-batch's forward and backward is wrapped in the annotator's
``scope`` and ``block``; block keys are equal exactly when the ops would be equal (see
``models.steps.Runner.forward``), except that the micro-batch whose backward leaves grad collectives open
is keyed per iteration (``models.steps.Runner.key_suffix``).

Example::

    comm = PipelineComm(group=ps.pp_group, rank=ps.pp_rank, size=ps.pp_size,
                        shape=model.hidden_shape(mbs), dtype=torch.bfloat16)
    losses = forward_backward(step, num_microbatches=8, num_chunks=1, comm=comm, grad_sync=gs)

``--overlap-p2p-communication`` (``PipelineComm.overlap``) runs the interleaved schedule's
overlapped path (:class:`_InterleavedOverlap`); otherwise each p2p exchange is waited right after
it is issued (Megatron's ``batch_p2p_sync``).

Known limitations: no forward-only (evaluation) mode; 1F1B has no overlapped p2p path (Megatron's
non-interleaved schedule has none either); p2p ops keep the batched order (Megatron's overlapped
path issues them one by one, even and odd stages in opposite orders: the same pairs); no variable
sequence lengths.
"""

from __future__ import annotations

from typing import Sequence

import torch

from heterosim.errors import ConfigError
from models.p2p import PipelineComm
from models.steps import ForwardStep, GradSync, PlanStep, Runner

__all__ = [
    "ForwardStep",
    "GradSync",
    "forward_backward",
    "interleaved_order",
    "one_f_one_b_order",
]

Tensor = torch.Tensor


def one_f_one_b_order(pp: int, rank: int, num_microbatches: int) -> list[tuple[str, int]]:
    """The 1F1B compute order on stage ``rank``: [("F", mb) | ("B", mb)].

    (pp - rank - 1) warm-up forwards, then forward/backward pairs, then the cool-down backwards
    (Narayanan et al., SC'21, Fig. 4 top; Megatron ``forward_backward_pipelining_without_interleaving``).
    """
    warmup = min(pp - rank - 1, num_microbatches)
    order = [("F", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(num_microbatches - warmup, num_microbatches)]
    return order


def _chunk_id(k: int, pp: int, vpp: int, forward: bool) -> int:
    """Model chunk of virtual micro-batch ``k`` (Megatron ``get_model_chunk_id``)."""
    chunk = (k % (pp * vpp)) // pp
    return chunk if forward else vpp - chunk - 1


def _mb_in_chunk(k: int, pp: int, vpp: int) -> int:
    """Micro-batch index within its chunk (Megatron ``get_microbatch_id_in_model_chunk``)."""
    return k % pp + (k // (pp * vpp)) * pp


def interleaved_order(pp: int, rank: int, num_microbatches: int, vpp: int) -> list[tuple[str, int, int]]:
    """The interleaved compute order on stage ``rank``: [("F"|"B", chunk, mb)].

    Warm-up = 2 (pp - rank - 1) + (vpp - 1) pp virtual micro-batches (all of them when
    num_microbatches == pp), then one forward and one backward per step, then the cool-down.
    Groups of ``pp`` micro-batches go through chunk 0, 1, ... forward and vpp-1, ..., 0 backward
    (Narayanan et al., SC'21, Sec. 2.2; Megatron ``forward_backward_pipelining_with_interleaving``).
    """
    total = num_microbatches * vpp
    warmup = total if num_microbatches == pp else min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)

    def f(k: int) -> tuple[str, int, int]:
        return ("F", _chunk_id(k, pp, vpp, True), _mb_in_chunk(k, pp, vpp))

    def b(k: int) -> tuple[str, int, int]:
        return ("B", _chunk_id(k, pp, vpp, False), _mb_in_chunk(k, pp, vpp))

    order = [f(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [f(warmup + k), b(k)]
    order += [b(k) for k in range(total - warmup, total)]
    return order


def _no_pipelining(r: Runner) -> None:
    """Megatron ``forward_backward_no_pipelining``: F,B per micro-batch; sync only on the last."""
    r.set_grad_sync(False)
    for mb in range(r.m):
        if mb == r.m - 1:
            r.set_grad_sync(True)
        out = r.forward(0, mb, None)
        r.backward(0, mb, None, out, None)


def _combined_no_pipelining(r: Runner) -> None:
    """Megatron-core ``combined_1f1b_schedule_for_no_pipelining`` (``--overlap-moe-expert-parallel-comm``,
    :mod:`models.ep_overlap`): the first forward alone, then each forward merged with the previous
    micro-batch's backward, then the last backward alone, with grad sync. When that backward issues
    grad reduction (recorded every iteration, on its own forward's plan), the first two steps are
    recorded every iteration too, so that a plan stands in for the backward merged into its forward's step."""
    r.set_grad_sync(False)
    sync = r.syncs_in_backward(r.m - 1)
    r.combined((0, 0, None), None, every_call=sync)
    for mb in range(1, r.m):
        r.combined((0, mb, None), (0, mb - 1, None), every_call=sync and mb == 1)
    r.set_grad_sync(True)
    r.combined(None, (0, r.m - 1, None))
    r.drop_plans()


def _one_f_one_b(r: Runner) -> None:
    """Megatron ``forward_backward_pipelining_without_interleaving``."""
    c = r.comm
    assert c is not None
    m = r.m
    warmup = min(c.size - c.rank - 1, m)
    remaining = m - warmup
    inputs: list[Tensor | None] = []
    outputs: list[Tensor] = []
    r.set_grad_sync(False)
    for i in range(warmup):
        x = r.p2p("fwd", i, 0, c.recv_forward)
        y = r.forward(0, i, x)
        r.p2p("fwd", i, 0, c.send_forward, y)
        inputs.append(x)
        outputs.append(y)
    x = r.p2p("fwd", warmup, 0, c.recv_forward) if remaining > 0 else None
    for i in range(remaining):
        fwd_mb, bwd_mb = warmup + i, i
        last_iteration = i == remaining - 1
        y = r.forward(0, fwd_mb, x)
        dy = r.p2p("fwd", fwd_mb, 0, c.send_forward_recv_backward, y)
        inputs.append(x)
        outputs.append(y)
        bx, by = inputs.pop(0), outputs.pop(0)
        if warmup == 0 and last_iteration and r.syncs_in_backward(bwd_mb):
            r.set_grad_sync(True)
        dx = r.backward(0, bwd_mb, bx, by, dy)
        if last_iteration:
            x = None
            r.p2p("bwd", bwd_mb, 0, c.send_backward, dx)
        else:
            x = r.p2p("bwd", bwd_mb, 0, c.send_backward_recv_forward, dx)
    for i in range(warmup):
        bwd_mb = remaining + i
        if i == warmup - 1 and r.syncs_in_backward(bwd_mb):
            r.set_grad_sync(True)
        dy = r.p2p("bwd", bwd_mb, 0, c.recv_backward)
        dx = r.backward(0, bwd_mb, inputs.pop(0), outputs.pop(0), dy)
        r.p2p("bwd", bwd_mb, 0, c.send_backward, dx)
    # Stages > 0 reduce after their whole backward, in the pipeline bubble (Megatron's
    # "Launch any remaining grad reductions"); on the first stage the hooks already did.
    r.start_grad_sync(0)


class _Interleaved:
    """Megatron ``forward_backward_pipelining_with_interleaving`` (non-overlapped p2p path): warm-up
    forwards, steady forward/backward pairs, cool-down backwards. Step ``k`` runs micro-batch
    ``_mb_in_chunk(k)`` of chunk ``_chunk_id(k)``; each chunk queues its in-flight inputs, outputs
    and output gradients."""

    def __init__(self, r: Runner) -> None:
        c = r.comm
        assert c is not None
        pp, rank, vpp, m = c.size, c.rank, r.vpp, r.m
        self.r, self.c, self.pp, self.rank, self.vpp = r, c, pp, rank, vpp
        self.total = m * vpp
        self.all_warmup = m == pp
        self.warmup = self.total if self.all_warmup else min((pp - rank - 1) * 2 + (vpp - 1) * pp, self.total)
        self.remaining = self.total - self.warmup
        self.inputs: list[list[Tensor | None]] = [[] for _ in range(self.vpp)]
        self.outputs: list[list[Tensor]] = [[] for _ in range(self.vpp)]
        self.grads: list[list[Tensor | None]] = [[] for _ in range(self.vpp)]
        self.synced: set[int] = set()

    def chunk(self, k: int, forward: bool) -> int:
        """The model chunk of step ``k`` of the forward (or backward) order."""
        return _chunk_id(k, self.pp, self.vpp, forward)

    def tag(self, k: int, forward: bool) -> tuple[int, int]:
        """(micro-batch, chunk) of step ``k``, the annotation of its p2p."""
        return _mb_in_chunk(k, self.pp, self.vpp), self.chunk(k, forward)

    def is_last_mb_of_chunk(self, k: int) -> bool:
        """Whether backward step ``k`` is its chunk's last micro-batch."""
        group, in_group = divmod(k, self.pp * self.vpp)
        return group == self.total // (self.pp * self.vpp) - 1 and in_group % self.pp == self.pp - 1

    def dispatch_param_sync(self, chunk: int) -> None:
        """Issue ``chunk``'s overlapped parameter all-gathers ahead of its first forward (aligned)."""
        gs = self.r.gs
        if gs is not None and getattr(gs, "align_param_gather", False) and gs.param_sync_pending(chunk):
            with self.r.ann.scope(phase="fwd", mb=0, chunk=chunk):
                gs.dispatch_param_sync(chunk)

    def is_first_mb_of_chunk(self, k: int) -> bool:
        """Whether forward step ``k`` is its chunk's first micro-batch (Megatron
        ``is_first_microbatch_for_model_chunk``)."""
        return k < self.pp * self.vpp and k % self.pp == 0

    def forward(self, k: int) -> Tensor | None:
        """Forward step ``k`` on its chunk's newest input; queues and returns the output.

        Before it, the parameter all-gathers of chunk c + 1 are dispatched when step
        ``k + pp_rank`` is chunk c's first micro-batch (chunks 0 and 1 go at the start), so every
        stage dispatches a chunk at the same time (Megatron ``forward_step_helper_preprocess``)."""
        chunk, mb, x = self.forward_args(k)
        y = self.r.forward(chunk, mb, x)
        self.outputs[chunk].append(y)
        return y

    def forward_args(self, k: int) -> tuple[int, int, Tensor | None]:
        """(chunk, micro-batch, input) of forward step ``k``, after the parameter all-gathers it dispatches."""
        sync_k = k + self.rank
        if sync_k < self.total and self.is_first_mb_of_chunk(sync_k):
            nxt = self.chunk(sync_k, True) + 1
            if 1 < nxt < self.vpp:
                self.dispatch_param_sync(nxt)
        chunk, mb = self.chunk(k, True), _mb_in_chunk(k, self.pp, self.vpp)
        if self.r.first_virtual(chunk) and len(self.inputs[chunk]) == len(self.outputs[chunk]):
            self.inputs[chunk].append(None)
        return chunk, mb, self.inputs[chunk][-1]

    def backward(self, k: int) -> Tensor | None:
        """Backward step ``k`` on its chunk's oldest micro-batch; launches a finished chunk's
        grad reduction ``pp_rank`` steps later; returns the input gradient."""
        chunk, mb, inp, out, grad = self.backward_args(k)
        dx = self.r.backward(chunk, mb, inp, out, grad)
        self.backward_done(k)
        return dx

    def backward_args(self, k: int) -> tuple[int, int, Tensor | None, Tensor, Tensor | None]:
        """(chunk, micro-batch, input, output, output gradient) of backward step ``k``, dequeued."""
        r = self.r
        chunk, mb = self.chunk(k, False), _mb_in_chunk(k, self.pp, self.vpp)
        if r.syncs_in_backward(mb):  # not aligned: hooks reduce in the chunk's last backward
            r.set_grad_sync(True)
        if r.last_virtual(chunk) and not self.grads[chunk]:
            self.grads[chunk].append(None)
        return chunk, mb, self.inputs[chunk].pop(0), self.outputs[chunk].pop(0), self.grads[chunk].pop(0)

    def backward_done(self, k: int) -> None:
        # Megatron launches a chunk's reduction pp_rank steps after its last backward, so that
        # all stages launch it at the same time (schedules.py, custom grad_sync_func path).
        r = self.r
        sync_k = k - self.rank
        if r.aligned and sync_k >= 0 and self.is_last_mb_of_chunk(sync_k):
            sync_chunk = self.chunk(sync_k, False)
            r.start_grad_sync(sync_chunk)
            self.synced.add(sync_chunk)
        r.set_grad_sync(False)

    def step(self, fk: int, bk: int) -> tuple[Tensor | None, Tensor | None]:
        """A steady step: forward step ``fk``, then backward step ``bk``."""
        return self.forward(fk), self.backward(bk)

    def run(self) -> None:
        """The whole iteration."""
        self.r.set_grad_sync(False)
        for chunk in range(min(2, self.vpp)):  # "Synchronize params for first two model chunks"
            self.dispatch_param_sync(chunk)
        self.inputs[0].append(self.r.p2p("fwd", 0, 0, self.c.recv_forward))
        self.warmup_phase()
        self.steady_phase()
        self.cooldown_phase()
        for chunk in range(self.vpp):  # "Launch any remaining grad reductions."
            if chunk not in self.synced:
                self.r.start_grad_sync(chunk)

    def warmup_phase(self) -> None:
        """Forwards only; the last one also receives the first output gradient (unless all warm-up)."""
        r, c = self.r, self.c
        for k in range(self.warmup):
            y = self.forward(k)
            next_chunk = self.chunk(k + 1, True)
            recv_prev = not (c.is_first and next_chunk == 0) and k != self.total - 1
            if r.last_virtual(self.chunk(k, True)):
                y = None
            if k == self.warmup - 1 and not self.all_warmup:
                x, dy = r.p2p("fwd", *self.tag(k, True), c.communicate, send_next=y,
                              recv_prev=recv_prev, recv_next=not c.is_last)
                self.grads[self.vpp - 1].append(dy)
            else:
                x, _ = r.p2p("fwd", *self.tag(k, True), c.communicate, send_next=y, recv_prev=recv_prev)
            if recv_prev:
                self.inputs[next_chunk].append(x)

    def steady_phase(self) -> None:
        """One forward and one backward per step, their p2p exchanged together."""
        r, c = self.r, self.c
        for k in range(self.remaining):
            fk, bk = k + self.warmup, k
            y, dx = self.step(fk, bk)
            if r.last_virtual(self.chunk(fk, True)):
                y = None
            if r.first_virtual(self.chunk(bk, False)):
                dx = None
            recv_prev, next_f = self.next_forward_chunk(fk)
            recv_next, next_b = self.next_backward_chunk(bk)
            if k == self.remaining - 1:
                recv_prev = False
            x, dy = r.p2p("bwd", *self.tag(bk, False), c.communicate, send_next=y, send_prev=dx,
                          recv_prev=recv_prev, recv_next=recv_next)
            if recv_prev:
                self.inputs[next_f].append(x)
            if recv_next:
                self.grads[next_b].append(dy)

    def next_forward_chunk(self, fk: int) -> tuple[bool, int]:
        """(whether to receive an input, the chunk it is for) after steady forward step ``fk``."""
        if self.c.is_first:
            next_f = self.chunk(fk - (self.pp - 1), True)
            return next_f != self.vpp - 1, next_f + 1
        return True, self.chunk(fk + 1, True)

    def next_backward_chunk(self, bk: int) -> tuple[bool, int]:
        """(whether to receive an output gradient, the chunk it is for) after steady backward step ``bk``."""
        if self.c.is_last:
            next_b = self.chunk(bk - (self.pp - 1), False)
            return next_b != 0, next_b - 1
        return True, self.chunk(bk + 1, False)

    def cooldown_phase(self) -> None:
        """The remaining backwards (all of them when every step was warm-up)."""
        r, c = self.r, self.c
        if self.all_warmup:
            self.grads[self.vpp - 1].append(r.p2p("bwd", 0, self.vpp - 1, c.recv_backward))
        for k in range(self.remaining, self.total):
            dx = self.backward(k)
            if r.first_virtual(self.chunk(k, False)):
                dx = None
            next_b = self.chunk(k + 1, False)
            recv_next = not (c.is_last and next_b == self.vpp - 1) and k != self.total - 1
            _, dy = r.p2p("bwd", *self.tag(k, False), c.communicate, send_prev=dx, recv_next=recv_next)
            if recv_next:
                self.grads[next_b].append(dy)


class _InterleavedOverlap(_Interleaved):
    """The same schedule with ``--overlap-p2p-communication`` (Megatron's ``overlap_p2p_comm``
    path): a forward's send/receive runs under the following backward and a backward's under
    the next forward; each is waited right before the step that needs what it receives. The
    cool-down exchanges synchronously, as Megatron's does."""

    fwd_reqs: list | None = None
    bwd_reqs: list | None = None

    def _wait(self, attr: str, k: int, forward: bool) -> None:
        self.r.wait(getattr(self, attr), "fwd" if forward else "bwd", *self.tag(k, forward))
        setattr(self, attr, None)

    def warmup_phase(self) -> None:
        r, c = self.r, self.c
        for k in range(self.warmup):
            self._wait("fwd_reqs", k, True)
            y = self.forward(k)
            next_chunk = self.chunk(k + 1, True)
            recv_prev = not (c.is_first and next_chunk == 0) and k != self.total - 1
            if r.last_virtual(self.chunk(k, True)):
                y = None
            x, _, self.fwd_reqs = r.p2p("fwd", *self.tag(k, True), c.communicate, send_next=y,
                                        recv_prev=recv_prev, wait=False)
            if k == self.warmup - 1 and not self.all_warmup:
                _, dy, self.bwd_reqs = r.p2p("bwd", *self.tag(k, True), c.communicate,
                                             recv_next=not c.is_last, wait=False)
                self.grads[self.vpp - 1].append(dy)
            if recv_prev:
                self.inputs[next_chunk].append(x)

    def steady_phase(self) -> None:
        for k in range(self.remaining):
            fk, bk = k + self.warmup, k
            self._wait("fwd_reqs", fk, True)
            self.exchange_forward(k, fk, self.forward(fk))
            self._wait("bwd_reqs", bk, False)
            self.exchange_backward(bk, self.backward(bk))

    def exchange_forward(self, k: int, fk: int, y: Tensor | None) -> None:
        """Steady step ``k``'s forward send / receive (forward step ``fk``), left in flight."""
        r, c = self.r, self.c
        if r.last_virtual(self.chunk(fk, True)):
            y = None
        recv_prev, next_f = self.next_forward_chunk(fk)
        if k == self.remaining - 1:
            recv_prev = False
        x, _, self.fwd_reqs = r.p2p("fwd", *self.tag(fk, True), c.communicate, send_next=y,
                                    recv_prev=recv_prev, wait=False)
        if recv_prev:
            self.inputs[next_f].append(x)

    def exchange_backward(self, bk: int, dx: Tensor | None) -> None:
        """Backward step ``bk``'s send / receive, left in flight."""
        r, c = self.r, self.c
        if r.first_virtual(self.chunk(bk, False)):
            dx = None
        recv_next, next_b = self.next_backward_chunk(bk)
        _, dy, self.bwd_reqs = r.p2p("bwd", *self.tag(bk, False), c.communicate, send_prev=dx,
                                     recv_next=recv_next, wait=False)
        if recv_next:
            self.grads[next_b].append(dy)

    def cooldown_phase(self) -> None:
        k = self.remaining
        self._wait("fwd_reqs", max(k - 1 + self.warmup, 0), True)
        self._wait("bwd_reqs", min(k, self.total - 1), False)
        super().cooldown_phase()


class _Combined(_Interleaved):
    """The interleaved schedule with expert-parallel overlap (Megatron-core's
    ``combined_1f1b_schedule_for_interleaved_pipelining`` through ``forward_backward_helper_wrapper``;
    :mod:`models.ep_overlap`): one more warm-up forward ("so that the forward and backward computations
    are independent in all 1F1B steps", ``get_pp_rank_microbatches``), every forward and backward a
    combined step of the runner, a steady step's forward and backward merged into one."""

    def __init__(self, r: Runner) -> None:
        super().__init__(r)
        if r.overlap and not r.aligned:
            raise ConfigError("expert-parallel overlap with --no-align-grad-reduce is not modelled")
        if not self.all_warmup:
            self.warmup = min(self.warmup + 1, self.total)
            self.all_warmup = self.warmup == self.total
            self.remaining = self.total - self.warmup

    def run(self) -> None:
        def at(k: int, forward: bool) -> tuple[int, int]:
            return self.chunk(k, forward), _mb_in_chunk(k, self.pp, self.vpp)

        self.r.plan_combined([(at(k, True), None) for k in range(self.warmup)]
                             + [(at(k + self.warmup, True), at(k, False)) for k in range(self.remaining)]
                             + [(None, at(k, False)) for k in range(self.remaining, self.total)])
        super().run()

    def forward(self, k: int) -> Tensor | None:
        chunk, mb, x = self.forward_args(k)
        y, _ = self.r.combined((chunk, mb, x), None)
        self.outputs[chunk].append(y)
        return y

    def backward(self, k: int) -> Tensor | None:
        chunk, mb, inp, _, grad = self.backward_args(k)
        _, dx = self.r.combined(None, (chunk, mb, inp), grad)
        self.backward_done(k)
        return dx

    def step(self, fk: int, bk: int) -> tuple[Tensor | None, Tensor | None]:
        fc, fmb, x = self.forward_args(fk)
        bc, bmb, inp, _, grad = self.backward_args(bk)
        y, dx = self.r.combined((fc, fmb, x), (bc, bmb, inp), grad)
        self.outputs[fc].append(y)
        self.backward_done(bk)
        return y, dx


class _CombinedOverlap(_Combined, _InterleavedOverlap):
    """:class:`_Combined` with overlapped p2p: a merged step waits for both of its receives first
    (its ``pre_forward`` / ``pre_backward``), then leaves both exchanges in flight (``post_forward`` /
    ``post_backward``)."""

    def steady_phase(self) -> None:
        for k in range(self.remaining):
            fk, bk = k + self.warmup, k
            self._wait("fwd_reqs", fk, True)
            self._wait("bwd_reqs", bk, False)
            y, dx = self.step(fk, bk)
            self.exchange_forward(k, fk, y)
            self.exchange_backward(bk, dx)


def forward_backward(
    forward_step: ForwardStep,
    *,
    num_microbatches: int,
    num_chunks: int = 1,
    comm: PipelineComm | None = None,
    grad_sync: GradSync | None = None,
    chunk_classes: Sequence[int] | None = None,
    plan_step: PlanStep | None = None,
) -> list[Tensor]:
    """Run one iteration's forwards and backwards, then ``grad_sync.finalize()``.

    Picks Megatron's schedule: no pipelining when ``comm`` is None or has one stage, 1F1B for one
    chunk, the interleaved schedule for ``num_chunks`` > 1 (``num_microbatches`` must then be a
    multiple of the pipeline size). Returns the scaled losses of this rank's micro-batches
    (empty unless this rank holds the last virtual stage). ``chunk_classes``: for each chunk, the
    first chunk built like it (:func:`models.chunks.chunk_classes`); a capture then records one
    forward and backward per class instead of per chunk. ``plan_step``: run Megatron-core's
    combined 1F1B on it (expert-parallel overlap, :mod:`models.ep_overlap`).

    Raises:
        ConfigError: bad micro-batch or chunk counts.
    """
    if num_microbatches < 1:
        raise ConfigError(f"num_microbatches must be >= 1, got {num_microbatches}")
    if num_chunks < 1:
        raise ConfigError(f"number of model chunks must be >= 1, got {num_chunks}")
    pp = comm.size if comm is not None else 1
    if num_chunks > 1 and pp == 1:
        raise ConfigError("the interleaved schedule (virtual pipeline stages) needs "
                          "--pipeline-model-parallel-size > 1")
    if num_chunks > 1 and num_microbatches % pp:
        raise ConfigError(
            f"the interleaved schedule needs num_microbatches ({num_microbatches}) to be a multiple "
            f"of the pipeline-parallel size ({pp}); change --global-batch-size or --micro-batch-size"
        )
    if plan_step is not None and pp > 1 and num_chunks == 1:
        raise ConfigError("expert-parallel overlap (the combined 1F1B schedule) with pipelining needs virtual "
                          "pipeline stages (Megatron-core runs it in the interleaved schedule only)")
    runner = Runner(forward_step, num_microbatches, num_chunks, comm if pp > 1 else None, grad_sync,
                     chunk_classes if chunk_classes is not None and len(chunk_classes) == num_chunks else None,
                     plan_step)
    if plan_step is not None and pp == 1:
        _combined_no_pipelining(runner)
    elif plan_step is not None:
        (_CombinedOverlap if comm.overlap else _Combined)(runner).run()
        runner.drop_plans()
    elif pp == 1:
        _no_pipelining(runner)
    elif num_chunks == 1:
        _one_f_one_b(runner)
    else:
        (_InterleavedOverlap if comm is not None and comm.overlap else _Interleaved)(runner).run()
    runner.finalize()
    return runner.losses
