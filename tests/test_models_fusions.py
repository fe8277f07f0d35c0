"""Megatron's fused SwiGLU and TE's fused RoPE (models/layers/fusions.py): the same numbers as the
unfused ops, and under capture one fused kernel per direction with the bytes the real kernel moves
(tests/scripts/megatron_fusions.py: fp32, T=256 tokens x 2F=1024 for SwiGLU, [64, 2, 4, 32] for RoPE)."""

import pytest
import torch
import torch.nn.functional as F

from capture_script import capture_script
from models.args import parse_args
from models.layers.fusions import rope, swiglu, weighted_swiglu
from models.layers.mlp import activation_fn
from models.layers.rope import apply_rotary, rotary_freqs

T, FF, E = 256, 512, 4
S, B, NH, D = 64, 2, 4, 32
POI = "inductor.triton_poi_fused.default"
RED = "inductor.triton_red_fused.default"  # a fused kernel with a reduction (the weights' gradient)


def _grads(fn, x):
    x = x.detach().clone().requires_grad_(True)
    y = fn(x)
    g = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
    y.backward(g)
    return y.detach(), x.grad


def test_swiglu_matches_unfused_forward_and_backward():
    torch.manual_seed(0)
    x = torch.randn(8, 2 * 16, dtype=torch.float64)
    want = _grads(lambda v: F.silu(v[:, :16]) * v[:, 16:], x)
    got = _grads(swiglu, x)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    assert activation_fn("swiglu", fused=True) is swiglu
    assert activation_fn("gelu", fused=True) is activation_fn("gelu")


def test_weighted_swiglu_matches_unfused_forward_and_backward():
    """Megatron-core's weighted_bias_swiglu_impl: swiglu(y) * w per row, gradients to y and to w."""
    torch.manual_seed(0)
    y = torch.randn(8, 2 * 16, dtype=torch.float64, requires_grad=True)
    w = torch.rand(8, 1, dtype=torch.float64, requires_grad=True)
    g = torch.linspace(-1, 1, 8 * 16, dtype=torch.float64).reshape(8, 16)
    (F.silu(y[:, :16]) * y[:, 16:] * w).backward(g)
    want = (y.grad.clone(), w.grad.clone())
    y.grad = w.grad = None
    out = weighted_swiglu(y, w)
    out.backward(g)
    torch.testing.assert_close(out, F.silu(y[:, :16]) * y[:, 16:] * w)
    torch.testing.assert_close((y.grad, w.grad), want)
    # by hand, one element: y1 = 0, y2 = 3, w = 0.5 -> silu(0) = 0; d/dy1 = sigmoid(0) * y2 * w = 0.75
    one = torch.tensor([[0.0, 3.0]], dtype=torch.float64, requires_grad=True)
    weighted_swiglu(one, torch.tensor([[0.5]], dtype=torch.float64)).sum().backward()
    assert one.grad.tolist() == [[0.75, 0.0]]


def test_rope_matches_unfused_forward_and_backward():
    torch.manual_seed(0)
    freqs = rotary_freqs(S, D).double()
    t = torch.randn(S, B, NH, D, dtype=torch.float64)
    want = _grads(lambda v: apply_rotary(v, freqs), t)
    got = _grads(lambda v: rope(v, freqs), t)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(apply_rotary(t, freqs, fused=True), want[0])


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    _, trace = capture_script(tmp_path_factory.mktemp("fusions") / "t", "megatron_fusions.py")
    return [o for o in trace.roles[0].ops() if o.name in (POI, RED)]


def test_captured_as_one_kernel_each_way(kernels):
    """SwiGLU: forward reads y [T, 2F] once and writes [T, F]; backward reads the gradient [T, F]
    and y, writes dy [T, 2F]. RoPE: each way reads the tensor and the fp32 angles [S, 1, 1, D]
    once and writes the tensor once. Weighted SwiGLU: the same plus the weights [T, 1] read each
    way and their gradient written."""
    sw_f, sw_b, rp_f, rp_b, ws_f, ws_b = kernels
    assert [k.phase for k in kernels] == ["fwd", "bwd"] * 3
    assert (sw_f.bytes_read, sw_f.bytes_written) == (T * 2 * FF * E, T * FF * E)  # 1,048,576 / 524,288
    assert (sw_b.bytes_read, sw_b.bytes_written) == (3 * T * FF * E, T * 2 * FF * E)
    for k in (rp_f, rp_b):
        assert (k.bytes_read, k.bytes_written) == (S * B * NH * D * E + S * D * E, S * B * NH * D * E)
    # weighted SwiGLU: the weights [T, 1] beside y; the backward also writes their gradient (a row sum)
    assert (ws_f.name, ws_b.name, ws_b.kernel_class) == (POI, RED, "reduction")
    assert (ws_f.bytes_read, ws_f.bytes_written) == (T * 2 * FF * E + T * E, T * FF * E)
    assert (ws_b.bytes_read, ws_b.bytes_written) == (3 * T * FF * E + T * E, T * 2 * FF * E + T * E)


def test_flags_turn_fusions_off():
    base = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--vocab-size", "128", "--global-batch-size", "2", "--swiglu", "--position-embedding-type", "rope"]
    on = parse_args(base, 1).model
    off = parse_args(base + ["--no-bias-swiglu-fusion", "--no-rope-fusion"], 1).model
    assert (on.bias_swiglu_fusion, on.rope_fusion) == (True, True)
    assert (off.bias_swiglu_fusion, off.rope_fusion) == (False, False)
