"""Board power and SM clock per kernel class, alone and mixed: what a power model of the kernel mix
under the board's cap needs. Needs a CUDA GPU and pynvml (``nvidia-ml-py``).

Why: kernel_db prices Hopper tensor work at the boost clock, while a training run sits at its
power limit (``docs/kernel_db.md``, "Boost burst vs power cap"). Back-to-back GEMMs settle at ~0.86
of boost on an H100 SXM, but the DGX H100 recipes' rows do not all fit that one ratio
(``docs/calibration.md``, "DGX H100 recipes"): the clock a training run settles at depends on the
power its kernel mix draws. This script measures, per class, each run for ``--run-s`` seconds
after ``--soak-s`` of GEMM heat-soak (so every class starts in the capped regime):

- ``gemm``: 8192^3 bf16 ``torch.mm``; ``gemm_fp8``: 8192^3 ``torch._scaled_mm`` (Hopper and newer);
- ``attention``: causal SDPA, [1, 32, 8192, 128] bf16, forward;
- ``stream``: a 2^28-element bf16 add (HBM-bound); ``norm``: layer_norm of [16384, 8192] bf16;
- ``idle``: ``torch.cuda._sleep`` (a spinning kernel that issues no math);
- ``mix_<f>``: GEMM and stream interleaved so that GEMMs take about fraction ``f`` of the time.

Per class it prints the median board power (W), SM clock (MHz) and kernel throughput in the last
half of the run, and the throughput relative to the same kernel right after an idle pause (its
boost-regime rate). A power model P = P_idle + sum_k share_k * (P_k - P_idle) at the clock that
keeps P at the limit can then be checked on the ``mix_`` rows.

    python benchmarks/bench_power_mix.py [--run-s 3] [--soak-s 2] [--classes gemm,stream,mix_0.8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from typing import Any, Callable

CLASSES = ("gemm", "gemm_fp8", "attention", "stream", "norm", "idle", "mix_0.5", "mix_0.8", "mix_0.95")


def _sampler(stop: threading.Event, out: list, period_s: float = 0.01) -> None:
    import pynvml  # noqa: PLC0415 -- checked in main
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    t0 = time.perf_counter()
    while not stop.is_set():
        out.append((time.perf_counter() - t0, pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                    pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0))
        time.sleep(period_s)


def _kernels(torch: Any) -> dict[str, tuple[Callable[[], Any], float]]:
    """Class -> (one launch, its work in FLOPs or bytes: the unit of the printed rate)."""
    dev, bf = "cuda", torch.bfloat16
    a = torch.randn(8192, 8192, device=dev, dtype=bf)
    big, big2 = (torch.randn(1 << 28, device=dev, dtype=bf) for _ in range(2))
    x = torch.randn(16384, 8192, device=dev, dtype=bf)
    q = torch.randn(1, 32, 8192, 128, device=dev, dtype=bf)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    out: dict[str, tuple[Callable[[], Any], float]] = {
        "gemm": (lambda: torch.mm(a, a), 2.0 * 8192 ** 3),
        "attention": (lambda: sdpa(q, q, q, is_causal=True), 4.0 * 32 * 8192 * 8192 * 128 / 2),
        "stream": (lambda: big.add(big2), 3.0 * 2 * (1 << 28)),
        "norm": (lambda: torch.nn.functional.layer_norm(x, (8192,)), 2.0 * 2 * x.numel()),
        "idle": (lambda: torch.cuda._sleep(1_000_000), 0.0),
    }
    if hasattr(torch, "float8_e4m3fn") and torch.cuda.get_device_capability() >= (8, 9):
        a8 = a.to(torch.float8_e4m3fn)
        b8 = a.to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev)
        out["gemm_fp8"] = (lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=bf),
                           2.0 * 8192 ** 3)
    return out


def _timed(torch: Any, fn: Callable[[], Any], n: int = 5) -> float:
    """Median seconds of ``n`` back-to-back launches of ``fn``, each between its own CUDA events."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for e0, e1 in ev:
        e0.record(); fn(); e1.record()
    torch.cuda.synchronize()
    return statistics.median(e0.elapsed_time(e1) * 1e-3 for e0, e1 in ev)


