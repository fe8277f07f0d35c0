"""The kernel database: measured kernel times keyed by GPU, kernel class, signature and software.

On disk it is one CSV file whose first line is a version comment::

    # heterosim-kernel-db schema_version=1
    gpu,kernel_class,signature,dtype,dims,torch_version,cuda_version,driver_version,time_s,...

so ``pandas.read_csv(path, comment="#")`` reads it as is (:meth:`KernelDB.to_frame` too). A row is
one kernel on one GPU with one software stack: the median time, the sample count, the spread,
FLOPs and bytes, the raw device name and provenance. Rows are written sorted by key, so the same
rows give a byte-identical file.

Writes go through :func:`merge_rows`: under an exclusive ``flock`` on ``<db>.lock`` it re-reads the
file, merges the new rows (the newer ``recorded_utc`` wins on a key collision) and replaces the
file atomically -- two profilers writing the same DB at once lose no rows, and a crash leaves the
old file. A damaged file raises :class:`KernelDBError` naming the line, and is never overwritten.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import math
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from heterosim.atomic import atomic_write_text
from heterosim.errors import KernelDBError

__all__ = ["SCHEMA_VERSION", "KernelRow", "KernelDB", "merge_rows", "dims_key", "SHIPPED_DIR"]

SCHEMA_VERSION = 1
SHIPPED_DIR = Path(__file__).with_name("data") / "measured"
"""Measured DBs shipped with HeteroSim (one CSV per GPU, from ``python -m kernel_db profile``)."""
_MAGIC = f"# heterosim-kernel-db schema_version={SCHEMA_VERSION}"


def dims_key(dims: Mapping[str, Any] | None) -> str:
    """Canonical JSON of a dims mapping (sorted keys, no spaces): the DB's ``dims`` column."""
    return json.dumps(dict(dims or {}), sort_keys=True, separators=(",", ":"))


