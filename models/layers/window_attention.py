"""Sliding-window causal attention and attention sinks as one fused kernel each way (GPT-OSS:
Megatron-core's ``window_size`` / ``window_attn_skip_freq`` and ``softmax_type="learnable"``).

A query ``i`` sees keys ``max(0, i - w) .. i`` (Transformer Engine's ``window_size = (w, 0)``; GPT-OSS:
``w = 127``, every other layer); a learnable per-head logit ("sink", Megatron-core's
``softmax_offset``) joins each row's softmax and takes probability without a value. Transformer
Engine runs both inside its fused attention kernels (cuDNN / FlashAttention skip the key tiles
outside the window), which PyTorch's CPU flash kernel cannot express, so this is a real custom op:

    heterosim::window_attention(Tensor q, Tensor k, Tensor v, Tensor? sinks, int window, float scale) -> Tensor
    heterosim::window_attention_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor? sinks,
                                         int window, float scale) -> (Tensor, Tensor, Tensor, Tensor)

in SDPA's layout (``q [b, h, s, d]``, ``k`` / ``v [b, hkv, s, d]``, ``h`` a multiple of ``hkv``);
``window < 0`` is plain causal attention (a layer with sinks but no window). The eager kernel
computes it for real (a masked softmax, in fp32 for 16-bit inputs); the backward returns an empty
sinks gradient when there are no sinks. :mod:`capture.window_cost` records each call as an
``attention`` kernel with the pairs it computes, and kernel_db prices a query tile over the key
tiles its window reaches.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from heterosim.errors import ConfigError
from models.layers.megatron_ops import eager_vjp, register_pair

__all__ = ["WINDOW", "WINDOW_BACKWARD", "window_attention"]

WINDOW = "heterosim::window_attention"
WINDOW_BACKWARD = "heterosim::window_attention_backward"
_SCHEMA = "Tensor q, Tensor k, Tensor v, Tensor? sinks, int window, float scale"


def _check(q: torch.Tensor, k: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or q.shape[1] % k.shape[1] or q.shape[2] != k.shape[2]:
        raise ConfigError(f"{WINDOW}: q {tuple(q.shape)} and k {tuple(k.shape)} must be [b, h, s, d] and "
                          "[b, hkv, s, d] with hkv dividing h (self-attention: one sequence length)")


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None, window: int,
           scale: float) -> torch.Tensor:
    _check(q, k)
    acc = torch.promote_types(q.dtype, torch.float32)
    rep = q.shape[1] // k.shape[1]
    kf, vf = (t.to(acc).repeat_interleave(rep, dim=1) for t in (k, v))
    scores = torch.einsum("bhid,bhjd->bhij", q.to(acc), kf) * scale
    s = q.shape[2]
    i = torch.arange(s, device=q.device).view(s, 1)
    j = torch.arange(s, device=q.device).view(1, s)
    hidden = (j > i) | ((i - j > window) if window >= 0 else torch.zeros_like(j > i))
    scores = scores.masked_fill(hidden, float("-inf"))
    if sinks is not None:
        sink = sinks.to(acc).view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.einsum("bhij,bhjd->bhid", probs, vf).to(q.dtype)


def _backward_eager(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    sinks: torch.Tensor | None, window: int, scale: float) -> tuple[torch.Tensor, ...]:
    if sinks is None:
        dq, dk, dv = eager_vjp(lambda a, b, c: _eager(a, b, c, None, window, scale), (q, k, v), grad)
        return dq, dk, dv, q.new_empty(0)
    return eager_vjp(lambda a, b, c, d: _eager(a, b, c, d, window, scale), (q, k, v, sinks), grad)


def _fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None, window: int,
          scale: float) -> torch.Tensor:
    _check(q, k)
    return q.new_empty(*q.shape[:3], v.shape[-1])


def _backward_fake(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   sinks: torch.Tensor | None, window: int, scale: float) -> tuple[torch.Tensor, ...]:
    like = lambda t: torch.empty_like(t, memory_format=torch.contiguous_format)  # noqa: E731
    return like(q), like(k), like(v), (like(sinks) if sinks is not None else q.new_empty(0))


def _setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    q, k, v, sinks, window, scale = inputs
    ctx.save_for_backward(q, k, v, sinks)
    ctx.window, ctx.scale, ctx.has_sinks = window, scale, sinks is not None


def _autograd_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    q, k, v, sinks = ctx.saved_tensors
    dq, dk, dv, dsinks = _backward_op(grad.contiguous(), q, k, v, sinks, ctx.window, ctx.scale)
    return dq, dk, dv, (dsinks if ctx.has_sinks else None), None, None


register_pair(WINDOW, WINDOW_BACKWARD,
              schemas=(f"({_SCHEMA}) -> Tensor", f"(Tensor grad, {_SCHEMA}) -> (Tensor, Tensor, Tensor, Tensor)"),
              kernels=(_eager, _backward_eager), fakes=(_fake, _backward_fake),
              autograd=(_autograd_backward, _setup_context))
_forward_op = torch.ops.heterosim.window_attention.default
_backward_op = torch.ops.heterosim.window_attention_backward.default


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int | None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of ``q [s, b, np, d]`` over ``k``, ``v [s, b, ng, d]`` within ``window``
    earlier keys (None: all), with per-head ``sinks [np]`` -> ``[s, b, np * d]``: one op."""
    s, b, np_ = q.shape[:3]
    qh, kh, vh = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [b, heads, s, d]
    out = _forward_op(qh, kh, vh, sinks, -1 if window is None else int(window), 1.0 / math.sqrt(q.shape[-1]))
    return out.permute(2, 0, 1, 3).reshape(s, b, np_ * v.shape[-1])
