"""Column- and row-parallel linear layers (Megatron ``tensor_parallel/layers.py``).

The GEMMs run in :class:`LinearWithAsyncComm`, Megatron's
``LinearWithGradAccumulationAndAsyncCommunication``: in backward the data-gradient GEMM comes
first, then its TP all-reduce (or, with sequence parallelism, its reduce-scatter) is issued
asynchronously and the weight-gradient GEMM runs while it is in flight. Without
``async_allreduce`` (``--no-async-tensor-model-parallel-allreduce``; Megatron-LM before late 2021,
whose ``copy_to_tensor_model_parallel_region`` all-reduced in its own backward) the all-reduce
runs after both GEMMs and the compute stream waits for it. With sequence
parallelism the forward all-gathers the sequence-split input and the backward re-gathers it
(async, overlapped with the data-gradient GEMM) instead of keeping the gathered copy.

Gradient-accumulation fusion (Megatron's default ``--gradient-accumulation-fusion``): when the
weight has fp32 or bf16 main gradients (:mod:`models.distributed`), the weight-gradient GEMM
accumulates straight into ``weight.main_grad`` (``main_grad += dY^T X`` written in the buffer's
dtype: APEX's ``wgrad_gemm_accum_fp32`` / ``wgrad_gemm_accum_fp16``, the latter for bf16 too, and
Transformer Engine's ``fuse_wgrad_accumulation``) and autograd gets an unfilled placeholder, as
Megatron returns, so the DDP hook still fires and skips its add. fp16 main gradients (Megatron-LM
2020-21 runs without fp32 accumulation, before the 16-bit accumulating GEMM existed) get the weight
gradient back, and the DDP hook adds it into the buffer (one elementwise add per micro-batch).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any, Callable

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import is_fake

from heterosim.errors import ConfigError

from heterosim.annotate import get_annotator
from models.layers import fp8 as te_fp8
from models.layers.tp_overlap import RowGemmReduceScatter, ag_gemm
from models.layers.mappings import (
    all_gather_dim0,
    group_size,
    reduce_from_tp,
    reduce_scatter_to_sp,
)

__all__ = [
    "LinearWithAsyncComm",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "gemm_scope",
    "init_normal",
    "init_replicated",
    "scaled_init_std",
]


def gemm_scope(fp8: bool):
    """Context marking the GEMMs inside as low precision for the capture: fp8, or fp4 under the
    ``nvfp4`` recipe (:func:`models.layers.fp8.gemm_dtype`); a no-op without ``fp8``."""
    return get_annotator().scope(gemm_dtype=te_fp8.gemm_dtype()) if fp8 else nullcontext()


def scaled_init_std(std: float, num_layers: int) -> float:
    """Megatron's ``scaled_init_method_normal``: std / sqrt(2 * num_layers) for output projections."""
    return std / math.sqrt(2.0 * num_layers)


def init_normal(std: float) -> Callable[[torch.Tensor], Any]:
    return lambda w: nn.init.normal_(w, mean=0.0, std=std)


def init_replicated(std: float, seed: int | None) -> Callable[[torch.Tensor], Any]:
    """:func:`init_normal` for a parameter replicated over TP ranks: drawn from a generator seeded
    with ``seed`` (the same on every TP rank, as Megatron's default generator is), leaving the
    global generator as it was. ``seed`` None: the global generator."""
    def init(w: torch.Tensor) -> Any:
        if seed is None:
            return nn.init.normal_(w, mean=0.0, std=std)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return nn.init.normal_(w, mean=0.0, std=std)
    return init


