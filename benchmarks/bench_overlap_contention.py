"""Compute kernels' speed while a communication kernel holds some of the SMs: what the replay's
overlap slowdown (``replay.simulate.OVERLAP_SLOWDOWN``) stands for. Needs a CUDA GPU, CuPy and
pynvml (``nvidia-ml-py``).

NCCL runs a collective as one CUDA block per channel, each resident on its own SM for the
collective's whole life (``src/device/common.h``: ``ncclKernelMain``, ``blockIdx.x`` is the
channel; 512 threads a block for the Simple protocol, ``NCCL_SIMPLE_MAX_NTHREADS``; per-warp scratch
in dynamic shared memory on sm_70+). A compute kernel launched beside it gets the other SMs and
shares HBM bandwidth and the board's power with it. One GPU cannot run a collective with itself
(NCCL refuses two ranks on one device), so the communication kernel here is a stand-in with NCCL's
launch shape: ``C`` blocks of 512 threads, each holding ``--smem-kib`` of shared memory (so no
GEMM or attention block fits beside it on its SM), in one of two modes:

- ``spin``: waiting on a flag, as a collective blocked on its peers (SMs taken, no traffic);
- ``copy``: each block streaming its own 1 MiB slice HBM to HBM as fast as it can (a collective
  moving data: a ring step reads its input and the peer's incoming chunk and writes its output,
  3-4 bytes of local HBM traffic per byte on the wire: ~1.5 TB/s at NVLink 4's 450 GB/s).

It runs until the compute stream, done with its kernels, sets the flag, and never longer than 10 s
(a lazy initialisation that synchronizes the device while it runs, a first cuBLAS call say, would
otherwise wait for it forever). Per compute class and
``(C, mode)`` the compute kernel runs back to back for ``--run-s`` seconds (after a ``--soak-s``
heat-soak of its own, so every point is in the power-capped regime a training run is in); the
script prints the median kernel time over the last half relative to the same class alone, run for
as long right before the point, the board's median power and SM clock (NVML), and the
communication kernel's HBM traffic (read + write). The class's row with 0 blocks is its median
time alone and the spread of those baselines (``drift``).

    python benchmarks/bench_overlap_contention.py [--run-s 0.4] [--soak-s 1] [--json out.json]
    python benchmarks/bench_overlap_contention.py --table benchmarks/data/overlap_contention_h200_*.json

``--table`` prints the Markdown table of ``docs/replay.md`` from saved runs (no GPU needed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable

from bench_power_mix import _sampler  # NVML clock and power, every 10 ms

CHANNELS = (4, 8, 16, 24, 32, 64)
MODES = ("spin", "copy")
CLASSES = ("gemm_bf16", "gemm_fp8", "gemm_bf16_fc1", "gemm_fp8_fc1", "attention", "norm", "stream")
SLICE = 1 << 20  # bytes a copy block moves per pass (its own slice, read then written elsewhere)

_SRC = r"""
extern "C" __global__ void comm(const float4* __restrict__ src, float4* __restrict__ dst,
                                unsigned long long flag_ptr, int mode, unsigned long long* moved,
                                unsigned long long max_ns) {
    const volatile int* flag = (const volatile int*)flag_ptr;
    extern __shared__ float4 scratch[];          // held, as NCCL's per-warp scratch is
    __shared__ int stop;
    const unsigned long long per = %(slice)d / sizeof(float4);
    const float4* s = src + blockIdx.x * per;
    float4* d = dst + blockIdx.x * per;
    unsigned long long bytes = 0, t0, t;
    asm volatile("mov.u64 %%0, %%globaltimer;" : "=l"(t0));
    for (;;) {
        if (mode == 1) {
            for (unsigned long long i = threadIdx.x; i < per; i += blockDim.x) d[i] = s[i];
            bytes += 2ull * per * sizeof(float4);
        } else if (threadIdx.x == 0) {
            __nanosleep(500);
        }
        if (threadIdx.x == 0) {
            asm volatile("mov.u64 %%0, %%globaltimer;" : "=l"(t));
            stop = *flag || t - t0 > max_ns;  // never outlives max_ns, whatever the compute side does
            scratch[0].x = (float)stop;
        }
        __syncthreads();
        if (stop) break;
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(moved, bytes);
}
"""


def _kernels(torch: Any) -> dict[str, Callable[[], Any]]:
    """Class -> one launch. ``_fc1``: GPT-3 175B's FC1 forward at the DGX H100 recipe's per-rank
    shape (2,048 tokens, TP 4: 2048 x 12288 @ 12288 x 12288); fp8 as Transformer Engine's dgrad /
    wgrad run it (split accumulator, ``use_fast_accum=False``)."""
    dev, bf = "cuda", torch.bfloat16
    a = torch.randn(8192, 8192, device=dev, dtype=bf)
    x, w = torch.randn(2048, 12288, device=dev, dtype=bf), torch.randn(12288, 12288, device=dev, dtype=bf)
    big, big2 = (torch.randn(1 << 28, device=dev, dtype=bf) for _ in range(2))
    xn = torch.randn(16384, 8192, device=dev, dtype=bf)
    q = torch.randn(1, 32, 8192, 128, device=dev, dtype=bf)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    out: dict[str, Callable[[], Any]] = {
        "gemm_bf16": lambda: torch.mm(a, a),
        "gemm_bf16_fc1": lambda: torch.mm(x, w),
        "attention": lambda: sdpa(q, q, q, is_causal=True),
        "norm": lambda: torch.nn.functional.layer_norm(xn, (8192,)),
        "stream": lambda: big.add(big2),
    }
    if hasattr(torch, "float8_e4m3fn") and torch.cuda.get_device_capability() >= (8, 9):
        one, f8 = torch.ones((), device=dev), torch.float8_e4m3fn
        a8, b8 = a.to(f8), a.to(f8).t()
        x8, w8 = x.to(f8), w.to(f8).t()
        out["gemm_fp8"] = lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=bf,
                                                   use_fast_accum=False)
        out["gemm_fp8_fc1"] = lambda: torch._scaled_mm(x8, w8, scale_a=one, scale_b=one, out_dtype=bf,
                                                       use_fast_accum=False)
    return out


class Comm:
    """The stand-in communication kernel (CuPy RawKernel) on a non-blocking stream of its own.

    Nothing of a point runs on the legacy default stream: a blocking stream's work would wait for
    the communication kernel, which waits for the compute stream's flag (a deadlock)."""

    def __init__(self, torch: Any, cp: Any, smem_kib: int) -> None:
        self.torch, self.cp = torch, cp
        self.kernel = cp.RawKernel(_SRC % {"slice": SLICE}, "comm")
        self.smem = smem_kib * 1024
        self.max_s = 10.0
        if self.smem > 48 * 1024:
            self.kernel.max_dynamic_shared_size_bytes = self.smem
        n = max(CHANNELS) * SLICE // 4
        self.src, self.dst = cp.ones(n, dtype=cp.float32), cp.zeros(n, dtype=cp.float32)
        self.moved = cp.zeros(1, dtype=cp.uint64)
        self.flag = torch.zeros(1, dtype=torch.int32, device="cuda")  # set by the compute stream
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.ev = (cp.cuda.Event(), cp.cuda.Event())
        cp.cuda.Device().synchronize()

    def start(self, blocks: int, mode: str) -> None:
        self.flag.zero_()
        self.torch.cuda.synchronize()
        with self.stream:
            self.moved.fill(0)
            self.ev[0].record(self.stream)
            self.kernel((blocks,), (512,), (self.src, self.dst, self.cp.uint64(self.flag.data_ptr()),
                                            self.cp.int32(MODES.index(mode)), self.moved,
                                            self.cp.uint64(int(self.max_s * 1e9))),
                        shared_mem=self.smem)
            self.ev[1].record(self.stream)

    def stop(self, timeout_s: float = 20.0) -> float:
        """Set the flag from the current (compute) stream; the kernel's HBM traffic in bytes/s."""
        self.flag.fill_(1)
        end = time.time() + timeout_s
        while not self.ev[1].done:
            if time.time() > end:
                print("bench_overlap_contention: the communication kernel did not stop (deadlock)",
                      file=sys.stderr, flush=True)
                os._exit(3)
            time.sleep(0.001)
        self.torch.cuda.synchronize()
        with self.stream:
            moved = float(self.moved.get(stream=self.stream)[0])
        ran_s = self.cp.cuda.get_elapsed_time(self.ev[0], self.ev[1]) * 1e-3
        if ran_s >= self.max_s:
            raise RuntimeError(f"the communication kernel stopped itself after {self.max_s:g} s, before the "
                               f"compute kernels ended: part of the point ran without it; give a shorter --run-s")
        return moved / ran_s


def _point(torch: Any, fn: Callable[[], Any], n: int, comm: Comm | None, blocks: int, mode: str) -> dict:
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    if comm is not None:
        comm.start(blocks, mode)
        time.sleep(0.002)  # its blocks are resident before the first compute kernel
    stop, tel = threading.Event(), []
    th = threading.Thread(target=_sampler, args=(stop, tel), daemon=True)
    th.start()
    for e0, e1 in ev:
        e0.record(); fn(); e1.record()
    bw = comm.stop() if comm is not None else 0.0
    torch.cuda.synchronize()
    stop.set(); th.join(timeout=1)
    late = [(c, p) for t, c, p in tel if t >= tel[-1][0] / 2] if tel else [(0, 0.0)]
    times = [e0.elapsed_time(e1) * 1e-3 for e0, e1 in ev[n // 2:]]
    return {"t_s": statistics.median(times), "comm_Bps": bw,
            "sm_MHz": statistics.median(c for c, _ in late), "power_W": statistics.median(p for _, p in late)}


def measure(torch: Any, name: str, fn: Callable[[], Any], comm: Comm, run_s: float, soak_s: float) -> list[dict]:
    fn(); torch.cuda.synchronize()  # library handles and kernel choice
    t0 = time.perf_counter()
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    one = (time.perf_counter() - t0) / 20
    n = max(20, int(run_s / one))
    end = time.time() + soak_s
    while time.time() < end:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    base, rows = [], []
    for mode in MODES:
        for c in CHANNELS:
            # each point beside its own baseline, measured right before it: the board's clock drifts
            # by a few percent over a class's points (seen: 2-5% between the first and the last)
            alone = _point(torch, fn, n, None, 0, "spin")
            r = {"class": name, "blocks": c, "mode": mode, **_point(torch, fn, n, comm, c, mode)}
            r["t_alone_s"] = alone["t_s"]
            r["slowdown"] = 1 - alone["t_s"] / r["t_s"]  # the replay's F: speed lost while the comm runs
            base.append(alone)
            rows.append(r)
    times = [b["t_s"] for b in base]
    out = [{"class": name, "blocks": 0, "mode": "-", **base[0], "t_s": statistics.median(times),
            "drift": max(times) / min(times) - 1}]
    return out + rows


def table(runs: list[dict]) -> str:
    """Markdown: per class, the time alone and the slowdown at each block count, ``spin · copy``,
    each run's value joined by ``/`` (runs in the order given)."""
    cells: dict[tuple, list[float]] = {}
    alone: dict[str, list[float]] = {}
    for run in runs:
        for r in run["rows"]:
            if r["blocks"] == 0:
                alone.setdefault(r["class"], []).append(r["t_s"])
            else:
                cells.setdefault((r["class"], r["blocks"], r["mode"]), []).append(r["slowdown"])
    blocks = sorted({k[1] for k in cells})
    sms = runs[0]["sms"]
    lines = ["| class | alone (ms) | " + " | ".join(f"{b} CTAs ({b / sms:.2f})" for b in blocks) + " |",
             "|---|---|" + "---|" * len(blocks)]
    for name in [c for c in CLASSES if c in alone]:
        row = [name, "/".join(f"{t * 1e3:.2f}" for t in alone[name])]
        for b in blocks:
            row.append(" · ".join("/".join(f"{v:.2f}" for v in cells.get((name, b, m), [])) or "-" for m in MODES))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-s", type=float, default=0.4)
    ap.add_argument("--soak-s", type=float, default=1.0)
    ap.add_argument("--smem-kib", type=int, default=64, help="shared memory each comm block holds")
    ap.add_argument("--classes", default=",".join(CLASSES), help=f"comma-separated; valid: {', '.join(CLASSES)}")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the Markdown table of saved runs and exit")
    args = ap.parse_args(argv)
    if args.table:
        runs = []
        for path in args.table:
            with open(path) as f:
                run = json.load(f)
            if run.get("schema_version") != 1 or "rows" not in run:
                print(f"bench_overlap_contention: {path} is not a saved run (schema_version 1 with rows); "
                      f"write one with --json", file=sys.stderr)
                return 2
            runs.append(run)
        print(table(runs))
        return 0
    names = [c for c in args.classes.split(",") if c]
    unknown = next((c for c in names if c not in CLASSES), None)
    if unknown:
        print(f"bench_overlap_contention: unknown class {unknown!r}; valid: {', '.join(CLASSES)}", file=sys.stderr)
        return 2
    try:
        import torch  # noqa: PLC0415
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU found")
        import cupy as cp  # noqa: PLC0415
        import pynvml  # noqa: PLC0415
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001
        print(f"bench_overlap_contention needs a CUDA GPU, CuPy and NVML (nvidia-ml-py): {e}", file=sys.stderr)
        return 2
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device: {torch.cuda.get_device_name(0)}  {sms} SMs  power limit "
          f"{pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000:.0f} W  torch {torch.__version__}  "
          f"CUDA {torch.version.cuda}  comm block: 512 threads, {args.smem_kib} KiB shared")
    comm = Comm(torch, cp, args.smem_kib)
    kernels = _kernels(torch)
    torch.cuda.synchronize()
    torch.cuda.set_stream(torch.cuda.Stream())  # the compute stream: not the legacy default one
    # the comm kernel alone: its traffic per block count (compute stream idle but for the flag)
    print("comm kernel alone, copy mode: " + "  ".join(
        f"{c}: {_point(torch, lambda: torch.cuda._sleep(2_000_000), 20, comm, c, 'copy')['comm_Bps'] / 1e9:.0f} GB/s"
        for c in CHANNELS))
    rows: list[dict] = []
    print(f"{'class':>14} {'blocks':>6} {'mode':>5} {'time ms':>8} {'slowdown':>8} {'ideal':>6} "
          f"{'comm GB/s':>9} {'SM MHz':>7} {'power W':>7}")
    for name in names:
        if name not in kernels:
            print(f"{name:>14} (not on this GPU)")
            continue
        try:
            measured = measure(torch, name, kernels[name], comm, args.run_s, args.soak_s)
        except RuntimeError as e:  # the stand-in kernel stopped itself before the point ended
            print(f"bench_overlap_contention: {name}: {e}", file=sys.stderr)
            return 2
        for r in measured:
            rows.append(r)
            ideal = f"{r['blocks'] / sms:.3f}" if r["blocks"] else "-"
            slow = f"{r['slowdown']:+.3f}" if "slowdown" in r else f"d{r['drift']:+.3f}"
            print(f"{name:>14} {r['blocks']:>6} {r['mode']:>5} {r['t_s'] * 1e3:>8.3f} {slow:>8} {ideal:>6} "
                  f"{r['comm_Bps'] / 1e9:>9.0f} {r['sm_MHz']:>7.0f} {r['power_W']:>7.0f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema_version": 1, "device": torch.cuda.get_device_name(0), "sms": sms,
                       "smem_kib": args.smem_kib, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
