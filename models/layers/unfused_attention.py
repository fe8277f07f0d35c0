"""Unfused core attention, as Megatron-LM ran it before FlashAttention (2020-21
``megatron/model/transformer.py``: ``ParallelAttention`` / ``CoreAttention``).

Per TP rank, with ``np`` query heads of size ``d`` and scores of ``b*np x sq x sk`` elements::

    scores  = baddbmm(empty[b*np, sq, sk], q[b*np, sq, d], k^T[b*np, d, sk], beta=0, alpha=1/sqrt(d))
    probs   = scale_mask_softmax(scores)          # one kernel each way (causal mask)
    probs   = attention_dropout(probs)            # one native_dropout each way, when p > 0
    context = bmm(probs[b*np, sq, sk], v[b*np, sk, d]) -> [sq, b, np*d]

so the capture records, per layer forward, ``aten.baddbmm`` (gemm),
``heterosim.scaled_upper_triang_masked_softmax`` (softmax, Megatron's fused causal kernel, see
:mod:`models.layers.megatron_ops`), ``aten.native_dropout`` (p > 0) and ``aten.bmm``; backward,
``aten.bmm`` x4 (two per GEMM) with the alpha scaling of the two baddbmm input gradients
(``aten.mul`` over ``s x d``), ``aten.native_dropout_backward`` and
``heterosim.scaled_upper_triang_masked_softmax_backward``. All s^2 score traffic that the flash
kernel keeps on chip goes through memory here.

Approximations (what is ignored):

- Megatron passes the softmax scale into the fused kernel (``scale`` argument); here baddbmm's
  alpha already applies ``1/sqrt(d)`` and the softmax runs with ``scale = 1``: same numerics,
  and the kernel's traffic is unchanged (the scale is one multiply in registers).
- ``--apply-query-key-layer-scaling`` (divide by the layer number before the softmax, multiply
  inside it) is numerically the identity and costs no kernel; it is left out.
- GQA (which Megatron 2020 did not have) expands K/V groups to ``np`` heads with one copy each.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from models.layers.megatron_ops import scaled_upper_triang_masked_softmax

__all__ = ["AttentionDropout", "CoreAttention", "FusedScaleMaskSoftmax"]


class FusedScaleMaskSoftmax(nn.Module):
    """Causal softmax over the last dim of ``[b, np, sq, sk]`` scores, one op each way.

    As Megatron's ``FusedScaleMaskSoftmax`` on its ``upper_triang`` path: the scores are viewed as
    ``[b*np, sq, sk]`` and go through ``scaled_upper_triang_masked_softmax`` (mask implicit in the
    element index, no mask tensor); backward is its ``_backward`` op. Query ``i`` sees keys
    ``0..i`` (top-left aligned, as ``is_causal=True``).
    """

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        b, np_, sq, sk = scores.shape
        probs = scaled_upper_triang_masked_softmax(scores.view(b * np_, sq, sk), self.scale)
        return probs.view(b, np_, sq, sk)


class AttentionDropout(nn.Module):
    """Dropout on the probabilities as one ``aten.native_dropout`` each way (as
    :func:`models.transformer.dropout`; Megatron's ``torch.nn.Dropout`` is one CUDA kernel)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, probs: torch.Tensor) -> torch.Tensor:
        if self.p <= 0.0 or not self.training:
            return probs
        return torch.native_dropout(probs, self.p, True)[0]


class CoreAttention(nn.Module):
    """``q [sq, b, np, d]`` over ``k, v [sk, b, ng, d]`` -> ``[sq, b, np*d]``, causal.

    ``seq_length`` is kept for Megatron's signature; the causal mask is implicit in the softmax.
    """

    def __init__(self, *, seq_length: int, dropout: float) -> None:
        super().__init__()
        self.seq_length = seq_length
        self.scale_mask_softmax = FusedScaleMaskSoftmax()
        self.attention_dropout = AttentionDropout(dropout)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        sq, b, np_, d = q.shape
        sk, ng = k.shape[0], k.shape[2]
        if ng != np_:  # GQA: each K/V group serves np/ng consecutive query heads
            k, v = (t.unsqueeze(3).expand(sk, b, ng, np_ // ng, d).reshape(sk, b, np_, d) for t in (k, v))
        # [s, b, np, d] -> [s, b*np, d] -> [b*np, s, d]: views, as in Megatron.
        qb = q.reshape(sq, b * np_, d).transpose(0, 1)
        kb = k.reshape(sk, b * np_, d).transpose(0, 1)
        vb = v.reshape(sk, b * np_, d).transpose(0, 1)
        # beta=0: the preallocated buffer is only written (Megatron takes it from a global buffer).
        scores = torch.baddbmm(torch.empty(b * np_, sq, sk, dtype=q.dtype, device=q.device),
                               qb, kb.transpose(1, 2), beta=0.0, alpha=1.0 / math.sqrt(d))
        probs = self.scale_mask_softmax(scores.view(b, np_, sq, sk))
        probs = self.attention_dropout(probs)
        ctx = torch.bmm(probs.view(b * np_, sq, sk), vb)  # [b*np, sq, d]
        return ctx.view(b, np_, sq, d).permute(2, 0, 1, 3).reshape(sq, b, np_ * d)
