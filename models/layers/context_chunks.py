"""Megatron's load-balanced sequence split for context parallelism.

The sequence is cut into ``2*cp`` equal chunks and CP rank ``i`` holds chunks ``i`` and
``2*cp-1-i``, so every rank does the same causal-attention work
(``megatron.training.utils.get_batch_on_this_cp_rank``).
"""

from __future__ import annotations

import torch

from heterosim.errors import ConfigError

__all__ = ["cp_chunk_select", "cp_chunk_ids"]


def cp_chunk_ids(cp_size: int, cp_rank: int) -> tuple[int, int]:
    """The two sequence chunks (of ``2*cp``) held by ``cp_rank``."""
    return cp_rank, 2 * cp_size - 1 - cp_rank


def cp_chunk_select(t: torch.Tensor, dim: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """This CP rank's two chunks of ``t`` along ``dim`` (the identity when ``cp_size`` is 1)."""
    if cp_size == 1:
        return t
    n = t.shape[dim]
    if n % (2 * cp_size):
        raise ConfigError(f"sequence length {n} not divisible by 2*cp = {2 * cp_size}")
    shape = list(t.shape)
    shape[dim:dim + 1] = [2 * cp_size, n // (2 * cp_size)]
    idx = torch.tensor(cp_chunk_ids(cp_size, cp_rank), dtype=torch.long, device=t.device)
    picked = t.view(shape).index_select(dim, idx)
    out_shape = list(t.shape)
    out_shape[dim] = n // cp_size
    return picked.reshape(out_shape)
