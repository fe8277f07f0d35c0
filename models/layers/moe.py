"""Mixture-of-experts MLP with expert parallelism (Megatron-core ``transformer/moe``: ``TopKRouter``,
``MoEAlltoAllTokenDispatcher``, ``GroupedMLP``).

Per layer and micro-batch, with ``T = s/cp/tp * b`` local tokens, ``E`` experts, top-``k``:

1. router GEMM ``[T, h] x [h, E]``, top-k over the logits, softmax over the k kept scores;
2. permute: gather the ``T*k`` token copies into expert-major order;
3. dispatch: ``all_to_all_single`` over the EP group (equal splits), then with TP an all-gather
   over TP (experts are TP-split like the dense MLP; Megatron requires sequence parallelism) unless
   ``--expert-tensor-parallel-size 1``: then each rank holds whole experts and its EP group spans
   TP peers too, and no TP collective runs;
4. regroup the received rows by local expert, run the ``E/ep`` local experts as one batched GEMM
   per projection (a grouped GEMM with equal group sizes), activation in between, weighted by the
   routing probabilities there (Megatron-core's ``experts.py``: each row's probability, sent with
   it by a second all-to-all, scales the activation's output; with SwiGLU fusion one fused kernel,
   ``weighted_bias_swiglu_impl``);
5. the reverse: reduce-scatter over TP, ``all_to_all_single`` back, un-permute (index-add of the
   weighted rows into the token rows).

With Megatron-core's flex dispatcher (``--moe-token-dispatcher-type flex``, DeepEP / HybridEP) steps
2, 3 and 5 are the two-level exchange of :mod:`models.layers.moe_flex` instead.

**Balanced routing (an assumption):** routing decided by the data cannot run under
FakeTensorMode (token counts per expert are data, split sizes need a device-to-host copy), so
every expert receives exactly ``T*k/E`` token copies from every rank: the permutation is fixed
(copy ``j`` of token ``t`` goes to expert ``(t*k + j) mod E``) and the all-to-all splits are
equal. The router GEMM, top-k and softmax still run, and the probabilities weight the combine.
The dispatcher's token-count exchange is kept: an all-gather over EP of the ``E`` int64
per-expert counts (Megatron's ``preprocess``), and the host's read of the gathered counts right
before the all-to-all. Megatron-core's dropless ``MoEAlltoAllTokenDispatcher`` copies the splits
to the host on a side stream and waits on that copy's event at its ``cuda_sync_point``, which is
``before_ep_alltoall`` whenever EP or TP is above 1 (``before_finish``, the end of the dispatch,
otherwise): the CPU stops until the GPU has run everything issued so far, once per MoE layer and
forward, so the GPU then waits for the ops issued after it (replay's host model, docs/host.md).
Here the read is a blocking copy of the counts, one place for both cases (the permutation between
the two points is one gather). This ignores load imbalance, token dropping / capacity factors
(whose padded path has no sync) and the auxiliary load-balancing loss.

Expert parameters carry ``param.allreduce = False``: their gradients are averaged over the
expert-data-parallel group, not the data-parallel group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from heterosim.errors import ConfigError
from models.config import ModelConfig
from models.layers import fp8 as te_fp8
from models.layers.fusions import weighted_swiglu
from models.layers.linear import gemm_scope, init_normal, init_replicated, scaled_init_std
from models.layers.mappings import all_gather_dim0, gather_from_sp, reduce_scatter_to_sp
from models.layers.mlp import MLP, activation_fn
from models.layers.moe_flex import all_to_all, flex_combine, flex_dispatch
from models.layers.recompute import recompute

__all__ = ["MoELayer", "balanced_permutation"]


def balanced_permutation(tokens: int, topk: int, experts: int) -> torch.Tensor:
    """Flat copy index (``t*topk + j``) of each of the ``tokens*topk`` routed copies, expert-major.

    Copy ``j`` of token ``t`` goes to expert ``(t*topk + j) mod experts`` (balanced routing);
    within an expert copies keep token order, like Megatron's stable permutation. The token row
    of a copy is ``index // topk``.
    """
    copies = torch.arange(tokens * topk)
    expert = copies % experts
    return torch.argsort(expert * (tokens * topk) + copies)


class _GroupedGemm(torch.autograd.Function):
    """``x [G, n, a] @ w [G, a, c]`` per expert group; all three GEMMs carry the fp8 scope.

    In fp8 (or fp4) Transformer Engine's ``GroupedLinear`` quantizes what it is given in bf16
    (``tex.split_quantize`` of the experts' inputs: the dispatched tokens before FC1, the
    activation's output before FC2; nothing before them writes fp8 or takes their amax), casts and
    transposes the output gradient, and transposes its fp8 input for the weight-gradient GEMM, as
    ``models.layers.linear`` does for a dense layer (:mod:`models.layers.fp8`): one kernel for all
    experts under delayed scaling and NVFP4, one per expert otherwise
    (:func:`models.layers.fp8.split_quantize_fused`). NB: the weights' casts, cached across
    micro-batches, are left out as for the dense layers."""

    @staticmethod
    def forward(ctx, x, w, fp8):
        ctx.save_for_backward(x, w)
        ctx.fp8 = fp8
        if fp8:
            _split_quantize(x)
        with gemm_scope(fp8):
            return torch.bmm(x, w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        if ctx.fp8:
            for g8 in _split_quantize(g):
                te_fp8.transpose(g8)
        with gemm_scope(ctx.fp8):
            gx = torch.bmm(g, w.transpose(1, 2))
        if ctx.fp8:
            te_fp8.transpose(te_fp8.fp8_like(x))
        with gemm_scope(ctx.fp8):
            gw = torch.bmm(x.transpose(1, 2), g)
        return gx, gw, None


def _split_quantize(t: torch.Tensor) -> list[torch.Tensor]:
    """``t [experts, rows, cols]`` quantized as ``GroupedLinear`` does, all experts at once or each apart."""
    if te_fp8.split_quantize_fused():
        return [te_fp8.cast(t)]
    return [te_fp8.cast(part) for part in t.unbind(0)]


@dataclass
class _Routed:
    """One MoE layer's routing of its local tokens (:meth:`MoELayer.route`)."""

    tokens: torch.Tensor
    """``[T, h]``."""
    probs: torch.Tensor
    """Routing weights ``[T, k]``."""
    counts: torch.Tensor
    """Tokens per expert, gathered over EP (read back by the host before the exchange)."""
    rows: torch.Tensor | None = None
    """All-to-all dispatcher: the token row of each expert-major copy."""
    permuted: torch.Tensor | None = None
    permuted_probs: torch.Tensor | None = None


class MoELayer(nn.Module):
    """``x [s/tp, b, h] -> (out [s/tp, b, h], None)`` through ``num_experts`` top-k experts."""

    def __init__(self, mcfg: ModelConfig, pstate: Any, *, dtype: torch.dtype, fp8: bool, recompute_act: bool = False,
                 recompute_shared: bool = False, replicated_seed: int | None = None) -> None:
        super().__init__()
        E, ep = mcfg.num_experts, pstate.ep_size
        tp = pstate.etp_size  # ranks each expert is split over: the TP group's, or 1 (whole experts)
        if E % ep:
            raise ConfigError(f"--num-experts {E} must be divisible by --expert-model-parallel-size {ep}")
        if not 1 <= mcfg.moe_router_topk <= E:
            raise ConfigError(f"--moe-router-topk {mcfg.moe_router_topk} must be in [1, {E}]")
        if pstate.ep_domain and tp > 1:
            raise ConfigError("the flex dispatcher runs whole experts on each rank: give "
                              "--expert-tensor-parallel-size 1 with --moe-token-dispatcher-type flex")
        if pstate.tp_size > 1 and not pstate.sequence_parallel:
            raise ConfigError("MoE with tensor parallelism needs --sequence-parallel (as in Megatron)")
        ffn = mcfg.moe_ffn_hidden_size or mcfg.ffn_size
        if ffn % tp:
            raise ConfigError(f"expert FFN size {ffn} not divisible by tensor-parallel size {tp}")
        self.E, self.topk, self.local = E, mcfg.moe_router_topk, E // ep
        self.pstate, self.fp8 = pstate, fp8
        self.act = activation_fn(mcfg.activation, fused=mcfg.bias_swiglu_fusion)
        self.fused_weighting = mcfg.activation == "swiglu" and mcfg.bias_swiglu_fusion  # weighted_bias_swiglu_impl
        self.permute_in_kernel = mcfg.moe_permute_fusion_into_hybridep
        # Selective recomputation (--recompute-modules moe_act / shared_experts, models/layers/recompute.py)
        self.recompute_act, self.recompute_shared = recompute_act, recompute_shared
        h, std = mcfg.hidden_size, mcfg.init_method_std
        gated = 2 if mcfg.activation == "swiglu" else 1
        self.router = nn.Parameter(torch.empty(E, h, dtype=dtype))
        init_replicated(std, replicated_seed)(self.router)  # the same on every TP rank
        self.router.sequence_parallel = pstate.sequence_parallel  # replicated over TP
        self.fc1 = nn.Parameter(torch.empty(self.local, h, gated * ffn // tp, dtype=dtype))
        self.fc2 = nn.Parameter(torch.empty(self.local, ffn // tp, h, dtype=dtype))
        init_normal(std)(self.fc1)
        init_normal(scaled_init_std(std, mcfg.num_layers))(self.fc2)
        for p in (self.fc1, self.fc2):
            p.allreduce = False
            p.tensor_model_parallel = tp > 1
        self.shared_experts = None
        if mcfg.moe_shared_expert_intermediate_size:  # Megatron-core's SharedExpertMLP: a TP-split MLP
            self.shared_experts = MLP(
                h, mcfg.moe_shared_expert_intermediate_size, activation=mcfg.activation, tp_group=pstate.tp_group,
                sequence_parallel=pstate.sequence_parallel, bias=False, dtype=dtype, init_std=std,
                out_init_std=scaled_init_std(std, mcfg.num_layers), fp8=fp8,
                async_allreduce=pstate.async_tp_allreduce, fused_activation=mcfg.bias_swiglu_fusion)

    def forward(self, x: torch.Tensor):
        # Megatron-core's stages (megatron/core/models/gpt/fine_grained_callables.py): route and
        # preprocess, dispatch, the experts, combine; the shared experts beside them.
        routed = self.route(x)
        s, b, h = x.shape
        if self.pstate.ep_domain:  # the flex dispatcher (DeepEP / HybridEP): two-level, one copy per domain and rank
            routed.counts.cpu()  # the receive sizes read back before the dispatch, as DeepEP's normal kernels do
            inputs, weights, exchange = flex_dispatch(routed.tokens, routed.probs, self.pstate, self.topk, self.E,
                                                      permute_in_kernel=self.permute_in_kernel)
            combined = flex_combine(self.experts(inputs, weights), exchange, self.pstate).view(s, b, h)
        else:
            recv, recv_probs = self.dispatch(routed)
            combined = self.combine(self.expert_mlp(recv, recv_probs, routed), routed).view(s, b, h)
        return self._plus_shared(combined, x), None

    def route(self, x: torch.Tensor) -> _Routed:
        """Router GEMM, top-k and softmax, the tokens-per-expert exchange, and (all-to-all dispatcher)
        the permutation into expert-major order."""
        s, b, h = x.shape
        T = s * b
        if (T * self.topk) % self.E:
            raise ConfigError(f"{T} local tokens x top-{self.topk} are not divisible over {self.E} "
                              f"experts; balanced routing needs tokens*topk % num_experts == 0")
        tokens = x.reshape(T, h)
        logits = torch.nn.functional.linear(tokens, self.router)  # [T, E]
        scores, _ = torch.topk(logits, self.topk, dim=-1)
        probs = torch.softmax(scores.float(), dim=-1).to(x.dtype)  # [T, k]
        ps = self.pstate
        counts = torch.full((self.E,), T * self.topk // self.E, dtype=torch.int64, device=x.device)
        if ps.ep_size > 1:  # tokens per expert, exchanged so each rank can size its all-to-all
            counts = all_gather_dim0(counts, ps.ep_group)
        if ps.ep_domain:
            return _Routed(tokens=tokens, probs=probs, counts=counts)
        order = balanced_permutation(T, self.topk, self.E).to(x.device)
        rows = order // self.topk
        permuted = tokens.index_select(0, rows)  # [T*k, h] expert-major
        permuted_probs = probs.reshape(-1, 1).index_select(0, order)  # [T*k, 1], permuted with the tokens
        return _Routed(tokens=tokens, probs=probs, counts=counts, rows=rows, permuted=permuted,
                       permuted_probs=permuted_probs)

    def dispatch(self, r: _Routed) -> tuple[torch.Tensor, torch.Tensor]:
        """The all-to-all dispatcher's exchange: tokens, then their routing weights, to the experts'
        ranks (and with TP-split experts to every TP peer)."""
        ps = self.pstate
        r.counts.cpu()  # the splits read back: a host sync (Megatron's cuda_sync_point)
        recv = all_to_all(r.permuted, ps.ep_group)  # [ep (source), local, n, h]
        recv_probs = all_to_all(r.permuted_probs, ps.ep_group)  # Megatron's probs all-to-all, after the tokens'
        if ps.etp_size > 1:  # experts split over TP: every TP rank computes on all of its peers' tokens
            recv = gather_from_sp(recv, ps.tp_group)  # [tp * ep (sources), local, n, h]
            recv_probs = gather_from_sp(recv_probs, ps.tp_group)
        return recv, recv_probs

    def expert_mlp(self, recv: torch.Tensor, recv_probs: torch.Tensor, r: _Routed) -> torch.Tensor:
        """The received rows regrouped by local expert, the experts, and the rows back in source order
        (partial sums over TP when the experts are split over it)."""
        ps = self.pstate
        h = recv.shape[-1]
        sources, n = ps.etp_size * ps.ep_size, r.tokens.shape[0] * self.topk // self.E
        grouped = recv.view(sources, self.local, n, h).transpose(0, 1).reshape(self.local * sources * n, h)
        weights = recv_probs.view(sources, self.local, n, 1).transpose(0, 1).reshape(self.local * sources * n, 1)
        out = self.experts(grouped, weights)  # [local * sources*n, h], weighted, partial over TP
        return out.view(self.local, sources, n, h).transpose(0, 1).reshape(sources * self.local * n, h)

    def combine(self, out: torch.Tensor, r: _Routed) -> torch.Tensor:
        """Reduce-scattered over TP when the experts are split over it, the all-to-all back, then the
        un-permutation: each token's weighted expert rows summed."""
        if self.pstate.etp_size > 1:
            out = reduce_scatter_to_sp(out, self.pstate.tp_group)
        out = all_to_all(out, self.pstate.ep_group)  # back in this rank's expert-major order
        return torch.zeros_like(r.tokens).index_add(0, r.rows, out)

    def experts(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The local experts on ``x [local * rows, h]``, expert-major: one batched GEMM per projection,
        the activation's output scaled by each row's routing weight (``weights [local * rows, 1]``)."""
        grouped = x.view(self.local, -1, x.shape[-1])
        w = weights.view(self.local, -1, 1)
        fc1 = _GroupedGemm.apply(grouped, self.fc1, self.fp8)
        inter = recompute(self._activation, fc1, w) if self.recompute_act else self._activation(fc1, w)
        return _GroupedGemm.apply(inter, self.fc2, self.fp8).reshape(x.shape)

    def _activation(self, fc1: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return weighted_swiglu(fc1, w) if self.fused_weighting else self.act(fc1) * w

    def _plus_shared(self, combined: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        shared = self.shared(x)
        return combined if shared is None else combined + shared

    def shared(self, x: torch.Tensor) -> torch.Tensor | None:
        """The shared experts' output on every token ``x`` (None without shared experts)."""
        if self.shared_experts is None:
            return None
        shared, _ = recompute(self.shared_experts, x) if self.recompute_shared else self.shared_experts(x)
        return shared

