"""The reference engine: per rank, per op, one heap of (time, seq, event). Small and plain.

It is the specification the fast engine (:mod:`replay.engine`) is tested against. Semantics (CUDA
streams + NCCL, eager mode):

- each rank's compute stream runs its compute ops in program order, back to back;
- a comm op (collective or p2p) is issued at its program position without blocking the compute
  stream; on its own comm stream (``op.stream``) it becomes *ready* once (a) the compute work
  issued before it has completed (NCCL's stream waits on an event recorded on the compute stream)
  and (b) the previous op of that comm stream has completed (ops of one coalesced launch do not
  wait for each other);
- the transfer starts when every member is ready, and completes when the network
  (:class:`~replay.flows.FluidNetwork`) delivers its last byte. By default that is the network the
  fast engine runs on, solo fast path included, so the two engines differ only in how they
  simulate ranks (each one here, one per class there); ``solo=False`` gives the plain fluid model,
  which the fast path equals up to rounding (``docs/replay.md``, Known limits);
- a wait op blocks the compute stream until its target comm op has completed;
- with ``w.overlap_slowdown = s > 0``, compute runs at speed ``1 - s`` while at least one comm op
  of the same rank is in flight (from its transfer's start to its completion): NCCL kernels take
  SMs and memory bandwidth from concurrent kernels. Compute then advances event by event (a
  rate change re-plans the op in progress) instead of running ahead. One constant fraction: it
  ignores the collective's size and channels, the kernel's own boundness and how many comm ops
  overlap; measured compute slowdowns under overlap average 18.9 % (F ~ 0.16) in "Characterizing
  Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning" (arXiv:2507.03114).

If nothing can move while ops remain, it raises :class:`TraceMismatchError` naming the ranks, ops
and group/sequence that did not match.
"""

from __future__ import annotations

import math
from typing import Hashable

import numpy as np

from heterosim.errors import TraceMismatchError

from .events import NETWORK, Ev, EventQueue
from .expand import (RankOp, RankTimes, WaitRecord, Workload, busy_change, check_match, describe_op, expand_rank,
                     span_step)
from .flows import FluidNetwork, solo_time

__all__ = ["run_reference"]


class _Rank:
    __slots__ = ("ops", "pc", "tc", "blocked_at", "end", "start", "stream_groups", "compute",
                 "waits", "finish", "preds", "work", "busy", "ver", "t_reach")

    def __init__(self, ops: list[RankOp]):
        self.ops = ops
        self.pc = 0
        self.tc = 0.0
        self.blocked_at: float | None = None
        self.end: dict[int, float] = {}
        self.start: dict[int, float] = {}
        # stream -> (coalesced id of the current launch, its ops, ops of the previous launch)
        self.stream_groups: dict[str, tuple[int, list[int], list[int]]] = {}
        self.compute = 0.0
        self.waits: list[WaitRecord] = []
        self.finish = 0.0
        self.preds: dict[int, list[int]] = {}
        # overlap slowdown: work (full-speed seconds) left in the compute op in progress (None: not
        # started), comm ops in flight, version and time of the pending end-of-op event
        self.work: float | None = None
        self.busy = 0
        self.ver = 0
        self.t_reach = math.inf


def run_reference(w: Workload, *, solo: bool = True) -> dict[int, RankTimes]:
    """Simulate every rank of ``w``; returns each rank's :class:`RankTimes`. ``solo``: the network's
    solo fast path (:class:`~replay.flows.FluidNetwork`); off, every transfer is fluid flows."""
    return _Engine(w, solo).run()


