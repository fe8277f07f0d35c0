"""Unfused core attention, as Megatron-LM ran it before FlashAttention (2020-21
``megatron/model/transformer.py``: ``ParallelAttention`` / ``CoreAttention``).

Per TP rank, with ``np`` query heads of size ``d`` and scores of ``b*np x sq x sk`` elements::

    scores  = baddbmm(empty[b*np, sq, sk], q[b*np, sq, d], k^T[b*np, d, sk], beta=0, alpha=1/sqrt(d))
    probs   = scale_mask_softmax(scores)          # one kernel each way (causal mask)
    probs   = attention_dropout(probs)            # one native_dropout each way, when p > 0
    context = bmm(probs[b*np, sq, sk], v[b*np, sk, d]) -> [sq, b, np*d]

so the capture records, per layer forward, ``aten.baddbmm`` (gemm), ``aten._masked_softmax``
(softmax), ``aten.native_dropout`` (p > 0) and ``aten.bmm``; backward, ``aten.bmm`` x4 (two per
GEMM) with the alpha scaling of the two baddbmm input gradients (``aten.mul`` over ``s x d``),
``aten.native_dropout_backward`` and ``aten._masked_softmax_backward``. All s^2 score traffic
that the flash kernel keeps on chip goes through memory here.

Approximations (what is ignored):

- Megatron's ``FusedScaleMaskSoftmax`` for a causal GPT is ``scaled_upper_triang_masked_softmax``,
  which derives the mask from the element index. The CPU stand-in ``_masked_softmax`` reads a
  boolean ``(sq, sk)`` mask broadcast (stride 0) over ``b*np``: the trace counts ``sq*sk`` bytes
  read more than the GPU kernel, ``1 / (2 b np)`` of the scores it reads.
- ``--apply-query-key-layer-scaling`` (divide by the layer number before the softmax, multiply
  inside it) is numerically the identity and costs no kernel; it is left out.
- GQA (which Megatron 2020 did not have) expands K/V groups to ``np`` heads with one copy each.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

__all__ = ["AttentionDropout", "CoreAttention", "FusedScaleMaskSoftmax", "causal_mask"]


def causal_mask(sq: int, sk: int) -> torch.Tensor:
    """``[sq, sk]`` bool, True where query ``i`` must not see key ``j > i`` (top-left aligned,
    as ``F.scaled_dot_product_attention(is_causal=True)``)."""
    return torch.ones(sq, sk, dtype=torch.bool).triu(1)


class FusedScaleMaskSoftmax(nn.Module):
    """Causal softmax over the last dim of ``[b, np, sq, sk]`` scores, one aten op each way.

    ``torch._masked_softmax`` with ``mask_type=2`` (a mask of the input's shape, here a stride-0
    broadcast of the ``[sq, sk]`` causal mask): forward ``aten._masked_softmax``, backward
    ``aten._masked_softmax_backward`` (autograd passes it the same broadcast mask; with
    ``mask_type=0`` it would get the ``[sq, sk]`` mask and reject it). No row is fully masked:
    every query sees at least its own key.
    """

    def forward(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch._masked_softmax(scores, mask.expand(scores.shape), scores.dim() - 1, 2)


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

    The ``[seq_length, seq_length]`` causal mask is built once here (outside the recorded
    iteration), so every forward issues the same ops.
    """

    def __init__(self, *, seq_length: int, dropout: float) -> None:
        super().__init__()
        self.scale_mask_softmax = FusedScaleMaskSoftmax()
        self.attention_dropout = AttentionDropout(dropout)
        self.mask = causal_mask(seq_length, seq_length)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        sq, b, np_, d = q.shape
        sk, ng = k.shape[0], k.shape[2]
        if ng != np_:  # GQA: each K/V group serves np/ng consecutive query heads
            k, v = (t.unsqueeze(3).expand(sk, b, ng, np_ // ng, d).reshape(sk, b, np_, d) for t in (k, v))
        mask = self.mask if self.mask.shape == (sq, sk) else causal_mask(sq, sk)
        # [s, b, np, d] -> [s, b*np, d] -> [b*np, s, d]: views, as in Megatron.
        qb = q.reshape(sq, b * np_, d).transpose(0, 1)
        kb = k.reshape(sk, b * np_, d).transpose(0, 1)
        vb = v.reshape(sk, b * np_, d).transpose(0, 1)
        # beta=0: the preallocated buffer is only written (Megatron takes it from a global buffer).
        scores = torch.baddbmm(torch.empty(b * np_, sq, sk, dtype=q.dtype, device=q.device),
                               qb, kb.transpose(1, 2), beta=0.0, alpha=1.0 / math.sqrt(d))
        probs = self.scale_mask_softmax(scores.view(b, np_, sq, sk), mask)
        probs = self.attention_dropout(probs)
        ctx = torch.bmm(probs.view(b * np_, sq, sk), vb)  # [b*np, sq, d]
        return ctx.view(b, np_, sq, d).permute(2, 0, 1, 3).reshape(sq, b, np_ * d)