class LinearWithAsyncComm(torch.autograd.Function):
    """``y = x @ W^T (+ b)`` with Megatron's overlapped TP communication in backward.

    ``allreduce_dgrad``: all-reduce the input gradient over ``group`` (column-parallel without SP):
    ``"async"`` overlapped with the weight-gradient GEMM, ``"sync"`` after it, ``""`` not at all.
    ``sequence_parallel``: the input is sequence-split; all-gather it in forward, re-gather it for
    wgrad and reduce-scatter the input gradient in backward.
    ``fp8``: fp8 GEMMs with Transformer Engine's casts and transposes (:mod:`models.layers.fp8`);
    ``fp8_input_cast``: the input arrives in bf16 and is cast here (False: a fused norm or
    activation wrote it in fp8); ``fp8_grad_cast``: the output gradient is cast and transposed here
    (False: the activation's backward did it, TE's fused ``dgelu`` cast-transpose before FC1).
    ``tp_overlap``: with SP, the forward all-gather as a ring exchange under the GEMM
    (:func:`models.layers.tp_overlap.ag_gemm`); ``aggregate``: two ring steps per GEMM.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, group, allreduce_dgrad, sequence_parallel, fp8, tp_overlap=False,
                fp8_input_cast=False, fp8_grad_cast=True, aggregate=False):
        ctx.save_for_backward(x, weight)
        ctx.use_bias = bias is not None
        ctx.group, ctx.allreduce_dgrad, ctx.sp, ctx.fp8 = group, allreduce_dgrad, sequence_parallel, fp8
        ctx.tp_overlap, ctx.fp8_grad_cast = tp_overlap, fp8_grad_cast
        if fp8 and (fp8_input_cast or not te_fp8.delayed()):
            # Beyond delayed scaling a fused norm / activation wrote x in bf16 (current scaling: with
            # its amax), and a sequence-parallel shard's amax is agreed over TP before its all-gather.
            te_fp8.cast(x, amax_taken=not fp8_input_cast, amax_group=group if sequence_parallel else None)
        if sequence_parallel and tp_overlap:  # ring-exchange all-gather under the GEMM (tp_overlap.py)
            out = ag_gemm(x.contiguous(), weight.t(), group, gemm_scope, fp8, aggregate=aggregate)
        else:
            with te_fp8.wire(fp8 and te_fp8.block_scaled()):  # TE 2.x gathers these inputs quantized
                total = all_gather_dim0(x, group) if sequence_parallel else x
            with gemm_scope(fp8):
                out = torch.matmul(total, weight.t())
        if bias is not None:
            out = out + bias
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        group = ctx.group
        if ctx.fp8 and ctx.fp8_grad_cast:  # TE's fp8_cast_transpose_fused (grad_output_preprocess)
            te_fp8.transpose(te_fp8.cast(grad_out))
        elif ctx.fp8 and not te_fp8.delayed():  # the fused dgelu wrote bf16 (and its amax)
            te_fp8.transpose(te_fp8.cast(grad_out, amax_taken=True))
        if ctx.sp:
            # Re-gather the input for wgrad while the dgrad GEMM runs (TE's bulk overlap moves the
            # fp8 copy the norm wrote: qkv_dgrad / fc1_dgrad are fp8 userbuffers; block-scaled
            # recipes gather the column-wise copy in either path).
            with te_fp8.wire(ctx.fp8 and (ctx.tp_overlap or te_fp8.block_scaled()), usage="columnwise"):
                total, gather = all_gather_dim0(x, group, async_op=True)
        else:
            total = x
        with gemm_scope(ctx.fp8):
            grad_in = grad_out.matmul(weight)
        if ctx.sp:
            gather.wait()
        if ctx.fp8:  # the fp8 input transposed for the wgrad GEMM
            te_fp8.transpose(te_fp8.fp8_like(total))
        grad_out2 = grad_out.reshape(-1, grad_out.shape[-1])
        total2 = total.reshape(-1, total.shape[-1])
        handle = None
        if ctx.sp:
            sub = grad_in.new_empty((grad_in.shape[0] // group_size(group), *grad_in.shape[1:]))
            handle = torch.distributed.reduce_scatter_tensor(
                sub, grad_in.contiguous(), group=group, async_op=True)
        elif ctx.allreduce_dgrad == "async":
            grad_in = grad_in.contiguous()
            handle = torch.distributed.all_reduce(grad_in, group=group, async_op=True)
        with gemm_scope(ctx.fp8):  # wgrad overlaps the collective above
            grad_w = _wgrad(weight, grad_out2.t(), total2)
        grad_b = grad_out2.sum(dim=0) if ctx.use_bias else None
        if ctx.allreduce_dgrad == "sync":
            grad_in = grad_in.contiguous()
            torch.distributed.all_reduce(grad_in, group=group)
        if handle is not None:
            handle.wait()
        return (sub if ctx.sp else grad_in), grad_w, grad_b, None, None, None, None, None, None, None, None


def _wgrad(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b``, the weight gradient; accumulated into an fp32 / bf16 ``weight.main_grad`` where
    there is one."""
    main = getattr(weight, "main_grad", None)
    if main is None or main.dtype not in (torch.float32, torch.bfloat16):
        return a.matmul(b)
    if main.dtype == a.dtype:
        torch.addmm(main, a, b, out=main)
    elif main.device.type == "cpu" and not is_fake(main):
        main.add_(a.matmul(b))  # real CPU tensors (tests): torch has no CPU addmm with out_dtype
    else:
        torch.addmm(main, a, b, out_dtype=main.dtype, out=main)
    weight.grad_added_to_main_grad = True
    # Megatron hands autograd an empty tensor so that the DDP post-hook runs (and skips its add).
    return torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)


