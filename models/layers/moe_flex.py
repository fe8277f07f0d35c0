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

Routing (an assumption, as in :mod:`models.layers.moe`): data-decided routing cannot run under
FakeTensorMode, so it is fixed, and balanced. Copy ``j`` of local token ``t`` goes to expert
``perm[(t*k + j) mod E]`` with ``perm`` a fixed pseudo-random permutation of the experts: every
expert gets exactly ``T*k/E`` copies from each rank (so the experts' GEMMs have the all-to-all
path's shapes), and a token's ``k`` experts are ``k`` distinct experts spread as a uniform draw
without replacement spreads them, which is what the deduplication depends on (Megatron Bridge's
benchmarks force-balance routing with random logits, ``moe_router_force_load_balancing``). Split
sizes follow from that routing in Python. This ignores DeepEP's SMs taken from compute (its
kernels run on 20-32 SMs beside the GEMMs) and the all-to-all's chunked pipelining.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.distributed as dist

from models.layers.mappings import group_size

__all__ = ["FlexPlan", "flex_plan", "flex_dispatch_combine", "all_to_all"]


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


def flex_dispatch_combine(tokens: torch.Tensor, probs: torch.Tensor, ps: Any, topk: int, experts: int,
                          run_experts: Any) -> torch.Tensor:
    """``tokens [T, h]``, routing weights ``probs [T, k]`` -> the combined expert output ``[T, h]``.

    ``run_experts(x [local * ep * T*k/E, h]) -> [same]`` runs the local experts on their inputs,
    expert-major (each expert's ``ep * T*k/E`` rows together)."""
    T, h = tokens.shape
    plan = flex_plan(T, topk, experts, ps.ep_size, ps.ep_domain, ps.ep_rank)
    dev = tokens.device

    def idx(rows: tuple[int, ...]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.long, device=dev)

    send1, send2, expand = idx(plan.send1), idx(plan.send2), idx(plan.expand)
    payload = torch.cat([tokens, probs.to(tokens.dtype)], dim=1)  # the weights travel with the token
    rail = all_to_all(payload.index_select(0, send1), ps.ep_rail_group, plan.in1, plan.out1)
    held = all_to_all(rail.index_select(0, send2), ps.ep_domain_group, plan.in2, plan.out2)
    x = held[:, :h].index_select(0, expand)
    weight = held[:, h:].index_select(0, expand).gather(1, idx(plan.column).unsqueeze(1))
    out = run_experts(x) * weight  # one row per (token, local expert), weighted
    per_rank = torch.zeros((held.shape[0], h), dtype=out.dtype, device=dev).index_add(0, expand, out)
    back = all_to_all(per_rank, ps.ep_domain_group, plan.out2, plan.in2)
    per_domain = torch.zeros((rail.shape[0], h), dtype=out.dtype, device=dev).index_add(0, send2, back)
    home = all_to_all(per_domain, ps.ep_rail_group, plan.out1, plan.in1)
    return torch.zeros_like(tokens).index_add(0, send1, home)
