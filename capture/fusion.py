"""``torch.compile``d regions recorded as the fused kernels Inductor generates for them.

Under capture ``torch.compile`` runs its function eagerly (a dispatch mode makes Dynamo skip every
frame, ``capture/fakecuda.py``), so a compiled bias-GeLU arrives as its ~10 eager pointwise ops,
each reading and writing memory. On a GPU, TorchInductor lowers the region's pointwise and
reduction ops into Triton kernels that load the region's inputs once and store its outputs once,
while matrix multiplies, attention and collectives stay calls into cuBLAS / extern kernels
(Ansel et al., "PyTorch 2", ASPLOS 2024, section 5: "Inductor ... fuses pointwise and reduction
operations", "matmuls ... are lowered to ... extern kernels"); AOTAutograd compiles the backward
graph the same way (section 4). This module gives the recorder that view:

- :func:`compiled` is what ``torch.compile`` returns during capture: the function (a module's call)
  run eagerly between :meth:`Fuser.enter` and :meth:`Fuser.exit`. Nested regions are one region.
- :meth:`Fuser.region` says which region an op belongs to: the innermost-open region in forward
  (or in a compiled function called by backward code, Megatron's ``bias_gelu_back``); in
  backward, the region whose forward created the autograd node running (autograd sequence
  numbers, ``docs/capture.md``, "Interception", item 5).
- Consecutive fusible ops of one region (one direction) are one :class:`Kernel`, one trace row:
  FLOPs summed; bytes read = the tensors its ops read that it did not produce (each view once);
  bytes written = what it produced that leaves it: read by a later op of the region (a GEMM in
  the middle), returned by the region, written in place into a tensor from outside, or, for a
  backward kernel (no return value to look at), still alive when the kernel ends (the gradients
  it hands on; the ones its own ops consumed have been freed by then).

NB: approximations. One kernel per run of fusible ops: Inductor may split a run into several
kernels (a reduction over another iteration space, a size limit) or fuse differently across a
GEMM (epilogues are not fused into cuBLAS calls). What a forward saves for backward is decided by
AOTAutograd's min-cut partitioner, which prefers recomputing pointwise ops in backward from the
region's inputs to storing intermediates (`min_cut_rematerialization_partition`,
torch/_functorch/partitioners.py): an
intermediate is not counted as written in forward, and a backward kernel that reads one reads
its forward kernel's inputs instead (once); this ignores the partitioner's real choice (it may
save an intermediate when recomputing costs more reads). Memory accounting is unchanged: eager
autograd still keeps the intermediates alive, where Inductor's saved set is smaller.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import torch

from capture.opinfo import tensors_in, unique_nbytes
from heterosim.trace.vocab import kernel_class_of, register_kernel_class

__all__ = ["Fuser", "Kernel", "compiled", "compile_eagerly", "fusible", "POINTWISE", "REDUCTION"]

POINTWISE = "triton_poi_fused"
"""Base name of a fused kernel of pointwise ops only (Inductor's ``triton_poi_fused_*`` kernels)."""
REDUCTION = "triton_red_fused"
"""Base name of a fused kernel with a reduction in it (Inductor's ``triton_red_fused_*``)."""
register_kernel_class("elementwise", POINTWISE)
register_kernel_class("reduction", REDUCTION)

_FUSIBLE = ("elementwise", "copy", "reduction", "norm", "softmax", "cross_entropy", "optimizer")
"""Kernel classes Inductor generates code for. Not fused: ``gemm`` and ``attention`` (extern
kernels), ``embedding`` (its backward is a scatter-add Inductor may leave to aten), collectives,
and custom ops of other namespaces (opaque to Inductor: Megatron's fused softmax stand-ins)."""
_REDUCING = ("reduction", "norm", "softmax", "cross_entropy")

_ACTIVE: list["Fuser"] = []
"""The fuser of the rank being recorded (at most one; empty outside capture)."""


def fusible(func: Any, kernel_class: str) -> bool:
    """Whether Inductor would generate an op into a fused kernel (see :data:`_FUSIBLE`)."""
    return func.namespace in ("aten", "prims") and kernel_class in _FUSIBLE


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run eagerly as one compiled region of the active :class:`Fuser` (if any)."""

    def region(*args: Any, **kwargs: Any) -> Any:
        fuser = _ACTIVE[-1] if _ACTIVE else None
        if fuser is None:
            return fn(*args, **kwargs)
        fuser.enter()
        out = None
        try:
            out = fn(*args, **kwargs)
        finally:
            fuser.exit(out)
        return out

    region.__name__ = region.__qualname__ = getattr(fn, "__name__", "compiled")  # no __wrapped__: Dynamo unwraps it
    return region


def compile_eagerly(model: Any = None, **kwargs: Any) -> Any:
    """``torch.compile`` during capture: the function (or the module itself, its call compiled)
    run eagerly as a fused region; as a decorator too. ``disable=True`` compiles nothing."""
    if kwargs.get("disable"):
        return model if model is not None else (lambda fn: fn)
    if model is None:
        return lambda fn: compile_eagerly(fn, **kwargs)
    if isinstance(model, torch.nn.Module):
        # What nn.Module.compile does: __call__ goes through _compiled_call_impl when it is set.
        model._compiled_call_impl = compiled(model._call_impl)
        return model
    return compiled(model)


@dataclass(slots=True, eq=False)
class Kernel:
    """One fused kernel being recorded: its trace row and what its ops read and produced."""

    row: dict
    """The trace row (the recorder's dict, updated in place)."""
    oid: int
    """The row's op id."""
    region: Hashable
    backward: bool
    """A backward kernel: its bytes written are settled by liveness (module docstring)."""
    classes: set[str] = field(default_factory=set)
    produced: dict[int, int] = field(default_factory=dict)
    """Storage -> bytes the kernel's ops wrote to it."""
    forced: set[int] = field(default_factory=set)
    """Storages from outside written in place: always stored."""
    read: dict[int, set] = field(default_factory=dict)
    """Storage -> views of it already counted as read."""
    escaped: set[int] = field(default_factory=set)
    """Produced storages read by another op: counted in ``written`` already."""
    sources: list = field(default_factory=list)
    """What the kernel reads from outside, in order: (storage, view, bytes, shape)."""
    written: int = 0


def _skey(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _view(t: torch.Tensor) -> tuple:
    return (t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


class Fuser:
    """Regions of ``torch.compile``d code and the fused kernels recorded for them (one rank)."""

    def __init__(self) -> None:
        self.depth = 0
        self.count = 0
        self.current: int | None = None
        self.reset()

    def reset(self) -> None:
        """Forget regions and kernels (an iteration restarts op ids and sequence maps)."""
        self.starts: list[int] = []  # sorted autograd sequence numbers where forward regions start
        self.spans: list[tuple[int, int, int]] = []  # (first seq, end seq, region)
        self.tail: Kernel | None = None  # the kernel an op may still join
        self.pending: list[Kernel] = []  # forward kernels of the open region (bytes written unsettled)
        self.recompute: dict[int, list] = {}
        """Intermediate a forward kernel did not store -> that kernel's sources (recomputed from)."""

    def install(self) -> None:
        _ACTIVE.append(self)

    def uninstall(self) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    # ---- regions ------------------------------------------------------------------------------
    def enter(self) -> None:
        self.depth += 1
        if self.depth == 1:
            self.current = self.count
            self.count += 1
            self._seq0 = torch.autograd._get_sequence_nr()

    def exit(self, out: Any) -> None:
        self.depth -= 1
        if self.depth:
            return
        seq1 = torch.autograd._get_sequence_nr()
        if seq1 > self._seq0:  # autograd nodes were created: their backward ops form the region too
            self.starts.append(self._seq0)
            self.spans.append((self._seq0, seq1, self.current))
        outs = {_skey(t) for t in tensors_in(out)}
        for k in self.pending:
            self._settle(k, keep=outs)
        self.pending, self.tail, self.current = [], None, None

    def region(self, in_backward: bool) -> Hashable | None:
        """The region an op run now belongs to, with its direction; None outside regions."""
        if self.current is not None:
            return (self.current, in_backward)
        if not in_backward or not self.spans:
            return None
        node = torch._C._current_autograd_node()
        if node is None:
            return None
        seq = node._sequence_nr()
        i = bisect.bisect_right(self.starts, seq) - 1
        if i >= 0 and seq < self.spans[i][1]:
            return (self.spans[i][2], True)
        return None

    # ---- kernels ------------------------------------------------------------------------------
    def joinable(self, region: Hashable | None, last_row: dict | None) -> Kernel | None:
        """The open kernel an op of ``region`` joins: the last row recorded, of the same region."""
        k = self.tail
        if region is None or k is None or k.region != region or k.row is not last_row:
            return None
        return k

    def start(self, region: Hashable, row: dict, oid: int, kernel_class: str, reads: Sequence[torch.Tensor],
              outs: Sequence[torch.Tensor], mutated: Sequence[torch.Tensor]) -> Kernel:
        """Turn the just-recorded ``row`` (op ``oid``) into a fused kernel of ``region``."""
        self.close()
        k = Kernel(row, oid, region, backward=self.current is None)
        flops, flops_full = row["flops"], row["flops_full"]
        row.update(flops=0.0, flops_full=0.0, bytes_read=0, bytes_written=0, dims={})
        self.add(k, kernel_class, reads, outs, mutated, flops, flops_full)
        self.tail = k
        if not k.backward:
            self.pending.append(k)
        return k

    def add(self, k: Kernel, kernel_class: str, reads: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
            mutated: Sequence[torch.Tensor], flops: float, flops_full: float) -> None:
        """One more op in kernel ``k``: its FLOPs, what it reads from outside ``k``, what it produces."""
        self.escape(reads, k)
        row = k.row
        row["flops"] += flops
        row["flops_full"] += flops_full
        k.classes.add(kernel_class)
        for t in reads:
            key = _skey(t)
            if key in k.produced:
                continue  # made by an earlier op of the kernel: it stays in registers
            # An intermediate its forward kernel did not store: recomputed from that kernel's sources.
            for src in self.recompute.get(key) or [(key, _view(t), unique_nbytes(t), tuple(t.shape))]:
                views = k.read.setdefault(src[0], set())
                if src[1] not in views:  # NB: two overlapping views of one input are both counted
                    views.add(src[1])
                    row["bytes_read"] += src[2]
                    k.sources.append(src)
        k.forced.update(_skey(t) for t in mutated if _skey(t) not in k.produced)
        for t in [*outs, *mutated]:
            key = _skey(t)
            k.produced[key] = max(k.produced.get(key, 0), unique_nbytes(t))
        numel = max([t.numel() for t in [*reads, *outs]] or [0])
        row["dims"] = {"numel": max(int(numel), int(row["dims"].get("numel", 0)))}
        name = REDUCTION if any(c in _REDUCING for c in k.classes) else POINTWISE
        row["name"] = f"inductor.{name}.default"
        row["kernel_class"] = kernel_class_of(name, row["phase"]) or "elementwise"
        shapes = ",".join("x".join(str(int(d)) for d in src[3]) or "scalar" for src in k.sources)
        row["signature"] = f"{row['name']}:{row['dtype']}:{shapes}"

    def escape(self, reads: Sequence[torch.Tensor], by: Kernel | None = None) -> None:
        """Ops read ``reads`` outside kernel ``by``: what pending kernels produced of them is stored."""
        if not self.pending and self.tail is None:
            return
        kernels = [*self.pending] + ([self.tail] if self.tail is not None and self.tail.backward else [])
        for t in reads:
            key = _skey(t)
            for k in kernels:
                if k is not by and key in k.produced and key not in k.escaped:
                    k.escaped.add(key)
                    k.written += k.produced[key]
                    k.row["bytes_written"] = k.written

    def close(self) -> None:
        """No op joins the open kernel any more (another row was recorded); a backward one settles."""
        k, self.tail = self.tail, None
        if k is not None and k.backward:
            self._settle(k, keep=None)

    def seal(self) -> None:
        """The rows are about to become a block: settle every kernel with what is known now."""
        self.close()
        for k in self.pending:
            self._settle(k, keep=None)
        self.pending = []

    def storage_died(self, key: int) -> None:
        """A storage was freed: a later one may reuse its key."""
        self.recompute.pop(key, None)
        for k in [*self.pending] + ([self.tail] if self.tail is not None else []):
            if key in k.forced and key not in k.escaped:  # stored before it died
                k.escaped.add(key)
                k.written += k.produced.get(key, 0)
                k.row["bytes_written"] = k.written
            k.produced.pop(key, None)
            k.escaped.discard(key)
            k.read.pop(key, None)
            k.forced.discard(key)

    def _settle(self, k: Kernel, keep: set[int] | None) -> None:
        # keep: the region's outputs (forward); None: whatever is still alive (backward, or a seal).
        for key, nbytes in k.produced.items():
            if key in k.escaped:
                continue
            if keep is None or key in keep or key in k.forced:
                k.written += nbytes
                k.escaped.add(key)
            else:  # saved for backward at most: AOTAutograd's partitioner recomputes it there
                self.recompute[key] = list(k.sources)
        k.row["bytes_written"] = k.written
