"""Per-op cost: kernel classes, GEMM dims and FLOPs, causal attention fractions, bytes."""

import torch

from capture.opinfo import causal_fraction, describe, kernel_class_of, unmasked_elements, window_pairs, window_tiles
from models.layers import megatron_ops, window_attention  # noqa: F401  registers torch.ops.heterosim

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


def test_fp32_accumulating_gemm_is_priced_in_its_operands_dtype():
    """addmm(fp32 c, bf16 a, bf16 b, out_dtype=fp32, out=c), Megatron's weight-gradient
    accumulation into main_grad, is a bf16 GEMM that reads and writes the fp32 accumulator."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        c = torch.zeros(8, 4)
        a, b = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(16, 4, dtype=torch.bfloat16)
        out = torch.addmm(c, a, b, out_dtype=torch.float32, out=c)
        got = describe(aten.addmm.dtype_out, (c, a, b), {"out_dtype": torch.float32, "out": c},
                       out, [c], "bwd")
    assert got.kernel_class == "gemm" and got.dtype == "bf16"
    assert got.dims == {"m": 8, "k": 16, "n": 4, "batch": 1} and got.flops == 2 * 8 * 16 * 4
    assert got.bytes_read == 8 * 4 * 4 + (8 * 16 + 16 * 4) * 2 and got.bytes_written == 8 * 4 * 4


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


def test_unmasked_elements_by_hand():
    """Query i sees keys 0..min(i, sk-1): 64x64 -> 64*65/2; 3x5 -> 1+2+3; 5x3 -> 1+2+3+3+3."""
    assert unmasked_elements(64, 64) == 2080
    assert unmasked_elements(3, 5) == 6
    assert unmasked_elements(5, 3) == 12
    assert unmasked_elements(1, 1) == 1


def test_megatron_causal_softmax_moves_only_unmasked_reads():
    """heterosim.scaled_upper_triang_masked_softmax over b*np 2, s 64, bf16 (N = 8192, f = 65/128):
    forward reads N*2*f = 8320 B and writes 16384 B; backward reads grad and output on the same
    elements, 16640 B, and writes 16384 B. Class softmax, dims numel N, 5 FLOPs per unmasked
    element (5 * 2 * 2080 = 20800) both ways, and a signature with the op's full name."""
    fwd_op = torch.ops.heterosim.scaled_upper_triang_masked_softmax.default
    bwd_op = torch.ops.heterosim.scaled_upper_triang_masked_softmax_backward.default
    x = torch.randn(2, 64, 64, dtype=torch.bfloat16)
    y = fwd_op(x, 1.0)
    f = describe(fwd_op, (x, 1.0), {}, y, [], "fwd")
    assert (f.kernel_class, f.dims, f.dtype) == ("softmax", {"numel": 8192}, "bf16")
    assert (f.bytes_read, f.bytes_written) == (2 * 64 * 64 * 2 * 65 // 128, 16384) == (8320, 16384)
    assert f.flops == f.flops_full == 20800
    assert f.signature == "heterosim.scaled_upper_triang_masked_softmax.default:bf16:2x64x64"
    g = torch.randn_like(y)
    dx = bwd_op(g, y, 1.0)
    b = describe(bwd_op, (g, y, 1.0), {}, dx, [], "bwd")
    assert (b.kernel_class, b.dims, b.bytes_read, b.bytes_written) == ("softmax", {"numel": 8192}, 16640, 16384)
    assert b.flops == b.flops_full == 20800
    assert b.signature == "heterosim.scaled_upper_triang_masked_softmax_backward.default:bf16:2x64x64,2x64x64"


def test_tensors_in_follows_tree_flatten_order():
    from collections import OrderedDict, namedtuple

    from torch.utils._pytree import tree_flatten

    from capture.opinfo import tensors_in

    a, b, c, d, e = (torch.full((1,), float(i)) for i in range(5))
    Pair = namedtuple("Pair", "x y")
    cases = [
        ((a, [b, None, (c, 3)], {"k": d, "j": [e]}), {}),
        ([], {"out": a}),
        ((Pair(a, b), torch.return_types.max((c, d))), {"z": OrderedDict(q=e, p=a)}),
        ((1, 2.0, torch.float32, "s"), {}),
        (a, {}),
    ]
    for args, kwargs in cases:
        want = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        got = tensors_in((args, kwargs))
        assert [id(t) for t in got] == [id(t) for t in want]
    assert [float(t) for t in tensors_in(((a, [b, (c,)]), {"k": [d], "m": e}))] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_window_tiles_and_pairs_by_hand():
    """512 tokens, window 127, tiles of 128: query tile 0 visits key tile 0; tiles 1, 2, 3 visit their
    diagonal tile and the one before (their first rows reach back 127 keys): 1 + 2 + 2 + 2 = 7 of 16.
    Pairs: the first 128 queries see 1..128 keys (8,256), the other 384 see 128 each (49,152)."""
    assert window_tiles(512, 127) == (7, 16)
    assert window_tiles(512, -1) == (10, 16)  # plain causal: the lower triangle of tiles
    assert window_pairs(512, 127) == 8_256 + 49_152
    assert window_pairs(512, -1) == window_pairs(512, 600) == 512 * 513 // 2


def test_window_attention_op_is_recorded_with_its_window():
    """heterosim::window_attention on [1, 8, 512, 64] queries over 2 K/V heads, window 127: an attention
    kernel; executed FLOPs 4 b h d s^2 x 7/16 (whole tiles), model FLOPs 4 b h d x 57,408 pairs; the
    backward executes 2.5x and counts 2x."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    q, k, v = torch.empty(1, 8, 512, 64, **meta), torch.empty(1, 2, 512, 64, **meta), torch.empty(1, 2, 512, 64, **meta)
    op = torch.ops.heterosim.window_attention.default
    out = op(q, k, v, None, 127, 0.125)
    c = describe(op, (q, k, v, None, 127, 0.125), {}, out, [], "forward")
    assert c.kernel_class == "attention" and c.dims == {"b": 1, "h": 8, "hkv": 2, "sq": 512, "sk": 512, "d": 64,
                                                        "causal": True, "dir": "fwd", "window": 127}
    assert c.flops == 4.0 * 8 * 64 * 512 * 512 * 7 / 16 and c.flops_full == 4.0 * 8 * 64 * 57_408
    bop = torch.ops.heterosim.window_attention_backward.default
    args = (out, q, k, v, None, 127, 0.125)
    cb = describe(bop, args, {}, bop(*args), [], "backward")
    assert (cb.flops, cb.flops_full, cb.dims["dir"]) == (2.5 * c.flops, 2.0 * c.flops_full, "bwd")
