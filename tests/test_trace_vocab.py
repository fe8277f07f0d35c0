"""The trace vocabulary: dtype sizes, collective names, the op -> kernel class table, and that
every layer (capture, kernel_db, ncclshim, replay) reads the one copy."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from heterosim.errors import ConfigError, UnknownKernelError
from heterosim.trace import ir, store, vocab
from heterosim.trace.vocab import (
    COLLECTIVES,
    DTYPE_BYTES,
    DTYPE_OF_TORCH,
    KERNEL_CLASSES,
    NCCL_COLLECTIVES,
    P2P,
    TORCH_DTYPE_OF,
    as_planned,
    kernel_class_of,
    register_kernel_class,
    registered_names,
    unregister_kernel_class,
)

# A custom op the way a model defines one (models/layers/megatron_ops.py does the same).
_LIB = torch.library.Library("heterosim_vocab_test", "DEF")
_LIB.define("fused_swiglu(Tensor x) -> Tensor")
_LIB.impl("fused_swiglu", lambda x: x.clone(), "CompositeExplicitAutograd")
_OP = torch.ops.heterosim_vocab_test.fused_swiglu.default


def test_dtype_bytes_by_hand():
    """Sizes anyone can check: bf16 and fp16 are 2 bytes, every fp8 1, fp32 and tf32 4, fp64 8."""
    assert DTYPE_BYTES["bf16"] == 2 and DTYPE_BYTES["fp16"] == 2
    assert DTYPE_BYTES["fp8"] == DTYPE_BYTES["fp8_e4m3"] == DTYPE_BYTES["fp8_e5m2"] == 1
    assert DTYPE_BYTES["fp32"] == DTYPE_BYTES["tf32"] == 4
    assert DTYPE_BYTES["fp64"] == 8 and DTYPE_BYTES["int64"] == 8 and DTYPE_BYTES["int32"] == 4
    assert DTYPE_BYTES["int8"] == DTYPE_BYTES["uint8"] == DTYPE_BYTES["bool"] == 1


def test_torch_names_agree_with_torch():
    """Every torch dtype the vocabulary names has the byte size torch gives it, both ways round."""
    for torch_name, name in DTYPE_OF_TORCH.items():
        if hasattr(torch, torch_name):
            assert getattr(torch, torch_name).itemsize == DTYPE_BYTES[name], torch_name
    # fp4 has no unpacked torch dtype (torch.float4_e2m1fn_x2 holds two per byte): no profiling path.
    assert set(TORCH_DTYPE_OF) == set(DTYPE_BYTES) - {"fp4"}
    for name, torch_name in TORCH_DTYPE_OF.items():
        assert getattr(torch, torch_name).itemsize == DTYPE_BYTES[name], name
        assert DTYPE_OF_TORCH[torch_name] in (name, "fp8", "fp32")  # fp8_e4m3 -> fp8, tf32 -> fp32


def test_capture_records_vocabulary_names():
    """capture's dtype names are the vocabulary's; a dtype it does not name keeps torch's name."""
    from capture.opinfo import dtype_name

    assert dtype_name(torch.bfloat16) == "bf16"
    assert dtype_name(torch.float8_e4m3fn) == dtype_name(torch.float8_e5m2) == "fp8"
    assert dtype_name(torch.int64) == "int64"
    assert dtype_name(torch.int16) == "int16"


def test_readers_share_the_one_dtype_table():
    """ncclshim, kernel_db's profiler and the replay read the vocabulary's table, not a copy."""
    import importlib

    import kernel_db.profile as profile
    import ncclshim.bench as bench
    import ncclshim.planner as planner

    simulate = importlib.import_module("replay.simulate")  # replay.simulate is also a function

    assert planner.DTYPE_BYTES is DTYPE_BYTES and bench.DTYPE_BYTES is DTYPE_BYTES
    assert simulate.DTYPE_BYTES is DTYPE_BYTES
    assert profile._TORCH_DTYPES == {**TORCH_DTYPE_OF, "": "float32"}
    assert [s.bytes for s in profile.sweep("elementwise", "fp8", [1024])] == [3 * 1024]  # 1 B a value
    assert [s.bytes for s in profile.sweep("gemm", "fp64", [2])] == [3 * 4 * 8]


