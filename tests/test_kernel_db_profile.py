"""Tests for kernel_db.profile: distinct kernels of a trace, input building, the CPU path, resuming."""

import pytest

from heterosim.trace.ir import Block, GroupInfo, Role, Segment, Trace
from heterosim.errors import KernelDBError
from kernel_db.db import KernelDB
from kernel_db.pricing import Pricer
from kernel_db.profile import Clock, KernelSpec, kernels_from_trace, profile, sweep


def small_trace() -> Trace:
    d = {"b": 1, "h": 2, "hkv": 2, "sq": 32, "sk": 32, "d": 16, "causal": True}
    qkv = "1x2x32x16,1x2x32x16,1x2x32x16"
    rows = [
        {"kind": "compute", "name": "aten.mm.default", "kernel_class": "gemm", "dtype": "fp32",
         "dims": {"m": 32, "n": 48, "k": 16, "batch": 1}, "flops": 2.0 * 32 * 48 * 16,
         "bytes_read": (32 * 16 + 16 * 48) * 4, "bytes_written": 32 * 48 * 4, "signature": "aten.mm.default:fp32:32x16,16x48"},
        {"kind": "compute", "name": "aten._scaled_dot_product_flash_attention_for_cpu.default", "kernel_class": "attention",
         "dtype": "fp32", "dims": {**d, "dir": "fwd"}, "flops": 1e5, "bytes_read": 3 * 4096, "bytes_written": 4096,
         "signature": f"aten._scaled_dot_product_flash_attention_for_cpu.default:fp32:{qkv}"},
        {"kind": "compute", "name": "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
         "kernel_class": "attention", "dtype": "fp32", "dims": {**d, "dir": "bwd"}, "flops": 2.5e5, "bytes_read": 5 * 4096,
         "bytes_written": 3 * 4096, "signature": f"aten._scaled_dot_product_flash_attention_for_cpu_backward.default:fp32:{qkv}"},
        {"kind": "compute", "name": "aten.gelu.default", "kernel_class": "elementwise", "dtype": "fp32",
         "dims": {"numel": 1536}, "flops": 1536 * 8.0, "bytes_read": 1536 * 4, "bytes_written": 1536 * 4,
         "signature": "aten.gelu.default:fp32:32x48"},
        {"kind": "compute", "name": "aten.native_dropout.default", "kernel_class": "elementwise", "dtype": "fp32",
         "dims": {"numel": 1536}, "flops": 1536.0, "bytes_read": 1536 * 4, "bytes_written": 1536 * 5,
         "signature": "aten.native_dropout.default:fp32:32x48"},
        {"kind": "collective", "name": "all_reduce", "kernel_class": "comm", "collective": "all_reduce", "group": "0",
         "comm_bytes": 4096, "stream": "comm:0"},
        {"kind": "compute", "name": "aten.mm.default", "kernel_class": "gemm", "dtype": "fp32",
         "dims": {"m": 32, "n": 48, "k": 16, "batch": 1}, "flops": 2.0 * 32 * 48 * 16,
         "bytes_read": (32 * 16 + 16 * 48) * 4, "bytes_written": 32 * 48 * 4, "signature": "aten.mm.default:fp32:32x16,16x48"},
    ]
    blk = Block.from_rows(rows)
    role = Role(id=0, captured_rank=0, ranks=(0, 1), blocks={"b0": blk}, program=[Segment("b0", m) for m in range(3)])
    return Trace(world_size=2, groups={"0": GroupInfo((0, 1), "tp", "tp")}, roles=[role])


def test_kernels_from_trace_distinct_and_canonical():
    """Distinct compute kernels only (the repeated mm once, no comm), CPU attention names made CUDA."""
    ks = kernels_from_trace(small_trace())
    assert [k.kernel_class for k in ks] == ["gemm", "attention", "attention", "elementwise", "elementwise"]
    assert ks[1].signature.startswith("aten._scaled_dot_product_flash_attention.default:fp32:")
    assert ks[2].name == "aten._scaled_dot_product_flash_attention_backward.default"


