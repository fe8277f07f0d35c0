"""Max-min fair rates of flows sharing links, by progressive filling, solved in full or incrementally.

Progressive filling: raise all rates together, freeze the flows that cross a saturated link (or
reach their own cap), repeat (Bertsekas & Gallager, *Data Networks*, 2nd ed., section 6.5.2).

The filling here (:func:`maxmin_rates`) is defined so that a change to the flows in flight can be
solved again over the flows it can affect only, bit for bit (:func:`refill`):

- a link's *share* is ``rem / n`` (capacity left over its ``n`` unfrozen flows); the *level* of a
  round is the smallest share or unfrozen cap; a round freezes the flows of every link whose share
  equals the level (exact ties only, no tolerance: disjoint parts of the network never influence
  each other's rounds) and every flow capped at it, and charges each link
  ``rem = max(rem - k * level, 0)`` for its ``k`` flows frozen;
- a link whose flows froze at ``level`` keeps a share of at least ``nextafter(level, inf)``:
  rounding of ``rem / n`` could otherwise dip an ulp below the level just frozen. Levels then
  strictly increase (a one-ulp overestimate where the floor bites), so a link's state at level
  ``v`` is its capacity charged with the rates below ``v`` of its flows, in increasing order.

Why :func:`refill` equals a full solve (the tests check it on random inputs, bit for bit). Call
``s_l(v)`` link ``l``'s share at level ``v`` computed from the rates of its flows (those below
``v`` charged, the others counted). A rate assignment is *valid* when every flow's rate is
``min(cap, min over its links l of s_l(rate))``. The filling is valid, and only one assignment is:
take two valid ones and the lowest rate ``v`` at which they differ, for a flow ``f`` at ``v`` in
the first; below ``v`` they agree, so every ``s_l(v)`` is the same in both; ``f``'s cap or one of
its links ``l`` has value ``v``; a flow on ``l`` at a higher rate in the second would have
``s_l = v`` below its rate (nothing on ``l`` froze in between), a contradiction; so ``f`` is at
``v`` in both. The filling records each flow's *pin*, the link (or cap) that froze it. After a
change, the *region* is the smallest set of flows holding the added flows and every flow pinned at
a link of a region flow or of a changed link; the other flows on those links are *held* at their
rates (each a flow capped at its rate, on those links only). Filling the region with the held
flows gives the region's flows valid rates; a held flow stays valid when it froze at its own rate
in that filling (its pin, outside, is untouched, and no link inside went below it), else it joins
the region and the filling is run again; flows on no region link keep their links' states. The
whole assignment is then valid, hence the full solve's.

Between events every flow progresses linearly (the fluid approximation: it ignores packet-level
effects, congestion control dynamics and queueing delay).
"""

from __future__ import annotations

import heapq
import math
from itertools import chain
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["maxmin_rates", "refill"]

_REL_TOL = 1e-12
"""Network events closer than this, relative, count as simultaneous (:mod:`replay.flows`)."""

_VECTOR_MIN = 4096
"""Flow-link incidences from which the vectorised filling is faster (measured on 2 CPU cores)."""
_INF = math.inf
_up = math.nextafter


