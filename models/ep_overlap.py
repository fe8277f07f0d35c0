"""Expert-parallel overlap: Megatron-core's ``--overlap-moe-expert-parallel-comm`` (combined 1F1B).

One micro-batch's forward runs merged with another's backward, layer by layer, so that the MoE
layers' token exchanges of one hide under the other's computation
(``megatron/core/pipeline_parallel/combined_1f1b.py``,
``megatron/core/models/common/model_chunk_schedule_plan.py``). Each transformer layer is split into
Megatron-core's nodes (``megatron/core/models/gpt/fine_grained_callables.py``):

- ``pre`` (compute stream): attention with its norm and residual, the pre-MLP norm, the router and
  the dispatch preprocessing (permutation), the shared experts; a dense layer's attention half;
- ``dispatch`` (communication stream): the token exchange (all-to-all dispatcher with its TP
  all-gather, or DeepEP / HybridEP's two-level exchange);
- ``mlp`` (compute stream): the experts, with the regrouping around them; a dense layer's MLP half;
- ``combine`` (communication stream): the exchange back, the un-permutation, the shared experts'
  sum and the residual.

A node runs on detached inputs, so that its backward can run on its own: :meth:`Node.backward` takes
the gradients of its outputs and returns those of its inputs. The nodes of one micro-batch follow
each other through one CUDA event (Megatron-core's ``ScheduleNode.stream_acquire_context``); the two
micro-batches of a step share nothing but the streams. :func:`run_step` merges them per layer
(``TransformerLayerSchedulePlan.run``), pairing forward layer ``i`` with backward layer ``L - 1 - i``:

    comm stream:    combine_bwd      | dispatch_fwd  dispatch_bwd | combine_fwd
    compute stream: pre_dispatch_fwd | mlp_bwd       mlp_fwd      | pre_dispatch_bwd

The schedules (``models/schedules.py``): without pipelining, the first forward alone, each later
one merged with the previous micro-batch's backward, the last backward alone; in the interleaved
schedule one more warm-up forward and every steady step merged (Megatron-core's
``combined_1f1b_schedule_for_interleaved_pipelining``).

Issue order. Megatron-core issues ``combine_bwd, pre_fwd, mlp_bwd, dispatch_fwd, dispatch_bwd,
mlp_fwd, combine_fwd, pre_bwd``; on a GPU ``dispatch_fwd`` waits only for ``pre_fwd`` (its event)
and the communication stream, and runs beside ``mlp_bwd``. Replay starts a collective once the
compute issued before it has finished (``replay/reference.py``), so here the forward's dispatch is
issued right after ``pre_fwd``, before ``mlp_bwd``: the same dependencies as on the GPU, in an order
replay reads them. Likewise the flex dispatcher's host read of the tokens per expert (TEGroupedMLP's
``tolist()``, a copy on the compute stream) is issued after ``mlp_bwd`` and before ``dispatch_bwd``:
the host waits for the compute stream and the forward's dispatch, not for ``dispatch_bwd``, as on a
GPU. Approximations: the ``combine`` node's compute (un-permutation, residual) runs on the one
compute stream of replay, after the work issued before it, without waiting for its exchange (a
side stream's compute, ``capture/streams.py``); ``delay_wgrad_compute`` (the experts' weight
gradients split from ``mlp_bwd``) is not modelled; the exchange kernels' share of the SMs and of
memory bandwidth is replay's one ``overlap_slowdown`` of the compute beside them, and the kernels
themselves are not slowed. Memory: a node's inputs that no backward reads are released after its
forward (Megatron-core's ``should_free_input``, decided for this model's graph); the rest of both
micro-batches of a step is alive at once, as on a GPU.

Example::

    plan = ChunkPlan(model, ids, labels, stream=comm_stream())  # one micro-batch, one chunk
    loss, _ = run_step(plan, None, None)            # forward only
    nxt = ChunkPlan(model, ids2, labels2, stream=plan.chain.comm)
    loss2, dx = run_step(nxt, plan, None)           # forward of the next, backward of the first
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterator

import torch

from heterosim.annotate import get_annotator
from heterosim.errors import ConfigError
from models.layers.moe import MoELayer
from models.layers.moe_flex import flex_receive, flex_return, flex_send, flex_unpermute

__all__ = ["ChunkPlan", "Node", "comm_stream", "ep_overlap_flag", "run_step"]

Tensor = torch.Tensor


def ep_overlap_flag(a: dict[str, Any], pp: int, vpp: int | None) -> bool:
    """``--overlap-moe-expert-parallel-comm`` from the parsed flags ``a`` (``models.args``), checked
    as Megatron-core's ``TransformerConfig.__post_init__`` checks ``overlap_moe_expert_parallel_comm``,
    and for what this model does not run with it.

    Raises:
        ConfigError: the first check that fails, naming the flag to change.
    """
    if not a["overlap_moe_expert_parallel_comm"]:
        return False
    flag = "--overlap-moe-expert-parallel-comm"
    if not a["num_experts"] or a["expert_model_parallel_size"] < 2:
        raise ConfigError(f"{flag} needs --num-experts and --expert-model-parallel-size > 1")
    if not (a["bf16"] or a["fp16"]):
        raise ConfigError(f"{flag} needs --bf16 or --fp16")
    if a["recompute_granularity"] == "full" or a["recompute_method"] is not None:
        raise ConfigError(f"{flag} needs no full recomputation and no --recompute-method")
    if a["recompute_granularity"] == "selective" and "moe" in (a["recompute_modules"] or ()):
        raise ConfigError(f"{flag} needs 'moe' out of --recompute-modules")
    if pp > 1 and vpp is None:
        raise ConfigError(f"{flag} with --pipeline-model-parallel-size > 1 needs virtual pipeline stages "
                          "(Megatron-core runs it in the interleaved schedule only)")
    if a["mtp_num_layers"]:
        raise ConfigError(f"{flag} with --mtp-num-layers is not modelled")
    if a["hybrid_override_pattern"]:
        raise ConfigError(f"{flag} with --hybrid-override-pattern (Mamba layers) is not modelled")
    return True


def comm_stream() -> Any:
    """A communication stream for the nodes (Megatron-core's ``set_streams``); None without a CUDA
    device (a run on the CPU)."""
    return torch.cuda.Stream() if torch.cuda.is_available() else None


class _Chain:
    """The streams and the event the nodes of one micro-batch follow each other through (no-ops
    without a communication stream)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.event = torch.cuda.Event() if comm is not None else None

    @contextlib.contextmanager
    def on(self, comm: bool) -> Iterator[None]:
        if self.comm is None:
            yield
            return
        stream = self.comm if comm else torch.cuda.default_stream()
        with torch.cuda.stream(stream):
            self.event.wait(stream)
            yield
            self.event.record(stream)


def _detach(t: Any) -> Any:
    if not isinstance(t, Tensor):
        return t
    d = t.detach()
    if t.requires_grad:
        d.requires_grad_(True)
    return d


class Node:
    """One piece of a layer's forward on detached inputs, with its own backward
    (Megatron-core's ``ScheduleNode``)."""

    def __init__(self, fn: Callable[..., Any], chain: _Chain, *, comm: bool, free: tuple[int, ...] = ()) -> None:
        self.fn, self.chain, self.comm, self.free = fn, chain, comm, free
        self.inputs: tuple = ()
        self.outputs: tuple = ()

    def forward(self, *inputs: Any) -> tuple:
        """``free``: the inputs whose storage is released after the forward (Megatron-core's
        ``free_input``), those no backward reads."""
        with self.chain.on(self.comm):
            self.inputs = tuple(_detach(t) for t in inputs)
            out = self.fn(*self.inputs)
            for i in self.free:
                if isinstance(self.inputs[i], Tensor):
                    get_annotator().release(self.inputs[i])
        self.outputs = out if isinstance(out, tuple) else (out,)
        return self.outputs

    def backward(self, *grads: Tensor | None) -> tuple:
        """Gradients of the outputs (None where an output gets none) -> gradients of the inputs."""
        with self.chain.on(self.comm):
            pairs = [(o, g) for o, g in zip(self.outputs, grads)
                     if isinstance(o, Tensor) and o.requires_grad and g is not None]
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        out = tuple(t.grad if isinstance(t, Tensor) and t.requires_grad else None for t in self.inputs)
        for t in self.inputs:  # the gradients go on; a graph that outlives the node (a loss) keeps its leaves
            if isinstance(t, Tensor) and t.requires_grad:
                t.grad = None
        self.release()
        return out

    def release(self) -> None:
        """Drop what the node holds (its function too: a layer's bound method refers back to it), so
        that its tensors die when their last use does, not at the next garbage collection."""
        self.fn, self.inputs, self.outputs = None, (), ()


class _Layer:
    """One transformer layer as nodes: ``pre``, ``mlp`` and, with experts, ``dispatch`` and ``combine``."""

    def __init__(self, layer: Any, chain: _Chain, rotary: list) -> None:
        if layer.mlp is None or layer.mixer is not None:
            raise ConfigError("--overlap-moe-expert-parallel-comm runs attention + MLP layers only")
        self.layer, self.rotary = layer, rotary  # rotary: the chunk's RoPE angles, once its input node ran
        self.moe = layer.mlp if isinstance(layer.mlp, MoELayer) else None
        self.flex = bool(self.moe is not None and self.moe.pstate.ep_domain)
        # Inputs released after the forward (Megatron-core's should_free_input, for what this model's
        # graph saves): the exchanges' inputs (the all-to-all dispatcher's; the flex dispatcher's are
        # views of what the router saved), the experts' received rows where they are regrouped into a
        # copy (the flex rows are always unpacked into copies; one local expert: a view the GEMM saves),
        # the experts' output and the shared experts' output after the combine (not the residual).
        received = (0,) if self.flex else (0, 1) if self.moe is not None and self.moe.local > 1 else ()
        self.pre = Node(self._pre if self.moe else self._attention, chain, comm=False)
        self.mlp = Node(self._experts if self.moe else self._dense_mlp, chain, comm=False, free=received)
        self.dispatch = Node(self._dispatch, chain, comm=True, free=() if self.flex else (0, 1)) if self.moe else None
        self.combine = Node(self._combine, chain, comm=True, free=(0, 2)) if self.moe else None
        self.routed: Any = None
        self.exchange: Any = None
        self.held: tuple = ()  # pre's output gradients combine_bwd gives (residual, shared experts)

    # ---- node bodies ------------------------------------------------------------------------
    def _attention(self, x: Tensor) -> Tensor:
        return self.layer.mix(x, self.rotary[0])

    def _dense_mlp(self, h: Tensor) -> Tensor:
        return self.layer.mlp_half(h)

    def _pre(self, x: Tensor) -> tuple:
        h = self.layer.mix(x, self.rotary[0])
        normed = self.layer.pre_mlp_norm(h)
        r = self.routed = self.moe.route(normed)
        shared = self.moe.shared(normed)  # after the router, before the routed experts (Megatron-core)
        if self.flex:
            return h, r.tokens, r.probs, shared
        return h, r.permuted, r.permuted_probs, shared

    def _dispatch(self, tokens: Tensor, probs: Tensor) -> tuple:
        moe, r = self.moe, self.routed
        if self.flex:
            r.counts.cpu()  # the receive sizes read back before the exchange, as in MoELayer.forward
            held, self.exchange = flex_send(tokens, probs, moe.pstate, moe.topk, moe.E,
                                            permute_in_kernel=moe.permute_in_kernel)
            return (held,)
        return moe.dispatch(dataclasses.replace(r, permuted=tokens, permuted_probs=probs))

    def read_counts(self) -> None:
        """The flex dispatcher's host read of the tokens per expert (see the module docstring)."""
        if self.flex:
            self.exchange.per_expert.cpu()

    def _experts(self, *received: Tensor) -> Tensor:
        moe = self.moe
        if self.flex:
            x, w = flex_receive(received[0], self.exchange, read_counts=False)
            return flex_unpermute(moe.experts(x, w), self.exchange)
        return moe.expert_mlp(received[0], received[1], self.routed)

    def _combine(self, out: Tensor, h: Tensor, shared: Tensor | None) -> Tensor:
        moe = self.moe
        combined = flex_return(out, self.exchange, moe.pstate) if self.flex else moe.combine(out, self.routed)
        combined = combined.view(h.shape)
        if shared is not None:
            combined = combined + shared
        return self.layer.mlp_residual(combined, None, h)

    # ---- forward / backward steps -----------------------------------------------------------
    def forward_pre(self, x: Tensor) -> tuple:
        return self.pre.forward(x)

    def forward_rest(self, pre_out: tuple, dispatched: tuple | None) -> Tensor:
        if self.moe is None:
            return self.mlp.forward(pre_out[0])[0]
        out = self.mlp.forward(*dispatched)[0]
        return self.combine.forward(out, pre_out[0], pre_out[3])[0]

    def backward_combine(self, g: Tensor) -> Tensor:
        """combine_bwd: the experts' output gradient; holds the residual's and the shared experts'."""
        if self.moe is None:
            return g
        g_out, g_h, g_shared = self.combine.backward(g)
        self.held = (g_h, g_shared)
        return g_out

    def backward_mlp(self, g: Tensor) -> tuple:
        return self.mlp.backward(g)

    def backward_dispatch(self, g: tuple) -> tuple:
        return self.dispatch.backward(*g) if self.moe is not None else g

    def backward_pre(self, g: tuple) -> Tensor:
        if self.moe is None:
            return self.pre.backward(g[0])[0]
        g_h, g_shared = self.held
        self.held, self.routed, self.exchange = (), None, None
        return self.pre.backward(g_h, g[0], g[1], g_shared)[0]


def _run_layer(f: _Layer | None, b: _Layer | None, x: Tensor | None, g: Tensor | None) -> tuple:
    """One forward layer and one backward layer merged (``TransformerLayerSchedulePlan.run``, in the
    issue order of the module docstring); either may be None."""
    if b is not None:
        g = b.backward_combine(g)
    pre_out = dispatched = None
    if f is not None:
        pre_out = f.forward_pre(x)
        if f.moe is not None:
            dispatched = f.dispatch.forward(pre_out[1], pre_out[2])
    gm = b.backward_mlp(g) if b is not None else None
    if f is not None:
        f.read_counts()
    gd = b.backward_dispatch(gm) if b is not None else None
    if f is not None:
        x = f.forward_rest(pre_out, dispatched)
    if b is not None:
        g = b.backward_pre(gd)
    return x, g


class ChunkPlan:
    """One micro-batch through one model chunk (a :class:`models.gpt.GPTModel`) as nodes: the input
    (embedding on the first stage), the layers, the head (final norm, output layer and loss on the
    last stage) followed by ``finish`` (loss scaling); ``stream``: the communication stream
    (:func:`comm_stream`). Megatron-core's ``TransformerModelChunkSchedulePlan``."""

    def __init__(self, model: Any, inp: Tensor | None, labels: Tensor | None, *,
                 finish: Callable[[Tensor], Tensor] = lambda y: y, stream: Any = None) -> None:
        self.chain = _Chain(stream)
        self.inp = inp
        rotary: list = [None]
        decoder = model.decoder

        def enter(x: Tensor) -> Tensor:
            x = model.embed_input(x)
            rotary[0] = model.rotary(x.device)
            return decoder.enter(x)

        self.pre = Node(enter, self.chain, comm=False)
        self.layers = [_Layer(layer, self.chain, rotary) for layer in decoder.layers]
        self.post = Node(lambda h: finish(model.head(decoder.exit(h), labels)), self.chain, comm=False)
        self.output: Any = None
        """The chunk's output, once its forward ran."""

    def release(self) -> None:
        """Drop every node's tensors and functions: a plan whose backward will not run."""
        for layer in self.layers:
            for node in (layer.pre, layer.mlp, layer.dispatch, layer.combine):
                if node is not None:
                    node.release()
            layer.routed = layer.exchange = None
            layer.held = ()
        self.pre.release()
        self.post.release()
        self.inp = self.output = None


def run_step(f: ChunkPlan | None, b: ChunkPlan | None, grad: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """Forward of ``f`` merged with the backward of ``b`` (``grad``: the gradient of ``b``'s output,
    None for a loss) -> (``f``'s output, the gradient of ``b``'s input; None on the first stage).
    Megatron-core's ``TransformerModelChunkSchedulePlan.run``."""
    x = g = None
    if f is not None:
        x = f.pre.forward(f.inp)[0]
    if b is not None:
        g = b.post.backward(grad if grad is not None else torch.ones_like(b.post.outputs[0]))[0]
    nf, nb = (len(f.layers) if f else 0), (len(b.layers) if b else 0)
    both = min(nf, nb)
    for i in range(both):  # merged layers, then the backward's rest, then the forward's
        x, g = _run_layer(f.layers[i], b.layers[nb - 1 - i], x, g)
    for i in range(both, nb):
        _, g = _run_layer(None, b.layers[nb - 1 - i], None, g)
    for i in range(both, nf):
        x, _ = _run_layer(f.layers[i], None, x, None)
    y = dx = None
    if f is not None:
        y = f.output = f.post.forward(x)[0]
    if b is not None:
        gi = b.pre.backward(g)[0]
        dx = gi if b.inp is not None and b.inp.is_floating_point() else None
    return y, dx
