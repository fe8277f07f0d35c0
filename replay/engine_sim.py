"""One pass of the fast engine: the class-level event simulation behind :func:`replay.engine.run_fast`.

:mod:`replay.engine` says what is simulated (one representative per class of equivalent ranks,
every replica of every transfer on the network) and decides the classes and the symmetry mode;
a :class:`_Sim` runs the classes' programs once against the fluid network and returns a
:class:`FastRun`, or raises :class:`_Asymmetric` (``exact`` mode) when replicas of one class-level
transfer end at different times, naming how to split the classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import numpy as np

from heterosim.errors import TraceMismatchError
from heterosim.trace.vocab import P2P

from .events import NETWORK, Ev, EventQueue
from .expand import (CommInstance, RankTimes, RoleSkeleton, WaitRecord, Workload, _family, build_skeleton,
                     busy_change, span_step)
from .fastrun import FastRun
from .flows import FluidNetwork, solo_time
from .holds import end_span
from .periodic import Skipper

__all__ = ["FastRun"]

_SYM_TOL = 1e-10
"""Replicas of one class-level transfer count as simultaneous within this relative spread."""


@dataclass(slots=True, kw_only=True)
class _Shape:
    """One kind of comm op of one class: its replicas, as every micro-batch meets them again."""

    ident: int
    """Interned (family, member classes) or (family, src class/pos, dst class/pos)."""
    counter: tuple
    """Sequence counter key (per group, or per p2p pair and direction)."""
    insts: list[CommInstance]
    replica_ranks: list[tuple[int, ...]]
    rep_inst: CommInstance
    need: int
    """Distinct member classes that must issue it."""
    trivial: bool
    """One-rank group: takes no time."""
    inter_node: bool
    specs: list | None = None
    solo: list[float] | None = None
    folded: Any = None
    """Its :class:`replay.fold.FoldedBatch` (False: it does not fold; None: not asked yet)."""


class _Unfold(Exception):
    """A transfer that does not fold started while folded ones were in flight: the run stops, to
    restart without the fold (:mod:`replay.fold`)."""


class _Asymmetric(Exception):
    """Replicas of one class-level transfer ended at different times: the run stops, to restart
    with ``class_of`` (the classes split by when their replicas ended)."""

    def __init__(self, class_of: list[int]):
        super().__init__("replicas finished at different times")
        self.class_of = class_of


class _Class:
    __slots__ = ("rep", "ranks", "sk", "spans", "pc", "tc", "blocked", "end", "start", "t_at",
                 "stream_groups", "preds", "waits", "finish", "counters", "keys", "compute", "tail",
                 "work", "busy", "ver", "t_reach", "shape_by_sig")

    def __init__(self, rep: int, ranks: tuple[int, ...], sk: RoleSkeleton, gpu: str):
        n = len(sk)
        self.rep = rep
        self.ranks = ranks
        self.sk = sk
        self.spans = sk.spans[gpu].tolist()
        self.compute = float(sum(self.spans))
        self.pc = 0
        self.tc = 0.0
        self.blocked = False
        self.end = [math.nan] * n
        self.start = [math.nan] * n
        self.t_at = [math.nan] * n
        self.stream_groups: dict[str, tuple[int, list[int], list[int]]] = {}
        self.preds: dict[int, list[int]] = {}
        self.waits: list[WaitRecord] = []
        self.finish = 0.0
        self.counters: dict = {}
        self.keys: dict[int, tuple] = {}
        self.tail = False
        # overlap slowdown: work (full-speed seconds) left in the span in progress (None: not
        # started), comm ops in flight, version and time of the pending end-of-span event
        self.work: float | None = None
        self.busy = 0
        self.ver = 0
        self.t_reach = math.inf
        self.shape_by_sig: dict[int, _Shape] = {}  # point signature -> its shape (see _shape)


class _Sim:
    def __init__(self, w: Workload, class_of: list[int], skeletons: dict[int, RoleSkeleton], xp: Any,
                 exact: bool = True, refine: Callable[[list[list[int]]], list[int] | None] | None = None,
                 periodic: bool = True, fold: bool = True):
        self.w = w
        self.fold = w._cache.get("fold") if fold and w.link_sharing else None
        """The network's quotient by a node shift (:mod:`replay.fold`), or None."""
        self.folded = False
        """The network holds folded transfers (decided whenever it is idle)."""
        self.folded_transfers = 0
        self.exact = exact
        self.refine = refine
        self.asymmetric = 0
        self.max_spread = 0.0
        self.switched_at = math.nan
        self.trace = trace = w.trace
        self.class_of = class_of
        members: dict[int, list[int]] = {}
        for r, c in enumerate(class_of):
            members.setdefault(c, []).append(r)
        role_of = {r: role.id for role in trace.roles for r in role.ranks}
        gpus_by_role: dict[int, list[str]] = {}
        for c, rs in members.items():
            gpus_by_role.setdefault(role_of[rs[0]], []).append(w.gpu_type[rs[0]])
        for rid, gpus in gpus_by_role.items():
            sk = skeletons.get(rid)
            if sk is None or any(g not in sk.spans for g in gpus):
                skeletons[rid] = build_skeleton(w, rid, sorted(set(gpus) | set(sk.spans if sk else ())), xp)
        self.skeletons = skeletons
        self.classes = [
            _Class(rs[0], tuple(rs), skeletons[role_of[rs[0]]], w.gpu_type[rs[0]])
            for c, rs in sorted(members.items())
        ]
        # (family, member classes) -> groups of that family with those member classes
        self.replica_groups: dict[tuple, list[str]] = {}
        self.member_classes: dict[str, tuple[int, ...]] = {}
        for g, info in trace.groups.items():
            mc = tuple(sorted(class_of[r] for r in info.ranks))
            self.member_classes[g] = mc
            self.replica_groups.setdefault((_family(trace, g), mc), []).append(g)
        self.events = EventQueue()
        self.arrivals: dict[tuple, list[tuple[int, int]]] = {}
        self._matched: set[tuple[int, int, int, int]] = set()
        """(class, signature) pairs already checked to match (:meth:`_check`)."""
        self.need: dict[tuple, int] = {}
        self.inst: dict[tuple, tuple[list[tuple[int, int]], float, _Shape]] = {}
        """Started class-level transfers: key -> (members as (class, point), start time, shape)."""
        self._shapes: dict[tuple, _Shape] = {}
        self._interned: dict[Hashable, int] = {}
        self.stream_waiters: dict[tuple[int, int], list[tuple[int, float]]] = {}
        self.net = FluidNetwork(w.capacity_Bps)
        self.blocker: list[dict[int, tuple[int, int]]] = [{} for _ in self.classes]
        self.slow = w.overlap_slowdown
        self.busy_rate = 1.0 - w.overlap_slowdown
        self.in_flight: set[tuple] = set()
        if self.slow:
            for cl in self.classes:
                cl.compute = 0.0  # accumulated as the spans run (stretched)
        self.skipper = Skipper(self) if periodic and w.link_sharing else None
        """Advances a repeating steady 1F1B phase by whole periods (:mod:`replay.periodic`)."""

    # -- keys ---------------------------------------------------------------------------------
    def _shape(self, ci: int, p: int) -> "_Shape":
        """What point p of class ci is, network-wise (cached: every micro-batch reuses it)."""
        cl = self.classes[ci]
        sk = cl.sk
        ck = (cl.sk.role, ci, sk.group[p], sk.collective[p], sk.nbytes[p], sk.dtype[p], sk.peer[p])
        sh = self._shapes.get(ck)
        if sh is None:
            sh = self._new_shape(ci, p)
            self._shapes[ck] = sh
        return sh

    def _intern(self, k: Hashable) -> int:
        v = self._interned.get(k)
        if v is None:
            v = self._interned[k] = len(self._interned)
        return v

    def _new_shape(self, ci: int, p: int) -> "_Shape":
        cl = self.classes[ci]
        sk = cl.sk
        trace = self.trace
        rep = cl.rep
        g = trace.group_for(sk.group[p], rep)
        info = trace.groups[g]
        fam = _family(trace, g)
        coll = sk.collective[p]
        nbytes, dtype = sk.nbytes[p], sk.dtype[p]
        if coll in P2P:
            peer = sk.peer[p]
            if not 0 <= peer < len(info.ranks):
                raise TraceMismatchError(
                    f"rank {rep}: {coll} op {sk.op_id[p]} ({sk.name[p]}) on group {g} names peer "
                    f"{peer}, but the group has {len(info.ranks)} ranks: the p2p has no partner")
            me = info.ranks.index(rep)
            send = coll == "send"
            src_pos, dst_pos = (me, peer) if send else (peer, me)
            src, dst = info.ranks[src_pos], info.ranks[dst_pos]
            cs, cd = self.class_of[src], self.class_of[dst]
            ident = self._intern(("p", fam, cs, src_pos, cd, dst_pos))
            pairs = [(trace.groups[h].ranks[src_pos], trace.groups[h].ranks[dst_pos])
                     for h in self.replica_groups[(fam, self.member_classes[g])]
                     if self.class_of[trace.groups[h].ranks[src_pos]] == cs]
            insts = [CommInstance(collective="send", nbytes=nbytes, dtype=dtype, ranks=pair, group=g, dim=info.dim)
                     for pair in pairs]
            return _Shape(ident=ident, counter=(ident, send), insts=insts, replica_ranks=pairs,
                          rep_inst=next(i for i in insts if rep in i.ranks), need=2,
                          trivial=False, inter_node=self.w.crosses_nodes((src, dst)))
        mc = self.member_classes[g]
        ident = self._intern(("c", fam, mc))
        groups = self.replica_groups[(fam, mc)]
        insts = [CommInstance(collective=coll, nbytes=nbytes, dtype=dtype, ranks=trace.groups[h].ranks,
                              group=h, dim=trace.groups[h].dim) for h in groups]
        rep_inst = next(i for i in insts if rep in i.ranks)
        return _Shape(ident=ident, counter=(ident, None), insts=insts, replica_ranks=[i.ranks for i in insts],
                      rep_inst=rep_inst, need=len(set(mc)), trivial=len(set(info.ranks)) <= 1,
                      inter_node=self.w.crosses_nodes(info.ranks))

    # -- event handling -------------------------------------------------------------------------
    def push_ready(self, t: float, ci: int, p: int) -> None:
        self.events.push(t, Ev.READY, ci, p)

    def issue(self, ci: int, p: int, issue_t: float) -> None:
        cl = self.classes[ci]
        sk = cl.sk
        stream = sk.stream[p]
        cg = sk.coalesced[p]
        cur = cl.stream_groups.get(stream)
        if cur is None:
            preds: list[int] = []
            cl.stream_groups[stream] = (cg, [p], [])
        elif cur[0] == cg:
            preds = cur[2]
            cur[1].append(p)
        else:
            preds = cur[1]
            cl.stream_groups[stream] = (cg, [p], cur[1])
        cl.preds[p] = preds
        sig = sk.sig[p]
        sh = cl.shape_by_sig.get(sig)
        if sh is None:
            sh = cl.shape_by_sig[sig] = self._shape(ci, p)
        counters = cl.counters
        k = counters.get(sh.counter, 0)
        counters[sh.counter] = k + 1
        cl.keys[p] = ((sh.ident, k), sh)
        if not preds:
            self.events.push(issue_t, Ev.READY, ci, p)
            return
        self.try_ready(ci, p, issue_t)

    def try_ready(self, ci: int, p: int, issue_t: float) -> None:
        cl = self.classes[ci]
        end = cl.end
        t = issue_t
        for q in cl.preds[p]:
            e = end[q]
            if e != e:  # nan: predecessor still running
                self.stream_waiters.setdefault((ci, q), []).append((p, issue_t))
                return
            if e > t:
                t = e
        self.push_ready(t, ci, p)

    def _run_span(self, ci: int, cl: _Class, p: int) -> bool:
        """Slowdown mode: start (or finish) span ``p``; True while it runs."""
        return self._push_reach(span_step(cl, cl.spans[p], self.busy_rate), ci)

    def _push_reach(self, t: float | None, ci: int) -> bool:
        if t is None:
            return False
        self.events.push(t, Ev.REACH, ci, self.classes[ci].ver)
        return True

    def _reached(self, t: float, ci: int, ver: int) -> None:
        cl = self.classes[ci]
        if ver != cl.ver:
            return  # re-planned: a later event replaces it
        cl.compute += t - cl.tc
        cl.tc = t
        cl.work = 0.0
        self.advance(ci)

    def advance(self, ci: int) -> None:
        """Run class ci's compute stream until it blocks at a wait (or, with overlap slowdown, until
        a span is in progress: it continues at its end event)."""
        if self.slow:
            self._advance_slow(ci)
            return
        cl = self.classes[ci]
        sk = cl.sk
        kinds, target = sk.kind, sk.target
        spans, end, t_at = cl.spans, cl.end, cl.t_at
        n = len(kinds)
        pc, tc = cl.pc, cl.tc
        while pc < n:
            tc += spans[pc]
            t_at[pc] = tc
            if kinds[pc] == "wait":
                tgt = target[pc]
                te = end[tgt]
                if te != te:  # nan: still running; complete() resumes after this wait
                    cl.pc, cl.tc, cl.blocked = pc, tc, True
                    return
                if te > tc:
                    self._record_wait(cl, tgt, tc, te)
                    tc = te
            else:
                self.issue(ci, pc, tc)
            pc += 1
        cl.pc, cl.tc = pc, tc
        if not cl.tail:
            cl.tc += spans[n]
            cl.tail = True
        cl.finish = max(cl.finish, cl.tc)

    def _advance_slow(self, ci: int) -> None:
        """:meth:`advance` with overlap slowdown: spans end at events, a blocked wait resumes without
        adding its span again."""
        cl = self.classes[ci]
        sk = cl.sk
        kinds = sk.kind
        n = len(kinds)
        while cl.pc < n:
            p = cl.pc
            if not cl.blocked:
                if self._run_span(ci, cl, p):
                    return
                cl.t_at[p] = cl.tc
            if kinds[p] == "wait":
                tgt = sk.target[p]
                te = cl.end[tgt]
                if te != te:
                    cl.blocked = True
                    return
                cl.blocked = False
                if te > cl.tc:
                    self._record_wait(cl, tgt, cl.tc, te)
                    cl.tc = te
            else:
                self.issue(ci, p, cl.tc)
            cl.pc += 1
        if not cl.tail:
            if self._run_span(ci, cl, n):
                return
            cl.tail = True
        cl.finish = max(cl.finish, cl.tc)

    def _record_wait(self, cl: _Class, tgt: int, t_block: float, t_end: float) -> None:
        sh = cl.keys[tgt][1]
        cl.waits.append(WaitRecord(t_block=t_block, t_end=t_end, t_start=cl.start[tgt], dim=sh.rep_inst.dim,
                                   inter_node=sh.inter_node, point=tgt))

    def arrive(self, t: float, ci: int, p: int) -> None:
        cl = self.classes[ci]
        key, sh = cl.keys[p]
        if sh.need == 1:
            got = [(ci, p)]
        else:
            got = self.arrivals.get(key)
            if got is None:
                self.arrivals[key] = [(ci, p)]
                return
            c0, p0 = got[0]
            pair = (c0, self.classes[c0].sk.sig[p0], ci, cl.sk.sig[p])
            if pair not in self._matched:  # what _check reads is fixed by class and signature
                self._check(got[0], (ci, p), key)
                self._matched.add(pair)
            got.append((ci, p))
            if len(got) < sh.need:
                return
            del self.arrivals[key]
        self.inst[key] = (got, t, sh)
        if sh.trivial:
            self.complete(key, t)
            return
        if self.slow:
            self.in_flight.add(key)
            for cj, _ in got:
                self._push_reach(busy_change(self.classes[cj], t, +1, self.busy_rate), cj)
        if sh.specs is None:
            sh.specs = [self.w.transfer_spec(inst) for inst in sh.insts]
        if self.w.link_sharing:
            specs, shape = sh.specs, sh
            if self.fold is not None:
                fb = sh.folded
                if fb is None:
                    fb = sh.folded = self.fold.batch(sh.specs, sh.replica_ranks) or False
                if fb or self.net.latency_bound_times(specs, shape) is None:
                    # (a latency-bound batch is priced alone, on no link: it runs unfolded beside
                    # folded transfers; replay.latency)
                    if self.net.idle():
                        self.folded = bool(fb)
                    if self.folded:
                        if not fb:
                            raise _Unfold()
                        specs, shape = fb.specs, fb
                        self.folded_transfers += 1
            for k, ends in self.net.start(key, specs, t, shape=shape):
                self.batch_done(k, ends)
        else:
            if sh.solo is None:
                sh.solo = [self._solo(inst) for inst in sh.insts]
            ends = [t + d for d in sh.solo]
            self.events.push(max(ends), Ev.TIMER, key, ends)

    def _solo(self, inst: CommInstance) -> float:
        ck = ("solo", inst)
        v = self.w._cache.get(ck)
        if v is None:
            v = solo_time(self.w.transfer_spec(inst), self.w.capacity_Bps)
            self.w._cache[ck] = v
        return v

    def batch_done(self, key: tuple, ends: list[float]) -> None:
        """All replicas of a class-level transfer ended (at ``ends``): they must agree."""
        lo, hi = end_span(ends)
        ahi = abs(hi)
        if hi - lo > _SYM_TOL * (1e-30 if 1e-30 > ahi else ahi):  # max(|hi|, 1e-30)
            if self.exact:
                ends = list(ends)
                order = sorted(set(ends))
                groups: list[list[int]] = [[] for _ in order]
                sh = self.inst[key][2]
                reps = sh.replica_ranks if len(ends) == len(sh.replica_ranks) else sh.folded.replica_ranks
                for j, e in enumerate(ends):
                    groups[order.index(e)].extend(reps[j])
                split = self.refine(groups) if self.refine is not None else None
                if split is not None:
                    raise _Asymmetric(split)
                self.exact = False  # past the class budget: go on with the slowest replica
                self.switched_at = self.inst[key][1]
            self.asymmetric += 1
            t0 = self.inst[key][1]
            self.max_spread = max(self.max_spread, (hi - lo) / max(hi - t0, 1e-30))
        self.complete(key, hi)

    def complete(self, key: tuple, t: float) -> None:
        got, t0, _ = self.inst.pop(key)
        last = got[-1]
        counted = self.slow and key in self.in_flight
        if counted:
            self.in_flight.discard(key)
        classes, blocker, waiters = self.classes, self.blocker, self.stream_waiters
        for ci, p in got:
            cl = classes[ci]
            if counted:
                self._push_reach(busy_change(cl, t, -1, self.busy_rate), ci)
            blocker[ci][p] = last
            cl.end[p] = t
            cl.start[p] = t0
            if t > cl.finish:
                cl.finish = t
            if waiters:
                for q, issue_t in waiters.pop((ci, p), ()):
                    self.try_ready(ci, q, issue_t)
            if cl.blocked and cl.sk.target[cl.pc] == p:
                if t > cl.tc:
                    self._record_wait(cl, p, cl.tc, t)
                    cl.tc = t
                cl.blocked = False
                cl.pc += 1
                self.advance(ci)

    def _check(self, first: tuple[int, int], this: tuple[int, int], key: tuple) -> None:
        (c0, p0), (c1, p1) = first, this
        a, b = self.classes[c0], self.classes[c1]
        sa, sb = a.sk, b.sk
        if a.keys[p0][1].counter[1] is not None:  # p2p
            if sa.collective[p0] == sb.collective[p1]:
                raise TraceMismatchError(
                    f"p2p mismatch: ranks {a.rep} and {b.rep} both posted a {sa.collective[p0]} "
                    f"(op {sa.op_id[p0]} ({sa.name[p0]}), op {sb.op_id[p1]} ({sb.name[p1]})) to each "
                    f"other; each send needs a recv on the peer")
            if sa.nbytes[p0] != sb.nbytes[p1]:
                raise TraceMismatchError(
                    f"p2p size mismatch between ranks {a.rep} and {b.rep} (#{key[1]}): op "
                    f"{sa.op_id[p0]} ({sa.name[p0]}) moves {sa.nbytes[p0]} B but op {sb.op_id[p1]} "
                    f"({sb.name[p1]}) moves {sb.nbytes[p1]} B")
            return
        if sa.collective[p0] != sb.collective[p1] or sa.nbytes[p0] != sb.nbytes[p1]:
            g = self.trace.group_for(sa.group[p0], a.rep)
            raise TraceMismatchError(
                f"collective mismatch on group {g} sequence {key[1]}: rank {a.rep} issued "
                f"{sa.collective[p0]} of {sa.nbytes[p0]} B (op {sa.op_id[p0]} ({sa.name[p0]})) but "
                f"rank {b.rep} issued {sb.collective[p1]} of {sb.nbytes[p1]} B (op {sb.op_id[p1]} "
                f"({sb.name[p1]})); the ranks of a group must issue the same collectives in the same order")

    # -- main loop ------------------------------------------------------------------------------
    def run(self, progress: Callable[[int], None] | None) -> FastRun:
        for ci in range(len(self.classes)):
            self.advance(ci)
        events, net, skip = self.events, self.net, self.skipper
        anchor = skip.anchor if skip is not None and skip.periods else -1
        steps = 0
        # Only net.step and arrive (net.start) change the network: its next event time is read
        # again after those alone (next_time is a function of the network's state).
        t_net = net.next_time()
        while True:
            ev = events.next(t_net)
            if ev is None:
                break
            t, kind, ci, p = ev
            if kind == NETWORK:
                t, done = net.step()
                t_net = net.next_time()
                for k, ends in done:
                    self.batch_done(k, ends)
            elif kind == Ev.TIMER:
                self.batch_done(ci, p)  # (instance key, its replicas' ends)
            elif kind == Ev.REACH:
                self._reached(t, ci, p)  # (class, version)
            else:
                self.arrive(t, ci, p)
                if ci == anchor and skip.is_checkpoint(ci, p):
                    skip.at_checkpoint(t)
                t_net = net.next_time()
                steps += 1
                if progress is not None and steps % 4096 == 0:
                    progress(4096)
        self._check_done()
        times, point_time, meta = [], [], []
        for ci, cl in enumerate(self.classes):
            comm = [p for p, k in enumerate(cl.sk.kind) if k != "wait"]
            times.append(RankTimes(
                finish_s=cl.finish,
                compute_s=cl.compute,
                comm_start=np.array([cl.start[p] for p in comm], dtype=np.float64),
                comm_end=np.array([cl.end[p] for p in comm], dtype=np.float64),
                waits=cl.waits,
            ))
            point_time.append(np.array(cl.t_at, dtype=np.float64))
            meta.append([cl.keys[p][1].rep_inst for p in comm])
        return FastRun(classes=[cl.ranks for cl in self.classes], class_of=self.class_of,
                       skeletons=self.skeletons, times=times, point_time=point_time, comm_meta=meta,
                       blocker=self.blocker, symmetry="exact" if self.exact else "max",
                       asymmetric=self.asymmetric, max_spread=self.max_spread,
                       network_recomputes=self.net.recomputes,
                       periods_skipped=self.skipper.skipped if self.skipper is not None else 0,
                       folded_transfers=self.folded_transfers, fold="on" if self.fold is not None else "none")

    def _check_done(self) -> None:
        stuck = [cl for cl in self.classes if cl.pc < len(cl.sk)]
        if not stuck and not self.arrivals:
            return
        lines = []
        for key, got in list(self.arrivals.items())[:4]:
            ci, p = got[0]
            cl = self.classes[ci]
            sk = cl.sk
            g = self.trace.group_for(sk.group[p], cl.rep)
            if cl.keys[p][1].counter[1] is None:
                have = sorted(r for cj, _ in got for r in self.classes[cj].ranks
                              if r in self.trace.groups[g].ranks)
                missing = sorted(set(self.trace.groups[g].ranks) - set(have))
                lines.append(
                    f"{sk.collective[p]} on group {g} sequence {key[1]}: ranks {have[:8]} issued it "
                    f"(op {sk.op_id[p]} ({sk.name[p]})) but ranks {missing[:8]} never did")
            else:
                other = self.trace.groups[g].ranks[sk.peer[p]]
                want = "recv" if sk.collective[p] == "send" else "send"
                lines.append(
                    f"p2p {sk.collective[p]} on group {g} by rank {cl.rep} (op {sk.op_id[p]} "
                    f"({sk.name[p]})) has no matching {want} on rank {other}")
        for cl in stuck[:4]:
            sk = cl.sk
            p = cl.pc
            lines.append(f"rank {cl.rep} is blocked at op {sk.op_id[p]} ({sk.name[p]}) waiting for op "
                         f"{sk.op_id[sk.target[p]]}" if sk.kind[p] == "wait" else f"rank {cl.rep} stopped at op {sk.op_id[p]}")
        raise TraceMismatchError(
            "the trace deadlocks: no rank can make progress. " + "; ".join(lines)
            + ". Collectives must be issued in the same order on every member and every send needs a "
            "matching recv.")
