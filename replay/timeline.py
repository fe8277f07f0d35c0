"""Chrome / Perfetto trace JSON of a simulated iteration: one process per rank, one track per stream.

Format: the Trace Event Format's JSON object form (``{"traceEvents": [...]}``) with complete
events (``"ph": "X"``, microsecond ``ts`` / ``dur``) and metadata events naming processes and
threads; https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU and
Perfetto's legacy JSON importer. Per rank:

- track ``compute``: compute spans (the kernels between two comm/wait ops, merged) and the
  ``wait`` blocks where the compute stream waited for communication;
- one track per communication stream (``comm:<group>``, ``p2p:<group>:<peer>``): each collective
  or p2p from its start (all members issued it) to its end, named with the collective, NCCL's
  algorithm/protocol and its size.

Ranks of one class have identical timelines, so by default jobs over 64 ranks show one rank per
class (the first); pass ``ranks`` to choose.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from heterosim.atomic import atomic_write_text
from heterosim.errors import ConfigError

__all__ = ["TIMELINE_SCHEMA_VERSION", "timeline_events", "write_timeline"]

TIMELINE_SCHEMA_VERSION = 1
_US = 1e6


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
