"""Calibration: fit the roofline efficiency curves to measured rows, with k-fold cross-validation.

For each GPU and kernel class with measured rows, the parameters that scale a class's efficiency
are refit so that the roofline tier reproduces the measurements:

- ``gemm``: ``eff_max`` (closed form: the roofline time above the launch overhead is
  ``C / eff_max`` for compute-bound rows, so ``log eff_max`` is the mean of ``log(C / (t - L))``),
  with ``k_half`` chosen from a grid by training error;
- ``attention``: ``eff_max_fwd`` and ``eff_max_bwd`` (same closed form per direction);
- memory-bound classes: ``mem_factor[class]`` (same closed form on the memory term).

Error is reported as the mean absolute relative error of held-out rows over ``k`` folds (rows
assigned to folds round-robin in key order, so results are deterministic), next to the error of the
uncalibrated curves on the same rows. For scaling, every ordered pair of GPUs that measured the same
kernels is checked: scale one GPU's measurement to the other (:func:`kernel_db.pricing.scale_time`)
and compare with the other's measurement -- a held-out check with no fitted parameter.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from heterosim.cluster.gpus import Catalogue, GpuSpec, load_catalogue

from .db import KernelDB, KernelRow
from .pricing import scale_time
from .roofline import MEMORY_CLASSES, EfficiencyModel, load_efficiency, roofline_time

__all__ = ["FitResult", "PairResult", "CalibrationReport", "calibrate"]

_K_HALF_GRID = (32, 64, 128, 256, 512)


@dataclass(frozen=True, slots=True, kw_only=True)
class FitResult:
    """Calibration of one kernel class on one GPU."""

    gpu: str
    kernel_class: str
    n: int
    """Measured rows used."""
    params: Mapping[str, Any]
    """Fitted parameters (the override written under ``gpu.<name>.<section>``)."""
    prior_err: float
    """Mean |predicted / measured - 1| of the uncalibrated curves on these rows."""
    cv_err: float
    """Same, k-fold cross-validated, for the fitted curves (NaN if too few rows to fold)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PairResult:
    """Scaling check from one GPU's measurements to another's."""

    src: str
    dst: str
    kernel_class: str
    n: int
    mean_err: float
    """Mean |scaled / measured - 1|."""
    max_err: float
    """Largest |scaled / measured - 1|."""


@dataclass(slots=True)
class CalibrationReport:
    """All fits and pair checks, and the efficiency document with the fitted overrides."""

    fits: list[FitResult] = field(default_factory=list)
    pairs: list[PairResult] = field(default_factory=list)
    efficiency_doc: dict = field(default_factory=dict)


def _section(kc: str) -> str:
    return kc if kc in ("gemm", "attention") else "memory"


def _with(params: Mapping[str, Any], kc: str, fitted: Mapping[str, Any]) -> dict:
    p = copy.deepcopy(dict(params))
    sect = _section(kc)
    if sect == "memory":
        p["memory"]["mem_factor"] = {**p["memory"]["mem_factor"], **fitted.get("mem_factor", {})}
    else:
        p[sect] = {**p[sect], **fitted}
    return p


# Profiled rows are boost-clock times (kernel_db profile idles the GPU before each timed call), so
# the curves are fitted, and GPUs compared, at boost (clock ratio 1); pricing applies the sustained
# clock on top (kernel_db.pricing.sustained).
def _predict(rows: Sequence[KernelRow], gpu: GpuSpec, params: Mapping[str, Any]) -> list[float]:
    return [roofline_time(r.kernel_class, r.dtype, r.dims_dict(), r.flops, r.bytes, gpu, params,
                          clock_ratio=1.0).seconds for r in rows]


def _err(pred: Sequence[float], rows: Sequence[KernelRow]) -> float:
    return sum(abs(p / r.estimate_s - 1) for p, r in zip(pred, rows)) / len(rows) if rows else float("nan")


def _fit_scale(rows: Sequence[KernelRow], gpu: GpuSpec, params: Mapping[str, Any], current: float, term: str) -> float:
    # Closed form in log space: each row's (t - L) is term_time(current) * current / new.
    logs = []
    for r in rows:
        rt = roofline_time(r.kernel_class, r.dtype, r.dims_dict(), r.flops, r.bytes, gpu, params, clock_ratio=1.0)
        body = r.estimate_s - gpu.launch_overhead_s
        part = rt.compute_s if term == "compute" else rt.memory_s
        # NB: rows whose time is mostly launch overhead say nothing about this term; skip them.
        if body > 0 and part >= gpu.launch_overhead_s and rt.bound == term:
            logs.append(math.log(part * current / body))
    if not logs:
        return current
    return min(1.0, max(0.01, math.exp(sum(logs) / len(logs))))


