"""torch.compile'd regions are recorded as the fused kernels Inductor generates (capture/fusion.py).

The script (tests/scripts/compiled_regions.py, fp32, T=256 tokens, H=512, F=1024) runs a compiled
module x @ w1 -> gelu(+ b1) -> @ w2, Megatron's bias-GeLU as a compiled function (10 eager
pointwise ops) and a compiled (x + b) * 2, forward and backward with a given output gradient.
"""

import pytest

from capture_script import capture_script

T, H, F, E = 256, 512, 1024, 4  # tokens, hidden, MLP width, fp32 bytes
POI, RED = "inductor.triton_poi_fused.default", "inductor.triton_red_fused.default"


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    _, trace = capture_script(tmp_path_factory.mktemp("compiled") / "t", "compiled_regions.py")
    return [o for o in trace.roles[0].ops() if o.module]


def _rows(ops, module, phase):
    return [o for o in ops if o.module == module and o.phase == phase]


def test_bias_gelu_forward_is_one_kernel(ops):
    """x [T, H] and b [H] are read once, the output written once; FLOPs are the 10 ops' T*H each."""
    (row,) = _rows(ops, "act", "fwd")
    assert row.name == POI and row.kernel_class == "elementwise"
    assert row.bytes_read == T * H * E + H * E  # 526,336
    assert row.bytes_written == T * H * E  # 524,288: intermediates are not stored
    assert row.flops == 10 * T * H and row.flops_full == 10 * T * H
    assert row.dims == {"numel": T * H}
    assert row.signature == f"{POI}:fp32:{T}x{H},{H}"


def test_gemms_in_a_compiled_module_stay_separate(ops):
    """mm, then add + gelu as one kernel that reads h and b1 and stores what the second mm reads, then mm."""
    mm1, fused, mm2 = _rows(ops, "mlp", "fwd")
    assert [mm1.name, fused.name, mm2.name] == ["aten.mm.default", POI, "aten.mm.default"]
    assert fused.bytes_read == T * F * E + F * E and fused.bytes_written == T * F * E
    assert fused.flops == 2 * T * F
    assert mm1.id in fused.deps and fused.id in mm2.deps  # ids and dependencies stay consistent


def test_backward_is_fused_too(ops):
    """(x + b) * 2 backward: mul of the gradient and the bias gradient's sum over tokens, one
    kernel: reads the gradient, writes the input gradient [T, H] and the bias gradient [H]."""
    (row,) = _rows(ops, "scale", "bwd")
    assert row.name == RED and row.kernel_class == "reduction"
    assert row.bytes_read == T * H * E
    assert row.bytes_written == T * H * E + H * E
    assert row.flops == 2 * T * H


def test_backward_recomputes_what_forward_did_not_store(ops):
    """bias-GeLU backward reads the gradient and, for the 7 intermediates autograd saved, the
    region's inputs x and b once (AOTAutograd recomputes them): as Megatron's bias_gelu_back."""
    (row,) = _rows(ops, "act", "bwd")
    assert row.bytes_read == 2 * T * H * E + H * E
    assert row.bytes_written == T * H * E + H * E


def test_backward_fusion_stops_at_gemms(ops):
    """The compiled MLP's backward: the w2 and h gradients (mm), gelu_backward + the b1 sum as one
    kernel, the w1 gradient (mm; x needs no gradient)."""
    names = [o.name for o in _rows(ops, "mlp", "bwd")]
    assert names == ["aten.mm.default", "aten.mm.default", RED, "aten.mm.default"]
    fused = _rows(ops, "mlp", "bwd")[2]
    assert fused.bytes_read == 2 * T * F * E + F * E  # gradient, h (mm output) and b1
    assert fused.bytes_written == T * F * E + F * E
