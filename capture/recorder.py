"""The recorder: a TorchDispatchMode that turns one rank's execution into blocks of trace ops.

It sits on top of ``FakeTensorMode`` and sees, in program order, every aten op and every c10d /
``_c10d_functional`` collective (``docs/capture.md``, "Interception", says why this interception
point works and what it relies on; the pitfalls it handles: c10d ops carry no alias info, funcol waits are issued at once
under fake tensors, DTensor ops must be unwrapped, some coalesced ops have no fake kernel).

It is also the capture's :class:`heterosim.annotate.Annotator`: scopes set phase / micro-batch /
chunk, :meth:`Recorder.block` records a repeatable block once and references it afterwards, and
:meth:`Recorder.iteration` keeps only the last training iteration.

Dependencies are tracked per storage (last writer), module paths by forward hooks in forward and by
autograd sequence numbers in backward (exact; ``docs/capture.md``, "Interception", item 5).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any, Hashable, Iterator

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode

from capture import comm as comm_info
from capture.blocks import BlockRecorder, _CachedBlock
from capture.commrec import CommRecorder, _skey
from capture.fakecuda import Dispatching, cpu_device_kwargs
from capture.fusion import Fuser, fusible
from capture.hoist import hoist
from capture.graphs import GraphRecorder
from capture.hostsync import SCALAR_READ, HostSyncs
from capture.fakeworld import FakeWorld
from capture.flexattn import register as register_flex_attention
from capture.iterations import IterationClock, StopCapture
from capture.memory import MemoryTracker
from capture.modpaths import ModulePaths
from capture.opcache import OutputCache
from capture.streams import StreamTracker
from heterosim.trace.ir import Block, Segment
from heterosim.trace.memory import ACTIVATIONS, OTHER, RoleMemory
from capture.opinfo import describe, read_tensors, tensors_in
from heterosim.annotate import Annotator

__all__ = ["Recorder"]

aten = torch.ops.aten

_ALLOC = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_like.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
}
_SKIP = {aten.detach.default, aten.lift_fresh.default, aten.alias.default}
_UPLOADS = {aten.lift_fresh.default, aten.lift_fresh_copy.default, aten.lift.default, aten._to_copy.default}
"""Ops that turn a real tensor into a device one (``torch.tensor(data)``, ``.to("cuda")``): fake."""
_VIEWS_EXTRA = {aten.t.default, aten.view.default, aten._unsafe_view.default}
_DEVICE_QUERY = torch.ops.prim.device.default
"""C++ asking a fake tensor for its device (an argument check of ``torch.mm(out=)``, of every c10d
call): no kernel, nothing to record; answered with the fake device, as ``FakeTensor.__torch_dispatch__``
does outside a fake kernel (inside one, or for another tensor type, the query takes the usual path)."""
ATTENTION_IMPLS = ("flash", "fused")
"""Declared ``attention_backend`` values that name a kernel implementation (FlashAttention-2,
cuDNN fused attention); recorded as ``dims["impl"]`` of each attention op."""
_NOT_ACTIVATION = ("optimizer", "grad_sync", "other")


@dataclass(slots=True)
class _Tags:
    phase: str | None = None
    mb: int = -1
    chunk: int = 0
    gemm_dtype: str | None = None
    comm_dtype: str | None = None
    sm_margin: int | None = None
    region: str | None = None
    comm_kernel: bool = False


class Recorder(BlockRecorder, CommRecorder, HostSyncs, GraphRecorder, TorchDispatchMode, Annotator):
    """Records one rank. Use as a context manager on top of FakeTensorMode; see :meth:`result`."""

    def __init__(self, world: FakeWorld, stop_after: int | None = None) -> None:
        super().__init__()
        self.world = world
        self.clock = IterationClock(stop_after)
        """``"error"``: reading a device value fails (the default); ``"zero"``: it reads as 0."""
        self.kept: tuple[list[Segment], list[int], list] | None = None
        """The last complete iteration (program, baseline, gaps) when optimizer steps delimit them."""
        world.batch_hook = self._batch
        world.quiet = self.quiet
        self.layout: dict[str, Any] = {}
        self.model: dict[str, Any] = {}
        self.blocks: dict[str, Block] = {}
        self.program: list[Segment] = []
        self.cache: dict[Hashable, _CachedBlock] = {}
        self._protos: dict[torch.dtype, torch.Tensor] = {}
        self.outputs = OutputCache()  # fake outputs of calls seen before, from metadata (capture/opcache.py)
        self.graph_allocs: dict[int, list[tuple[int, list]]] = {}
        """Live output storage of a recorded block -> the storages (with their live entries) its
        autograd graph may hold (:meth:`discard`)."""
        self.tags = _Tags()
        self.suppress = 0
        self.iterations_seen = 0
        self.paths = ModulePaths()
        self.streams = StreamTracker(self._emit_wait, lambda: self.next_id, self.host_synced)
        self.fuser = Fuser()  # torch.compile'd regions as fused kernels (capture/fusion.py)
        self._reset_iteration()
        # Storage lifetimes (capture/memory.py): events are filed under the op they precede, in
        # the block being recorded (``block_mem``) or between segments (``gaps``).
        self.mem = MemoryTracker(on_free=self._storage_died)
        self.block_mem: dict[str, list] = {}
        self.seg_mem: list[list[int]] = []
        self.gaps: list[list[int]] = []
        self.baseline: list[int] = self.mem.totals()
        self.memory: RoleMemory | None = None

    # ---- iteration / segment state -----------------------------------------------------------
    def _reset_iteration(self) -> None:
        self.next_id = 0
        self.rows: list[dict] = []
        self.seg_start = 0
        self.seg_key: tuple[int, int] | None = None
        self.in_block: str | None = None
        self.writers: dict[int, list[int]] = {}
        self.paths.seq2mod = {}
        self.streams.reset()
        self.fuser.reset()
        self.works: dict[int, Any] = {}  # first op id -> capture.streams.RecWork
        self.comm_sigs: dict[int, tuple] = {}  # op id -> what it moves (commrec: CommRecorder._outstanding)
        self.unwaited: dict[int, list[tuple[int, int, int]]] = {}
        """storage -> (comm op, first byte, end byte) an async c10d op writes and nobody waited for."""
        self.pending_funcol: dict[int, tuple[int, ...]] = {}
        self.batch_first: int | None = None
        self.in_batch = False

    def _close_segment(self, final: bool = False) -> None:
        """Turn the open segment into a block; ``final``: no later op refers to its ops by id (an
        iteration ends), so side-stream work may move up to where a GPU starts it (capture/hoist.py)."""
        self.fuser.seal()
        if self.in_block is None and self.rows:
            bid = f"i{len(self.blocks)}"
            self._file_events(self.seg_mem, len(self.rows))
            if final:
                self.rows, self.seg_mem = hoist(self.rows, self.seg_mem, self.seg_start)
            else:
                for r in self.rows:
                    r.pop("_after", None)
            self.blocks[bid] = Block.from_rows(self.rows)
            self.block_mem[bid] = self.seg_mem
            self.program.append(Segment(bid, self.seg_key[0], self.seg_key[1]))
        if self.in_block is None:
            self.rows = []
            self.seg_mem = []
            self.seg_key = None

    def _file_events(self, into: list, pos: int) -> None:
        for cat, b in self.mem.take():
            into.append([pos, cat, b])

    def _storage_died(self, key: int) -> None:
        # A storage's address may be reused by a new one: forget what the dead one held.
        self.writers.pop(key, None)
        self.fuser.storage_died(key)
        self.pending_funcol.pop(key, None)
        self.unwaited.pop(key, None)
        self.graph_allocs.pop(key, None)

    def _append(self, row: dict) -> int:
        if self._divert(row):  # inside a CUDA graph capture: kept for its replays (capture/graphs.py)
            return -1
        self.fuser.close()
        if self.in_block is None:
            key = (self.tags.mb, self.tags.chunk)
            if self.seg_key != key:
                self._close_segment()
                self.seg_key = key
                self.seg_start = self.next_id
        self._file_events(self.seg_mem, len(self.rows))
        oid = self.next_id
        lo = self.seg_start if self.in_block is not None else 0
        row["deps"] = sorted({oid - d for d in row.get("deps", ()) if lo <= d < oid})
        if self.in_batch:
            if self.batch_first is None:
                self.batch_first = oid
            elif row["kind"] in ("p2p", "collective"):
                row["coalesced"] = oid - self.batch_first
        self._take_sync(row)
        if self.tags.region is not None:
            row["_region"] = self.tags.region  # the capture's alone (Block.from_rows keeps the columns)
        if row["kind"] != "wait" and self.in_block is None:
            after = self.streams.side_after(oid)
            if after is not None:
                row["_after"] = after
        self.rows.append(row)
        self.next_id += 1
        return oid

    # ---- Annotator API -----------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return True

    def declare(self, layout: dict | None = None, model: dict | None = None) -> None:
        self.layout.update(layout or {})
        self.model.update(model or {})

    def label_group(self, group: Any, dim: str) -> None:
        self.world.label(group, dim)

    def iteration(self, index: int) -> None:
        self.clock.annotated()
        if self.clock.annotated_stop_due():
            self.clock.stopped = True
            raise StopCapture
        self._start_iteration()

    def _step_boundary(self) -> None:
        """An optimizer step ended the iteration: keep it, start the next (or stop the script)."""
        self._close_segment(final=True)
        self.kept = (list(self.program), list(self.baseline), list(self.gaps))
        self.clock.end_by_step()
        self._start_iteration()

    def _start_iteration(self) -> None:
        self.iterations_seen += 1
        self._close_segment(final=True)
        self.program = []
        self._reset_iteration()
        self.mem.take()  # already in the live set the baseline is taken from
        self.mem.classify()
        self.baseline = self.mem.totals()
        self.gaps = []

    @contextlib.contextmanager
    def scope(
        self,
        *,
        phase: str | None = None,
        mb: int | None = None,
        chunk: int | None = None,
        gemm_dtype: str | None = None,
        comm_dtype: str | None = None,
        sm_margin: int | None = None,
        region: str | None = None,
        comm_kernel: bool | None = None,
    ) -> Iterator[None]:
        old = self.tags
        self.tags = _Tags(
            phase if phase is not None else old.phase,
            mb if mb is not None else old.mb,
            chunk if chunk is not None else old.chunk,
            gemm_dtype if gemm_dtype is not None else old.gemm_dtype,
            comm_dtype if comm_dtype is not None else old.comm_dtype,
            sm_margin if sm_margin is not None else old.sm_margin,
            region if region is not None else old.region,
            comm_kernel if comm_kernel is not None else old.comm_kernel,
        )
        try:
            yield
        finally:
            self.tags = old

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Run framework bookkeeping without recording it."""
        self.suppress += 1
        try:
            yield
        finally:
            self.suppress -= 1

    def _batch(self, entering: bool) -> None:
        self.in_batch = entering
        self.batch_first = None

    def __enter__(self) -> "Recorder":
        self.paths.install()
        self.fuser.install()
        self.streams.activate()
        self.clock.install()
        self._graphs = self.graphs_installed()
        self._graphs.__enter__()
        self._sp = None
        try:  # DTensor sharding propagation runs shadow ops on global shapes: do not record them.
            from torch.distributed.tensor._sharding_prop import ShardingPropagator

            rec = self

            class _Suppress:
                def __enter__(self_) -> None:
                    rec.suppress += 1

                def __exit__(self_, *a: Any) -> None:
                    rec.suppress -= 1

            self._sp = (ShardingPropagator, ShardingPropagator._fake_mode_lock)
            ShardingPropagator._fake_mode_lock = _Suppress()
        except (ImportError, AttributeError):
            pass
        return super().__enter__()

    def __exit__(self, *a: Any) -> Any:
        self.paths.uninstall()
        self.fuser.uninstall()
        self.streams.deactivate()
        self.clock.uninstall()
        self._graphs.__exit__(None, None, None)
        if self._sp is not None:
            self._sp[0]._fake_mode_lock = self._sp[1]
        return super().__exit__(*a)

    # ---- dispatch ------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is _DEVICE_QUERY and isinstance(args[0], FakeTensor) and not args[0].fake_mode.in_kernel_invocation:
            return args[0].fake_device  # the commonest call by far (60% of a TP-overlapped forward's)
        Dispatching.depth += 1  # torch's kernels see tensors on the CPU (capture/fakecuda.py)
        try:
            return self._dispatch(func, types, args, cpu_device_kwargs(kwargs or {}))
        finally:
            Dispatching.depth -= 1

    def _dispatch(self, func: Any, types: Any, args: Any, kwargs: dict) -> Any:
        if self.suppress or self.clock.stopped:  # bookkeeping; the script's cleanup after --iterations
            if func is SCALAR_READ:
                return self.read_scalar(args[0], record=False)
            out = func(*args, **kwargs)
            if self.suppress:
                self.mem.note(out, OTHER, counted=False)
            return out
        if self.clock.step_ended and self.in_block is None and self.clock.step_boundary_due():
            self._step_boundary()
        if func is SCALAR_READ:  # .item(): no data to read back; a placeholder (capture/hostsync.py)
            return self.read_scalar(args[0], record=True)
        if not all(_is_fake_type(t) for t in types):
            return NotImplemented  # tensor subclasses (DTensor...) unwrap first; their local ops re-enter
        if (func.namespace == "aten" and func not in _UPLOADS and not _REAL_TYPES.isdisjoint(types)
                and _host_data(args, kwargs)):
            # Real CPU tensors only (an RNG state the script compares with torch.get_rng_state()):
            # host data, computed for real and read back by the script; no GPU kernel.
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        out = comm_info.c10d_result(func, args) if func.namespace == "c10d" else _gemm_into_out(func, args, kwargs)
        if out is comm_info.FAKE_KERNEL:
            out = func(*args, **kwargs)
        elif out is None and func.namespace != "c10d":
            call = self.outputs.key(func, args, kwargs)
            out = None if call is None else self.outputs.lookup(call)
            if out is None:
                out = func(*args, **kwargs)
                if call is not None:
                    self.outputs.learn(call, func, out)
        # The recorder's own reads of tensors (storages, strides, sizes) skip the script's torch
        # function modes (the fake CUDA device's, the host data's): ~10 calls an op otherwise.
        with torch._C.DisableTorchFunction():
            self.mem.note(out, OTHER if self.tags.phase in _NOT_ACTIVATION or self.clock.in_step else ACTIVATIONS)
            if func.namespace in ("c10d", "_c10d_functional"):
                self.fuser.escape(tensors_in((args, kwargs)))
                return self._record_comm(func, args, kwargs, out)
            return self._record_compute(func, args, kwargs, out)

    def _phase(self) -> tuple[str, bool]:
        in_bwd = torch._C._current_graph_task_id() != -1
        if self.tags.phase is not None:
            return self.tags.phase, in_bwd
        if self.clock.in_step:
            return "optimizer", in_bwd
        return ("bwd" if in_bwd else "fwd"), in_bwd

    def _deps(self, tensors: list) -> list[int]:
        deps: set[int] = set()
        for t in tensors:
            deps.update(self.writers.get(_skey(t), ()))
        return sorted(deps)

    def _set_writer(self, t: torch.Tensor, oid: int, partial: bool = False) -> None:
        k = _skey(t)
        self.mem.note(t, OTHER, counted=False)  # known to the tracker, so its death clears writers
        if partial and k in self.writers:
            self.writers[k] = [*self.writers[k][-3:], oid]
        else:
            self.writers[k] = [oid]

    def _record_compute(self, func: Any, args: Any, kwargs: dict, out: Any) -> Any:
        if func in _ALLOC or func in _SKIP:
            return out
        ins = tensors_in((args, kwargs))
        outs = tensors_in(out)
        schema = func._schema
        mutated = [
            t
            for i, a in enumerate(schema.arguments)
            if i < len(args) and a.alias_info is not None and a.alias_info.is_write
            for t in (args[i] if isinstance(args[i], (list, tuple)) else [args[i]])
            if isinstance(t, torch.Tensor)
        ]
        if not outs and not mutated:
            return out  # metadata queries
        phase, in_bwd = self._phase()
        module = self.paths.path(in_bwd)
        if self.pending_funcol:
            self._flush_funcol(ins)
        if (func.is_view or func in _VIEWS_EXTRA) and not mutated:
            return out  # views move no data; deps flow through the shared storage
        if self.unwaited:
            self._flush_unwaited(ins)
        self.paths.map_sequence(in_bwd, module)
        cost = describe(func, args, kwargs, out, mutated, phase, self.tags.gemm_dtype, ins, outs)
        if cost.kernel_class == "attention" and self.model.get("attention_backend") in ATTENTION_IMPLS:
            # which fused kernel the script names (Transformer Engine's flash / fused backends):
            # kernel_db prices that implementation's curve
            cost.dims["impl"] = self.model["attention_backend"]
        if self.tags.comm_kernel:  # moved by a communication kernel as it sends (Annotator.scope)
            cost = replace(cost, kernel_class="comm")
        if cost.kernel_class == "gemm" and self.tags.sm_margin:
            cost.dims["sm_margin"] = int(self.tags.sm_margin)  # SMs left to a comm kernel (TE set_sm_margin)
        region = self._region(func, cost.kernel_class, in_bwd)
        reads = read_tensors(func, args, kwargs, mutated, ins) if region is not None else ins
        kernel = self.fuser.joinable(region, self.rows[-1] if self.rows else None)
        if kernel is not None:  # one more op of a compiled region's fused kernel
            self._join(kernel, self._deps(ins))
            self.fuser.add(kernel, cost.kernel_class, reads, outs, mutated, cost.flops, cost.flops_full)
            self._writes(kernel.oid, outs, mutated)
            return out
        self.fuser.escape(ins)
        oid = self._append(
            {
                "kind": "compute",
                "name": str(func),
                "kernel_class": cost.kernel_class,
                "module": module,
                "phase": phase,
                "flops": cost.flops,
                "flops_full": cost.flops_full,
                "bytes_read": cost.bytes_read,
                "bytes_written": cost.bytes_written,
                "dtype": cost.dtype,
                "dims": cost.dims,
                "signature": cost.signature,
                "deps": self._deps(ins),
            }
        )
        if region is not None and oid >= 0:
            self.fuser.start(region, self.rows[-1], oid, cost.kernel_class, reads, outs, mutated)
        self._writes(oid, outs, mutated)
        return out

    def _region(self, func: Any, kernel_class: str, in_bwd: bool) -> tuple | None:
        """The compiled region (and stream) a fusible op joins a kernel of; None: a row of its own."""
        if self.graph_rows is not None or not fusible(func, kernel_class):
            return None
        region = self.fuser.region(in_bwd)
        stream = self.streams.current
        if region is None or (stream.stream_id and stream.after):
            return None  # NB: a side stream that synchronised since its last op starts a new kernel
        return (region, stream.stream_id)

    def _join(self, kernel: Any, deps: list[int]) -> None:
        row, oid = kernel.row, kernel.oid
        self._file_events(self.seg_mem, len(self.rows) - 1)  # its allocations belong to the kernel
        lo = self.seg_start if self.in_block is not None else 0
        row["deps"] = sorted(set(row["deps"]) | {oid - d for d in deps if lo <= d < oid})

    def _writes(self, oid: int, outs: list, mutated: list) -> None:
        mut_ids = {id(t) for t in mutated}
        for t in outs:
            if id(t) not in mut_ids:
                self._set_writer(t, oid)
        for t in mutated:
            whole = t.numel() * t.element_size() >= t.untyped_storage().nbytes()
            self._set_writer(t, oid, partial=not whole)

    def finish(self) -> tuple[dict[str, Block], list[Segment]]:
        """Close the open segment; return the blocks the kept iteration's program uses, renumbered.

        The kept iteration is the last one; with optimizer-step boundaries, the last complete one
        (what ran after its step is dropped).
        """
        self.mem.take()  # after the last op: the script's teardown, not the iteration
        self._close_segment(final=True)
        if self.kept is not None:
            self.program, self.baseline, self.gaps = self.kept
        used: dict[str, str] = {}
        program = []
        blocks: dict[str, Block] = {}
        for seg in self.program:
            if seg.block not in used:
                used[seg.block] = f"{seg.block[0]}{len(used)}"
                blocks[used[seg.block]] = self.blocks[seg.block]
            program.append(Segment(used[seg.block], seg.mb, seg.chunk))
        self.memory = RoleMemory(tuple(self.baseline),
                                 {used[b]: self.block_mem.get(b, []) for b in used}, list(self.gaps))
        return blocks, program