class _Engine:
    """One run: every rank's state, the event queues and the network.

    Events (:mod:`replay.events`), earliest first, ties in this order: the fluid network's next
    transfer completion; ``TIMER`` (instance key), a fixed-duration completion when links are not
    shared; ``REACH`` (rank, version), the end of a rank's compute op in slowdown mode (an event
    whose version is stale was re-planned and is skipped); ``READY`` (rank, op), a comm op
    becoming ready on its stream.
    """

    def __init__(self, w: Workload, solo: bool = True) -> None:
        self.w = w
        self.ranks = [_Rank(expand_rank(w, r)) for r in range(w.trace.world_size)]
        self.events = EventQueue()
        self.net = FluidNetwork(w.capacity_Bps, solo=solo)
        self.arrivals: dict[Hashable, list[tuple[int, int]]] = {}  # instance -> (rank, op) ready so far
        self.members: dict[Hashable, list[tuple[int, int]]] = {}  # started instance -> (rank, op)
        self.inst_start: dict[Hashable, float] = {}  # instance -> its transfer's start
        self.stream_waiters: dict[tuple[int, int], list[tuple[int, float]]] = {}  # (rank, pred op) -> [(op, issue t)]
        self.in_flight: set[Hashable] = set()  # started transfers counted in their members' ``busy``
        self.slow = w.overlap_slowdown
        self.busy_rate = 1.0 - self.slow

    def run(self) -> dict[int, RankTimes]:
        """Run every rank to its end; raise :class:`TraceMismatchError` if some never get there."""
        for r in range(len(self.ranks)):
            self.advance(r)
        while self.step():
            pass
        _check_done(self.ranks, self.arrivals)
        return {r: _rank_times(st) for r, st in enumerate(self.ranks)}

    def step(self) -> bool:
        """Handle the earliest event; False when there is none left."""
        ev = self.events.next(self.net.next_time())
        if ev is None:
            return False
        t, kind, a, b = ev
        if kind == NETWORK:
            t, done = self.net.step()
            for k, _ in done:
                self.complete(k, t)
        elif kind == Ev.TIMER:
            self.complete(a, t)
        elif kind == Ev.REACH:
            self.compute_done(t, a, b)
        else:
            self.arrive(t, a, b)
        return True

    # ------------------------------------------------------------------ one rank's program
    def advance(self, r: int) -> None:
        """Run rank r's program from its current op until it blocks or ends."""
        st = self.ranks[r]
        ops = st.ops
        while st.pc < len(ops):
            op = ops[st.pc]
            if op.kind == "compute":
                if self.slow:
                    if self.push_reach(span_step(st, op.duration_s, self.busy_rate), r):
                        return
                else:
                    st.tc += op.duration_s
                    st.compute += op.duration_s
            elif op.kind == "wait":
                if op.target not in st.end:
                    st.blocked_at = st.tc
                    return
                te = st.end[op.target]
                if te > st.tc:
                    st.waits.append(self.wait_record(st.tc, te, st.start[op.target], ops[op.target]))
                    st.tc = te
            else:
                self.issue(r, st.pc, st.tc)
            st.pc += 1
        st.finish = max(st.finish, st.tc)

    def compute_done(self, t: float, r: int, ver: int) -> None:
        """Rank r's compute op in progress ends at t (slowdown mode), unless re-planned since."""
        st = self.ranks[r]
        if ver == st.ver:  # else re-planned: a later event replaces it
            st.compute += t - st.tc
            st.tc = t
            st.work = 0.0
            self.advance(r)

    def push_reach(self, t: float | None, r: int) -> bool:
        """Push rank r's end-of-op event due at t (slowdown mode); False if t is None."""
        if t is None:
            return False
        self.events.push(t, Ev.REACH, r, self.ranks[r].ver)
        return True

    def wait_record(self, t_block: float, t_end: float, t_start: float, target: RankOp) -> WaitRecord:
        """A wait of the compute stream from t_block to t_end on ``target`` (started at t_start)."""
        inst = target.inst
        return WaitRecord(t_block=t_block, t_end=t_end, t_start=t_start, dim=inst.dim,
                          inter_node=self.w.crosses_nodes(inst.ranks))

    # ------------------------------------------------------------------ comm streams
    def issue(self, r: int, i: int, issue_t: float) -> None:
        """Op i of rank r was issued at compute time issue_t: find its stream predecessors."""
        st = self.ranks[r]
        op = st.ops[i]
        cg = op.coalesced if op.coalesced >= 0 else op.index
        cur = st.stream_groups.get(op.stream)
        if cur is None:
            preds: list[int] = []
            st.stream_groups[op.stream] = (cg, [i], [])
        elif cur[0] == cg:
            preds = cur[2]
            cur[1].append(i)
        else:
            preds = cur[1]
            st.stream_groups[op.stream] = (cg, [i], cur[1])
        st.preds[i] = list(preds)
        self.try_ready(r, i, issue_t)

    def try_ready(self, r: int, i: int, issue_t: float) -> None:
        """Push op i's ready event if its stream predecessors are done, else wait for one."""
        st = self.ranks[r]
        preds = st.preds[i]
        pending = [p for p in preds if p not in st.end]
        if pending:
            self.stream_waiters.setdefault((r, pending[0]), []).append((i, issue_t))
            return
        self.events.push(max([issue_t] + [st.end[p] for p in preds]), Ev.READY, r, i)

    # ------------------------------------------------------------------ comm instances
    def arrive(self, t: float, r: int, i: int) -> None:
        """Op i of rank r is ready at t; the last member to arrive starts the instance."""
        op = self.ranks[r].ops[i]
        key = op.key
        got = self.arrivals.setdefault(key, [])
        if got:
            r0, i0 = got[0]
            check_match(self.ranks[r0].ops[i0], r0, op, r, key)
        got.append((r, i))
        need = len(op.inst.ranks) if key[0] == "c" else 2
        if len(got) < need:
            return
        del self.arrivals[key]
        self.members[key] = got
        self.inst_start[key] = t
        if need == 1 or (key[0] == "c" and len(set(op.inst.ranks)) == 1):
            self.complete(key, t)
        else:
            self.start_transfer(key, op, t)

    def start_transfer(self, key: Hashable, op: RankOp, t: float) -> None:
        """Put instance ``key`` on the network at t (its members now count it as in flight)."""
        if self.slow:
            self.in_flight.add(key)
            for r, _ in self.members[key]:
                self.push_reach(busy_change(self.ranks[r], t, +1, self.busy_rate), r)
        spec = self.w.transfer_spec(op.inst)
        if self.w.link_sharing:
            for k, _ in self.net.start(key, [spec], t):
                self.complete(k, t)
        else:
            self.events.push(t + solo_time(spec, self.w.capacity_Bps), Ev.TIMER, key)

    def complete(self, key: Hashable, t: float) -> None:
        """Instance ``key`` completed at t: each member's op is done."""
        counted = key in self.in_flight
        self.in_flight.discard(key)
        for r, i in self.members.pop(key):
            if counted:
                self.push_reach(busy_change(self.ranks[r], t, -1, self.busy_rate), r)
            self.op_done(r, i, t, self.inst_start[key])

    def op_done(self, r: int, i: int, t: float, t_start: float) -> None:
        """Comm op i of rank r ran from t_start to t: release the ops of its stream and a wait on it."""
        st = self.ranks[r]
        st.end[i] = t
        st.start[i] = t_start
        st.finish = max(st.finish, t)
        for j, issue_t in self.stream_waiters.pop((r, i), ()):
            self.try_ready(r, j, issue_t)
        if st.blocked_at is not None and st.ops[st.pc].target == i:
            if t > st.blocked_at:
                st.waits.append(self.wait_record(st.blocked_at, t, t_start, st.ops[i]))
            st.tc = max(st.tc, t)
            st.blocked_at = None
            st.pc += 1
            self.advance(r)