class ColumnParallelLinear(nn.Module):
    """``Y = X A`` with ``A`` split by output columns over the TP group: ``[out/tp, in]`` per rank.

    Input ``[s(/tp with SP), b, in]``, output ``[s, b, out/tp]`` (never gathered: Megatron's
    ``gather_output=False``). In fp8 runs the input arrives in fp8 (TE fuses the cast into the
    norm before QKV / FC1); ``fp8_grad_cast=False``: so does the output gradient (TE's fused
    ``dgelu`` cast-transpose before FC1 with GeLU).
    """

    def __init__(self, in_features: int, out_features: int, *, tp_group: Any, sequence_parallel: bool,
                 bias: bool, dtype: torch.dtype, init_std: float, fp8: bool = False,
                 weight: nn.Parameter | None = None, async_allreduce: bool = True,
                 tp_comm_overlap: bool = False, fp8_grad_cast: bool = True, tp_comm_aggregate: bool = False) -> None:
        super().__init__()
        tp = group_size(tp_group)
        self.async_allreduce = async_allreduce
        if out_features % tp:
            raise ConfigError(f"output size {out_features} not divisible by tensor-parallel size {tp}")
        self.tp_group, self.tp = tp_group, tp
        self.sequence_parallel = sequence_parallel and tp > 1
        self.tp_comm_overlap = tp_comm_overlap and self.sequence_parallel
        self.tp_comm_aggregate = tp_comm_aggregate  # TE's aggregate: two ring steps per GEMM
        self.fp8, self.fp8_grad_cast = fp8, fp8_grad_cast
        if weight is None:
            weight = nn.Parameter(torch.empty(out_features // tp, in_features, dtype=dtype))
            init_normal(init_std)(weight)
            weight.tensor_model_parallel = tp > 1
            weight.partition_dim = 0
            weight.fp8_weight = fp8  # an fp8 GEMM's weight (fp8_params, models.distributed)
            self.weight = weight
        else:
            self.weight = weight  # shared (tied) weight owned by another module
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features // tp, dtype=dtype))
            self.bias.tensor_model_parallel = tp > 1
        else:
            self.bias = None

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        w = self.weight if weight is None else weight
        allreduce_dgrad = ("" if self.tp == 1 or self.sequence_parallel
                           else "async" if self.async_allreduce else "sync")
        return LinearWithAsyncComm.apply(x, w, self.bias, self.tp_group, allreduce_dgrad,
                                         self.sequence_parallel, self.fp8, self.tp_comm_overlap,
                                         False, self.fp8_grad_cast, self.tp_comm_aggregate)


class RowParallelLinear(nn.Module):
    """``Y = X A`` with ``A`` split by input rows: ``[out, in/tp]`` per rank.

    Input ``[s, b, in/tp]``; output ``[s(/tp with SP), b, out]`` after the TP all-reduce (or
    reduce-scatter with SP). With ``skip_bias_add`` the bias is returned for bias-dropout-add.
    ``fp8_input_cast=False``: in fp8 runs the input arrives in fp8 (TE's ``LayerNormMLP`` fuses the
    cast into the activation before FC2); True: cast here (TE ``Linear``, the attention projection).
    """

    def __init__(self, in_features: int, out_features: int, *, tp_group: Any, sequence_parallel: bool,
                 bias: bool, dtype: torch.dtype, init_std: float, skip_bias_add: bool = True,
                 fp8: bool = False, tp_comm_overlap: bool = False, fp8_input_cast: bool = True,
                 tp_comm_aggregate: bool = False, tp_comm_sm_margin: int = 0, tp_comm_fp8_buf: bool = False) -> None:
        super().__init__()
        self.fp8_input_cast = fp8_input_cast
        tp = group_size(tp_group)
        if in_features % tp:
            raise ConfigError(f"input size {in_features} not divisible by tensor-parallel size {tp}")
        self.tp_group, self.tp = tp_group, tp
        self.sequence_parallel = sequence_parallel and tp > 1
        self.tp_comm_overlap = tp_comm_overlap and self.sequence_parallel
        self.tp_comm_aggregate = tp_comm_aggregate  # the data-gradient ring exchange's
        self.tp_comm_sm_margin = tp_comm_sm_margin  # SMs the pipelined forward GEMM leaves to its RS
        self.tp_comm_fp8_buf = tp_comm_fp8_buf  # that RS moves fp8 (TE's fp8_buf) in fp8 runs
        self.skip_bias_add, self.fp8 = skip_bias_add, fp8
        self.weight = nn.Parameter(torch.empty(out_features, in_features // tp, dtype=dtype))
        init_normal(init_std)(self.weight)
        self.weight.tensor_model_parallel = tp > 1
        self.weight.partition_dim = 1
        self.weight.fp8_weight = fp8  # an fp8 GEMM's weight (fp8_params, models.distributed)
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype))
            # Megatron all-reduces this bias's gradient over TP when it is sequence-parallel.
            self.bias.sequence_parallel = self.sequence_parallel
        else:
            self.bias = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.tp_comm_overlap:  # pipelined GEMM + reduce-scatter (tp_overlap.py)
            out = RowGemmReduceScatter.apply(x, self.weight, self.tp_group, self.fp8, gemm_scope, _wgrad,
                                             self.fp8_input_cast, self.tp_comm_aggregate, self.tp_comm_sm_margin,
                                             self.tp_comm_fp8_buf)
        else:
            out = LinearWithAsyncComm.apply(x, self.weight, None, self.tp_group, False, False, self.fp8,
                                            False, self.fp8_input_cast)
            if self.sequence_parallel:
                out = reduce_scatter_to_sp(out, self.tp_group)
            else:
                out = reduce_from_tp(out, self.tp_group)
        if self.skip_bias_add:
            return out, self.bias
        return (out + self.bias if self.bias is not None else out), None

