"""Pricing a whole trace, and rendering catalogue, DB and pricing summaries as text tables.

:func:`price_trace` is the library call behind ``python -m kernel_db price``: it prices every block
of every role once with :meth:`Pricer.price_block` and multiplies by the program's references, so a
role of 96 micro-batches costs as much to price as one. The ``format_*`` functions return strings;
only ``__main__`` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from heterosim.cluster.gpus import Catalogue

from .calibrate import CalibrationReport
from .db import KernelDB
from .pricing import Pricer

__all__ = ["OpCost", "TracePrice", "price_trace", "db_summary", "format_gpus", "format_db", "format_trace_price",
           "format_calibration"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OpCost:
    """Total time of one kernel (name + signature) over a role's program."""

    role: int
    name: str
    signature: str
    kernel_class: str
    count: int
    seconds: float
    """Summed over every occurrence in the program."""
    source: str
    rel_err: float


@dataclass(slots=True)
class TracePrice:
    """Compute time of each role on one GPU, by source, and the most expensive kernels."""

    gpu: str
    role_seconds: dict[int, float] = field(default_factory=dict)
    """Serial compute time of each role's program (comm/wait ops excluded), seconds."""
    by_source: dict[str, float] = field(default_factory=dict)
    """Seconds summed over all roles, by pricing source."""
    role_err_s: dict[int, float] = field(default_factory=dict)
    """1-sigma error of each role's total, seconds, treating kernels' errors as fully correlated."""
    ops: list[OpCost] = field(default_factory=list)
    """Every distinct kernel, most expensive first."""

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document."""
        total = sum(self.role_seconds.values())
        return {
            "gpu": self.gpu,
            "compute_seconds_per_role": {str(k): v for k, v in sorted(self.role_seconds.items())},
            "compute_err_seconds_per_role": {str(k): v for k, v in sorted(self.role_err_s.items())},
            "seconds_by_source": dict(sorted(self.by_source.items())),
            "fraction_by_source": {k: (v / total if total else 0.0) for k, v in sorted(self.by_source.items())},
        }


def price_trace(trace: Any, gpu: str, pricer: Pricer | None = None) -> TracePrice:
    """Price every role of ``trace`` on ``gpu`` (see the module docstring)."""
    pricer = pricer or Pricer()
    spec = pricer.gpu(gpu)
    out = TracePrice(gpu=spec.name)
    agg: dict[tuple[int, str, str], list] = {}
    for role in trace.roles:
        refs: dict[str, int] = {}
        for seg in role.program:
            refs[seg.block] = refs.get(seg.block, 0) + 1
        total = err = 0.0
        for bname, nref in refs.items():
            blk = role.blocks[bname]
            secs, srcs, errs = pricer.price_block(blk, spec)
            total += float(secs.sum()) * nref
            err += float((secs * errs).sum()) * nref
            c = blk.columns
            for i in np.flatnonzero(secs > 0):
                out.by_source[srcs[i]] = out.by_source.get(srcs[i], 0.0) + float(secs[i]) * nref
                key = (role.id, c["name"][i], c["signature"][i])
                a = agg.setdefault(key, [c["kernel_class"][i], 0, 0.0, srcs[i], float(errs[i])])
                a[1] += nref
                a[2] += float(secs[i]) * nref
        out.role_seconds[role.id] = total
        out.role_err_s[role.id] = err
    out.ops = sorted((OpCost(role=r, name=n, signature=s, kernel_class=a[0], count=a[1], seconds=a[2], source=a[3],
                             rel_err=a[4]) for (r, n, s), a in agg.items()), key=lambda o: (-o.seconds, o.role, o.signature))
    return out


def _table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header] + [[str(x) for x in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_gpus(cat: Catalogue) -> str:
    """The catalogue as a table (dense TFLOP/s, memory in TB/s and GiB; the sustained tensor clock
    under the power cap as a fraction of boost, and its board-to-board spread)."""
    rows = [[g.name, g.vendor, g.compute_capability or g.arch, f"{g.peak_flops['fp32'] / 1e12:.1f}",
             f"{g.peak_flops['tf32'] / 1e12:.1f}", f"{g.peak_flops['bf16'] / 1e12:.1f}", f"{g.peak_flops['fp8'] / 1e12:.1f}",
             f"{g.hbm_bw / 1e12:.2f}", f"{g.hbm_bytes / 2**30:.0f}", g.sm_count, f"{g.l2_bytes / 2**20:.0f}",
             f"{g.nvlink_bw / 1e9:.0f}", f"{g.power_clock_ratio:.3f}", f"{g.board_spread * 100:.1f}%"] for g in cat.gpus]
    return _table(["gpu", "vendor", "cc", "fp32_TF", "tf32_TF", "bf16_TF", "fp8_TF", "hbm_TBps", "mem_GiB", "SMs",
                   "L2_MiB", "nvlink_GBps/dir", "clock", "spread"], rows)


def db_summary(db: KernelDB) -> list[dict[str, Any]]:
    """Row counts by GPU, kernel class and how the rows were produced."""
    acc: dict[tuple[str, str, str], int] = {}
    for r in db.rows:
        src = r.provenance.split(" ", 1)[0] if r.provenance else "unknown"
        acc[(r.gpu, src, r.kernel_class)] = acc.get((r.gpu, src, r.kernel_class), 0) + 1
    return [{"gpu": g, "source": s, "kernel_class": k, "rows": n} for (g, s, k), n in sorted(acc.items())]


def format_db(db: KernelDB) -> str:
    """What the DB holds, by GPU, source and kernel class."""
    summary = db_summary(db)
    if not summary:
        return f"{db.path or 'kernel DB'}: empty (fill it with: python -m kernel_db profile TRACE --db {db.path or 'DB'})"
    return f"{db.path}: {len(db)} rows\n" + _table(["gpu", "source", "kernel_class", "rows"],
                                                   [[d["gpu"], d["source"], d["kernel_class"], d["rows"]] for d in summary])


def format_trace_price(tp: TracePrice, top: int = 20) -> str:
    """Totals per role and source, then the ``top`` most expensive kernels."""
    total = sum(tp.role_seconds.values())
    lines = [f"GPU {tp.gpu}: compute time per role (serial, comm excluded)"]
    lines.append(_table(["role", "compute_ms", "+-ms"],
                        [[r, f"{s * 1e3:.3f}", f"{tp.role_err_s[r] * 1e3:.3f}"] for r, s in sorted(tp.role_seconds.items())]))
    lines.append("")
    lines.append(_table(["source", "ms", "share"], [[k, f"{v * 1e3:.3f}", f"{(v / total if total else 0):.1%}"]
                                                   for k, v in sorted(tp.by_source.items(), key=lambda kv: -kv[1])]))
    lines.append("")
    lines.append(_table(["role", "kernel_class", "op", "count", "total_ms", "source", "rel_err", "signature"],
                        [[o.role, o.kernel_class, o.name, o.count, f"{o.seconds * 1e3:.3f}", o.source, f"{o.rel_err:.2f}",
                          o.signature[:70]] for o in tp.ops[:top]]))
    return "\n".join(lines)


def format_calibration(rep: CalibrationReport) -> str:
    """Fitted parameters with prior and cross-validated error, then per-pair scaling error."""
    if not rep.fits:
        return "no measured rows with FLOPs or bytes to calibrate from"
    lines = [_table(["gpu", "kernel_class", "rows", "prior_err", "cv_err", "fitted"],
                    [[f.gpu, f.kernel_class, f.n, f"{f.prior_err:.1%}", f"{f.cv_err:.1%}", f.params] for f in rep.fits])]
    if rep.pairs:
        lines += ["", "scaling from one GPU's measurements to another's (held out by construction):",
                  _table(["from", "to", "kernel_class", "kernels", "mean_err", "max_err"],
                         [[p.src, p.dst, p.kernel_class, p.n, f"{p.mean_err:.1%}", f"{p.max_err:.1%}"] for p in rep.pairs])]
    return "\n".join(lines)
