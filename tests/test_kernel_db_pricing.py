"""Tests for kernel_db.pricing: the measured -> interpolated -> scaled -> roofline order."""

import pytest

from heterosim.trace.ir import Block, Op
from heterosim.errors import UnknownGPUError, UnknownKernelError
from heterosim.cluster.gpus import get_gpu
from kernel_db.db import KernelDB, KernelRow, dims_key
from kernel_db.pricing import Pricer, fusion_groups, price, scale_factor


def gemm_op(m, n, k, dtype="bf16", name="aten.mm.default"):
    it = 2 if dtype in ("bf16", "fp16") else 4
    return Op(id=0, kind="compute", name=name, kernel_class="gemm", dtype=dtype,
              dims={"m": m, "n": n, "k": k, "batch": 1}, flops=2.0 * m * n * k,
              bytes_read=(m * k + k * n) * it, bytes_written=m * n * it,
              signature=f"{name}:{dtype}:{m}x{k},{k}x{n}")


def ew_op(numel, name="aten.add.Tensor"):
    return Op(id=0, kind="compute", name=name, kernel_class="elementwise", dtype="bf16", dims={"numel": numel},
              flops=float(numel), bytes_read=4 * numel, bytes_written=2 * numel, signature=f"{name}:bf16:{numel},{numel}")


def row_for(op, gpu, t):
    return KernelRow(gpu=gpu, kernel_class=op.kernel_class, signature=op.signature, dtype=op.dtype,
                     dims=dims_key(op.dims), time_s=t, samples=10, spread_rel=0.01, flops=op.flops,
                     bytes=op.bytes_read + op.bytes_written)


H100 = "H100-SXM5-80GB"


def test_measured_wins():
    """An op whose exact kernel is in the DB for this GPU is priced from it (source measured)."""
    op = gemm_op(4096, 4096, 4096)
    p = price(op, get_gpu("h100").at_boost(), KernelDB([row_for(op, H100, 1.234e-4)]))
    assert (p.seconds, p.source) == (1.234e-4, "measured")
    assert p.rel_err == pytest.approx(0.02)


def test_measured_tensor_time_moves_to_the_sustained_clock():
    """The profiler measures at boost; on the H100 (sustained 0.86 of boost under its 700 W cap) a
    compute-bound GEMM's time above the 3.5 us launch overhead grows by 1/0.86; a memory-bound add keeps its time."""
    op = gemm_op(4096, 4096, 4096)
    p = price(op, "h100", KernelDB([row_for(op, H100, 1.234e-4)]))
    assert p.source == "measured"
    assert p.seconds == pytest.approx(3.5e-6 + (1.234e-4 - 3.5e-6) / 0.86)
    add = {"kind": "compute", "name": "aten.add.Tensor", "kernel_class": "elementwise", "dtype": "bf16",
           "signature": "aten.add.Tensor:bf16:4096x4096,4096x4096", "dims": {}, "flops": 0.0,
           "bytes_read": 2 * 2 * 4096 * 4096, "bytes_written": 2 * 4096 * 4096}
    row = KernelRow(gpu=H100, kernel_class="elementwise", signature=add["signature"], dtype="bf16",
                    dims=dims_key({}), time_s=6.0e-5, samples=1, bytes=6.0 * 4096 * 4096)
    assert price(add, "h100", KernelDB([row])).seconds == 6.0e-5


def test_cpu_signature_matches_cuda_row():
    """A CPU-captured flash-attention op finds the row profiled under the CUDA kernel name."""
    dims = {"b": 1, "h": 8, "hkv": 8, "sq": 1024, "sk": 1024, "d": 128, "causal": True, "dir": "fwd"}
    cpu = Op(id=0, kind="compute", name="aten._scaled_dot_product_flash_attention_for_cpu.default",
             kernel_class="attention", dtype="bf16", dims=dims, flops=1e10,
             signature="aten._scaled_dot_product_flash_attention_for_cpu.default:bf16:1x8x1024x128,1x8x1024x128,1x8x1024x128")
    row = KernelRow(gpu=H100, kernel_class="attention", dtype="bf16", dims=dims_key(dims), time_s=5e-5, samples=3,
                    signature="aten._scaled_dot_product_flash_attention.default:bf16:1x8x1024x128,1x8x1024x128,1x8x1024x128")
    assert price(cpu, "H100", KernelDB([row])).source == "measured"


def test_scaling_follows_flops_and_bandwidth_ratios():
    """Measured on H100 only: a compute-bound GEMM's body (time above the 3.5 us launch) on A100 scales by
    989.4/312, a memory-bound add's by 3350/2039."""
    g, e = gemm_op(8192, 8192, 8192), ew_op(2**26)
    db = KernelDB([row_for(g, H100, 1.6e-3), row_for(e, H100, 1.2e-4)])
    pg = price(g, "A100-SXM4-80GB", db)
    pe = price(e, "A100-SXM4-80GB", db)
    assert pg.source == pe.source == "scaled:H100-SXM5-80GB"
    L = 3.5e-6
    assert pg.seconds == pytest.approx(L + (1.6e-3 - L) * 989.4 / 312.0)
    assert pe.seconds == pytest.approx(L + (1.2e-4 - L) * 3350 / 2039)
    assert pg.rel_err == pytest.approx((0.15**2 + 0.02**2) ** 0.5)