def maxmin_rates(paths: Sequence[tuple[int, ...]], caps: Sequence[float], capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates (B/s) of flows over ``paths`` on idle links (the filling of the module docstring)."""
    return np.asarray(_fill(paths, caps, capacity)[0], dtype=np.float64)


def _fill(paths: Sequence[tuple[int, ...]], caps: Sequence[float], capacity: Any) -> tuple[list[float], list[int]]:
    """Progressive filling of ``paths`` on idle links: each flow's rate and *pin*, the lowest-numbered
    link whose share froze it (-1: its cap, or nothing bounds it). Two implementations of the same
    IEEE operations (equal bit for bit, tested): vectorised for big inputs, a heap of link shares
    (a round costs only the links whose flows froze in it) for the small ones most events make,
    where numpy's fixed cost per call would dominate."""
    if sum(map(len, paths)) >= _VECTOR_MIN:
        return _fill_vector(paths, caps, capacity)
    return _fill_heap(paths, caps, capacity)


def _fill_vector(paths: Sequence[tuple[int, ...]], caps: Sequence[float], capacity: Any) -> tuple[list[float], list[int]]:
    """:func:`_fill` with every link rescanned at every round (numpy)."""
    nf = len(paths)
    lens = np.fromiter(map(len, paths), dtype=np.int64, count=nf)
    owner = np.repeat(np.arange(nf), lens)
    ulinks, local = np.unique(np.fromiter(chain.from_iterable(paths), dtype=np.int64, count=int(lens.sum())),
                              return_inverse=True)
    nl = ulinks.size
    rem = np.asarray(capacity, dtype=np.float64)[ulinks]
    floor = np.zeros(nl)
    cap = np.asarray(caps, dtype=np.float64)
    rate = np.zeros(nf)
    pin = np.full(nf, nl, dtype=np.int64)
    active = np.ones(nf, dtype=bool)
    while active.any():
        on = active[owner]
        count = np.bincount(local[on], minlength=nl)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(count > 0, np.maximum(rem / np.maximum(count, 1), floor), np.inf)
        level = min(float(share.min()), float(cap[active].min()))
        hit = on & (share <= level)[local]
        np.minimum.at(pin, owner[hit], local[hit])
        freeze = np.zeros(nf, dtype=bool)
        freeze[owner[hit]] = True
        freeze |= active & (cap <= level)
        rate[freeze] = level
        active &= ~freeze
        k = np.bincount(local[freeze[owner]], minlength=nl)
        took = k > 0
        rem = np.where(took, np.maximum(rem - k * level, 0.0), rem)
        floor[took] = math.nextafter(level, _INF)
    return rate.tolist(), np.where(pin < nl, ulinks[np.minimum(pin, nl - 1)], -1).tolist()


def _fill_heap(paths: Sequence[tuple[int, ...]], caps: Sequence[float], capacity: Any) -> tuple[list[float], list[int]]:
    """:func:`_fill` driven by a heap of link shares (pure Python)."""
    nf = len(paths)
    rate = [0.0] * nf
    pin = [-1] * nf
    rem: dict[int, float] = {}
    on_link: dict[int, list[int]] = {}
    for i, p in enumerate(paths):
        for l in p:
            on = on_link.get(l)
            if on is None:
                on_link[l] = [i]
            else:
                on.append(i)
    count = {l: len(on) for l, on in on_link.items()}
    share: dict[int, float] = {}
    for l, n in count.items():
        rem[l] = c = float(capacity[l])
        share[l] = c / n
    heap = [(s, l) for l, s in share.items()]
    heapq.heapify(heap)
    capped = sorted((float(c), i) for i, c in enumerate(caps) if c < _INF)
    ci = 0
    frozen = [False] * nf
    active = nf
    while active:
        while heap and share.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # stale: the link's share changed (or it has no unfrozen flow left)
        while ci < len(capped) and frozen[capped[ci][1]]:
            ci += 1
        level = min(heap[0][0] if heap else _INF, capped[ci][0] if ci < len(capped) else _INF)
        freeze: list[int] = []
        if level == _INF:  # no flow crosses a link and none is capped: unbounded
            freeze = [i for i in range(nf) if not frozen[i]]
        while heap and heap[0][0] <= level:
            s, l = heapq.heappop(heap)
            if share.get(l) != s:
                continue
            for i in on_link[l]:
                if not frozen[i]:
                    frozen[i] = True
                    pin[i] = l
                    freeze.append(i)
        while ci < len(capped) and capped[ci][0] <= level:
            i = capped[ci][1]
            ci += 1
            if not frozen[i]:
                frozen[i] = True
                freeze.append(i)
        took: dict[int, int] = {}
        for i in freeze:
            rate[i] = level
            for l in paths[i]:
                took[l] = took.get(l, 0) + 1
        active -= len(freeze)
        floor = _up(level, _INF)
        for l, k in took.items():
            left = rem[l] - float(k) * level
            rem[l] = left if left > 0.0 else 0.0
            n = count[l] - k
            count[l] = n
            if n > 0:
                s = rem[l] / n
                if s < floor:
                    s = floor
                share[l] = s
                heapq.heappush(heap, (s, l))
            else:
                share.pop(l, None)
    return rate, pin


def refill(flows: Mapping[int, Any], link_flows: Mapping[int, Mapping[int, None]], capacity: Any,
           touched: Iterable[int], new: Iterable[int]) -> tuple[list[int], list[float], list[int]]:
    """Re-solve the rates after a change (flows on ``touched`` links finished, flows ``new``
    started): the flows of the region of influence (module docstring), their new rates and pins.

    ``flows``: id -> object with ``links``, ``cap`` and, for flows not in ``new``, ``rate`` and
    ``pin`` (the filling's); ``link_flows``: link -> ids of the flows on it. Returns (flow ids in
    increasing order, their rates, their pins)."""
    region: set[int] = set(new)
    links: set[int] = set()
    near: set[int] = set()  # every flow on a link of ``links``
    queue = [l for l in touched if l in link_flows]
    for g in region:
        queue.extend(flows[g].links)
    while True:
        while queue:  # close: links of the region, and the flows pinned at them
            l = queue.pop()
            if l in links:
                continue
            links.add(l)
            on = link_flows[l]
            near.update(on)
            for g in on:
                if g not in region and flows[g].pin == l:
                    region.add(g)
                    queue.extend(flows[g].links)
        fids = sorted(region)
        others = sorted(near - region)
        paths = [flows[g].links for g in fids]
        paths += [tuple([l for l in flows[g].links if l in links]) for g in others]
        caps = [flows[g].cap for g in fids] + [flows[g].rate for g in others]
        rates, pins = _fill(paths, caps, capacity)
        n = len(fids)
        moved = [g for g, r in zip(others, rates[n:]) if r != flows[g].rate]
        if not moved:
            return fids, rates[:n], pins[:n]
        for g in moved:  # a flow held outside the region was not: it joins it, and the region grows
            region.add(g)
            queue.extend(flows[g].links)
