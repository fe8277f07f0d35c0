"""Block-scaled quantization (models/layers/block_scaling.py): both copies in one op, with TE's traffic."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from capture.opinfo import describe
from models.layers import block_scaling as bs

E2M1 = torch.tensor(bs._E2M1)


def dequantize(data: torch.Tensor, scale: torch.Tensor, amax: float) -> torch.Tensor:
    """Unpack e2m1 codes (low nibble first) and apply the block scales and the global scale."""
    codes = torch.stack([data & 15, data >> 4], -1).reshape(data.shape[0], -1)
    vals = E2M1[(codes & 7).long()] * torch.where(codes & 8 > 0, -1.0, 1.0)
    blocks = vals.reshape(codes.shape[0], -1, bs.NVFP4_BLOCK) * scale.to(torch.float32).unsqueeze(-1)
    return blocks.reshape(codes.shape) * (amax / (6.0 * 448.0))


def test_grid_values_round_trip_exactly_in_both_copies():
    """Each 16-block holds a 6 (the e2m1 maximum) and the tensor's amax is 6, so every block scale is
    6 / 6 / (6 / (6 x 448)) = 448, exact in e4m3, and e2m1 grid values come back (to fp32 rounding of the global scale)."""
    torch.manual_seed(0)
    grid = torch.cat([E2M1, -E2M1])
    x = grid[torch.randint(0, 16, (32, 48))]
    x[:, ::16] = 6.0
    x[::16, :] = 6.0
    rd, rs, cd, cs = bs.nvfp4_quantize(x.to(torch.bfloat16))
    assert (rd.shape, rs.shape, cd.shape, cs.shape) == ((32, 24), (32, 3), (48, 16), (48, 2))
    assert rd.dtype == cd.dtype == torch.uint8 and rs.dtype == cs.dtype == torch.float8_e4m3fn
    assert torch.equal(rs.to(torch.float32), torch.full((32, 3), 448.0))
    assert torch.allclose(dequantize(rd, rs, 6.0), x, rtol=1e-6, atol=0)
    assert torch.allclose(dequantize(cd, cs, 6.0), x.t(), rtol=1e-6, atol=0)


def test_partial_blocks_round_up_and_fake_shapes_match_eager():
    x = torch.randn(3, 7, 20, dtype=torch.bfloat16)  # [21, 20]: neither dim whole blocks
    eager = bs.nvfp4_quantize(x)
    with FakeTensorMode():
        fake = bs.nvfp4_quantize(torch.empty(3, 7, 20, dtype=torch.bfloat16))
    assert [tuple(t.shape) for t in eager] == [tuple(t.shape) for t in fake] == [(21, 10), (21, 2), (20, 11), (20, 2)]


@pytest.mark.parametrize("name,written", [("nvfp4_quantize", 9216), ("mxfp8_quantize", 16896)])
def test_capture_prices_both_copies_in_one_kernel(name, written):
    """[64, 128] bf16: 16,384 bytes read. NVFP4 writes row-wise 64 x 64 + 64 x 8 and column-wise
    128 x 32 + 128 x 4 bytes = 9,216 (1.125 a value); MXFP8 64 x 128 + 64 x 4 and 128 x 64 + 128 x 2
    = 16,896 (2.0625 a value); one copy-class kernel each."""
    with FakeTensorMode():
        x = torch.empty(64, 128, dtype=torch.bfloat16)
        op = getattr(torch.ops.heterosim, name).default
        out = op(x)
        cost = describe(op, (x,), {}, out, [], "fwd")
    assert (cost.kernel_class, cost.bytes_read, cost.bytes_written) == ("copy", 16384, written)


def test_mxfp8_scales_are_powers_of_two_from_each_block():
    """OCP MX: a block's shared exponent is floor(log2(amax)) - 8 (e4m3's largest exponent), stored
    biased by 127. Row block of amax 3.0 -> exponent 1 - 8 = -7 -> 120; values come back exactly
    when they are e4m3 numbers times 2^-7."""
    x = torch.zeros(32, 64)
    x[:, :32] = 3.0 * torch.linspace(-1, 1, 32).round(decimals=2)
    x[:, 32:] = 0.25
    rd, rs, cd, cs = bs.mxfp8_quantize(x.to(torch.bfloat16))
    assert (rd.dtype, rs.dtype, tuple(rs.shape), tuple(cd.shape), tuple(cs.shape)) == (
        torch.float8_e4m3fn, torch.uint8, (32, 2), (64, 32), (64, 1))
    assert rs[0].tolist() == [120, 117]  # amax 3 -> 2^-7; amax 0.25 -> 2^(-2-8)
    deq = rd.to(torch.float32).reshape(32, 2, 32) * torch.exp2(rs.to(torch.float32) - 127).unsqueeze(-1)
    assert torch.allclose(deq.reshape(32, 64), x.to(torch.bfloat16).float(), rtol=0.07)


def test_non_float_input_is_refused():
    with pytest.raises(ValueError, match=r"heterosim::nvfp4_quantize takes a floating-point tensor of at least "
                                         r"2 dims, got torch.int32 of shape \(4, 4\)"):
        bs.nvfp4_quantize(torch.zeros(4, 4, dtype=torch.int32))
