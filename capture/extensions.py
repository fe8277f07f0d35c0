"""Stand-ins for Megatron's fused-kernel CUDA extensions and apex, so a captured script runs its GPU paths.

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

apex, as NGC containers ship it (their megatron-core takes its GPU-host path with it: the
optimizer, gradient clipping and the main/model parameter copies), is stood in for as a package
of the modules megatron-core imports, each function recording the multi-tensor kernels a GPU
host runs rather than the per-tensor fallbacks megatron-core has without apex (16 ``_foreach_``
kernels of ``torch.optim.AdamW``, one ``linalg_vector_norm`` per gradient for the clipping norm,
one ``mul`` and ``copy_`` per gradient to clip):

- ``apex.optimizers.FusedAdam``: torch's fused Adam/AdamW (``fused=True``: one
  ``_fused_adamw_`` / ``_fused_adam_`` kernel per parameter group, as apex's ``multi_tensor_adam``),
  apex's arguments accepted (``adam_w_mode``, ``bias_correction``, ``set_grad_none``,
  ``capturable``, ``master_weights``); ``FusedSGD``: torch's fused SGD;
- ``apex.multi_tensor_apply.multi_tensor_applier`` and ``amp_C``: ``multi_tensor_l2norm`` (one
  ``_foreach_norm`` and the norm of the norms), ``multi_tensor_scale`` (``_foreach_mul_`` in place,
  ``_foreach_copy_`` for a copy, both for a scaled copy);
- ``apex.normalization.fused_layer_norm.FusedLayerNormAffineFunction``, because ``import apex``
  succeeding switches megatron-core's local specs to its ``FusedLayerNorm``, which needs it: one
  ``native_layer_norm`` each way, as torch's LayerNorm.

Known limitations: Transformer Engine is not stood in for (its presence switches whole module
families: layers, attention, optimizers); apex's other modules (``apex.contrib``, ``FusedRMSNorm``,
its amp) are absent, so code that needs them takes its fallback or raises ImportError.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import torch

__all__ = ["APEX_STAND_INS", "STAND_INS", "CudaExtensions", "FusedAdam", "batch_per_block"]


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


class FusedAdam(torch.optim.Adam):
    """apex's ``FusedAdam`` (``adam_w_mode=True``: AdamW) as torch's fused Adam: one multi-tensor
    kernel per parameter group and step, as apex's ``multi_tensor_adam``. apex keeps the step count
    per group and needs no ``step`` in a parameter's state (megatron-core's ``init_state_fn`` fills
    only the moments): a missing one is added before torch's step reads it."""

    def __init__(self, params: Any, lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, adam_w_mode: bool = True,
                 weight_decay: float = 0.0, amsgrad: bool = False, set_grad_none: bool = True,
                 capturable: bool = False, master_weights: bool = False, **_: Any) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         fused=True, decoupled_weight_decay=adam_w_mode)
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        super().zero_grad(self.set_grad_none if set_to_none is None else set_to_none)

    @torch.no_grad()
    def step(self, closure: Any = None, grads: Any = None, output_params: Any = None, scale: Any = None,
             grad_norms: Any = None, grad_scaler: Any = None) -> Any:
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p)
                if state and "step" not in state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        return super().step(closure)


class FusedSGD(torch.optim.SGD):
    """apex's ``FusedSGD`` as torch's fused SGD; apex's extra arguments accepted."""

    def __init__(self, params: Any, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, wd_after_momentum: bool = False,
                 materialize_master_grads: bool = True, set_grad_none: bool = False, **_: Any) -> None:
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov, fused=True)


def _l2norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list, per_tensor: bool = False,
            *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``amp_C.multi_tensor_l2norm``: the fp32 L2 norm of all tensors of ``tensor_lists[0]``
    (shape [1]) and, with ``per_tensor``, each tensor's."""
    tensors = tensor_lists[0]
    if not tensors:
        empty = torch.zeros(1, dtype=torch.float32, device=noop_flag.device)
        return empty, empty[:0]
    norms = torch.stack(torch._foreach_norm(tensors)).float()
    total = torch.linalg.vector_norm(norms).reshape(1)
    return total, (norms if per_tensor else torch.empty(0, dtype=torch.float32, device=total.device))