register_flex_attention(Recorder)

_PLAIN_TYPES: set[type] = {torch.Tensor, torch.nn.Parameter}
_REAL_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
"""Types a real (non-fake) tensor argument shows in ``types``: without one, an op has no host data
to run for real, and the per-op argument walk of :func:`_host_data` is skipped."""


def _host_data(args: Any, kwargs: dict) -> bool:
    """Whether an op's tensors are all real CPU tensors (at least one; none fake)."""
    ts = tensors_in((args, kwargs))
    return bool(ts) and not any(isinstance(t, FakeTensor) or t.device.type != "cpu" for t in ts)


_GEMM_OUT = {aten.mm.out: 2, aten.addmm.out: 3, aten.addmm.dtype_out: 4}
"""GEMMs writing into ``out=`` -> how many positional arguments they take (mat1, mat2; self,
mat1, mat2; self, mat1, mat2, out_dtype)."""


def _gemm_into_out(func: Any, args: Any, kwargs: dict) -> Any:
    """``out`` for a GEMM writing into an ``out=`` of the product's shape and dtype, else None:
    ``mm(a, b, out=y[i])`` (a chunk of TP overlap's pipelined GEMM, ``models/layers/tp_overlap.py``)
    and ``addmm(c, a, b, out=c)`` (a weight gradient accumulated into ``main_grad``,
    ``models/layers/linear.py``).

    Such a call leaves ``out``'s metadata as it was (its version was bumped by autograd's in-place
    layer before the mode saw it), so the fake kernel has nothing to compute; FakeTensorMode runs
    it through its Python out= reference instead, bypassing its cache (3-5 ms a call). The call is
    recorded all the same."""
    n = _GEMM_OUT.get(func)
    if n is None or len(args) != n:
        return None
    c = kwargs.get("out")
    a, b = (args[0], args[1]) if n == 2 else (args[1], args[2])
    if not (isinstance(c, FakeTensor) and isinstance(a, FakeTensor) and isinstance(b, FakeTensor)):
        return None
    if n > 2 and args[0] is not c:  # addmm adds its own output only
        return None
    with torch._C.DisableTorchFunction():
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or tuple(c.shape) != (a.shape[0], b.shape[1]):
            return None
        if a.dtype != b.dtype or c.dtype != (args[3] if n == 4 else a.dtype):
            return None
        if not a.device == b.device == c.device:
            return None
    return c


def _is_fake_type(t: type) -> bool:
    if t in _PLAIN_TYPES:
        return True
    from torch._subclasses.fake_tensor import FakeTensor

    if issubclass(t, FakeTensor):
        _PLAIN_TYPES.add(t)
        return True
    return False
