"""Tests of ``models.layers.attention`` and ``models.layers.mlp`` at one rank (real tensors)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from heterosim.errors import ConfigError
from models.config import ModelConfig
from models.layers.attention import SelfAttention
from models.layers.mlp import MLP, activation_fn
from models.layers.rope import apply_rotary, rotary_freqs

SOLO = SimpleNamespace(tp_size=1, cp_size=1, sequence_parallel=False, tp_group=None, async_tp_allreduce=True,
               tp_comm_overlap=False, tp_comm_aggregate=(), tp_comm_sm_margin=(), tp_comm_fp8_buf=())


def test_gqa_attention_matches_explicit_heads():
    """8 heads / 2 groups, RoPE: the per-group [q*4, k, v] QKV layout, causal softmax attention
    with each K/V head shared by 4 query heads, then the output projection."""
    torch.manual_seed(0)
    mcfg = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=8, num_query_groups=2, seq_length=6)
    attn = SelfAttention(mcfg, SOLO, dtype=torch.float64, init_std=0.2, fp8=False, selective_recompute=False)
    x = torch.randn(6, 2, 32, dtype=torch.float64)
    freqs = rotary_freqs(6, 4).double()
    out, bias = attn(x, freqs)
    mixed = (x @ attn.linear_qkv.weight.T + attn.linear_qkv.bias).view(6, 2, 2, 6 * 4)
    q = mixed[..., :16].reshape(6, 2, 8, 4)
    k, v = mixed[..., 16:20], mixed[..., 20:24]
    q, k = apply_rotary(q, freqs), apply_rotary(k, freqs)
    k, v = k.repeat_interleave(4, dim=2), v.repeat_interleave(4, dim=2)
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) / 2.0
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    ctx = torch.einsum("bhst,tbhd->sbhd", scores.softmax(-1), v).reshape(6, 2, 32)
    torch.testing.assert_close(out, ctx @ attn.linear_proj.weight.T)
    assert bias is attn.linear_proj.bias


def test_qk_layernorm_normalizes_each_heads_query_and_key_before_rope():
    """--qk-layernorm (Qwen3): RMSNorm of every query and key head over its 4 dims with one weight per
    kind shared by the heads, then RoPE and the same attention (the weights set to 0.5 and 2)."""
    torch.manual_seed(0)
    mcfg = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=8, num_query_groups=2, seq_length=6,
                       qk_layernorm=True, normalization="RMSNorm")
    attn = SelfAttention(mcfg, SOLO, dtype=torch.float64, init_std=0.2, fp8=False, selective_recompute=False)
    with torch.no_grad():
        attn.q_layernorm.weight.fill_(0.5)
        attn.k_layernorm.weight.fill_(2.0)
    x = torch.randn(6, 2, 32, dtype=torch.float64)
    freqs = rotary_freqs(6, 4).double()
    out, _ = attn(x, freqs)
    mixed = (x @ attn.linear_qkv.weight.T + attn.linear_qkv.bias).view(6, 2, 2, 6 * 4)
    rms = lambda t, w: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5) * w  # noqa: E731
    q, k = rms(mixed[..., :16].reshape(6, 2, 8, 4), 0.5), rms(mixed[..., 16:20], 2.0)
    q, k = apply_rotary(q, freqs), apply_rotary(k, freqs).repeat_interleave(4, dim=2)
    v = mixed[..., 20:24].repeat_interleave(4, dim=2)
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) / 2.0
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    ctx = torch.einsum("bhst,tbhd->sbhd", scores.softmax(-1), v).reshape(6, 2, 32)
    torch.testing.assert_close(out, ctx @ attn.linear_proj.weight.T)


def test_attention_head_split_errors():
    """Heads must be a multiple of query groups, and both must split over TP."""
    mcfg = ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=8, num_query_groups=3)
    with pytest.raises(ConfigError, match="num_attention_heads 8 must be a multiple of num_query_groups 3"):
        SelfAttention(mcfg, SOLO, dtype=torch.float32, init_std=0.02, fp8=False, selective_recompute=False)
    mcfg = ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=8, num_query_groups=2)
    with pytest.raises(ConfigError, match="attention heads 8 and query groups 2 must both be divisible by "
                                          "tensor-parallel size 4"):
        SelfAttention(mcfg, SimpleNamespace(**{**vars(SOLO), "tp_size": 4}), dtype=torch.float32,
                      init_std=0.02, fp8=False, selective_recompute=False)


def test_mlp_activations():
    """SwiGLU = silu(gate) * up from one fc1 GEMM of width 2*ffn; squared ReLU = relu(x)^2."""
    torch.manual_seed(0)
    mlp = MLP(8, 12, activation="swiglu", tp_group=None, sequence_parallel=False, bias=False,
              dtype=torch.float64, init_std=0.3, out_init_std=0.3, fp8=False)
    assert mlp.linear_fc1.weight.shape == (24, 8)
    x = torch.randn(3, 2, 8, dtype=torch.float64)
    gate, up = (x @ mlp.linear_fc1.weight.T).chunk(2, dim=-1)
    out, bias = mlp(x)
    torch.testing.assert_close(out, (torch.nn.functional.silu(gate) * up) @ mlp.linear_fc2.weight.T)
    assert bias is None
    t = torch.tensor([-1.0, 0.5, 2.0])
    assert activation_fn("squared_relu")(t).tolist() == [0.0, 0.25, 4.0]
    with pytest.raises(ConfigError) as exc:
        activation_fn("relu6")
    assert str(exc.value) == "unknown activation 'relu6'; valid: ['gelu', 'squared_relu', 'swiglu']"
