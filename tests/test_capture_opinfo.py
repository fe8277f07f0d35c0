"""Per-op cost: kernel classes, GEMM dims and FLOPs, causal attention fractions, bytes."""

import torch
import torch.nn.functional as F

from capture.opinfo import causal_fraction, describe, kernel_class_of

aten = torch.ops.aten


def test_causal_fraction_by_hand():
    """Square causal attention with 128 tiles: n tiles per side compute n(n+1)/2 of n^2."""
    assert causal_fraction(128, 128) == 1.0
    assert causal_fraction(256, 256) == 3 / 4
    assert causal_fraction(2048, 2048) == (16 * 17 / 2) / 256
    # a query chunk at the end of a longer key sequence sees every earlier key tile
    assert causal_fraction(128, 256) == 1.0


def test_gemm_cost():
    """addmm(bias, a[m,k], b[k,n]) is a gemm with 2mnk FLOPs and dims m,n,k."""
    a, b, bias = torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)
    out = torch.addmm(bias, a, b)
    c = describe(aten.addmm.default, (bias, a, b), {}, out, [], "fwd")
    assert c.kernel_class == "gemm" and c.dims == {"m": 8, "k": 16, "n": 4, "batch": 1}
    assert c.flops == c.flops_full == 2 * 8 * 16 * 4
    assert c.bytes_read == (4 + 8 * 16 + 16 * 4) * 4 and c.bytes_written == 8 * 4 * 4
    assert c.signature == "aten.addmm.default:fp32:4,8x16,16x4"
    fp8 = describe(aten.addmm.default, (bias, a, b), {}, out, [], "fwd", gemm_dtype="fp8")
    assert fp8.dtype == "fp8"


def test_attention_cost_causal():
    """CPU flash SDPA: full FLOPs 4*b*h*s^2*d; executed scaled by the causal tile fraction."""
    q = torch.randn(1, 2, 256, 32)
    out = aten._scaled_dot_product_flash_attention_for_cpu.default(q, q, q, 0.0, True)
    c = describe(aten._scaled_dot_product_flash_attention_for_cpu.default, (q, q, q, 0.0, True), {}, out, [], "fwd")
    assert c.kernel_class == "attention"
    assert c.dims == {"b": 1, "h": 2, "hkv": 2, "sq": 256, "sk": 256, "d": 32, "causal": True, "dir": "fwd"}
    assert c.flops_full == 4 * 1 * 2 * 256 * 256 * 32
    assert c.flops == c.flops_full * 3 / 4


def test_kernel_classes():
    """Names map to classes; the optimizer phase wins for non-GEMM math; pointwise tags fall back."""
    assert kernel_class_of("native_layer_norm", aten.native_layer_norm.default, "fwd") == "norm"
    assert kernel_class_of("_softmax", aten._softmax.default, "fwd") == "softmax"
    assert kernel_class_of("embedding", aten.embedding.default, "fwd") == "embedding"
    assert kernel_class_of("add", aten.add.Tensor, "optimizer") == "optimizer"
    assert kernel_class_of("gelu", aten.gelu.default, "fwd") == "elementwise"
    assert kernel_class_of("sum", aten.sum.default, "bwd") == "reduction"
    assert kernel_class_of("mm", aten.mm.default, "optimizer") == "gemm"


def test_broadcast_input_is_read_once():
    """A stride-0 (expanded) input counts its distinct elements, not numel."""
    x = torch.randn(4, 8)
    bias = torch.randn(8).expand(4, 8)
    out = x + bias
    c = describe(aten.add.Tensor, (x, bias), {}, out, [], "fwd")
    assert c.bytes_read == (32 + 8) * 4 and c.kernel_class == "elementwise"


def test_attention_backward_counts_megatron_and_flash():
    """Backward: flops_full is Megatron's 2x forward; executed adds flash's QK^T recompute (2.5x)."""
    q = torch.randn(1, 2, 128, 16)
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(q, q, q, 0.0, False)
    args = (out, q, q, q, out, lse, 0.0, False)
    res = aten._scaled_dot_product_flash_attention_for_cpu_backward.default(*args)
    c = describe(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, args, {}, res, [], "bwd")
    fwd = 4 * 1 * 2 * 128 * 128 * 16
    assert c.dims["dir"] == "bwd" and c.flops_full == 2 * fwd and c.flops == 2.5 * fwd


def test_write_only_ops_do_not_read_their_destination():
    """copy_(dst, src) reads src only; zero_ reads nothing; add_ reads both operands."""
    dst, src = torch.empty(4, 8), torch.randn(4, 8)
    c = describe(aten.copy_.default, (dst, src), {}, dst, [dst], "fwd")
    assert c.bytes_read == 128 and c.bytes_written == 128
    z = describe(aten.zero_.default, (dst,), {}, dst, [dst], "fwd")
    assert z.bytes_read == 0 and z.bytes_written == 128
    a = describe(aten.add_.Tensor, (dst, src), {}, dst, [dst], "fwd")
    assert a.bytes_read == 256 and a.bytes_written == 128
