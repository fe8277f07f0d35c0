"""The GPU-types registry (the GPU catalogue): datasheet peaks per dtype, memory, SMs, L2, NVLink.

A cluster's node groups name their GPU type here; ``kernel_db`` prices ops from these figures.
The data lives in ``heterosim/cluster/data/gpus.yaml`` (units in its keys, a source per entry);
this module turns it into :class:`GpuSpec` records in SI units and resolves names. Names are matched case- and
punctuation-insensitively against each entry's name and aliases, so ``"H100"``, ``"h100-sxm"`` and
``"NVIDIA H100 80GB HBM3"`` (what ``torch.cuda.get_device_name`` says) all resolve.

Example::

    >>> from heterosim.cluster.gpus import get_gpu
    >>> get_gpu("h100").peak_flops["bf16"]
    989400000000000.0
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from statistics import NormalDist
from typing import Any, Mapping

from heterosim.errors import ConfigError, UnknownGPUError
from heterosim.yamlfile import read_yaml

__all__ = ["DTYPES", "OPTIONAL_DTYPES", "GpuSpec", "Catalogue", "load_catalogue", "get_gpu", "canonical_key", "spec_from_entry",
           "extend_catalogue", "with_specs", "expected_max_normal", "entry_of"]

SCHEMA_VERSION = 1
DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")
"""Dtype keys every entry's ``peak_TFLOPs`` gives (:attr:`GpuSpec.peak_flops`)."""
OPTIONAL_DTYPES: tuple[str, ...] = ("fp4",)
"""Dtype keys only GPUs with tensor cores for them give: ``fp4`` (NVFP4 / MXFP4 GEMMs, Blackwell
on). A GPU without the key has no such GEMMs (:meth:`GpuSpec.peak` refuses them)."""

_DEFAULT_PATH = Path(__file__).with_name("data") / "gpus.yaml"
_ENTRY_KEYS = {
    "name", "aliases", "vendor", "arch", "compute_capability", "peak_TFLOPs", "hbm_bw_GBps",
    "memory_GiB", "sm_count", "l2_MiB", "nvlink_bw_GBps", "pcie_bw_GBps", "tdp_W", "sources", "notes",
    "launch_overhead_us", "tensor_boost_power_W", "sustained_clock_ratio", "sustained_clock_spread",
}
_REQUIRED = _ENTRY_KEYS - {"aliases", "notes", "launch_overhead_us", "tensor_boost_power_W", "sustained_clock_ratio",
                           "sustained_clock_spread"}