def _fit(rows: Sequence[KernelRow], gpu: GpuSpec, params: Mapping[str, Any], kc: str) -> dict:
    if kc == "gemm":
        best: tuple[float, dict] | None = None
        for kh in _K_HALF_GRID:
            p = _with(params, kc, {"k_half": kh})
            eff = _fit_scale(rows, gpu, p, float(p["gemm"]["eff_max"]), "compute")
            fitted = {"k_half": kh, "eff_max": round(eff, 4)}
            e = _err(_predict(rows, gpu, _with(params, kc, fitted)), rows)
            if best is None or e < best[0]:
                best = (e, fitted)
        return best[1] if best else {}
    if kc == "attention":
        out: dict[str, float] = {}
        for direction in ("fwd", "bwd"):
            sub = [r for r in rows if r.dims_dict().get("dir", "fwd") == direction]
            if sub:
                key = f"eff_max_{direction}"
                out[key] = round(_fit_scale(sub, gpu, params, float(params["attention"][key]), "compute"), 4)
        return out
    cur = float(params["memory"]["mem_factor"].get(kc, 1.0))
    return {"mem_factor": {kc: round(_fit_scale(rows, gpu, params, cur, "memory"), 4)}}


def calibrate(db: KernelDB, *, catalogue: Catalogue | None = None, efficiency: EfficiencyModel | None = None,
              k: int = 5) -> CalibrationReport:
    """Fit efficiency curves per (GPU, kernel class) and check scaling per GPU pair (module docstring)."""
    cat = catalogue or load_catalogue()
    eff = efficiency or load_efficiency()
    report = CalibrationReport()
    doc = eff.to_doc()
    overrides: dict[str, dict] = copy.deepcopy(dict(doc.get("gpu", {})))
    groups: dict[tuple[str, str], list[KernelRow]] = {}
    for r in sorted(db.rows, key=lambda r: r.key):
        if r.kernel_class in ("gemm", "attention", *MEMORY_CLASSES) and (r.flops > 0 or r.bytes > 0):
            groups.setdefault((r.gpu, r.kernel_class), []).append(r)
    for (gname, kc), rows in sorted(groups.items()):
        try:
            gpu = cat.get(gname)
        except KeyError:
            continue
        params = eff.params(gpu)
        fitted = _fit(rows, gpu, params, kc)
        prior = _err(_predict(rows, gpu, params), rows)
        folds = min(k, len(rows))
        cv = float("nan")
        if folds >= 2:
            errs = []
            for f in range(folds):
                train = [r for i, r in enumerate(rows) if i % folds != f]
                test = [r for i, r in enumerate(rows) if i % folds == f]
                pf = _with(params, kc, _fit(train, gpu, params, kc))
                errs.extend(abs(p / r.estimate_s - 1) for p, r in zip(_predict(test, gpu, pf), test))
            cv = sum(errs) / len(errs)
        report.fits.append(FitResult(gpu=gname, kernel_class=kc, n=len(rows), params=fitted, prior_err=prior, cv_err=cv))
        sect = _section(kc)
        g_over = overrides.setdefault(gname, {})
        if sect == "memory":
            g_over.setdefault("memory", {}).setdefault("mem_factor", {}).update(fitted.get("mem_factor", {}))
        else:
            g_over.setdefault(sect, {}).update(fitted)
    doc["gpu"] = overrides
    report.efficiency_doc = doc
    report.pairs = _pairs(db, cat)
    return report


def _pairs(db: KernelDB, cat: Catalogue) -> list[PairResult]:
    by_kernel: dict[tuple, dict[str, KernelRow]] = {}
    for r in db.rows:
        by_kernel.setdefault((r.kernel_class, r.signature, r.dtype, r.dims), {})[r.gpu] = r
    acc: dict[tuple[str, str, str], list[float]] = {}
    for (kc, _, dtype, _), per_gpu in by_kernel.items():
        names = sorted(per_gpu)
        for a in names:
            for b in names:
                if a == b:
                    continue
                try:
                    ga, gb = cat.get(a), cat.get(b)
                except KeyError:
                    continue
                if not (ga.is_gpu and gb.is_gpu):
                    continue
                ra, rb = per_gpu[a], per_gpu[b]
                pred = scale_time(ra.estimate_s, kc, dtype, ra.flops, ra.bytes, ga.at_boost(), gb.at_boost())
                acc.setdefault((a, b, kc), []).append(abs(pred / rb.estimate_s - 1))
    return [PairResult(src=a, dst=b, kernel_class=kc, n=len(v), mean_err=sum(v) / len(v), max_err=max(v))
            for (a, b, kc), v in sorted(acc.items())]
