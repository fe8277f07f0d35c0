"""NVFP4 quantization (models/layers/nvfp4.py): both copies in one op, with TE's traffic."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from capture.opinfo import describe
from models.layers import nvfp4

E2M1 = torch.tensor(nvfp4._E2M1)


def dequantize(data: torch.Tensor, scale: torch.Tensor, amax: float) -> torch.Tensor:
    """Unpack e2m1 codes (low nibble first) and apply the block scales and the global scale."""
    codes = torch.stack([data & 15, data >> 4], -1).reshape(data.shape[0], -1)
    vals = E2M1[(codes & 7).long()] * torch.where(codes & 8 > 0, -1.0, 1.0)
    blocks = vals.reshape(codes.shape[0], -1, nvfp4.BLOCK) * scale.to(torch.float32).unsqueeze(-1)
    return blocks.reshape(codes.shape) * (amax / (6.0 * 448.0))


def test_grid_values_round_trip_exactly_in_both_copies():
    """Each 16-block holds a 6 (the e2m1 maximum) and the tensor's amax is 6, so every block scale is
    6 / 6 / (6 / (6 x 448)) = 448, exact in e4m3, and e2m1 grid values come back (to fp32 rounding of the global scale)."""
    torch.manual_seed(0)
    grid = torch.cat([E2M1, -E2M1])
    x = grid[torch.randint(0, 16, (32, 48))]
    x[:, ::16] = 6.0
    x[::16, :] = 6.0
    rd, rs, cd, cs = nvfp4.quantize(x.to(torch.bfloat16))
    assert (rd.shape, rs.shape, cd.shape, cs.shape) == ((32, 24), (32, 3), (48, 16), (48, 2))
    assert rd.dtype == cd.dtype == torch.uint8 and rs.dtype == cs.dtype == torch.float8_e4m3fn
    assert torch.equal(rs.to(torch.float32), torch.full((32, 3), 448.0))
    assert torch.allclose(dequantize(rd, rs, 6.0), x, rtol=1e-6, atol=0)
    assert torch.allclose(dequantize(cd, cs, 6.0), x.t(), rtol=1e-6, atol=0)


def test_partial_blocks_round_up_and_fake_shapes_match_eager():
    x = torch.randn(3, 7, 20, dtype=torch.bfloat16)  # [21, 20]: neither dim whole blocks
    eager = nvfp4.quantize(x)
    with FakeTensorMode():
        fake = nvfp4.quantize(torch.empty(3, 7, 20, dtype=torch.bfloat16))
    assert [tuple(t.shape) for t in eager] == [tuple(t.shape) for t in fake] == [(21, 10), (21, 2), (20, 11), (20, 2)]


def test_capture_prices_two_bytes_read_and_one_and_an_eighth_written_per_element():
    """[64, 128] bf16: 16,384 bytes read; row-wise 64 x 64 + 64 x 8, column-wise 128 x 32 + 128 x 4
    bytes written = 9,216 = 1.125 x 8,192 elements; one copy-class kernel."""
    with FakeTensorMode():
        x = torch.empty(64, 128, dtype=torch.bfloat16)
        op = torch.ops.heterosim.nvfp4_quantize.default
        out = op(x)
        cost = describe(op, (x,), {}, out, [], "fwd")
    assert (cost.kernel_class, cost.bytes_read, cost.bytes_written) == ("copy", 16384, 9216)


def test_non_float_input_is_refused():
    with pytest.raises(ValueError, match=r"heterosim::nvfp4_quantize takes a floating-point tensor of at least "
                                         r"2 dims, got torch.int32 of shape \(4, 4\)"):
        nvfp4.quantize(torch.zeros(4, 4, dtype=torch.int32))
