"""Boost burst vs power-capped clocks: how long a dense GEMM load runs before the GPU's power
limiter lowers its clock, and what that does to a short GEMM benchmark. Needs a CUDA GPU.

Why: a GEMM benchmark that runs a few milliseconds per size (public_cases.yaml
``kernel-a100-pcie40-torch-bf16-square-gemm``: 6 warm-up + 30 timed ``torch.mm`` per size) measures
the boost clock on small sizes and the power-capped clock on large ones, while training keeps the GPU
at its power limit. ``kernel_db`` prices the sustained regime (``docs/kernel_db.md``, "Clocks under
a power cap"); this script measures the two regimes and the time between them.

Part A: after an idle pause, back-to-back 8192^3 bf16 GEMMs, each between CUDA events (no gaps);
prints TFLOP/s per time window since the load began (and NVML clock/power if pynvml is present).
Part B: the public benchmark's own method (wall clock over 30 ``torch.mm`` after 6 warm-ups) per
size, once after an idle pause (cold) and once right after a 3 s heat soak (hot).

    python benchmarks/bench_power_regime.py [--soak-s 3] [--series-s 4]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time


def _nvml_sampler(stop: threading.Event, out: list, period_s: float = 0.005):
    try:
        import pynvml  # noqa: PLC0415 -- optional
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # noqa: BLE001 -- telemetry is optional
        return
    t0 = time.perf_counter()
    while not stop.is_set():
        try:
            clk = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
            pw = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
        except Exception:  # noqa: BLE001
            return
        out.append((time.perf_counter() - t0, clk, pw))
        time.sleep(period_s)


def series(torch, n: int = 8192, seconds: float = 4.0, idle_s: float = 3.0) -> list[tuple[float, float]]:
    """(ms since the load began, TFLOP/s) for each GEMM of a back-to-back run after ``idle_s`` idle."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    torch.mm(a, b)
    torch.cuda.synchronize()
    time.sleep(idle_s)
    # Estimate the count from one GEMM so the run lasts ~seconds.
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record(); torch.mm(a, b); e1.record(); torch.cuda.synchronize()
    count = max(10, int(seconds * 1e3 / e0.elapsed_time(e1)))
    time.sleep(idle_s)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
    ev[0].record()
    for i in range(count):
        torch.mm(a, b)
        ev[i + 1].record()
    torch.cuda.synchronize()
    flops = 2.0 * n ** 3
    out, t = [], 0.0
    for i in range(count):
        dt = ev[i].elapsed_time(ev[i + 1])
        t += dt
        out.append((t, flops / (dt * 1e-3) / 1e12))
    return out


def public_method(torch, size: int, warmup: int = 6, iters: int = 30) -> float:
    """TFLOP/s as public_cases' source measures it (torch-performance-test-data ``test.py``)."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(warmup):
        torch.mm(a, b)
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(iters):
        torch.mm(a, b)
    torch.cuda.synchronize()
    return 2.0 * size ** 3 * iters / (time.time() - t0) / 1e12


def soak(torch, seconds: float) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            torch.mm(a, a)
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--soak-s", type=float, default=3.0)
    ap.add_argument("--series-s", type=float, default=4.0)
    args = ap.parse_args(argv)
    import torch  # noqa: PLC0415
    if not torch.cuda.is_available():
        print("bench_power_regime needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name(0)}  torch {torch.__version__}  CUDA {torch.version.cuda}")

    stop, tel = threading.Event(), []
    th = threading.Thread(target=_nvml_sampler, args=(stop, tel), daemon=True)
    th.start()
    s = series(torch, seconds=args.series_s)
    stop.set(); th.join(timeout=1)
    print("\nA. back-to-back 8192^3 bf16 GEMMs after 3 s idle (CUDA events per GEMM)")
    print(f"{'window (ms since load began)':>30} {'GEMMs':>6} {'TFLOP/s median':>15}")
    edges = [0, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 1e9]
    for lo, hi in zip(edges, edges[1:]):
        w = sorted(tf for t, tf in s if lo <= t < hi)
        if w:
            print(f"{f'{lo:g}-{hi:g}' if hi < 1e9 else f'>= {lo:g}':>30} {len(w):>6} {w[len(w) // 2]:>15.1f}")
    if tel:
        print("NVML samples (s since sampler start, SM MHz, W):", " ".join(f"{t:.2f}:{c}/{p:.0f}" for t, c, p in tel[:: max(1, len(tel) // 40)]))
    else:
        print("(no NVML telemetry: pynvml not installed)")

    print("\nB. the public benchmark's method (6 warm-up + 30 torch.mm, wall clock), bf16")
    print(f"{'size':>6} {'cold TF/s':>10} {'hot TF/s':>10} {'run ms (cold)':>14}")
    for size in (1024, 2048, 4096, 8192, 10240):
        time.sleep(3.0)
        t0 = time.time(); cold = public_method(torch, size); run_ms = (time.time() - t0) * 1e3
        soak(torch, args.soak_s)
        hot = public_method(torch, size)
        print(f"{size:>6} {cold:>10.1f} {hot:>10.1f} {run_ms:>14.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