def _rank_times(st: _Rank) -> RankTimes:
    """The results of one finished rank."""
    comm = [op.index for op in st.ops if op.kind in ("collective", "p2p")]
    return RankTimes(
        finish_s=st.finish,
        compute_s=st.compute,
        comm_start=np.array([st.start[i] for i in comm], dtype=np.float64),
        comm_end=np.array([st.end[i] for i in comm], dtype=np.float64),
        waits=st.waits,
    )


def _check_done(ranks: list[_Rank], arrivals: dict) -> None:
    """Raise a :class:`TraceMismatchError` describing what never matched, if anything."""
    stuck = [(r, st) for r, st in enumerate(ranks) if st.pc < len(st.ops)]
    if not stuck and not arrivals:
        return
    lines = []
    for key, got in list(arrivals.items())[:4]:
        r0, i0 = got[0]
        op = ranks[r0].ops[i0]
        have = sorted(r for r, _ in got)
        if key[0] == "c":
            missing = sorted(set(op.inst.ranks) - set(have))
            lines.append(
                f"{op.inst.collective} on group {key[1]} sequence {key[2]}: ranks {have} issued it "
                f"({', '.join(describe_op(ranks[r].ops[i]) for r, i in got[:4])}) but ranks "
                f"{missing[:8]} never did"
            )
        else:
            side, other = ("send", key[3]) if op.send else ("recv", key[2])
            lines.append(
                f"p2p {side} on group {key[1]} {key[2]}->{key[3]} #{key[4]} by rank {have[0]} "
                f"({describe_op(op)}) has no matching {'recv' if op.send else 'send'} on rank {other}"
            )
    for r, st in stuck[:4]:
        op = st.ops[st.pc]
        lines.append(f"rank {r} is blocked at {describe_op(op)} waiting for op {op.target}")
    raise TraceMismatchError(
        "the trace deadlocks: no rank can make progress. " + "; ".join(lines)
        + ". Collectives must be issued in the same order on every member and every send needs a "
        "matching recv."
    )
