"""kernel_db's GEMM curves against published GEMM measurements (no GPU needed).

Usage::

    .venv/bin/python benchmarks/bench_published_gemm.py

Prints three tables from ``kernel_db/data/published_gemm.yaml`` (``kernel_db.published``): each
best-shape ``torch.matmul`` rate of Bekman's "Maximum Achievable Matmul FLOPS" table beside the
rate the roofline curve gives that shape at boost clock; the dtypes one harness timed side by side
(NVFP4 and bf16 on a B200) as ratios, measured and by the curves; and, for XLA's measured dots, the
mean and mean absolute log error of the curve per device and size band. ``docs/kernel_db.md`` ("GEMMs beyond
the measured GPUs") quotes the output.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_db.published import compare  # noqa: E402

BANDS = ((2**30, "1 GFLOP"), (2**33, "8.6 GFLOP"), (2**35, "34 GFLOP"))


def main() -> None:
    rows = compare()
    print("best-shape torch.matmul (Bekman, ml-engineering), boost clock")
    print(f"{'gpu':16s} {'dtype':5s} {'m x n x k':>20s} {'published':>9s} {'curve':>7s} {'error':>7s}")
    for r, c, _ in rows:
        if r.source == "mamf":
            print(f"{r.gpu:16s} {r.dtype:5s} {f'{r.m}x{r.n}x{r.k}':>20s} {r.tflops:9.1f} {c:7.1f} {c / r.tflops - 1:+7.1%}")
    print()
    print("one harness, two dtypes (pytorch/ao PR 2427, B200): fp4 / bf16 throughput ratio")
    print(f"{'m x n x k':>20s} {'bf16':>7s} {'fp4':>7s} {'measured':>8s} {'curves':>7s} {'error':>7s}")
    pairs: dict = {}
    for r, c, _ in rows:
        if r.source == "harness":
            pairs.setdefault((r.m, r.n, r.k), {})[r.dtype] = (r.tflops, c)
    for (m, n, k), d in pairs.items():
        meas, curve = d["fp4"][0] / d["bf16"][0], d["fp4"][1] / d["bf16"][1]
        print(f"{f'{m}x{n}x{k}':>20s} {d['bf16'][0]:7.0f} {d['fp4'][0]:7.0f} {meas:8.2f} {curve:7.2f} {curve / meas - 1:+7.1%}")
    print()
    print("XLA measured dots (matmul_interpolator_data.h), bf16: curve vs measured, log error")
    print(f"{'device':16s} {'gpu':16s} {'from':>10s} {'rows':>5s} {'mean':>7s} {'mean |.|':>8s}")
    for dev in sorted({r.source for r, _, _ in rows if r.source.startswith("xla:")}):
        for lo, label in BANDS:
            sel = [(r, e) for r, _, e in rows if r.source == dev and r.flops >= lo]
            errs = [e for _, e in sel]
            print(f"{dev[4:]:16s} {sel[0][0].gpu:16s} {label:>10s} {len(errs):5d} {sum(errs) / len(errs):+7.3f} "
                  f"{sum(map(abs, errs)) / len(errs):8.3f}")


if __name__ == "__main__":
    main()
