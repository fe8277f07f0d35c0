"""The steady 1F1B phase advanced by whole periods: the fast engine's skip-ahead.

In the steady phase of a 1F1B pipeline every stage repeats one forward and one backward
micro-batch, so every class's points repeat with a period of ``L_c`` points (:func:`point_period`:
the same network signature, kind, stream, wait / coalescing offsets and compute span) and, once
the pipeline has settled, the whole simulation state repeats too: shifted by ``L_c`` points per
class, by one counter period per transfer kind and by ``T`` seconds. :class:`Skipper` looks for
that at a fixed point of one class's period (a *checkpoint*): when two consecutive checkpoints
hold the same state (every class one period further, the same transfers in flight, the same
pending events, every time at the same offset from the checkpoint's), it advances ``K`` periods at
once: the points in between get the last period's records (end, start, reach times, waits,
blockers) ``j * T`` later, and the state in flight moves ``K * T`` later and ``K`` periods
further. ``K`` stops where the first class's points in flight would leave its steady range, so
the cool-down is simulated event by event.

With overlap slowdown the compute clock is part of that state: per class the work (full-speed
seconds) left in the span in progress, the count of its comm ops in flight, the pending end of the
span (compared as time offsets, moved ``K * T`` later; a re-planned, stale end event is dropped,
as popping it would do nothing) and the started transfers that count as in flight (moved ``K``
periods further). The compute seconds accumulated grow by ``K`` times the last period's.

It applies only where the state is small enough to move: link sharing on and a network that holds
only batches running wholly solo (:mod:`replay.holds`; no fluid flow, no per-link owner), as in the
benchmark's 1F1B cases on adaptive-routing clusters.

NB (approximation): two checkpoints count as the same state when every time offset agrees within
:data:`TIME_TOL` seconds, and the skipped records are the last period's plus ``j * T`` rather than
the sums the event-by-event run would round. The iteration time stays within 1e-9 relative of the
run without skipping on the benchmark's 1F1B cases and the engine tests' random pipelines, with and
without overlap slowdown (tested, ``tests/test_replay_periodic.py``); ``run_fast(...,
periodic=False)`` turns it off.
"""

from __future__ import annotations

import functools
import heapq
import math
import weakref
from typing import Any

import numpy as np

from .events import Ev
from .expand import RoleSkeleton, WaitRecord

__all__ = ["point_period", "Skipper", "SkippedBlockers", "TIME_TOL"]

TIME_TOL = 1e-12
"""Two checkpoints' time offsets (seconds from the checkpoint) count as equal within this."""

_MIN_PERIODS = 2
"""Skip only when at least this many whole periods can be advanced."""


