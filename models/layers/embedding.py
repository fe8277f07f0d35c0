"""Vocab-parallel embedding and cross-entropy (Megatron ``tensor_parallel/layers.py`` and
``tensor_parallel/cross_entropy.py``).

Each TP rank owns the vocabulary rows ``[r*V/tp, (r+1)*V/tp)``. The embedding looks up the ids it
owns, zeroes the others and sums over TP (all-reduce, or reduce-scatter into sequence-parallel
form). The loss never gathers the logits: it all-reduces (over TP) the max logit, then the logit
of the target, then the sum of exponentials, each ``[s, b]`` fp32 (Megatron's
``_VocabParallelCrossEntropy``). Masks are built with ``torch.where`` / ``masked_fill`` instead of
boolean indexing so nothing depends on the data (a requirement under FakeTensorMode).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from heterosim.errors import ConfigError
from models.layers.linear import init_normal
from models.layers.mappings import group_rank, group_size, reduce_from_tp, reduce_scatter_to_sp

__all__ = ["VocabParallelEmbedding", "vocab_parallel_cross_entropy"]


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


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, group, vocab_start):
        # logits [s, b, V/tp] fp32, target [s, b] int64
        tp = group_size(group)
        logits_max = logits.max(dim=-1)[0]
        if tp > 1:
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        logits = logits - logits_max.unsqueeze(-1)
        per_rank = logits.shape[-1]
        outside = (target < vocab_start) | (target >= vocab_start + per_rank)
        local = torch.where(outside, torch.zeros_like(target), target - vocab_start)
        logits_2d = logits.view(-1, per_rank)
        rows = torch.arange(logits_2d.shape[0], device=logits.device)
        predicted = logits_2d[rows, local.view(-1)].view_as(target)
        predicted = predicted.masked_fill(outside, 0.0)
        if tp > 1:
            dist.all_reduce(predicted, op=dist.ReduceOp.SUM, group=group)
        exp_logits = torch.exp(logits)
        sum_exp = exp_logits.sum(dim=-1)
        if tp > 1:
            dist.all_reduce(sum_exp, op=dist.ReduceOp.SUM, group=group)
        loss = torch.log(sum_exp) - predicted
        softmax = exp_logits.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, outside, local)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, outside, local = ctx.saved_tensors
        per_rank = softmax.shape[-1]
        grad = softmax.view(-1, per_rank).clone()
        rows = torch.arange(grad.shape[0], device=grad.device)
        hit = 1.0 - outside.view(-1).to(grad.dtype)
        grad[rows, local.view(-1)] -= hit
        grad = grad.view_as(softmax) * grad_loss.unsqueeze(-1)
        return grad, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, tp_group: Any) -> torch.Tensor:
    """Per-token loss ``[s, b]`` of vocab-split ``logits [s, b, V/tp]`` against ``target [s, b]``."""
    start = group_rank(tp_group) * logits.shape[-1]
    return _VocabParallelCrossEntropy.apply(logits, target, tp_group, start)
