"""Mirrored lanes: replicas of colliding batches that see the same network state, simulated once.

:class:`replay.flows.FluidNetwork` runs a batch (the replicas of one class-level transfer) solo
while its links are free. When batches collide, their colliding replicas run as fluid flows.
In a pipeline that is the rule, not the exception: in Megatron's interleaved schedule one
exchange sends to the previous *and* the next stage at once, so replica r of one class-level p2p
shares a GPU's NIC link with replica r of another, and every data-parallel replica meets the same
collision. A *mirror* runs such a collision for one replica (lane 0) as ordinary fluid flows and
stands for the others (lanes 1 .. n-1), which it only holds the links of.

Lanes. The member batches of a mirror all have ``n`` replicas, and lane r is replica r of every
member. A set of batch shapes may share a mirror when (checked once per shape and per pair of
shapes, cached):

- each shape is *uniform*: every replica is its own group (no link shared between two replicas)
  and is replica 0 with its links renamed, over links of the same capacities;
- each pair of shapes is *aligned*: replica r of one shares links only with replica r of the
  other, and at the same positions for every r.

Then the renaming of lane 0's links onto lane r's is one bijection over every member, the lanes
are pairwise disjoint and each is lane 0 renamed. A batch joins a mirror at its start, all its
replicas at once; the mirror's links (every lane's) collide with anything else that starts on
them, which then joins the mirror too (if the shapes allow) or *unfolds* it: lane 0's state is
copied onto every lane as real flows, and the network goes on as without mirrors.

Exact. The rates of a flow depend only on the flows it shares links with, transitively
(:mod:`replay.maxmin`: exact ties, so disjoint parts of the network never influence each other's
filling), and every lane starts the same batches at the same instants from the same states, so
every lane's flows have lane 0's rates, remaining bytes and finish times bit for bit, at the same
network instants: a mirrored replica ends when lane 0's does. Batches that end at one instant are
reported in the order of their lane-0 transfers; without the mirror, in the order of their last
lanes, the same order, since each lane orders its events as lane 0 does (an unfolded copy's event
takes the sequence number of lane 0's). The fast engine gives the same results with and without
mirrors (tested, bit for bit, on random lanes and an interleaved pipeline).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any, Sequence

from .transfers import TransferSpec, _Flow, _ShapeInfo, _Transfer

FluidNetwork = Any
"""The network these functions work on, :class:`replay.flows.FluidNetwork` (named, not imported:
flows imports this module)."""

__all__ = ["Mirror", "Lanes"]


class Mirror:
    """Batches whose replicas run lane by lane, lane 0 as real flows (see the module docstring)."""

    __slots__ = ("n", "reps")

    def __init__(self, n: int):
        self.n = n
        self.reps: dict[int, tuple[int, _ShapeInfo, _Form]] = {}
        """Transfer id of each member's lane-0 transfer in flight -> (batch id, batch shape, its links
        by position)."""


class _Form:
    """A uniform shape's links by position: ``loc[r][p]`` is replica r's p-th link (in the order
    its spec names them); ``live`` holds the positions of links that carry bytes."""

    __slots__ = ("loc", "live", "cols", "links")

    def __init__(self, loc: list[tuple[int, ...]], live: tuple[int, ...]):
        self.loc = loc
        self.live = live
        self.cols = {p: tuple(ls[p] for ls in loc) for p in live}
        """Position -> that link in every lane (lane 0 first)."""
        self.links = tuple(l for col in self.cols.values() for l in col)
        """Every lane's links that carry bytes."""


class Lanes:
    """Which batch shapes may share a mirror: uniform shapes, aligned pairs (cached)."""

    def __init__(self, capacity) -> None:
        self.capacity = capacity
        self._forms: dict[int, _Form | None] = {}
        self._aligned: dict[tuple[int, int], bool] = {}

    def form(self, info: _ShapeInfo, specs: Sequence[TransferSpec]) -> _Form | None:
        """``info``'s links by position if it is uniform, else None (cached per shape)."""
        k = id(info)
        if k in self._forms:
            return self._forms[k]
        v = self._forms[k] = self._uniform(info, specs)
        return v

    def _uniform(self, info: _ShapeInfo, specs: Sequence[TransferSpec]) -> _Form | None:
        n = len(specs)
        if n < 2 or len(info.groups) != n:
            return None  # replicas sharing links: lanes would not be disjoint
        forms, locs = [], []
        for sp in specs:
            local: dict[int, int] = {}
            forms.append(tuple((ph.latency_s, tuple((tuple(local.setdefault(l, len(local)) for l in f.links),
                                                     f.nbytes, f.max_rate_Bps) for f in ph.flows))
                               for ph in sp.phases))
            locs.append(tuple(local))
        caps = self.capacity[list(locs[0])].tobytes()
        if any(f != forms[0] for f in forms) or any(self.capacity[list(ls)].tobytes() != caps for ls in locs):
            return None
        live0 = set(info.links[0])
        return _Form(locs, tuple(p for p, l in enumerate(locs[0]) if l in live0))

    def aligned(self, a: _ShapeInfo, fa: _Form, b: _ShapeInfo, fb: _Form) -> bool:
        """Replica r of ``a`` shares links only with replica r of ``b``, at the same positions for every r."""
        k = (id(a), id(b))
        v = self._aligned.get(k)
        if v is None:
            at = {l: (r, p) for r, ls in enumerate(fa.loc) for p, l in enumerate(ls)}
            pattern = None
            v = True
            for r, ls in enumerate(fb.loc):
                pat = []
                for q, l in enumerate(ls):
                    o = at.get(l)
                    if o is not None:
                        if o[0] != r:
                            v = False
                            break
                        pat.append((o[1], q))
                if not v:
                    break
                if pattern is None:
                    pattern = pat
                elif pat != pattern:
                    v = False
                    break
            self._aligned[k] = self._aligned[(id(b), id(a))] = v
        return v


