"""Boost burst and power-capped clock: what a timed loop of identical GEMMs measures.

A GPU starts a dense tensor-core load at its boost clock; its power limiter lowers the clock after
about ``POWER_WINDOW_S`` of load, to the sustained clock ``GpuSpec.power_clock_ratio`` of boost
(kernel_db prices that sustained regime, which training runs in). A short benchmark therefore
measures partly or wholly at boost. :func:`loop_seconds` splits a loop of back-to-back kernels at
the window; :func:`square_gemm_benchmark` applies it to the method of public_cases.yaml
``kernel-a100-pcie40-torch-bf16-square-gemm`` (6 warm-up + 30 timed ``torch.mm`` per size, wall
clock; torch-performance-test-data ``test.py``).

Measured (``benchmarks/bench_power_regime.py``, H200, torch 2.11 + CUDA 13.0): after 3 s idle,
back-to-back 8192^3 bf16 GEMMs run 807-812 TF/s for the first 100 ms of load, 695 TF/s from 100 to
200 ms and 666-686 TF/s after that (SM clock 1980 -> ~1470 MHz at 690 W of 700 W); the public
method gives 809 TF/s at 8192 (49 ms of load) cold and 664 TF/s right after a 3 s soak.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from heterosim.cluster.gpus import GpuSpec

from .roofline import roofline_time

__all__ = ["POWER_WINDOW_S", "loop_seconds", "GemmBenchPoint", "square_gemm_benchmark"]

POWER_WINDOW_S = 0.1
"""Seconds of dense load a GPU holds its boost clock before the power limiter lowers it.

Measured on H200 (module docstring): throughput left the boost level between 100 and 200 ms;
0.1 s is the end of the last window still at boost. NB: taken to hold for every NVIDIA GPU (the
limiter is board firmware; not measured on others), and the drop is modelled as a step, not the
~0.1 s ramp seen."""


def loop_seconds(t_burst: float, t_sustained: float, count: int, *, warmup: int = 0,
                 window_s: float = POWER_WINDOW_S) -> float:
    """Seconds of the last ``count`` of ``warmup + count`` back-to-back kernels, starting cold.

    Kernels run ``t_burst`` each until ``window_s`` of load has passed, then ``t_sustained``
    (a kernel straddling the boundary is split at it, as the clock changes mid-kernel).
    """
    def elapsed(n: int) -> float:  # time to finish the first n kernels
        n_burst = window_s / t_burst
        if n <= n_burst:
            return n * t_burst
        return window_s + (n - n_burst) * t_sustained
    return elapsed(warmup + count) - elapsed(warmup)


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmBenchPoint:
    """One size of the square-GEMM benchmark, as predicted."""

    n: int
    """Matrix size (n x n @ n x n)."""
    tflops: float
    """Predicted TFLOP/s as the benchmark reports it."""
    burst_tflops: float
    """At boost throughout."""
    sustained_tflops: float
    """At the power-capped clock throughout."""
    load_s: float
    """Seconds of load of the whole run (warm-up + timed)."""


def square_gemm_benchmark(gpu: GpuSpec, params: Mapping[str, Any], sizes: tuple[int, ...], *,
                          dtype: str = "bf16", warmup: int = 6, iters: int = 30) -> list[GemmBenchPoint]:
    """Predicted TFLOP/s of ``torch.mm`` on square matrices, each size starting cold.

    NB: ignores the wall-clock timer's one synchronize (~10 us over the whole loop) and the heat
    left by the previous size (the script allocates new inputs between sizes, a pause of its own).
    """
    out = []
    for n in sizes:
        flops, nbytes = 2.0 * n ** 3, 3.0 * n * n * 2
        dims = {"m": n, "n": n, "k": n, "batch": 1}
        tb = roofline_time("gemm", dtype, dims, flops, nbytes, gpu, params, clock_ratio=1.0).seconds
        ts = roofline_time("gemm", dtype, dims, flops, nbytes, gpu, params).seconds
        t = loop_seconds(tb, ts, iters, warmup=warmup)
        out.append(GemmBenchPoint(n=n, tflops=flops * iters / t / 1e12, burst_tflops=flops / tb / 1e12,
                                  sustained_tflops=flops / ts / 1e12, load_s=loop_seconds(tb, ts, warmup + iters)))
    return out
