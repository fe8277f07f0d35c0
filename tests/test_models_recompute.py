"""Tests of ``models.layers.recompute`` through ``TransformerBlock``: recomputation changes
memory, never numbers; bad flags fail clearly."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from heterosim.errors import ConfigError
from models.config import ModelConfig, TrainConfig
from models.transformer import TransformerBlock

SOLO = SimpleNamespace(tp_size=1, cp_size=1, sequence_parallel=False, tp_group=None, async_tp_allreduce=True,
               tp_comm_overlap=False, tp_comm_aggregate=(), tp_comm_sm_margin=(), tp_comm_fp8_buf=())
MCFG = ModelConfig(num_layers=3, hidden_size=16, num_attention_heads=2, seq_length=8, hidden_dropout=0.0)


def _grads(mcfg=MCFG, pstate=SOLO, **tkw):
    torch.manual_seed(0)
    block = TransformerBlock(mcfg, TrainConfig(params_dtype="fp32", **tkw), pstate, layers=range(mcfg.num_layers),
                             post_process=True)
    x = torch.randn(8, 2, 16, requires_grad=True)
    y = block(x)
    (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
    return [y.detach(), x.grad] + [p.grad for p in block.parameters()]


@pytest.mark.parametrize("tkw", [
    dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2),
    dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=2),
    dict(recompute_granularity="selective"),
])
def test_recompute_gives_identical_gradients(tkw):
    """Full (uniform / block) and selective recomputation give bitwise the same outputs and grads."""
    for a, b in zip(_grads(), _grads(**tkw)):
        assert torch.equal(a, b)


def test_full_recompute_needs_method_and_count():
    """--recompute-granularity full without a method or a layer count names the missing flag."""
    with pytest.raises(ConfigError, match="needs --recompute-method uniform or block, got None"):
        TransformerBlock(MCFG, TrainConfig(recompute_granularity="full"), SOLO, layers=range(1), post_process=False)
    with pytest.raises(ConfigError, match="needs --recompute-num-layers >= 1"):
        TransformerBlock(MCFG, TrainConfig(recompute_granularity="full", recompute_method="block"), SOLO,
                         layers=range(1), post_process=False)


# ---- selective recomputation by module (--recompute-modules) -----------------------------------

def test_selective_modules_checks_as_megatron_does():
    """Default core_attn, order kept, repeats dropped; one clear error per misuse."""
    from models.layers.recompute import selective_modules
    assert selective_modules("selective", None, moe=False, mla=False) == ("core_attn",)
    assert selective_modules("selective", ["moe_act", "layernorm", "moe_act"], moe=True, mla=False) == ("moe_act", "layernorm")
    assert selective_modules(None, None, moe=True, mla=True) == () == selective_modules("full", None, moe=False, mla=False)
    with pytest.raises(ConfigError, match=r"^--recompute-modules mhc: not a module; valid: core_attn, layernorm, mlp, "
                                          r"moe, moe_act, shared_experts, mla_up_proj$"):
        selective_modules("selective", ["mlp", "mhc"], moe=False, mla=False)
    with pytest.raises(ConfigError, match="^--recompute-modules needs --recompute-granularity selective, got 'full'$"):
        selective_modules("full", ["mlp"], moe=False, mla=False)
    with pytest.raises(ConfigError, match=r"moe_act and shared_experts need an MoE model \(--num-experts\)$"):
        selective_modules("selective", ["moe_act"], moe=False, mla=False)
    with pytest.raises(ConfigError, match="^--recompute-modules mla_up_proj needs --multi-latent-attention$"):
        selective_modules("selective", ["mla_up_proj"], moe=True, mla=False)


def test_recompute_modules_flag():
    """pretrain_gpt's --recompute-modules reaches TrainConfig; recomputes() reads it."""
    from models.args import parse_args
    base = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--vocab-size", "128", "--num-experts", "4", "--recompute-granularity", "selective"]
    t = parse_args(base + ["--recompute-modules", "moe_act", "layernorm"], world_size=1).train
    assert t.recompute_modules == ("moe_act", "layernorm")
    assert t.recomputes("layernorm") and not t.recomputes("core_attn")
    assert parse_args(base, world_size=1).train.recompute_modules == ("core_attn",)
    with pytest.raises(ConfigError, match="--recompute-modules attn: not a module"):
        parse_args(base + ["--recompute-modules", "attn"], world_size=1)


MOE_SOLO = SimpleNamespace(**vars(SOLO), ep_size=1, etp_size=1, ep_domain=0, ep_group=None)
MOE_CFG = ModelConfig(num_layers=2, hidden_size=16, num_attention_heads=2, seq_length=8, hidden_dropout=0.0,
                      num_experts=4, moe_router_topk=2, activation="swiglu", normalization="RMSNorm",
                      moe_shared_expert_intermediate_size=8)


@pytest.mark.parametrize("modules,mcfg", [
    (("mlp", "layernorm"), MCFG),
    (("moe_act", "layernorm", "shared_experts"), MOE_CFG),
    (("moe", "core_attn"), MOE_CFG),
])
def test_recompute_modules_give_identical_gradients(modules, mcfg):
    """Recomputing modules changes memory and time, never numbers (bitwise)."""
    plain = _grads(mcfg, MOE_SOLO)
    for a, b in zip(plain, _grads(mcfg, MOE_SOLO, recompute_granularity="selective", recompute_modules=modules)):
        assert torch.equal(a, b)


