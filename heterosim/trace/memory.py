"""A role's device memory over one iteration: the optional ``memory`` part of a role file.

Capture (``capture/memory.py``) sees every tensor storage of the captured rank being allocated
and freed; the trace keeps it compactly, in the shape of the program itself:

- ``baseline``: bytes live when the kept iteration starts, per category (parameters, gradients,
  optimizer state: whatever lives across iterations);
- ``blocks``: per block, the events inside it, ``[pos, category, bytes]`` (a free is negative;
  ``pos`` is the op the event precedes, ``len(block)`` for the block's tail). A block is stored
  once, so its events replay for every segment that references it: a forward block referenced
  for micro-batch 5 allocates that micro-batch's activations, the backward block frees them;
- ``gaps``: ``[segment, category, bytes]``: events between two segments, outside any block (the
  schedule dropping a micro-batch's output...), before segment ``segment`` of the program.

Walking the program (:func:`memory_peak`) gives the running total and its peak. Categories are
:data:`CATEGORIES` (by index); ``slack`` is not memory the script asked for but what the CUDA
caching allocator reserves around large blocks (:func:`allocator_sizes`).

Old traces have no ``memory`` part: they load, and report no memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from heterosim.errors import TraceSchemaError

__all__ = [
    "CATEGORIES", "PARAMETERS", "GRADIENTS", "OPTIMIZER", "ACTIVATIONS", "OTHER", "SLACK",
    "MIN_BLOCK", "SMALL_SIZE", "MIN_LARGE_ALLOC", "ROUND_LARGE", "POOL_ALLOWANCE",
    "allocator_sizes", "RoleMemory", "MemoryPeak", "memory_peak",
]

CATEGORIES: tuple[str, ...] = ("parameters", "gradients", "optimizer", "activations", "other", "slack")
PARAMETERS, GRADIENTS, OPTIMIZER, ACTIVATIONS, OTHER, SLACK = range(6)

# PyTorch c10/cuda/CUDACachingAllocator.cpp (CachingAllocatorConfig constants, round_size,
# get_allocation_size): blocks are multiples of 512 bytes; requests of at most 1 MiB come from
# 2 MiB segments of the small pool, requests under 10 MiB from 20 MiB segments of the large pool
# (shared by splitting), larger requests get their own segment rounded up to 2 MiB.
MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20
POOL_ALLOWANCE = SMALL_BUFFER + LARGE_BUFFER
"""Reserved beyond the blocks: one partly used segment of each pool (small 2 MiB, large 20 MiB)."""


def allocator_sizes(nbytes: int) -> tuple[int, int]:
    """``(allocated, slack)`` for a storage of ``nbytes``: the block the caching allocator hands
    out (``torch.cuda.memory_allocated`` counts it) and the rest of its own segment, for requests
    of 10 MiB and more (``memory_reserved`` counts both). Zero bytes allocate nothing."""
    if nbytes <= 0:
        return 0, 0
    block = -(-nbytes // MIN_BLOCK) * MIN_BLOCK
    if nbytes < MIN_LARGE_ALLOC:
        return block, 0
    return block, -(-nbytes // ROUND_LARGE) * ROUND_LARGE - block


@dataclass(frozen=True, slots=True)
class RoleMemory:
    """The memory part of a role (see the module docstring); JSON via :meth:`to_json` / :meth:`from_json`."""

    baseline: tuple[int, ...]
    blocks: Mapping[str, list] = field(default_factory=dict)
    gaps: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"categories": list(CATEGORIES), "baseline": list(self.baseline),
                "blocks": {b: ev for b, ev in sorted(self.blocks.items()) if ev}, "gaps": list(self.gaps)}

    @staticmethod
    def from_json(d: Any, where: str, blocks: Mapping[str, Any], nsegments: int) -> "RoleMemory":
        """Validate and build; every problem is one TraceSchemaError naming ``where``."""
        if not isinstance(d, dict):
            raise TraceSchemaError(f"{where}: 'memory' must be a JSON object")
        if d.get("categories", list(CATEGORIES)) != list(CATEGORIES):
            raise TraceSchemaError(f"{where}: memory categories {d.get('categories')!r:.80} are not {list(CATEGORIES)}")
        base = d.get("baseline")
        if not isinstance(base, list) or len(base) != len(CATEGORIES) or not all(_count(v) for v in base):
            raise TraceSchemaError(f"{where}: memory 'baseline' must be {len(CATEGORIES)} byte counts >= 0")
        evs = d.get("blocks", {})
        if not isinstance(evs, dict):
            raise TraceSchemaError(f"{where}: memory 'blocks' must be a JSON object")
        for b, ev in evs.items():
            if b not in blocks:
                raise TraceSchemaError(f"{where}: memory names unknown block {b!r:.40}")
            _check_events(ev, len(blocks[b]), f"{where} memory of block {b!r}")
        gaps = d.get("gaps", [])
        _check_events(gaps, nsegments, f"{where} memory gaps")
        return RoleMemory(tuple(base), dict(evs), list(gaps))


def _count(v: Any) -> bool:
    return type(v) is int and v >= 0


def _check_events(ev: Any, top: int, where: str) -> None:
    if not isinstance(ev, list):
        raise TraceSchemaError(f"{where}: events must be a list of [position, category, bytes]")
    for e in ev:
        if (not isinstance(e, list) or len(e) != 3 or not all(type(x) is int for x in e)
                or not 0 <= e[0] <= top or not 0 <= e[1] < len(CATEGORIES)):
            raise TraceSchemaError(f"{where}: event {e!r:.60} is not [position 0..{top}, category, bytes]")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPeak:
    """One rank's device memory over the iteration, in bytes (allocator-rounded)."""

    allocated: int
    """Peak of ``torch.cuda.max_memory_allocated``: the most bytes in blocks at once."""
    reserved: int
    """Peak of ``torch.cuda.max_memory_reserved`` (estimated): blocks, own-segment rounding and
    one partly used segment per pool (:data:`POOL_ALLOWANCE`); fragmentation is ignored."""
    at_peak: Mapping[str, int]
    """What the allocated peak consists of, by category (``slack`` excluded)."""
    baseline: int
    """Bytes allocated when the iteration starts (what lives across iterations)."""
    end: int
    """Bytes allocated when the iteration ends (equals ``baseline`` in a steady state)."""
    peak_segment: int
    """Index of the program segment where the allocated peak is reached (-1: at the start)."""

    def to_dict(self) -> dict[str, Any]:
        return {"allocated": self.allocated, "reserved": self.reserved, "at_peak": dict(self.at_peak),
                "baseline": self.baseline, "end": self.end, "peak_segment": self.peak_segment}


