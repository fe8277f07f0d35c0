"""Pictures of a simulated iteration (matplotlib, imported lazily, Agg backend: no display needed).

One PNG with two or three panels:

1. where the time goes: a stacked bar per class of ranks (or per GPU type when there are many
   classes): compute, exposed communication per parallel dimension, pipeline bubble, idle;
2. the timeline of one rank per class: compute spans, blocking waits, and the communication
   in flight (thin bar underneath);
3. (traces with memory recorded) memory per role and GPU type at its peak: parameters,
   gradients, optimizer state, activations, other, the allocator's reserve, CUDA context and
   NCCL buffers, against the GPU's capacity (a black tick; red bars are out of memory).
"""

from __future__ import annotations

import io
import os
from typing import Any

from heterosim.atomic import atomic_write_bytes

__all__ = ["write_plot"]

_COLORS = {"compute": "#4c72b0", "tp": "#dd8452", "dp": "#55a868", "pp": "#c44e52", "cp": "#8172b3",
           "ep": "#937860", "world": "#da8bc3", "other": "#8c8c8c", "bubble": "#ccb974", "idle": "#e5e5e5"}
_MAX_ROWS = 16


def _rows(result: Any) -> list[tuple[str, Any]]:
    if len(result.classes) <= _MAX_ROWS:
        return [(f"ranks {_short(c.ranks)} {c.gpu_type}", c.breakdown) for c in result.classes]
    return [(f"all {g}", b) for g, b in result.breakdown_by_gpu.items()]


def _short(ranks: tuple[int, ...]) -> str:
    return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}..({len(ranks)})"


_MEM_COLORS = {"parameters": "#4c72b0", "gradients": "#55a868", "optimizer": "#8172b3",
               "activations": "#dd8452", "other": "#8c8c8c", "allocator reserve": "#ccb974",
               "CUDA context": "#937860", "NCCL buffers": "#da8bc3"}


def _memory_panel(ax: Any, mem: list) -> None:
    gib = float(1 << 30)
    for i, m in enumerate(mem):
        parts = list(m.peak.at_peak.items()) + [
            ("allocator reserve", m.peak.reserved - m.peak.allocated), ("CUDA context", m.cuda_context),
            ("NCCL buffers", m.nccl_buffers)]
        left = 0.0
        for name, v in parts:
            ax.barh(i, v / gib, left=left, color=_MEM_COLORS.get(name, "#999999"), edgecolor="red" if
                    m.out_of_memory else "none", label=name if i == 0 else None)
            left += v / gib
        ax.plot([m.capacity / gib] * 2, [i - 0.45, i + 0.45], color="black", linewidth=2,
                label="GPU memory" if i == 0 else None)
    ax.set_yticks(range(len(mem)), [f"role {m.role} {_short(m.ranks)} {m.gpu_type}" for m in mem], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GiB at the peak (per GPU)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=6, ncol=2)


def write_plot(result: Any, path: str | os.PathLike) -> None:
    """Render the breakdown and timeline panels of ``result`` into the PNG ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = _rows(result)
    mem = list(result.memory)[:_MAX_ROWS]
    heights = [max(len(rows), 1), max(min(len(result.classes), _MAX_ROWS), 1)] + ([len(mem)] if mem else [])
    fig, axes = plt.subplots(len(heights), 1, figsize=(11, 3 + 0.45 * sum(heights)),
                             gridspec_kw={"height_ratios": heights})
    ax1, ax2 = axes[0], axes[1]
    ms = 1e3
    dims = sorted({d for _, b in rows for d in b.exposed_comm_s})
    for i, (label, b) in enumerate(rows):
        left = 0.0
        parts = [("compute", b.compute_s)] + [(d, b.exposed_comm_s.get(d, 0.0)) for d in dims] + \
                [("bubble", b.bubble_s), ("idle", b.idle_s)]
        for name, v in parts:
            ax1.barh(i, v * ms, left=left, color=_COLORS.get(name, "#999999"),
                     label=name if i == 0 else None, edgecolor="none")
            left += v * ms
    ax1.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax1.invert_yaxis()
    ax1.set_xlabel("ms per iteration")
    ax1.set_title(f"{result.cluster}: {result.world_size} ranks, iteration {result.iteration_time_s * ms:.2f} ms, "
                  f"MFU {result.mfu * 100:.1f}%", fontsize=10)
    ax1.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)

    run = result._run
    reps = [c.ranks[0] for c in result.classes][:_MAX_ROWS]
    if run is not None:
        from .timeline import timeline_events

        ev = timeline_events(result, reps)
        y = {r: i for i, r in enumerate(reps)}
        for kind, color, h, off in (("compute", _COLORS["compute"], 0.5, -0.3), ("wait", _COLORS["idle"], 0.5, -0.3),
                                    ("comm", _COLORS["tp"], 0.2, 0.25)):
            by_rank: dict[int, list] = {}
            for e in ev:
                if e.get("ph") == "X" and e.get("cat") == kind:
                    by_rank.setdefault(e["pid"], []).append((e["ts"] / 1e3, max(e["dur"] / 1e3, 1e-6)))
            for r, bars in by_rank.items():
                ax2.broken_barh(bars, (y[r] + off, h), facecolors=color, edgecolor="none",
                                label=kind if r == reps[0] else None)
        ax2.set_yticks(range(len(reps)), [f"rank {r}" for r in reps], fontsize=8)
        ax2.invert_yaxis()
        ax2.set_xlabel("ms")
        ax2.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    if mem:
        _memory_panel(axes[2], mem)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