def _run(torch: Any, launches: list[Callable[[], Any]], seconds: float) -> int:
    """Launch ``launches`` round-robin for ``seconds`` (synchronizing every 50 rounds); rounds run."""
    n, end = 0, time.time() + seconds
    while time.time() < end:
        for _ in range(50):
            for f in launches:
                f()
        torch.cuda.synchronize()
        n += 50
    return n


def measure(torch: Any, name: str, kernels: dict, run_s: float, soak_s: float) -> dict | None:
    if name.startswith("mix_"):
        share = float(name[4:])
        g, s = kernels["gemm"][0], kernels["stream"][0]
        tg, ts = _timed(torch, g), _timed(torch, s)
        ratio = share / (1 - share) * ts / tg  # GEMM launches per stream launch for that time share
        ng, ns = (max(1, round(ratio)), 1) if ratio >= 1 else (1, max(1, round(1 / ratio)))
        launches, work, boost = [g] * ng + [s] * ns, None, None  # a rate is not meaningful for a mix
    elif name in kernels:
        fn, work = kernels[name]
        launches = [fn]
        _timed(torch, fn, 1)  # first launch: library handles and kernel selection, not the kernel
        time.sleep(2.0)  # idle: the next launch runs at boost
        boost = work / _timed(torch, fn) if work else None
    else:
        return None
    _run(torch, [kernels["gemm"][0]], soak_s)  # start capped
    stop, tel = threading.Event(), []
    th = threading.Thread(target=_sampler, args=(stop, tel), daemon=True)
    th.start()
    t0 = time.perf_counter()
    rounds = _run(torch, launches, run_s)
    wall = time.perf_counter() - t0
    stop.set(); th.join(timeout=1)
    late = [(c, p) for t, c, p in tel if t >= wall / 2] or [(c, p) for _, c, p in tel]
    rate = None
    if work:
        rate = work / _timed(torch, launches[0])  # five more launches, still in the capped regime
    return {"class": name, "power_W": statistics.median(p for _, p in late),
            "sm_MHz": statistics.median(c for c, _ in late), "rounds": rounds,
            "rate": rate, "rate_vs_boost": (rate / boost) if rate and boost else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-s", type=float, default=3.0)
    ap.add_argument("--soak-s", type=float, default=2.0)
    ap.add_argument("--classes", default=",".join(CLASSES), help=f"comma-separated; valid: {', '.join(CLASSES)}")
    args = ap.parse_args(argv)
    names = [c for c in args.classes.split(",") if c]
    bad = [c for c in names if c not in CLASSES]
    if bad:
        print(f"bench_power_mix: unknown class {bad[0]!r}; valid: {', '.join(CLASSES)}", file=sys.stderr)
        return 2
    import torch  # noqa: PLC0415
    if not torch.cuda.is_available():
        print("bench_power_mix needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    try:
        import pynvml  # noqa: PLC0415
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001
        print(f"bench_power_mix needs NVML (pip install nvidia-ml-py): {e}", file=sys.stderr)
        return 2
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    limit = pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
    print(f"device: {torch.cuda.get_device_name(0)}  power limit {limit:.0f} W  torch {torch.__version__}  "
          f"CUDA {torch.version.cuda}")
    kernels = _kernels(torch)
    print(f"{'class':>10} {'power W':>8} {'SM MHz':>7} {'rate (TFLOP/s or GB/s)':>23} {'vs boost':>9}")
    for name in names:
        r = measure(torch, name, kernels, args.run_s, args.soak_s)
        if r is None:
            print(f"{name:>10} (not on this GPU)")
            continue
        unit = 1e9 if name in ("stream", "norm") else 1e12
        rate = f"{r['rate'] / unit:.1f}" if r["rate"] else "-"
        vs = f"{r['rate_vs_boost']:.3f}" if r["rate_vs_boost"] else "-"
        print(f"{name:>10} {r['power_W']:>8.0f} {r['sm_MHz']:>7.0f} {rate:>23} {vs:>9}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
