"""Communication as the recorder records it: collectives and p2p ops, their works, and the waits.

A mixin of :class:`capture.recorder.Recorder` (it uses the recorder's rows, writers and stream
tracker). A c10d op becomes one op (a rooted gather / scatter: its grouped sends and receives,
``capture/comm.py``); the script gets a :class:`capture.streams.RecWork` whose ``wait()`` makes the
current stream wait (``capture/streams.py``). A functional collective's wait lands at the first use
of its result, as eager ``AsyncCollectiveTensor`` does; a c10d op's output buffer read or written
before its work was waited for waits first. Inside ``scope(comm_dtype=...)`` a floating-point
collective is recorded at that element type's width (:func:`wire_width`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from capture import comm as comm_info
from capture.opinfo import tensors_in
from capture.streams import RecWork
from heterosim.trace.ir import COLUMNS
from heterosim.trace.vocab import DTYPE_BYTES, PACKED_BLOCK, PACKED_WIRE_BYTES

__all__ = ["CommRecorder", "wire_width"]

_FLOAT = ("fp32", "tf32", "bf16", "fp16")


def wire_width(info: comm_info.CommInfo, comm_dtype: str | None) -> comm_info.CommInfo:
    """``info`` as moved in ``comm_dtype``: a bf16 all-gather of 8 MiB in an ``fp8`` scope is
    recorded as a 4 MiB fp8 all-gather (same elements, 1 byte each); in an ``nvfp4x2`` scope as a
    4.5 MiB ``uint8`` one (:data:`~heterosim.trace.vocab.PACKED_WIRE_BYTES`). Non-float payloads
    (token ids, counts) and collectives already narrower keep their size."""
    if comm_dtype in PACKED_WIRE_BYTES and info.dtype in _FLOAT:
        elems = info.nbytes // DTYPE_BYTES[info.dtype]
        # partial blocks: TE gathers such a tensor in high precision
        if elems % PACKED_BLOCK[comm_dtype.removesuffix("x2")]:
            return info
        return dataclasses.replace(info, nbytes=int(elems * PACKED_WIRE_BYTES[comm_dtype]), dtype="uint8")
    if comm_dtype is None or info.dtype not in _FLOAT or DTYPE_BYTES[comm_dtype] >= DTYPE_BYTES[info.dtype]:
        return info
    nbytes = info.nbytes // DTYPE_BYTES[info.dtype] * DTYPE_BYTES[comm_dtype]
    return dataclasses.replace(info, nbytes=nbytes, dtype=comm_dtype)

_c10d_functional = torch.ops._c10d_functional
_SIG_COLUMNS = ("kind", "collective", "comm_bytes", "dtype", "group", "stream", "peer")
"""What a communication op moves, where: its signature for :meth:`CommRecorder._outstanding`."""


def _skey(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage a tensor (view) spans: [offset, offset + extent)."""
    size = t.element_size()
    lo = t.storage_offset() * size
    if t.numel() == 0:
        return lo, lo
    extent = 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
    return lo, lo + extent * size


