"""Published GEMM throughput measurements, and the roofline curves priced against them.

``kernel_db/data/published_gemm.yaml`` holds two public sets: the best-shape ``torch.matmul`` rates
of Bekman's "Maximum Achievable Matmul FLOPS" table (one shape per GPU and dtype), and XLA's
measured dot throughput over a grid of shapes (``matmul_interpolator_data.h``). Both are boost-clock
figures (short runs), the regime kernel_db's own rows are in, so the curves are priced at boost
here. :func:`compare` gives each measurement's log error; ``benchmarks/bench_published_gemm.py``
prints the table and ``docs/kernel_db.md`` ("GEMMs beyond the measured GPUs") quotes it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from heterosim.cluster.gpus import Catalogue, load_catalogue
from heterosim.errors import ConfigError
from heterosim.yamlfile import read_yaml

from .roofline import EfficiencyModel, load_efficiency, roofline_time

__all__ = ["PublishedRate", "load_published", "curve_tflops", "compare", "PUBLISHED_PATH"]

PUBLISHED_PATH = Path(__file__).with_name("data") / "published_gemm.yaml"
SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedRate:
    """One published GEMM measurement."""

    gpu: str
    """Catalogue name of the GPU."""
    dtype: str
    b: int
    m: int
    n: int
    k: int
    tflops: float
    """Measured dense math rate, 2 b m n k / time, TF/s."""
    source: str
    """``mamf`` (best-shape torch.matmul), ``harness`` (dtypes timed side by side in one harness:
    compared as ratios) or ``xla:<device key>``."""

    @property
    def flops(self) -> float:
        return 2.0 * self.b * self.m * self.n * self.k


def load_published(path: str | os.PathLike | None = None) -> tuple[PublishedRate, ...]:
    """Every measurement of the file (default: the shipped one), in file order."""
    p = Path(path) if path is not None else PUBLISHED_PATH
    doc = read_yaml(p, "published GEMM file", schema_version=SCHEMA_VERSION)
    try:
        out = [PublishedRate(gpu=str(g), dtype=str(dt), b=1, m=int(m), n=int(n), k=int(k), tflops=float(t),
                             source="mamf")
               for g, dt, m, n, k, t, _software in doc["maximum_matmul"]["rows"]]
        out += [PublishedRate(gpu=str(g), dtype=str(dt), b=1, m=int(m), n=int(n), k=int(k), tflops=float(t),
                              source="harness") for g, dt, m, n, k, t, _software in doc["same_harness"]["rows"]]
        xla = doc["xla_dots"]
        for dev, rows in xla["rows"].items():
            gpu = xla["devices"][dev]
            out += [PublishedRate(gpu=str(gpu), dtype="bf16", b=int(b), m=int(m), n=int(n), k=int(k),
                                  tflops=float(t), source=f"xla:{dev}") for b, m, n, k, t in rows]
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"published GEMM file {p}: malformed ({type(e).__name__}: {e}); each "
                          "maximum_matmul and same_harness row is [gpu, dtype, m, n, k, TF/s, software], each xla_dots "
                          "row [b, m, n, k, TF/s] under a device listed in xla_dots.devices") from None
    return tuple(out)


def curve_tflops(rate: PublishedRate, efficiency: EfficiencyModel | None = None,
                 catalogue: Catalogue | None = None) -> float:
    """The rate kernel_db's roofline tier gives ``rate``'s shape on its GPU at boost clock.

    Best-shape (``mamf``) figures are compared on the math time alone (the benchmark's 100 back-to-
    back iterations hide the launch); XLA's per-dot times include one launch overhead each.
    """
    gpu = (catalogue or load_catalogue()).get(rate.gpu).at_boost()
    eff = efficiency or load_efficiency()
    dims = {"m": rate.m, "n": rate.n, "k": rate.k, "batch": rate.b}
    r = roofline_time("gemm", rate.dtype, dims, rate.flops, 0.0, gpu, eff.params(gpu))
    seconds = r.seconds if rate.source.startswith("xla:") else r.compute_s
    return rate.flops / seconds / 1e12


def compare(rates: tuple[PublishedRate, ...] | None = None, efficiency: EfficiencyModel | None = None,
            catalogue: Catalogue | None = None) -> list[tuple[PublishedRate, float, float]]:
    """``(rate, curve TF/s, log(curve / published))`` for each measurement (default: all shipped)."""
    cat = catalogue or load_catalogue()
    out = []
    for r in rates if rates is not None else load_published():
        c = curve_tflops(r, efficiency, cat)
        out.append((r, c, math.log(c / r.tflops)))
    return out