def test_collective_names():
    """The trace's collectives: NCCL's five (in NCCL's order), all_to_all, barrier, then send/recv."""
    assert NCCL_COLLECTIVES == ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce")
    assert P2P == ("send", "recv")
    assert COLLECTIVES == NCCL_COLLECTIVES + ("all_to_all", "barrier", "send", "recv")
    assert len(set(COLLECTIVES)) == len(COLLECTIVES)


def test_every_layer_reads_the_one_list():
    """The schema validates against it; ncclshim plans it but barrier; capture records only its names."""
    import capture.comm as comm
    import ncclshim
    from ncclshim.constants import COST_COLLECTIVES

    assert store.COLLECTIVES is COLLECTIVES and store.KERNEL_CLASSES is KERNEL_CLASSES
    assert COST_COLLECTIVES is NCCL_COLLECTIVES
    assert ncclshim.COLLECTIVES == tuple(c for c in COLLECTIVES if c != "barrier")
    recorded = {c for c, _, _ in comm._C10D.values()} | set(comm._FUNCTIONAL.values())
    assert recorded == set(COLLECTIVES)


def test_barrier_is_planned_as_one_element_all_reduce():
    """torch.distributed.barrier runs on NCCL as an all_reduce of one fp32 element; others run as is."""
    assert as_planned("barrier", 0, "") == ("all_reduce", 4, "fp32")
    assert as_planned("all_gather", 1024, "bf16") == ("all_gather", 1024, "bf16")


def test_trace_loader_names_the_valid_collectives(tmp_path):
    """A trace with a collective outside the vocabulary is refused, listing the valid names."""
    blk = ir.Block.from_rows([dict(kind="collective", name="c10d.x.default", kernel_class="comm",
                                   collective="all_reduce", group="0", comm_bytes=4, stream="comm:0")])
    t = ir.Trace(world_size=2, groups={"0": ir.GroupInfo((0, 1), "world", "world")},
                 roles=[ir.Role(0, 0, (0, 1), {"b": blk}, [ir.Segment("b", 0)])])
    store.write_trace(t, tmp_path / "t")
    role = tmp_path / "t" / "roles" / "role_0000.json"
    role.write_text(role.read_text().replace('"all_reduce"', '"allreduce"'))
    with pytest.raises(Exception, match=r"collective 'allreduce'; valid: \('broadcast', 'reduce'"):
        store.load_trace(tmp_path / "t")


