"""Max-min fair sharing of links between the flows in flight: a fluid network model.

The network runs *transfers* (:mod:`replay.transfers`: phases of flows, one transfer per
collective or send/recv pair) and reports when each ends.

Rates are max-min fair over every flow in flight (progressive filling, :mod:`replay.maxmin`).
At every instant where flows start or finish, only the flows whose rate can change are filled
again (:func:`replay.maxmin.refill`: the region of influence of the change, found from the link
each flow is bottlenecked at), and only the flows whose rate did change get a new finish event;
the rates equal a full solve bit for bit (tested). Between events every flow progresses linearly (the
fluid approximation: it ignores packet-level effects, congestion control dynamics and queueing
delay).

*Latency-bound* batches (:mod:`replay.latency`) skip the sharing: each replica is priced alone on
idle links, in the fast path and the reference (``solo=False``) alike.

The network is deterministic: events at one instant are handled together, in insertion order.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from typing import Hashable, Sequence

import numpy as np

from heterosim.errors import ReplayError

from . import latency as _latency
from .holds import Holds, SoloEnds
from .maxmin import _REL_TOL, refill
from .mirrors import Lanes, leave, try_join
from .transfers import FlowSpec, PhaseSpec, TransferSpec, _Batch, _Flow, _Group, _ShapeInfo, _Transfer

__all__ = ["FlowSpec", "PhaseSpec", "TransferSpec", "FluidNetwork", "solo_time"]

_SOLO_MAX_FLOWS = 4096
"""A group of more flows (all phases) keeps no per-step states of its solo run (memory in
proportion to flows x steps): materializing it replays that run, and from then on its shape starts
it as fluid flows, which cost only what each event changes (:func:`replay.maxmin.refill`)."""


class FluidNetwork:
    """Flows sharing links max-min fairly; advance it event by event with :meth:`step`.

    Work arrives in *batches*: ``start(key, specs, now)`` starts one transfer per spec (the
    replicas of one collective); a batch is reported once, when its last transfer completes, as
    ``(key, [end time of each transfer])``. :meth:`next_time` is the time of the next internal
    event (inf when idle); :meth:`step` handles that instant and returns ``(time, completed)``.

    Fast path (exact): a batch's transfers are split into *groups* connected by shared links. A
    group whose links no transfer in flight uses (now or in a later phase) runs *solo*: its end
    times are those of the group alone on an idle network (computed once per distinct group form
    and cached). Should a later batch
    touch one of its links, the group is *materialized*: replayed alone up to that instant, it
    continues as ordinary fluid flows. ``solo=False`` turns the fast path off (the reference
    engine runs that way, and the tests compare the two).
    """

    def __init__(self, capacity_Bps: Sequence[float], *, solo: bool = True, mirror: bool = True,
                 latency_bound: float | None = None):
        cap = np.asarray(capacity_Bps, dtype=np.float64)
        if cap.ndim != 1 or (cap.size and not np.all(cap > 0)):
            raise ReplayError("link capacities must be a 1-D vector of positive bytes/s")
        self.capacity = cap
        self.solo_enabled = solo
        self.mirror_enabled = mirror
        self.latency_bound = _latency.LATENCY_BOUND if latency_bound is None else latency_bound
        """The :data:`replay.latency.LATENCY_BOUND` fraction this network applies (0: every batch
        shares links)."""
        self._bound = _latency.BoundTimes(cap, self.latency_bound)
        self._link_flows: dict[int, dict[int, None]] = {}
        self._flows: dict[int, _Flow] = {}
        self._transfers: dict[int, _Transfer] = {}
        self._batches: dict[int, _Batch] = {}
        self._heap: list[tuple[float, int, int, int, int]] = []  # (time, seq, kind, id, version)
        self._seq = 0
        self._next_fid = 0
        self._next_tid = 0
        self._next_bid = 0
        self._owned: dict[int, int] = {}  # link -> solo batch holding it (per-link ownership)
        self._holds = Holds()
        """Batches running wholly solo, holding their shape's links without per-link entries (their
        link sets are pairwise disjoint: one starts only on links free of the others), tested
        through a clash index over shapes (:mod:`replay.holds`); one is demoted to per-link
        ownership when a new batch collides with it."""
        self._reserved: dict[int, int] = {}
        """link -> fluid transfers in flight that use it in some phase (fast path only): a solo group
        must not start on a link a fluid transfer will use after its latency or in a later phase."""
        self._mirror_of: dict[int, object] = {}
        """link -> the mirror (:mod:`replay.mirrors`) holding it, in any lane (fast path only)."""
        self._lanes = Lanes(cap)
        self._new: dict[int, None] = {}  # flows added since the last solve
        self._pending_start: dict[int, float] = {}  # transfer -> time its next phase starts
        self._spec_info: dict[int, tuple[TransferSpec, np.ndarray, float]] = {}
        self._shape_info: dict[Hashable, _ShapeInfo] = {}  # id(shape) or the specs' ids -> links, groups
        self.now = 0.0
        self.recomputes = 0
        """Number of max-min solves done (a cost counter for benchmarks)."""
        self.solo_batches = 0
        """Batches that ran on the fast path (never materialized)."""
        self.mirrored_batches = 0
        """Batches that started in a mirror, lane 0 standing for every lane (:mod:`replay.mirrors`)."""

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
        if now > self.now:  # self.now = max(self.now, now)
            self.now = now
        bid = self._next_bid
        self._next_bid += 1
        batch = _Batch(key, len(specs))
        self._batches[bid] = batch
        if not specs:
            del self._batches[bid]
            return [(key, [])]
        n = len(specs)
        if self.latency_bound > 0:
            alone = self.latency_bound_times(specs, shape)
            if alone is not None:
                batch.ends = [now + e for e in alone]
                longest = max(alone)
                if longest <= 0:
                    del self._batches[bid]
                    return [(key, batch.ends)]
                # Non-empty ``solo`` and no groups or links: step() ends it at ``longest`` (kind 2)
                # like a solo batch, with nothing to release.
                batch.t0, batch.solo = now, [0]
                self._push(now + longest, 2, bid, batch.version)
                return []
        if not self.solo_enabled:
            return self._start_fluid(bid, specs, list(range(n)), now)
        info = self._shape_info.get(id(shape)) if shape is not None else None
        if info is None:
            info = self._shape(specs, shape)
        reserved, owned, holds, mirror_of = self._reserved, self._owned, self._holds, self._mirror_of
        clear = ((not reserved or reserved.keys().isdisjoint(info.link_set))
                 and (not owned or owned.keys().isdisjoint(info.link_set))
                 and (not mirror_of or mirror_of.keys().isdisjoint(info.link_set))
                 and (not holds.held or holds.free(info)))
        if clear and info.simple:
            # Every group runs solo (the common case): O(1) bookkeeping, its links held by shape,
            # its ends reported lazily (replay.holds).
            batch.t0, batch.specs, batch.solo, batch.groups = now, specs, info.group_ids, info.groups
            batch.info = info
            holds.hold(bid, info)
            self._push(now + info.longest, 2, bid, batch.version)
            return []
        if holds.held:
            for ob in holds.colliding(info):
                self._demote(ob)  # collides with this batch: per-link ownership from here on
        fluid: list[int] = []
        batch.t0, batch.specs, batch.groups = now, specs, info.groups
        if mirror_of or (owned and self.mirror_enabled):
            done = try_join(self, bid, info, specs, now, self.mirror_enabled and info.simple)
            if done is not None:
                return done
        for gi, g in enumerate(info.groups):
            if g.fluid or any(l in reserved or l in owned for l in g.links):
                fluid.extend(g.members)
                continue
            timed = False
            for j, e in zip(g.members, g.rel_ends):
                batch.ends[j] = now + e
                if e > 0:
                    timed = True
                else:
                    batch.left -= 1  # nothing to move: done at once
            if timed:
                batch.solo.append(gi)
        if batch.left == 0:
            del self._batches[bid]
            return [(key, batch.ends)]
        if fluid and owned:
            hit = {l for j in fluid for l in info.links[j] if l in owned}
            for ob in sorted({owned[l] for l in hit}):
                self._materialize(ob, now, hit)
        if batch.solo:
            batch.partial = True
            for gi in batch.solo:
                for l in info.groups[gi].links:
                    owned[l] = bid
            self._push(max(batch.ends[j] for gi in batch.solo for j in info.groups[gi].members), 2, bid,
                       batch.version)
        return self._start_fluid(bid, specs, fluid, now, info.links)

    def latency_bound_times(self, specs: Sequence[TransferSpec], shape: Hashable = None) -> list[float] | None:
        """Each replica's time alone if the batch is latency-bound (:mod:`replay.latency`), else None."""
        return self._bound(specs, shape, self._solo_end)

    def _solo_end(self, spec: TransferSpec) -> float:
        """``spec``'s time alone on idle links (cached by its form, like :meth:`_group`)."""
        ck = ("alone",) + self._form((spec,))
        t = self._spec_info.get(ck)
        if t is None:
            t = self._spec_info[ck] = solo_time(spec, self.capacity, latency_bound=0.0)
        return t

    def _demote(self, bid: int) -> None:
        """Batch ``bid`` (bulk solo) holds its links one by one from now on."""
        b = self._batches[bid]
        info = self._holds.release(bid)
        b.info = None
        b.ends = [b.t0 + d for d in info.rel_ends]  # the values SoloEnds would give, written out
        self._owned.update(dict.fromkeys(info.all_links, bid))
        b.solo_links = info.all_links

    def _start_fluid(self, bid: int, specs: Sequence[TransferSpec], fluid: list[int],
                     now: float, links: Sequence[tuple[int, ...]] | None = None) -> list[tuple[Hashable, list[float]]]:
        """Start replicas ``fluid`` of batch ``bid`` as ordinary flows (``links``: each replica's
        links, to reserve them while the fast path is on)."""
        touched: set[int] = set()
        done: list[tuple[Hashable, list[float]]] = []
        for j in fluid:
            tid = self._next_tid
            self._next_tid += 1
            tr = _Transfer((bid, j), specs[j], now, links[j] if links is not None else ())
            self._reserve(tr.links)
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
        if t0 > self.now:  # self.now = max(self.now, t0)
            self.now = t0
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
                    if not lf:
                        del self._link_flows[l]
                    touched.add(l)
                tr = self._transfers[f.tid]
                tr.pending -= 1
                if tr.pending == 0:
                    finished_tids.append(f.tid)
            elif kind == 1:
                phase_starts.append(ident)
                self._pending_start.pop(ident, None)
            else:
                b = self._batches.get(ident)
                if b is None or not b.solo or b.version != version:
                    continue
                if b.partial:
                    for gi in b.solo:
                        g = b.groups[gi]
                        for l in g.links:
                            del self._owned[l]
                        b.left -= sum(1 for j, e in zip(g.members, g.rel_ends) if e > 0)
                elif b.info is not None:  # bulk: its shape's links, its ends lazily
                    self._holds.release(ident)
                    b.solo, b.left = [], 0
                    self.solo_batches += 1
                    del self._batches[ident]
                    done.append((b.key, SoloEnds(b.t0, b.info)))
                    b.info = None
                    continue
                else:
                    deque(map(self._owned.__delitem__, b.solo_links), maxlen=0)
                    b.left -= len(b.ends)
                b.solo_links = ()
                b.solo = []
                self.solo_batches += 1
                if b.left == 0:
                    del self._batches[ident]
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
    @staticmethod
    def _links(spec: TransferSpec) -> tuple[int, ...]:
        return tuple(sorted({l for ph in spec.phases for f in ph.flows if f.nbytes > 0 for l in f.links}))

    def _group(self, specs: tuple[TransferSpec, ...], members: tuple[int, ...], links: tuple[int, ...]) -> _Group:
        """Run ``specs`` together on an idle network for their end times (cached by spec identity)."""
        k = ("g",) + tuple(map(id, specs))
        v = self._spec_info.get(k)
        if v is None or any(a is not b for a, b in zip(v[0], specs)):
            ck = ("form",) + self._form(specs)
            ends = self._spec_info.get(ck)
            if ends is None:
                scratch, done = self._idle_run(specs)
                while not done:
                    _, done = scratch.step()
                ends = self._spec_info[ck] = done[0][1]
            v = (specs, ends)
            self._spec_info[k] = v
        return _Group(members, links, v[1], specs)

    def _form(self, specs: Sequence[TransferSpec]) -> tuple[tuple, bytes]:
        """What an idle-network run of ``specs`` depends on: their phases and flows with links
        numbered in order of appearance, and those links' capacities (replicas of one collective
        on other nodes share it: the same arithmetic, link for link, so the same bits)."""
        local: dict[int, int] = {}
        form = tuple(tuple((ph.latency_s, tuple((tuple(local.setdefault(l, len(local)) for l in f.links),
                                                f.nbytes, f.max_rate_Bps) for f in ph.flows))
                           for ph in sp.phases) for sp in specs)
        return form, self.capacity[list(local)].tobytes()

    def _idle_run(self, specs: Sequence[TransferSpec]) -> tuple["FluidNetwork", list]:
        """A scratch network (no solo fast path) with ``specs`` started together at 0 on idle links,
        and what its start completed."""
        scratch = FluidNetwork(self.capacity, solo=False, latency_bound=self.latency_bound)
        return scratch, scratch.start(0, list(specs), 0.0)

    def _group_state(self, g: _Group, dt: float) -> dict[int, tuple]:
        """State of group ``g`` run alone, ``dt`` after its start: member position -> (phase,
        next phase start or nan, flows as (links, remaining, rate, cap, t_last)).

        The group's solo run is replayed once per group (by spec identity) and its state after
        every step kept: a later call takes the snapshot after the steps due by ``dt``, the same
        state a fresh replay up to ``dt`` reaches (micro-batches materialize the same groups again).
        A group of over ``_SOLO_MAX_FLOWS`` flows is replayed up to ``dt`` and marked to run as
        fluid flows from then on (its form collides: the next materialization would replay again)."""
        if sum(len(ph.flows) for sp in g.specs for ph in sp.phases) > _SOLO_MAX_FLOWS:
            g.fluid = True
            g.shape.simple = False
            scratch, _ = self._idle_run(g.specs)
            while scratch.next_time() <= dt:
                scratch.step()
            return _snapshot(scratch)
        k = ("state",) + tuple(map(id, g.specs))
        run = self._spec_info.get(k)
        if run is None or any(a is not b for a, b in zip(run[0], g.specs)):
            scratch, _ = self._idle_run(g.specs)
            run = self._spec_info[k] = (g.specs, scratch, [scratch.next_time()], [_snapshot(scratch)])
        _, scratch, times, states = run
        while times[-1] <= dt:
            scratch.step()
            times.append(scratch.next_time())
            states.append(_snapshot(scratch))
        return states[bisect.bisect_right(times, dt)]

    def _shape(self, specs: Sequence[TransferSpec], shape: Hashable = None) -> _ShapeInfo:
        """Links of a batch's replicas grouped by shared links, with each group's solo run (cached)."""
        k = id(shape) if shape is not None else tuple(map(id, specs))
        v = self._shape_info.get(k)
        if v is None:
            links = [self._links(s) for s in specs]
            parent = list(range(len(specs)))

            def find(x: int) -> int:
                while parent[x] != x:
                    parent[x] = parent[parent[x]]
                    x = parent[x]
                return x

            first: dict[int, int] = {}
            for j, ls in enumerate(links):
                for l in ls:
                    o = first.setdefault(l, j)
                    if o != j:
                        parent[find(j)] = find(o)
            comps: dict[int, list[int]] = {}
            for j in range(len(specs)):
                comps.setdefault(find(j), []).append(j)
            groups = []
            for members in comps.values():
                glinks = tuple(sorted({l for j in members for l in links[j]}))
                groups.append(self._group(tuple(specs[j] for j in members), tuple(members), glinks))
            v = _ShapeInfo(links, groups, len(specs), shape)
            self._holds.register(v)
            self._shape_info[k] = v
        return v

    def _transfer_done(self, tr: _Transfer, t: float, done: list) -> None:
        bid, j = tr.key
        b = self._batches[bid]
        if tr.mirror is None:
            b.ends[j] = t
            b.left -= 1
        else:  # lane 0 of a mirror: every lane ends now
            b.ends = [t] * len(b.ends)
            b.left -= len(b.ends)
        if b.left == 0:
            del self._batches[bid]
            done.append((b.key, b.ends))

    def _materialize(self, bid: int, now: float, hit: set[int]) -> None:
        """Turn the solo groups of batch ``bid`` that use a link in ``hit`` into fluid flows,
        replayed (alone) up to ``now``; the others stay solo."""
        b = self._batches[bid]
        owned = self._owned
        if not b.partial:  # bulk-started: switch to group-by-group link ownership
            b.partial = True
        victims = [gi for gi in b.solo if not hit.isdisjoint(b.groups[gi].links)]
        b.solo = [gi for gi in b.solo if hit.isdisjoint(b.groups[gi].links)]
        touched: set[int] = set()
        dt = now - b.t0
        for gi in victims:
            g = b.groups[gi]
            for l in g.links:
                del owned[l]
            state = self._group_state(g, dt)
            for pos, j in enumerate(g.members):
                if g.rel_ends[pos] <= 0:
                    continue  # took no time: already counted done
                if b.ends[j] <= now or pos not in state:
                    b.left -= 1  # already complete by now; its end time stands
                    continue
                b.ends[j] = math.nan
                phase, t_start, flows = state[pos]
                tid = self._next_tid
                self._next_tid += 1
                tr = _Transfer((bid, j), b.specs[j], b.t0, self._links(b.specs[j]))
                self._reserve(tr.links)
                tr.phase, tr.pending = phase, len(flows)
                self._transfers[tid] = tr
                if t_start == t_start:  # a phase start is pending
                    self._push(b.t0 + t_start, 1, tid, 0)
                    self._pending_start[tid] = b.t0 + t_start
                for links, rem, rate, cap, t_last in flows:
                    self._add_flow(tid, links, rem - rate * (dt - t_last), cap, now, touched)
        if b.left == 0:
            raise AssertionError("materialized a batch that had completed")
        if not b.solo:
            b.version += 1  # its solo-end event is void
        if touched:
            self._recompute(touched, now)

    def _reserve(self, links: tuple[int, ...]) -> None:
        res = self._reserved
        for l in links:
            res[l] = res.get(l, 0) + 1

    def _release(self, links: tuple[int, ...]) -> None:
        res = self._reserved
        for l in links:
            n = res[l] - 1
            if n:
                res[l] = n
            else:
                del res[l]

    def _add_flow(self, tid: int, links: tuple[int, ...], nbytes: float, cap: float, now: float,
                  touched: set[int]) -> None:
        fid = self._next_fid
        self._next_fid += 1
        self._flows[fid] = _Flow(links, nbytes, cap, tid, now)
        self._new[fid] = None
        link_flows = self._link_flows
        for l in links:
            on = link_flows.get(l)
            if on is None:
                link_flows[l] = {fid: None}
            else:
                on[fid] = None
        touched.update(links)

    def _advance_phase(self, tid: int, tr: _Transfer, now: float, touched: set[int]) -> bool:
        """Move ``tr`` to its next phase(s); True when the transfer is complete."""
        phases = tr.spec.phases
        while True:
            tr.phase += 1
            if tr.phase >= len(phases):
                del self._transfers[tid]
                if tr.links:
                    self._release(tr.links)
                if tr.mirror is not None:
                    leave(self, tid, tr)
                return True
            ph = phases[tr.phase]
            if ph.latency_s > 0:
                self._push(now + ph.latency_s, 1, tid, 0)
                self._pending_start[tid] = now + ph.latency_s
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

    def _solve(self, touched: set[int]) -> tuple[list[int], list[float], list[int]]:
        """The flows whose rate may have changed, with their rates and pins (:func:`replay.maxmin.refill`)."""
        return refill(self._flows, self._link_flows, self.capacity, touched, self._new)

    def _recompute(self, touched: set[int], now: float) -> None:
        """Re-solve the rates after flows on ``touched`` links started or finished (see
        :mod:`replay.maxmin`); a flow whose rate changed is brought up to ``now`` at its old rate and
        gets a new finish event, the others keep theirs."""
        flows, new = self._flows, self._new
        fids, rates, pins = self._solve(touched)
        if not fids:
            new.clear()
            return
        self.recomputes += 1
        heap, seq, push = self._heap, self._seq, heapq.heappush
        for fid, r, pin in zip(fids, rates, pins):
            f = flows[fid]
            f.pin = pin
            if r == f.rate and fid not in new:
                continue
            if f.rate > 0:  # bring progress up to now at the old rate
                f.remaining -= f.rate * (now - f.t_last)
            f.t_last = now
            f.rate = r
            v = f.version = f.version + 1
            rem = f.remaining if f.remaining > 0 else 0.0
            push(heap, (now + rem / r, seq, 0, fid, v))
            seq += 1
        self._seq = seq
        new.clear()


def _snapshot(net: FluidNetwork) -> dict[int, tuple]:
    """Per transfer of ``net`` (by replica position): (phase, next phase start or nan, flows)."""
    flows: dict[int, list] = {}
    for f in net._flows.values():
        flows.setdefault(f.tid, []).append((f.links, f.remaining, f.rate, f.cap, f.t_last))
    return {tr.key[1]: (tr.phase, net._pending_start.get(tid, math.nan), tuple(flows.get(tid, ())))
            for tid, tr in net._transfers.items()}


def solo_time(spec: TransferSpec, capacity: Sequence[float], *, latency_bound: float | None = None) -> float:
    """Time ``spec`` takes alone on an idle network (its uncontended duration)."""
    net = FluidNetwork(capacity, solo=False, latency_bound=latency_bound)
    done = net.start(0, [spec], 0.0)
    t = 0.0
    while not done:
        t, done = net.step()
    return t