def point_period(sk: RoleSkeleton, spans: list[float]) -> tuple[int, int, int] | None:
    """``(L, lo, hi)``: points ``q`` in ``[lo, hi)`` repeat those ``L`` earlier (``q - L >= lo``)
    and later, as the engine sees them; None without such a repetition around the middle."""
    n = len(sk)
    if n < 8:
        return None

    tgt = [t - q if t >= 0 else 0 for q, t in enumerate(sk.target)]
    coal = [c - q for q, c in enumerate(sk.coalesced)]
    hs = list(zip(sk.sig, sk.kind, sk.stream, tgt, coal, spans[:n]))
    m = n // 2
    q, stop = m, min(n, m + n // 3)
    while True:
        try:
            q = hs.index(hs[m], q + 1, stop)  # the next point like the middle one (compared at C speed)
        except ValueError:
            return None
        L = q - m
        h = min(L, 64)  # a short look first: most candidates differ early
        if m + 2 * L > n or hs[m:m + h] != hs[q:q + h] or hs[m:q] != hs[q:q + L]:
            continue
        lo, hi = m, m + L
        while lo >= L and hs[lo - L:lo] == hs[lo:lo + L]:  # a period at a time, then point by point
            lo -= L
        while lo > 0 and hs[lo - 1] == hs[lo - 1 + L]:
            lo -= 1
        while hi + L <= n and hs[hi:hi + L] == hs[hi - L:hi]:
            hi += L
        while hi < n and hs[hi] == hs[hi - L]:
            hi += 1
        if hi - lo >= max(4 * L, n // 3):  # the steady phase, not a short run of alike points
            return L, lo, hi


_wait_record = functools.partial(tuple.__new__, WaitRecord)
"""A :class:`WaitRecord` from a tuple of its fields, built at C speed."""


def _rel(x: float, t: float) -> float:
    return x - t if x == x else math.nan


def _same(a: list[float], b: list[float]) -> bool:
    for x, y in zip(a, b):
        if x != x or y != y:
            if (x == x) != (y == y):
                return False
        elif abs(x - y) > TIME_TOL:
            return False
    return len(a) == len(b)


class SkippedBlockers(dict):
    """A class's blockers (comm point -> (class, point) of the member that issued it last) once
    ``S`` points from ``f`` were skipped in periods of ``D``: a skipped point's entry is that of its
    point in the last period before ``f``, ``j + 1`` periods on (``j``: its period), the blocking
    class's period being ``strides[class]`` points. Resolved when read rather than written out:
    only the critical path reads a few of them. Reading every entry (``items``, ``len``, ``==``)
    lists them all."""

    def __init__(self, base: dict, f: int, S: int, D: int, strides: list[int]):
        super().__init__(base)
        self.f, self.S, self.D, self.strides = f, S, D, strides

    def _skipped(self, q: Any) -> tuple[int, int] | None:
        if not isinstance(q, int) or not self.f <= q < self.f + self.S:
            return None
        j, r = divmod(q - self.f, self.D)
        got = dict.get(self, self.f - self.D + r)
        if got is None:
            return None
        cj, pj = got
        return cj, pj + (j + 1) * self.strides[cj]

    def __missing__(self, q: Any) -> tuple[int, int]:
        got = self._skipped(q)
        if got is None:
            raise KeyError(q)
        return got

    def __contains__(self, q: Any) -> bool:
        return dict.__contains__(self, q) or self._skipped(q) is not None

    def get(self, q: Any, default: Any = None) -> Any:
        try:
            return self[q]
        except KeyError:
            return default

    def full(self) -> dict[int, tuple[int, int]]:
        """Every entry, the skipped ones written out."""
        out = dict(dict.items(self))
        for r in range(self.D):
            if dict.__contains__(self, self.f - self.D + r):
                for q in range(self.f + r, self.f + self.S, self.D):
                    out[q] = self[q]
        return out

    def items(self):  # type: ignore[override]
        return self.full().items()

    def keys(self):  # type: ignore[override]
        return self.full().keys()

    def values(self):  # type: ignore[override]
        return self.full().values()

    def __iter__(self):
        return iter(self.full())

    def __len__(self) -> int:
        return len(self.full())

    def __eq__(self, other: object) -> bool:
        return self.full() == (other.full() if isinstance(other, SkippedBlockers) else other)

    __hash__ = None  # type: ignore[assignment]


class Skipper:
    """Checkpoints of one :class:`replay.engine_sim._Sim` run; :meth:`at_checkpoint` skips ahead."""

    def __init__(self, sim: Any):
        self.sim = weakref.proxy(sim)  # the sim holds its skipper: no cycle for the collector to find
        self.periods: list[tuple[int, int, int]] = []
        self.anchor_point = -1
        self.anchor = 0
        """The class whose checkpoints are compared (the longest period)."""
        self.strides: list[int] = []
        """Points each class advanced between the two checkpoints of the skip (whole periods)."""
        self.last: tuple | None = None
        self.skipped = 0
        """Periods advanced in closed form (0: none)."""
        self.fronts: dict[int, int] = {}
        found: dict[tuple[int, str], tuple[int, int, int] | None] = {}
        for cl in sim.classes:
            rk = (cl.sk.role, sim.w.gpu_type[cl.rep])  # classes of one role and GPU type share a program
            if rk not in found:
                found[rk] = point_period(cl.sk, cl.spans)
            got = found[rk]
            if got is None:
                self.periods = []
                return
            self.periods.append(got)
        # The anchor is the class of the longest period (the first stage's, whose embedding chunk
        # comes back only every PP x VPP steps in an interleaved schedule): its period is the
        # whole state's, and the other classes advance whole periods of their own meanwhile.
        self.anchor = max(range(len(self.periods)), key=lambda ci: (self.periods[ci][0], -ci))
        L, lo, _ = self.periods[self.anchor]
        kinds = sim.classes[self.anchor].sk.kind
        # Checkpoints sit on an issued point a quarter period into the steady range, so the points
        # still in flight there are steady ones too; a period of waits alone has none, and then
        # nothing is skipped.
        self.anchor_point = next((q for q in range(lo + L // 4, lo + L + L // 4) if kinds[q] != "wait"), -1)
        if self.anchor_point < 0:
            self.periods = []

    def is_checkpoint(self, ci: int, p: int) -> bool:
        if ci != self.anchor or not self.periods or self.skipped:
            return False
        L, lo, hi = self.periods[ci]
        return p >= self.anchor_point and (p - self.anchor_point) % L == 0 and p < hi

    # -- state ----------------------------------------------------------------------------------
    def _frontier(self, ci: int) -> int:
        """The class's first comm point not yet complete (or its compute position; a wait point
        has no end of its own)."""
        cl = self.sim.classes[ci]
        end, kind = cl.end, cl.sk.kind
        f = self.fronts.get(ci, 0)
        while f < cl.pc and (end[f] == end[f] or kind[f] == "wait"):
            f += 1
        self.fronts[ci] = f
        return f

    def _state(self, t: float) -> tuple | None:
        """(structure, time offsets, per-class frontiers, counters, waits lengths) or None when the
        state is not one this module can move."""
        sim = self.sim
        net = sim.net
        if (net._flows or net._transfers or net._owned or net._reserved or net._pending_start
                or any(e[1] == Ev.TIMER for e in sim.events.heap)):
            return None
        if any(b.info is None for b in net._batches.values()):
            return None
        fronts, struct, times = [], [], []
        due = {(e[3], e[4]) for e in sim.events.of_kind(Ev.REACH)}  # pending span ends: (class, version)
        for ci, cl in enumerate(sim.classes):
            if cl.tail:
                return None
            f = self._frontier(ci)
            L = self.periods[ci][0]
            if cl.pc - f > 4 * L:  # an op in flight since long ago: not the steady phase (and each
                return None        # checkpoint would read the whole window)
            fronts.append(f)
            struct.append((cl.pc - f, cl.blocked,
                           tuple(q - f for q in range(f, cl.pc) if cl.end[q] != cl.end[q] and cl.sk.kind[q] != "wait")))
            times.append(cl.tc - t)
            if sim.slow:  # the compute clock: work left in the span in progress, its pending end
                pending = cl.work is not None and (ci, cl.ver) in due
                struct.append((cl.work is None, cl.busy, pending))
                if cl.work is not None:
                    times.append(cl.work)
                if pending:
                    times.append(cl.t_reach - t)
            for q in range(f, cl.pc):
                times += (_rel(cl.end[q], t), _rel(cl.start[q], t), _rel(cl.t_at[q], t))
            for s in sorted(cl.stream_groups):
                cg, cur, prev = cl.stream_groups[s]
                struct.append((s, cg - f if self._live(cl, cg, f) else "old", tuple(self._off(q, f) for q in cur),
                               tuple(self._off(q, f) for q in prev)))
        base = self._bases()
        ready = sim.events.of_kind(Ev.READY)
        struct.append(tuple((ci, p - fronts[ci]) for _, _, _, ci, p in ready))
        times += [e[0] - t for e in ready]
        for key in sorted(sim.arrivals, key=repr):
            struct.append((key[0], key[1] - base[key[0]], tuple((c, p - fronts[c]) for c, p in sim.arrivals[key])))
        for key in sorted(sim.inst, key=repr):
            got, t0, _ = sim.inst[key]
            struct.append((key[0], key[1] - base[key[0]], tuple((c, p - fronts[c]) for c, p in got)))
            times.append(t0 - t)
        for (ci, q) in sorted(sim.stream_waiters):
            ws = sim.stream_waiters[(ci, q)]
            struct.append((ci, q - fronts[ci], tuple(p - fronts[ci] for p, _ in ws)))
            times += [it - t for _, it in ws]
        held = sorted(net._batches.values(), key=lambda b: (b.key[0], b.key[1]))
        struct.append(tuple((b.key[0], b.key[1] - base[b.key[0]], id(b.info)) for b in held))
        times += [b.t0 - t for b in held]
        struct.append(tuple(sorted((k[0], k[1] - base[k[0]]) for k in sim.in_flight)))
        counters = [dict(cl.counters) for cl in sim.classes]
        waits = [len(cl.waits) for cl in sim.classes]
        compute = [cl.compute for cl in sim.classes]
        return tuple(struct), times, fronts, counters, waits, base, t, compute

    # A stream's last launch group matters to the ops issued next only through its points still
    # running (a stream op waits for them) and its id (an op of the same launch joins it). Points
    # before the frontier have completed, at or before any later issue, so they count as "old":
    # where they sit does not change what follows (a stream used once per iteration, e.g. by the
    # parameter all-gathers, would otherwise keep two checkpoints apart for a whole period).
    @staticmethod
    def _off(q: int, f: int) -> Any:
        return "old" if q < f else q - f

    @staticmethod
    def _live(cl: Any, cg: int, f: int) -> bool:
        """Whether launch group ``cg`` may still be joined or holds running points."""
        co = cl.sk.coalesced
        return cg >= f or (cl.pc < len(co) and co[cl.pc] == cg)

    def _bases(self) -> dict[int, int]:
        base: dict[int, int] = {}
        for cl in self.sim.classes:
            for (ident, _), k in cl.counters.items():
                if k > base.get(ident, -1):
                    base[ident] = k
        return base

    # -- the skip -------------------------------------------------------------------------------
    def at_checkpoint(self, t: float) -> float | None:
        """Called when the anchor class reaches a checkpoint at ``t``: the new time if it skipped."""
        now = self._state(t)
        last, self.last = self.last, now
        if now is None or last is None or now[0] != last[0] or not _same(now[1], last[1]):
            return None
        fronts, fronts0 = now[2], last[2]
        # Each class must have advanced whole periods of its own from inside its steady range:
        # then its program from the last checkpoint on repeats every ``d`` points.
        d = [f - f0 for f, f0 in zip(fronts, fronts0)]
        if any(dc <= 0 or dc % L or f0 < lo for dc, f0, (L, lo, _) in zip(d, fronts0, self.periods)):
            return None
        T = t - last[6]
        if not T > 0:
            return None
        # Every point in flight lands inside its steady range: [lo, hi) repeats, so point q + K d acts
        # as q for q < pc when pc + K d <= hi.
        K = min((hi - cl.pc) // dc for cl, dc, (_, _, hi) in zip(self.sim.classes, d, self.periods))
        if K < _MIN_PERIODS:
            return None
        self.strides = d
        self._advance(K, T, last, now)
        self.skipped = K
        self.last = None
        return t + K * T

    def _fill_skipped(self, ci: int, cl: Any, f: int, K: int, T: float, w0: int) -> None:
        """Write out class ``ci``'s skipped periods, points ``f`` to ``f + K D``: the last complete
        period's times ``j T`` later, its keys and its blockers ``j`` periods on, its waits (from
        ``w0``) shifted alike; every column built by numpy and zipped in at C speed."""
        sim, stride = self.sim, self.strides
        D = stride[ci]
        S = K * D
        # the skipped periods: the last complete period, j * T later (nan, a wait's end, stays
        # nan); a skipped point keeps its shape, the sequence number in its key is never read again
        src, ds = f - D, [j * T for j in range(1, K + 1)]
        shifts = np.array(ds)[:, None]  # row j: the period j * T on (same sums as in Python)
        for col in (cl.end, cl.start, cl.t_at):
            col[f:f + S] = (np.array(col[src:f], dtype=np.float64) + shifts).ravel().tolist()
        # point f + j D + r (j < K) takes point src + r's key, and its blocker K periods on:
        # index grids built by numpy (integers: exact), the entries zipped at C speed
        rows = np.arange(K, dtype=np.int64)[:, None]
        keyed = [r for r in range(D) if src + r in cl.keys]
        cl.keys.update(zip((f + rows * D + np.array(keyed, dtype=np.int64)).ravel().tolist(),
                           [cl.keys[src + r] for r in keyed] * K))
        sim.blocker[ci] = SkippedBlockers(sim.blocker[ci], f, S, D, list(stride))
        base_w = cl.waits[w0:]
        if base_w:  # the last period's waits, j * T and j periods of points on (j = 1..K)
            t_block, t_end, t_start, dims, inter, points = (list(c) for c in zip(*base_w))
            cl.waits += map(_wait_record, zip(
                *((np.array(c, dtype=np.float64) + shifts).ravel().tolist() for c in (t_block, t_end, t_start)),
                dims * K, inter * K, (np.array(points, dtype=np.int64) + (rows + 1) * D).ravel().tolist()))

    def _advance(self, K: int, T: float, last: tuple, now: tuple) -> None:
        sim = self.sim
        fronts, counters0, waits0, base0, compute0 = now[2], last[3], last[4], last[5], last[7]
        base = now[5]
        dk = {ident: base[ident] - base0.get(ident, 0) for ident in base}
        shift_t = K * T
        stride = self.strides  # points per class between the two checkpoints: whole periods
        for ci, cl in enumerate(sim.classes):
            D = stride[ci]
            f, pc = fronts[ci], cl.pc
            S = K * D
            # the state in flight, K periods on
            for q in range(pc - 1, f - 1, -1):
                cl.end[q + S] = cl.end[q] + shift_t if cl.end[q] == cl.end[q] else math.nan
                cl.start[q + S] = cl.start[q] + shift_t if cl.start[q] == cl.start[q] else math.nan
                cl.t_at[q + S] = cl.t_at[q] + shift_t
                if q in cl.keys:
                    key, sh = cl.keys[q]
                    cl.keys[q + S] = ((key[0], key[1] + K * dk[key[0]]), sh)
                if q in sim.blocker[ci]:
                    cj, pj = sim.blocker[ci][q]
                    sim.blocker[ci][q + S] = (cj, pj + K * stride[cj])
            self._fill_skipped(ci, cl, f, K, T, waits0[ci])
            for ck, k in cl.counters.items():
                cl.counters[ck] = k + K * (k - counters0[ci].get(ck, 0))
            mv = self._mover(f, S)
            for s, (cg, cur, prev) in list(cl.stream_groups.items()):
                cl.stream_groups[s] = (cg + S if self._live(cl, cg, f) else cg, [mv(q) for q in cur],
                                       [mv(q) for q in prev])
            cl.pc += S
            cl.tc += shift_t
            cl.finish += shift_t
            cl.compute += K * (cl.compute - compute0[ci])  # 0 without slowdown (the spans' sum)
            cl.t_reach += shift_t  # the work left and the comm ops in flight stay as they are
            self.fronts[ci] = f + S
        fr = [(fronts[ci], K * stride[ci]) for ci in range(len(sim.classes))]

        def key_on(key: tuple) -> tuple:
            return (key[0], key[1] + K * dk[key[0]])

        # Every queued event is a READY or a REACH one (no TIMER: _state). A span end re-planned
        # since (an older version) would be dropped when popped: dropped now.
        sim.events.replace([(e[0] + shift_t, e[1], e[2], e[3], e[4] + fr[e[3]][1]) if e[1] == Ev.READY
                            else (e[0] + shift_t, e[1], e[2], e[3], e[4]) for e in sim.events.heap
                            if e[1] == Ev.READY or e[4] == sim.classes[e[3]].ver])
        in_flight = {key_on(k) for k in sim.in_flight}
        sim.in_flight.clear()
        sim.in_flight.update(in_flight)
        arrivals = {key_on(k): [(c, p + fr[c][1]) for c, p in v] for k, v in sim.arrivals.items()}
        sim.arrivals.clear()
        sim.arrivals.update(arrivals)
        inst = {key_on(k): ([(c, p + fr[c][1]) for c, p in got], t0 + shift_t, sh)
                for k, (got, t0, sh) in sim.inst.items()}
        sim.inst.clear()
        sim.inst.update(inst)
        waiters = {}
        for (ci, q), ws in sim.stream_waiters.items():
            cl = sim.classes[ci]
            S = fr[ci][1]
            mv = self._mover(fr[ci][0], S)
            for p, _ in ws:
                cl.preds[p + S] = [mv(x) for x in cl.preds[p]]
            waiters[(ci, q + S)] = [(p + S, it + shift_t) for p, it in ws]
        sim.stream_waiters.clear()
        sim.stream_waiters.update(waiters)
        net = sim.net
        entries = []
        for e in net._heap:
            b = net._batches.get(e[3])
            if e[2] == 2 and b is not None and b.version == e[4]:
                entries.append(e)
        for b in net._batches.values():
            b.key = key_on(b.key)
            b.t0 += shift_t
        net._heap[:] = [(net._batches[e[3]].t0 + net._batches[e[3]].info.longest, e[1], 2, e[3], e[4])
                        for e in entries]
        heapq.heapify(net._heap)
        net.now += shift_t

    @staticmethod
    def _mover(f: int, S: int):
        def mv(q: int) -> int:
            return q if q < f else q + S
        return mv
