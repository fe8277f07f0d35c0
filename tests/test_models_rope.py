"""Tests of ``models.layers.rope`` and ``models.layers.context_chunks``."""

from __future__ import annotations

import pytest
import torch

from heterosim.errors import ConfigError
from models.layers.context_chunks import cp_chunk_ids, cp_chunk_select
from models.layers.rope import apply_rotary, rotary_freqs


def test_rotary_equals_complex_rotation():
    """Rotating halves (x1, x2) by angle pos*base^(-2i/d) is multiplication by e^{i angle}."""
    s, d = 6, 8
    x = torch.randn(s, 2, 3, d, dtype=torch.float64)
    out = apply_rotary(x, rotary_freqs(s, d).double())
    angle = torch.arange(s, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * torch.polar(torch.ones_like(angle), angle)[:, None, None, :]
    torch.testing.assert_close(out, torch.cat((z.real, z.imag), dim=-1))


def test_cp_chunks_are_load_balanced():
    """cp 2, s 8: rank 0 keeps chunks 0 and 3, rank 1 chunks 1 and 2 (2 tokens each)."""
    t = torch.arange(8)
    assert cp_chunk_ids(2, 0) == (0, 3)
    assert cp_chunk_select(t, 0, 2, 0).tolist() == [0, 1, 6, 7]
    assert cp_chunk_select(t, 0, 2, 1).tolist() == [2, 3, 4, 5]
    ids = torch.arange(16).view(2, 8)
    assert cp_chunk_select(ids, 1, 2, 1).tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]
    # RoPE angles follow the kept positions
    torch.testing.assert_close(rotary_freqs(8, 4, cp_size=2, cp_rank=1), rotary_freqs(8, 4)[2:6])
    with pytest.raises(ConfigError, match=r"sequence length 6 not divisible by 2\*cp = 4"):
        cp_chunk_select(torch.arange(6), 0, 2, 0)
