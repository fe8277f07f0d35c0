"""Published nccl-tests sweeps, and ncclshim's prediction beside each size.

The sweeps are data (``ncclshim/data/nccl_tests_h100.yaml``, ``schema_version`` 1): each names its
source, the cluster preset that describes its hardware, the group (nodes, ranks), the collective,
the dtype, the NCCL environment it ran with, and per size the times nccl-tests printed (one per
host or run; the mean is the measurement), or the busbw a source published (``measure:
busbw_GBps``, turned into a time with nccl-tests' factor). ``points`` are single published
figures (a busbw at one size). :func:`compare` plans every size as the sweep ran it and reports
the error of ``Plan.time_s`` and of NCCL's own estimate (``Plan.nccl_time_s``, what ``time_s``
was before ncclshim modelled how NVLS runs). ``python -m ncclshim sweeps`` prints both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping

from heterosim.errors import ConfigError
from heterosim.yamlfile import read_yaml
from ncclshim.algorithms.sharp import nvls_stream
from ncclshim.planner import Planner, busbw_factor
from ncclshim.view import preset_view

__all__ = ["SCHEMA_VERSION", "Catalog", "Sweep", "SweepRow", "Point", "load", "compare", "point_busbw",
           "format_rows", "format_points", "fit_nvls", "FIT_MIN_BYTES", "DEFAULT_FILE"]

SCHEMA_VERSION = 1
DEFAULT_FILE = "nccl_tests_h100.yaml"
"""The sweeps shipped with ncclshim (``ncclshim/data/``)."""
FIT_MIN_BYTES = 2 << 20
"""Smallest size :func:`fit_nvls` uses: 1 MiB takes 42 us in both NVLS sweeps and in the Together
ring sweep alike (a floor of their one-process ``-g 8`` harness, which NVIDIA's one-process-per-GPU
sweep does not have: 27 us there), so it measures the harness, not NVLS."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sweep:
    """One published sweep."""

    id: str
    url: str
    cluster: str
    nodes: int
    ranks: int
    op: str
    dtype: str
    env: Mapping[str, str]
    rows: tuple[tuple[int, float], ...]
    """(size in bytes, measured time in us: the mean over hosts / runs)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """One published figure: the busbw (GB/s) a source states for one size and group."""

    id: str
    url: str
    cluster: str
    nodes: int
    ranks: int
    op: str
    env: Mapping[str, str]
    size_bytes: int
    busbw_GBps: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalog:
    """A sweeps file: the tolerance its checks use, its sweeps and its single figures."""

    tolerance_pct: float
    sweeps: tuple[Sweep, ...]
    points: tuple[Point, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepRow:
    """One size: measured, predicted, NCCL's estimate (us) and the errors (predicted / measured - 1)."""

    size_bytes: int
    measured_us: float
    predicted_us: float
    nccl_estimate_us: float
    algo: str
    proto: str

    @property
    def error(self) -> float:
        return self.predicted_us / self.measured_us - 1

    @property
    def nccl_error(self) -> float:
        return self.nccl_estimate_us / self.measured_us - 1


def _sweep(raw: Any, where: str) -> Sweep:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a sweep is a mapping, got {type(raw).__name__}")
    need = ("id", "source", "cluster", "nodes", "ranks", "op", "dtype", "rows")
    missing = [k for k in need if k not in raw]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}; a sweep needs {', '.join(need)}")
    measure = raw.get("measure", "time_us")
    if measure not in ("time_us", "busbw_GBps"):
        raise ConfigError(f"{where}.measure: {measure!r} is not time_us or busbw_GBps")
    factor = busbw_factor(str(raw["op"]), int(raw["ranks"]))
    rows = []
    for size, values in raw["rows"].items():
        vals = values if isinstance(values, list) else [values]
        if not vals or not all(isinstance(t, (int, float)) and t > 0 for t in vals):
            raise ConfigError(f"{where}.rows[{size}]: values must be positive numbers ({measure}), got {values!r}")
        mean = sum(vals) / len(vals)
        # nccl-tests: busbw = algbw x factor and algbw = size / time (GB/s = B/ns = 1e-3 B/us)
        rows.append((int(size), mean if measure == "time_us" else int(size) * factor / (mean * 1e3)))
    return Sweep(id=str(raw["id"]), url=str(raw["source"].get("url", "")), cluster=str(raw["cluster"]),
                 nodes=int(raw["nodes"]), ranks=int(raw["ranks"]), op=str(raw["op"]), dtype=str(raw["dtype"]),
                 env={str(k): str(v) for k, v in (raw.get("env") or {}).items()}, rows=tuple(sorted(rows)))


def _point(raw: Any, where: str) -> Point:
    need = ("id", "url", "cluster", "nodes", "ranks", "op", "size_bytes", "busbw_GBps")
    missing = [k for k in need if not isinstance(raw, dict) or k not in raw]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}; a point needs {', '.join(need)}")
    if not isinstance(raw["busbw_GBps"], (int, float)) or raw["busbw_GBps"] <= 0:
        raise ConfigError(f"{where}.busbw_GBps: must be a positive number (GB/s), got {raw['busbw_GBps']!r}")
    return Point(id=str(raw["id"]), url=str(raw["url"]), cluster=str(raw["cluster"]), nodes=int(raw["nodes"]),
                 ranks=int(raw["ranks"]), op=str(raw["op"]),
                 env={str(k): str(v) for k, v in (raw.get("env") or {}).items()},
                 size_bytes=int(raw["size_bytes"]), busbw_GBps=float(raw["busbw_GBps"]))


