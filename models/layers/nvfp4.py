"""NVFP4 quantization as Transformer Engine's ``NVFP4BlockScaling`` recipe runs it (``--fp4-format e2m1``).

TE 2.8+ (``transformer_engine/common/recipe/__init__.py``, ``NVFP4BlockScaling``; the recipe of
Megatron-core's ``--fp4-recipe nvfp4`` and Megatron Bridge's ``bf16_with_nvfp4_mixed``) stores a
tensor as e2m1 values, two per byte, with one e4m3 scale per 16 consecutive values and one fp32
scale for the whole tensor (the two-level scaling of "Pretraining Large Language Models with
NVFP4", arXiv:2509.25149). Its GEMMs take both operands in NVFP4, in every direction (fprop, dgrad,
wgrad); what this means for a training step:

- The scale of a tensor comes from its own amax (current scaling), so an amax pass over the bf16
  tensor runs before the cast. Inputs and gradients are quantized with a 16 x 16 random Hadamard
  transform on their column-wise copy (the one the weight-gradient GEMM reads); TE takes the amax
  of the tensor and of its transform in one pass (``hadamard_transform_amax``). Where the tensor is
  a sequence-parallel shard about to be all-gathered, the amax is all-reduced (MAX) over TP first
  (``set_quantizer_amax_reduction_group``, ``module/linear.py``), as for fp8 current scaling.
- Scaling runs along rows or along columns, so the transposed copy is not the row-wise copy
  transposed: "when Transformer Engine needs both the tensor and its transpose ... both versions
  are computed from the high precision input" (the recipe's docstring). One quantize kernel reads
  the bf16 tensor and writes both copies, each half a byte per element plus its scales
  (:func:`quantize`); no separate transpose runs.
- All-gathers of a quantized tensor move the packed bytes and scales (``_all_gather_nvfp4``,
  ``pytorch/distributed.py``): both copies where both are needed, the column-wise one alone for the
  weight-gradient re-gather.
- Weights take 16 x 16 two-dimensional blocks without the transform; like fp8's weight casts they
  are quantized once per iteration and are left out here (~1% of the casts' bytes).

The quantize op is a real PyTorch custom op, so a capture records one kernel with exactly its
traffic: ``heterosim::nvfp4_quantize(Tensor x) -> (Tensor, Tensor, Tensor, Tensor)`` gives, for
``x`` seen as ``[rows, cols]`` (its last dim is ``cols``), the row-wise data ``uint8 [rows,
cols / 2]`` and scales ``float8_e4m3fn [rows, cols / 16]`` and the column-wise data ``uint8 [cols,
rows / 2]`` and scales ``[cols, rows / 16]`` (partial blocks rounded up): 2 bytes read and 1.125
written per element. Its eager
kernel computes the real two-level quantization (without the Hadamard transform and stochastic
rounding, which change values, not shapes or traffic) so that the op runs outside a capture too.

NB: ignores stochastic rounding's random-number cost on the gradients' copies (compute hidden under
the memory traffic), the scales' swizzled padding to 128 x 4 tiles (<1% of the bytes at these sizes)
and the fp32 global-scale bookkeeping (a few bytes).
"""

from __future__ import annotations

import torch

from heterosim.errors import ConfigError

__all__ = ["QUANTIZE", "BLOCK", "quantize"]

QUANTIZE = "heterosim::nvfp4_quantize"
BLOCK = 16
"""Values sharing one e4m3 scale (NVFP4's 1-D block)."""
_E2M1_MAX, _E4M3_MAX = 6.0, 448.0
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _check(x: torch.Tensor) -> tuple[int, int]:
    """``x`` as a matrix ``[rows, cols]`` (its last dim is ``cols``)."""
    if x.dim() < 2 or not x.dtype.is_floating_point:
        raise ConfigError(f"{QUANTIZE} takes a floating-point tensor of at least 2 dims, got {x.dtype} "
                          f"of shape {tuple(x.shape)}")
    cols = x.shape[-1]
    return (x.numel() // cols if cols else 0), cols


def _up(n: int, to: int) -> int:
    return -(-n // to) * to


def _pack(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise NVFP4 of ``m [r, c]`` (fp32): packed e2m1 codes ``uint8 [r, c/2]``, e4m3 block scales."""
    r, c = m.shape
    global_scale = m.abs().amax().clamp_min(1e-30) / (_E2M1_MAX * _E4M3_MAX)
    blocks = m.reshape(r, c // BLOCK, BLOCK)
    scale = (blocks.abs().amax(-1) / _E2M1_MAX / global_scale).clamp(max=_E4M3_MAX).to(torch.float8_e4m3fn)
    denom = (scale.to(torch.float32) * global_scale).clamp_min(1e-30).unsqueeze(-1)
    v = (blocks / denom).clamp(-_E2M1_MAX, _E2M1_MAX)
    grid = torch.tensor(_E2M1, dtype=torch.float32, device=m.device)
    code = (v.abs().unsqueeze(-1) - grid).abs().argmin(-1).to(torch.uint8) | ((v < 0).to(torch.uint8) << 3)
    code = code.reshape(r, c)
    return (code[:, 0::2] | (code[:, 1::2] << 4)).contiguous(), scale


def _quantize_eager(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, cols = _check(x)
    m = x.new_zeros((_up(rows, BLOCK), _up(cols, BLOCK)), dtype=torch.float32)  # zero-padded to whole blocks
    m[:rows, :cols] = x.reshape(rows, cols)
    (rd, rs), (cd, cs) = _pack(m), _pack(m.t().contiguous())
    return rd[:rows, :_up(cols, 2) // 2], rs[:rows], cd[:cols, :_up(rows, 2) // 2], cs[:cols]


def _quantize_fake(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, cols = _check(x)
    data = lambda r, c: x.new_empty((r, _up(c, 2) // 2), dtype=torch.uint8)  # noqa: E731
    scale = lambda r, c: x.new_empty((r, _up(c, BLOCK) // BLOCK), dtype=torch.float8_e4m3fn)  # noqa: E731
    return data(rows, cols), scale(rows, cols), data(cols, rows), scale(cols, rows)


def _register() -> None:
    ns, name = QUANTIZE.split("::")
    if hasattr(getattr(torch.ops, ns), name):  # already registered by an earlier import
        return
    op = torch.library.custom_op(QUANTIZE, _quantize_eager, mutates_args=(),
                                 schema="(Tensor x) -> (Tensor, Tensor, Tensor, Tensor)")
    op.register_fake(_quantize_fake)


_register()


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Both NVFP4 copies of ``x`` (row-wise and column-wise, each data and scales): one kernel."""
    return torch.ops.heterosim.nvfp4_quantize.default(x)
