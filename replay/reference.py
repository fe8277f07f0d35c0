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
  (:class:`~replay.flows.FluidNetwork`) delivers its last byte;
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

import heapq
import math
from typing import Hashable

import numpy as np

from heterosim.errors import TraceMismatchError

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


def run_reference(w: Workload) -> dict[int, RankTimes]:
    """Simulate every rank of ``w``; returns each rank's :class:`RankTimes`."""
    world = w.trace.world_size
    ranks = [_Rank(expand_rank(w, r)) for r in range(world)]
    heap: list[tuple[float, int, int, int]] = []  # (time, seq, rank, op index): op becomes ready
    seq = 0
    arrivals: dict[Hashable, list[tuple[int, int]]] = {}
    inst_start: dict[Hashable, float] = {}
    members: dict[Hashable, list[tuple[int, int]]] = {}
    stream_waiters: dict[tuple[int, int], list[tuple[int, float]]] = {}  # (rank, pred op) -> [(op, issue t)]
    net = FluidNetwork(w.capacity_Bps, solo=False)  # plain fluid model: no fast path here
    timers: list[tuple[float, int, Hashable]] = []  # no-sharing mode: fixed-duration completions
    slow = w.overlap_slowdown
    busy_rate = 1.0 - slow
    reach: list[tuple[float, int, int, int]] = []  # (time, seq, rank, version): compute op ends
    in_flight: set[Hashable] = set()  # started transfers counted in their members' ``busy``

    def push_ready(t: float, r: int, i: int) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, seq, r, i))
        seq += 1

    def issue(r: int, i: int, issue_t: float) -> None:
        """Op i of rank r was issued at compute time issue_t: find its stream predecessors."""
        st = ranks[r]
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
        try_ready(r, i, issue_t)

    def try_ready(r: int, i: int, issue_t: float) -> None:
        """Push op i's ready event if its stream predecessors are done, else wait for one."""
        st = ranks[r]
        preds = st.preds[i]
        pending = [p for p in preds if p not in st.end]
        if pending:
            stream_waiters.setdefault((r, pending[0]), []).append((i, issue_t))
            return
        push_ready(max([issue_t] + [st.end[p] for p in preds]), r, i)

    def push_reach(t: float | None, r: int) -> bool:
        """Push rank r's end-of-op event due at t (slowdown mode); False if t is None."""
        nonlocal seq
        if t is None:
            return False
        heapq.heappush(reach, (t, seq, r, ranks[r].ver))
        seq += 1
        return True

    def advance(r: int) -> None:
        st = ranks[r]
        ops = st.ops
        while st.pc < len(ops):
            op = ops[st.pc]
            if op.kind == "compute":
                if slow:
                    if push_reach(span_step(st, op.duration_s, busy_rate), r):
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
                    inst = ops[op.target].inst
                    st.waits.append(WaitRecord(t_block=st.tc, t_end=te, t_start=st.start[op.target],
                                               dim=inst.dim, inter_node=w.crosses_nodes(inst.ranks)))
                    st.tc = te
            else:
                issue(r, st.pc, st.tc)
            st.pc += 1
        st.finish = max(st.finish, st.tc)

    def complete(key: Hashable, t: float) -> None:
        counted = key in in_flight
        if counted:
            in_flight.discard(key)
        for r, i in members.pop(key):
            if counted:
                push_reach(busy_change(ranks[r], t, -1, busy_rate), r)
            st = ranks[r]
            st.end[i] = t
            st.start[i] = inst_start[key]
            st.finish = max(st.finish, t)
            for j, issue_t in stream_waiters.pop((r, i), ()):
                try_ready(r, j, issue_t)
            if st.blocked_at is not None and st.ops[st.pc].target == i:
                op = st.ops[i]
                if t > st.blocked_at:
                    st.waits.append(WaitRecord(t_block=st.blocked_at, t_end=t, t_start=inst_start[key],
                                               dim=op.inst.dim, inter_node=w.crosses_nodes(op.inst.ranks)))
                st.tc = max(st.tc, t)
                st.blocked_at = None
                st.pc += 1
                advance(r)

    def arrive(t: float, r: int, i: int) -> None:
        op = ranks[r].ops[i]
        key = op.key
        got = arrivals.setdefault(key, [])
        if got:
            r0, i0 = got[0]
            check_match(ranks[r0].ops[i0], r0, op, r, key)
        got.append((r, i))
        need = len(op.inst.ranks) if key[0] == "c" else 2
        if len(got) < need:
            return
        del arrivals[key]
        members[key] = got
        inst_start[key] = t
        if need == 1 or (key[0] == "c" and len(set(op.inst.ranks)) == 1):
            complete(key, t)
            return
        if slow:
            in_flight.add(key)
            for r2, _ in got:
                push_reach(busy_change(ranks[r2], t, +1, busy_rate), r2)
        spec = w.transfer_spec(op.inst)
        if w.link_sharing:
            for k, _ in net.start(key, [spec], t):
                complete(k, t)
        else:
            heapq.heappush(timers, (t + solo_time(spec, w.capacity_Bps), next(_tick), key))

    _tick = iter(range(1 << 62))
    for r in range(world):
        advance(r)
    while True:
        t_heap = heap[0][0] if heap else math.inf
        t_net = net.next_time()
        t_tim = timers[0][0] if timers else math.inf
        t_cmp = reach[0][0] if reach else math.inf
        if t_heap == t_net == t_tim == t_cmp == math.inf:
            break
        if t_net <= t_heap and t_net <= t_tim and t_net <= t_cmp:
            t, done = net.step()
            for k, _ in done:
                complete(k, t)
        elif t_tim <= t_heap and t_tim <= t_cmp:
            t, _, k = heapq.heappop(timers)
            complete(k, t)
        elif t_cmp <= t_heap:
            t, _, r, ver = heapq.heappop(reach)
            st = ranks[r]
            if ver == st.ver:  # else re-planned: a later event replaces it
                st.compute += t - st.tc
                st.tc = t
                st.work = 0.0
                advance(r)
        else:
            t, _, r, i = heapq.heappop(heap)
            arrive(t, r, i)
    _check_done(ranks, arrivals)
    out: dict[int, RankTimes] = {}
    for r, st in enumerate(ranks):
        comm = [op.index for op in st.ops if op.kind in ("collective", "p2p")]
        out[r] = RankTimes(
            finish_s=st.finish,
            compute_s=st.compute,
            comm_start=np.array([st.start[i] for i in comm], dtype=np.float64),
            comm_end=np.array([st.end[i] for i in comm], dtype=np.float64),
            waits=st.waits,
        )
    return out


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
