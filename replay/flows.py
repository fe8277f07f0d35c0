"""Max-min fair sharing of links between the flows in flight: a fluid network model.

A *transfer* is what one collective (or one send/recv pair) puts on the network: a sequence of
*phases*; a phase waits its latency, then starts its flows together and ends when the last one has
arrived; the next phase starts then. A *flow* moves ``nbytes`` over a path of directed links
(indices into the capacity vector), optionally capped at ``max_rate_Bps`` (a per-channel limit).

Rates are max-min fair over every flow in flight (progressive filling: raise all rates together,
freeze the flows that cross a saturated link, repeat; Bertsekas & Gallager, *Data Networks*, 2nd
ed., section 6.5.2). Rates are recomputed at every flow start and finish, but only for the
connected component (flows <-> shared links) that the event touched, since max-min allocations of
disjoint components are independent. Between events every flow progresses linearly (the fluid
approximation: it ignores packet-level effects, congestion control dynamics and queueing delay).

The network is deterministic: events at one instant are handled together, in insertion order.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

import numpy as np

from heterosim.errors import ReplayError

__all__ = ["FlowSpec", "PhaseSpec", "TransferSpec", "FluidNetwork", "solo_time"]

_REL_TOL = 1e-12
"""Events closer than this (relative) are handled as one instant."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowSpec:
    """Bytes from one GPU to another over a path of link indices."""

    links: tuple[int, ...]
    nbytes: float
    max_rate_Bps: float = math.inf
    """Cap on this flow's rate (e.g. one NCCL channel's throughput); inf: links alone decide."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseSpec:
    """Wait ``latency_s``, then run ``flows`` concurrently until the last one is done."""

    latency_s: float = 0.0
    flows: tuple[FlowSpec, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferSpec:
    """Phases run one after another; an empty spec takes zero time."""

    phases: tuple[PhaseSpec, ...] = ()


class _Flow:
    __slots__ = ("links", "remaining", "rate", "t_last", "tid", "version", "cap")

    def __init__(self, links: tuple[int, ...], nbytes: float, cap: float, tid: int, now: float):
        self.links = links
        self.remaining = float(nbytes)
        self.rate = 0.0
        self.t_last = now
        self.tid = tid
        self.version = 0
        self.cap = cap


class _Transfer:
    __slots__ = ("key", "spec", "phase", "pending")

    def __init__(self, key: Hashable, spec: TransferSpec):
        self.key = key
        self.spec = spec
        self.phase = -1
        self.pending = 0


class FluidNetwork:
    """Flows sharing links max-min fairly; advance it event by event with :meth:`step`.

    Usage: ``start(items, now)`` adds transfers ``(key, TransferSpec)`` at time ``now``;
    :meth:`next_time` is the time of the next internal event (inf when idle); :meth:`step` handles
    that instant and returns ``(time, keys of the transfers that completed)``.
    """

    def __init__(self, capacity_Bps: Sequence[float]):
        cap = np.asarray(capacity_Bps, dtype=np.float64)
        if cap.ndim != 1 or (cap.size and not np.all(cap > 0)):
            raise ReplayError("link capacities must be a 1-D vector of positive bytes/s")
        self.capacity = cap
        self._link_flows: dict[int, dict[int, None]] = {}
        self._flows: dict[int, _Flow] = {}
        self._transfers: dict[int, _Transfer] = {}
        self._heap: list[tuple[float, int, int, int, int]] = []  # (time, seq, kind, id, version)
        self._seq = 0
        self._next_fid = 0
        self._next_tid = 0
        self.now = 0.0
        self.recomputes = 0
        """Number of max-min solves done (a cost counter for benchmarks)."""

    # -- public -------------------------------------------------------------------------------
    def idle(self) -> bool:
        """True when no transfer is in flight."""
        return not self._transfers

    def next_time(self) -> float:
        """Time of the next event inside the network (flow finish or phase start); inf if none."""
        heap = self._heap
        while heap:
            t, _, kind, ident, version = heap[0]
            if kind == 0:
                f = self._flows.get(ident)
                if f is None or f.version != version:
                    heapq.heappop(heap)
                    continue
            return t
        return math.inf

    def start(self, items: Iterable[tuple[Hashable, TransferSpec]], now: float) -> list[Hashable]:
        """Start transfers at ``now``; returns the keys of those that complete at once (empty)."""
        if now < self.now * (1 - _REL_TOL) - 1e-300:
            raise ReplayError(f"network asked to start a transfer at {now} s, before its time {self.now} s")
        self.now = max(self.now, now)
        touched: set[int] = set()
        done: list[Hashable] = []
        for key, spec in items:
            tid = self._next_tid
            self._next_tid += 1
            tr = _Transfer(key, spec)
            self._transfers[tid] = tr
            if self._advance_phase(tid, tr, now, touched):
                done.append(key)
        if touched:
            self._recompute(touched, now)
        return done

    def step(self) -> tuple[float, list[Hashable]]:
        """Handle the next instant; returns its time and the keys of transfers that completed."""
        t0 = self.next_time()
        if t0 == math.inf:
            return t0, []
        limit = t0 + abs(t0) * _REL_TOL
        heap = self._heap
        self.now = max(self.now, t0)
        touched: set[int] = set()
        finished_tids: list[int] = []
        phase_starts: list[int] = []
        while heap and heap[0][0] <= limit:
            _, _, kind, ident, version = heapq.heappop(heap)
            if kind == 0:
                f = self._flows.get(ident)
                if f is None or f.version != version:
                    continue
                del self._flows[ident]
                for l in f.links:
                    lf = self._link_flows[l]
                    del lf[ident]
                    if not lf:
                        del self._link_flows[l]
                    touched.add(l)
                tr = self._transfers[f.tid]
                tr.pending -= 1
                if tr.pending == 0:
                    finished_tids.append(f.tid)
            else:
                phase_starts.append(ident)
        done: list[Hashable] = []
        for tid in phase_starts:
            tr = self._transfers[tid]
            if self._start_flows(tid, tr, t0, touched):
                if self._advance_phase(tid, tr, t0, touched):
                    done.append(tr.key)
        for tid in finished_tids:
            tr = self._transfers[tid]
            if self._advance_phase(tid, tr, t0, touched):
                done.append(tr.key)
        if touched:
            self._recompute(touched, t0)
        return t0, done

    # -- internals ------------------------------------------------------------------------------
    def _advance_phase(self, tid: int, tr: _Transfer, now: float, touched: set[int]) -> bool:
        """Move ``tr`` to its next phase(s); True when the transfer is complete."""
        phases = tr.spec.phases
        while True:
            tr.phase += 1
            if tr.phase >= len(phases):
                del self._transfers[tid]
                return True
            ph = phases[tr.phase]
            if ph.latency_s > 0:
                self._push(now + ph.latency_s, 1, tid, 0)
                return False
            if not self._start_flows(tid, tr, now, touched):
                return False

    def _start_flows(self, tid: int, tr: _Transfer, now: float, touched: set[int]) -> bool:
        """Start the current phase's flows; True when it has none that take time."""
        n = 0
        for fs in tr.spec.phases[tr.phase].flows:
            if fs.nbytes <= 0 or not fs.links:
                continue  # nothing to move, or a copy inside one GPU: instantaneous here
            fid = self._next_fid
            self._next_fid += 1
            self._flows[fid] = _Flow(fs.links, fs.nbytes, fs.max_rate_Bps, tid, now)
            for l in fs.links:
                self._link_flows.setdefault(l, {})[fid] = None
                touched.add(l)
            n += 1
        tr.pending = n
        return n == 0

    def _push(self, t: float, kind: int, ident: int, version: int) -> None:
        heapq.heappush(self._heap, (t, self._seq, kind, ident, version))
        self._seq += 1

    def _component(self, links: set[int]) -> list[int]:
        """Flow ids connected (through shared links) to ``links``, in id order."""
        seen_links = set()
        fids: dict[int, None] = {}
        stack = [l for l in links if l in self._link_flows]
        while stack:
            l = stack.pop()
            if l in seen_links:
                continue
            seen_links.add(l)
            for fid in self._link_flows.get(l, ()):
                if fid not in fids:
                    fids[fid] = None
                    for l2 in self._flows[fid].links:
                        if l2 not in seen_links:
                            stack.append(l2)
        return sorted(fids)

    def _recompute(self, touched: set[int], now: float) -> None:
        fids = self._component(touched)
        if not fids:
            return
        self.recomputes += 1
        flows = [self._flows[f] for f in fids]
        for f in flows:  # bring progress up to now at the old rates
            if f.rate > 0:
                f.remaining -= f.rate * (now - f.t_last)
            f.t_last = now
        rates = maxmin_rates([f.links for f in flows], [f.cap for f in flows], self.capacity)
        for fid, f, r in zip(fids, flows, rates):
            f.rate = float(r)
            f.version += 1
            rem = f.remaining if f.remaining > 0 else 0.0
            self._push(now + rem / f.rate, 0, fid, f.version)