DISTURBED_SPREAD = 1.0
"""Interquartile range over median above which a measured row's repeats count as disturbed
(:attr:`KernelRow.estimate_s`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelRow:
    """One measured kernel."""

    gpu: str
    """Canonical catalogue name of the GPU (``CPU-host`` for ``--device cpu``)."""
    kernel_class: str
    """Kernel class (``heterosim.trace.vocab.KERNEL_CLASSES``)."""
    signature: str
    """Canonical signature (CUDA kernel name, dtype, shapes)."""
    dtype: str
    """Compute dtype."""
    dims: str
    """Shape parameters as canonical JSON (:func:`dims_key`)."""
    torch_version: str = ""
    """torch version of the profiler ('' if unknown)."""
    cuda_version: str = ""
    """CUDA (or HIP) runtime version ('' on CPU / unknown)."""
    driver_version: str = ""
    """GPU driver version ('' on CPU / unknown)."""
    time_s: float
    """Median kernel time, seconds."""
    samples: int
    """Timed repeats behind the median."""
    spread_rel: float = 0.0
    """Interquartile range / median."""
    min_s: float = 0.0
    """Fastest repeat, seconds."""
    max_s: float = 0.0
    """Slowest repeat, seconds."""
    flops: float = 0.0
    """Executed FLOPs of the kernel."""
    bytes: float = 0.0
    """Bytes read plus written."""
    device_name: str = ""
    """The device name as the runtime reported it."""
    provenance: str = ""
    """What produced the row (``profile:cuda trace=... host=...``, ``import:...``)."""
    recorded_utc: str = ""
    """ISO-8601 UTC time of the measurement."""

    @property
    def estimate_s(self) -> float:
        """The kernel's time for pricing: the median, or the fastest repeat where the repeats were
        disturbed (interquartile range over ``DISTURBED_SPREAD`` times the median). Interference on
        a shared GPU or host only adds time, so when it reaches the median the fastest repeat is
        the least disturbed figure. (One shipped row: H100 ``4096x2048 @ 2048x2048`` bf16, median
        144 us, min 48 us, IQR 1.25x the median; the H200 runs it in 49 us.)"""
        if self.spread_rel > DISTURBED_SPREAD and self.min_s > 0:
            return self.min_s
        return self.time_s

    @property
    def key(self) -> tuple[str, ...]:
        """Identity of the row: GPU, class, signature, dtype, dims, software."""
        return (self.gpu, self.kernel_class, self.signature, self.dtype, self.dims,
                self.torch_version, self.cuda_version, self.driver_version)

    def dims_dict(self) -> dict[str, Any]:
        """``dims`` parsed back into a dict."""
        return json.loads(self.dims)


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(KernelRow))
_FLOAT = {"time_s", "spread_rel", "min_s", "max_s", "flops", "bytes"}
_INT = {"samples"}


def _parse(path: Path, text: str) -> list[KernelRow]:
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip("\r\n") != _MAGIC:
        first = lines[0].rstrip()[:80] if lines else "(empty file)"
        raise KernelDBError(
            f"{path} is not a HeteroSim kernel DB of schema_version {SCHEMA_VERSION}: first line is "
            f"{first!r}, expected {_MAGIC!r}. The file was left untouched; move it away or pass another --db."
        )
    reader = csv.reader(io.StringIO("".join(lines[1:])))
    try:
        header = next(reader)
    except StopIteration:
        raise KernelDBError(f"{path}: missing the column header line; the file was left untouched") from None
    if tuple(header) != COLUMNS:
        raise KernelDBError(
            f"{path}: columns {header} differ from this version's {list(COLUMNS)}; the file was left untouched"
        )
    rows: list[KernelRow] = []
    try:
        for rec in reader:
            lineno = reader.line_num + 1
            if len(rec) != len(COLUMNS):
                raise KernelDBError(
                    f"{path}: line {lineno} has {len(rec)} fields, expected {len(COLUMNS)} (truncated or "
                    f"damaged file); it was left untouched -- repair it or remove that line"
                )
            kw: dict[str, Any] = {}
            for c, v in zip(COLUMNS, rec):
                try:
                    kw[c] = float(v) if c in _FLOAT else int(v) if c in _INT else v
                except ValueError:
                    raise KernelDBError(
                        f"{path}: line {lineno}: column {c} = {v!r} is not a number; the file was left untouched"
                    ) from None
            if not kw["time_s"] > 0 or not math.isfinite(kw["time_s"]):
                raise KernelDBError(f"{path}: line {lineno}: time_s must be a finite number > 0 seconds, "
                                    f"got {kw['time_s']}")
            bad = [c for c in _FLOAT if not math.isfinite(kw[c])]
            if bad:
                raise KernelDBError(f"{path}: line {lineno}: column {bad[0]} is not finite; the file was left untouched")
            try:
                dims = json.loads(kw["dims"])
            except ValueError:
                dims = None
            if not isinstance(dims, dict):
                raise KernelDBError(f"{path}: line {lineno}: dims {kw['dims']!r:.60} is not a JSON object like "
                                    '{"m":1024}; the file was left untouched -- repair or remove that line')
            rows.append(KernelRow(**kw))
    except csv.Error as e:
        raise KernelDBError(f"{path}: damaged CSV ({e}); the file was left untouched") from e
    return rows


def _render(rows: Iterable[KernelRow]) -> str:
    buf = io.StringIO()
    buf.write(_MAGIC + "\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in sorted(rows, key=lambda r: r.key):
        w.writerow([repr(v) if isinstance(v, float) else v for v in (getattr(r, c) for c in COLUMNS)])
    return buf.getvalue()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _merge(old: Iterable[KernelRow], new: Iterable[KernelRow]) -> list[KernelRow]:
    by_key: dict[tuple[str, ...], KernelRow] = {}
    for r in (*old, *new):
        prev = by_key.get(r.key)
        if prev is None or r.recorded_utc >= prev.recorded_utc:
            by_key[r.key] = r
    return list(by_key.values())


def merge_rows(path: str | os.PathLike, rows: Iterable[KernelRow]) -> int:
    """Merge ``rows`` into the DB file at ``path`` (created if absent); returns the row count after.

    Safe against concurrent writers (file lock + re-read) and crashes (atomic replace).
    """
    path = Path(path)
    rows = list(rows)
    with _locked(path):
        old = _parse(path, path.read_text()) if path.exists() else []
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask()
        merged = _merge(old, rows)
        atomic_write_text(path, _render(merged))
        os.chmod(path, mode)  # the atomic write's temp file is 0600; keep the DB shareable
    return len(merged)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class KernelDB:
    """Measured rows in memory, indexed for pricing.

    ``lookup`` finds an exact (gpu, class, signature, dtype, dims) row; when several software
    stacks measured it, the most recently recorded row wins. ``candidates`` lists a GPU's rows of one
    class and dtype, for interpolation.
    """

    def __init__(self, rows: Iterable[KernelRow] = (), path: str = "") -> None:
        self.path = path
        self.rows: list[KernelRow] = _merge([], rows)
        self._reindex()

    def _reindex(self) -> None:
        self._exact: dict[tuple[str, str, str, str, str], KernelRow] = {}
        self._by_class: dict[tuple[str, str, str], list[KernelRow]] = {}
        self._by_sig: dict[tuple[str, str, str, str], list[KernelRow]] = {}
        for r in sorted(self.rows, key=lambda r: (r.recorded_utc, r.key)):
            self._exact[(r.gpu, r.kernel_class, r.signature, r.dtype, r.dims)] = r
        for r in self._exact.values():
            self._by_class.setdefault((r.gpu, r.kernel_class, r.dtype), []).append(r)
            self._by_sig.setdefault((r.kernel_class, r.signature, r.dtype, r.dims), []).append(r)

    @classmethod
    def load(cls, path: str | os.PathLike, *, must_exist: bool = False) -> "KernelDB":
        """Read a DB file; a damaged one raises :class:`KernelDBError`. A missing file is an empty
        DB (a profile starts one), unless ``must_exist`` (a DB to price from), when it is an error.

        A directory loads every ``*.csv`` in it, merged (e.g. :data:`SHIPPED_DIR`); such a DB has
        no single file to :meth:`save` back to.
        """
        p = Path(path)
        if p.is_dir():
            rows: list[KernelRow] = []
            for f in sorted(p.glob("*.csv")):
                rows.extend(cls.load(f).rows)
            return cls(rows, "")
        if not p.exists():
            if must_exist:
                raise KernelDBError(f"kernel DB {p} does not exist; create it with python -m kernel_db profile "
                                    "--db FILE, or leave the option out to price by roofline")
            return cls((), str(p))
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise KernelDBError(f"cannot read kernel DB {p}: {e}") from e
        return cls(_parse(p, text), str(p))

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rows: Iterable[KernelRow]) -> None:
        """Add rows in memory (use :func:`merge_rows` to persist)."""
        self.rows = _merge(self.rows, rows)
        self._reindex()

    def save(self, path: str | os.PathLike | None = None) -> None:
        """Merge this DB's rows into ``path`` (default: where it was loaded from)."""
        target = path or self.path
        if not target:
            raise KernelDBError("KernelDB.save: no path given and the DB was not loaded from a file")
        merge_rows(target, self.rows)

    def lookup(self, gpu: str, kernel_class: str, signature: str, dtype: str, dims: str) -> KernelRow | None:
        """The measured row for exactly this kernel on ``gpu``, or None."""
        return self._exact.get((gpu, kernel_class, signature, dtype, dims))

    def candidates(self, gpu: str, kernel_class: str, dtype: str) -> list[KernelRow]:
        """All of ``gpu``'s rows of one kernel class and dtype (one per kernel)."""
        return self._by_class.get((gpu, kernel_class, dtype), [])

    def other_gpus(self, kernel_class: str, signature: str, dtype: str, dims: str) -> list[KernelRow]:
        """Rows of exactly this kernel on every GPU that measured it."""
        return self._by_sig.get((kernel_class, signature, dtype, dims), [])

    def gpus(self) -> list[str]:
        """GPUs with at least one row, sorted."""
        return sorted({r.gpu for r in self.rows})

    def to_frame(self) -> Any:
        """The rows as a pandas DataFrame (columns as on disk)."""
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in sorted(self.rows, key=lambda r: r.key)], columns=list(COLUMNS))
