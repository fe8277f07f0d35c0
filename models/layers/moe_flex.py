"""Megatron-core's flex MoE dispatcher (``--moe-token-dispatcher-type flex``): DeepEP's / HybridEP's
two-level exchange, a token once per NVLink domain over the scale-out network, then once per rank
inside the domain.

DeepEP's internode kernels (deepseek-ai/DeepEP ``csrc/kernels/internode.cu``; HybridEP the same with
its domain size from ``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN``) see the EP group as domains of
``D`` consecutive ranks (``NUM_MAX_NVL_PEERS`` = 8 GPUs of a node). A token goes to every domain
that holds one of its experts, once, by RDMA to the rank with its own index there ("rail"), and
that rank forwards it over NVLink once to each rank of the domain that holds one of its experts;
the routing weights travel with it. The receiver copies it to each of its local experts, and after
the experts the combine runs back: a rank sums its experts' weighted outputs into one row per token,
the forwarding rank sums its domain's rows, the source sums the domains'. Megatron-core's all-to-all
dispatcher instead sends each (token, expert) copy: top-8 of 256 experts over 4 domains is about
2.7 remote copies a token here against 6 there.

DeepEP's and HybridEP's kernels read the rows they send straight from their source and sum the rows
they receive as they arrive, so those gathers and sums are recorded as the kernels' own work
(``Annotator.scope(comm_kernel=True)``: no compute time beside the exchange's). The sort of a rank's
received tokens into expert order and back is Megatron-core's permute / unpermute kernels (compute),
or HybridEP's own with ``moe_permute_fusion_into_hybridep``. The routing weights scale the experts'
activation (:meth:`models.layers.moe.MoELayer._experts`), as in Megatron-core.

Routing (an assumption, as in :mod:`models.layers.moe`): data-decided routing cannot run under
FakeTensorMode, so it is fixed, and balanced. Copy ``j`` of local token ``t`` goes to expert
``perm[(t*k + j) mod E]`` with ``perm`` a fixed pseudo-random permutation of the experts: every
expert gets exactly ``T*k/E`` copies from each rank (so the experts' GEMMs have the all-to-all
path's shapes), and a token's ``k`` experts are ``k`` distinct experts spread as a uniform draw
without replacement spreads them, which is what the deduplication depends on (Megatron Bridge's
benchmarks force-balance routing with random logits, ``moe_router_force_load_balancing``). Split
sizes follow from that routing in Python. The exchange is priced as NCCL all-to-alls of the same
bytes (ncclshim), not as DeepEP's / HybridEP's own kernels: their SMs (20-32, taken from compute
when they overlap it) and chunked pipelining are ignored.
"""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.distributed as dist

from heterosim.annotate import get_annotator
from heterosim.errors import ConfigError
from models.layers.mappings import group_size

__all__ = ["FlexExchange", "FlexPlan", "all_to_all", "flex_combine", "flex_dispatch", "flex_domain", "flex_plan",
           "flex_receive", "flex_return", "flex_send", "flex_unpermute"]


def flex_domain(dispatcher: str, backend: str | None, permute_fusion: bool) -> int | None:
    """EP ranks per NVLink domain of the flex dispatcher (``--moe-token-dispatcher-type flex``):
    DeepEP's NUM_MAX_NVL_PEERS (8), HybridEP's NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN (environment,
    8 when unset); None for Megatron-core's all-to-all dispatcher. Checks the flex flags together:
    ``--moe-permute-fusion-into-hybridep`` (``permute_fusion``) needs HybridEP."""
    if dispatcher != "flex":
        if permute_fusion:
            raise ConfigError("--moe-permute-fusion-into-hybridep needs --moe-token-dispatcher-type flex "
                              "--moe-flex-dispatcher-backend hybridep")
        return None
    if backend is None:
        raise ConfigError("--moe-token-dispatcher-type flex needs --moe-flex-dispatcher-backend deepep or hybridep")
    if backend == "deepep":
        if permute_fusion:
            raise ConfigError("--moe-permute-fusion-into-hybridep needs --moe-flex-dispatcher-backend hybridep")
        return 8
    env = os.environ.get("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", "8")
    if not env.isdigit() or int(env) < 1:
        raise ConfigError(f"NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN={env!r}: give a positive integer")
    return int(env)