def maxmin_rates(paths: Sequence[tuple[int, ...]], caps: Sequence[float], capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates (B/s) of flows over ``paths`` by progressive filling.

    Each iteration raises every unfrozen flow to the smallest fair share left on any link (or its
    own cap), then freezes the flows that cross a link saturated at that level.
    """
    nf = len(paths)
    lens = np.fromiter((len(p) for p in paths), dtype=np.int64, count=nf)
    flat = np.fromiter((l for p in paths for l in p), dtype=np.int64, count=int(lens.sum()))
    owner = np.repeat(np.arange(nf), lens)
    ulinks, local = np.unique(flat, return_inverse=True)
    rem = capacity[ulinks].astype(np.float64)
    cap = np.asarray(caps, dtype=np.float64)
    rate = np.zeros(nf)
    active = np.ones(nf, dtype=bool)
    nl = ulinks.size
    while active.any():
        on = active[owner]
        count = np.bincount(local[on], minlength=nl)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(count > 0, rem / np.maximum(count, 1), np.inf)
        level = min(float(share.min()), float(cap[active].min()))
        sat_links = share <= level * (1 + _REL_TOL)
        freeze = np.zeros(nf, dtype=bool)
        hit = on & sat_links[local]
        freeze[owner[hit]] = True
        freeze |= active & (cap <= level * (1 + _REL_TOL))
        rate[freeze] = level
        active &= ~freeze
        took = np.bincount(local[freeze[owner]], minlength=nl) * level
        rem = np.maximum(rem - took, 0.0)
    return rate


def solo_time(spec: TransferSpec, capacity: Sequence[float]) -> float:
    """Time ``spec`` takes alone on an idle network (its uncontended duration)."""
    net = FluidNetwork(capacity)
    done = net.start([(0, spec)], 0.0)
    t = 0.0
    while not done:
        t, done = net.step()
    return t