def test_scale_factor_crossing_ridge():
    """An op compute-bound on one GPU and memory-bound on the other scales by the ratio of roofline maxima."""
    old, new = get_gpu("H20"), get_gpu("H100")  # H20: ridge 37 FLOP/B; H100: 295 FLOP/B
    f, b = 100.0 * 1e9, 1e9  # intensity 100
    expect = max(f / new.peak("bf16"), b / new.hbm_bw) / max(f / old.peak("bf16"), b / old.hbm_bw)
    assert scale_factor("gemm", "bf16", f, b, old, new) == pytest.approx(expect)
    assert expect == pytest.approx((1e9 / 3.35e12) / (100e9 / 148e12))


def test_nearest_gpu_is_preferred():
    """With rows on H100 and V100, an H800 op scales from H100 (same arch), not V100."""
    op = gemm_op(4096, 4096, 4096)
    db = KernelDB([row_for(op, H100, 2e-4), row_for(op, "V100-SXM2-32GB", 3e-3)])
    assert price(op, "H800", db).source == "scaled:H100-SXM5-80GB"


def test_another_vendors_gpu_is_priced_by_its_own_curve():
    """Rows on H100 only: an MI300X GEMM is not scaled from them (the fraction of peak differs
    across vendors' libraries) but priced by the gfx942 curve; an A100 GEMM still scales."""
    op = gemm_op(8192, 8192, 8192)
    db = KernelDB([row_for(op, H100, 1.6e-3)])
    assert price(op, "MI300X", db) == price(op, "MI300X")
    assert price(op, "MI300X", db).source == "roofline"
    assert price(op, "A100-SXM4-80GB", db).source == "scaled:H100-SXM5-80GB"


def test_disturbed_row_is_priced_by_its_fastest_repeat():
    """A row whose interquartile range exceeds its median (repeats disturbed) prices at its
    fastest repeat; an ordinary spread keeps the median."""
    op = gemm_op(4096, 2048, 2048)
    base = dict(gpu=H100, kernel_class="gemm", signature=op.signature, dtype="bf16", dims=dims_key(op.dims),
                samples=20, min_s=4.8e-5, flops=op.flops)
    g = get_gpu("h100").at_boost()
    assert price(op, g, KernelDB([KernelRow(time_s=1.44e-4, spread_rel=1.25, **base)])).seconds == 4.8e-5
    assert price(op, g, KernelDB([KernelRow(time_s=5.0e-5, spread_rel=0.04, **base)])).seconds == 5.0e-5


def test_interpolation_between_measured_shapes_is_monotone():
    """Between measured GEMMs m=1024 and m=8192 (n=k=4096), prices rise with m and stay inside the bracket."""
    lo, hi = gemm_op(1024, 4096, 4096), gemm_op(8192, 4096, 4096)
    db = KernelDB([row_for(lo, H100, 3.0e-5), row_for(hi, H100, 2.0e-4)])
    pr = Pricer(db)
    ts = []
    for m in (1024, 1536, 2048, 3000, 4096, 6000, 8192):
        p = pr.price(gemm_op(m, 4096, 4096), get_gpu(H100).at_boost())  # the rows' own (boost) regime
        assert p.source == ("measured" if m in (1024, 8192) else "interpolated")
        ts.append(p.seconds)
    assert ts == sorted(ts) and ts[0] == 3.0e-5 and ts[-1] == 2.0e-4
    # log-log in FLOPs: m=2048 is 1/3 of the way from 1024 to 8192 in log2 -> t = 3e-5 * (2e-4/3e-5)**(1/3)
    assert ts[2] == pytest.approx(3.0e-5 * (2.0e-4 / 3.0e-5) ** (1 / 3))


def test_outside_bracket_falls_to_roofline():
    """A shape above every measured one is not extrapolated: roofline on that GPU."""
    db = KernelDB([row_for(gemm_op(1024, 1024, 1024), H100, 1e-5)])
    assert price(gemm_op(2048, 2048, 2048), "H100", db).source == "roofline"


def test_unknown_kernel_class_and_gpu():
    """An op with no class and an unknown name raises naming the op; an unknown GPU lists names."""
    op = {"kind": "compute", "name": "aten.weird_op.default", "kernel_class": "", "flops": 1.0}
    with pytest.raises(UnknownKernelError, match="op 'aten.weird_op.default' has no kernel class"):
        price(op, "H100")
    with pytest.raises(UnknownGPUError, match="unknown GPU 'H1000'"):
        price(gemm_op(8, 8, 8), "H1000")


def test_op_with_nothing_to_price_by_errors():
    """A compute op without signature, FLOPs or bytes is an error, never 0 s."""
    op = {"kind": "compute", "name": "aten.add.Tensor", "kernel_class": "elementwise"}
    with pytest.raises(UnknownKernelError, match="has no signature, FLOPs or bytes"):
        price(op, "H100")


