"""Multi-head latent attention (models/layers/mla.py): the math against a hand-written reference,
and its per-layer shapes under TP."""

from types import SimpleNamespace

import pytest
import torch

from heterosim.errors import ConfigError
from models.config import ModelConfig
from models.layers.mla import MultiLatentAttention
from models.layers.rope import rotary_freqs
from test_models_mappings import run_fake

SOLO = SimpleNamespace(tp_size=1, tp_group=None, cp_size=1, sequence_parallel=False, async_tp_allreduce=True)


def _cfg(**kw):
    base = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=8, multi_latent_attention=True,
                q_lora_rank=16, kv_lora_rank=8, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=6,
                add_bias_linear=False, normalization="RMSNorm", rope_fusion=False)
    return ModelConfig(**{**base, **kw})


def _rope(t, freqs):
    x1, x2 = torch.chunk(t, 2, dim=-1)
    return t * torch.cos(freqs) + torch.cat((-x2, x1), dim=-1) * torch.sin(freqs)


def _rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_matches_the_deepseek_formulas():
    """DeepSeek-V2 eq. (37)-(47) written out: compressed query and key/value, RMSNorm, up
    projections, RoPE on the 4-dim rotary parts (one shared key part per token), causal softmax
    over (8 + 4)-dim heads, 6-dim values, output projection. The module (value heads padded for
    the fused kernel) agrees to 1e-12."""
    torch.manual_seed(0)
    m = MultiLatentAttention(_cfg(), SOLO, dtype=torch.float64, init_std=0.2, fp8=False, selective_recompute=False)
    s, b, h, n = 8, 2, 32, 4
    x = torch.randn(s, b, h, dtype=torch.float64)
    freqs = rotary_freqs(s, 4).to(torch.float64)
    out, bias = m(x, freqs)
    assert bias is None and out.shape == (s, b, h)
    c_q = _rms(x @ m.linear_q_down_proj.weight.t(), m.q_layernorm.weight)
    q = (c_q @ m.linear_q_up_proj.weight.t()).view(s, b, n, 12)
    c_kv, k_pe = torch.split(x @ m.linear_kv_down_proj.weight.t(), [8, 4], dim=-1)
    kv = (_rms(c_kv, m.kv_layernorm.weight) @ m.linear_kv_up_proj.weight.t()).view(s, b, n, 14)
    k_nope, v = kv[..., :8], kv[..., 8:]
    qf = torch.cat([q[..., :8], _rope(q[..., 8:], freqs)], -1)
    kf = torch.cat([k_nope, _rope(k_pe.unsqueeze(2), freqs).expand(s, b, n, 4)], -1)
    scores = torch.einsum("sbnd,tbnd->bnst", qf, kf) / 12**0.5
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    ctx = torch.einsum("bnst,tbnd->sbnd", scores.softmax(-1), v).reshape(s, b, n * 6)
    assert torch.allclose(out, ctx @ m.linear_proj.weight.t(), atol=1e-12, rtol=0)


def test_without_q_lora_rank_the_query_is_one_projection():
    m = MultiLatentAttention(_cfg(q_lora_rank=None), SOLO, dtype=torch.float32, init_std=0.02, fp8=False,
                             selective_recompute=False)
    assert not hasattr(m, "linear_q_down_proj") and m.linear_q_proj.weight.shape == (4 * 12, 32)


def test_context_parallelism_is_refused():
    cp = SimpleNamespace(**{**vars(SOLO), "cp_size": 2})
    with pytest.raises(ConfigError, match=r"--multi-latent-attention runs with one fused attention kernel and no "
                                          r"context parallelism"):
        MultiLatentAttention(_cfg(), cp, dtype=torch.float32, init_std=0.02, fp8=False, selective_recompute=False)


TP2 = """
from models import parallel_state
from models.config import ModelConfig, ParallelConfig
from models.layers.mla import MultiLatentAttention
from models.layers.rope import rotary_freqs
ann = PhaseAnnotator(); set_annotator(ann)
ps = parallel_state.initialize(ParallelConfig(world_size=2, tp=2, sequence_parallel=True), 1)
mcfg = ModelConfig(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=16, multi_latent_attention=True,
                   q_lora_rank=32, kv_lora_rank=16, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16,
                   add_bias_linear=False)
m = MultiLatentAttention(mcfg, ps, dtype=torch.bfloat16, init_std=0.02, fp8=False, selective_recompute=False)
x = torch.randn(8, 2, 64, dtype=torch.bfloat16)
log = OpLog(ann)
with log:
    m(x, rotary_freqs(16, 8))
result = dict(comm=comm_ops(log.ops), mm=[o["shapes"][:2] for o in log.ops if o["name"] == "aten.mm.default"],
              attn=[o["shapes"][:3] for o in log.ops if "attention" in o["name"]],
              sp=sorted(n for n, p in m.named_parameters() if getattr(p, "sequence_parallel", False)))
"""


def test_tp2_sequence_parallel_shapes_and_traffic():
    """TP 2 with SP, 16 tokens x batch 2 (8 per rank), 4 heads (2 per rank): the down projections
    run first, on the rank's 16 rows with whole weights (their grads summed over TP like the norms'),
    as in Megatron-core; the rotary key part [16, 2, 8] is all-gathered; each up projection gathers
    its [16, 2, r] latent; attention over 2 heads of 24 (value padded from 16); the output
    reduce-scattered."""
    r = run_fake(TP2, rank=1, world=2)
    assert [c[:2] for c in r["comm"]] == [["_allgather_base_", 16 * 2 * 8 * 2], ["_allgather_base_", 16 * 2 * 32 * 2],
                                          ["_allgather_base_", 16 * 2 * 16 * 2], ["_reduce_scatter_base_", 16 * 2 * 64 * 2]]
    assert r["mm"] == [[[16, 64], [64, 32]], [[16, 64], [64, 24]], [[32, 32], [32, 48]], [[32, 16], [16, 64]],
                       [[32, 32], [32, 64]]]
    assert r["attn"] == [[[2, 2, 16, 24]] * 3]
    assert r["sp"] == ["kv_layernorm.weight", "linear_kv_down_proj.weight", "linear_q_down_proj.weight",
                       "q_layernorm.weight"]