def canonical_key(name: str) -> str:
    """Lower-case ``name`` and drop everything but letters and digits (``"H100-SXM"`` -> ``"h100sxm"``)."""
    return re.sub(r"[^0-9a-z]", "", name.lower())


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One GPU model, in SI units."""

    name: str
    """Canonical catalogue name, e.g. ``H100-SXM5-80GB``."""
    vendor: str
    """``nvidia``, ``amd`` or ``host`` (the CPU pseudo-device used to test the profiler)."""
    arch: str
    """Architecture family (``ampere``, ``hopper``, ``gfx942`` ...)."""
    compute_capability: int
    """CUDA compute capability times ten (80, 90, 100); 0 for non-NVIDIA devices."""
    peak_flops: Mapping[str, float]
    """Dense peak FLOP/s per dtype key of :data:`DTYPES` (and of :data:`OPTIONAL_DTYPES` it has)."""
    hbm_bw: float
    """Device-memory bandwidth, bytes/s."""
    hbm_bytes: float
    """Device-memory capacity, bytes."""
    sm_count: int
    """Streaming multiprocessors (compute units on AMD)."""
    l2_bytes: float
    """L2 cache size, bytes."""
    nvlink_bw: float
    """NVLink (Infinity Fabric on AMD) bandwidth per GPU per direction, bytes/s; 0 if none."""
    pcie_bw: float
    """Host-link bandwidth per direction, bytes/s."""
    tdp_w: float
    """Board power limit, watts."""
    launch_overhead_s: float
    """Fixed cost per kernel (launch plus ramp and tail), seconds."""
    tensor_boost_power_w: float = 0.0
    """Board power dense tensor-core work draws at the boost clock, watts; 0 = not known (no derate)."""
    sustained_clock_ratio: float = 0.0
    """Sustained / boost tensor throughput under dense load where it is published as a measurement
    (it then replaces the power model of :attr:`power_clock_ratio`); 0 = not given."""
    clock_spread: float = 0.0
    """Relative standard deviation of the sustained tensor throughput from board to board of this
    model, where boards run power-capped (:attr:`board_spread`); 0 = none."""
    aliases: tuple[str, ...] = ()
    """Other names that resolve to this GPU."""
    sources: str = ""
    """Where the figures come from."""
    notes: str = ""
    """Caveats (dtype fallbacks, bridges, ...)."""

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a trace dtype; non-float dtypes (int64 ...) use the fp32 rate.

        Raises:
            ConfigError: ``dtype`` is an optional one (``fp4``) this GPU has no tensor cores for.
        """
        if dtype in OPTIONAL_DTYPES and dtype not in self.peak_flops:
            raise ConfigError(f"{self.name} has no {dtype} tensor cores (sm_{self.compute_capability}; fp4 "
                              "GEMMs such as NVFP4 need Blackwell, sm_100 or later): run the job in fp8 or "
                              f"bf16 on it, or give the GPU a peak_TFLOPs.{dtype}")
        return self.peak_flops.get(dtype, self.peak_flops["fp32"])

    @property
    def power_clock_ratio(self) -> float:
        """Sustained / boost clock under dense tensor-core load: ``min(1, (tdp / P_boost) ** (1/3))``.

        Dynamic power goes as C * V^2 * f and DVFS lowers V with f, so P ~ f^3 (Weste & Harris,
        "CMOS VLSI Design", 4th ed., sec. 5.1-5.2). A board whose tensor work would draw
        ``P_boost`` at the boost clock settles, once its power limiter acts (~0.1 s of load:
        ``benchmarks/bench_power_regime.py``), at the clock where that power equals its TDP.
        NB: ignores static (leakage) power, which does not scale with f: the true derate is a
        little deeper than this. Far below boost, where the voltage stops falling with the clock,
        the cube law no longer holds: a board measured there gives ``sustained_clock_ratio``
        instead, which this returns as is.
        """
        if self.sustained_clock_ratio > 0:
            return self.sustained_clock_ratio
        if self.tensor_boost_power_w <= 0 or self.tdp_w <= 0:
            return 1.0
        return min(1.0, (self.tdp_w / self.tensor_boost_power_w) ** (1.0 / 3.0))

    @property
    def board_spread(self) -> float:
        """:attr:`clock_spread` where the board runs power-capped (:attr:`power_clock_ratio` < 1),
        else 0: boards that hold their boost clock all run at that clock. The clock a capped board
        settles at depends on its own silicon (leakage, voltage): Sinha et al., "Not All GPUs Are
        Created Equal", SC'22, find GPUs of one SKU differing under power management."""
        return self.clock_spread if self.power_clock_ratio < 1.0 else 0.0

    def slowest_of(self, boards: int) -> "GpuSpec":
        """The expected slowest of ``boards`` boards of this model: tensor throughput
        ``power_clock_ratio * (1 - z * board_spread)``, z the expected largest of ``boards``
        standard normal draws (:func:`expected_max_normal`). A synchronous training step waits
        for its slowest GPU at every collective, so each GPU of a job runs at that pace.
        NB: boards taken as independent, normally spread draws (no slow outliers, no binning by
        node); the slowest board's pace is given to all, as if every board waited its full lag at
        every synchronisation."""
        if boards <= 1 or self.board_spread <= 0:
            return self
        z = expected_max_normal(boards)
        return replace(self, sustained_clock_ratio=self.power_clock_ratio * (1.0 - z * self.board_spread))

    def at_power_limit(self, watts: float) -> "GpuSpec":
        """This board held to ``watts`` (``nvidia-smi -pl``), named ``<name>@<watts>W``: dense tensor
        work settles at ``min(1, (watts / P_boost) ** (1/3))`` of its boost throughput, ``P_boost``
        the power it would draw at boost: :attr:`tensor_boost_power_w` where known, else
        ``tdp_w / power_clock_ratio ** 3``, the cube law of :attr:`power_clock_ratio` through the
        board's own operating point at its rated limit (a measured sustained ratio there, or boost
        held). An H100 SXM (0.86 of boost at 700 W) at 500 W: 0.769; an A100 SXM4 (boost held at
        400 W) at 300 W: 0.909, the A100-PCIe's figure (``docs/kernel_db.md``).
        NB: the cube law holds while the voltage still falls with the clock; a limit low enough to
        reach the voltage floor derates deeper (power then falls only linearly with the clock).

        Raises:
            ConfigError: ``watts`` is not a finite number > 0.
        """
        watts = _positive(watts, f"{self.name}: power limit", "W")
        p_boost = self.tensor_boost_power_w
        if p_boost <= 0:
            p_boost = (self.tdp_w or watts) / self.power_clock_ratio ** 3
        ratio = min(1.0, (watts / p_boost) ** (1.0 / 3.0))
        return replace(self, name=f"{self.name}@{watts:g}W", aliases=(), tdp_w=watts, sustained_clock_ratio=ratio)

    def at_boost(self) -> "GpuSpec":
        """This GPU held at its boost clock (``power_clock_ratio`` 1): the regime of a short
        benchmark burst, and of ``kernel_db profile``, which idles the GPU before each timed call."""
        return replace(self, sustained_clock_ratio=1.0)

    def ridge(self, dtype: str) -> float:
        """Ridge point (FLOP/byte) of the roofline for ``dtype``: above it an op is compute-bound."""
        return self.peak(dtype) / self.hbm_bw

    @property
    def is_gpu(self) -> bool:
        """False for the CPU pseudo-device."""
        return self.vendor != "host"