def try_join(net: FluidNetwork, bid: int, info: _ShapeInfo, specs: Sequence[TransferSpec],
             now: float, allowed: bool = True) -> list | None:
    """Start batch ``bid`` in a mirror with what it collides with (what it returns: see
    :meth:`FluidNetwork.start`); None when it collides with nothing, or the shapes do not allow
    it (or ``allowed`` is false): the mirrors it touches are then unfolded."""
    link_set = info.link_set
    mirror_of, owned, reserved = net._mirror_of, net._owned, net._reserved
    hit_m = mirror_of.keys() & link_set if mirror_of else set()
    hit_o = owned.keys() & link_set if owned else set()
    if not hit_m and not hit_o:
        return None
    n = len(specs)
    # What lane 0 hits; aligned shapes hit the same in every lane, so n times as many links in all:
    # more means a lane meets something lane 0 does not (checked below, with the shapes).
    hit0_m = [l for l in info.links[0] if l in mirror_of]
    hit0_o = [l for l in info.links[0] if l in owned]
    mirrors = sorted({mirror_of[l] for l in hit0_m}, key=_first)
    owners = sorted({owned[l] for l in hit0_o})
    ok = (allowed and n > 1 and bool(hit0_m or hit0_o) and len(hit_m) == n * len(hit0_m)
          and len(hit_o) == n * len(hit0_o)
          and not (reserved and not (reserved.keys() & link_set) <= hit_m))  # no plain fluid transfer hit
    sigma: list[tuple[_ShapeInfo, Sequence[TransferSpec]]] = []
    if ok:
        for m in mirrors:
            if m.n != n:
                ok = False
            sigma.extend((i, net._batches[b].specs) for b, i, _ in m.reps.values())
        for ob in owners:
            b = net._batches[ob]
            g0 = b.groups[0].shape if b.groups else None
            if g0 is None or len(b.specs) != n or len(b.solo) != len(b.groups):
                ok = False
                break
            sigma.append((g0, b.specs))
        sigma.append((info, specs))
    lanes = net._lanes
    if ok:
        forms = [lanes.form(i, sp) for i, sp in sigma]
        ok = all(f is not None for f in forms) and all(
            lanes.aligned(sigma[x][0], forms[x], sigma[y][0], forms[y])
            for x in range(len(sigma)) for y in range(x + 1, len(sigma)))
    if not ok:
        for m in sorted({mirror_of[l] for l in hit_m}, key=_first):
            unfold(net, m)
        return None
    m = _merge(net, mirrors, n)
    net.mirrored_batches += 1
    for ob in owners:
        _join_solo(net, m, ob, now)
    tid = net._next_tid
    net._next_tid += 1
    tr = _Transfer((bid, 0), specs[0], now, info.links[0])
    tr.mirror = m
    net._reserve(tr.links)
    net._transfers[tid] = tr
    _hold(net, m, tid, bid, info, specs)
    touched: set[int] = set()
    done: list = []
    if net._advance_phase(tid, tr, now, touched):
        net._transfer_done(tr, now, done)
    if touched:
        net._recompute(touched, now)
    return done


def _first(m: Mirror) -> int:
    return min(m.reps)


def _merge(net: FluidNetwork, mirrors: list[Mirror], n: int) -> Mirror:
    """One mirror standing for ``mirrors`` (their lanes are disjoint: merging them is renaming)."""
    if not mirrors:
        return Mirror(n)
    m = mirrors[0]
    for o in mirrors[1:]:
        for tid, rep in o.reps.items():
            net._transfers[tid].mirror = m
            m.reps[tid] = rep
            net._mirror_of.update(dict.fromkeys(rep[2].links, m))
    return m


def _hold(net: FluidNetwork, m: Mirror, tid: int, bid: int, info: _ShapeInfo, specs) -> None:
    """Transfer ``tid`` (lane 0 of batch ``bid``) joins ``m``: every lane's links become the mirror's."""
    form = net._lanes.form(info, specs)
    m.reps[tid] = (bid, info, form)
    net._mirror_of.update(dict.fromkeys(form.links, m))


