"""LayerNorm and RMSNorm as one fused kernel each way, the way Transformer Engine / Apex run them.

``F.rms_norm`` decomposes into six pointwise/reduction ops on CPU; a GPU run uses one fused
kernel forward and one backward, so :class:`RMSNorm` calls ATen's fused ``_fused_rms_norm`` and
``_fused_rms_norm_backward`` directly. LayerNorm is ``aten.native_layer_norm`` (+ backward)
already. Parameters are created in the model dtype and carry ``param.sequence_parallel`` so the
gradient sync all-reduces them over TP when sequence parallelism splits their inputs.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake

from heterosim.errors import ConfigError

__all__ = ["LayerNorm", "RMSNorm", "build_norm", "fused_rms_norm"]


class _FusedRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        # ATen registers the forward as CompositeImplicitAutograd (it decomposes into six ops at
        # the autograd key); dispatching below autograd hands the one fused op to any mode.
        with torch._C._AutoDispatchBelowAutograd():
            y, rstd = torch.ops.aten._fused_rms_norm.default(x, [x.shape[-1]], weight, eps)
        ctx.save_for_backward(x, rstd, weight)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        if is_fake(x) or x.is_meta:
            gx, gw = torch.ops.aten._fused_rms_norm_backward(
                grad.contiguous(), x, [x.shape[-1]], rstd, weight, [True, weight is not None])
            return gx, gw, None
        # ATen has no CPU kernel for the fused backward; real-tensor runs use its formula:
        # xhat = x * rstd, dxhat = g * w, dx = rstd * (dxhat - xhat * mean(dxhat * xhat)).
        acc = torch.promote_types(x.dtype, torch.float32)
        xhat = x.to(acc) * rstd
        dxhat = grad.to(acc) * weight.to(acc) if weight is not None else grad.to(acc)
        gx = rstd * (dxhat - xhat * (dxhat * xhat).mean(dim=-1, keepdim=True))
        if weight is None:  # a weightless norm (models.layers.mamba's grouped norm)
            return gx.to(x.dtype), None, None
        gw = (grad.to(acc) * xhat).reshape(-1, x.shape[-1]).sum(dim=0)
        return gx.to(x.dtype), gw.to(weight.dtype), None


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` as ONE fused kernel each way; ``weight`` None: no scale."""
    return _FusedRMSNorm.apply(x, weight, eps)


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x^2) + eps) * w`` over the last dim (Zhang & Sennrich 2019)."""

    def __init__(self, hidden_size: int, *, eps: float, dtype: torch.dtype, sequence_parallel: bool) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.weight.sequence_parallel = sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FusedRMSNorm.apply(x, self.weight, self.eps)


class LayerNorm(nn.Module):
    """``y = (x - mean) / sqrt(var + eps) * w + b`` over the last dim."""

    def __init__(self, hidden_size: int, *, eps: float, dtype: torch.dtype, sequence_parallel: bool) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype))
        self.weight.sequence_parallel = sequence_parallel
        self.bias.sequence_parallel = sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


_NORMS = {"LayerNorm": LayerNorm, "RMSNorm": RMSNorm}


def build_norm(kind: str, hidden_size: int, *, eps: float, dtype: torch.dtype,
               sequence_parallel: bool) -> nn.Module:
    """The norm named ``kind`` (``LayerNorm`` or ``RMSNorm``, Megatron's ``--normalization``)."""
    try:
        cls = _NORMS[kind]
    except KeyError:
        raise ConfigError(f"unknown normalization {kind!r}; valid: {sorted(_NORMS)}") from None
    return cls(hidden_size, eps=eps, dtype=dtype, sequence_parallel=sequence_parallel)
