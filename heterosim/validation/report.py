"""Results of ``replay validate``: each case's comparisons, and the report over a file (MAPE and
worst case per category, the fp8 / 16-bit time ratios, the text and Markdown tables, the
JSON document and the predicted-vs-measured plot).

Only formatting and arithmetic over results: running cases is :mod:`heterosim.validation.validate`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Comparison", "CaseResult", "Report", "SCHEMA_VERSION", "FP8_FLAGS"]

SCHEMA_VERSION = 1
"""Of the report's JSON document (``Report.to_json``)."""
_PRIMARY = ("iteration_time_s", "busbw_GBps")
"""The metrics MAPE is taken over: an end-to-end case's iteration time, a collective's busbw."""


def _signed_pct(x: float) -> str:
    """``+1.2%`` / ``-3.4%``; an error that rounds to zero prints ``+0.0%``, never ``-0.0%``."""
    text = f"{x:+.1%}"
    return "+0.0%" if text == "-0.0%" else text


FP8_FLAGS = {"--fp8-format": 1, "--fp8-recipe": 1, "--fp8-param-gather": 0, "--tp-comm-overlap-fp8-buf": 1,
             "--fp4-format": 1, "--fp4-recipe": 1, "--model.converters": 1, "--quantize.linear.float8.recipe_name": 1}
"""Flags an fp8 or fp4 run has and its 16-bit twin lacks (flag -> values after it): what
:meth:`Report.fp8_pairs` ignores when it pairs them."""


