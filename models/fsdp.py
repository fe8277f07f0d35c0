"""Fully sharded data parallelism as Megatron-core's Megatron-FSDP runs it (``--use-megatron-fsdp``,
``--data-parallel-sharding-strategy optim_grads_params``).

Parameters, gradients and optimizer state are sharded over the data-parallel (x context-parallel)
group. ``megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py`` (megatron-core 0.16):

- *Units.* Each transformer layer is an FSDP unit (``fsdp_unit_modules``); every other module
  that holds parameters directly (embedding, final norm, output layer) is gathered on its own in
  its forward ("all-gather the shallow parameters in every forward pass for modules that are not
  FSDP units") and kept through the backward (no release or backward hook of its own); its
  gradients are reduce-scattered where the backward ends (``_root_post_backward``). A unit's
  parameters form one bucket per dtype (fp8 weights apart with ``--fp8-param-gather``: their
  gathers move one byte per element), padded to ``lcm(dp, 128)`` like the distributed optimizer's.
- *Forward.* A module's forward pre-hook all-gathers its bucket(s) (``all_gather_and_wait_parameters_ready``),
  prefetching the next unit's in forward order, and waits its own; after its forward a layer is
  resharded (``release_module_parameters``) unless the backward has begun (recomputation).
- *Backward.* When the gradient of a layer's output arrives (``_register_pre_backward_param_unshard_hook``)
  the layer is gathered again, prefetching the next one in backward order; once every parameter of
  the layer has its gradient, it is resharded and its gradients are reduce-scattered,
  asynchronously, on every micro-batch (``grad_reduce_every_bprop`` for ``optim_grads_params``).
- *Step.* The optimizer updates this rank's shards (the distributed optimizer's path,
  :class:`models.optimizer.MixedPrecisionAdam`); nothing is gathered after it: the next forward does.

What this ignores: Megatron-FSDP's reduce-scatter queue (``suggested_RS_queue_capacity``) is taken
as unbounded within a backward and drained where the backward ends (here each micro-batch's
backward waits its own reduce-scatters, so a captured backward is self-contained and is reused for
the other micro-batches); the fp8 weights' transpose cache rebuilt in each backward on Hopper
(``fp8_create_transpose_cache``, one transpose per fp8 weight) is not recorded. Memory: the
buffers are kept whole (the layers compute on them) but counted at 1/dp
(:meth:`heterosim.annotate.Annotator.shard`); each gather writes a transient unsharded buffer,
alive until the unit is released, and each unit's backward a transient unsharded gradient buffer,
alive until its reduce-scatter is drained; both count in the phase they are allocated in
(activations in forward and backward). In a real run (not a capture) each micro-batch's reduced
shard is also summed into an accumulator and the unsharded gradients cleared, so that ranks train
as one rank would (``tests/test_pretrain_gpt.py``); a capture records the reduce-scatters alone
(Megatron-FSDP writes each micro-batch's gradients into fresh buffers and sums the reduced shards
in place). Pipeline parallelism is not modelled with it (``models.args`` refuses the combination).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from heterosim.annotate import get_annotator
from models.distributed import Bucket, DataParallel, _group_size

__all__ = ["FullyShardedDataParallel", "fsdp_units"]


def fsdp_units(module: nn.Module, unit_types: tuple[type, ...]) -> list[nn.Module]:
    """The modules gathered as one, in forward (registration) order: each ``unit_types`` instance,
    and every other module holding parameters directly, outside those."""
    units: list[nn.Module] = []
    inside: set[int] = set()
    for m in module.modules():
        if id(m) in inside:
            continue
        if isinstance(m, unit_types):
            units.append(m)
            inside.update(id(x) for x in m.modules())
        elif any(p.requires_grad for p in m.parameters(recurse=False)):
            units.append(m)
    return units


class FullyShardedDataParallel(DataParallel):
    """:class:`models.distributed.DataParallel`'s buffers cut per FSDP unit, with Megatron-FSDP's
    gathers and per-micro-batch reduce-scatters (module docstring). The schedules drive it through
    the same calls; it never overlaps with the distributed optimizer's machinery (no aligned
    gathers, no grad-sync toggling: every backward reduces)."""

    def __init__(self, module: nn.Module, *, dp_group: Any, unit_types: tuple[type, ...],
                 grad_dtype: torch.dtype | None = None, fp8_param_gather: bool = False) -> None:
        # No buckets from the base class: they are built per unit below.
        super().__init__(nn.Module(), dp_group=dp_group, use_distributed_optimizer=True, grad_dtype=grad_dtype)
        self.module = module
        self.units: list[nn.Module] = []
        self.layer: list[bool] = []
        self.unit_buckets: list[list[Bucket]] = []
        self.unit_of: dict[int, int] = {}
        for unit in fsdp_units(module, unit_types):
            is_layer = isinstance(unit, unit_types)
            params = [p for p in unit.parameters(recurse=is_layer) if p.requires_grad and id(p) not in self.unit_of]
            if not params:  # e.g. an output layer whose weight is the embedding's (tied)
                continue
            u, first = len(self.units), len(self.buckets)
            groups: dict[tuple[torch.dtype, bool], list[nn.Parameter]] = {}
            for p in params:
                groups.setdefault((p.dtype, fp8_param_gather and getattr(p, "fp8_weight", False)), []).append(p)
            for (dtype, fp8), plist in groups.items():
                self._build_buffer(plist, dtype, dp_group, None, set(), fp8)
            self.units.append(unit)
            self.layer.append(is_layer)
            self.unit_buckets.append(self.buckets[first:])
            self.unit_of.update((id(p), u) for p in params)
        # The job holds 1/dp of every buffer (parameters and gradients; the optimizer's masters are
        # shards already): the capture counts them so. A unit's unsharded parameters and gradients
        # are transient buffers, allocated at its gather / backward and freed at its release / the
        # end of its reduce-scatter (Megatron-FSDP's per-bucket allocations).
        dp = _group_size(dp_group)
        for b in self.buckets:
            get_annotator().shard(b.param, dp)
            get_annotator().shard(b.grad, dp)
        self.unsharded: dict[int, torch.Tensor] = {}
        self.unsharded_grad: dict[int, torch.Tensor] = {}
        # A real run's numbers (not a capture's ops): each micro-batch's reduced shard is summed
        # into an accumulator the optimizer's shard is set from (Megatron-FSDP sums reduce-scatter
        # outputs into its sharded main gradient and writes each micro-batch's gradients afresh).
        self.reduced: dict[int, torch.Tensor] = {}
        self.accumulated: dict[int, torch.Tensor] = {}
        self.gathered = [False] * len(self.units)
        self.ready_units: set[int] = set()
        self.in_backward = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_accumulated)
                       for p in module.parameters() if p.requires_grad]
        for u, unit in enumerate(self.units):
            unit.register_forward_pre_hook(lambda m, args, u=u: self._gather(u, +1))
            if self.layer[u]:
                unit.register_forward_hook(lambda m, args, out, u=u: self._forward_post(u, out))

    # ---- gathers ------------------------------------------------------------------------------
    def _issue(self, u: int) -> None:
        for b in self.unit_buckets[u]:
            if not b.param_issued:
                self._start_bucket_param_sync(b, async_op=True)

    def _gather(self, u: int, step: int) -> None:
        """Gather unit ``u`` (if it is not), prefetch the unit ``step`` further on, wait ``u``'s."""
        if self.gathered[u]:
            return
        self._issue(u)
        if 0 <= u + step < len(self.units) and not self.gathered[u + step]:
            self._issue(u + step)
        for b in self.unit_buckets[u]:
            if b.param_work is not None:
                b.param_work.wait()
                b.param_work = None
        self.gathered[u] = True

    def _release(self, u: int) -> None:
        self.gathered[u] = False
        for b in self.unit_buckets[u]:
            b.param_issued = False
            self.unsharded.pop(b.index, None)

    def _grad_buffers(self, u: int) -> None:
        """The unit's unsharded gradient buffers, for its backward (freed by :meth:`_drain`)."""
        for b in self.unit_buckets[u]:
            if b.index not in self.unsharded_grad:
                self.unsharded_grad[b.index] = torch.empty_like(b.grad)

    def _forward_post(self, u: int, out: Any) -> None:
        """A layer is resharded after its forward (not in a recomputation inside the backward) and
        gathered again when its output's gradient arrives."""
        if not self.in_backward:
            self._release(u)
        if isinstance(out, torch.Tensor) and out.requires_grad:  # a layer returns its hidden states
            out.register_hook(lambda grad, u=u: self._backward_pre(u))

    def _backward_pre(self, u: int) -> None:
        self.in_backward = True
        self._gather(u, -1)
        self._grad_buffers(u)

    # ---- gradients ----------------------------------------------------------------------------
    def _reduce(self, u: int) -> None:
        self._release(u)
        with get_annotator().scope(phase="grad_sync"):
            for b in self.unit_buckets[u]:
                b.ready.clear()
                if not b.grad_issued:
                    self._start_bucket_grad_sync(b, async_op=True)

    def _grad_ready(self, p: torch.Tensor) -> None:
        u = self.unit_of.get(id(p))
        if u is None:
            return
        self.param_to_bucket[p].ready.add(id(p))
        self._grad_buffers(u)  # a shallow module's, at its first gradient
        if any(len(b.ready) < len(b.params) for b in self.unit_buckets[u]):
            return
        self.ready_units.add(u)
        if self.layer[u]:
            self._reduce(u)  # a layer reduces as soon as its backward is done
        if len(self.ready_units) == len(self.units):
            # Megatron-FSDP's root post-backward: the shallow modules' gradients, then the end of
            # this backward (its reduce-scatters drained here; module docstring).
            for v in range(len(self.units)):
                if not self.layer[v]:
                    self._reduce(v)
            self._drain()

    def _drain(self) -> None:
        for b in self.buckets:
            if b.grad_work is not None:
                b.grad_work.wait()
                b.grad_work = None
            b.grad_issued = False
            out = self.reduced.pop(b.index, None)
            if out is not None:
                acc = self.accumulated.get(b.index)
                self.accumulated[b.index] = out if acc is None else acc.add_(out)
                b.grad.zero_()
        self.ready_units.clear()
        self.unsharded_grad.clear()
        self.in_backward = False

    def finish_grad_sync(self) -> None:
        """Reduce what no backward finished reducing, then wait every outstanding reduce-scatter
        (in a real run, then set each shard the optimizer reads from its micro-batches' sum)."""
        for u in range(len(self.units)):
            if any(b.ready for b in self.unit_buckets[u]):
                self._reduce(u)
        self._drain()
        for b in self.buckets:
            acc = self.accumulated.pop(b.index, None)
            if acc is not None:
                b.shard(b.grad).copy_(acc)

    def _reduced_shard(self, b: Bucket) -> torch.Tensor:
        """In place for a capture; in a real run a fresh shard, summed over micro-batches by :meth:`_drain`."""
        out = b.shard(b.grad)
        if not get_annotator().active:
            out = self.reduced[b.index] = torch.empty_like(out)
        return out

    def start_grad_sync(self) -> None:
        """Nothing to issue from the schedule: every unit reduces from its own backward."""

    def start_param_sync(self) -> None:
        """After the optimizer step: nothing; the next forward gathers each unit."""

    def dispatch_param_sync(self) -> None:
        """No aligned gathers (Megatron-FSDP gathers from its module hooks)."""

    def _start_bucket_param_sync(self, b: Bucket, *, async_op: bool) -> None:
        # The layers compute on the whole buffer (gathered in place); the unsharded copy the job
        # allocates is this transient, for the memory timeline.
        if _group_size(b.group) > 1:
            self.unsharded[b.index] = torch.empty_like(b.param)
        super()._start_bucket_param_sync(b, async_op=async_op)