class CommRecorder:
    """Collective / p2p recording and wait placement (mixed into the Recorder)."""

    def _flush_funcol(self, tensors: list) -> None:
        for t in tensors:
            target = self.pending_funcol.pop(_skey(t), None)
            if target is not None:
                for k in [k for k, v in self.pending_funcol.items() if v == target]:
                    del self.pending_funcol[k]
                self.streams.wait(target[0])

    def _flush_unwaited(self, tensors: list) -> None:
        # A read or write of bytes an asynchronous c10d op is still writing waits for it first
        # (what DDP's reducer does through futures in C++, which no Python hook sees). Bytes, not
        # storages: Megatron's buckets are slices of one gradient buffer, and accumulating into
        # one bucket must not wait for another's reduce-scatter.
        for t in tensors:
            pending = self.unwaited.get(_skey(t))
            if pending:
                lo, hi = _byte_range(t)
                for target, a, b in list(pending):
                    if a < hi and lo < b:
                        self._work_waited(target, self.streams.epoch)

    def _work_waited(self, target: int, epoch: int) -> None:
        if epoch != self.streams.epoch:
            return  # issued in an earlier (discarded) iteration
        self._forget_unwaited(target)
        self.streams.wait(target)

    def _forget_unwaited(self, target: int) -> None:
        for k in list(self.unwaited):
            left = [e for e in self.unwaited[k] if e[0] != target]
            if left:
                self.unwaited[k] = left
            else:
                del self.unwaited[k]

    def _waited_in_block(self, target: int) -> None:
        """A referenced block's wait op waited for communication op ``target`` (as :meth:`_work_waited`,
        its ``wait`` op already in the block)."""
        self._forget_unwaited(target)
        self.streams.waited_in_block(target)

    def _outstanding(self, pos: int) -> tuple | None:
        """The communication issued before op ``pos`` and not yet waited for, as (distance back
        from ``pos``, signature); None when one came from a referenced block (no signature kept)."""
        out = []
        for t in self.streams.outstanding():
            sig = self.comm_sigs.get(t)
            if sig is None:
                return None
            out.append((pos - t, sig))
        return tuple(out)

    def _record_comm(self, func: Any, args: Any, kwargs: dict, out: Any) -> Any:
        phase, in_bwd = self._phase()
        module = self.paths.path(in_bwd)
        ins = tensors_in((args, kwargs))
        if func is _c10d_functional.wait_tensor.default:
            src = self.writers.get(_skey(ins[0]), [])
            if src:  # eager semantics: the wait lands at the first use of the result
                for t in [ins[0], *tensors_in(out)]:
                    self.pending_funcol[_skey(t)] = (src[-1],)
                    self._set_writer(t, src[-1])
            return out
        if self.pending_funcol:
            self._flush_funcol(ins)
        if self.unwaited:
            self._flush_unwaited(ins)
        self.paths.map_sequence(in_bwd, module)
        pg = comm_info.find_group(func, args, kwargs)
        gid = self.world.gid_of(pg)
        infos = [wire_width(i, self.tags.comm_dtype) for i in comm_info.describe_comms(func, args, kwargs, out, pg)]
        grouped = len(infos) > 1 and not self.in_batch
        if grouped:  # a rooted gather / scatter: NCCL's grouped sends and receives
            self._batch(True)
        try:
            oids = [self._append_comm(func, info, gid, module, phase, ins) for info in infos]
        finally:
            if grouped:
                self._batch(False)
        if func.namespace == "_c10d_functional":
            for t in tensors_in(out):
                self._set_writer(t, oids[0])
            return out
        for info, oid in zip(infos, oids):
            for t in info.written:
                self.unwaited.setdefault(_skey(t), []).append((oid, *_byte_range(t)))
        epoch = self.streams.epoch
        work = RecWork(lambda cid: self._work_waited(cid, epoch), tuple(oids),
                       out[0] if isinstance(out, tuple) else None)
        self.works[oids[0]] = work
        if out is None or isinstance(out, torch.ScriptObject):
            return work.boxed()
        if isinstance(out, tuple) and len(out) == 2:
            return (out[0], work.boxed())
        return out

    def _handed_back(self, works: list, out: Any, start: int) -> dict[int, tuple[int, ...]] | None:
        """A block (ops from ``start`` on) that leaves ``works`` open, as an overlapped p2p exchange
        does: replayable when it returns every one of them, their ops are its own, and the bytes
        they still write are output tensors, whole. Then: each work (by ``id``) -> its ops relative
        to ``start``; else None. What the writes are is read again by :meth:`_pending_writes`."""
        leaves = tree_flatten(out)[0]
        returned = {id(x) for x in leaves if isinstance(x, RecWork)}
        if returned != {id(w) for w in works} or any(w.get_future().value() is not None for w in works):
            return None
        rel = {id(w): tuple(c - start for c in w.comm_ids) for w in works}
        if any(r < 0 for rs in rel.values() for r in rs):
            return None
        ops = {c for w in works for c in w.comm_ids}
        outs = {_skey(t): _byte_range(t) for t in leaves if isinstance(t, torch.Tensor)}
        for k, entries in self.unwaited.items():
            for oid, lo, hi in entries:
                if oid in ops and outs.get(k) != (lo, hi):
                    return None
        return rel

    def _pending_writes(self, t: torch.Tensor, start: int) -> tuple[int, ...]:
        """The ops (relative to ``start``) of the block just recorded whose writes to ``t`` are
        still unwaited."""
        return tuple(oid - start for oid, _, _ in self.unwaited.get(_skey(t), ()) if oid >= start)

    def _revive(self, rel: tuple[int, ...], base: int, columns: Any) -> Any:
        """A replayed block's open work (its ops at ``base + rel``; ``columns``: the block's), as
        :meth:`_record_comm` made it."""
        oids = tuple(base + r for r in rel)
        epoch = self.streams.epoch
        work = RecWork(lambda cid: self._work_waited(cid, epoch), oids, None)
        self.works[oids[0]] = work
        for r, oid in zip(rel, oids):
            self.streams.issue(oid)
            self.comm_sigs[oid] = tuple(columns[c][r] for c in _SIG_COLUMNS)
        return work

    def _append_comm(self, func: Any, info: Any, gid: str, module: str, phase: str, ins: list) -> int:
        stream = f"p2p:{gid}:{info.peer}" if info.kind == "p2p" else f"comm:{gid}"
        row = {
                "kind": info.kind,
                "name": str(func),
                "kernel_class": "comm",
                "module": module,
                "phase": phase,
                "bytes_read": info.nbytes,
                "dtype": info.dtype,
                "signature": f"{info.collective}:{info.dtype}:{info.nbytes}",
                "stream": stream,
                "collective": info.collective,
                "group": gid,
                "comm_bytes": info.nbytes,
                "peer": info.peer,
                "deps": self._deps(ins),
            }
        oid = self._append(row)
        self.streams.issue(oid)
        # As the trace's columns hold it (heterosim.trace.ir.Block.from_rows), for _revive's to compare.
        self.comm_sigs[oid] = tuple(v if (v := row.get(c, COLUMNS[c][1])) is not None else [] for c in _SIG_COLUMNS)
        for t in info.written:
            self._set_writer(t, oid)
        return oid

    def _emit_wait(self, target: int) -> None:
        """A ``wait`` op: the compute stream waits for communication op ``target``."""
        if target >= self.next_id or target < 0:
            return  # issued in an earlier (discarded) iteration
        phase, in_bwd = self._phase()
        module = self.paths.path(in_bwd)
        oid = self.next_id
        self._append(
            {
                "kind": "wait",
                "name": "wait",
                "kernel_class": "comm",
                "module": module or "",
                "phase": phase,
                "target": oid - target,
                "deps": [target],
            }
        )
