"""Repeatable blocks of a capture: recorded once, referenced afterwards (the recorder's part of
:meth:`heterosim.annotate.Annotator.block`).

A block is recorded the first time its key is seen; later calls append a reference and return
fresh tensors shaped like the first outputs (:meth:`BlockRecorder._mimic`). A block that waits
on communication issued before it, or leaves some open, is recorded anew each time, except that
an overlapped p2p exchange hands its requests back (``capture/commrec.py``) and that the script
may name, as ``bare_key``, the block the same code records without those waits
(:func:`_without_rows`). ``any_chunk`` keys a block without the model chunk, and
:meth:`BlockRecorder.discard` forgets what an autograd graph that will never run still holds
(``docs/capture.md``, "Repeatable blocks and iterations").

:class:`BlockRecorder` is a mixin of :class:`capture.recorder.Recorder`, whose state it uses.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import torch
from torch.utils._pytree import tree_leaves, tree_map

from capture.commrec import _byte_range, _skey
from capture.opcache import fake_tensor
from heterosim.trace.ir import Block, Segment
from heterosim.trace.memory import ACTIVATIONS, OTHER

__all__ = ["BlockRecorder"]


_SCALARS = (int, float, bool, str)
"""Leaves of a block's output that pytree would hand back as they are."""


def _is_meta_leaf(m: Any) -> bool:
    """A cached block's stand-in for an output tensor or an open work (:meth:`BlockRecorder._mimic`)."""
    return isinstance(m, tuple) and bool(m) and m[0] in ("__tensor__", "__work__")


@dataclass(slots=True)
class _CachedBlock:
    bid: str
    n: int
    out_meta: Any  # pytree of ("__tensor__", shape, dtype, requires_grad, producer, counted, pending writes),
    # ("__work__", its ops) for an open work handed back, and non-tensors
    reusable: bool
    derived: tuple[list[dict], list] | None = None
    """Rows and memory events of a block derived from another (:func:`_without_rows`),
    not yet in the trace: it becomes a block at its first use."""
    outstanding: tuple | None = None
    """A block that waits on communication issued before it (``shared_waits``): the communication
    still outstanding when it was recorded, as (distance back from its first op, signature)."""
    waited: tuple[int, ...] = ()
    """Distances back from its first op of the outstanding ops it waits for."""


def _without_rows(rows: list[dict], drop: list[int], mem: list, meta: Any) -> tuple[list[dict], list, Any] | None:
    """A recorded block without its rows ``drop`` (ascending; waits on communication issued before the block,
    and the ops of a ``bare_without`` region issued inside it with the waits on them): (rows,
    memory events, output meta) with every backward distance and event position re-counted, or
    None when a kept op waits for or is coalesced with a dropped one, depends on a dropped wait,
    or a dropped row carries a host sync.

    This is the block the same code records when nothing it reads is still being communicated
    (:meth:`BlockRecorder.block`, ``bare_key``): the waits are where the script's reads met pending
    communication, and a dependency on dropped communication is one on the op that wrote what
    was read, which the bare run finds outside the block (and so does not record).
    """
    gone = set(drop)
    new: list[int | None] = []
    for i in range(len(rows)):
        new.append(None if i in gone else i - bisect.bisect_left(drop, i))

    def moved(j: int, i: int, dist: int) -> int | None:
        t = new[i - dist] if 0 <= i - dist < len(rows) else None
        return None if t is None else j - t

    out: list[dict] = []
    for i, r in enumerate(rows):
        j = new[i]
        if j is None:
            if r.get("host_sync"):
                return None
            continue
        r2 = dict(r)
        deps = []
        for d in r.get("deps") or ():
            m = moved(j, i, d)
            if m is None and rows[i - d]["kind"] == "wait":
                return None
            if m is not None:
                deps.append(m)
        r2["deps"] = deps
        for col in ("target", "coalesced"):
            if r.get(col):
                d = moved(j, i, r[col])
                if d is None:
                    return None
                r2[col] = d
        out.append(r2)
    events = [[pos - bisect.bisect_left(drop, pos), cat, b] for pos, cat, b in mem]

    def leaf(m: Any) -> Any:
        if not (_is_meta_leaf(m) and m[0] == "__tensor__") or m[4] is None:
            return m
        if m[6] or new[m[4]] is None:
            raise LookupError
        return (*m[:4], new[m[4]], *m[5:])

    try:
        return out, events, tree_map(leaf, meta, is_leaf=_is_meta_leaf)
    except LookupError:
        return None


