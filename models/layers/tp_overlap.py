"""Tensor-parallel communication overlapped with the GEMMs, as Megatron-core's ``--tp-comm-overlap``
runs it through Transformer Engine's userbuffers (sequence parallelism only).

TE's default configuration (``transformer_engine/pytorch/module/base.py``, ``initialize_ub``; the
same methods in NeMo's per-model ``ub_cfg`` files) overlaps each TP collective of a transformer
layer with a GEMM in one of three ways:

- *ring exchange* (QKV and FC1 forward, proj and FC2 data-gradient): the all-gather of the
  sequence-split input is cut into ``tp`` steps, and the GEMM on the rows already gathered runs
  while the next rows travel, so only one step's transfer is exposed;
- *pipeline* (proj and FC2 forward): the GEMM is cut into chunks of rows (``num_splits``, 4 by
  default); each chunk's output is reduce-scattered while the next chunk is computed;
- *bulk* (QKV and FC1 data- and weight-gradient): the input re-gather runs under the
  data-gradient GEMM and the gradient reduce-scatter under the weight-gradient GEMM, which
  :class:`models.layers.linear.LinearWithAsyncComm` already does without this flag.

Here every rank runs the same program (one captured rank stands for its TP group): ring step ``i``
is a broadcast of TP rank ``i``'s shard into its region of a rank-major buffer (each rank first
copies its own shard there, as TE copies its input into the userbuffer), and the GEMM on region
``i`` runs while region ``i + 1`` travels (with TE's ``aggregate``, the GEMM takes two regions at a
time and the next two travel under it); the pipelined reduce-scatter cuts the GEMM into
``PIPELINE_SPLITS`` chunks of consecutive regions (one per region when TP does not divide by it),
and after each chunk's GEMM reduces each of its regions to the region's TP rank, under the next
chunk's GEMM. With TE's ``set_sm_margin`` the pipelined GEMM leaves ``num_sm`` SMs to the
reduce-scatter kernel (``sm_margin``, recorded on the GEMM for pricing). Each rank moves the bytes
of the plain all-gather / reduce-scatter and the results are the unsplit layer's numbers. What this
ignores: TE moves the ring's steps peer-to-peer by copy engine or a few SMs, priced here as NCCL
broadcasts / reduces of the same bytes with NCCL's per-call latency; TE's first step overlaps the
GEMM on the rank's own rows, here region 0 is broadcast before any GEMM (``1/tp`` of the transfer
exposed). In fp8 runs the ring exchanges move one byte per element (TE's all-gather userbuffers are
fp8, :mod:`models.layers.fp8`); the pipelined reduce-scatters move the activation dtype (TE's
default), or one byte per element where ``fp8_buf`` is set on them (``--tp-comm-overlap-fp8-buf``:
TE's GEMM then writes fp8 into the userbuffer and its reduce-scatter kernel sums the fp8 chunks
into a bf16 output). NB: the GEMM here still writes bf16, twice the output bytes of TE's fp8
write (the GEMM is compute-bound, its output a small share of its traffic).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from heterosim.annotate import get_annotator
from models.layers import fp8 as te_fp8
from models.layers.mappings import group_rank, group_size

__all__ = ["ag_gemm", "RowGemmReduceScatter", "PIPELINE_SPLITS", "pipeline_chunks", "RING_EXCHANGE_OPS",
           "PIPELINE_OPS"]

RING_EXCHANGE_OPS = ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad")
"""TE's ring-exchange overlaps (``ub_tp_comm_overlap_cfg`` names): the column-parallel forward
all-gathers (QKV, FC1) and the row-parallel data-gradient all-gathers (proj, FC2)."""
PIPELINE_OPS = ("proj_fprop", "fc2_fprop")
"""TE's pipelined reduce-scatter overlaps: the row-parallel forward GEMMs (attention proj, FC2)."""

PIPELINE_SPLITS = 4
"""``num_splits`` of TE's pipelined reduce-scatter overlap (its default in ``initialize_ub``, and
the value every DGX Cloud v24.11.1 recipe's ``ub_tp_comm_overlap_cfg`` gives ``proj_fprop`` and
``fc2_fprop``)."""


def pipeline_chunks(tp: int, splits: int = PIPELINE_SPLITS) -> list[range]:
    """The TP regions each pipelined GEMM chunk covers: ``splits`` chunks of ``tp / splits``
    consecutive regions when ``splits`` divides ``tp``, else one chunk per region
    (NB: TE then cuts finer than a region; here a region is the smallest chunk)."""
    per = tp // splits if splits <= tp and tp % splits == 0 else 1
    return [range(c, c + per) for c in range(0, tp, per)]


def _src(group: Any, i: int) -> int:
    return dist.get_global_rank(group, i)