def test_cpu_profile_fills_db_that_prices_as_measured(tmp_path):
    """--device cpu path: every kernel of the trace is measured (3 repeats, 6 if re-timed as noisy); Pricer then prices all of them measured."""
    db_path = tmp_path / "k.csv"
    res = profile(kernels_from_trace(small_trace()), db_path, device="cpu", warmup=1, repeats=3)
    assert (res.gpu, res.measured, res.skipped, res.failed) == ("CPU-host", 5, 0, [])
    db = KernelDB.load(db_path)
    assert len(db) == 5 and all(r.samples in (3, 6) and r.time_s > 0 and r.torch_version for r in db.rows)
    assert {r.provenance.split()[1] for r in db.rows} >= {"torch.mm", "sdpa", "aten"}
    secs, srcs, _ = Pricer(db).price_block(small_trace().roles[0].blocks["b0"], "cpu")
    assert srcs == ["measured"] * 5 + ["comm", "measured"]
    # the row's estimate_s: its median, or its fastest repeat where CPU noise disturbed the repeats
    assert secs[0] == secs[6] == db.lookup("CPU-host", "gemm", "aten.mm.default:fp32:32x16,16x48", "fp32",
                                           '{"batch":1,"k":16,"m":32,"n":48}').estimate_s


def test_profile_resumes(tmp_path):
    """A second run over the same kernels measures nothing new (same GPU and software)."""
    ks = kernels_from_trace(small_trace())[:2]
    profile(ks, tmp_path / "k.csv", device="cpu", warmup=0, repeats=2)
    again = profile(ks, tmp_path / "k.csv", device="cpu", warmup=0, repeats=2)
    assert (again.measured, again.skipped) == (0, 2)


def test_cuda_without_gpu_says_so(tmp_path):
    """Asking for CUDA on a host without one raises KernelDBError pointing at --device cpu."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    with pytest.raises(KernelDBError, match=r"no CUDA GPU is visible .* pass --device cpu"):
        profile(sweep("gemm", sizes=[64]), tmp_path / "k.csv", device="cuda")
    assert not (tmp_path / "k.csv").exists()


def test_unrunnable_kernel_is_reported_not_fatal(tmp_path):
    """A kernel that cannot be built is listed in failed; the others are still measured."""
    bad = KernelSpec(kernel_class="comm", name="aten.nothing.default", signature="", dtype="fp32", dims={})
    res = profile([bad, *sweep("elementwise", "fp32", sizes=[1024])], tmp_path / "k.csv", device="cpu", warmup=0,
                  repeats=2)
    assert res.measured == 1 and res.failed[0][1] == "KernelDBError: cannot build inputs for aten.nothing.default: no shapes and no dims.numel"


def test_sweeps():
    """Sweep sizes: gemm is the cube of the size list; attention has fwd+bwd per shape; unknown sweep errors."""
    assert len(sweep("gemm", sizes=[64, 128])) == 8
    att = sweep("attention", sizes=[256])
    assert len(att) == 2 * 3 * 2 and {a.dims["dir"] for a in att} == {"fwd", "bwd"}
    with pytest.raises(KernelDBError, match="unknown sweep 'conv'; valid sweeps: gemm, attention, elementwise, all"):
        sweep("conv")


def test_cpu_clock_measures_elapsed():
    """The CPU clock's elapsed time between two records is non-negative and in seconds."""
    import torch

    c = Clock(torch, "cpu")
    a = c.record()
    b = c.record()
    c.synchronize()
    assert 0 <= c.elapsed_s(a, b) < 1.0


def test_only_real_aten_ops_resolve_from_trace_names():
    """A trace's op name reaches only aten operators: no dunders, no other namespaces, no attributes."""
    import torch

    from kernel_db.profile import _resolve_aten

    assert _resolve_aten(torch, "aten.mm.default") is torch.ops.aten.mm.default
    assert _resolve_aten(torch, "aten.addmm.out") is torch.ops.aten.addmm.out
    for name in ("aten.__class__.__init__", "aten.mm.__call__", "aten.mm.default.__globals__", "os.system",
                 "aten.no_such_op.default", "aten.mm.no_such_overload", "aten.mm.default.name"):
        assert _resolve_aten(torch, name) is None, name