class BlockRecorder:
    """Block recording and referencing (mixed into :class:`capture.recorder.Recorder`)."""

    def block(self, key: Hashable, fn: Callable[..., Any], *args: Any, bare_key: Hashable | None = None,
              bare_without: str | None = None, any_chunk: bool = False, shared_waits: bool = False) -> Any:
        if self.in_block is not None:
            return fn(*args)  # nested: part of the outer block
        full_key = key if any_chunk else (key, self.tags.chunk)
        hit = self.cache.get(full_key)
        self._close_segment()
        self._file_events(self.gaps, len(self.program))
        if shared_waits and hit is not None and hit.outstanding is not None and not self.pending_funcol \
                and self._outstanding(self.next_id) == hit.outstanding:
            # The communication still outstanding is where and what it was when the block was
            # recorded: the same ops wait for it at the same distances.
            return self._reference(hit)
        if hit is not None and hit.derived is not None:  # first use of a derived block: it joins the trace
            bid = f"b{len(self.blocks)}"
            self.blocks[bid] = Block.from_rows(hit.derived[0])
            self.block_mem[bid] = hit.derived[1]
            hit = self.cache[full_key] = _CachedBlock(bid, hit.n, hit.out_meta, True)
        if hit is not None and hit.reusable:
            return self._reference(hit)
        bid = f"b{len(self.blocks)}"
        before = self._outstanding(self.next_id) if shared_waits else None
        self.in_block, self.seg_start, self.rows = bid, self.next_id, []
        self.seg_mem, self.mem.block_allocs = [], set()
        works_before = len(self.works)  # works are only added: the block's are the dict's last ones
        try:
            out = fn(*args)
        finally:
            self.fuser.seal()
            rows, self.in_block = self.rows, None
            self._file_events(self.seg_mem, len(rows))
            self.block_mem[bid], self.seg_mem = self.seg_mem, []
            self.rows = []
        start = self.seg_start
        new_works = itertools.islice(reversed(self.works.values()), len(self.works) - works_before)
        open_works = [w for w in new_works if not w.waited]
        outside = [i for i, r in enumerate(rows) if r["kind"] == "wait" and r["target"] > i]
        reusable = not outside and not self.pending_funcol
        handed: dict[int, tuple[int, ...]] = {}
        if open_works and reusable:  # an overlapped exchange hands its requests back
            handed = self._handed_back(open_works, out, start) or {}
            reusable = bool(handed)
        self.blocks[bid] = Block.from_rows(rows)
        self.program.append(Segment(bid, self.tags.mb, self.tags.chunk))

        def meta_of(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return self._meta(x, start, self._pending_writes(x, start) if handed else ())
            return ("__work__", handed[id(x)]) if id(x) in handed else x

        meta = tree_map(meta_of, out)
        self._note_graphs(out)
        self.cache[full_key] = _CachedBlock(bid, len(rows), meta, reusable)
        if before is not None and outside and not open_works and not self.pending_funcol:
            waited = tuple(rows[i]["target"] - i for i in outside)
            if {d for d, _ in before} >= set(waited):
                self.cache[full_key] = _CachedBlock(bid, len(rows), meta, False, outstanding=before, waited=waited)
        bare = bare_key if any_chunk else (bare_key, self.tags.chunk)
        if bare_key is not None and not open_works and not self.pending_funcol and bare not in self.cache:
            drop = set(outside)
            if bare_without is not None:
                drop.update(i for i, r in enumerate(rows) if r.get("_region") == bare_without)
                drop.update(i for i, r in enumerate(rows) if r["kind"] == "wait" and i - r["target"] in drop)
            derived = _without_rows(rows, sorted(drop), self.block_mem[bid], meta) if drop else None
            if derived is not None:
                self.cache[bare] = _CachedBlock("", len(derived[0]), derived[2], True, derived[:2])
        self.mem.block_allocs = None
        return out

    def _reference(self, hit: _CachedBlock) -> Any:
        """Append a reference to ``hit``'s block; its waits on earlier communication (``waited``)
        count as done; the outputs it left."""
        base = self.next_id
        self.program.append(Segment(hit.bid, self.tags.mb, self.tags.chunk))
        self.next_id += hit.n
        for d in hit.waited:
            self._waited_in_block(base - d)
        with torch._C.DisableTorchFunction():  # the recorder's bookkeeping, not the script's calls
            return self._mimic(hit.out_meta, base, self.blocks[hit.bid].columns)

    def _note_graphs(self, out: Any) -> None:
        """Remember what the block allocated that its outputs' autograd graphs may hold (for
        :meth:`discard`): every storage it allocated and left alive, its outputs' own excepted."""
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not any(t.grad_fn is not None for t in outs):
            return
        live = self.mem.live
        mine = {_skey(t) for t in outs}
        # Storage keys are addresses, reused once a storage dies: keep the live entry to compare.
        held = [(k, live[k]) for k in self.mem.block_allocs or () if k in live and k not in mine]
        for t in outs:
            if t.grad_fn is not None and _skey(t) in live:  # dropped when it dies (Recorder._storage_died)
                self.graph_allocs[_skey(t)] = held

    def shard(self, tensor: Any, parts: int) -> None:
        if isinstance(tensor, torch.Tensor) and parts > 1:
            self.mem.resize(tensor, tensor.untyped_storage().nbytes() // parts)

    def release(self, tensor: Any) -> None:
        self.mem.resize(tensor, 0)
        tensor.untyped_storage().resize_(0)

    def discard(self, out: Any) -> None:
        for key, e in self.graph_allocs.pop(_skey(out), ()):
            if self.mem.live.get(key) is e:
                self.mem.forget(key)

    def _meta(self, t: torch.Tensor, start: int, writes: tuple[int, ...] = ()) -> tuple:
        w = self.writers.get(_skey(t), [])
        local = w[-1] - start if w and w[-1] >= start else None
        return ("__tensor__", tuple(t.shape), t.dtype, t.requires_grad, local, self.mem.counted_in_block(t), writes)

    def _fresh(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """``torch.empty(shape, dtype=dtype)`` as the script would get it (a fake tensor on the
        fake device, known to the memory tracker, not counted), built directly: a replayed block's
        outputs are most of a long capture's tensors, and the dispatch through every mode costs
        ~10x more. The first tensor of a dtype is made the usual way and gives mode and device."""
        proto = self._protos.get(dtype)
        if proto is None:
            self.suppress += 1
            try:
                proto = self._protos[dtype] = torch.empty(0, dtype=dtype)
            finally:
                self.suppress -= 1
        t = fake_tensor(proto.fake_mode, proto.fake_device, shape, dtype)
        self.mem.note(t, OTHER, counted=False)
        return t

    def _mimic(self, meta: Any, base: int, columns: Any) -> Any:
        """The outputs of a replayed block (``columns``) whose first op is ``base``: fresh tensors as
        the block left them (producer, memory count, comm writes still pending) and its open works
        revived."""
        def make(m: Any) -> Any:
            if not _is_meta_leaf(m):
                return m
            if m[0] == "__work__":
                return self._revive(m[1], base, columns)
            _, shape, dtype, rg, local, counted, writes = m
            t = self._fresh(shape, dtype)
            if counted:  # the block's events allocated it: count its free wherever it happens
                self.mem.adopt(t, ACTIVATIONS)
            if rg:
                t.requires_grad_(True)
            if local is not None:
                self._set_writer(t, base + local)
            if writes:  # an open receive's buffer: a read waits for it (CommRecorder._flush_unwaited)
                span = _byte_range(t)
                self.unwaited.setdefault(_skey(t), []).extend((base + r, *span) for r in writes)
            return t

        # Most blocks return one tensor or a flat tuple of them: built without pytree's flatten
        # and unflatten (a third of a referenced block's cost).
        if _is_meta_leaf(meta):
            return make(meta)
        if type(meta) is tuple and all(_is_meta_leaf(m) or m is None or type(m) in _SCALARS for m in meta):
            return tuple(make(m) for m in meta)
        return tree_map(make, meta, is_leaf=_is_meta_leaf)
