"""An nccl-tests-like sweep over message sizes, as data (the CLI renders it).

``sweep(view, op, min_bytes, max_bytes)`` plans ``op`` over every GPU of the view for sizes
``min, min*f, ...`` up to ``max`` (nccl-tests' ``-b/-e/-f``), rounding each size down to a
multiple of ``ranks x element size`` for the operations whose buffers split across ranks, as
nccl-tests does. ``format_table`` renders the rows like ``all_reduce_perf``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Mapping

from heterosim.errors import ConfigError
from heterosim.trace.vocab import DTYPE_BYTES
from ncclshim.planner import COLLECTIVES, plan
from ncclshim.topology import TopologyView

__all__ = ["BenchRow", "parse_size", "sweep", "format_table", "rows_to_json"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRow:
    """One line of the table."""

    size_bytes: int
    count: int
    """Elements of ``dtype`` in ``size_bytes``."""
    dtype: str
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    algo: str
    proto: str
    nchannels: int


def parse_size(text: str) -> int:
    """nccl-tests size syntax: an integer with an optional K/M/G/T suffix (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)B?\s*", str(text).upper())
    if not m:
        raise ConfigError(f"size {text!r} is not understood; write e.g. 8, 64K, 128M or 8G")
    return int(m.group(1)) * _UNITS[m.group(2)]


def sweep(view: TopologyView, op: str, min_bytes: int, max_bytes: int, *, step_factor: int = 2,
          dtype: str = "bf16", env: Mapping[str, str] | None = None,
          ranks: tuple[int, ...] | None = None) -> list[BenchRow]:
    """Plan ``op`` at each size of the sweep over ``ranks`` (default: every GPU of ``view``)."""
    if op not in COLLECTIVES or op == "recv":
        valid = ", ".join(c for c in COLLECTIVES if c != "recv")
        raise ConfigError(f"--op {op!r} is not a collective ncclshim benchmarks; valid: {valid}")
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"--dtype {dtype!r} is unknown; valid: {', '.join(DTYPE_BYTES)}")
    if min_bytes < 1 or max_bytes < min_bytes or step_factor < 2:
        raise ConfigError(f"need 1 <= min-bytes ({min_bytes}) <= max-bytes ({max_bytes}) and step factor >= 2")
    group = ranks if ranks is not None else tuple(range(len(view.gpus)))
    if op == "send":
        group = group[:1] + group[-1:]  # sendrecv between the first and the last GPU
    elem = DTYPE_BYTES[dtype]
    quantum = elem * (len(group) if op in ("all_gather", "reduce_scatter", "all_to_all") else 1)
    rows, size = [], min_bytes
    while size <= max_bytes:
        nbytes = size // quantum * quantum
        if nbytes:
            p = plan(op, nbytes, group, view, env=env, dtype=dtype)
            rows.append(BenchRow(size_bytes=nbytes, count=nbytes // elem, dtype=dtype, time_us=p.time_s * 1e6,
                                 algbw_GBps=p.algbw / 1e9, busbw_GBps=p.busbw / 1e9, algo=p.algo, proto=p.proto,
                                 nchannels=p.nchannels))
        size *= step_factor
    return rows


def format_table(rows: list[BenchRow], *, title: str = "") -> str:
    """Rows as an ``all_reduce_perf``-style text table."""
    head = f"{'size':>12} {'count':>12} {'type':>6} {'time':>10} {'algbw':>8} {'busbw':>8} {'algo':>10} {'proto':>7} {'nch':>4}"
    unit = f"{'(B)':>12} {'(elements)':>12} {'':>6} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>10} {'':>7} {'':>4}"
    lines = ([f"# {title}"] if title else []) + ["#" + head[1:], "#" + unit[1:]]
    for r in rows:
        lines.append(f"{r.size_bytes:>12} {r.count:>12} {r.dtype:>6} {r.time_us:>10.2f} {r.algbw_GBps:>8.2f} "
                     f"{r.busbw_GBps:>8.2f} {r.algo:>10} {r.proto:>7} {r.nchannels:>4}")
    if rows:
        avg = sum(r.busbw_GBps for r in rows) / len(rows)
        lines.append(f"# Avg bus bandwidth    : {avg:.3f} GB/s")
    return "\n".join(lines)


def rows_to_json(rows: list[BenchRow]) -> list[dict]:
    """Rows as JSON-ready dicts (units in the keys)."""
    return [asdict(r) for r in rows]
