"""What Transformer Engine runs around an fp8 GEMM besides the GEMM itself (``--fp8-format``).

The GEMMs of a transformer layer are marked fp8 for pricing (:func:`models.layers.linear.gemm_scope`)
while their tensors stay in the activation dtype here. Transformer Engine 1.x (NeMo 24.09 ships TE
1.11; ``transformer_engine/pytorch/module/{base,linear,layernorm_linear,layernorm_mlp}.py``) also:

- *casts* each GEMM operand it does not receive in fp8: ``cast_to_fp8`` reads the bf16 tensor and
  writes one byte per element (its amax is taken in the same kernel);
- *transposes* fp8 operands for the weight-gradient GEMM (Hopper's fp8 tensor-core GEMMs take
  only the "TN" layout): ``fp8_transpose`` reads and writes one byte per element, or
  ``fp8_cast_transpose_fused`` does cast and transpose in one pass;
- *moves fp8 on the wire* where it overlaps TP communication with userbuffers: ``initialize_ub``
  allocates the buffers of ``layers_all_gather_overlap`` (``qkv_fprop``, ``qkv_dgrad``,
  ``proj_dgrad``, ``fc1_fprop``, ``fc1_dgrad``, ``fc2_dgrad``) as ``torch.uint8`` in fp8 runs, so
  those all-gathers move 1 byte per element (reduce-scatters stay in bf16 unless a recipe sets
  ``fp8_buf`` on a pipelined one).

Which operand arrives in fp8: the layer norm before QKV and FC1 writes fp8 (TE's
``LayerNormLinear`` / ``LayerNormMLP`` fuse the cast into the norm), so does the activation before
FC2 (fused ``fp8_gelu`` / ``srelu`` / ``swiglu``); the attention output before the projection
does not (TE ``Linear`` casts it). Gradients: a column-parallel layer's output gradient is cast and
transposed (``fp8_cast_transpose_fused``; before FC1 with GeLU it is fused into the activation's
backward, ``fp8_cast_transpose_bgrad_dgelu_fused``, other activations run theirs in bf16 first); a
row-parallel layer's, sequence-split, is cast on the rank's shard, all-gathered in fp8 and
transposed after (``grad_output_preprocess``).

Approximations: a fused cast-transpose is run here as a cast then a transpose of the fp8 result
(5 instead of 4 bytes per element, one launch more); the per-iteration transpose of fp8 weights
(``fp8_params``: once per weight per iteration, ~1% of the casts' bytes), the amax-history /
scale update kernels and the amax all-reduce (a few kB per micro-batch) are left out.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from heterosim.annotate import get_annotator

__all__ = ["FP8", "cast", "transpose", "fp8_like", "wire"]

FP8 = torch.float8_e4m3fn
"""The storage type of the casts (e4m3 and e5m2 both take one byte; pricing needs no more)."""


def wire(fp8: bool):
    """Context in which collectives move one byte per element (TE's fp8 userbuffers); a no-op
    without ``fp8``."""
    return get_annotator().scope(comm_dtype="fp8") if fp8 else nullcontext()


def cast(x: torch.Tensor) -> torch.Tensor:
    """``cast_to_fp8``: ``x`` read in its dtype, written in fp8 (same shape)."""
    return x.to(FP8)


def transpose(x8: torch.Tensor) -> torch.Tensor:
    """``fp8_transpose`` of ``x8`` seen as a matrix ``[rows, last dim]``: ``[last dim, rows]``."""
    return x8.reshape(-1, x8.shape[-1]).t().contiguous()


def fp8_like(x: torch.Tensor) -> torch.Tensor:
    """An fp8 tensor shaped like ``x``, standing for an operand TE holds in fp8 (the norm's or the
    activation's fused output, an fp8 all-gather buffer); allocating it runs no kernel."""
    return torch.empty(x.shape, dtype=FP8, device=x.device)
