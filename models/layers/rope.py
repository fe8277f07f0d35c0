"""Rotary position embedding (Su et al. 2021, arXiv:2104.09864) as Megatron-core applies it.

Megatron's ``RotaryEmbedding`` builds ``freqs[s, 1, 1, d] = cat(pos * inv_freq, pos * inv_freq)``
with ``inv_freq = base^(-2i/d)``, and ``apply_rotary_pos_emb`` (the unfused "bshd" path) computes
``t * cos(freqs) + rotate_half(t) * sin(freqs)`` on ``[s, b, heads, d]``; with ``apply_rope_fusion``
(the default) Transformer Engine's fused kernel does the same in one pass. Under context
parallelism each rank keeps the positions of its two load-balanced sequence chunks
(``get_pos_emb_on_this_cp_rank``).
"""

from __future__ import annotations

import torch

from models.layers.context_chunks import cp_chunk_select
from models.layers.fusions import rope

__all__ = ["rotary_freqs", "apply_rotary"]


def rotary_freqs(seq_length: int, dim: int, *, base: float = 10000.0, cp_size: int = 1,
                 cp_rank: int = 0) -> torch.Tensor:
    """``[s/cp, 1, 1, dim]`` fp32 rotation angles for this CP rank's tokens."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    pos = torch.arange(seq_length, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]
    return cp_chunk_select(emb, 0, cp_size, cp_rank)


def _rotate_half(t: torch.Tensor) -> torch.Tensor:
    x1, x2 = torch.chunk(t, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(t: torch.Tensor, freqs: torch.Tensor, *, fused: bool = False) -> torch.Tensor:
    """Rotate ``t [s, b, heads, d]`` by ``freqs [s, 1, 1, d]`` (fp32 angles, cast to ``t``'s dtype);
    ``fused``: Transformer Engine's fused kernel (:func:`models.layers.fusions.rope`)."""
    if fused:
        return rope(t, freqs)
    cos = torch.cos(freqs).to(t.dtype)
    sin = torch.sin(freqs).to(t.dtype)
    return t * cos + _rotate_half(t) * sin
