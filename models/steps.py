"""One micro-batch step of a pipeline schedule: its annotations, block keys and grad-sync calls.

:class:`Runner` holds what the three schedules of :mod:`models.schedules` share: it runs a
chunk's forward or backward inside the annotator's ``scope`` and ``block``, names the blocks so
that equal keys mean equal ops, exchanges and waits for p2p tensors as blocks of their own, and
switches overlapped gradient reduction on and off. Keys: a chunk's forward names the chunk (or,
given ``chunk_classes``, its class: chunks built alike share blocks, :mod:`models.chunks`),
whether it waits for overlapped parameter all-gathers (first micro-batch), whether its backward
issues grad reduction (then also the schedule call, :meth:`Runner.key_suffix`) and the input
shape; the first micro-batch's forward names the others' as its ``bare_key``.

Example::

    r = Runner(step, num_microbatches=8, num_chunks=1, comm=None, grad_sync=None)
    out = r.forward(0, 0, None)
    r.backward(0, 0, None, out, None)
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Hashable, Protocol, Sequence

import torch

from heterosim.annotate import get_annotator
from models.ep_overlap import comm_stream, run_step
from models.p2p import PipelineComm

__all__ = ["ForwardStep", "GradSync", "PlanStep", "Runner"]

Tensor = torch.Tensor
_CALLS = itertools.count()  # numbers the runners, one per forward_backward call (Runner.key_suffix)
PlanStep = Callable[..., Any]
"""``plan_step(chunk, mb, input, finish=, stream=)``: the micro-batch as a :class:`models.ep_overlap.ChunkPlan`
(for Megatron-core's combined 1F1B, ``--overlap-moe-expert-parallel-comm``)."""
ForwardStep = Callable[[int, int, "Tensor | None"], Tensor]
"""``forward_step(chunk, mb, input)``: input is None on the first virtual stage (the step makes
its own token ids); returns the chunk output, or the mean loss on the last virtual stage."""


class GradSync(Protocol):
    """What the schedules need from data parallelism (see :class:`models.distributed.ModelGradSync`)."""

    overlap_grad_reduce: bool
    """True when a backward with grad sync enabled issues collectives from grad hooks."""

    align_grad_reduce: bool
    """Megatron's ``align_grad_reduce`` (default True; ``--no-align-grad-reduce`` turns it off)."""

    align_param_gather: bool
    """Megatron's ``align_param_gather``: the interleaved schedule dispatches chunks' gathers ahead."""

    def param_sync_pending(self, chunk: int) -> bool:
        """True when the next forward of ``chunk`` waits for overlapped parameter all-gathers."""
        ...

    def param_sync_done(self, chunk: int) -> None:
        """Called after that forward: its hooks waited the all-gathers (or a capture replayed it)."""
        ...

    def dispatch_param_sync(self, chunk: int) -> None:
        """Megatron's ``param_sync_func[chunk]`` (``align_param_gather``): issue (async) every
        pending parameter all-gather of ``chunk`` that no forward pre-hook has issued yet."""
        ...

    def set_grad_sync(self, enabled: bool) -> None:
        """Megatron's ``no_sync`` switch: grad hooks reduce buckets only while enabled."""
        ...

    def start_grad_sync(self, chunk: int) -> None:
        """Megatron's ``grad_sync_func``: issue (async) the reduction of every bucket of ``chunk``
        that its grad hooks have not issued yet."""
        ...

    def finalize(self) -> None:
        """Megatron's ``finalize_model_grads``: finish DP sync, tied-embedding and SP-norm grads."""
        ...


class Runner:
    """Per-iteration state shared by the three schedules: forward/backward steps with annotations."""

    def __init__(self, forward_step: ForwardStep, num_microbatches: int, num_chunks: int,
                 comm: PipelineComm | None, grad_sync: GradSync | None,
                 chunk_classes: Sequence[int] | None = None, plan_step: PlanStep | None = None) -> None:
        self.forward_step = forward_step
        self.plan_step = plan_step
        self.plans: dict[tuple[int, int], Any] = {}
        """(chunk, micro-batch) -> the :class:`models.ep_overlap.ChunkPlan` of a combined step's forward that ran."""
        self.spare: dict[Hashable, list[Any]] = {}
        """Backward class -> plans whose own backward was a referenced block: they stand in for a
        backward whose forward was referenced (as :attr:`graphs` for plain steps)."""
        self.stream: Any = None
        self.forced: set[int] = set()
        """Combined steps recorded under keys of their own (:meth:`plan_combined`)."""
        self.step_index = 0
        self.classes = list(chunk_classes) if chunk_classes is not None else None
        self.graphs: dict[Hashable, tuple[Tensor | None, Tensor]] = {}
        """Backward key -> (input, output) of a forward that ran with autograd: a referenced
        forward of the same class leaves no graph, and the first backward of its key runs on this."""
        self.m = num_microbatches
        self.vpp = num_chunks
        self.comm = comm
        self.gs = grad_sync
        self.ann = get_annotator()
        self.losses: list[Tensor] = []
        self.call = next(_CALLS)
        self.pp_rank = comm.rank if comm else 0
        self.pp = comm.size if comm else 1

    def first_virtual(self, chunk: int) -> bool:
        return self.pp_rank == 0 and chunk == 0

    def last_virtual(self, chunk: int) -> bool:
        return self.pp_rank == self.pp - 1 and chunk == self.vpp - 1

    @property
    def overlap(self) -> bool:
        return bool(self.gs is not None and self.gs.overlap_grad_reduce)

    def syncs_in_backward(self, mb: int) -> bool:
        """The last micro-batch's backward issues the overlapped grad reduction (a distinct block).

        With pipelining, Megatron (``align_grad_reduce``, its default) lets grad hooks do that
        only on the first stage of 1F1B and never in the interleaved schedule; the other
        stages issue the chunk's reduction from the schedule (``start_grad_sync``).
        """
        if not self.overlap or mb != self.m - 1:
            return False
        if not self.aligned:
            return True  # every stage and chunk reduces from hooks in its last backward
        return self.vpp == 1 and self.pp_rank == 0

    @property
    def aligned(self) -> bool:
        return bool(getattr(self.gs, "align_grad_reduce", True)) and self.pp > 1

    def start_grad_sync(self, chunk: int) -> None:
        if self.overlap:
            assert self.gs is not None
            self.set_grad_sync(True)
            with self.ann.scope(phase="grad_sync", chunk=chunk):
                self.gs.start_grad_sync(chunk)

    def key_suffix(self, mb: int) -> tuple:
        """Per-iteration key part for the micro-batch whose backward issues async grad reduction.

        That backward leaves collectives open when it returns, so a capture re-runs it every
        iteration, and it needs the autograd graph of its own forward: the forward must then be
        re-run as well, so its key (and the backward's) names the iteration's schedule call.
        """
        return (("call", self.call),) if self.syncs_in_backward(mb) else ()

    def _class(self, chunk: int, mb: int) -> Hashable:
        """The chunk as block keys name it: its class when chunks of a class share blocks (not a
        backward that issues grad reduction: it is recorded every time, with its own forward)."""
        if self.classes is None or self.syncs_in_backward(mb):
            return ("chunk", chunk)
        return ("class", self.classes[chunk])

    def forward(self, chunk: int, mb: int, inp: Tensor | None) -> Tensor:
        last = self.last_virtual(chunk)
        # Equal keys <=> equal ops: the chunk (or its class), whether the forward waits for
        # overlapped param all-gathers (first micro-batch), whether its backward is distinct (grad
        # sync), the input.
        gather = bool(self.gs is not None and mb == 0 and self.gs.param_sync_pending(chunk))
        rest = (self.syncs_in_backward(mb), None if inp is None else tuple(inp.shape), *self.key_suffix(mb))
        cls = self._class(chunk, mb)
        key = ("fwd", cls, gather, *rest)
        # Without its waits for the all-gathers, the first micro-batch's forward is the others'.
        bare = ("fwd", cls, False, *rest) if gather else None

        def run(x: Tensor | None) -> Tensor:
            out = self.forward_step(chunk, mb, x)
            # Megatron divides each micro-batch loss by the number of micro-batches (schedules.forward_step).
            return out / self.m if last else out

        with self.ann.scope(phase="fwd", mb=mb, chunk=chunk):
            out = self.ann.block(key, run, inp, bare_key=bare, bare_without="param_gather", any_chunk=True,
                                 shared_waits=gather)
        if out.grad_fn is not None:  # it ran: the first backward of its key may need its graph
            self.graphs.setdefault(self._backward_key(chunk, mb, inp), (inp, out))
        if gather:
            self.gs.param_sync_done(chunk)
        if last:
            self.losses.append(out)
        return out

    def _backward_key(self, chunk: int, mb: int, inp: Tensor | None) -> tuple:
        return ("bwd", self._class(chunk, mb), self.syncs_in_backward(mb), None if inp is None else tuple(inp.shape),
                *self.key_suffix(mb))

    def backward(self, chunk: int, mb: int, inp: Tensor | None, out: Tensor, grad: Tensor | None) -> Tensor | None:
        key = self._backward_key(chunk, mb, inp)
        ran = []

        def run(x: Tensor | None, y: Tensor, dy: Tensor | None) -> Tensor | None:
            ran.append(True)
            stand_in = y.grad_fn is None
            if stand_in:  # a referenced forward: run on the graph of one of its class that ran
                if key not in self.graphs:
                    raise RuntimeError(f"backward {key}: no forward of its class ran with autograd")
                x, y = self.graphs.pop(key)
            else:
                self._forget_graph(key, y)
            if x is not None:
                x.retain_grad()
            torch.autograd.backward(y, grad_tensors=dy)
            if x is None:
                return None
            dx = x.grad
            if stand_in:
                x.grad = None  # the stand-in's input lives on; its gradient is this backward's output
            return dx

        with self.ann.scope(phase="bwd", mb=mb, chunk=chunk):
            dx = self.ann.block(key, run, inp, out, grad, any_chunk=True)
        if not ran and out.grad_fn is not None:
            # A forward that ran, whose backward is a block recorded on another graph: that
            # block's events free what this graph saved; it will never run.
            self._forget_graph(key, out)
            self.ann.discard(out)
        return dx

    def combined(self, f: tuple[int, int, Tensor | None] | None, b: tuple[int, int, Tensor | None] | None,
                 grad: Tensor | None = None, *, every_call: bool = False) -> tuple[Tensor | None, Tensor | None]:
        """One step of Megatron-core's combined 1F1B (:mod:`models.ep_overlap`): the forward of ``f`` =
        (chunk, micro-batch, input) merged with the backward of ``b`` = (chunk, micro-batch, input;
        ``grad`` its output's gradient), either None, as one block -> (``f``'s output, ``b``'s input
        gradient). Keys as :meth:`forward` and :meth:`backward` would give the two halves;
        ``every_call``: recorded every iteration (a later step needs a plan of its forward to run on);
        a step :meth:`plan_combined` forced is recorded under a key of its own."""
        gather = bool(self.gs is not None and f is not None and f[1] == 0 and self.gs.param_sync_pending(f[0]))
        index, self.step_index = self.step_index, self.step_index + 1
        key, bare = self._combined_key(f and f[:2], b and b[:2], gather, every_call, index if index in self.forced else None)
        ran = []

        def run(x: Tensor | None, dy: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
            ran.append(True)
            if self.stream is None:
                self.stream = comm_stream()
            fplan = None
            if f is not None:
                finish = (lambda y: y / self.m) if self.last_virtual(f[0]) else (lambda y: y)
                fplan = self.plan_step(f[0], f[1], x, finish=finish, stream=self.stream)
            bplan = self._backward_plan(b) if b is not None else None
            y, dx = run_step(fplan, bplan, dy)
            if fplan is not None:
                self.plans[(f[0], f[1])] = fplan
            return y, dx

        mb, chunk = (f[1], f[0]) if f is not None else (b[1], b[0])
        with self.ann.scope(mb=mb, chunk=chunk):
            y, dx = self.ann.block(key, run, f[2] if f else None, grad, bare_key=bare if gather else None,
                                   bare_without="param_gather", any_chunk=True, shared_waits=gather)
        if not ran and b is not None and (b[0], b[1]) in self.plans:
            # A forward that ran whose backward was referenced: its plan stands in for a later one.
            self.spare.setdefault(self._class(b[0], b[1]), []).append(self.plans.pop((b[0], b[1])))
        if gather:
            self.gs.param_sync_done(f[0])
        if f is not None and self.last_virtual(f[0]):
            self.losses.append(y.detach())  # its graph would keep the head's detached input alive
        return y, dx

    def _combined_key(self, f: tuple[int, int] | None, b: tuple[int, int] | None, gather: bool, every_call: bool,
                      forced: int | None) -> tuple[tuple, tuple]:
        """(key, bare key) of a combined step; a stage's inputs and output gradients all have one
        shape, so whether there is one (first / last virtual stage) stands for it."""
        fkey = None if f is None else (self._class(*f), self.syncs_in_backward(f[1]), self.first_virtual(f[0]),
                                       *self.key_suffix(f[1]))
        bkey = None if b is None else (self._class(*b), self.syncs_in_backward(b[1]), self.first_virtual(b[0]),
                                       self.last_virtual(b[0]), *self.key_suffix(b[1]))
        rest = (bkey, *((("call", self.call),) if every_call else ()), *((("step", forced),) if forced is not None else ()))
        return ("1f1b", fkey, gather, *rest), ("1f1b", fkey, False, *rest)

    def plan_combined(self, steps: Sequence[tuple[tuple[int, int] | None, tuple[int, int] | None]]) -> None:
        """Before a schedule of combined steps (``(forward, backward)`` as (chunk, micro-batch), in the
        order :meth:`combined` will be called): choose the steps to record under keys of their own.

        A capture records a step once per key and references it afterwards, so a referenced step's
        forward leaves no plan; a recorded step's backward runs on its micro-batch's plan, or on a
        spare one of its class (a plan whose own backward was referenced). Where neither would exist,
        the step that ran that micro-batch's forward is recorded anew (forced), which may force more;
        repeated until every recorded backward has a plan. Assumes every key is new to the capture
        and every step reusable (the interleaved schedule with aligned grad reduction)."""
        pending = {c: bool(self.gs is not None and self.gs.param_sync_pending(c)) for c in range(self.vpp)}
        self.forced, self.step_index = set(), 0
        while (need := self._missing_plan(steps, pending)) is not None:
            if need in self.forced:
                raise RuntimeError(f"combined steps: step {need} is recorded and still leaves no plan")
            self.forced.add(need)

    def _missing_plan(self, steps: Sequence, pending: dict[int, bool]) -> int | None:
        """The step whose forward must be recorded for a recorded backward to have a plan (None: none)."""
        seen: set = set()
        ran_forward: dict[tuple[int, int], int] = {}
        plans: set[tuple[int, int]] = set()
        spare: dict[Hashable, int] = {}
        for i, (f, b) in enumerate(steps):
            gather = bool(f is not None and f[1] == 0 and pending[f[0]])
            key, bare = self._combined_key(f, b, gather, False, i if i in self.forced else None)
            runs = key not in seen
            seen.add(key)
            if runs and gather:
                seen.add(bare)  # the block without its waits, referenced by the others (Annotator.block)
            if f is not None:
                ran_forward[f] = i
            if runs and b is not None:
                if b in plans:
                    plans.remove(b)
                elif spare.get(self._class(*b), 0):
                    spare[self._class(*b)] -= 1
                else:
                    return ran_forward[b]
            elif b is not None and b in plans:
                plans.remove(b)
                spare[self._class(*b)] = spare.get(self._class(*b), 0) + 1
            if runs and f is not None:
                plans.add(f)
        return None

    def _backward_plan(self, b: tuple[int, int, Tensor | None]) -> Any:
        plan = self.plans.pop((b[0], b[1]), None)
        if plan is None:
            spare = self.spare.get(self._class(b[0], b[1]))
            if not spare:
                raise RuntimeError(f"combined step: no forward of chunk {b[0]} micro-batch {b[1]}'s class ran")
            plan = spare.pop()
        return plan

    def drop_plans(self) -> None:
        """Plans whose backward will never run (referenced): their saved tensors are the referenced
        blocks' (:meth:`heterosim.annotate.Annotator.discard`)."""
        for plan in [*self.plans.values(), *(p for ps in self.spare.values() for p in ps)]:
            self.ann.discard(plan.output)
            plan.release()
        self.plans.clear()
        self.spare.clear()

    def _forget_graph(self, key: Hashable, out: Tensor) -> None:
        """``out``'s backward is done (run or referenced): it no longer stands in for its class."""
        if key in self.graphs and self.graphs[key][1] is out:
            del self.graphs[key]

    def set_grad_sync(self, enabled: bool) -> None:
        if self.gs is not None:
            self.gs.set_grad_sync(enabled)

    def finalize(self) -> None:
        self.set_grad_sync(True)
        if self.gs is not None:
            with self.ann.scope(phase="grad_sync"):
                self.gs.finalize()

    def wait(self, reqs: list | None, phase: str, mb: int, chunk: int) -> None:
        """Wait for overlapped p2p requests (a block of its own: it waits for what another issued)."""
        if reqs:
            def run() -> None:
                for req in reqs:
                    req.wait()
            with self.ann.scope(phase=phase, mb=mb, chunk=chunk):
                self.ann.block(("p2p-wait", phase, len(reqs)), run, shared_waits=True)

    def p2p(self, phase: str, mb: int, chunk: int, call: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        # A block: every exchange of one kind (helper, which tensors are present, their shapes)
        # issues the same ops with the same peers, so a capture records it once per kind.
        def sig(v: Any) -> Hashable:
            return ("t", tuple(v.shape)) if isinstance(v, Tensor) else v

        key = ("p2p", phase, getattr(call, "__name__", repr(call)), tuple(map(sig, args)),
               tuple(sorted((k, sig(v)) for k, v in kw.items())))
        with self.ann.scope(phase=phase, mb=mb, chunk=chunk):
            return self.ann.block(key, lambda *a: call(*a, **kw), *args)
