"""Block-scaled quantization as Transformer Engine runs it: NVFP4 (``--fp4-format e2m1``) and MXFP8
or fp8 blockwise (``--fp8-recipe mxfp8`` / ``blockwise``).

These recipes scale small blocks of a tensor, along rows for the copy a GEMM reads row-wise
(fprop, dgrad) and along columns for the copy the weight-gradient GEMM reads, so the two copies
are not transposes of each other: "when Transformer Engine needs both the tensor and its transpose
... both versions are computed from the high precision input" (``NVFP4BlockScaling``'s docstring,
``transformer_engine/common/recipe/__init__.py``; TE's MXFP8 and blockwise quantizers write both
usages in one kernel the same way). So one quantize kernel reads the bf16 tensor and writes both
copies, and no transpose runs. All-gathers of a quantized tensor move the data and scales of the
copies needed (``_all_gather_nvfp4``, ``_all_gather_mxfp8``, ``_start_all_gather_fp8_blockwise`` in
``pytorch/distributed.py``). The formats:

- **NVFP4** (TE 2.8+ ``NVFP4BlockScaling``; Megatron-core's ``--fp4-recipe nvfp4``, Megatron
  Bridge's ``bf16_with_nvfp4_mixed``): e2m1 values, two per byte, one e4m3 scale per 16 values and
  an fp32 scale for the whole tensor ("Pretraining Large Language Models with NVFP4",
  arXiv:2509.25149). The whole-tensor scale comes from the tensor's amax, so an amax pass runs
  before the quantize (current scaling; all-reduced over TP for a sequence-parallel shard,
  ``set_quantizer_amax_reduction_group``, ``module/linear.py``). Inputs and gradients get a 16 x 16
  random Hadamard transform on their column-wise copy; TE takes the amax of the tensor and of its
  transform in one pass (``hadamard_transform_amax``). 1.125 bytes written per element.
- **MXFP8** (``MXFP8BlockScaling``, Blackwell) and **fp8 blockwise** (``Float8BlockScaling``, the
  DeepSeek-V3 scheme): e4m3 values with one e8m0 (power of two) scale per 32 values, or one fp32
  scale per 128 (1 x 128 blocks for activations and gradients): 1/32 byte of scale per element
  either way. Each block's scale comes from the block itself, inside the quantize kernel: no amax
  pass, nothing all-reduced. 2.0625 bytes written per element. The blockwise recipe is run with the
  MXFP8 op (same bytes; its numerics are MX's).

Weights (16 x 16 or 128 x 128 two-dimensional blocks for NVFP4 and blockwise) are quantized once
per iteration and, like fp8's weight casts, left out here (~1% of the casts' bytes).

The quantize ops are real PyTorch custom ops, so a capture records one kernel with exactly their
traffic. For ``x`` seen as ``[rows, cols]`` (its last dim is ``cols``; partial blocks round up):

- ``heterosim::nvfp4_quantize(Tensor x)``: row-wise data ``uint8 [rows, cols / 2]`` and scales
  ``float8_e4m3fn [rows, cols / 16]``, column-wise data ``uint8 [cols, rows / 2]`` and scales
  ``[cols, rows / 16]``;
- ``heterosim::mxfp8_quantize(Tensor x)``: row-wise data ``float8_e4m3fn [rows, cols]`` and scales
  ``uint8 [rows, cols / 32]``, column-wise data ``[cols, rows]`` and scales ``[cols, rows / 32]``.

Their eager kernels compute the real quantization (NVFP4 without the Hadamard transform and
stochastic rounding, which change values, not shapes or traffic), so the ops run outside a capture.

NB: ignores stochastic rounding's random-number cost (compute under the memory traffic), the
scales' swizzled padding to 128 x 4 tiles (<1% of the bytes at these sizes) and the global-scale
bookkeeping (a few bytes).
"""

from __future__ import annotations

from typing import Callable

import torch

from heterosim.errors import ConfigError

__all__ = ["NVFP4_QUANTIZE", "MXFP8_QUANTIZE", "NVFP4_BLOCK", "MX_BLOCK", "nvfp4_quantize", "mxfp8_quantize"]

