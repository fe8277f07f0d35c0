"""Adam with fp32 master weights and global-norm gradient clipping, as Megatron's optimizers do it.

One step (Megatron ``MixedPrecisionOptimizer.step`` / ``DistributedOptimizer``):

1. copy the bf16/fp16 gradients into fp32 main gradients of the fp32 master parameters (whole
   parameters, or with the distributed optimizer only this rank's 1/dp shard of every bucket);
2. fp16 only: unscale, check for inf/nan and all-reduce the flag (MAX);
3. global gradient norm: squared norms of the non-duplicated gradients summed locally, then
   all-reduced over the model-parallel group (tp x pp), or over every rank with the distributed
   optimizer (each dp rank holds a different shard); clip by ``max_norm / (norm + 1e-6)``;
4. AdamW (decoupled weight decay, none for biases and norm weights) on the master parameters;
5. copy the masters back into the model parameters, and with the distributed optimizer
   all-gather the updated shards (:meth:`models.distributed.ModelGradSync.start_param_sync`).

Everything runs under the annotator's ``phase="optimizer"``.

Known limitations: constant learning rate (no warm-up or decay schedule); the clip factor is
always applied (clamped to 1) where Megatron skips the multiply when no clipping is needed, to
stay free of data-dependent branches under capture; fp16 uses a static loss scale.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from models.annotate import get_annotator
from models.config import ParallelConfig
from models.distributed import ModelGradSync, _group_rank, _group_size

__all__ = ["MixedPrecisionAdam", "model_parallel_group"]


def model_parallel_group(pcfg: ParallelConfig, rank: int) -> Any:
    """Create the tp x pp groups (Megatron's model-parallel group) on every rank; return ``rank``'s.

    Gradient-norm partial sums are all-reduced over it. Every rank must call this, in the same
    order relative to other ``new_group`` calls.
    """
    tp, cp, dp, pp = pcfg.tp, pcfg.cp, pcfg.dp, pcfg.pp
    mine = None
    for d in range(dp):
        for c in range(cp):
            ranks = [t + tp * (c + cp * (d + dp * p)) for p in range(pp) for t in range(tp)]
            group = dist.new_group(ranks)
            if rank in ranks:
                get_annotator().label_group(group, "other")
                mine = group
    return mine


class MixedPrecisionAdam:
    """AdamW on fp32 master copies of the parameters held in ``grad_sync``'s buffers.

    Args:
        grad_sync: the rank's model chunks and their gradient buckets.
        lr, weight_decay, betas, eps: AdamW hyper-parameters (Megatron ``--lr`` ...).
        clip_grad: max global gradient norm (0 disables clipping and the norm all-reduce).
        grad_stats_group: group the squared-norm partial sums are summed over (None: this rank
            only); Megatron's model-parallel group, or every rank (``dist.group.WORLD``) with the
            distributed optimizer.
        use_distributed_optimizer: keep masters for this rank's bucket shards only.
        tp_rank: tensor-parallel rank; parameters not split over TP count in the norm on rank 0 only.
        exclude_from_norm: parameters whose gradient is a duplicate (the tied output weight on the
            last stage) and must not count twice in the norm.
        loss_scale: static fp16 loss scale (None for bf16/fp32).
    """

    def __init__(
        self,
        grad_sync: ModelGradSync,
        *,
        lr: float = 1e-4,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        clip_grad: float = 1.0,
        grad_stats_group: Any = None,
        use_distributed_optimizer: bool = False,
        tp_rank: int = 0,
        exclude_from_norm: Sequence[nn.Parameter] = (),
        loss_scale: float | None = None,
    ) -> None:
        self.grad_sync = grad_sync
        self.clip_grad = clip_grad
        self.grad_stats_group = grad_stats_group
        self.loss_scale = loss_scale
        self.distributed = use_distributed_optimizer
        excluded = {id(p) for p in exclude_from_norm}
        # (model-side parameter slice, model-side gradient slice, fp32 master, counts in norm)
        self.slices: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]] = []
        decay: list[torch.Tensor] = []
        no_decay: list[torch.Tensor] = []
        for bucket in grad_sync.buckets():
            lo, hi = 0, bucket.numel
            if use_distributed_optimizer:
                n = bucket.numel // _group_size(bucket.group)
                lo = _group_rank(bucket.group) * n
                hi = lo + n
            off = 0
            for p in bucket.params:
                a, b = max(lo, off), min(hi, off + p.numel())
                off += p.numel()
                if a >= b:
                    continue
                base = off - p.numel()
                model = p.detach().view(-1)[a - base:b - base]
                grad = p.grad.view(-1)[a - base:b - base]
                master = model.clone().float()
                counted = (getattr(p, "tensor_model_parallel", False) or tp_rank == 0) and id(p) not in excluded
                self.slices.append((model, grad, master, counted))
                # Megatron: no weight decay for biases and 1-D (norm) parameters.
                (no_decay if p.dim() == 1 else decay).append(master)
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
        # Fused AdamW = one multi-tensor kernel per group, like apex/TE FusedAdam in Megatron.
        self.adam = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True) if groups else None

    @property
    def master_params(self) -> list[torch.Tensor]:
        return [m for _, _, m, _ in self.slices]

    def _grad_norm(self, grads: list[torch.Tensor], counted: list[bool]) -> torch.Tensor:
        """sqrt(sum of squared norms of counted grads over the stats group); Megatron
        ``get_grad_norm_fp32`` (multi_tensor_l2norm, then all-reduce of norm**2)."""
        # Every rank runs the same kernels: the norms of all grads, weighted 1 (counted) or 0
        # (a TP duplicate or the tied copy). Megatron filters the list instead; the result is the
        # same and the op sequence no longer depends on the TP rank, so one captured rank stands
        # for its whole pipeline stage.
        total = torch.zeros((), dtype=torch.float32)
        if grads:
            weights = torch.tensor([1.0 if c else 0.0 for c in counted], dtype=torch.float32)
            total = (torch.stack(torch._foreach_norm(grads)).square() * weights).sum()
        if _group_size(self.grad_stats_group) > 1:
            dist.all_reduce(total, group=self.grad_stats_group)
        return total.sqrt()

    def step(self) -> torch.Tensor:
        """One optimizer step; returns the global gradient norm (a 0-d fp32 tensor)."""
        with get_annotator().scope(phase="optimizer"):
            for _, grad, master, _ in self.slices:
                master.grad = grad.float()
            grads = [m.grad for _, _, m, _ in self.slices]
            skip = None
            if self.loss_scale is not None and grads:
                found_inf = torch.zeros(1, dtype=torch.float32)
                inv = torch.full((1,), 1.0 / self.loss_scale, dtype=torch.float32)
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv)
                if _group_size(self.grad_stats_group) > 1:
                    dist.all_reduce(found_inf, op=dist.ReduceOp.MAX, group=self.grad_stats_group)
                skip = found_inf
            norm = torch.zeros((), dtype=torch.float32)
            if self.clip_grad > 0:
                norm = self._grad_norm(grads, [c for *_, c in self.slices])
                coeff = torch.clamp(self.clip_grad / (norm + 1.0e-6), max=1.0)
                if grads:
                    torch._foreach_mul_(grads, coeff)
            # Skipping on overflow is data-dependent: only decided when nothing is capturing.
            if skip is not None and not get_annotator().active and bool(skip.item() > 0):
                return norm
            if self.adam is not None:
                self.adam.step()
            for model, _, master, _ in self.slices:
                model.copy_(master)
            self.grad_sync.start_param_sync()
        return norm