def load(path: str | os.PathLike | None = None) -> Catalog:
    """The sweeps file at ``path`` (default: the shipped one).

    Raises:
        ConfigError: an unknown ``schema_version`` or a malformed sweep, naming it.
    """
    if path is None:
        path = resources.files("ncclshim") / "data" / DEFAULT_FILE
    doc = read_yaml(path, "sweeps file", schema_version=SCHEMA_VERSION)
    sweeps = tuple(_sweep(s, f"{path}: sweeps[{i}]") for i, s in enumerate(doc.get("sweeps") or ()))
    points = tuple(_point(p, f"{path}: points[{i}]") for i, p in enumerate(doc.get("points") or ()))
    return Catalog(tolerance_pct=float(doc.get("tolerance_pct", 5)), sweeps=sweeps, points=points)


def compare(sweep: Sweep) -> list[SweepRow]:
    """Plan every size of ``sweep`` as it ran (its preset, nodes, first ``ranks`` GPUs, env, dtype)."""
    planner = Planner(preset_view(sweep.cluster, sweep.nodes))
    ranks = tuple(range(sweep.ranks))
    out = []
    for size, measured in sweep.rows:
        p = planner.plan(sweep.op, size, ranks, env=sweep.env, dtype=sweep.dtype)
        out.append(SweepRow(size_bytes=size, measured_us=measured, predicted_us=p.time_s * 1e6,
                            nccl_estimate_us=p.nccl_time_s * 1e6, algo=p.algo, proto=p.proto))
    return out


def fit_nvls(sweep: Sweep, min_bytes: int = FIT_MIN_BYTES) -> tuple[float, float, float]:
    """The run-time latency (us), streaming efficiency and per-step time (us) of a one-node NVLS
    all-reduce sweep: the least-squares solution (relative errors) of ``measured = latency +
    link_bytes / (efficiency x NVLink bandwidth) + steps x step_us`` over its sizes of ``min_bytes``
    or more (``ncclshim.algorithms.sharp``'s :func:`~ncclshim.algorithms.sharp.nvls_stream` gives
    link bytes and chunk steps). Where ``ncclshim.constants.NVLS_RUN_LATENCY_US``,
    ``NVLS_RUN_EFFICIENCY`` and ``NVLS_STEP_US`` come from.

    Raises:
        ConfigError: fewer than three sizes of one-node NVLS all-reduce at ``min_bytes`` or more.
    """
    import numpy as np

    planner = Planner(preset_view(sweep.cluster, sweep.nodes))
    ranks = tuple(range(sweep.ranks))
    g = planner.graph(ranks)
    rows = []  # (1, link bytes / (1000 x GB/s), chunk steps) and the measured time, all in us
    for size, measured in sweep.rows:
        p = planner.plan(sweep.op, size, ranks, env=sweep.env, dtype=sweep.dtype)
        if size < min_bytes or (p.algo, p.collective, g.n_nodes) != ("NVLS", "all_reduce", 1):
            continue
        link_bytes, steps = nvls_stream(size, g.nvls_channels, p.nchannels)
        rows.append(((1.0, link_bytes / (1000 * g.gpu_bw), steps), measured))
    if len(rows) < 3:
        raise ConfigError(f"sweep {sweep.id!r}: {len(rows)} size(s) of one-node NVLS all-reduce from "
                          f"{min_bytes} B; the fit needs three or more")
    x = np.array([r for r, _ in rows], dtype=np.float64)
    y = np.array([m for _, m in rows], dtype=np.float64)
    (lat, a, step_us), *_ = np.linalg.lstsq(x / y[:, None], np.ones_like(y), rcond=None)  # rows / y: relative
    return float(lat), float(1 / a), float(step_us)


def point_busbw(point: Point) -> tuple[float, str]:
    """ncclshim's busbw (GB/s) for ``point`` and the algorithm it plans."""
    view = preset_view(point.cluster, point.nodes)
    p = Planner(view).plan(point.op, point.size_bytes, tuple(range(point.ranks)), env=point.env)
    return p.busbw / 1e9, p.algo


def format_points(points: tuple[Point, ...]) -> str:
    """A markdown table of the single figures: measured and predicted busbw."""
    lines = ["| figure | measured busbw | predicted | error | algo | source |", "|---|---:|---:|---:|---|---|"]
    for pt in points:
        bw, algo = point_busbw(pt)
        lines.append(f"| {pt.id} | {pt.busbw_GBps:g} | {bw:.1f} | {100 * (bw / pt.busbw_GBps - 1):+.1f}% | {algo} | "
                     f"{pt.url} |")
    return "\n".join(lines)


def format_rows(sweep: Sweep, rows: list[SweepRow]) -> str:
    """A markdown table: size, measured, predicted and NCCL's estimate with their errors."""
    env = " ".join(f"{k}={v}" for k, v in sweep.env.items()) or "default"
    lines = [f"{sweep.id}: {sweep.op} on {sweep.ranks} GPUs of {sweep.nodes} x {sweep.cluster} ({env}); {sweep.url}",
             "", "| size | measured us | predicted us | error | NCCL estimate us | error | algo/proto |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {_size(r.size_bytes)} | {r.measured_us:.1f} | {r.predicted_us:.1f} | {100 * r.error:+.1f}% | "
                     f"{r.nccl_estimate_us:.1f} | {100 * r.nccl_error:+.1f}% | {r.algo}/{r.proto} |")
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}iB"
    return f"{n} B"
