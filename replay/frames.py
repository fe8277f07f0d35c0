"""A simulated iteration as pandas tables, for notebooks: classes, ranks, and per-op times.

``Result.to_dataframe(table)`` builds one of:

- ``"classes"``: one row per class of equivalent ranks (same role, GPU type and network
  situation) with its breakdown;
- ``"ranks"``: one row per rank (its class, role, GPU type, node and breakdown);
- ``"ops"``: one row per op of the chosen ranks (default: the first rank of each class) with its
  simulated start and end. Compute ops are the kernel_db prices of the rank's GPU type placed
  back to back before the next communication point, as the timeline draws them (an overlap
  slowdown stretches the gap between points, not the priced ops); collectives and p2p run from
  the moment all members issued them to their completion; a wait spans the time its compute
  stream was blocked (zero when the awaited transfer had finished).

Breakdown columns are seconds: ``compute_s``, ``exposed_<dim>_s`` per parallel dimension,
``exposed_intra_node_s``, ``exposed_inter_node_s``, ``bubble_s``, ``idle_s``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from heterosim.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TABLES", "to_dataframe"]

TABLES = ("classes", "ranks", "ops")

OP_COLUMNS = ("rank", "op_id", "kind", "name", "kernel_class", "phase", "mb", "chunk", "stream", "group",
              "bytes", "start_s", "end_s", "duration_s")


def _breakdown_row(b: Any, dims: Sequence[str]) -> dict[str, float]:
    row = {"compute_s": b.compute_s}
    row.update({f"exposed_{d}_s": b.exposed_comm_s.get(d, 0.0) for d in dims})
    row.update({"exposed_intra_node_s": b.exposed_intra_node_s, "exposed_inter_node_s": b.exposed_inter_node_s,
                "bubble_s": b.bubble_s, "idle_s": b.idle_s})
    return row


def _dims(result: Any) -> list[str]:
    return sorted({d for c in result.classes for d in c.breakdown.exposed_comm_s})


def _classes(result: Any) -> list[dict[str, Any]]:
    dims = _dims(result)
    return [{"class": i, "first_rank": min(c.ranks), "num_ranks": len(c.ranks), "gpu_type": c.gpu_type,
             "role": c.role, "finish_s": c.finish_s, **_breakdown_row(c.breakdown, dims)}
            for i, c in enumerate(result.classes)]


def _ranks(result: Any) -> list[dict[str, Any]]:
    dims = _dims(result)
    w = result._workload
    rows = []
    for i, c in enumerate(result.classes):
        bd = _breakdown_row(c.breakdown, dims)
        for r in c.ranks:
            rows.append({"rank": r, "class": i, "gpu_type": c.gpu_type, "role": c.role,
                         "node": int(w.node[r]) if w is not None else -1, "finish_s": c.finish_s, **bd})
    rows.sort(key=lambda row: row["rank"])
    return rows


def _rank_ops(result: Any, rank: int) -> list[dict[str, Any]]:
    """The op rows of one rank (see the module docstring)."""
    run, w = result._run, result._workload
    ci = run.class_of[rank]
    rt, t_at = run.times[ci], run.point_time[ci]
    role = w.trace.role_of(rank)
    gpu = w.gpu_type[rank]
    rows: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []

    def place(end: float) -> None:
        t = end - sum(row["duration_s"] for row in pending)
        for row in pending:
            row["start_s"], row["end_s"] = t, t + row["duration_s"]
            t = row["end_s"]
        rows.extend(pending)
        pending.clear()

    op_id = point = comm = wait = 0
    for seg in role.program:
        cols = role.blocks[seg.block].columns
        dur = w.block_durations(role.id, seg.block, gpu)
        for i, kind in enumerate(cols["kind"]):
            row = {"rank": rank, "op_id": op_id, "kind": kind, "name": cols["name"][i],
                   "kernel_class": cols["kernel_class"][i], "phase": cols["phase"][i], "mb": seg.mb,
                   "chunk": seg.chunk, "stream": cols["stream"][i], "group": cols["group"][i],
                   "bytes": int(cols["comm_bytes"][i]) if kind != "compute" else 0}
            op_id += 1
            if kind == "compute":
                row["duration_s"] = float(dur[i])
                pending.append(row)
                continue
            at = float(t_at[point]) if point < len(t_at) else rt.compute_s
            place(at)
            point += 1
            if kind == "wait":
                start = end = at
                if wait < len(rt.waits) and rt.waits[wait].t_block == at:
                    end = rt.waits[wait].t_end
                    wait += 1
            else:
                start, end = float(rt.comm_start[comm]), float(rt.comm_end[comm])
                comm += 1
            row.update(start_s=start, end_s=end, duration_s=end - start)
            rows.append(row)
    if pending:
        place(rt.compute_s + sum(x.t_end - x.t_block for x in rt.waits))
    return rows


def to_dataframe(result: Any, table: str = "classes", *, ranks: Sequence[int] | None = None) -> "pd.DataFrame":
    """One of :data:`TABLES` of ``result`` as a DataFrame (see the module docstring).

    ``ranks`` chooses the ranks of the ``ops`` table (default: the first rank of each class).
    """
    import pandas as pd

    if table not in TABLES:
        raise ConfigError(f"unknown table {table!r}; valid tables: {', '.join(TABLES)}")
    if table == "classes":
        return pd.DataFrame(_classes(result))
    if result._run is None or result._workload is None:
        raise ConfigError(f"the {table!r} table needs the engine run, which a Result loaded from JSON "
                          "does not carry; re-run simulate()")
    if table == "ranks":
        return pd.DataFrame(_ranks(result))
    chosen = sorted(min(c.ranks) for c in result.classes) if ranks is None else list(ranks)
    bad = [r for r in chosen if not 0 <= r < result.world_size]
    if bad:
        raise ConfigError(f"ranks {bad[:8]} are outside the world (0..{result.world_size - 1})")
    rows = [row for r in chosen for row in _rank_ops(result, r)]
    return pd.DataFrame(rows, columns=list(OP_COLUMNS))
