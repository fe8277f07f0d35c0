"""Megatron-core's fused elementwise kernels: SwiGLU (plain and token-weighted) and rotary embedding.

Megatron-core runs the SwiGLU activation as ``bias_swiglu_impl`` (``bias_activation_fusion``,
``megatron/core/fusions/fused_bias_swiglu.py``): an autograd function whose forward ``swiglu`` and
backward ``swiglu_back`` are each compiled with ``jit_fuser`` (``torch.compile`` from torch 2.2,
``megatron/core/jit.py``), one kernel per direction. With ``apply_rope_fusion`` the rotary
embedding is Transformer Engine's ``fused_apply_rotary_pos_emb``: one CUDA kernel forward, one
backward, each reading the tensor once (and the small angle table) and writing it once. NeMo's
Llama configurations set both (``LlamaConfig``: ``bias_activation_fusion``, ``apply_rope_fusion``;
``NemotronConfig``: ``apply_rope_fusion``); ``--no-bias-swiglu-fusion`` / ``--no-rope-fusion``
turn them off as in Megatron-LM.

Each fused function here is :func:`jit_fuser`: under capture ``torch.compile`` is the recorder's
eager region (``capture/fusion.py``), so its ops become one fused kernel per direction, with the
bytes the real kernel moves; in a real run here it runs eagerly (same numbers, no compiler
needed on a CPU).

Approximation: TE's RoPE kernel computes sin/cos of the fp32 angles inside the kernel; here they
are computed in the same region (one fused kernel), so the cost is the same reads and writes.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from heterosim.annotate import get_annotator

__all__ = ["jit_fuser", "swiglu", "weighted_swiglu", "rope"]


def jit_fuser(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Megatron's ``jit_fuser``: ``fn`` compiled while a capture records (one fused kernel),
    eager otherwise."""

    def call(*args: Any) -> Any:
        if get_annotator().active:
            return torch.compile(fn)(*args)
        return fn(*args)

    call.__name__ = call.__qualname__ = fn.__name__
    return call


@jit_fuser
def _swiglu_fwd(y: torch.Tensor) -> torch.Tensor:
    y_1, y_2 = torch.chunk(y, 2, -1)
    return F.silu(y_1) * y_2


@jit_fuser
def _swiglu_back(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # d/dy1 silu(y1) = sigmoid(y1) (1 + y1 (1 - sigmoid(y1))) (fused_bias_swiglu.swiglu_back)
    y_1, y_2 = torch.chunk(y, 2, -1)
    s = torch.sigmoid(y_1)
    return torch.cat((g * s * (1 + y_1 * (1 - s)) * y_2, g * F.silu(y_1)), -1)


class _SwiGLU(torch.autograd.Function):
    """Plain (``w`` None: ``bias_swiglu_impl``) or token-weighted (``weighted_bias_swiglu_impl``)."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        ctx.weighted = w is not None
        ctx.save_for_backward(y, *((w,) if ctx.weighted else ()))
        return _weighted_swiglu_fwd(y, w) if ctx.weighted else _swiglu_fwd(y)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if ctx.weighted:
            return _weighted_swiglu_back(g, *ctx.saved_tensors)
        (y,) = ctx.saved_tensors
        return _swiglu_back(g, y), None


def swiglu(y: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``y = [gate, up]`` (last dim), fused forward and backward."""
    return _SwiGLU.apply(y, None)


@jit_fuser
def _weighted_swiglu_fwd(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y_1, y_2 = torch.chunk(y, 2, -1)
    return (F.silu(y_1) * y_2 * w).to(y.dtype)


@jit_fuser
def _weighted_swiglu_back(g: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # fused_bias_swiglu.weighted_swiglu_back: the input gradient of swiglu at g * w, and the
    # weight's gradient sum(swiglu(y) * g) over the row.
    y_1, y_2 = torch.chunk(y, 2, -1)
    s = torch.sigmoid(y_1)
    gw = (g * w).to(y.dtype)
    dy = torch.cat((gw * s * (1 + y_1 * (1 - s)) * y_2, gw * F.silu(y_1)), -1)
    return dy, (F.silu(y_1) * y_2 * g).to(w.dtype).sum(-1, keepdim=True)


def weighted_swiglu(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``swiglu(y) * w`` with one weight per row (``w [rows, 1]``: a token's routing weight for the
    expert the row belongs to), fused forward and backward as Megatron-core's
    ``weighted_bias_swiglu_impl`` (the MoE experts' activation: ``experts.py`` applies the router's
    probabilities there, not when it un-permutes)."""
    return _SwiGLU.apply(y, w)


def _half_signs(freqs: torch.Tensor, first: float) -> torch.Tensor:
    # [first] * d/2 then [-first] * d/2, shaped like freqs' last dim (a few bytes).
    half = freqs.shape[-1] // 2
    return torch.cat((freqs.new_full((half,), first), freqs.new_full((half,), -first)))


@jit_fuser
def _rope_fwd(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    # t cos + rotate_half(t) sin, rotate_half(t) = [-t_2, t_1] = roll(t, d/2) * [-1, +1]: t is read
    # as one tensor (its halves as views would count its bytes twice).
    half = t.shape[-1] // 2
    sin = (torch.sin(freqs) * _half_signs(freqs, -1.0)).to(t.dtype)
    return t * torch.cos(freqs).to(t.dtype) + torch.roll(t, half, -1) * sin


@jit_fuser
def _rope_back(g: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    # The transpose of the rotation: g cos + [u_2, -u_1] with u = g sin, i.e.
    # roll(g, d/2) * roll(sin, d/2) * [+1, -1].
    half = g.shape[-1] // 2
    sin = (torch.roll(torch.sin(freqs), half, -1) * _half_signs(freqs, 1.0)).to(g.dtype)
    return g * torch.cos(freqs).to(g.dtype) + torch.roll(g, half, -1) * sin


class _RoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(freqs)
        return _rope_fwd(t, freqs)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (freqs,) = ctx.saved_tensors
        return _rope_back(g, freqs), None


def rope(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate ``t [s, b, heads, d]`` by ``freqs [s, 1, 1, d]`` in one fused kernel per direction."""
    return _RoPE.apply(t, freqs)