def test_vocabulary_imports_no_torch():
    """heterosim.trace (vocab, ir) loads without torch, so the engines read traces without it."""
    code = ("import sys, heterosim.trace, heterosim.trace.vocab; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
    assert vocab.__all__  # the module under test is the one imported above


def test_kernel_class_rules():
    """Names map to classes; in-place variants follow their op; the optimizer phase takes all but
    tensor-core kernels; foreach ops are elementwise; an unknown name is None."""
    assert kernel_class_of("mm") == "gemm" and kernel_class_of("mm", "optimizer") == "gemm"
    assert kernel_class_of("_scaled_dot_product_flash_attention_for_cpu", "optimizer") == "attention"
    assert kernel_class_of("native_layer_norm", "bwd") == "norm"
    assert kernel_class_of("_log_softmax") == "cross_entropy"
    assert kernel_class_of("add", "optimizer") == "optimizer"
    assert kernel_class_of("clamp_") == "elementwise"  # via clamp
    assert kernel_class_of("masked_fill_") == "copy"  # what capture has always recorded
    assert kernel_class_of("_foreach_mul_") == "elementwise" and kernel_class_of("_foreach_norm") == "reduction"
    assert kernel_class_of("scaled_upper_triang_masked_softmax") == "softmax"
    assert kernel_class_of("all_reduce_") == "comm"
    assert kernel_class_of("frobnicate") is None
    assert "mm" in registered_names("gemm") and "mm" not in registered_names("norm")


def test_unknown_class_error_lists_the_classes():
    """A class outside the vocabulary is refused with the exact list of valid ones."""
    with pytest.raises(ConfigError) as e:
        register_kernel_class("matmul", "my_op")
    assert str(e.value) == ("unknown kernel class 'matmul'; valid: gemm, attention, ssm, norm, softmax, elementwise, "
                            "reduction, embedding, cross_entropy, copy, optimizer, comm")
    assert kernel_class_of("my_op") is None  # nothing was registered


def test_bad_registrations_refused():
    """One name under two classes, a qualified name, or unregistering an unknown name raises."""
    with pytest.raises(ConfigError, match="duplicate kernel-class registration for mm: gemm and norm"):
        register_kernel_class("norm", "mm")
    with pytest.raises(ConfigError, match=r"base name \(mm for aten.mm.default\), not 'aten.x.default'"):
        register_kernel_class("norm", "aten.x.default")
    with pytest.raises(ConfigError, match=r"cannot unregister \['frobnicate'\]"):
        unregister_kernel_class("frobnicate")
    register_kernel_class("gemm", "mm")  # the same class again: a no-op
    assert kernel_class_of("mm") == "gemm"


def test_custom_op_registered_once_is_seen_by_capture_and_kernel_db():
    """Registering a custom op in the one table classifies it in capture and in kernel_db alike."""
    from capture.opinfo import describe
    from capture.opinfo import kernel_class_of as capture_class
    from kernel_db.opmap import kernel_class_of as kernel_db_class

    name = "heterosim_vocab_test.fused_swiglu.default"
    assert capture_class("fused_swiglu", _OP, "fwd") == "copy"  # untagged, unknown: torch-tag fallback
    with pytest.raises(UnknownKernelError, match="fused_swiglu"):
        kernel_db_class(name)
    register_kernel_class("elementwise", "fused_swiglu")
    try:
        assert capture_class("fused_swiglu", _OP, "fwd") == "elementwise"
        assert kernel_db_class(name) == "elementwise"
        assert kernel_db_class(name, "", "optimizer") == "optimizer"
        x = torch.randn(4, 8)
        assert describe(_OP, (x,), {}, _OP(x), [], "bwd").kernel_class == "elementwise"
    finally:
        unregister_kernel_class("fused_swiglu")
    assert capture_class("fused_swiglu", _OP, "fwd") == "copy"
    with pytest.raises(UnknownKernelError):
        kernel_db_class(name)


# Every compute op of the recorded traces (README example, GPT-3 175B, validation cases) outside the
# optimizer phase, with the class capture recorded for it: the table must keep giving these.
_RECORDED = {
    "attention": "_scaled_dot_product_flash_attention_for_cpu.default "
                 "_scaled_dot_product_flash_attention_for_cpu_backward.default",
    "copy": "_to_copy.default arange.default cat.default clone.default copy_.default index.Tensor index_put_.default "
            "ones_like.default randint.low_generator zero_.default zeros_like.default",
    "elementwise": "add.Tensor add_.Tensor bitwise_or.Tensor div.Scalar div.Tensor div_.Tensor exp.default ge.Scalar "
                   "gelu.default gelu_backward.default log.default lt.Scalar masked_fill.Scalar mul.Scalar mul.Tensor "
                   "mul_.Tensor native_dropout.default native_dropout_backward.default remainder.Scalar rsub.Scalar "
                   "sub.Tensor sub_.Tensor where.self",
    "embedding": "embedding.default embedding_dense_backward.default",
    "gemm": "baddbmm.default bmm.default mm.default",
    "norm": "native_layer_norm.default native_layer_norm_backward.default",
    "reduction": "max.dim mean.default sum.dim_IntList",
}


@pytest.mark.parametrize("kernel_class", sorted(_RECORDED))
def test_recorded_ops_keep_their_class(kernel_class):
    """Capture (with torch's tags) and kernel_db (from the name alone) both give the recorded class."""
    from capture.opinfo import kernel_class_of as capture_class
    from kernel_db.opmap import kernel_class_of as kernel_db_class

    for op in _RECORDED[kernel_class].split():
        packet, overload = op.split(".")
        func = getattr(getattr(torch.ops.aten, packet), overload)
        assert capture_class(packet, func, "fwd") == kernel_class, op
        assert kernel_db_class(f"aten.{op}") == kernel_class, op
        if kernel_class not in ("gemm", "attention"):
            assert capture_class(packet, func, "optimizer") == "optimizer"
            assert kernel_db_class(f"aten.{op}", "", "optimizer") == "optimizer"
