"""Tests for kernel_db.opmap: CPU kernel names map to CUDA ones; unknown ops fail loudly."""

import pytest

from heterosim.errors import UnknownKernelError
from kernel_db.opmap import base_name, canonical_name, canonical_signature, kernel_class_of, parse_signature


def test_cpu_flash_attention_maps_to_cuda():
    """The CPU flash-attention kernels (fwd and bwd) are rewritten to the CUDA kernel names."""
    assert canonical_name("aten._scaled_dot_product_flash_attention_for_cpu.default") == (
        "aten._scaled_dot_product_flash_attention.default")
    assert canonical_signature("aten._scaled_dot_product_flash_attention_for_cpu_backward.default:bf16:1x2x3x4") == (
        "aten._scaled_dot_product_flash_attention_backward.default:bf16:1x2x3x4")
    assert canonical_name("aten.mm.default") == "aten.mm.default"


def test_kernel_class_from_name():
    """An op with no kernel class gets one from its aten name; a given class wins."""
    assert kernel_class_of("aten.addmm.default") == "gemm"
    assert kernel_class_of("aten._scaled_dot_product_flash_attention_for_cpu.default") == "attention"
    assert kernel_class_of("aten.gelu_backward.default") == "elementwise"
    assert kernel_class_of("aten._masked_softmax_backward.default") == "softmax"  # unfused attention
    assert kernel_class_of("heterosim.scaled_upper_triang_masked_softmax.default") == "softmax"
    assert base_name("heterosim.scaled_upper_triang_masked_softmax_backward.default") == \
        "scaled_upper_triang_masked_softmax_backward"
    assert kernel_class_of("aten.gelu.default", "norm") == "norm"
    assert base_name("mylib.fused_swiglu.default") == base_name("mylib::fused_swiglu") == "fused_swiglu"
    assert base_name("aten::mm.default") == base_name("mm.default") == base_name("mm") == "mm"


def test_unknown_op_names_the_op():
    """An op with no class and an unknown aten name raises UnknownKernelError naming it."""
    with pytest.raises(UnknownKernelError, match=r"op 'aten.frobnicate.default' has no kernel class .* 'frobnicate'"):
        kernel_class_of("aten.frobnicate.default")


def test_phase_decides_like_capture():
    """With no kernel class, the op's phase classifies it as capture would have: optimizer math."""
    assert kernel_class_of("aten._foreach_mul_.Tensor", "", "optimizer") == "optimizer"
    assert kernel_class_of("aten._foreach_mul_.Tensor") == "elementwise"
    assert kernel_class_of("aten.mm.default", "", "optimizer") == "gemm"


def test_parse_signature():
    """Signatures split into name, dtype and integer shapes; a malformed one is rejected."""
    assert parse_signature("aten.mm.default:bf16:2048x12288,12288x4608") == (
        "aten.mm.default", "bf16", ((2048, 12288), (12288, 4608)))
    assert parse_signature("aten.sum.default:fp32:") == ("aten.sum.default", "fp32", ())
    with pytest.raises(UnknownKernelError, match="is not '<aten name>:<dtype>:<shapes>'"):
        parse_signature("mm")


def test_write_only_ops():
    """zero_/fill_/factory ops only write; add_ reads too."""
    from kernel_db.opmap import writes_only

    assert writes_only("aten.zero_.default") and writes_only("aten.arange.start")
    assert not writes_only("aten.add_.Tensor")