def ag_gemm(shard: torch.Tensor, weight_t: torch.Tensor, group: Any, scope: Callable[[bool], Any],
            fp8: bool, gathered: torch.Tensor | None = None, aggregate: bool = False) -> torch.Tensor:
    """``all_gather(shard) @ weight_t`` as a ring exchange: ``shard [s/tp, b, k]``, ``weight_t
    [k, n]`` -> ``[s, b, n]``; ``gathered`` (``[s, b, k]``) receives the gathered input if given;
    ``scope(fp8)`` is the context each GEMM runs in (:func:`models.layers.linear.gemm_scope`);
    ``aggregate`` (even TP): each GEMM on two regions (TE's ``aggregate: 1``)."""
    tp, rows, b, k = group_size(group), shard.shape[0], shard.shape[1], shard.shape[2]
    n = weight_t.shape[1]
    buf = gathered if gathered is not None else shard.new_empty((tp * rows, b, k))
    regions = buf.view(tp, rows, b, k)
    regions[group_rank(group)].copy_(shard)
    per = 2 if aggregate and tp % 2 == 0 else 1
    ins = buf.view(tp // per, per * rows * b, k)
    out = shard.new_empty((tp * rows, b, n))
    outs = out.view(tp // per, per * rows * b, n)

    def send(step: int) -> list:
        with te_fp8.wire(fp8):
            return [dist.broadcast(regions[i], src=_src(group, i), group=group, async_op=True)
                    for i in range(step * per, (step + 1) * per)]

    works = send(0)
    for step in range(tp // per):
        for w in works:
            w.wait()
        if step + 1 < tp // per:
            works = send(step + 1)
        with scope(fp8):
            torch.mm(ins[step], weight_t, out=outs[step])
    return out


class RowGemmReduceScatter(torch.autograd.Function):
    """Row-parallel linear with sequence parallelism under ``--tp-comm-overlap``:
    ``x [s, b, f/tp] @ weight^T`` reduce-scattered to ``[s/tp, b, h]`` region by region (GEMM on
    TP rank ``i``'s rows, then an async reduce to ``i``); backward gathers ``grad_out`` by ring
    exchange under the data-gradient GEMMs, then runs the weight-gradient GEMM on it. In fp8 runs
    the input is cast first where ``fp8_input_cast``, the shard of ``grad_out`` is cast before its
    fp8 ring exchange, and both wgrad operands are transposed (:mod:`models.layers.fp8`)."""

    @staticmethod
    def forward(ctx, x, weight, group, fp8, scope_fn, wgrad_fn, fp8_input_cast=True, aggregate_dgrad=False,
                sm_margin=0, fp8_buf=False):
        x = x.contiguous()
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.fp8, ctx.scope_fn, ctx.wgrad_fn = group, fp8, scope_fn, wgrad_fn
        ctx.aggregate = aggregate_dgrad
        if fp8 and (fp8_input_cast or not te_fp8.delayed()):  # see LinearWithAsyncComm
            te_fp8.cast(x, amax_taken=not fp8_input_cast)
        tp = group_size(group)
        s, b, f = x.shape
        h, rows = weight.shape[0], s // tp
        y = x.new_empty((tp, rows, b, h))
        works = []
        for chunk in pipeline_chunks(tp):
            lo, hi = chunk.start, chunk.stop
            with scope_fn(fp8), get_annotator().scope(sm_margin=sm_margin or None):
                torch.mm(x[lo * rows:hi * rows].view(-1, f), weight.t(), out=y[lo:hi].view(-1, h))
            with te_fp8.wire(fp8 and fp8_buf, usage="output"):
                works += [dist.reduce(y[i], dst=_src(group, i), group=group, async_op=True) for i in chunk]
        for work in works:
            work.wait()
        # This rank's region now holds the sum over TP (a view: the buffer lives as long as the
        # output does, which the residual add consumes at once).
        return y[group_rank(group)]

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        tp = group_size(ctx.group)
        if ctx.fp8:  # grad_output_preprocess: cast_to_fp8 of the shard into the userbuffer (its
            te_fp8.cast(grad_out, amax_group=ctx.group)  # amax agreed over TP under current scaling)
        gathered = grad_out.new_empty((tp * grad_out.shape[0], *grad_out.shape[1:]))
        grad_in = ag_gemm(grad_out.contiguous(), weight, ctx.group, ctx.scope_fn, ctx.fp8, gathered=gathered,
                          aggregate=ctx.aggregate)
        if ctx.fp8:  # fp8_transpose of the gathered gradient and of the input, for the wgrad GEMM
            te_fp8.transpose(te_fp8.fp8_like(gathered))
            te_fp8.transpose(te_fp8.fp8_like(x))
        with ctx.scope_fn(ctx.fp8):
            grad_w = ctx.wgrad_fn(weight, gathered.reshape(-1, gathered.shape[-1]).t(),
                                  x.reshape(-1, x.shape[-1]))
        return grad_in, grad_w, None, None, None, None, None, None, None, None
