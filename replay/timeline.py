"""Chrome / Perfetto trace JSON of a simulated iteration: one process per rank, one track per stream.

Format: the Trace Event Format's JSON object form (``{"traceEvents": [...]}``) with complete
events (``"ph": "X"``, microsecond ``ts`` / ``dur``) and metadata events naming processes and
threads; https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU and
Perfetto's legacy JSON importer. Per rank:

- track ``compute``: compute spans (the kernels between two comm/wait ops, merged) and the
  ``wait`` blocks where the compute stream waited for communication;
- one track per communication stream (``comm:<group>``, ``p2p:<group>:<peer>``): each collective
  or p2p from its start (all members issued it) to its end, named with the collective, NCCL's
  algorithm/protocol and its size;
- a counter ``memory (GiB)`` (traces with memory recorded): allocated bytes per category
  (:mod:`heterosim.trace.memory`), two samples per program segment (a micro-batch's forward or
  backward block): the highest total inside the segment at its first op, the total after it at
  its last op. An op's time is interpolated by op count inside its compute span (what that
  ignores: ops of unequal length within a span).

Ranks of one class have identical timelines, so by default jobs over 64 ranks show one rank per
class (the first); pass ``ranks`` to choose.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np

from heterosim.atomic import atomic_write_text
from heterosim.errors import ConfigError
from heterosim.trace.memory import CATEGORIES, SLACK

__all__ = ["TIMELINE_SCHEMA_VERSION", "timeline_events", "write_timeline"]

TIMELINE_SCHEMA_VERSION = 1
_US = 1e6
_GIB = float(1 << 30)


def _default_ranks(result: Any) -> list[int]:
    if result.world_size <= 64:
        return list(range(result.world_size))
    return sorted(c.ranks[0] for c in result.classes)


def timeline_events(result: Any, ranks: Sequence[int] | None = None) -> list[dict]:
    """The trace events of ``result`` for ``ranks`` (see the module docstring for the default)."""
    run, w = result._run, result._workload
    if run is None or w is None:
        raise ConfigError("this Result carries no engine run (it was loaded from JSON); re-run simulate()")
    ranks = _default_ranks(result) if ranks is None else list(ranks)
    bad = [r for r in ranks if not 0 <= r < result.world_size]
    if bad:
        raise ConfigError(f"timeline ranks {bad[:8]} are outside the world (0..{result.world_size - 1})")
    labels = w._cache.get("labels", {})
    events: list[dict] = []
    for r in ranks:
        ci = run.class_of[r]
        rt = run.times[ci]
        sk = run.skeletons[w.trace.role_of(r).id]
        spans = sk.spans[w.gpu_type[r]]
        t_at = run.point_time[ci]
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                       "args": {"name": f"rank {r} ({w.gpu_type[r]}, node {w.node[r]})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": 0, "args": {"name": "compute"}})
        tids: dict[str, int] = {}
        if len(t_at):
            for p in range(len(sk)):
                d = float(spans[p])
                if d > 0:
                    events.append({"ph": "X", "name": "compute", "cat": "compute", "pid": r, "tid": 0,
                                   "ts": (float(t_at[p]) - d) * _US, "dur": d * _US,
                                   "args": {"until_op": sk.op_id[p], "phase": sk.phase[p], "mb": sk.mb[p]}})
            blocked = sum(x.t_end - x.t_block for x in rt.waits)
            tail = float(spans[len(sk)])
            if tail > 0:
                end = rt.compute_s + blocked
                events.append({"ph": "X", "name": "compute", "cat": "compute", "pid": r, "tid": 0,
                               "ts": (end - tail) * _US, "dur": tail * _US, "args": {"until_op": sk.num_ops}})
        events += _memory_counter(w.trace.roles[sk.role], sk, spans, t_at, rt.compute_s + sum(
            x.t_end - x.t_block for x in rt.waits), r)
        for x in rt.waits:
            events.append({"ph": "X", "name": f"wait ({x.dim})", "cat": "wait", "pid": r, "tid": 0,
                           "ts": x.t_block * _US, "dur": (x.t_end - x.t_block) * _US,
                           "args": {"transfer_start_us": x.t_start * _US, "inter_node": x.inter_node}})
        comm_points = [p for p, k in enumerate(sk.kind) if k != "wait"]
        meta = run.comm_meta[ci]
        for k, p in enumerate(comm_points):
            stream = sk.stream[p]
            tid = tids.get(stream)
            if tid is None:
                tid = tids[stream] = len(tids) + 1
                events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": stream}})
            t0, t1 = float(rt.comm_start[k]), float(rt.comm_end[k])
            inst = meta[k] if k < len(meta) else None
            name = labels.get(inst) or f"{sk.collective[p]} {sk.nbytes[p]} B"
            events.append({"ph": "X", "name": name, "cat": "comm", "pid": r, "tid": tid, "ts": t0 * _US,
                           "dur": (t1 - t0) * _US,
                           "args": {"op": sk.op_id[p], "bytes": sk.nbytes[p], "group": sk.group[p],
                                    "phase": sk.phase[p], "mb": sk.mb[p]}})
    return events


def _op_time(op_id: np.ndarray, num_ops: int, spans: Any, t_at: np.ndarray, end: float) -> Any:
    """Global op index -> seconds: inside its compute span, by op count (see module docstring)."""
    n = len(op_id)
    first = np.concatenate([[0], op_id + 1])  # first compute op of span p
    stop = np.concatenate([op_id, [num_ops]])  # one past its last (point p, or the program's end)
    durs = np.asarray(spans[:n + 1], dtype=np.float64)
    starts = np.concatenate([t_at, [end]]) - durs

    def at(q: int) -> float:
        p = int(np.searchsorted(op_id, q))
        if p < n and op_id[p] == q:  # a comm / wait op itself: the end of the span before it
            return float(t_at[p])
        return float(starts[p] + durs[p] * (q - first[p]) / max(int(stop[p] - first[p]), 1))
    return at


def _memory_counter(role: Any, sk: Any, spans: Any, t_at: Any, end: float, pid: int) -> list[dict]:
    """Counter events of ``role``'s memory over the iteration (empty without memory)."""
    mem = role.memory
    if mem is None:
        return []
    at = _op_time(np.asarray(sk.op_id, dtype=np.int64), sk.num_ops, spans,
                  np.asarray(t_at, dtype=np.float64), end)
    run = list(mem.baseline[:SLACK])
    gaps: dict[int, list] = {}
    for seg, cat, b in mem.gaps:
        gaps.setdefault(seg, []).append((cat, b))
    out: list[dict] = []

    def sample(t: float, values: Sequence[float]) -> None:
        out.append({"ph": "C", "name": "memory (GiB)", "pid": pid, "tid": 0, "ts": t * _US,
                    "args": {c: round(v / _GIB, 6) for c, v in zip(CATEGORIES, values)}})
    base = 0
    for j, seg in enumerate(role.program):
        n = len(role.blocks[seg.block])
        high, high_at = sum(run), list(run)
        for cat, b in gaps.get(j, []) + [(c, b) for _, c, b in mem.blocks.get(seg.block, ())]:
            if cat < SLACK:
                run[cat] += b
                if sum(run) > high:
                    high, high_at = sum(run), list(run)
        if n:
            sample(at(base), high_at)
            sample(at(base + n - 1), run)
        base += n
    return out


def write_timeline(result: Any, path: str | os.PathLike, *, ranks: Sequence[int] | None = None) -> None:
    """Write the Perfetto-loadable JSON of ``result`` to ``path`` (atomically, byte-stable)."""
    doc = {
        "traceEvents": timeline_events(result, ranks),
        "displayTimeUnit": "ms",
        "otherData": {
            "schema_version": TIMELINE_SCHEMA_VERSION,
            "generator": "heterosim replay",
            "cluster": result.cluster,
            "iteration_time_s": result.iteration_time_s,
        },
    }
    atomic_write_text(path, json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n")
