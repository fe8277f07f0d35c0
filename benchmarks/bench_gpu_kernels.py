"""Two kernel_db modelling questions answered on a real GPU (needs CUDA; prints tables).

A. Which GEMM tile does cuBLAS pick? ``gemm.tile_policy`` ``largest_full_wave`` (the largest tile whose
   grid fills a wave) and ``best`` (best modelled option) disagree where the 256x128 grid fills
   between one and two waves. This times ``torch.mm`` (bf16) on shapes m = 2048 and m = 4096 with n
   sweeping across that band and prints the roofline price under each policy against the
   measurement (boost regime: short runs separated by idle pauses).
B. Megatron's causal softmax. ``scaled_upper_triang_masked_softmax`` (Megatron-LM
   ``fused_kernels``) holds a row in registers (one warp per row), reads only the row's unmasked
   ``i + 1`` scores and writes the whole row; backward reads the unmasked gradient and output and
   writes the row. A Triton kernel with that access pattern is timed against torch's
   ``_masked_softmax`` / ``_softmax`` and a streaming add, in GB/s of bytes actually moved.

    python benchmarks/bench_gpu_kernels.py
"""

from __future__ import annotations

import math
import sys
import time


def _time(torch, fn, reps: int = 30, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record(); fn(); b.record()
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) * 1e-3 for a, b in ev)
    return ts[len(ts) // 2]


def tile_policy(torch) -> None:
    from heterosim.cluster.gpus import get_gpu
    from kernel_db.roofline import load_efficiency, roofline_time

    name = torch.cuda.get_device_name(0)
    gpu = get_gpu("H200" if "H200" in name else "H100" if "H100" in name else "A100")
    eff = load_efficiency()
    p_full = eff.params(gpu)
    p_best = {**p_full, "gemm": {**p_full["gemm"], "tile_policy": "best"}}
    print(f"\nA. torch.mm bf16 on {name} (priced as {gpu.name}, {gpu.sm_count} SMs), boost regime")
    print(f"{'m':>5} {'n':>5} {'k':>5} {'tiles256x128':>12} {'meas TF/s':>10} {'full_wave':>10} {'best':>10}")
    errs = {"largest_full_wave": [], "best": []}
    for m in (2048, 4096):
        for n in range(1024 * 2, 1024 * 6 + 1, 256):
            for k in (4096, 8192):
                a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
                time.sleep(0.15)  # let the power limiter forget: price and measure at boost
                t = _time(torch, lambda: torch.mm(a, b), reps=20)
                f = 2.0 * m * n * k
                dims = {"m": m, "n": n, "k": k, "batch": 1}
                pf = roofline_time("gemm", "bf16", dims, f, 0, gpu, p_full, clock_ratio=1.0).seconds
                pb = roofline_time("gemm", "bf16", dims, f, 0, gpu, p_best, clock_ratio=1.0).seconds
                errs["largest_full_wave"].append(abs(math.log(pf / t)))
                errs["best"].append(abs(math.log(pb / t)))
                tiles = -(-m // 256) * -(-n // 128)
                print(f"{m:>5} {n:>5} {k:>5} {tiles:>12} {f / t / 1e12:>10.1f} {f / pf / 1e12:>10.1f} {f / pb / 1e12:>10.1f}")
    for pol, e in errs.items():
        print(f"mean |log(priced/measured)| with {pol}: {sum(e) / len(e):.3f} over {len(e)} shapes")


def _triton_softmax():
    import triton
    import triton.language as tl

    @triton.jit
    def fwd(x_ptr, y_ptr, n_cols, scale, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        i = row % n_cols  # query index within its (b, head) matrix
        offs = tl.arange(0, BLOCK)
        live = offs <= i
        x = tl.load(x_ptr + row * n_cols + offs, mask=live, other=-float("inf")).to(tl.float32) * scale
        x = x - tl.max(x, axis=0)
        e = tl.where(live, tl.exp(x), 0.0)
        y = e / tl.sum(e, axis=0)
        tl.store(y_ptr + row * n_cols + offs, y.to(tl.float16), mask=offs < n_cols)

    @triton.jit
    def bwd(g_ptr, y_ptr, dx_ptr, n_cols, scale, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        i = row % n_cols
        offs = tl.arange(0, BLOCK)
        live = offs <= i
        g = tl.load(g_ptr + row * n_cols + offs, mask=live, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + row * n_cols + offs, mask=live, other=0.0).to(tl.float32)
        gy = g * y
        dx = scale * (gy - y * tl.sum(gy, axis=0))
        tl.store(dx_ptr + row * n_cols + offs, dx.to(tl.float16), mask=offs < n_cols)

    return triton, fwd, bwd


def softmax(torch) -> None:
    print("\nB. causal softmax over fp16 scores [b, heads, s, s]: GB/s of bytes actually moved, % of streaming add")
    try:
        triton, tfwd, tbwd = _triton_softmax()
    except Exception as e:  # noqa: BLE001
        triton = None
        print(f"(no Triton: {type(e).__name__}: {e})")
    print(f"{'shape':>18} {'kernel':>34} {'ms':>8} {'GB/s':>8} {'% add':>6}")
    for b, h, s in ((16, 15, 1024), (1, 24, 2048), (4, 24, 2048)):
        n = b * h * s * s
        x = torch.randn(b, h, s, s, device="cuda", dtype=torch.float16)
        g = torch.randn_like(x)
        y = torch.empty_like(x)
        mask = torch.ones(s, s, dtype=torch.bool, device="cuda").triu(1).expand(b, h, s, s)
        tri = (s + 1) / (2 * s)  # fraction of a row that is unmasked, averaged over rows
        t_add = _time(torch, lambda: torch.add(x, g, out=y))
        add_bw = 3 * 2 * n / t_add
        rows = [("streaming add (read 2, write 1)", t_add, 3 * 2 * n)]
        ys = torch._softmax(x, -1, False)
        dx = torch.empty_like(x)
        blk = triton.next_power_of_2(s) if triton is not None else 0
        grid = (b * h * s,)
        trials = [
            ("torch _softmax fwd (read, write)", lambda: torch._softmax(x, -1, False), 2 * 2 * n),
            ("torch _softmax_backward_data", lambda: torch._softmax_backward_data(g, ys, -1, torch.float16), 3 * 2 * n),
            ("torch _masked_softmax fwd", lambda: torch._masked_softmax(x, mask, 3, 2), 2 * 2 * n + n),
            ("torch _masked_softmax_backward", lambda: torch.ops.aten._masked_softmax_backward(g, ys, mask, 3),
             3 * 2 * n + n),
        ]
        if triton is not None:
            trials += [
                ("Megatron-style fwd (tri read, full write)", lambda: tfwd[grid](x, y, s, 1.0, BLOCK=blk),
                 2 * n * tri + 2 * n),
                ("Megatron-style bwd (tri read x2, full write)", lambda: tbwd[grid](g, ys, dx, s, 1.0, BLOCK=blk),
                 2 * 2 * n * tri + 2 * n),
            ]
        for label, fn, nbytes in trials:
            try:
                rows.append((label, _time(torch, fn), nbytes))
            except Exception as e:  # noqa: BLE001 -- report and go on
                print(f"{label}: failed: {type(e).__name__}: {str(e)[:200]}")
        for label, t, nbytes in rows:
            bw = nbytes / t
            print(f"{f'{b}x{h}x{s}x{s}':>18} {label:>34} {t * 1e3:>8.3f} {bw / 1e9:>8.0f} {100 * bw / add_bw:>6.0f}")
        torch.cuda.empty_cache()


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("bench_gpu_kernels needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name(0)}  torch {torch.__version__}  CUDA {torch.version.cuda}")
    softmax(torch)
    tile_policy(torch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
