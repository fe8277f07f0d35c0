"""Sliding-window attention and attention sinks (models/layers/window_attention.py): the op against
the masked softmax written out, its gradient, which layers are windowed, and the errors."""

from types import SimpleNamespace

import pytest
import torch

from heterosim.errors import ConfigError
from models.config import ModelConfig
from models.layers.attention import SelfAttention
from models.layers.window_attention import window_attention

SOLO = SimpleNamespace(tp_size=1, tp_group=None, cp_size=1, sequence_parallel=False, async_tp_allreduce=True,
                       tp_comm_overlap=False, tp_comm_aggregate=(), tp_comm_sm_margin=(), tp_comm_fp8_buf=())
F64 = dict(dtype=torch.float64)


def test_window_and_sinks_written_out():
    """Query i sees keys i-2..i (window 2); each K/V head serves 2 query heads; the sink logit of a
    head joins the softmax denominator: p_ij = exp(s_ij) / (exp(sink) + sum_j exp(s_ij)). 1e-12."""
    torch.manual_seed(0)
    s, b, np_, ng, d = 7, 2, 4, 2, 3
    q, k, v = torch.randn(s, b, np_, d, **F64), torch.randn(s, b, ng, d, **F64), torch.randn(s, b, ng, d, **F64)
    sinks = torch.randn(np_, **F64)
    out = window_attention(q, k, v, window=2, sinks=sinks)
    ref = torch.zeros(s, b, np_, d, **F64)
    for i in range(s):
        for h in range(np_):
            keys = range(max(0, i - 2), i + 1)
            logits = torch.stack([(q[i, :, h] * k[j, :, h // 2]).sum(-1) / d ** 0.5 for j in keys], -1)  # [b, n]
            den = torch.exp(sinks[h]) + torch.exp(logits).sum(-1, keepdim=True)
            ref[i, :, h] = sum((torch.exp(logits[:, n]) / den[:, 0]).unsqueeze(-1) * v[j, :, h // 2]
                               for n, j in enumerate(keys))
    assert torch.allclose(out, ref.reshape(s, b, np_ * d), atol=1e-12, rtol=0)
    full = window_attention(q, k, v, window=None)
    causal = torch.nn.functional.scaled_dot_product_attention(
        q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3), is_causal=True, enable_gqa=True)
    assert torch.allclose(full, causal.permute(2, 0, 1, 3).reshape(s, b, np_ * d), atol=1e-12, rtol=0)


@pytest.mark.parametrize("with_sinks", [True, False])
def test_gradient_matches_finite_differences(with_sinks):
    torch.manual_seed(1)
    ins = [torch.randn(5, 1, 2, 3, **F64, requires_grad=True), torch.randn(5, 1, 1, 3, **F64, requires_grad=True),
           torch.randn(5, 1, 1, 3, **F64, requires_grad=True)] + ([torch.randn(2, **F64, requires_grad=True)]
                                                                   if with_sinks else [])
    fn = (lambda q, k, v, s=None: window_attention(q, k, v, window=1, sinks=s))
    assert torch.autograd.gradcheck(fn, tuple(ins))


def _cfg(**kw):
    return ModelConfig(**{**dict(num_layers=4, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                                 window_size=127, window_attn_skip_freq=2, softmax_type="learnable"), **kw})


def test_every_other_layer_is_windowed_and_sinks_are_per_head():
    """GPT-OSS: window (127, 0) with skip frequency 2: layers 1 and 3 (1-based) windowed, 2 and 4 full
    (Megatron-core's is_layer_window_attention); every layer has a sink per head of its rank."""
    c = _cfg()
    assert [c.attention_window(i) for i in range(4)] == [127, None, 127, None]
    assert _cfg(window_attn_skip_freq=None).attention_window(3) == 127 and _cfg(window_size=None).attention_window(0) is None
    attn = SelfAttention(c, SOLO, dtype=torch.float32, init_std=0.02, fp8=False, selective_recompute=False,
                         layer_number=1)
    assert attn.window is None and attn.softmax_offset.shape == (4,)


def test_context_parallelism_is_refused():
    cp = SimpleNamespace(**{**vars(SOLO), "cp_size": 2})
    with pytest.raises(ConfigError, match=r"sliding-window attention and attention sinks run as one fused kernel "
                                          r"without context parallelism"):
        SelfAttention(_cfg(), cp, dtype=torch.float32, init_std=0.02, fp8=False, selective_recompute=False)