NVFP4_QUANTIZE = "heterosim::nvfp4_quantize"
MXFP8_QUANTIZE = "heterosim::mxfp8_quantize"
NVFP4_BLOCK = 16
"""Values sharing one e4m3 scale (NVFP4's 1-D block)."""
MX_BLOCK = 32
"""Values sharing one e8m0 scale (the OCP MX block)."""
_E2M1_MAX, _E4M3_MAX = 6.0, 448.0
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_Quads = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _matrix(x: torch.Tensor, op: str) -> tuple[int, int]:
    """``x`` as a matrix ``[rows, cols]`` (its last dim is ``cols``)."""
    if x.dim() < 2 or not x.dtype.is_floating_point:
        raise ConfigError(f"{op} takes a floating-point tensor of at least 2 dims, got {x.dtype} "
                          f"of shape {tuple(x.shape)}")
    cols = x.shape[-1]
    return (x.numel() // cols if cols else 0), cols


def _up(n: int, to: int) -> int:
    return -(-n // to) * to


def _padded(x: torch.Tensor, rows: int, cols: int, block: int) -> torch.Tensor:
    """``x`` as an fp32 ``[rows, cols]`` matrix zero-padded to whole blocks both ways."""
    m = x.new_zeros((_up(rows, block), _up(cols, block)), dtype=torch.float32)
    m[:rows, :cols] = x.reshape(rows, cols)
    return m


def _nvfp4_rows(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise NVFP4 of ``m [r, c]`` (fp32): packed e2m1 codes ``uint8 [r, c/2]``, e4m3 block scales."""
    r, c = m.shape
    global_scale = m.abs().amax().clamp_min(1e-30) / (_E2M1_MAX * _E4M3_MAX)
    blocks = m.reshape(r, c // NVFP4_BLOCK, NVFP4_BLOCK)
    scale = (blocks.abs().amax(-1) / _E2M1_MAX / global_scale).clamp(max=_E4M3_MAX).to(torch.float8_e4m3fn)
    denom = (scale.to(torch.float32) * global_scale).clamp_min(1e-30).unsqueeze(-1)
    v = (blocks / denom).clamp(-_E2M1_MAX, _E2M1_MAX)
    grid = torch.tensor(_E2M1, dtype=torch.float32, device=m.device)
    code = (v.abs().unsqueeze(-1) - grid).abs().argmin(-1).to(torch.uint8) | ((v < 0).to(torch.uint8) << 3)
    code = code.reshape(r, c)
    return (code[:, 0::2] | (code[:, 1::2] << 4)).contiguous(), scale


def _mxfp8_rows(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise MXFP8 of ``m [r, c]`` (fp32): e4m3 values and biased e8m0 exponents ``uint8 [r, c/32]``
    (OCP MX v1.0: shared exponent floor(log2(amax)) - emax(e4m3) = -8)."""
    r, c = m.shape
    blocks = m.reshape(r, c // MX_BLOCK, MX_BLOCK)
    amax = blocks.abs().amax(-1).clamp_min(2.0**-126)
    exp = (torch.floor(torch.log2(amax)) - 8).clamp(-127, 127)
    data = (blocks / torch.exp2(exp).unsqueeze(-1)).clamp(-_E4M3_MAX, _E4M3_MAX).to(torch.float8_e4m3fn)
    return data.reshape(r, c), (exp + 127).to(torch.uint8)


def _both(x: torch.Tensor, op: str, block: int, rows_fn: Callable, elems: int) -> _Quads:
    rows, cols = _matrix(x, op)
    m = _padded(x, rows, cols, block)
    (rd, rs), (cd, cs) = rows_fn(m), rows_fn(m.t().contiguous())
    return rd[:rows, :_up(cols, elems) // elems], rs[:rows], cd[:cols, :_up(rows, elems) // elems], cs[:cols]


def _fake(x: torch.Tensor, op: str, block: int, elems: int, data_dtype: torch.dtype,
          scale_dtype: torch.dtype) -> _Quads:
    """Empty outputs of a quantize op; ``elems`` values per data byte."""
    rows, cols = _matrix(x, op)
    data = lambda r, c: x.new_empty((r, _up(c, elems) // elems), dtype=data_dtype)  # noqa: E731
    scale = lambda r, c: x.new_empty((r, _up(c, block) // block), dtype=scale_dtype)  # noqa: E731
    return data(rows, cols), scale(rows, cols), data(cols, rows), scale(cols, rows)


_OPS = {  # op name -> (eager kernel, fake kernel)
    NVFP4_QUANTIZE: (lambda x: _both(x, NVFP4_QUANTIZE, NVFP4_BLOCK, _nvfp4_rows, 2),
                     lambda x: _fake(x, NVFP4_QUANTIZE, NVFP4_BLOCK, 2, torch.uint8, torch.float8_e4m3fn)),
    MXFP8_QUANTIZE: (lambda x: _both(x, MXFP8_QUANTIZE, MX_BLOCK, _mxfp8_rows, 1),
                     lambda x: _fake(x, MXFP8_QUANTIZE, MX_BLOCK, 1, torch.float8_e4m3fn, torch.uint8)),
}


def _register() -> None:
    for qualname, (eager, fake) in _OPS.items():
        ns, name = qualname.split("::")
        if hasattr(getattr(torch.ops, ns), name):  # already registered by an earlier import
            continue
        op = torch.library.custom_op(qualname, eager, mutates_args=(),
                                     schema="(Tensor x) -> (Tensor, Tensor, Tensor, Tensor)")
        op.register_fake(fake)


_register()


def nvfp4_quantize(x: torch.Tensor) -> _Quads:
    """Both NVFP4 copies of ``x`` (row-wise and column-wise, each data and scales): one kernel."""
    return torch.ops.heterosim.nvfp4_quantize.default(x)


def mxfp8_quantize(x: torch.Tensor) -> _Quads:
    """Both MXFP8 copies of ``x`` (row-wise and column-wise, each data and scales): one kernel."""
    return torch.ops.heterosim.mxfp8_quantize.default(x)
