"""What a simulation found: iteration time, throughput, MFU and where the time went.

Breakdown of one rank's iteration (its compute stream, which is what the step waits on):

- ``compute_s``: the compute stream was running kernels;
- ``exposed_comm_s[dim]``: it was blocked at a wait while the awaited transfer was moving data
  (the part of the block after the transfer started), by parallel dimension of the group, also
  split ``exposed_intra_node_s`` / ``exposed_inter_node_s``;
- ``bubble_s``: blocked on pipeline p2p before the transfer could start (the peer stage had not
  issued its side yet), plus the tail after its last op, for ranks in a pipeline;
- ``idle_s``: blocked before a non-pipeline transfer could start (waiting for slower members),
  plus the tail for ranks not in a pipeline.

The four add up to the iteration time for every rank (tested). MFU follows Megatron (Narayanan et
al., SC'21): model FLOPs per iteration (attention counted full, no recomputation) over iteration
time times the summed dense peak of every GPU for the trace's dtype.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from heterosim.atomic import atomic_write_text

from .expand import RankTimes

__all__ = ["RESULT_SCHEMA_VERSION", "Breakdown", "ClassSummary", "PathStep", "Result", "rank_breakdown"]

RESULT_SCHEMA_VERSION = 1

DIMS = ("tp", "dp", "pp", "cp", "ep", "world", "other")


@dataclass(frozen=True, slots=True, kw_only=True)
class Breakdown:
    """Seconds of one iteration by activity (see the module docstring)."""

    compute_s: float
    exposed_comm_s: Mapping[str, float]
    exposed_intra_node_s: float
    exposed_inter_node_s: float
    bubble_s: float
    idle_s: float

    @property
    def total_s(self) -> float:
        """Sum of all parts (equals the iteration time)."""
        return self.compute_s + sum(self.exposed_comm_s.values()) + self.bubble_s + self.idle_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "compute_s": self.compute_s,
            "exposed_comm_s": {d: self.exposed_comm_s.get(d, 0.0) for d in DIMS if d in self.exposed_comm_s},
            "exposed_intra_node_s": self.exposed_intra_node_s,
            "exposed_inter_node_s": self.exposed_inter_node_s,
            "bubble_s": self.bubble_s,
            "idle_s": self.idle_s,
        }

    @staticmethod
    def mean(parts: Sequence[tuple["Breakdown", int]]) -> "Breakdown":
        """Weighted mean of breakdowns (weights: rank counts)."""
        n = sum(k for _, k in parts)
        dims: dict[str, float] = {}
        for b, k in parts:
            for d, v in b.exposed_comm_s.items():
                dims[d] = dims.get(d, 0.0) + v * k / n
        return Breakdown(
            compute_s=sum(b.compute_s * k for b, k in parts) / n,
            exposed_comm_s=dict(sorted(dims.items())),
            exposed_intra_node_s=sum(b.exposed_intra_node_s * k for b, k in parts) / n,
            exposed_inter_node_s=sum(b.exposed_inter_node_s * k for b, k in parts) / n,
            bubble_s=sum(b.bubble_s * k for b, k in parts) / n,
            idle_s=sum(b.idle_s * k for b, k in parts) / n,
        )


def rank_breakdown(rt: RankTimes, iteration_s: float, in_pipeline: bool) -> Breakdown:
    """Breakdown of one rank from its engine times."""
    exposed: dict[str, float] = {}
    intra = inter = bubble = idle = blocked = 0.0
    for w in rt.waits:
        span = w.t_end - w.t_block
        comm = w.t_end - max(w.t_block, w.t_start)
        peer = span - comm
        blocked += span
        exposed[w.dim] = exposed.get(w.dim, 0.0) + comm
        if w.inter_node:
            inter += comm
        else:
            intra += comm
        if w.dim == "pp":
            bubble += peer
        else:
            idle += peer
    tail = max(iteration_s - rt.compute_s - blocked, 0.0)
    if in_pipeline:
        bubble += tail
    else:
        idle += tail
    return Breakdown(compute_s=rt.compute_s, exposed_comm_s=dict(sorted(exposed.items())),
                     exposed_intra_node_s=intra, exposed_inter_node_s=inter, bubble_s=bubble, idle_s=idle)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassSummary:
    """Ranks that behave identically (same role, GPU type and network situation)."""

    ranks: tuple[int, ...]
    gpu_type: str
    role: int
    finish_s: float
    breakdown: Breakdown
    phase_compute_s: Mapping[str, float]
    """Compute seconds of one of these ranks by phase (fwd, bwd, recompute, optimizer, ...)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PathStep:
    """One step of the critical path: what ``rank`` was doing from ``start_s`` to ``end_s``."""

    rank: int
    start_s: float
    end_s: float
    what: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """One simulated iteration. Writers: :meth:`to_json`, :meth:`write_timeline`, :meth:`write_plot`;
    tables: :meth:`to_dataframe`."""

    iteration_time_s: float
    world_size: int
    cluster: str
    gpu_counts: Mapping[str, int]
    model_flops: float
    tokens_per_iteration: float | None
    tokens_per_s: float | None
    tflops_per_gpu: float
    mfu: float
    dtype: str
    breakdown: Breakdown
    """Mean over ranks."""
    breakdown_by_gpu: Mapping[str, Breakdown]
    """Mean over the ranks of each GPU type (heterogeneous pools: who waits for whom)."""
    classes: tuple[ClassSummary, ...]
    critical_path: tuple[PathStep, ...]
    price_sources_s: Mapping[str, float]
    """Compute seconds (summed over every rank) by kernel_db source: measured, interpolated, ..."""
    options: Mapping[str, Any] = field(default_factory=dict)
    stats: Mapping[str, Any] = field(default_factory=dict)
    """Engine statistics: classes, restarts, network solves, wall time."""
    memory: tuple = ()
    """Per (role, GPU type): :class:`replay.memory.ClassMemory` (peak, what it is made of, what
    the GPU holds); empty when the trace has no memory recorded."""
    _run: Any = field(default=None, repr=False, compare=False)
    _workload: Any = field(default=None, repr=False, compare=False)

    @property
    def slowed_clocks(self) -> dict[str, Mapping[str, Any]]:
        """Per GPU type priced below its mean board's tensor clock (the slowest of its boards,
        ``replay.simulate.job_catalogue``): ``{"boards", "mean_board", "priced"}``."""
        return {t: c for t, c in self.stats.get("tensor_clock_ratio", {}).items() if c["priced"] != c["mean_board"]}

    @property
    def out_of_memory(self) -> tuple:
        """The :attr:`memory` entries whose ranks need more than their GPU has."""
        return tuple(m for m in self.memory if m.out_of_memory)

    def oom_message(self) -> str | None:
        """``out of memory on ranks ...: needs X GiB of Y`` (one clause per GPU shortfall), or None."""
        if not self.out_of_memory:
            return None
        return "out of memory on " + "; ".join(
            f"ranks {_ranges(m.ranks)} ({m.gpu_type}): needs {m.needed / 2**30:.1f} GiB of {m.capacity / 2**30:.1f}"
            for m in self.out_of_memory)

    def rank_breakdown(self, rank: int) -> Breakdown:
        """Breakdown of one rank."""
        for c in self.classes:
            if rank in c.ranks:
                return c.breakdown
        raise KeyError(f"rank {rank} is not in this result (world size {self.world_size})")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``schema_version`` first)."""
        return {
            "schema_version": RESULT_SCHEMA_VERSION,
            "iteration_time_s": self.iteration_time_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_iteration": self.tokens_per_iteration,
            "model_flops": self.model_flops,
            "dtype": self.dtype,
            "world_size": self.world_size,
            "cluster": self.cluster,
            "gpu_counts": dict(sorted(self.gpu_counts.items())),
            "breakdown": self.breakdown.to_dict(),
            "breakdown_by_gpu": {g: b.to_dict() for g, b in sorted(self.breakdown_by_gpu.items())},
            "classes": [
                {
                    "ranks": _ranges(c.ranks),
                    "num_ranks": len(c.ranks),
                    "gpu_type": c.gpu_type,
                    "role": c.role,
                    "finish_s": c.finish_s,
                    "breakdown": c.breakdown.to_dict(),
                    "phase_compute_s": dict(sorted(c.phase_compute_s.items())),
                }
                for c in self.classes
            ],
            "critical_path": [
                {"rank": s.rank, "start_s": s.start_s, "end_s": s.end_s, "what": s.what} for s in self.critical_path
            ],
            "price_sources_s": dict(sorted(self.price_sources_s.items())),
            "options": dict(sorted(self.options.items())),
            "stats": dict(sorted(self.stats.items())),
            **({"memory": {"out_of_memory": self.oom_message(),
                           "classes": [m.to_dict(_ranges) for m in self.memory]}} if self.memory else {}),
        }

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The result as one JSON object; also written atomically to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=1, sort_keys=False, allow_nan=False) + "\n"
        if path is not None:
            atomic_write_text(path, text)
        return text

    def write_timeline(self, path: str | os.PathLike, *, ranks: Sequence[int] | None = None) -> None:
        """Chrome / Perfetto trace JSON (see :mod:`replay.timeline`)."""
        from .timeline import write_timeline

        write_timeline(self, path, ranks=ranks)

    def to_dataframe(self, table: str = "classes", *, ranks: Sequence[int] | None = None) -> Any:
        """A pandas DataFrame of ``"classes"``, ``"ranks"`` or ``"ops"`` (per-op simulated times);
        see :mod:`replay.frames`."""
        from .frames import to_dataframe

        return to_dataframe(self, table, ranks=ranks)

    def write_plot(self, path: str | os.PathLike) -> None:
        """Breakdown chart and timeline picture as one PNG (see :mod:`replay.plots`)."""
        from .plots import write_plot

        write_plot(self, path)

    def summary(self) -> str:
        """A few human-readable lines."""
        b = self.breakdown
        comm = ", ".join(f"{d} {v * 1e3:.2f}" for d, v in b.exposed_comm_s.items()) or "none"
        tok = f"{self.tokens_per_s:,.0f} tokens/s, " if self.tokens_per_s else ""
        mem = "".join("\n" + m.line(_ranges) for m in self.memory)
        oom = self.oom_message()
        mem += f"\n  WARNING: {oom}" if oom else ""
        clocks = [f"{t} {c['priced']:.3f} (mean board {c['mean_board']:.3f}, slowest of {c['boards']:,})"
                  for t, c in self.slowed_clocks.items()]
        slow = f"\n  tensor clock / boost: {'; '.join(clocks)}" if clocks else ""
        return (
            f"{self.cluster}: {self.world_size} ranks, iteration {self.iteration_time_s * 1e3:.3f} ms\n"
            f"  {tok}{self.tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {self.mfu * 100:.1f}% ({self.dtype})\n"
            f"  mean per rank (ms): compute {b.compute_s * 1e3:.2f}, exposed comm [{comm}] "
            f"(intra {b.exposed_intra_node_s * 1e3:.2f}, inter {b.exposed_inter_node_s * 1e3:.2f}), "
            f"bubble {b.bubble_s * 1e3:.2f}, idle {b.idle_s * 1e3:.2f}" + slow + mem
        )


def _ranges(ranks: Sequence[int]) -> str:
    """``0-3,8-11`` for a sorted rank list."""
    out = []
    rs = sorted(ranks)
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(f"{rs[i]}-{rs[j]}" if j > i else f"{rs[i]}")
        i = j + 1
    return ",".join(out)