def _join_solo(net: FluidNetwork, m: Mirror, ob: int, now: float) -> None:
    """Solo batch ``ob`` (every replica its own solo group) joins ``m``: lane 0 is replayed alone up
    to ``now`` and continues as fluid flows, the other lanes follow it (what
    :meth:`FluidNetwork._materialize` does to every replica)."""
    b = net._batches[ob]
    owned = net._owned
    for gi in b.solo:
        deque(map(owned.__delitem__, b.groups[gi].links), maxlen=0)
    b.partial = True
    b.solo = []
    b.version += 1  # its solo-end event is void
    n = len(b.specs)
    g = next(g for g in b.groups if g.members[0] == 0)
    if g.rel_ends[0] <= 0:
        return  # took no time: already counted done
    dt = now - b.t0
    state = net._group_state(g, dt)
    if b.ends[0] <= now or 0 not in state:
        b.left -= n  # already complete by now; its end times stand
        if b.left == 0:
            raise AssertionError("joined a batch that had completed")
        return
    b.ends = [math.nan] * n
    phase, t_start, flows = state[0]
    tid = net._next_tid
    net._next_tid += 1
    tr = _Transfer((ob, 0), b.specs[0], b.t0, net._links(b.specs[0]))
    tr.mirror = m
    net._reserve(tr.links)
    tr.phase, tr.pending = phase, len(flows)
    net._transfers[tid] = tr
    _hold(net, m, tid, ob, g.shape, b.specs)
    if t_start == t_start:  # a phase start is pending
        net._push(b.t0 + t_start, 1, tid, 0)
        net._pending_start[tid] = b.t0 + t_start
    touched: set[int] = set()
    for links, rem, rate, cap, t_last in flows:
        net._add_flow(tid, links, rem - rate * (dt - t_last), cap, now, touched)
    if touched:
        net._recompute(touched, now)


def leave(net: FluidNetwork, tid: int, tr: _Transfer) -> None:
    """Lane-0 transfer ``tid`` completed (its links released): free the lanes' links no member uses."""
    m = tr.mirror
    _, _, form = m.reps.pop(tid)
    reserved, mirror_of = net._reserved, net._mirror_of
    for col in form.cols.values():
        # Lane r uses a link at a position iff lane 0 does (one renaming for every member).
        if col[0] not in reserved and col[0] in mirror_of:
            deque(map(mirror_of.__delitem__, col), maxlen=0)


def unfold(net: FluidNetwork, m: Mirror) -> None:
    """Copy lane 0's transfers and flows onto every lane as real ones; ``m`` is gone."""
    rename: list[dict[int, int]] = [{} for _ in range(m.n)]
    members = []
    for tid, (bid, info, form) in m.reps.items():
        specs = net._batches[bid].specs
        for r in range(1, m.n):
            rename[r].update(zip(form.loc[0], form.loc[r]))
        members.append((tid, bid, info, specs, form))
    mirror_of, flows, link_flows = net._mirror_of, net._flows, net._link_flows
    # Each copy's event takes the sequence number of lane 0's, so events of one instant keep the
    # order they would have had without the mirror (lane 0, then its copies, lane by lane).
    seq = {(kind, ident): q for t, q, kind, ident, version in net._heap
           if (kind == 0 and ident in flows and flows[ident].version == version)
           or (kind == 1 and net._pending_start.get(ident) == t)}
    heap = net._heap
    for tid, bid, info, specs, form in members:
        tr = net._transfers[tid]
        tr.mirror = None
        for col in form.cols.values():
            for l in col:
                mirror_of.pop(l, None)
        mine = sorted({f for l in info.links[0] for f in link_flows.get(l, ()) if flows[f].tid == tid})
        t_start = net._pending_start.get(tid)
        for r in range(1, m.n):
            ren = rename[r]
            ctid = net._next_tid
            net._next_tid += 1
            c = _Transfer((bid, r), specs[r], tr.t0, info.links[r])
            c.phase, c.pending = tr.phase, tr.pending
            net._reserve(c.links)
            net._transfers[ctid] = c
            if t_start is not None:
                heapq.heappush(heap, (t_start, seq[1, tid], 1, ctid, 0))
                net._pending_start[ctid] = t_start
            for fid in mine:
                f = flows[fid]
                cf = _Flow(tuple(ren[l] for l in f.links), 0.0, f.cap, ctid, f.t_last)
                cf.remaining, cf.rate, cf.pin = f.remaining, f.rate, ren[f.pin] if f.pin >= 0 else -1
                nf = net._next_fid
                net._next_fid += 1
                flows[nf] = cf
                for l in cf.links:
                    on = link_flows.get(l)
                    if on is None:
                        link_flows[l] = {nf: None}
                    else:
                        on[nf] = None
                rem = f.remaining if f.remaining > 0 else 0.0
                heapq.heappush(heap, (f.t_last + rem / f.rate, seq[0, fid], 0, nf, cf.version))
    m.reps.clear()
