"""Vocab-parallel embedding (Megatron ``tensor_parallel/layers.py``).

Each TP rank owns the vocabulary rows ``[r*V/tp, (r+1)*V/tp)``. The embedding looks up the ids it
owns, zeroes the others and sums over TP (all-reduce, or reduce-scatter into sequence-parallel
form). The loss over the same split is :mod:`models.layers.cross_entropy`. The mask is built with
``torch.where`` / ``masked_fill`` instead of boolean indexing so nothing depends on the data (a
requirement under FakeTensorMode).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from heterosim.errors import ConfigError
from models.layers.linear import init_normal
from models.layers.mappings import group_rank, group_size, reduce_from_tp, reduce_scatter_to_sp

__all__ = ["VocabParallelEmbedding"]


class VocabParallelEmbedding(nn.Module):
    """Embedding table split by vocabulary rows over the TP group: ``[V/tp, h]`` per rank.

    ``forward(ids [b, s])`` returns ``[s, b, h]`` summed over TP, or ``[s/tp, b, h]`` reduced and
    scattered when ``reduce_scatter`` (sequence parallelism without learned positions).
    """

    def __init__(self, vocab_size: int, hidden_size: int, *, tp_group: Any, dtype: torch.dtype,
                 init_std: float, reduce_scatter: bool) -> None:
        super().__init__()
        tp = group_size(tp_group)
        if vocab_size % tp:
            raise ConfigError(f"vocab size {vocab_size} not divisible by tensor-parallel size {tp}; "
                              f"pad it (--make-vocab-size-divisible-by)")
        self.tp_group, self.tp = tp_group, tp
        self.per_rank = vocab_size // tp
        self.start = group_rank(tp_group) * self.per_rank
        self.reduce_scatter = reduce_scatter and tp > 1
        self.weight = nn.Parameter(torch.empty(self.per_rank, hidden_size, dtype=dtype))
        init_normal(init_std)(self.weight)
        self.weight.tensor_model_parallel = tp > 1
        self.weight.partition_dim = 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp > 1:
            outside = (ids < self.start) | (ids >= self.start + self.per_rank)
            local = torch.where(outside, torch.zeros_like(ids), ids - self.start)
            out = F.embedding(local, self.weight)
            out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        else:
            out = F.embedding(ids, self.weight)
        out = out.transpose(0, 1).contiguous()  # [b, s, h] -> [s, b, h]
        if self.reduce_scatter:
            return reduce_scatter_to_sp(out, self.tp_group)
        return reduce_from_tp(out, self.tp_group)
