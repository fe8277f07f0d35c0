"""Data-parallel gradient sync as Megatron-core's ``DistributedDataParallel`` does it.

Each model chunk's parameters get contiguous gradient buffers (one per dtype, dense and expert
apart), cut into buckets in reverse parameter order; ``param.main_grad`` is a view into the
buffer that sums every micro-batch's gradient. The buffer's dtype is the parameters' own, or fp32
with ``grad_dtype=torch.float32`` (Megatron's ``--accumulate-allreduce-grads-in-fp32``, forced on
with ``--bf16`` unless ``--grad-reduce-in-bf16``: "bfloat16 requires gradient accumulation and
all-reduce to be done in fp32", megatron/training/arguments.py). Autograd's gradient is added into
``main_grad`` by a hook and dropped (Megatron's ``_make_backward_post_hook``; ``param.grad`` is
never the buffer itself), except where the weight-gradient GEMM already accumulated into it
(``grad_added_to_main_grad``, gradient-accumulation fusion, :mod:`models.layers.linear`). A bucket is reduced over the
data-parallel (x context-parallel) group, in the buffer's dtype:

* all-reduce of the whole bucket, or, with the distributed optimizer, reduce-scatter into this
  rank's 1/dp shard (and after the optimizer step an all-gather of the updated parameters, which
  then also live in a contiguous buffer);
* with ``overlap_grad_reduce`` the collective is issued asynchronously from a grad hook as soon
  as every parameter of the bucket has its last micro-batch's gradient, and waited in
  :meth:`DataParallel.finish_grad_sync` (the schedules let hooks do this only where Megatron
  does, and otherwise issue a chunk's remaining buckets at once with
  :meth:`DataParallel.start_grad_sync`); without overlap, all buckets are reduced after the
  backward, as one bucket per buffer (Megatron turns bucketing off then);
* with ``overlap_param_gather`` the optimizer step issues no all-gather: every iteration's first
  forward gathers (Megatron resets its bucket groups in ``zero_grad_buffer``, and a forward
  pre-hook dispatches a bucket's gather if nothing did, waits it, then dispatches the next
  bucket's, ``_ParamAndGradBucketGroup.finish_param_sync``). With ``align_param_gather`` (Megatron's
  default, used by the interleaved schedule) the schedule dispatches a whole chunk's gathers ahead
  of its first forward (:meth:`ModelGradSync.dispatch_param_sync`), so the pre-hooks only wait.

:class:`ModelGradSync` bundles the chunks of one rank with Megatron's ``finalize_model_grads``
(finish DP sync, all-reduce of sequence-parallel norm grads over TP, all-reduce of tied embedding
grads between the first and last pipeline stage) and is what the schedules drive.

Known limitations: buckets are padded at the end (to lcm(dp, 128) elements with the distributed
optimizer) but parameter starts are not 64-element aligned as in Megatron (a memory-alignment
detail); no bucket groups / ``--ddp-num-buckets``; collectives on one-rank groups are skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from heterosim.annotate import get_annotator
from models.layers import fp8 as te_fp8

__all__ = ["Bucket", "DataParallel", "ModelGradSync", "default_bucket_size"]


def default_bucket_size(dp: int) -> int:
    """Megatron's default bucket size in elements: max(40e6, 1e6 * dp).

    Larger DP groups get larger buckets so collectives stay bandwidth-bound
    (megatron/core/distributed/distributed_data_parallel_config.py, ``bucket_size``).
    """
    return max(40_000_000, 1_000_000 * dp)


def _group_size(group: Any) -> int:
    return dist.get_world_size(group) if group is not None else 1


def _group_rank(group: Any) -> int:
    return dist.get_rank(group) if group is not None else 0


@dataclass(slots=True, eq=False)
class Bucket:
    """A run of parameters whose gradients are reduced by one collective."""

    params: list[nn.Parameter]
    grad: torch.Tensor
    """View of the gradient buffer (padded numel)."""
    param: torch.Tensor | None
    """View of the parameter buffer (distributed optimizer only)."""
    group: Any
    index: int
    fp8: bool = False
    """Its parameters are fp8 weights: the all-gather moves one byte per element."""
    ready: set = field(default_factory=set)
    grad_work: Any = None
    param_work: Any = None
    grad_issued: bool = False
    param_issued: bool = False

    @property
    def numel(self) -> int:
        return self.grad.numel()

    def shard(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's 1/dp slice of ``t`` (a bucket-sized view)."""
        n = t.numel() // _group_size(self.group)
        r = _group_rank(self.group)
        return t[r * n:(r + 1) * n]