def _block_rows():
    e = 2**24
    return [
        {"kind": "compute", "name": "aten.mm.default", "kernel_class": "gemm", "dtype": "bf16", "module": "mlp",
         "dims": {"m": 4096, "n": 4096, "k": 4096, "batch": 1}, "flops": 2.0 * 4096**3,
         "bytes_read": 2 * 4096 * 4096 * 2, "bytes_written": 4096 * 4096 * 2, "signature": "aten.mm.default:bf16:4096x4096,4096x4096"},
        {"kind": "compute", "name": "aten.add.Tensor", "kernel_class": "elementwise", "dtype": "bf16", "module": "mlp.linear_fc1",
         "dims": {"numel": e}, "flops": e, "bytes_read": 2 * e * 2, "bytes_written": 2 * e, "deps": [1],
         "signature": f"aten.add.Tensor:bf16:{e},{e}"},
        {"kind": "compute", "name": "aten.gelu.default", "kernel_class": "elementwise", "dtype": "bf16", "module": "mlp",
         "dims": {"numel": e}, "flops": 8 * e, "bytes_read": 2 * e, "bytes_written": 2 * e, "deps": [1],
         "signature": f"aten.gelu.default:bf16:{e}"},
        {"kind": "collective", "name": "all_reduce", "kernel_class": "comm", "collective": "all_reduce", "group": "0",
         "comm_bytes": 1 << 20, "stream": "comm:0"},
        {"kind": "wait", "name": "wait", "kernel_class": "comm", "target": 1},
    ]


def test_price_block_matches_price_and_fuses_bias_gelu():
    """price_block = price per op, except bias-add (mlp.linear_fc1) -> gelu (mlp), one fused kernel; comm/wait cost 0."""
    blk = Block.from_rows(_block_rows())
    pr = Pricer()
    secs, srcs, errs = pr.price_block(blk, "H100")
    assert srcs == ["roofline", "roofline", "roofline", "comm", "comm"]
    assert secs[3] == secs[4] == 0.0
    one = Pricer(fuse=False).price_block(blk, "H100")[0]
    assert secs[0] == one[0]
    e, g = 2**24, get_gpu("H100")
    fused_bytes = 2 * e * 2 + 2 * e  # add's two inputs + gelu's output; the intermediate stays on chip
    assert secs[1] == pytest.approx(g.launch_overhead_s + fused_bytes / (3.35e12 * 0.90))
    assert secs[2] == 0.0 and one[2] > 0
    assert fusion_groups(blk) == [[1, 2]]
    assert list(errs[:3]) == [0.08, 0.3, 0.3]  # hopper gemm roofline error; memory-bound default


def test_sibling_modules_do_not_fuse():
    """Elementwise ops of sibling modules (mlp.a -> mlp.b) stay separate kernels; parent/child fuse."""
    rows = _block_rows()[:3]
    rows[1] = {**rows[1], "module": "mlp.a"}
    rows[2] = {**rows[2], "module": "mlp.b"}
    assert fusion_groups(Block.from_rows(rows)) == []
    rows[2] = {**rows[2], "module": "mlp.a.act"}
    assert fusion_groups(Block.from_rows(rows)) == [[1, 2]]


def test_cache_reuses_prices():
    """The second price of the same op comes from the cache (same object)."""
    pr = Pricer()
    op = gemm_op(512, 512, 512)
    assert pr.price(op, "A100") is pr.price(op, "A100-SXM4-80GB")


def test_zero_fill_priced_by_bytes_written_only():
    """A zero_ of N bytes (captured as N read + N written) is priced as N bytes of writes."""
    n = 1 << 30
    op = {"kind": "compute", "name": "aten.zero_.default", "kernel_class": "copy", "dtype": "bf16",
          "dims": {"numel": n // 2}, "flops": 0.0, "bytes_read": n, "bytes_written": n,
          "signature": f"aten.zero_.default:bf16:{n // 2}"}
    assert price(op, "H100").seconds == pytest.approx(3.5e-6 + n / (3.35e12 * 0.90))


def test_op_factor_prices_megatron_causal_softmax_as_its_own_kernel():
    """memory.op_factor replaces the class factor for one kernel: Megatron's fused causal softmax
    (0.65 fwd) vs a plain softmax (class factor 0.5) moving the same bytes on A100: time ratio 0.5/0.65."""
    from kernel_db import Pricer, get_gpu

    g = get_gpu("A100")
    nbytes = 2 * 24 * 2048 * 2048 * 2
    base = dict(kind="compute", kernel_class="softmax", dtype="fp16", dims={"numel": nbytes // 4}, flops=0.0,
                bytes_read=nbytes // 2, bytes_written=nbytes // 2, signature="")
    pr = Pricer()
    plain = pr.price({**base, "name": "aten._softmax.default"}, g).seconds - g.launch_overhead_s
    megatron = pr.price({**base, "name": "heterosim.scaled_upper_triang_masked_softmax.default"}, g).seconds \
        - g.launch_overhead_s
    assert megatron / plain == pytest.approx(0.5 / 0.65)
    assert plain == pytest.approx(nbytes / (g.hbm_bw * 0.9 * 0.5))
