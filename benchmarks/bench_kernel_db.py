"""Benchmark kernel_db pricing on a GPT-3 175B TP8 PP8 DP16 (1024 GPUs) trace, and the public GEMM case.

Usage::

    .venv/bin/python benchmarks/bench_kernel_db.py [--trace TRACE]

Without ``--trace`` it synthesizes the trace's op mix (per layer per micro-batch: LN, QKV, flash
attention, proj, dropout-add, LN, fc1, GeLU, fc2, dropout-add forward; the backward with dgrad and
wgrad GEMMs; SP all-gather / reduce-scatter and pipeline p2p; embedding on the first stage,
logits + cross-entropy on the last; 96 micro-batches referenced through each stage's program).
It prints, for 3 GPU types, the time to price every op of every role with a fresh
:class:`kernel_db.Pricer` (cold) and again (warm), with an empty DB (all roofline) and with a DB
that measured every kernel on H100 (so A100 and H20 prices are scaled). Target: cold <= 2 s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heterosim.trace.ir import Block, GroupInfo, Role, Segment, Trace

from heterosim.trace.store import load_trace, write_trace  # noqa: E402
from kernel_db import KernelDB, KernelRow, Pricer, get_gpu, load_efficiency  # noqa: E402
from kernel_db.db import dims_key  # noqa: E402
from kernel_db.profile import kernels_from_trace  # noqa: E402
from kernel_db.report import price_trace  # noqa: E402
from kernel_db.power import square_gemm_benchmark  # noqa: E402
from kernel_db.roofline import roofline_time  # noqa: E402

H, HEADS, S, V, LAYERS, TP, PP, DP, MB = 12288, 96, 2048, 51200, 96, 8, 8, 16, 96
GPUS = ("H100", "A100", "H20")


def _gemm(name, m, n, k, module, phase, deps=(1,)):
    return {"kind": "compute", "name": name, "kernel_class": "gemm", "dtype": "bf16", "module": module, "phase": phase,
            "dims": {"m": m, "n": n, "k": k, "batch": 1}, "flops": 2.0 * m * n * k, "flops_full": 2.0 * m * n * k,
            "bytes_read": (m * k + k * n) * 2, "bytes_written": m * n * 2, "deps": list(deps),
            "signature": f"{name}:bf16:{m}x{k},{k}x{n}"}


def _ew(name, kc, numel, module, phase, nin=1, deps=(1,)):
    return {"kind": "compute", "name": name, "kernel_class": kc, "dtype": "bf16", "module": module, "phase": phase,
            "dims": {"numel": numel}, "flops": 4.0 * numel, "bytes_read": 2 * numel * nin, "bytes_written": 2 * numel,
            "deps": list(deps), "signature": f"{name}:bf16:" + ",".join([f"{numel}"] * nin)}


def _attn(direction, module, phase):
    h = HEADS // TP
    full = 4.0 * S * S * 128 * h * (2.5 if direction == "bwd" else 1.0)
    nm = "aten._scaled_dot_product_flash_attention" + ("_backward" if direction == "bwd" else "") + ".default"
    shp = f"1x{h}x{S}x128"
    return {"kind": "compute", "name": nm, "kernel_class": "attention", "dtype": "bf16", "module": module, "phase": phase,
            "dims": {"b": 1, "h": h, "hkv": h, "sq": S, "sk": S, "d": 128, "causal": True, "dir": direction},
            "flops": full * 0.53, "flops_full": full, "bytes_read": 4 * S * 128 * h * 2, "bytes_written": S * 128 * h * 2,
            "deps": [1], "signature": f"{nm}:bf16:{shp},{shp},{shp}"}


def _coll(coll, nbytes, phase):
    return [{"kind": "collective", "name": coll, "kernel_class": "comm", "collective": coll, "group": "tp", "phase": phase,
             "comm_bytes": nbytes, "stream": "comm:tp"},
            {"kind": "wait", "name": "wait", "kernel_class": "comm", "target": 1, "phase": phase}]


def _layer(i, phase):
    m, ln_numel, sp = f"layers.{i}", S * H // TP, S * H * 2
    if phase == "fwd":
        return [_ew("aten.native_layer_norm.default", "norm", ln_numel, m + ".ln1", phase), *_coll("all_gather", sp, phase),
                _gemm("aten.mm.default", S, 3 * H // TP, H, m + ".qkv", phase), _attn("fwd", m + ".attn", phase),
                _gemm("aten.mm.default", S, H, H // TP, m + ".proj", phase), *_coll("reduce_scatter", sp, phase),
                _ew("aten.add.Tensor", "elementwise", ln_numel, m + ".bda1", phase, 2),
                _ew("aten.native_dropout.default", "elementwise", ln_numel, m + ".bda1", phase),
                _ew("aten.add.Tensor", "elementwise", ln_numel, m + ".bda1", phase, 2),
                _ew("aten.native_layer_norm.default", "norm", ln_numel, m + ".ln2", phase), *_coll("all_gather", sp, phase),
                _gemm("aten.mm.default", S, 4 * H // TP, H, m + ".fc1", phase),
                _ew("aten.add.Tensor", "elementwise", S * 4 * H // TP, m + ".mlp", phase, 2),
                _ew("aten.gelu.default", "elementwise", S * 4 * H // TP, m + ".mlp", phase),
                _gemm("aten.mm.default", S, H, 4 * H // TP, m + ".fc2", phase), *_coll("reduce_scatter", sp, phase),
                _ew("aten.native_dropout.default", "elementwise", ln_numel, m + ".bda2", phase),
                _ew("aten.add.Tensor", "elementwise", ln_numel, m + ".bda2", phase, 2)]
    out = []
    for name, n, k in (("fc2", H, 4 * H // TP), ("fc1", 4 * H // TP, H), ("proj", H, H // TP), ("qkv", 3 * H // TP, H)):
        out += [_gemm("aten.mm.default", S, k, n, f"{m}.{name}", phase), _gemm("aten.mm.default", k, n, S, f"{m}.{name}", phase)]
        if name == "fc1":
            out += [_ew("aten.gelu_backward.default", "elementwise", S * 4 * H // TP, m + ".mlp", phase, 2)]
        if name == "proj":
            out += [_attn("bwd", m + ".attn", phase)]
    out += [_ew("aten.native_layer_norm_backward.default", "norm", ln_numel, m + ".ln1", phase, 3),
            _ew("aten.native_layer_norm_backward.default", "norm", ln_numel, m + ".ln2", phase, 3),
            _ew("aten.native_dropout_backward.default", "elementwise", ln_numel, m + ".bda1", phase, 2),
            *_coll("all_gather", sp, phase), *_coll("reduce_scatter", sp, phase)]
    return out


def synth_trace() -> Trace:
    """The synthetic GPT-3 175B TP8 PP8 DP16 trace (see the module docstring)."""
    groups = {"tp": GroupInfo(tuple(range(TP)), "tp", "tp")}
    roles = []
    per_stage = LAYERS // PP
    ranks_per_stage = TP * DP
    for st in range(PP):
        fwd, bwd = [], []
        if st == 0:
            fwd.append(_ew("aten.embedding.default", "embedding", S * H, "embedding", "fwd", deps=()))
            bwd.append(_ew("aten.embedding_dense_backward.default", "embedding", S * H, "embedding", "bwd", deps=()))
        for i in range(per_stage):
            fwd += _layer(st * per_stage + i, "fwd")
            bwd += _layer(st * per_stage + i, "bwd")
        if st == PP - 1:
            fwd += [_gemm("aten.mm.default", S, V // TP, H, "output_layer", "fwd"),
                    _ew("aten._log_softmax.default", "cross_entropy", S * V // TP, "loss", "fwd")]
            bwd = [_ew("aten._log_softmax_backward_data.default", "cross_entropy", S * V // TP, "loss", "bwd", 2),
                   _gemm("aten.mm.default", S, H, V // TP, "output_layer", "bwd"),
                   _gemm("aten.mm.default", H, V // TP, S, "output_layer", "bwd")] + bwd
        opt = [{"kind": "compute", "name": "aten._fused_adam_.default", "kernel_class": "optimizer", "dtype": "fp32",
                "phase": "optimizer", "dims": {"numel": 175_000_000_000 // (TP * PP * DP)}, "flops": 0.0,
                "bytes_read": 16 * 175_000_000_000 // (TP * PP * DP), "bytes_written": 12 * 175_000_000_000 // (TP * PP * DP),
                "signature": "aten._fused_adam_.default:fp32:1367188"}]
        for blk in (fwd, bwd):
            blk[0]["deps"] = []  # a block's first op depends on nothing inside it
        program = [Segment("fwd", mb) for mb in range(MB)] + [Segment("bwd", mb) for mb in range(MB)] + [Segment("opt")]
        ranks = tuple(range(st * ranks_per_stage, (st + 1) * ranks_per_stage))
        roles.append(Role(id=st, captured_rank=ranks[0], ranks=ranks, program=program,
                          blocks={"fwd": Block.from_rows(fwd), "bwd": Block.from_rows(bwd), "opt": Block.from_rows(opt)}))
    return Trace(world_size=TP * PP * DP, groups=groups, roles=roles, layout={"tp": TP, "pp": PP, "dp": DP})


def h100_db(trace: Trace) -> KernelDB:
    """Every distinct kernel 'measured' on H100 (roofline x 1.1, a stand-in for a profile)."""
    g = get_gpu("H100")
    p = load_efficiency().params(g)
    rows = [KernelRow(gpu=g.name, kernel_class=k.kernel_class, signature=k.signature, dtype=k.dtype, dims=dims_key(k.dims),
                      time_s=1.1 * roofline_time(k.kernel_class, k.dtype, k.dims, k.flops, k.bytes, g, p).seconds,
                      samples=30, flops=k.flops, bytes=k.bytes, provenance="synthetic")
            for k in kernels_from_trace(trace)]
    return KernelDB(rows)


def bench(trace: Trace, db: KernelDB | None) -> list[list[str]]:
    rows = []
    pricer = Pricer(db)
    nops = sum(r.num_ops for r in trace.roles)
    for label, p in (("cold", pricer), ("warm", pricer)):
        t0 = time.perf_counter()
        results = [price_trace(trace, g, p) for g in GPUS]
        dt = time.perf_counter() - t0
        srcs = sorted({s for r in results for s in r.by_source})
        rows.append([label, "measured-H100" if db else "empty", f"{nops * len(GPUS):,}", f"{dt:.3f}",
                     " ".join(f"{g}:{sum(r.role_seconds.values()) / len(r.role_seconds):.2f}s" for g, r in zip(GPUS, results)),
                     ",".join(srcs)])
    return rows


def public_gemm_case() -> list[list[str]]:
    g = get_gpu("A100-PCIe-40GB")
    p = load_efficiency().params(g)
    published = {1024: 94.89, 2048: 138.46, 4096: 234.14, 8192: 215.26, 10240: 211.72}
    out = []
    for pt in square_gemm_benchmark(g, p, tuple(published)):
        tf = published[pt.n]
        out.append([str(pt.n), f"{tf:.1f}", f"{pt.tflops:.1f}", f"{pt.tflops / tf - 1:+.1%}",
                    f"{pt.burst_tflops:.1f}", f"{pt.sustained_tflops:.1f}", f"{pt.load_s * 1e3:.0f}"])
    return out


def _print(header, rows):
    w = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for r in [header, ["-" * x for x in w], *rows]:
        print("  ".join(str(c).ljust(x) for c, x in zip(r, w)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", help="a captured trace (default: synthesize GPT-3 175B TP8 PP8 DP16)")
    args = ap.parse_args()
    if args.trace:
        trace = load_trace(args.trace)
    else:
        with tempfile.TemporaryDirectory() as d:  # round-trip through disk, as replay would load it
            trace = load_trace(write_trace(synth_trace(), Path(d) / "gpt3-175b"))
    print(f"trace: world {trace.world_size}, {len(trace.roles)} roles, "
          f"{sum(r.num_ops for r in trace.roles):,} ops in the expanded programs, "
          f"{sum(len(b) for r in trace.roles for b in r.blocks.values()):,} stored")
    rows = bench(trace, None) + bench(trace, h100_db(trace))
    _print(["pass", "db", "ops priced", "seconds", "mean compute/role per GPU", "sources"], rows)
    print("\npublic case kernel-a100-pcie40-torch-bf16-square-gemm (roofline tier, A100-PCIe-40GB; boost for the first 0.1 s of load, then the 250 W clock):")
    _print(["n", "published_TFLOPs", "predicted_TFLOPs", "error", "boost", "power-capped", "load_ms"],
           public_gemm_case())


if __name__ == "__main__":
    main()