def _scale(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list, scale: float) -> None:
    """``amp_C.multi_tensor_scale``: ``out = in * scale`` over ``tensor_lists = [in, out]``."""
    src, dst = tensor_lists[0], tensor_lists[1]
    if not src:
        return
    if all(a is b for a, b in zip(src, dst)):
        torch._foreach_mul_(dst, scale)
    elif scale == 1.0:
        torch._foreach_copy_(dst, src)
    else:
        torch._foreach_copy_(dst, torch._foreach_mul(src, scale))


class MultiTensorApply:
    """``apex.multi_tensor_apply.multi_tensor_applier``: calls ``op(chunk_size, noop_flag, lists, *args)``."""

    available = True
    warned = False

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size

    def __call__(self, op: Any, noop_flag_buffer: torch.Tensor, tensor_lists: list, *args: Any) -> Any:
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)


class FusedLayerNormAffineFunction:
    """apex's fused LayerNorm with weight and bias, called as megatron-core's ``FusedLayerNorm``
    calls it (``apply``; ``forward``'s arguments are read for ``memory_efficient``)."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, normalized_shape: Any,
                eps: float, memory_efficient: bool = False) -> torch.Tensor:
        return torch.nn.functional.layer_norm(input, tuple(normalized_shape), weight, bias, eps)

    @staticmethod
    def apply(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, normalized_shape: Any, eps: float,
              memory_efficient: bool = False) -> torch.Tensor:
        return torch.nn.functional.layer_norm(input, tuple(normalized_shape), weight, bias, eps)


def _module(name: str, package: bool = False, **attrs: Any) -> types.ModuleType:
    m = types.ModuleType(name)
    # A spec, so that importlib.util.find_spec(name) answers (it raises on __spec__ None).
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
    if package:
        m.__path__ = []
    m.__dict__.update(attrs)
    return m


def _apex_modules() -> dict[str, types.ModuleType]:
    mods = {
        "apex.optimizers": _module("apex.optimizers", True, FusedAdam=FusedAdam, FusedSGD=FusedSGD),
        "apex.multi_tensor_apply": _module("apex.multi_tensor_apply", True, MultiTensorApply=MultiTensorApply,
                                           multi_tensor_applier=MultiTensorApply(2048 * 32)),
        "apex.normalization": _module("apex.normalization", True),
        "apex.normalization.fused_layer_norm": _module(
            "apex.normalization.fused_layer_norm", FusedLayerNormAffineFunction=FusedLayerNormAffineFunction),
    }
    mods["apex.normalization"].fused_layer_norm = mods["apex.normalization.fused_layer_norm"]
    apex = _module("apex", True, optimizers=mods["apex.optimizers"],
                   multi_tensor_apply=mods["apex.multi_tensor_apply"], normalization=mods["apex.normalization"])
    return {"apex": apex, **mods}


def _amp_c_module() -> types.ModuleType:
    return _module("amp_C", multi_tensor_l2norm=_l2norm, multi_tensor_scale=_scale)


STAND_INS = {
    "scaled_upper_triang_masked_softmax_cuda": _causal_module,
    "scaled_masked_softmax_cuda": _masked_module,
    "scaled_softmax_cuda": _scaled_module,
    "fused_weight_gradient_mlp_cuda": _wgrad_module,
    "amp_C": _amp_c_module,
}
"""Module name -> builder of its stand-in."""

APEX_STAND_INS = {"apex": _apex_modules}
"""Top-level package name -> builder of its stand-in modules (the package and its submodules),
put in as a whole where the package is not importable."""


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
        for name, build in APEX_STAND_INS.items():
            if name in sys.modules or importlib.util.find_spec(name) is not None:
                continue  # a real apex, or the script's own package of that name
            for sub, module in build().items():
                sys.modules[sub] = module
                self._installed.append(sub)

    def uninstall(self) -> None:
        for name in self._installed:
            sys.modules.pop(name, None)
        self._installed.clear()