def memory_peak(mem: RoleMemory, program: Sequence[Any]) -> MemoryPeak:
    """Walk ``program`` (segments with a ``block`` attribute) applying ``mem``'s events in order.

    A block's events are folded once into a :class:`_BlockSweep` (integer sums: the same peaks as
    applying them one by one), so the walk costs one step per segment, not one per event."""
    run = list(mem.baseline)
    alloc = sum(run[:SLACK])
    slack = run[SLACK]
    peak, peak_res, at, where = alloc, alloc + slack, list(run), -1
    gaps: dict[int, list] = {}
    for seg, cat, b in mem.gaps:
        gaps.setdefault(seg, []).append((cat, b))
    sweeps = {b: _BlockSweep([(c, n) for _, c, n in ev]) for b, ev in mem.blocks.items() if ev}
    for j in range(len(program) + 1):
        for cat, b in gaps.get(j, ()):
            run[cat] += b
            if cat == SLACK:
                slack += b
            else:
                alloc += b
            if b > 0:
                if alloc > peak:
                    peak, at, where = alloc, list(run), j
                peak_res = max(peak_res, alloc + slack)
        sw = sweeps.get(program[j].block) if j < len(program) else None
        if sw is None:
            continue
        if sw.rise is not None:
            if alloc + sw.rise > peak:
                peak, where = alloc + sw.rise, j
                at = [a + d for a, d in zip(run, sw.at_rise)]
            peak_res = max(peak_res, alloc + slack + sw.rise_res)
        for i, d in sw.delta:
            run[i] += d
        alloc += sw.alloc
        slack += sw.slack
    return MemoryPeak(allocated=peak, reserved=peak_res + POOL_ALLOWANCE,
                      at_peak={c: at[i] for i, c in enumerate(CATEGORIES[:SLACK])},
                      baseline=sum(mem.baseline[:SLACK]), end=alloc, peak_segment=where)


class _BlockSweep:
    """A block's events as :func:`memory_peak` needs them: the net change per category, and over
    the events that allocate (``bytes > 0``: where the walk reads its peaks) the highest allocated
    and allocated + slack bytes reached, relative to the block's start, with the change per
    category at the first event reaching the former (a strictly higher total moves the peak, an
    equal one does not)."""

    __slots__ = ("delta", "alloc", "slack", "rise", "rise_res", "at_rise")

    def __init__(self, events: list[tuple[int, int]]):
        run = [0] * len(CATEGORIES)
        alloc = slack = 0
        rise: int | None = None
        rise_res: int | None = None
        at_rise = run
        for cat, b in events:
            run[cat] += b
            if cat == SLACK:
                slack += b
            else:
                alloc += b
            if b > 0:
                if rise is None or alloc > rise:
                    rise, at_rise = alloc, list(run)
                if rise_res is None or alloc + slack > rise_res:
                    rise_res = alloc + slack
        self.delta = [(i, d) for i, d in enumerate(run) if d]
        self.alloc, self.slack = alloc, slack
        self.rise, self.rise_res, self.at_rise = rise, rise_res, at_rise
