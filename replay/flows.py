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
    __slots__ = ("key", "spec", "phase", "pending", "t0")

    def __init__(self, key: Hashable, spec: TransferSpec, t0: float = 0.0):
        self.key = key  # (batch id, replica index)
        self.spec = spec
        self.phase = -1
        self.pending = 0
        self.t0 = t0


class _Batch:
    __slots__ = ("key", "left", "ends", "solo", "links", "t0", "specs", "version")

    def __init__(self, key: Hashable, n: int):
        self.key = key
        self.left = n
        self.ends: list[float] = [math.nan] * n
        self.solo = False
        self.links: np.ndarray | None = None
        self.t0 = 0.0
        self.specs: Sequence[TransferSpec] = ()
        self.version = 0


class FluidNetwork:
    """Flows sharing links max-min fairly; advance it event by event with :meth:`step`.

    Work arrives in *batches*: ``start(key, specs, now)`` starts one transfer per spec (the
    replicas of one collective); a batch is reported once, when its last transfer completes, as
    ``(key, [end time of each transfer])``. :meth:`next_time` is the time of the next internal
    event (inf when idle); :meth:`step` handles that instant and returns ``(time, completed)``.

    Fast path (exact): a batch whose transfers use links that no flow in flight uses, and that do
    not share links with each other, runs *solo*: its end times are its transfers' idle-network
    times (cached per spec). Should a later batch touch one of its links, it is *materialized*:
    its transfers are replayed alone up to that instant and continue as ordinary fluid flows.
    """

    def __init__(self, capacity_Bps: Sequence[float], *, solo: bool = True):
        cap = np.asarray(capacity_Bps, dtype=np.float64)
        if cap.ndim != 1 or (cap.size and not np.all(cap > 0)):
            raise ReplayError("link capacities must be a 1-D vector of positive bytes/s")
        self.capacity = cap
        self.solo_enabled = solo
        self._link_flows: dict[int, dict[int, None]] = {}
        self._flows: dict[int, _Flow] = {}
        self._transfers: dict[int, _Transfer] = {}
        self._batches: dict[int, _Batch] = {}
        self._heap: list[tuple[float, int, int, int, int]] = []  # (time, seq, kind, id, version)
        self._seq = 0
        self._next_fid = 0
        self._next_tid = 0
        self._next_bid = 0
        self._busy = np.zeros(cap.size, dtype=np.int64)  # fluid flows per link
        self._owner = np.full(cap.size, -1, dtype=np.int64)  # solo batch holding the link
        self._spec_info: dict[int, tuple[TransferSpec, np.ndarray, float]] = {}
        self._shape_info: dict[tuple, tuple[np.ndarray, bool]] = {}
        self.now = 0.0
        self.recomputes = 0
        """Number of max-min solves done (a cost counter for benchmarks)."""
        self.solo_batches = 0
        """Batches that ran on the fast path (never materialized)."""

    # -- public -------------------------------------------------------------------------------
    def idle(self) -> bool:
        """True when no transfer is in flight."""
        return not self._batches

    def next_time(self) -> float:
        """Time of the next event inside the network (flow finish, phase start, solo end); inf if none."""
        heap = self._heap
        while heap:
            t, _, kind, ident, version = heap[0]
            if kind == 0:
                f = self._flows.get(ident)
                if f is None or f.version != version:
                    heapq.heappop(heap)
                    continue
            elif kind == 2:
                b = self._batches.get(ident)
                if b is None or not b.solo or b.version != version:
                    heapq.heappop(heap)
                    continue
            return t
        return math.inf

    def start(self, key: Hashable, specs: Sequence[TransferSpec], now: float,
              shape: Hashable = None) -> list[tuple[Hashable, list[float]]]:
        """Start one batch at ``now``; returns ``[(key, ends)]`` if it completes at once, else [].

        ``shape``: an optional hashable naming this list of specs, to cache its link set by.
        """
        if now < self.now * (1 - _REL_TOL) - 1e-300:
            raise ReplayError(f"network asked to start a transfer at {now} s, before its time {self.now} s")
        self.now = max(self.now, now)
        bid = self._next_bid
        self._next_bid += 1
        batch = _Batch(key, len(specs))
        self._batches[bid] = batch
        if not specs:
            del self._batches[bid]
            return [(key, [])]
        links, disjoint = self._shape(specs, shape)
        if self.solo_enabled and disjoint and links.size and not self._busy[links].any():
            owners = self._owner[links]
            if not (owners >= 0).any():
                ends = [now + self._info(s)[2] for s in specs]
                batch.solo, batch.links, batch.t0, batch.specs, batch.ends = True, links, now, specs, ends
                self._owner[links] = bid
                self._push(max(ends), 2, bid, batch.version)
                return []
        if links.size:
            for ob in np.unique(self._owner[links]).tolist():
                if ob >= 0:
                    self._materialize(ob, now)
        touched: set[int] = set()
        done: list[tuple[Hashable, list[float]]] = []
        for j, spec in enumerate(specs):
            tid = self._next_tid
            self._next_tid += 1
            tr = _Transfer((bid, j), spec, now)
            self._transfers[tid] = tr
            if self._advance_phase(tid, tr, now, touched):
                self._transfer_done(tr, now, done)
        if touched:
            self._recompute(touched, now)
        return done

    def step(self) -> tuple[float, list[tuple[Hashable, list[float]]]]:
        """Handle the next instant; returns its time and the batches that completed."""
        t0 = self.next_time()
        if t0 == math.inf:
            return t0, []
        limit = t0 + abs(t0) * _REL_TOL
        heap = self._heap
        self.now = max(self.now, t0)
        touched: set[int] = set()
        finished_tids: list[int] = []
        phase_starts: list[int] = []
        done: list[tuple[Hashable, list[float]]] = []
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
                    self._busy[l] -= 1
                    if not lf:
                        del self._link_flows[l]
                    touched.add(l)
                tr = self._transfers[f.tid]
                tr.pending -= 1
                if tr.pending == 0:
                    finished_tids.append(f.tid)
            elif kind == 1:
                phase_starts.append(ident)
            else:
                b = self._batches.get(ident)
                if b is None or not b.solo or b.version != version:
                    continue
                self._owner[b.links] = -1
                del self._batches[ident]
                self.solo_batches += 1
                done.append((b.key, b.ends))
        for tid in phase_starts:
            tr = self._transfers[tid]
            if self._start_flows(tid, tr, t0, touched):
                if self._advance_phase(tid, tr, t0, touched):
                    self._transfer_done(tr, t0, done)
        for tid in finished_tids:
            tr = self._transfers[tid]
            if self._advance_phase(tid, tr, t0, touched):
                self._transfer_done(tr, t0, done)
        if touched:
            self._recompute(touched, t0)
        return t0, done

    # -- internals ------------------------------------------------------------------------------
    def _info(self, spec: TransferSpec) -> tuple[TransferSpec, np.ndarray, float]:
        """(spec, its distinct links, its idle-network time), cached by identity."""
        v = self._spec_info.get(id(spec))
        if v is None or v[0] is not spec:
            links = np.unique(np.fromiter((l for ph in spec.phases for f in ph.flows if f.nbytes > 0
                                           for l in f.links), dtype=np.int64))
            v = (spec, links, solo_time(spec, self.capacity) if self.solo_enabled else math.nan)
            self._spec_info[id(spec)] = v
        return v

    def _shape(self, specs: Sequence[TransferSpec], shape: Hashable = None) -> tuple[np.ndarray, bool]:
        """All links of a batch, and whether its transfers are link-disjoint from each other."""
        k = ("s", id(shape)) if shape is not None else tuple(map(id, specs))
        v = self._shape_info.get(k)
        if v is None:
            parts = [self._info(s)[1] for s in specs]
            allk = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            uniq = np.unique(allk)
            v = (uniq, uniq.size == allk.size, shape)  # keep ``shape`` alive: its id is the key
            self._shape_info[k] = v
        return v[0], v[1]

    def _transfer_done(self, tr: _Transfer, t: float, done: list) -> None:
        bid, j = tr.key
        b = self._batches[bid]
        b.ends[j] = t
        b.left -= 1
        if b.left == 0:
            del self._batches[bid]
            done.append((b.key, b.ends))

    def _materialize(self, bid: int, now: float) -> None:
        """Turn solo batch ``bid`` into fluid flows, replaying each transfer alone up to ``now``."""
        b = self._batches[bid]
        b.solo = False
        b.version += 1
        self._owner[b.links] = -1
        touched: set[int] = set()
        b.left = len(b.specs)
        ends = list(b.ends)
        for j, spec in enumerate(b.specs):
            scratch = FluidNetwork(self.capacity, solo=False)
            scratch.start(0, [spec], b.t0)
            while scratch.next_time() <= now:
                scratch.step()
            if ends[j] <= now or not scratch._transfers:
                b.left -= 1  # already complete by now; its end time stands
                ends[j] = min(ends[j], now)
                continue
            ends[j] = math.nan
            (stid, st), = scratch._transfers.items()
            tid = self._next_tid
            self._next_tid += 1
            tr = _Transfer((bid, j), spec, b.t0)
            tr.phase, tr.pending = st.phase, st.pending
            self._transfers[tid] = tr
            for _, _, kind, ident, _ in scratch._heap:
                if kind == 1 and ident == stid:
                    self._push(_pending_phase_time(scratch, stid), 1, tid, 0)
                    break
            for sf in scratch._flows.values():
                rem = sf.remaining - sf.rate * (now - sf.t_last)
                self._add_flow(tid, sf.links, rem, sf.cap, now, touched)
        b.ends = ends
        if touched:
            self._recompute(touched, now)

    def _add_flow(self, tid: int, links: tuple[int, ...], nbytes: float, cap: float, now: float,
                  touched: set[int]) -> None:
        fid = self._next_fid
        self._next_fid += 1
        self._flows[fid] = _Flow(links, nbytes, cap, tid, now)
        for l in links:
            self._link_flows.setdefault(l, {})[fid] = None
            self._busy[l] += 1
            touched.add(l)

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
            self._add_flow(tid, fs.links, fs.nbytes, fs.max_rate_Bps, now, touched)
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


def _pending_phase_time(net: FluidNetwork, tid: int) -> float:
    return min(t for t, _, kind, ident, _ in net._heap if kind == 1 and ident == tid)


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
    net = FluidNetwork(capacity, solo=False)
    done = net.start(0, [spec], 0.0)
    t = 0.0
    while not done:
        t, done = net.step()
    return t