@dataclass(frozen=True)
class FlexPlan:
    """Index lists and split sizes of one rank's two-stage exchange (rows are token rows)."""

    send1: tuple[int, ...]
    """Local token of each row sent over the rail group, destination domain by domain."""
    in1: tuple[int, ...]
    out1: tuple[int, ...]
    send2: tuple[int, ...]
    """Row of the rail-received buffer of each row forwarded in the domain, destination by destination."""
    in2: tuple[int, ...]
    out2: tuple[int, ...]
    expand: tuple[int, ...]
    """Row of the domain-received buffer of each expert input, expert-major (local experts)."""
    column: tuple[int, ...]
    """Routing-weight column (the copy index j) of each expert input."""


def token_experts(t: int, topk: int, experts: int) -> list[int]:
    """The ``topk`` experts of local token ``t`` (the same on every rank)."""
    perm = _permutation(experts)
    return [perm[(t * topk + j) % experts] for j in range(topk)]


@lru_cache(maxsize=16)
def _permutation(experts: int) -> tuple[int, ...]:
    return tuple(random.Random(experts).sample(range(experts), experts))


@lru_cache(maxsize=64)
def flex_plan(tokens: int, topk: int, experts: int, ep: int, domain: int, ep_rank: int) -> FlexPlan:
    """The exchange of EP rank ``ep_rank`` for ``tokens`` local tokens (every rank routes alike)."""
    local, n_dom = experts // ep, ep // domain
    me, my_dom = ep_rank, ep_rank // domain
    sets = [token_experts(t, topk, experts) for t in range(tokens)]
    ranks = [{e // local for e in s} for s in sets]
    doms = [{r // domain for r in rs} for rs in ranks]
    send1 = [t for n in range(n_dom) for t in range(tokens) if n in doms[t]]
    in1 = tuple(sum(1 for t in range(tokens) if n in doms[t]) for n in range(n_dom))
    held = [t for t in range(tokens) if my_dom in doms[t]]  # what each domain's rail peer sends here
    out1 = (len(held),) * n_dom
    send2, in2 = [], []
    for i in range(domain):
        dest = my_dom * domain + i
        rows = [m * len(held) + pos for m in range(n_dom) for pos, t in enumerate(held) if dest in ranks[t]]
        send2 += rows
        in2.append(len(rows))
    mine = [t for t in range(tokens) if me in ranks[t]]  # arriving from every source rank
    out2 = (n_dom * len(mine),) * domain
    expand, column = [], []
    for e in range(me * local, (me + 1) * local):
        for block in range(domain * n_dom):  # forwarder i, then source domain m
            for pos, t in enumerate(mine):
                if e in sets[t]:
                    expand.append(block * len(mine) + pos)
                    column.append(sets[t].index(e))
    return FlexPlan(tuple(send1), in1, out1, tuple(send2), tuple(in2), out2, tuple(expand), tuple(column))


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` along dim 0, equal splits (None) or the given ones; its gradient is the
    reverse exchange."""

    @staticmethod
    def forward(ctx, x, group, in_splits, out_splits):
        ctx.group, ctx.splits = group, (in_splits, out_splits)
        return _a2a(x, group, in_splits, out_splits)

    @staticmethod
    def backward(ctx, g):
        in_splits, out_splits = ctx.splits
        return _a2a(g.contiguous(), ctx.group, out_splits, in_splits), None, None, None


def _a2a(x: torch.Tensor, group: Any, in_splits: tuple[int, ...] | None,
         out_splits: tuple[int, ...] | None) -> torch.Tensor:
    if group_size(group) == 1:
        return x
    if in_splits is None:
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), list(out_splits), list(in_splits), group=group)
    return out


def all_to_all(x: torch.Tensor, group: Any, in_splits: tuple[int, ...] | None = None,
               out_splits: tuple[int, ...] | None = None) -> torch.Tensor:
    """Differentiable ``all_to_all_single`` of ``x``'s rows over ``group``: equal splits by default,
    else ``in_splits`` rows to each peer and ``out_splits`` from each."""
    return _AllToAll.apply(x, group, in_splits, out_splits)


class _Gather(torch.autograd.Function):
    """Rows ``idx`` of ``x`` (``out[i] = x[idx[i]]``); the gradient sums back into those rows. ``in_kernel``:
    data movement DeepEP's / HybridEP's own kernels do as they send (``Annotator.scope(comm_kernel=)``)."""

    @staticmethod
    def forward(ctx, x, idx, in_kernel):
        ctx.save_for_backward(idx)
        ctx.rows, ctx.in_kernel = x.shape[0], in_kernel
        with _moved(in_kernel):
            return x.index_select(0, idx)

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        with _moved(ctx.in_kernel):
            return g.new_zeros((ctx.rows, *g.shape[1:])).index_add(0, idx, g), None, None


class _SumInto(torch.autograd.Function):
    """``rows`` rows, row ``idx[i]`` the sum of every ``y[i]`` sent to it; the gradient is gathered back."""

    @staticmethod
    def forward(ctx, y, idx, rows, in_kernel):
        ctx.save_for_backward(idx)
        ctx.in_kernel = in_kernel
        with _moved(in_kernel):
            return y.new_zeros((rows, *y.shape[1:])).index_add(0, idx, y)

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        with _moved(ctx.in_kernel):
            return g.index_select(0, idx), None, None, None


class _Pack(torch.autograd.Function):
    """``[tokens | probs]`` side by side, the rows DeepEP / HybridEP send (a token with its k routing
    weights), and the split of the received rows; inside their kernels both ways."""

    @staticmethod
    def forward(ctx, tokens, probs):
        ctx.h = tokens.shape[1]
        with _moved(True):
            return torch.cat([tokens, probs.to(tokens.dtype)], dim=1)

    @staticmethod
    def backward(ctx, g):
        with _moved(True):
            return g[:, :ctx.h].contiguous(), g[:, ctx.h:].contiguous()


class _Unpack(torch.autograd.Function):
    """Received ``[tokens | weights]`` rows split in two (inside the kernels both ways, as :class:`_Pack`)."""

    @staticmethod
    def forward(ctx, rows, h):
        with _moved(True):
            return rows[:, :h].contiguous(), rows[:, h:].contiguous()

    @staticmethod
    def backward(ctx, gx, gw):
        with _moved(True):
            return torch.cat([gx, gw.to(gx.dtype)], dim=1), None


def _moved(in_kernel: bool) -> Any:
    return get_annotator().scope(comm_kernel=True) if in_kernel else contextlib.nullcontext()


@dataclass(frozen=True)
class FlexExchange:
    """What one layer's flex dispatch leaves for its combine (:func:`flex_dispatch`, :func:`flex_combine`)."""

    plan: FlexPlan
    send1: torch.Tensor
    send2: torch.Tensor
    expand: torch.Tensor
    tokens: int
    """Local tokens ``T``."""
    permute_in_kernel: bool
    hidden: int
    per_expert: torch.Tensor
    """Tokens per local expert, as the dispatch leaves them on the GPU."""

    @property
    def rail_rows(self) -> int:
        """Rows the rail stage delivered to this rank."""
        return sum(self.plan.out1)

    @property
    def held_rows(self) -> int:
        """Rows the domain stage delivered to this rank (one per token held here)."""
        return sum(self.plan.out2)


def flex_dispatch(tokens: torch.Tensor, probs: torch.Tensor, ps: Any, topk: int, experts: int, *,
                  permute_in_kernel: bool = False) -> tuple[torch.Tensor, torch.Tensor, FlexExchange]:
    """``tokens [T, h]``, routing weights ``probs [T, k]`` -> the local experts' inputs ``[local * ep *
    T*k/E, h]`` (expert-major: each expert's ``ep * T*k/E`` rows together), their routing weights
    ``[same rows, 1]`` and the state :func:`flex_combine` sums the experts' outputs back with:
    :func:`flex_send`, then :func:`flex_receive`.

    The rows DeepEP / HybridEP gather to send and forward are their kernels' own work (no compute
    time here: ``Annotator.scope(comm_kernel=True)``); the sort of the received tokens into expert
    order is Megatron-core's permute kernel, or HybridEP's own with ``permute_in_kernel``
    (``moe_permute_fusion_into_hybridep``)."""
    held, exchange = flex_send(tokens, probs, ps, topk, experts, permute_in_kernel=permute_in_kernel)
    x, weight = flex_receive(held, exchange)
    return x, weight, exchange


def flex_send(tokens: torch.Tensor, probs: torch.Tensor, ps: Any, topk: int, experts: int, *,
              permute_in_kernel: bool = False) -> tuple[torch.Tensor, FlexExchange]:
    """The dispatch's exchange (Megatron-core's ``dispatch``): each token with its weights packed,
    over the rails, then within the domain -> the rows held here ``[held, h + k]`` and the state."""
    T, h = tokens.shape
    plan = flex_plan(T, topk, experts, ps.ep_size, ps.ep_domain, ps.ep_rank)
    dev = tokens.device
    send1, send2, expand = (torch.tensor(r, dtype=torch.long, device=dev) for r in (plan.send1, plan.send2, plan.expand))
    payload = _Pack.apply(tokens, probs)  # the weights travel with the token
    rail = all_to_all(_Gather.apply(payload, send1, True), ps.ep_rail_group, plan.in1, plan.out1)
    held = all_to_all(_Gather.apply(rail, send2, True), ps.ep_domain_group, plan.in2, plan.out2)
    local = experts // ps.ep_size
    with _moved(True):  # the dispatch returns its tokens per local expert on the GPU
        per_expert = held.new_full((local,), len(plan.expand) // local, dtype=torch.long)
    return held, FlexExchange(plan=plan, send1=send1, send2=send2, expand=expand, tokens=T,
                              permute_in_kernel=permute_in_kernel, hidden=h, per_expert=per_expert)


def flex_receive(held: torch.Tensor, ex: FlexExchange, *, read_counts: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows held here -> the local experts' inputs and routing weights, expert-major (Megatron-core's
    ``dispatch_postprocess``). ``read_counts``: first read the tokens per expert back to the host, as
    Megatron-core's TEGroupedMLP does for its grouped GEMMs' splits (``tokens_per_expert.tolist()``,
    ``experts.py``): the host waits for the exchange, once per layer forward. The expert-parallel overlap
    (:mod:`models.ep_overlap`) reads them itself, where Megatron-core's host does."""
    if read_counts:
        ex.per_expert.cpu()
    x, w = _Unpack.apply(held, ex.hidden)
    weight = _Gather.apply(w, ex.expand, ex.permute_in_kernel).gather(
        1, torch.tensor(ex.plan.column, dtype=torch.long, device=held.device).unsqueeze(1))
    return _Gather.apply(x, ex.expand, ex.permute_in_kernel), weight


def flex_combine(out: torch.Tensor, ex: FlexExchange, ps: Any) -> torch.Tensor:
    """The experts' weighted outputs (one row per (token, expert), as :func:`flex_dispatch` gave the
    inputs) -> the combined output ``[T, h]``: :func:`flex_unpermute`, then :func:`flex_return`."""
    return flex_return(flex_unpermute(out, ex), ex, ps)


def flex_unpermute(out: torch.Tensor, ex: FlexExchange) -> torch.Tensor:
    """The experts' rows summed per token held here (Megatron-core's unpermute, or HybridEP's kernel)."""
    return _SumInto.apply(out, ex.expand, ex.held_rows, ex.permute_in_kernel)


def flex_return(per_rank: torch.Tensor, ex: FlexExchange, ps: Any) -> torch.Tensor:
    """The combine's exchange: sent back over NVLink and summed per domain, sent back over the rails
    and summed per token (the kernels' own sums) -> ``[T, h]``."""
    plan = ex.plan
    back = all_to_all(per_rank, ps.ep_domain_group, plan.out2, plan.in2)
    home = all_to_all(_SumInto.apply(back, ex.send2, ex.rail_rows, True), ps.ep_rail_group, plan.out1, plan.in1)
    return _SumInto.apply(home, ex.send1, ex.tokens, True)