FAKE = """
from models import parallel_state
from models.config import ModelConfig, ParallelConfig, TrainConfig
from models.transformer import TransformerBlock
ann = PhaseAnnotator(); set_annotator(ann)
ps = parallel_state.initialize(ParallelConfig(world_size=4, tp=2, ep=2, sequence_parallel=True), 1)

def run(modules, **mkw):
    mcfg = ModelConfig(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=32, hidden_dropout=0.0,
                       activation="swiglu", normalization="RMSNorm", add_bias_linear=False, **mkw)
    tcfg = TrainConfig(recompute_granularity="selective", recompute_modules=modules)
    block = TransformerBlock(mcfg, tcfg, ps, layers=range(1), post_process=False)
    x = torch.randn(16, 2, 64, dtype=torch.bfloat16, requires_grad=True)  # s/tp = 16, b = 2
    log = OpLog(ann)
    with log:
        y = block(x)
        with ann.scope(phase="bwd"):
            y.backward(torch.ones_like(y))
    rc = [o for o in log.ops if o["phase"] == "recompute"]
    return dict(gemm=[o["name"].split(".")[1] for o in rc if o["name"].startswith(("aten.mm", "aten.bmm"))],
                comm=[c[:2] for c in comm_ops(rc)], norms=sum("rms_norm" in o["name"] or "rsqrt" in o["name"] for o in rc),
                attn=sum("attention" in o["name"] for o in rc), n=len(rc))

moe = dict(num_experts=4, moe_router_topk=2, ffn_hidden_size=128)
mla = dict(multi_latent_attention=True, q_lora_rank=32, kv_lora_rank=16, qk_head_dim=16, qk_pos_emb_head_dim=8,
           v_head_dim=16, position_embedding_type="rope")
result = dict(mlp=run(("mlp",), ffn_hidden_size=128), ln_dense=run(("layernorm",), ffn_hidden_size=128),
              ln_moe=run(("layernorm",), **moe), act=run(("moe_act",), **moe), moe=run(("moe",), **moe),
              up=run(("mla_up_proj",), ffn_hidden_size=128, **mla))
"""


@pytest.fixture(scope="module")
def fake():
    from test_models_mappings import run_fake
    return run_fake(FAKE, rank=1, world=4)


def test_mlp_recompute_reruns_the_mlp_with_its_norm_and_sp_traffic(fake):
    """TP 2 with SP, 16 x 2 local tokens, h 64: a dense layer's MLP re-runs fc1 and fc2 (two mm),
    fc1's all-gather of [32, 2, 64] and fc2's reduce-scatter of [32, 2, 64] bf16, and the pre-MLP norm
    fused into fc1; no attention."""
    r = fake["mlp"]
    assert r["gemm"] == ["mm", "mm"] and r["attn"] == 0 and r["norms"] >= 1
    assert r["comm"] == [["_allgather_base_", 32 * 2 * 64 * 2], ["_reduce_scatter_base_", 32 * 2 * 64 * 2]]


def test_layernorm_recompute_is_the_moe_pre_mlp_norm_only(fake):
    """A dense layer's norms are fused into Transformer Engine's LayerNormLinear: nothing to
    recompute; an MoE layer re-runs its pre-MLP norm alone (no GEMM, no communication)."""
    assert fake["ln_dense"]["n"] == 0
    r = fake["ln_moe"]
    assert r["n"] > 0 and r["norms"] >= 1 and r["gemm"] == [] and r["comm"] == []


def test_moe_act_recompute_reruns_the_activation_alone(fake):
    """moe_act re-runs the experts' SwiGLU and weighting: elementwise ops, no GEMM or exchange."""
    r = fake["act"]
    assert r["n"] > 0 and r["gemm"] == [] and r["comm"] == [] and r["norms"] == 0


def test_moe_recompute_reruns_the_exchange(fake):
    """moe re-runs the whole MoE layer in backward: the router GEMM, the experts' two batched GEMMs
    and every exchange of the forward. 32 local tokens x top-2 = 64 copies of h 64 (bf16), EP 2, TP 2:
    the counts all-gather (4 int64 x 2 ranks), tokens (8192 B) and probs (128 B) all-to-all, their TP
    all-gathers (x2), the TP reduce-scatter and the combine all-to-all."""
    r = fake["moe"]
    assert r["gemm"] == ["mm", "bmm", "bmm"]
    assert r["comm"] == [["_allgather_base_", 64], ["alltoall_base_", 8192], ["alltoall_base_", 128],
                         ["_allgather_base_", 16384], ["_allgather_base_", 256], ["_reduce_scatter_base_", 16384],
                         ["alltoall_base_", 8192]]


def test_mla_up_proj_recompute_reruns_the_up_projections(fake):
    """mla_up_proj re-runs the query and key-value up projections (two mm), their norms and, with SP,
    the two latent all-gathers ([32, 2, 32] and [32, 2, 16] bf16; see models/layers/mla.py)."""
    r = fake["up"]
    assert r["gemm"] == ["mm", "mm"] and r["attn"] == 0 and r["norms"] >= 2
    assert r["comm"] == [["_allgather_base_", 32 * 2 * 32 * 2], ["_allgather_base_", 32 * 2 * 16 * 2]]
