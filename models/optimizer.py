"""Adam with fp32 master weights and global-norm gradient clipping, as Megatron's optimizers do it.

One step (Megatron ``MixedPrecisionOptimizer.step`` / ``DistributedOptimizer``):

1. give the fp32 master parameters the main gradients as fp32 (a copy from bf16/fp16 buffers, the
   buffer itself when gradients are accumulated in fp32) (whole
   parameters, or with the distributed optimizer only this rank's 1/dp shard of every bucket,
   kept flat with per-element norm and weight-decay masks so every dp rank runs the same ops);
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

from heterosim.annotate import get_annotator
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
        self.lr, self.weight_decay = lr, weight_decay
        excluded = {id(p) for p in exclude_from_norm}

        def counted(p: nn.Parameter) -> bool:
            return (getattr(p, "tensor_model_parallel", False) or tp_rank == 0) and id(p) not in excluded

        # Whole parameters: (model parameter, its gradient, fp32 master, counts in norm).
        self.slices: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]] = []
        # Distributed optimizer: this rank's 1/dp shard of every bucket as ONE flat fp32 master
        # (model shard, gradient shard, master, norm weights, weight-decay weights), so that every
        # dp rank runs the same kernels on the same shapes (one captured rank stands for all).
        # NB: Megatron keeps one master per parameter piece inside the shard; FusedAdam treats
        # them as one multi-tensor launch, so the kernels priced are alike.
        self.flat: list[tuple[torch.Tensor, ...]] = []
        decay: list[torch.Tensor] = []
        no_decay: list[torch.Tensor] = []
        # Under capture the masks are left out: they are fp32 arrays the size of the shard that
        # Megatron does not have (its norm kernel reads the shard's pieces, its FusedAdam applies
        # the decay), so they would add 8 bytes per parameter to the memory captured and two
        # elementwise passes to the time; the captured step then takes the norm of the whole
        # shard and decays it all inside the fused AdamW (the same kernels and bytes as Megatron,
        # not its numbers: duplicated TP-replicated elements count, biases decay).
        exact = not get_annotator().active
        for bucket in grad_sync.buckets():
            if use_distributed_optimizer:
                assert bucket.param is not None, "buffers were built without the distributed optimizer"
                n = bucket.numel // _group_size(bucket.group)
                lo = _group_rank(bucket.group) * n
                model, grad = bucket.param[lo:lo + n], bucket.grad[lo:lo + n]
                master = model.clone().float()
                if not exact:
                    self.flat.append((model, grad, master, None, None))
                    decay.append(master)
                    continue
                norm_w = torch.zeros(n, dtype=torch.float32)
                decay_w = torch.zeros(n, dtype=torch.float32)
                off = 0
                for p in bucket.params:
                    a, b = max(lo, off), min(lo + n, off + p.numel())
                    off += p.numel()
                    if a < b:
                        norm_w[a - lo:b - lo] = 1.0 if counted(p) else 0.0
                        decay_w[a - lo:b - lo] = 1.0 if p.dim() > 1 else 0.0
                self.flat.append((model, grad, master, norm_w, decay_w))
                no_decay.append(master)  # decoupled decay applied with decay_w in step()
                continue
            for p in bucket.params:
                master = p.detach().clone().float()
                self.slices.append((p.detach(), p.main_grad, master, counted(p)))
                # Megatron: no weight decay for biases and 1-D (norm) parameters.
                (no_decay if p.dim() == 1 else decay).append(master)
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
        # Fused AdamW = one multi-tensor kernel per group, like apex/TE FusedAdam in Megatron.
        self.adam = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True) if groups else None
        if self.adam is not None:
            # Allocate AdamW's state now, as torch's Adam._init_group would at the first step (a
            # float32 step counter on the parameter's device when fused, zeroed moments), so that
            # every iteration, the first included, is a steady one: published iteration times are
            # steady ones, and capture keeps one iteration.
            for group in self.adam.param_groups:
                for p in group["params"]:
                    self.adam.state[p] = {
                        "step": torch.zeros((), dtype=torch.float32, device=p.device),
                        "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}

    @property
    def master_params(self) -> list[torch.Tensor]:
        return [e[2] for e in self.slices] + [e[2] for e in self.flat]

    def _grad_norm(self) -> torch.Tensor:
        """sqrt(sum of squared norms of counted grads over the stats group); Megatron
        ``get_grad_norm_fp32`` (multi_tensor_l2norm, then all-reduce of norm**2)."""
        # Every rank runs the same kernels: the norms of all grads, weighted 1 (counted) or 0
        # (a TP duplicate or the tied copy). Megatron filters the list instead; the result is the
        # same and the op sequence no longer depends on the TP rank, so one captured rank stands
        # for its whole pipeline stage.
        total = torch.zeros((), dtype=torch.float32)
        if self.slices:
            weights = torch.tensor([1.0 if e[3] else 0.0 for e in self.slices], dtype=torch.float32)
            grads = [e[2].grad for e in self.slices]
            total = (torch.stack(torch._foreach_norm(grads)).square() * weights).sum()
        for _, _, master, norm_w, _ in self.flat:
            if norm_w is None:  # captured: the whole shard (see __init__)
                total = total + torch.linalg.vector_norm(master.grad).square()
            else:
                total = total + (master.grad.square() * norm_w).sum()
        if _group_size(self.grad_stats_group) > 1:
            dist.all_reduce(total, group=self.grad_stats_group)
        return total.sqrt()

    def zero_grad(self) -> None:
        """Drop the fp32 gradients the last step made, at the start of an iteration (Megatron's
        ``optimizer.zero_grad()`` in ``train_step``: ``set_to_none`` for the main parameters,
        ``megatron/core/optimizer/optimizer.py::_zero_grad_group_helper``), so that they do not
        live through the next forward and backward."""
        for _, _, master, *_ in self.slices + self.flat:
            master.grad = None

    def step(self) -> torch.Tensor:
        """One optimizer step; returns the global gradient norm (a 0-d fp32 tensor)."""
        with get_annotator().scope(phase="optimizer"):
            for _, grad, master, *_ in self.slices + self.flat:
                master.grad = grad.float()
            grads = [e[2].grad for e in self.slices + self.flat]
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
                norm = self._grad_norm()
                coeff = torch.clamp(self.clip_grad / (norm + 1.0e-6), max=1.0)
                if grads:
                    torch._foreach_mul_(grads, coeff)
            # Skipping on overflow is data-dependent: only decided when nothing is capturing.
            if skip is not None and not get_annotator().active and bool(skip.item() > 0):
                return norm
            if self.flat and self.weight_decay:
                # AdamW's decoupled decay p *= 1 - lr * wd, on the matrix elements only.
                for _, _, master, _, decay_w in self.flat:
                    if decay_w is not None:
                        master.addcmul_(master, decay_w, value=-self.lr * self.weight_decay)
            if self.adam is not None:
                self.adam.step()
            for model, _, master, *_ in self.slices + self.flat:
                model.copy_(master)
            self.grad_sync.start_param_sync()
        return norm
