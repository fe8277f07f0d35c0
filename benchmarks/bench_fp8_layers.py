"""A transformer layer's GEMMs in bf16 and in fp8, at the per-rank shapes of the Hopper-era models:
each GEMM at the boost clock, and the whole layer's GEMMs back to back under the board's power cap.
Needs a CUDA GPU with fp8 tensor cores (Hopper or newer); ``--device cpu --tiny`` runs the same code
on small shapes (a smoke test: its times mean nothing). pynvml (``nvidia-ml-py``) adds board power
and SM clock.

Why: kernel_db prices an fp8 GEMM from a curve fitted on square-ish sweeps of ``torch._scaled_mm``
and moves every tensor kernel to one sustained clock per board. What a training step's fp8 gain is
depends on (1) the fp8 / bf16 time of its actual GEMM shapes (thin QKV and projection GEMMs of a
TP-sharded layer), (2) the accumulation mode Transformer Engine asks for (fast accumulation in the
forward GEMM; split accumulator, i.e. ``use_fast_accum=False``, in the dgrad and wgrad GEMMs:
TE 1.x ``module/base.py`` ``_2X_ACC_FPROP = False``, ``_2X_ACC_DGRAD = _2X_ACC_WGRAD = True``) and
(3) the clock each dtype's GEMM mix settles at under the power cap. This script measures all three.

Per linear layer of a TP-sharded transformer layer (QKV, attention projection, FC1, FC2), with
``m`` tokens per rank, ``k`` inputs and ``n`` outputs per rank, three GEMMs: forward ``(m, n, k)``,
dgrad ``(m, k, n)``, wgrad ``(n, k, m)`` (as M, N, K). bf16 runs them in Megatron's layouts
(``x @ W.T``, ``dy @ W``, ``dy.T @ x``); fp8 as TE does on Hopper, every GEMM "TN" (operands
transposed beforehand), through ``torch._scaled_mm`` with tensor-wise scales and bf16 output.

- ``boost``: each GEMM alone after a 0.2 s pause (the board is at boost for ~50 ms of load), the
  median of ``--repeats`` CUDA-event timings over input sets rotated to exceed twice the L2;
  fp8 in both accumulation modes.
- ``sustained``: the layer's 12 GEMMs (and, in ``+attn`` rows, causal flash attention forward and
  backward at the layer's heads, bf16 in both) back to back for ``--run-s`` seconds after
  ``--soak-s`` seconds of the same loop: time per layer, median board power and SM clock; and
  the ratio of that time to the sum of the boost times of the same kernels.

    python benchmarks/bench_fp8_layers.py [--models llama3.1-70b,llama3.1-405b] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_db.profile import Clock  # noqa: E402

# name: hidden, ffn, heads, query groups, tokens per rank per micro-batch, TP, gated MLP (SwiGLU)
# (the DGX H100 recipes of validation/hopper_cases.yaml: Llama 3.1 with CP 2 and seq 8192, so 4096
# tokens per rank; Nemotron-4 15B micro-batch 4 x 4096).
MODELS: dict[str, tuple[int, int, int, int, int, int, bool]] = {
    "gpt3-175b": (12288, 49152, 96, 96, 2048, 4, False),
    "llama3.1-8b": (4096, 14336, 32, 8, 4096, 1, True),
    "llama3.1-70b": (8192, 28672, 64, 8, 4096, 4, True),
    "llama3.1-405b": (16384, 53248, 128, 8, 4096, 8, True),
    "nemotron4-15b": (6144, 24576, 48, 8, 16384, 4, False),
    "nemotron4-340b": (18432, 73728, 96, 8, 4096, 8, False),
}
TINY = {"tiny": (64, 128, 2, 1, 32, 2, True)}
PASSES = ("fprop", "dgrad", "wgrad")


def linears(h: int, ffn: int, heads: int, groups: int, tokens: int, tp: int, gated: bool) -> dict[str, tuple[int, int, int]]:
    """Linear layer -> (m tokens, k inputs, n outputs) per TP rank."""
    hd = h // heads
    return {"qkv": (tokens, h, (h + 2 * groups * hd) // tp), "proj": (tokens, h // tp, h),
            "fc1": (tokens, h, ffn * (2 if gated else 1) // tp), "fc2": (tokens, ffn // tp, h)}


def gemm_mnk(m: int, k: int, n: int, pas: str) -> tuple[int, int, int]:
    return {"fprop": (m, n, k), "dgrad": (m, k, n), "wgrad": (n, k, m)}[pas]


def make_gemm(torch: Any, dev: str, dtype: str, pas: str, m: int, k: int, n: int, fast: bool, sets: int) -> tuple[Callable, list]:
    """One GEMM of a linear layer as the framework runs it, and ``sets`` input sets for it."""
    bf = torch.bfloat16
    M, N, K = gemm_mnk(m, k, n, pas)
    if dtype == "fp8":
        one = torch.ones((), device=dev)
        e4 = torch.float8_e4m3fn

        def mk() -> tuple:
            return (torch.randn(M, K, device=dev, dtype=bf).to(e4), torch.randn(N, K, device=dev, dtype=bf).to(e4).t())
        return (lambda a, b: torch._scaled_mm(a, b, one, one, out_dtype=bf, use_fast_accum=fast)), [mk() for _ in range(sets)]
    if pas == "fprop":   # x [m,k] @ W[n,k].T
        def mk() -> tuple:
            return torch.randn(m, k, device=dev, dtype=bf), torch.randn(n, k, device=dev, dtype=bf).t()
    elif pas == "dgrad":  # dy [m,n] @ W[n,k]
        def mk() -> tuple:
            return torch.randn(m, n, device=dev, dtype=bf), torch.randn(n, k, device=dev, dtype=bf)
    else:                 # dy[m,n].T @ x[m,k]
        def mk() -> tuple:
            return torch.randn(m, n, device=dev, dtype=bf).t(), torch.randn(m, k, device=dev, dtype=bf)
    return torch.mm, [mk() for _ in range(sets)]


def n_sets(m: int, k: int, n: int, dtype: str, l2_bytes: int) -> int:
    per = (m * k + k * n + m * n) * (1 if dtype == "fp8" else 2)
    return max(2, min(6, math.ceil(2 * l2_bytes / per)))


def boost_time(tm: Clock, fn: Callable, sets: list, repeats: int, pause_s: float) -> float:
    fn(*sets[0])
    tm.synchronize()
    time.sleep(pause_s)
    marks = []
    for i in range(repeats):
        a = tm.record()
        fn(*sets[i % len(sets)])
        marks.append((a, tm.record()))
    tm.synchronize()
    return statistics.median(tm.elapsed_s(a, b) for a, b in marks)


def _sampler(stop: threading.Event, out: list) -> None:
    import pynvml  # noqa: PLC0415
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    while not stop.is_set():
        out.append((pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM), pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0))
        time.sleep(0.02)


def sustained(tm: Clock, steps: list[Callable], run_s: float, soak_s: float, nvml: bool) -> dict:
    """Run ``steps`` (one layer) back to back: soak, then time; seconds per layer, power, clock."""
    def loop(seconds: float) -> tuple[int, float]:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(4):
                for f in steps:
                    f()
            tm.synchronize()
            n += 4
        return n, time.perf_counter() - t0
    loop(soak_s)
    tel: list = []
    stop = threading.Event()
    th = threading.Thread(target=_sampler, args=(stop, tel), daemon=True) if nvml else None
    if th:
        th.start()
    n, wall = loop(run_s)
    stop.set()
    if th:
        th.join(timeout=1)
    late = tel[len(tel) // 4:] or tel
    return {"layer_s": wall / n, "layers": n, "power_W": statistics.median(p for _, p in late) if late else None,
            "sm_MHz": statistics.median(c for c, _ in late) if late else None}


def attention_steps(torch: Any, dev: str, heads: int, h: int, tokens: int, tp: int) -> list[Callable]:
    """Causal flash attention forward + backward at one rank's heads (bf16). Keys and values are
    given per query head (grouped-query attention expanded: the same FLOPs, a little more memory
    traffic)."""
    hd, hq = h // heads, max(1, heads // tp)
    q = torch.randn(1, hq, tokens, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
    kv = torch.randn(1, hq, tokens, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def fwd_bwd() -> None:
        o = sdpa(q, kv, kv, is_causal=True)
        o.backward(torch.ones_like(o))
    return [fwd_bwd]


def run_model(torch: Any, dev: str, name: str, spec: tuple, args: argparse.Namespace, tm: Clock, nvml: bool, l2: int) -> dict:
    h, _, heads, _, tokens, tp, _ = spec
    res: dict[str, Any] = {"model": name, "gemms": [], "sustained": {}}
    fns: dict[str, list[Callable]] = {"bf16": [], "fp8": []}
    boost_sum = {"bf16": 0.0, "fp8": 0.0}
    for lin, (m, k, n) in linears(*spec).items():
        for pas in PASSES:
            M, N, K = gemm_mnk(m, k, n, pas)
            row: dict[str, Any] = {"linear": lin, "pass": pas, "M": M, "N": N, "K": K}
            fn, sets = make_gemm(torch, dev, "bf16", pas, m, k, n, False, n_sets(M, N, K, "bf16", l2))
            row["bf16_s"] = boost_time(tm, fn, sets, args.repeats, args.pause_s)
            fns["bf16"].append(lambda fn=fn, s=sets[0]: fn(*s))
            for fast in (True, False):
                f8, s8 = make_gemm(torch, dev, "fp8", pas, m, k, n, fast, n_sets(M, N, K, "fp8", l2))
                row["fp8_fast_s" if fast else "fp8_split_s"] = boost_time(tm, f8, s8, args.repeats, args.pause_s)
                if fast == (pas == "fprop"):  # TE: fast accumulation in fprop only
                    fns["fp8"].append(lambda f8=f8, s=s8[0]: f8(*s))
            row["fp8_te_s"] = row["fp8_fast_s"] if pas == "fprop" else row["fp8_split_s"]
            row["tflops_bf16"] = 2 * M * N * K / row["bf16_s"] / 1e12
            row["tflops_fp8_te"] = 2 * M * N * K / row["fp8_te_s"] / 1e12
            boost_sum["bf16"] += row["bf16_s"]
            boost_sum["fp8"] += row["fp8_te_s"]
            res["gemms"].append(row)
            del sets
    att = attention_steps(torch, dev, heads, h, tokens, tp)
    a_boost = boost_time(tm, lambda: att[0](), [()], max(3, args.repeats // 4), args.pause_s)
    res["attention_boost_s"] = a_boost
    for dt in ("bf16", "fp8"):
        s = sustained(tm, fns[dt], args.run_s, args.soak_s, nvml)
        s["vs_boost"] = boost_sum[dt] / s["layer_s"]
        res["sustained"][dt] = s
        sa = sustained(tm, fns[dt] + att, args.run_s, args.soak_s, nvml)
        sa["vs_boost"] = (boost_sum[dt] + a_boost) / sa["layer_s"]
        res["sustained"][dt + "+attn"] = sa
    res["boost_sum"] = boost_sum
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated; valid: {', '.join(MODELS)}")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="one small layer (smoke test of the code path)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--pause-s", type=float, default=0.2)
    ap.add_argument("--run-s", type=float, default=2.0)
    ap.add_argument("--soak-s", type=float, default=1.5)
    ap.add_argument("--out", help="write every figure here (JSON)")
    args = ap.parse_args(argv)
    table = TINY if args.tiny else MODELS
    names = ["tiny"] if args.tiny else [x for x in args.models.split(",") if x]
    bad = [x for x in names if x not in table]
    if bad:
        print(f"bench_fp8_layers: unknown model {bad[0]!r}; valid: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    import torch  # noqa: PLC0415
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("bench_fp8_layers needs a CUDA GPU (none found); --device cpu --tiny runs the code path", file=sys.stderr)
        return 2
    nvml = False
    if cuda:
        try:
            import pynvml  # noqa: PLC0415
            pynvml.nvmlInit()
            nvml = True
        except Exception:  # noqa: BLE001
            pass
    tm = Clock(torch, args.device)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if cuda else 1 << 20
    env = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
           "cuda": torch.version.cuda}
    print(f"device {env['device']}  torch {env['torch']}  CUDA {env['cuda']}  nvml {nvml}", flush=True)
    out: dict[str, Any] = {"schema_version": 1, "env": env, "models": []}
    for name in names:
        r = run_model(torch, args.device, name, table[name], args, tm, nvml, l2)
        out["models"].append(r)
        if args.out:
            with open(args.out + ".tmp", "w") as f:
                json.dump(out, f, indent=1)
            import os  # noqa: PLC0415
            os.replace(args.out + ".tmp", args.out)
        print(f"\n{name}: {'gemm':<12} {'M':>6} {'N':>6} {'K':>6} {'bf16 TF/s':>9} {'fp8 fast':>9} {'fp8 split':>9} {'fp8/bf16 (TE)':>13}")
        for g in r["gemms"]:
            M, N, K = g["M"], g["N"], g["K"]
            tf = lambda s: 2 * M * N * K / s / 1e12  # noqa: E731
            print(f"{'':<{len(name) + 2}}{g['linear'] + ' ' + g['pass']:<12} {M:>6} {N:>6} {K:>6} {tf(g['bf16_s']):>9.0f} "
                  f"{tf(g['fp8_fast_s']):>9.0f} {tf(g['fp8_split_s']):>9.0f} {g['fp8_te_s'] / g['bf16_s']:>13.3f}")
        bs = r["boost_sum"]
        print(f"  boost: layer GEMMs bf16 {bs['bf16'] * 1e3:.3f} ms, fp8 {bs['fp8'] * 1e3:.3f} ms, ratio {bs['fp8'] / bs['bf16']:.3f};"
              f" attention fwd+bwd {r['attention_boost_s'] * 1e3:.3f} ms")
        for k, s in r["sustained"].items():
            pw = f"{s['power_W']:.0f} W {s['sm_MHz']:.0f} MHz" if s["power_W"] else "-"
            print(f"  sustained {k:<9} {s['layer_s'] * 1e3:8.3f} ms/layer  boost/sustained {s['vs_boost']:.3f}  {pw}")
        sus = r["sustained"]
        print(f"  sustained fp8/bf16: GEMMs {sus['fp8']['layer_s'] / sus['bf16']['layer_s']:.3f}, "
              f"with attention {sus['fp8+attn']['layer_s'] / sus['bf16+attn']['layer_s']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