class DataParallel:
    """Gradient buffers, buckets and their collectives for one model chunk.

    Args:
        module: the model chunk.
        dp_group: group over which dense gradients are reduced (Megatron's dp x cp group).
        expert_dp_group: group for parameters marked ``allreduce = False`` (MoE experts).
        bucket_size: elements per bucket; None gives Megatron's default when overlapping and one
            bucket per buffer otherwise (Megatron turns bucketing off without overlap).
        disable_bucketing: one bucket per buffer (Megatron does this for pipeline stages > 0
            and for model chunks > 0).
        separate_params: parameters that must start their own bucket (Megatron puts the shared
            embedding in its own bucket with the distributed optimizer).
        grad_dtype: dtype of the gradient buffers and of their collectives; None: each
            parameter's own dtype (Megatron-core ``DistributedDataParallelConfig.grad_reduce_in_fp32``).
        fp8_param_gather: parameters marked ``fp8_weight`` (the fp8 GEMMs' weights) are stored in
            fp8: they get buffers of their own, whose all-gathers move one byte per element
            (Megatron-core keeps TE's ``Float8Tensor`` parameters in a ``torch.uint8`` parameter
            buffer, ``distributed_data_parallel.py``; here the tensors stay bf16 and the capture
            records the fp8 width, :func:`models.layers.fp8.wire`).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        dp_group: Any,
        expert_dp_group: Any = None,
        overlap_grad_reduce: bool = False,
        use_distributed_optimizer: bool = False,
        overlap_param_gather: bool = False,
        bucket_size: int | None = None,
        disable_bucketing: bool = False,
        separate_params: Iterable[nn.Parameter] = (),
        grad_dtype: torch.dtype | None = None,
        fp8_param_gather: bool = False,
    ) -> None:
        self.module = module
        self.grad_dtype = grad_dtype
        self.overlap_grad_reduce = overlap_grad_reduce
        self.use_distributed_optimizer = use_distributed_optimizer
        self.overlap_param_gather = overlap_param_gather and use_distributed_optimizer
        self.grad_sync_enabled = True
        self.param_gather_pending = False
        dp = _group_size(dp_group)
        if bucket_size is None and overlap_grad_reduce:
            bucket_size = default_bucket_size(dp)
        if disable_bucketing or not overlap_grad_reduce:
            bucket_size = None
        separate = {id(p) for p in separate_params}
        # Buffers by (dtype, dense/expert); parameters in reverse order, as gradients become
        # ready in backward (megatron/core/distributed/param_and_grad_buffer.py).
        params = [p for p in module.parameters() if p.requires_grad]
        groups: dict[tuple[torch.dtype, bool, bool], list[nn.Parameter]] = {}
        for p in params:
            fp8 = fp8_param_gather and getattr(p, "fp8_weight", False)
            groups.setdefault((p.dtype, getattr(p, "allreduce", True), fp8), []).append(p)
        self.buckets: list[Bucket] = []
        self.buffers: list[torch.Tensor] = []
        self.param_to_bucket: dict[nn.Parameter, Bucket] = {}
        for (dtype, dense, fp8), plist in groups.items():
            group = dp_group if dense else expert_dp_group
            self._build_buffer(list(reversed(plist)), dtype, group, bucket_size, separate, fp8)
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_accumulated) for p in params]
        if self.overlap_param_gather:
            for m in module.modules():
                if any(True for _ in m.parameters(recurse=False)):
                    m.register_forward_pre_hook(self._param_gather_hook)

    # ---- construction -------------------------------------------------------------------------
    def _build_buffer(self, params: list[nn.Parameter], dtype: torch.dtype, group: Any,
                      bucket_size: int | None, separate: set[int], fp8: bool = False) -> None:
        dp = _group_size(group)
        # The distributed optimizer shards every bucket evenly over dp; Megatron pads bucket ends
        # to lcm(dp, 128) elements (256-byte aligned shards).
        pad_to = math.lcm(dp, 128) if self.use_distributed_optimizer else 1
        spans: list[tuple[list[nn.Parameter], int, int]] = []
        cur: list[nn.Parameter] = []
        start = offset = 0
        for p in params:
            if cur and id(p) in separate:
                end = math.ceil(offset / pad_to) * pad_to
                spans.append((cur, start, end))
                cur, start, offset = [], end, end
            cur.append(p)
            offset += p.numel()
            if (bucket_size is not None and offset - start >= bucket_size) or id(p) in separate:
                end = math.ceil(offset / pad_to) * pad_to
                spans.append((cur, start, end))
                cur, start, offset = [], end, end
        if cur:
            spans.append((cur, start, math.ceil(offset / pad_to) * pad_to))
        total = spans[-1][2] if spans else 0
        grad_buf = torch.zeros(total, dtype=self.grad_dtype or dtype)
        param_buf = torch.empty(total, dtype=dtype) if self.use_distributed_optimizer else None
        self.buffers.append(grad_buf)
        for plist, lo, hi in spans:
            bucket = Bucket(params=plist, grad=grad_buf[lo:hi], index=len(self.buckets),
                            param=None if param_buf is None else param_buf[lo:hi], group=group, fp8=fp8)
            off = lo
            for p in plist:
                n = p.numel()
                if param_buf is not None:
                    view = param_buf[off:off + n].view_as(p)
                    view.copy_(p.detach())
                    p.data = view  # parameters live in the buffer the all-gather writes
                p.main_grad = grad_buf[off:off + n].view_as(p)
                self.param_to_bucket[p] = bucket
                off += n
            self.buckets.append(bucket)

    # ---- gradients ----------------------------------------------------------------------------
    def zero_grad_buffer(self) -> None:
        """Zero every gradient buffer (start of an iteration); buckets become un-issued."""
        for buf in self.buffers:
            buf.zero_()
        for b in self.buckets:
            b.ready.clear()
            b.grad_work, b.grad_issued = None, False
        if self.overlap_param_gather:
            # Megatron's bucket-group reset: this iteration's forward gathers every bucket (the
            # first iteration too, which gathers what every rank already holds).
            self.param_gather_pending = any(_group_size(b.group) > 1 for b in self.buckets)

    def _grad_accumulated(self, p: torch.Tensor) -> None:
        if p.grad is not None:
            # Megatron DDP's backward post-hook: main_grad += grad, drop grad.
            if getattr(p, "grad_added_to_main_grad", False):
                p.grad_added_to_main_grad = False  # the fused wgrad GEMM already accumulated
            else:
                p.main_grad.add_(p.grad)
            p.grad = None
        self._grad_ready(p)

    def _grad_ready(self, p: torch.Tensor) -> None:
        if not (self.overlap_grad_reduce and self.grad_sync_enabled):
            return
        bucket = self.param_to_bucket[p]
        bucket.ready.add(id(p))
        if len(bucket.ready) == len(bucket.params):
            with get_annotator().scope(phase="grad_sync"):
                self._start_bucket_grad_sync(bucket, async_op=True)

    def _start_bucket_grad_sync(self, b: Bucket, *, async_op: bool) -> None:
        b.grad_issued = True
        dp = _group_size(b.group)
        if dp == 1:
            return
        # Megatron pre-scales by 1/dp and sums (gradient_scaling_factor, not ReduceOp.AVG).
        b.grad.mul_(1.0 / dp)
        if self.use_distributed_optimizer:
            b.grad_work = dist.reduce_scatter_single(self._reduced_shard(b), b.grad, group=b.group,
                                                     async_op=async_op)
        else:
            b.grad_work = dist.all_reduce(b.grad, group=b.group, async_op=async_op)

    def _reduced_shard(self, b: Bucket) -> torch.Tensor:
        """Where a bucket's reduce-scatter writes this rank's shard: in place, into the buffer."""
        return b.shard(b.grad)

    def start_grad_sync(self) -> None:
        """Issue every bucket its grad hooks have not issued (async when overlapping)."""
        for b in self.buckets:
            if not b.grad_issued:
                self._start_bucket_grad_sync(b, async_op=self.overlap_grad_reduce)

    def finish_grad_sync(self) -> None:
        """Issue the buckets not issued yet (all of them without overlap), then wait all."""
        self.start_grad_sync()
        for b in self.buckets:
            if b.grad_work is not None:
                b.grad_work.wait()
                b.grad_work = None

    # ---- parameters (distributed optimizer) ---------------------------------------------------
    def start_param_sync(self) -> None:
        """After the optimizer step: all-gather the updated shards now, unless overlapped (then
        the next forward gathers them, Megatron's ``DistributedOptimizer.step_with_ready_grads``)."""
        if not self.use_distributed_optimizer or self.overlap_param_gather:
            return
        for b in self.buckets:
            self._start_bucket_param_sync(b, async_op=False)
        for b in self.buckets:
            b.param_issued = False

    def dispatch_param_sync(self) -> None:
        """Issue (async) every pending bucket gather not issued yet, in forward order (Megatron's
        ``DistributedDataParallel.start_param_sync`` as the schedule's ``param_sync_func``)."""
        if self.param_gather_pending:
            for b in reversed(self.buckets):
                if not b.param_issued:
                    self._start_bucket_param_sync(b, async_op=True)

    def _start_bucket_param_sync(self, b: Bucket, *, async_op: bool) -> None:
        b.param_issued = True
        if _group_size(b.group) > 1:
            assert b.param is not None
            with te_fp8.wire(b.fp8, usage="param"), get_annotator().scope(region="param_gather"):
                b.param_work = dist.all_gather_single(b.param, b.shard(b.param), group=b.group,
                                                      async_op=async_op)

    def _wait_bucket_param(self, b: Bucket) -> None:
        if not b.param_issued:
            self._start_bucket_param_sync(b, async_op=True)
        # Prefetch: dispatch the bucket the forward reaches next (buckets are in reverse order).
        if b.index > 0 and not self.buckets[b.index - 1].param_issued:
            self._start_bucket_param_sync(self.buckets[b.index - 1], async_op=True)
        if b.param_work is not None:
            with get_annotator().scope(region="param_gather"):
                b.param_work.wait()
            b.param_work = None

    def _param_gather_hook(self, module: nn.Module, args: Any) -> None:
        if not self.param_gather_pending:
            return
        for p in module.parameters(recurse=False):
            b = self.param_to_bucket.get(p)
            if b is not None:
                self._wait_bucket_param(b)
        if all(b.param_issued and b.param_work is None for b in self.buckets):
            self.finish_param_sync()

    def finish_param_sync(self, *, issue_missing: bool = True) -> None:
        """Wait for every overlapped parameter all-gather still outstanding.

        ``issue_missing=False`` after the first forward: buckets whose gathers no hook issued are
        taken as done (a capture that replays a block does not run the hooks again).
        """
        if self.param_gather_pending:
            if issue_missing:
                self.dispatch_param_sync()
            for b in self.buckets:
                if b.param_work is not None:
                    with get_annotator().scope(region="param_gather"):
                        b.param_work.wait()
                    b.param_work = None
        for b in self.buckets:
            b.param_issued = False
        self.param_gather_pending = False


class ModelGradSync:
    """All of one rank's model chunks plus Megatron's ``finalize_model_grads`` steps.

    Args:
        chunks: one :class:`DataParallel` per model chunk, in chunk order.
        tp_group: tensor-parallel group (sequence-parallel norm grads are summed over it).
        sequence_parallel: whether parameters marked ``sequence_parallel`` need that sum.
        embedding_group: first+last stage group for tied embeddings (None: nothing to tie).
        embedding_params: the tied word-embedding / output weight(s) this rank holds.
        align_grad_reduce: Megatron's default: with pipelining, only the first 1F1B stage reduces
            from grad hooks; the others (and interleaved chunks) launch from the schedule.
        align_param_gather: Megatron's default (``--no-align-param-gather`` turns it off; NeMo sets
            it with PP > 1 and VP > 1): the interleaved schedule dispatches each chunk's overlapped
            parameter all-gathers ahead of its first forward, at the same step on every stage.
    """

    def __init__(
        self,
        chunks: Sequence[DataParallel],
        *,
        tp_group: Any = None,
        sequence_parallel: bool = False,
        embedding_group: Any = None,
        embedding_params: Sequence[nn.Parameter] = (),
        align_grad_reduce: bool = True,
        align_param_gather: bool = True,
    ) -> None:
        self.chunks = list(chunks)
        self.align_grad_reduce = align_grad_reduce
        self.align_param_gather = align_param_gather
        self.tp_group = tp_group
        self.sequence_parallel = sequence_parallel
        self.embedding_group = embedding_group
        self.embedding_params = list(embedding_params)
        self.overlap_grad_reduce = any(c.overlap_grad_reduce for c in self.chunks)

    def param_sync_pending(self, chunk: int) -> bool:
        return self.chunks[chunk].param_gather_pending

    def param_sync_done(self, chunk: int) -> None:
        self.chunks[chunk].finish_param_sync(issue_missing=False)

    def dispatch_param_sync(self, chunk: int) -> None:
        self.chunks[chunk].dispatch_param_sync()

    def set_grad_sync(self, enabled: bool) -> None:
        for c in self.chunks:
            c.grad_sync_enabled = enabled

    def start_grad_sync(self, chunk: int) -> None:
        self.chunks[chunk].start_grad_sync()

    def zero_grad(self) -> None:
        for c in self.chunks:
            c.zero_grad_buffer()

    def finalize(self) -> None:
        """DP sync of every chunk, then SP norm grads over TP, then tied embeddings (Megatron order)."""
        for c in self.chunks:
            c.finish_grad_sync()
        if self.sequence_parallel and _group_size(self.tp_group) > 1:
            grads = [p.main_grad for c in self.chunks for p in c.module.parameters()
                     if getattr(p, "sequence_parallel", False) and hasattr(p, "main_grad")]
            if grads:
                # Megatron flattens them into one buffer, all-reduces once, copies back.
                flat = torch._utils._flatten_dense_tensors(grads)
                dist.all_reduce(flat, group=self.tp_group)
                for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
                    g.copy_(synced)
        if self.embedding_group is not None and _group_size(self.embedding_group) > 1:
            for p in self.embedding_params:
                dist.all_reduce(p.main_grad, group=self.embedding_group)

    def start_param_sync(self) -> None:
        for c in self.chunks:
            c.start_param_sync()

    def buckets(self) -> list[Bucket]:
        return [b for c in self.chunks for b in c.buckets]