@dataclass(frozen=True, slots=True)
class Catalogue:
    """All GPUs of a catalogue file, with name resolution."""

    gpus: tuple[GpuSpec, ...]
    path: str = ""
    _index: Mapping[str, GpuSpec] | None = None
    defaults: Mapping[str, Any] | None = None
    """The file's ``defaults:`` (e.g. ``launch_overhead_us``), for entries defined elsewhere."""

    def names(self) -> list[str]:
        """Canonical names, in file order."""
        return [g.name for g in self.gpus]

    def get(self, name: "str | GpuSpec") -> GpuSpec:
        """Resolve a name or alias (case/punctuation-insensitive); a :class:`GpuSpec` passes through."""
        if isinstance(name, GpuSpec):
            return name
        index = self._index if self._index is not None else _build_index(self.gpus)
        spec = index.get(canonical_key(str(name)))
        if spec is None:
            raise UnknownGPUError(
                f"unknown GPU {name!r}; known GPUs: {', '.join(self.names())} "
                f"(aliases such as 'H100' or 'a100-80gb' work too; add a GPU to {self.path or 'gpus.yaml'})"
            )
        return spec


def expected_max_normal(n: int) -> float:
    """Expected largest of ``n`` independent standard normal draws, by Blom's formula
    ``Phi^-1((n - 0.375) / (n + 0.25))`` (G. Blom, *Statistical Estimates and Transformed Beta
    Variables*, 1958): 0 for one draw, 1.434 for 8, 2.585 for 128, 3.427 for 2,048. NB: within
    0.03 of the exact integral from 2 draws up (2: 0.590 vs 0.564; 8: 1.434 vs 1.424; 2,048: 3.427
    vs 3.442; 10,000: 3.836 vs 3.852)."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def extend_catalogue(base: Catalogue, extra: tuple[GpuSpec, ...], where: str) -> Catalogue:
    """``base`` plus the GPUs ``extra`` defines (a cluster file's own accelerators).

    Raises:
        ConfigError: an extra GPU reuses a name or alias of ``base`` or of another extra one.
    """
    if not extra:
        return base
    known = _build_index(base.gpus)
    for g in extra:
        for n in (g.name, *g.aliases):
            if canonical_key(n) in known:
                raise ConfigError(f"{where}: GPU name {n!r} is already in the GPU registry "
                                  f"({known[canonical_key(n)].name}); give the accelerator a name of its own")
    gpus = base.gpus + tuple(extra)
    return Catalogue(gpus, f"{base.path} + {where}", _build_index(gpus), base.defaults)


def with_specs(base: Catalogue, specs: Mapping[str, GpuSpec]) -> Catalogue:
    """``base`` with the GPUs named in ``specs`` (canonical names) replaced by those specs."""
    if not specs:
        return base
    gpus = tuple(specs.get(g.name, g) for g in base.gpus)
    return Catalogue(gpus, base.path, _build_index(gpus), base.defaults)


def _build_index(gpus: tuple[GpuSpec, ...]) -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for g in gpus:
        for n in (g.name, *g.aliases):
            k = canonical_key(n)
            other = index.get(k)
            if other is not None and other is not g:
                raise ConfigError(f"GPU catalogue: name {n!r} is used by both {other.name} and {g.name}")
            index[k] = g
    return index


def _positive(v: Any, where: str, unit: str) -> float:
    """``v`` as a finite number > 0, else one ConfigError naming ``where`` and its unit."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not v > 0:
        raise ConfigError(f"{where} must be a finite number > 0 {unit}, got {v!r:.60}")
    return float(v)


def spec_from_entry(e: Any, defaults: Mapping[str, Any], where: str) -> GpuSpec:
    """A :class:`GpuSpec` from one entry of the catalogue schema (``gpus.yaml``, or a cluster
    file's ``gpus:`` section); every figure is checked, with its unit, before use."""
    if not isinstance(e, Mapping):
        raise ConfigError(f"{where}: a GPU entry must be a mapping of the gpus.yaml keys, got {e!r:.60}")
    unknown = set(e) - _ENTRY_KEYS
    missing = _REQUIRED - set(e)
    if unknown or missing:
        raise ConfigError(
            f"{where}: GPU entry {e.get('name', '?')!r} has unknown keys {sorted(map(str, unknown))} / "
            f"missing keys {sorted(missing)}; valid keys are {sorted(_ENTRY_KEYS)}"
        )
    name = e["name"]
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: a GPU entry's name must be a non-empty string, got {name!r:.60}")
    peaks = e["peak_TFLOPs"]
    if not isinstance(peaks, Mapping) or not set(DTYPES) <= set(peaks) <= set(DTYPES + OPTIONAL_DTYPES):
        raise ConfigError(f"{where}: {name}: peak_TFLOPs must give exactly {DTYPES}, and {OPTIONAL_DTYPES} "
                          f"where the GPU has tensor cores for it; got {peaks!r:.80}")
    for k, v in peaks.items():
        _positive(v, f"{where}: {name}: peak_TFLOPs.{k}", "TFLOP/s")
    for k, unit in (("hbm_bw_GBps", "GB/s"), ("memory_GiB", "GiB"), ("sm_count", "SMs"), ("l2_MiB", "MiB")):
        _positive(e[k], f"{where}: {name}: {k}", unit)
    for k, unit in (("nvlink_bw_GBps", "GB/s"), ("pcie_bw_GBps", "GB/s"), ("tdp_W", "W")):
        v = e[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"{where}: {name}: {k} must be a finite number >= 0 {unit}, got {v!r:.60}")
    if isinstance(e["compute_capability"], bool) or not isinstance(e["compute_capability"], int):
        raise ConfigError(f"{where}: {name}: compute_capability must be an integer (80 for sm_80; 0 off NVIDIA)")
    aliases = e.get("aliases", [])
    if not isinstance(aliases, (list, tuple)) or not all(isinstance(a, str) for a in aliases):
        raise ConfigError(f"{where}: {name}: aliases must be a list of names")
    launch_us = float(e.get("launch_overhead_us", defaults.get("launch_overhead_us", 0.0)))
    ratio = e.get("sustained_clock_ratio", 0.0)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"{where}: {name}: sustained_clock_ratio must be a fraction in (0, 1] of the boost "
                          f"clock's tensor throughput, got {ratio!r:.60}")
    spread = e.get("sustained_clock_spread", defaults.get("sustained_clock_spread", 0.0))
    if isinstance(spread, bool) or not isinstance(spread, (int, float)) or not 0.0 <= spread < 0.2:
        raise ConfigError(f"{where}: {name}: sustained_clock_spread must be a relative standard deviation in "
                          f"[0, 0.2) of the sustained tensor throughput across boards, got {spread!r:.60}")
    return GpuSpec(
        name=str(e["name"]),
        vendor=str(e["vendor"]),
        arch=str(e["arch"]),
        compute_capability=int(e["compute_capability"]),
        peak_flops={k: float(peaks[k]) * 1e12 for k in DTYPES + OPTIONAL_DTYPES if k in peaks},
        hbm_bw=float(e["hbm_bw_GBps"]) * 1e9,
        hbm_bytes=float(e["memory_GiB"]) * 2**30,
        sm_count=int(e["sm_count"]),
        l2_bytes=float(e["l2_MiB"]) * 2**20,
        nvlink_bw=float(e["nvlink_bw_GBps"]) * 1e9,
        pcie_bw=float(e["pcie_bw_GBps"]) * 1e9,
        tdp_w=float(e["tdp_W"]),
        launch_overhead_s=launch_us * 1e-6,
        tensor_boost_power_w=float(e.get("tensor_boost_power_W", 0.0)),
        sustained_clock_ratio=float(ratio),
        clock_spread=float(spread),
        aliases=tuple(str(a) for a in e.get("aliases", ())),
        sources=str(e["sources"]),
        notes=str(e.get("notes", "")),
    )