def _precision_kind(flags: Any) -> str:
    """``fp8``, ``fp4`` or ``16`` (bf16 / fp16 GEMMs) for a case's flags (Megatron's, or torchtitan's
    Float8 converter, :mod:`heterosim.validation.titan`)."""
    if "--fp8-format" in flags or "quantize.linear.float8" in flags:
        return "fp8"
    return "fp4" if "--fp4-format" in flags else "16"


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """One predicted vs measured number. ``error`` = predicted / measured - 1 (signed)."""

    metric: str
    measured: float
    predicted: float
    error: float
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseResult:
    """The outcome of one case. ``status``: ok, missing_feature (``message`` names it) or error."""

    id: str
    category: str
    status: str
    comparisons: tuple[Comparison, ...] = ()
    assumptions: tuple[str, ...] = ()
    message: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def primary(self) -> Comparison | None:
        """The first comparison MAPE uses: iteration time (end to end) or a busbw figure."""
        for c in self.comparisons:
            if c.metric in _PRIMARY and "approximate" not in c.note:
                return c
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """All case results, with MAPE and worst case per category."""

    cases: tuple[CaseResult, ...]

    def errors(self, category: str) -> list[tuple[str, float]]:
        """(case id, signed error) of every primary comparison: each case's iteration time, each
        busbw figure of a collective case; approximate published values ("~200") excluded."""
        return [(r.id, c.error) for r in self.cases if r.category == category and r.status == "ok"
                for c in r.comparisons
                if c.metric in _PRIMARY and "approximate" not in c.note]

    def mape(self, category: str) -> float | None:
        """Mean |error| of the primary metric over the category's ok cases (None if none)."""
        errs = self.errors(category)
        return sum(abs(e) for _, e in errs) / len(errs) if errs else None

    def worst(self, category: str) -> tuple[str, float] | None:
        errs = self.errors(category)
        return max(errs, key=lambda x: abs(x[1])) if errs else None

    def summary_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for cat in sorted({r.category for r in self.cases}):
            w = self.worst(cat)
            out[cat] = {"cases": sum(r.category == cat for r in self.cases),
                        "compared": len(self.errors(cat)),
                        "compared_cases": len({i for i, _ in self.errors(cat)}), "mape": self.mape(cat),
                        "worst": {"id": w[0], "error": w[1]} if w else None}
        return out

    def fp8_pairs(self) -> list[dict[str, Any]]:
        """fp8 (or fp4) and 16-bit runs of one configuration (flags equal but for the low-precision
        ones, :data:`FP8_FLAGS`): the measured and predicted low-precision / 16-bit iteration-time
        ratios, in the file order of the low-precision runs (the ``fp8`` field names either)."""
        runs: dict[tuple, dict[str, CaseResult]] = {}
        for r in self.cases:
            p = r.primary
            if r.status != "ok" or p is None or p.metric != "iteration_time_s" or "flags" not in r.detail:
                continue
            f = list(r.detail["flags"])
            kind = _precision_kind(f)
            for flag, values in FP8_FLAGS.items():
                if flag in f:
                    i = f.index(flag)
                    del f[i:i + 1 + values]
            runs.setdefault((r.detail["world_size"], *f), {})[kind] = r
        out = []
        for pair in runs.values():
            for kind in ("fp8", "fp4"):
                if kind in pair and "16" in pair:
                    a, b = pair[kind].primary, pair["16"].primary
                    meas, pred = a.measured / b.measured, a.predicted / b.predicted
                    out.append({"fp8": pair[kind].id, "bf16": pair["16"].id, "measured": meas, "predicted": pred,
                                "error": pred / meas - 1})
        order = {r.id: i for i, r in enumerate(self.cases)}
        return sorted(out, key=lambda x: order[x["fp8"]])

    def to_json(self) -> str:
        """One JSON object (sorted keys): byte-identical for identical inputs."""
        doc = {"schema_version": SCHEMA_VERSION, "summary": self.summary_dict(),
               "cases": [asdict(r) for r in self.cases]}
        if self.fp8_pairs():
            doc["fp8_pairs"] = self.fp8_pairs()
        return json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n"

    def table(self, *, markdown: bool = False) -> str:
        """Predicted vs measured, one row per comparison (``markdown``: iteration time and busbw
        only), then MAPE and worst case per category."""
        head = ("case", "metric", "measured", "predicted", "error")
        rows = []
        for r in self.cases:
            if r.status != "ok":
                rows.append((r.id, r.status, "-", "-", r.message))
            for c in r.comparisons:
                if markdown and c.metric not in _PRIMARY:
                    continue  # the README keeps one row per figure: TF/s error follows from time
                rows.append((r.id, c.metric + (" ~" if "approximate" in c.note else ""), f"{c.measured:.4g}",
                             f"{c.predicted:.4g}", _signed_pct(c.error)))
        lines = []
        if markdown:
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "---|" * len(head))
            lines += ["| " + " | ".join(row) + " |" for row in rows]
        else:
            w = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]

            def fmt(row: tuple[str, ...]) -> str:
                return "  ".join(s.ljust(w[i]) if i < 2 else s.rjust(w[i]) for i, s in enumerate(row))

            lines.append(fmt(head))
            lines += [fmt(row) if len(row[4]) < 40 else fmt(row[:4] + ("",)) + "  " + row[4] for row in rows]
        lines.append("")
        for cat, s in self.summary_dict().items():
            if s["mape"] is None:
                lines.append(f"{cat}: no case compared ({s['cases']} cases)")
                continue
            lines.append(f"{cat}: MAPE {s['mape']:.1%} over {s['compared']} figures of {s['compared_cases']} of "
                         f"{s['cases']} cases; "
                         f"worst {s['worst']['id']} {_signed_pct(s['worst']['error'])}")
        return "\n".join(lines + self._precision_lines(markdown))

    def _precision_lines(self, markdown: bool) -> list[str]:
        """Iteration-time MAPE of the 16-bit, fp8 and fp4 runs apart, and the low-precision / 16-bit pairs."""
        pairs = self.fp8_pairs()
        if not pairs:
            return []
        lines = [""]
        for name, kind in (("16-bit", "16"), ("fp8", "fp8"), ("fp4", "fp4")):
            errs = [(r.id, r.primary.error) for r in self.cases if r.status == "ok" and r.primary is not None
                    and r.primary.metric == "iteration_time_s" and _precision_kind(r.detail.get("flags", ())) == kind]
            if errs:
                w = max(errs, key=lambda x: abs(x[1]))
                lines.append(f"{name} runs: MAPE {sum(abs(e) for _, e in errs) / len(errs):.1%} over {len(errs)}; "
                             f"worst {w[0]} {_signed_pct(w[1])}")
        lines.append("")
        head = ("fp8 run", "16-bit run", "measured ratio", "predicted ratio", "error")
        rows = [(p["fp8"], p["bf16"], f"{p['measured']:.3f}", f"{p['predicted']:.3f}", _signed_pct(p["error"]))
                for p in pairs]
        if markdown:
            lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(row) + " |" for row in rows]
        else:
            w = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
            lines += ["  ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i]) for i, c in enumerate(row))
                      for row in (head, *rows)]
        worst = max(pairs, key=lambda p: abs(p["error"]))
        lines.append(f"fp8/16-bit time ratio: mean |error| {sum(abs(p['error']) for p in pairs) / len(pairs):.1%} "
                     f"over {len(pairs)} pairs; worst {worst['fp8']} {_signed_pct(worst['error'])}")
        return lines

    def assumptions_text(self) -> str:
        """The defaults and assumptions each case used (what 'not stated' became)."""
        out = []
        for r in self.cases:
            if r.assumptions:
                out.append(f"{r.id}:")
                out += [f"  - {a}" for a in r.assumptions]
        return "\n".join(out)

    def write_plot(self, path: str | os.PathLike) -> None:
        """Predicted vs measured (log-log) for the primary metric of every compared case."""
        import matplotlib

        matplotlib.use("Agg")
        import io

        import matplotlib.pyplot as plt

        from heterosim.atomic import atomic_write_bytes

        cats = sorted({r.category for r in self.cases})
        fig, axes = plt.subplots(1, len(cats), figsize=(5 * len(cats), 4.5), squeeze=False)
        for ax, cat in zip(axes[0], cats):
            pts = [(r.id, c) for r in self.cases if r.category == cat and r.status == "ok"
                   for c in r.comparisons if c.metric in _PRIMARY and "approximate" not in c.note]
            if not pts:
                ax.set_visible(False)
                continue
            xs = [p.measured for _, p in pts]
            ys = [p.predicted for _, p in pts]
            lo, hi = min(xs + ys) * 0.8, max(xs + ys) * 1.25
            ax.plot([lo, hi], [lo, hi], color="#888", lw=1)
            ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="#ddd", label="±10%")
            ax.scatter(xs, ys, s=18, color="#4c72b0")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(f"measured {pts[0][1].metric}")
            ax.set_ylabel(f"predicted {pts[0][1].metric}")
            ax.set_title(f"{cat}: MAPE {self.mape(cat):.1%}")
            ax.legend(loc="upper left")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
        plt.close(fig)
        atomic_write_bytes(path, buf.getvalue())
