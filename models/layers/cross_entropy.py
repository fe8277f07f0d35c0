"""Vocab-parallel cross-entropy, unfused and fused (Megatron-core ``tensor_parallel/cross_entropy.py``
and ``fusions/fused_cross_entropy.py``).

The loss never gathers the logits ``[s, b, V/tp]``: each TP rank owns the vocabulary rows
``[r*V/tp, (r+1)*V/tp)`` and the ranks all-reduce (over TP) per-token ``[s, b]`` fp32 partials.

- :func:`vocab_parallel_cross_entropy` is Megatron's ``_VocabParallelCrossEntropy`` as eager
  ops on fp32 logits (the model casts them first): three all-reduces, the max logit (MAX), the
  target's logit and the sum of exponentials (SUM each).
- :func:`fused_vocab_parallel_cross_entropy` is what ``compute_language_model_loss`` calls with
  ``cross_entropy_loss_fusion`` (``cross_entropy_fusion_impl='native'``, the default): the same
  arithmetic in four ``jit_fuser`` regions, one fused kernel each under capture. Forward:
  ``calculate_logits_max`` (the fp32 cast of the logits, which arrive in the model's dtype, and
  their max), all-reduce MAX; ``calculate_predicted_logits`` (subtract the max and exponentiate in
  place, the target's logit, the sum of exponentials, both concatenated into one ``[2s, b]``
  tensor), ONE all-reduce SUM of that tensor; ``calculate_cross_entropy_loss`` (the loss, and the
  softmax divided in place). Backward: ``calculate_gradients`` (softmax minus the one-hot target,
  times the loss gradient, cast back to the logits' dtype), one kernel.

Masks are built with ``torch.where`` / ``masked_fill`` instead of Megatron's boolean indexing
(``masked_target[target_mask] = 0``) so that nothing depends on the data (a requirement under
FakeTensorMode); the values are the same.

NB: Megatron's ``calculate_gradients`` casts the gradient to bf16 whatever the logits' dtype
(``grad_input.to(torch.bfloat16)``); here it is cast to the logits' dtype, which is the same for
the bf16 runs that set the fusion and keeps fp32 / fp16 runs' gradients exact.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from models.layers.fusions import jit_fuser
from models.layers.mappings import group_rank, group_size

__all__ = ["vocab_parallel_cross_entropy", "fused_vocab_parallel_cross_entropy"]


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


# ---- the fused path: one function per jit_fuser region of fused_cross_entropy.py ------------------
@jit_fuser
def _logits_max(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # calculate_logits_max: the fp32 logits [s, b, V/tp] (a new tensor unless already fp32), max [s, b]
    logits = logits.float()
    return logits, torch.max(logits, dim=-1)[0]


@jit_fuser
def _predicted_logits(logits: torch.Tensor, target: torch.Tensor, logits_max: torch.Tensor,
                      vocab_start: int, vocab_end: int) -> tuple[torch.Tensor, ...]:
    # calculate_predicted_logits: logits becomes exp(logits - max) in place; [predicted; sum_exp] [2s, b]
    logits.sub_(logits_max.unsqueeze(-1))
    target_mask = (target < vocab_start) | (target >= vocab_end)
    masked_target = torch.where(target_mask, torch.zeros_like(target), target - vocab_start)
    per_rank = logits.shape[-1]
    logits_2d = logits.view(-1, per_rank)
    masked_target_1d = masked_target.view(-1)
    arange_1d = torch.arange(logits_2d.shape[0], device=logits.device)
    predicted = logits_2d[arange_1d, masked_target_1d].view_as(target).masked_fill(target_mask, 0.0)
    exp_logits = logits.exp_()
    sum_exp = exp_logits.sum(dim=-1)
    return target_mask, masked_target_1d, torch.cat((predicted, sum_exp)), exp_logits


@jit_fuser
def _cross_entropy_loss(exp_logits: torch.Tensor,
                        predicted_sum_exp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # calculate_cross_entropy_loss: loss [s, b] = log(sum_exp) - predicted; exp_logits -> softmax in place
    predicted, sum_exp = torch.split(predicted_sum_exp, predicted_sum_exp.shape[0] // 2)
    loss = torch.log(sum_exp) - predicted
    exp_logits.div_(sum_exp.unsqueeze(-1))
    return exp_logits, loss


@jit_fuser
def _gradients(softmax: torch.Tensor, grad_output: torch.Tensor, target_mask: torch.Tensor,
               masked_target_1d: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # calculate_gradients: (softmax - onehot(target)) * grad_output, in place, then cast
    softmax_update = 1.0 - target_mask.view(-1).float()
    per_rank = softmax.shape[-1]
    grad_2d = softmax.view(-1, per_rank)
    arange_1d = torch.arange(grad_2d.shape[0], device=grad_2d.device)
    grad_2d[arange_1d, masked_target_1d] -= softmax_update
    softmax.mul_(grad_output.unsqueeze(-1))
    return softmax.to(dtype)


class _FusedVocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, group):
        # logits [s, b, V/tp] in the model's dtype, target [s, b] int64
        tp = group_size(group)
        dtype = logits.dtype
        logits, logits_max = _logits_max(logits)
        if tp > 1:
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        per_rank = logits.shape[-1]
        start = group_rank(group) * per_rank
        target_mask, masked_target_1d, predicted_sum_exp, exp_logits = _predicted_logits(
            logits, target, logits_max, start, start + per_rank)
        if tp > 1:  # the target's logit and the sum of exponentials in one all-reduce
            dist.all_reduce(predicted_sum_exp, op=dist.ReduceOp.SUM, group=group)
        softmax, loss = _cross_entropy_loss(exp_logits, predicted_sum_exp)
        ctx.dtype = dtype
        ctx.save_for_backward(softmax, target_mask, masked_target_1d)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target_mask, masked_target_1d = ctx.saved_tensors
        return _gradients(softmax, grad_output, target_mask, masked_target_1d, ctx.dtype), None, None


def fused_vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor,
                                       tp_group: Any) -> torch.Tensor:
    """Per-token loss ``[s, b]`` of vocab-split ``logits [s, b, V/tp]`` (any float dtype: cast to
    fp32 inside the first fused kernel) against ``target [s, b]``; the gradient comes back in the
    logits' dtype. The logits' memory is reused (overwritten) when they are fp32."""
    return _FusedVocabParallelCrossEntropy.apply(logits, target, tp_group)
