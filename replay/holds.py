"""Links held by the batches that run wholly solo, and their end times, in O(1) per replica set.

:class:`replay.flows.FluidNetwork` runs a batch (the replicas of one class-level transfer) *bulk
solo* when every replica's links are free: each replica then ends at ``t0 + rel_end`` (its group
alone on an idle network, :class:`replay.transfers._ShapeInfo`). Two costs used to grow with the
number of replicas (the data-parallel width): testing a new batch's links against those held, and
writing out every replica's end time. Both are per *shape* here.

Clash index (:class:`Holds`). The bulk batches in flight hold pairwise disjoint link sets (one
starts only on links no other holds). Whether a new batch of shape S may start is "does a shape
that shares a link with S hold a batch now?". Each shape, registered once, is indexed link by
link; two shapes that share a link become each other's *clashers* (found through the index, once
per pair that shares a link, never by comparing shapes in flight). The test then reads S's
clashers only: O(shapes sharing a link with S), whatever the number of batches in flight or of
links in S. It answers exactly what intersecting the link sets answers (tested).

Lazy ends (:class:`SoloEnds`). A bulk batch reports its ends as ``t0`` plus the shape's relative
ends, computed on demand; its earliest and latest end come from the shape's smallest and largest
relative end. Exact: x -> fl(t0 + x) is monotone (IEEE round to nearest), so max_j fl(t0 + d_j) =
fl(t0 + max_j d_j) and likewise for the min, bit for bit; every element, when read, is the same
``t0 + d`` the network computed before.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from .transfers import _ShapeInfo

__all__ = ["Holds", "SoloEnds", "end_span"]


class Holds:
    """The bulk solo batches in flight (batch id -> shape) and the clash index over their shapes."""

    __slots__ = ("held", "_by_link")

    def __init__(self) -> None:
        self.held: dict[int, _ShapeInfo] = {}
        """Bulk batches in flight, in start order (batch ids increase, so also in id order)."""
        self._by_link: dict[int, list[_ShapeInfo]] = {}

    def __len__(self) -> int:
        return len(self.held)

    def register(self, info: _ShapeInfo) -> None:
        """Index shape ``info`` (once): link its clashers both ways."""
        if info.clashers is not None:
            return
        found: dict[_ShapeInfo, None] = {}
        by_link = self._by_link
        for l in info.link_set:
            on = by_link.get(l)
            if on is None:
                by_link[l] = [info]
            else:
                found.update(dict.fromkeys(on))
                on.append(info)
        for o in found:
            o.clashers.append(info)
        if info.link_set:
            found[info] = None  # a shape clashes with itself: one batch of it at a time
        info.clashers = list(found)

    def free(self, info: _ShapeInfo) -> bool:
        """True when no batch in flight holds a link of ``info`` (``info`` registered)."""
        for o in info.clashers:
            if o.holder >= 0:
                return False
        return True

    def colliding(self, info: _ShapeInfo) -> list[int]:
        """Ids of the batches in flight that hold a link of ``info``, in start order."""
        return sorted(o.holder for o in info.clashers if o.holder >= 0)

    def hold(self, bid: int, info: _ShapeInfo) -> None:
        self.held[bid] = info
        info.holder = bid

    def release(self, bid: int) -> _ShapeInfo:
        info = self.held.pop(bid)
        info.holder = -1
        return info


class SoloEnds(Sequence[float]):
    """End times of a bulk solo batch started at ``t0``: ``t0 + d`` for each relative end ``d`` of
    its shape, computed when read; :attr:`lo` / :attr:`hi` are the earliest / latest (see the
    module docstring for why they equal min / max of the elements, bit for bit)."""

    __slots__ = ("t0", "rel", "lo", "hi")

    def __init__(self, t0: float, info: _ShapeInfo):
        self.t0 = t0
        self.rel = info.rel_ends
        self.lo = t0 + info.shortest
        self.hi = t0 + info.longest

    def __len__(self) -> int:
        return len(self.rel)

    def __getitem__(self, j):  # type: ignore[override]
        if isinstance(j, slice):
            return [self.t0 + d for d in self.rel[j]]
        return self.t0 + self.rel[j]

    def __iter__(self) -> Iterator[float]:
        t0 = self.t0
        return (t0 + d for d in self.rel)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return repr(list(self))


def end_span(ends: Sequence[float]) -> tuple[float, float]:
    """(earliest, latest) of a batch's ends: O(1) for :class:`SoloEnds`, else min / max."""
    if type(ends) is SoloEnds:
        return ends.lo, ends.hi
    return min(ends), max(ends)