def entry_of(spec: GpuSpec) -> dict[str, Any]:
    """The catalogue-schema entry (``gpus.yaml``, a cluster file's ``gpus:``) that
    :func:`spec_from_entry` reads back to ``spec``."""
    e: dict[str, Any] = {
        "name": spec.name, "vendor": spec.vendor, "arch": spec.arch, "compute_capability": spec.compute_capability,
        "peak_TFLOPs": {k: v / 1e12 for k, v in spec.peak_flops.items()}, "hbm_bw_GBps": spec.hbm_bw / 1e9,
        "memory_GiB": spec.hbm_bytes / 2**30, "sm_count": spec.sm_count, "l2_MiB": spec.l2_bytes / 2**20,
        "nvlink_bw_GBps": spec.nvlink_bw / 1e9, "pcie_bw_GBps": spec.pcie_bw / 1e9, "tdp_W": spec.tdp_w,
        "launch_overhead_us": spec.launch_overhead_s * 1e6, "sustained_clock_spread": spec.clock_spread,
        "sources": spec.sources,
    }
    if spec.tensor_boost_power_w > 0:
        e["tensor_boost_power_W"] = spec.tensor_boost_power_w
    if spec.sustained_clock_ratio > 0:
        e["sustained_clock_ratio"] = spec.sustained_clock_ratio
    if spec.aliases:
        e["aliases"] = list(spec.aliases)
    if spec.notes:
        e["notes"] = spec.notes
    return e


def load_catalogue(path: str | os.PathLike | None = None) -> Catalogue:
    """Load a catalogue YAML (default: the one shipped in ``heterosim/cluster/data/gpus.yaml``)."""
    if path is None:
        return _default_catalogue()
    return _load(Path(path))


@lru_cache(maxsize=1)
def _default_catalogue() -> Catalogue:
    return _load(_DEFAULT_PATH)


def _load(path: Path) -> Catalogue:
    doc = read_yaml(path, "GPU catalogue", schema_version=SCHEMA_VERSION)
    defaults = doc.get("defaults", {}) or {}
    gpus = tuple(spec_from_entry(e, defaults, str(path)) for e in doc.get("gpus", []))
    return Catalogue(gpus, str(path), _build_index(gpus), dict(defaults))


def get_gpu(name: "str | GpuSpec") -> GpuSpec:
    """Resolve ``name`` in the default catalogue; unknown names raise :class:`UnknownGPUError`."""
    return load_catalogue().get(name)
