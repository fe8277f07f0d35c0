"""Stand-ins for Megatron's fused-kernel CUDA extensions, so a captured script runs its GPU paths.

Megatron-LM and megatron-core import small compiled CUDA modules when they are installed (they
are on a GPU training host: NGC containers, ``pip install apex``) and otherwise fall back to
several PyTorch ops each, or refuse a configuration (``gradient_accumulation_fusion=True``
without ``fused_weight_gradient_mlp_cuda`` raises). A capture host has no CUDA, so without
stand-ins the trace would hold the fallbacks: the causal softmax as a cast to fp32, a mask built
with ``triu``, ``masked_fill``, softmax and a cast back (five passes over ``[b, np, s, s]`` each
way instead of one), and every weight gradient as a GEMM plus an add into ``main_grad``.

While a capture runs, these module names import stand-ins (only where the real module is not
importable) whose functions record the one fused kernel each:

- ``scaled_upper_triang_masked_softmax_cuda``: ``forward`` / ``backward`` are
  ``heterosim::scaled_upper_triang_masked_softmax`` and its backward
  (:mod:`models.layers.megatron_ops`, the kernel's traffic priced by :mod:`capture.opinfo`);
- ``scaled_masked_softmax_cuda``: ``get_batch_per_block``, the kernel's launch arithmetic, so
  ``FusedScaleMaskSoftmax.is_kernel_available`` answers as it does on a GPU; ``forward`` /
  ``backward`` (a padding mask) and ``scaled_softmax_cuda``'s (no mask) compute the same values
  with PyTorch ops (not priced as one fused kernel);
- ``fused_weight_gradient_mlp_cuda``: ``wgrad_gemm_accum_fp32`` / ``_fp16``, ``main_grad +=
  grad_output^T @ input`` as one GEMM accumulating in ``main_grad``'s dtype (``addmm`` with
  ``out_dtype``, as :mod:`models.layers.linear` records Megatron's fused accumulation).

Known limitations: apex (``FusedLayerNorm``, ``amp_C``'s multi-tensor kernels, ``FusedAdam``) and
Transformer Engine are not stood in for: their presence switches whole module families, so their
PyTorch fallbacks are captured (``torch.nn.LayerNorm``, per-tensor norms for gradient clipping,
``torch.optim.AdamW``).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import torch

__all__ = ["STAND_INS", "CudaExtensions", "batch_per_block"]


def batch_per_block(sq: int, sk: int, b: int, np: int) -> int:
    """Rows one thread block of Megatron's masked-softmax kernels handles (``get_batch_per_block``
    of ``megatron/fused_kernels/scaled_masked_softmax.h``): 128 threads, a warp per row of up to
    ``next_pow2(sk)`` elements, two rows per warp up to 128 elements."""
    pow2 = 1 << max(sk - 1, 0).bit_length()
    warp = min(pow2, 32)
    return (128 // warp) * (2 if pow2 <= 128 else 1)


def _masked_softmax(x: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    y = x.float() * float(scale)
    if mask is not None:
        y = y.masked_fill(mask, -10000.0)
    return y.softmax(-1).to(x.dtype)


def _softmax_backward(grad: torch.Tensor, out: torch.Tensor, scale: float) -> torch.Tensor:
    g, y = grad.float(), out.float()
    return (float(scale) * y * (g - (g * y).sum(-1, keepdim=True))).to(grad.dtype)


def _wgrad_accum(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    # [out, in] += [N, out]^T @ [N, in], accumulated in main_grad's dtype by the GEMM itself.
    torch.addmm(main_grad, grad_output.t(), total_input, out_dtype=main_grad.dtype, out=main_grad)


def _softmax_ops() -> Any:
    """``torch.ops.heterosim``, its causal softmax ops registered: models/layers/megatron_ops.py
    registers them, loaded by path on first use so that a script's own ``models`` package is not
    shadowed by ours."""
    if not hasattr(torch.ops.heterosim, "scaled_upper_triang_masked_softmax"):
        path = Path(__file__).resolve().parents[1] / "models" / "layers" / "megatron_ops.py"
        spec = importlib.util.spec_from_file_location("_heterosim_megatron_ops", path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return torch.ops.heterosim


def _causal_module() -> types.ModuleType:
    m = types.ModuleType("scaled_upper_triang_masked_softmax_cuda")
    m.forward = lambda inputs, scale: _softmax_ops().scaled_upper_triang_masked_softmax(inputs, float(scale))
    m.backward = lambda grads, out, scale: _softmax_ops().scaled_upper_triang_masked_softmax_backward(
        grads, out, float(scale))
    return m


def _masked_module() -> types.ModuleType:
    m = types.ModuleType("scaled_masked_softmax_cuda")
    m.get_batch_per_block = batch_per_block
    m.forward = _masked_softmax
    m.backward = _softmax_backward
    return m


def _scaled_module() -> types.ModuleType:
    m = types.ModuleType("scaled_softmax_cuda")
    m.forward = lambda inputs, scale: _masked_softmax(inputs, None, scale)
    m.backward = _softmax_backward
    return m


def _wgrad_module() -> types.ModuleType:
    m = types.ModuleType("fused_weight_gradient_mlp_cuda")
    m.wgrad_gemm_accum_fp32 = _wgrad_accum
    m.wgrad_gemm_accum_fp16 = _wgrad_accum
    return m


STAND_INS = {
    "scaled_upper_triang_masked_softmax_cuda": _causal_module,
    "scaled_masked_softmax_cuda": _masked_module,
    "scaled_softmax_cuda": _scaled_module,
    "fused_weight_gradient_mlp_cuda": _wgrad_module,
}
"""Module name -> builder of its stand-in."""


class CudaExtensions:
    """Puts the stand-ins in ``sys.modules`` (:meth:`install`) and takes them out (:meth:`uninstall`)."""

    def __init__(self) -> None:
        self._installed: list[str] = []

    def install(self) -> None:
        for name, build in STAND_INS.items():
            if name in sys.modules or importlib.util.find_spec(name) is not None:
                continue  # the real extension (a GPU host) is used as it is
            sys.modules[name] = build()
            self._installed.append(name)

    def uninstall(self) -> None:
        for name in self._installed:
            sys.modules.pop(name, None)
        self._installed.clear()
