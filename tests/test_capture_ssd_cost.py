"""FLOPs and traffic of Mamba-2's fused conv + SSD op (capture/ssd_cost.py), counted by hand, and what
a capture records for the op (capture/opinfo.py)."""

import torch

import models.layers.mamba  # noqa: F401  (registers the heterosim:: ops)
from capture.opinfo import describe
from capture.ssd_cost import ssd_cost

# b 1, l 256, H 2 heads of P 4, G 1 group of N 8, chunks of Q 128 (c = 2), conv width K 4 over
# Cv = 8 + 16 = 24 channels; zxbcdt width 2*8 + 2*8 + 2 = 34; S = 1*2*2*4*8 = 128 state elements.


def _args(dy=False):
    meta = dict(device="meta")
    t = [torch.empty(1, 256, 34, dtype=torch.bfloat16, **meta), torch.empty(24, 4, dtype=torch.bfloat16, **meta),
         torch.empty(24, dtype=torch.bfloat16, **meta), torch.empty(2, **meta), torch.empty(2, **meta),
         torch.empty(2, **meta), 128, 4, 1]
    return ([torch.empty(1, 256, 8, dtype=torch.bfloat16, **meta)] if dy else []) + t


def test_forward_by_hand():
    """FLOPs: 2 (conv 256*4*24 + states and entering states 2*256*2*4*8 + C B^T 256*128*1*8 + causal
    intra-chunk 256*2*4*128/2) + state passing 2*128 = 2 (24,576 + 32,768 + 262,144 + 131,072) + 256
    = 901,376.
    Read: zxbcdt 256*34*2 + conv output three times and z (256*(16 + 16 + 24)*2) + dt / dA (3*256*2*4)
    + states 128*(4 + 2) + C B^T 2*128*128*4 + parameters (96 + 24)*2 + 3*2*4 = 184,328.
    Written: conv output and y 256*(24 + 8)*2 + dt, dA 2*256*2*4 + states 768 + C B^T 131,072 = 152,320."""
    read, written, flops, dims = ssd_cost("mamba_split_conv1d_scan", _args())
    assert (read, written, flops) == (184_328, 152_320, 901_376.0)
    assert dims == {"b": 1, "l": 256, "h": 2, "p": 4, "n": 8, "g": 1, "q": 128, "dir": "fwd"}


def test_backward_by_hand():
    """FLOPs: 2 (3 conv + 6 states + 3 C B^T + 3 intra) + 4 S = 2 (73,728 + 98,304 + 786,432 + 393,216)
    + 512 = 2,703,872. Read: dy 256*8*2 + twice
    the forward's reads = 372,752. Written: dzxbcdt 256*34*2 + parameter grads 264 + twice the forward's
    intermediates (152,320 - y 4,096) = 314,120."""
    read, written, flops, dims = ssd_cost("mamba_split_conv1d_scan_backward", _args(dy=True))
    assert (read, written, flops) == (372_752, 314_120, 2_703_872.0)
    assert dims["dir"] == "bwd" and dims["l"] == 256


def test_a_capture_records_the_op_as_ssm_with_those_costs():
    op = torch.ops.heterosim.mamba_split_conv1d_scan.default
    args = _args()
    out = op(*args)
    cost = describe(op, args, {}, out, [], "forward")
    assert cost.kernel_class == "ssm" and cost.dtype == "bf16"
    assert (cost.bytes_read, cost.bytes_written, cost.flops, cost.flops_full) == (184_328, 152_320, 901_376.0, 901_376.0)
    assert cost.dims["dir"] == "fwd"
    # a tensor-core class keeps its class in every phase
    assert describe(op, args, {}, out, [], "optimizer").kernel_class == "ssm"
