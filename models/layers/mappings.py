"""Tensor-parallel communication as autograd functions (Megatron ``tensor_parallel/mappings.py``).

Each mapping is the identity when its group has one rank, exactly as Megatron skips the
collective then. Sequence-parallel tensors are split along dim 0 (the sequence: activations are
``[s, b, h]``).

==============================  ===========================  ==============================
mapping                         forward                      backward
==============================  ===========================  ==============================
copy_to_tp                      identity                     all-reduce
reduce_from_tp                  all-reduce                   identity
scatter_to_sp                   split dim 0 (no comm)        all-gather dim 0
gather_from_sp                  all-gather dim 0             reduce-scatter dim 0
reduce_scatter_to_sp            reduce-scatter dim 0         all-gather dim 0
==============================  ===========================  ==============================
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "group_size",
    "group_rank",
    "all_gather_dim0",
    "reduce_scatter_dim0",
    "copy_to_tp",
    "reduce_from_tp",
    "scatter_to_sp",
    "gather_from_sp",
    "reduce_scatter_to_sp",
]


def group_size(group: Any) -> int:
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group: Any) -> int:
    return 0 if group is None else dist.get_rank(group)


def all_gather_dim0(x: torch.Tensor, group: Any, async_op: bool = False):
    """All-gather ``x`` along dim 0 into a new tensor; returns ``(out, work)`` when async."""
    n = group_size(group)
    out = x.new_empty((x.shape[0] * n, *x.shape[1:]))
    work = dist.all_gather_into_tensor(out, x.contiguous(), group=group, async_op=async_op)
    return (out, work) if async_op else out


def reduce_scatter_dim0(x: torch.Tensor, group: Any, async_op: bool = False):
    """Reduce-scatter ``x`` along dim 0; returns ``(out, work)`` when async."""
    n = group_size(group)
    out = x.new_empty((x.shape[0] // n, *x.shape[1:]))
    work = dist.reduce_scatter_tensor(out, x.contiguous(), group=group, async_op=async_op)
    return (out, work) if async_op else out


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class _ScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        n, r = group_size(group), group_rank(group)
        chunk = x.shape[0] // n
        return x[r * chunk:(r + 1) * chunk].contiguous()

    @staticmethod
    def backward(ctx, g):
        return all_gather_dim0(g, ctx.group), None


class _GatherFromSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_dim0(x, group)

    @staticmethod
    def backward(ctx, g):
        return reduce_scatter_dim0(g, ctx.group), None


class _ReduceScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_dim0(x, group)

    @staticmethod
    def backward(ctx, g):
        return all_gather_dim0(g, ctx.group), None


def copy_to_tp(x: torch.Tensor, group: Any) -> torch.Tensor:
    return x if group_size(group) == 1 else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: Any) -> torch.Tensor:
    return x if group_size(group) == 1 else _ReduceFromTP.apply(x, group)


def scatter_to_sp(x: torch.Tensor, group: Any) -> torch.Tensor:
    return x if group_size(group) == 1 else _ScatterToSP.apply(x, group)


def gather_from_sp(x: torch.Tensor, group: Any) -> torch.Tensor:
    return x if group_size(group) == 1 else _GatherFromSP.apply(x, group)


def reduce_scatter_to_sp(x: torch.Tensor, group: Any) -> torch.Tensor:
    return x if group_size(group) == 1 else _ReduceScatterToSP.apply(x, group)
