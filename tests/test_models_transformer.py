"""Tests of ``models.transformer``: one layer's TP traffic, GEMM FLOPs, fused attention and
recomputation, listed by a dispatch mode in a fake 4-rank TP world."""

from __future__ import annotations

import pytest

from test_models_mappings import run_fake

B, S, H, HEADS, TP = 2, 64, 256, 8, 4

CASES = """
from models import parallel_state
from models.config import ModelConfig, ParallelConfig, TrainConfig
from models.transformer import TransformerBlock
ann = PhaseAnnotator(); set_annotator(ann)
B, S, H = {B}, {S}, {H}
states = {{}}
for sp in (False, True):
    states[sp] = parallel_state.initialize(ParallelConfig(world_size=4, tp=4, sequence_parallel=sp), 1)

def run(sp=False, groups=None, act="gelu", bias=True, layers=1, dropout=0.0, **tkw):
    mcfg = ModelConfig(num_layers=layers, hidden_size=H, num_attention_heads={HEADS}, num_query_groups=groups,
                       seq_length=S, activation=act, add_bias_linear=bias, hidden_dropout=dropout,
                       normalization="RMSNorm" if act == "swiglu" else "LayerNorm")
    block = TransformerBlock(mcfg, TrainConfig(**tkw), states[sp], layers=range(layers), post_process=False)
    x = torch.randn(S // ({TP} if sp else 1), B, H, dtype=torch.bfloat16, requires_grad=True)
    log = OpLog(ann)
    with log:
        y = block(x)
        n_fwd = len(log.ops)
        with ann.scope(phase="bwd"):
            y.backward(torch.ones_like(y))
    weights = sum(p.numel() for n, p in block.named_parameters() if p.dim() == 2)
    return dict(fwd=log.ops[:n_fwd], bwd=log.ops[n_fwd:], weights=weights)

def summary(r):
    return dict(fwd_comm=comm_ops(r["fwd"]), bwd_comm=comm_ops(r["bwd"]), weights=r["weights"],
                fwd_gemm=gemm_flops(r["fwd"]),
                attn=[[o["name"], o["shapes"][:3], o["phase"]] for o in r["fwd"] + r["bwd"] if "attention" in o["name"] or "math" in o["name"]],
                recompute_ops=sorted({{o["name"] for o in r["bwd"] if o["phase"] == "recompute"}}),
                dropout=[o["name"] for o in r["fwd"] + r["bwd"] if "dropout" in o["name"] or "bernoulli" in o["name"]],
                gemm_dtypes=sorted({{str(o["gemm_dtype"]) for o in r["fwd"] + r["bwd"] if o["name"].startswith("aten.mm")}}))

result = dict(
    plain=summary(run()),
    sp=summary(run(sp=True)),
    gqa=summary(run(groups=4, act="swiglu", bias=False)),
    full=summary(run(layers=2, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2)),
    block=summary(run(layers=2, recompute_granularity="full", recompute_method="block", recompute_num_layers=1)),
    selective=summary(run(recompute_granularity="selective")),
    fp8=summary(run(fp8="hybrid", dropout=0.1)),
)
""".format(B=B, S=S, H=H, HEADS=HEADS, TP=TP)


@pytest.fixture(scope="module")
def res():
    return run_fake(CASES, rank=1, world=4)


def test_tp_all_reduce_bytes_per_layer(res):
    """Without SP a layer all-reduces 2*b*s*h bytes (bf16) twice forward, twice backward."""
    nb = 2 * B * S * H
    assert res["plain"]["fwd_comm"] == [["allreduce_", nb, "fwd"]] * 2
    assert res["plain"]["bwd_comm"] == [["allreduce_", nb, "bwd"]] * 2


def test_sequence_parallel_traffic_per_layer(res):
    """With SP: forward 2 all-gathers (output 2bsh bytes) and 2 reduce-scatters (input 2bsh);
    backward re-gathers the input for wgrad (2), gathers the reduce-scattered grads (2) and
    reduce-scatters the dgrads (2)."""
    nb = 2 * B * S * H
    ag, rs = ["_allgather_base_", nb], ["_reduce_scatter_base_", nb]
    fwd = [c[:2] for c in res["sp"]["fwd_comm"]]
    assert fwd == [ag, rs, ag, rs]
    bwd = [c[:2] for c in res["sp"]["bwd_comm"]]
    # fc2 (row): AG of the output grad; fc1 (column): re-gather input, then RS of dgrad; same for attention.
    assert bwd == [ag, ag, rs, ag, ag, rs]


def test_forward_gemm_flops_match_weights(res):
    """Forward GEMM FLOPs = 2*b*s*(per-rank GEMM weights of the layer); attention is a separate kernel."""
    for case in ("plain", "gqa", "sp"):
        r = res[case]
        assert r["fwd_gemm"] == 2 * B * S * r["weights"], case
    # per-rank weights: qkv 3h*h/tp + proj h*h/tp + fc1 4h*h/tp + fc2 4h*h/tp = 12 h^2 / tp
    assert res["plain"]["weights"] == 12 * H * H // TP
    # GQA (8 heads, 4 groups, d 32) + SwiGLU: qkv (8+2*4)*32*h/tp + proj h*h/tp + fc1 2*4h*h/tp + fc2 4h*h/tp
    assert res["gqa"]["weights"] == ((8 + 8) * 32 * H + H * H + 8 * H * H + 4 * H * H) // TP


def test_fused_cpu_flash_attention_runs(res):
    """SDPA runs the CPU flash kernel and its backward, also with GQA (K/V keep their heads)."""
    d, np_ = H // HEADS, HEADS // TP
    assert res["plain"]["attn"] == [
        ["aten._scaled_dot_product_flash_attention_for_cpu.default", [[B, np_, S, d]] * 3, "fwd"],
        ["aten._scaled_dot_product_flash_attention_for_cpu_backward.default", [[B, np_, S, d]] * 3, "bwd"]]
    gqa = res["gqa"]["attn"]
    assert [a[0].split(".")[1] for a in gqa] == ["_scaled_dot_product_flash_attention_for_cpu",
                                                 "_scaled_dot_product_flash_attention_for_cpu_backward"]
    assert gqa[0][1] == [[B, np_, S, d], [B, 1, S, d], [B, 1, S, d]]


def test_recompute_reruns_forward_tagged_recompute(res):
    """Full recompute re-runs the forward (GEMMs, attention, TP all-reduces) in phase
    "recompute"; selective re-runs only core attention."""
    full = res["full"]["recompute_ops"]
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in full
    assert "aten.mm.default" in full and "c10d.allreduce_.default" in full
    assert res["block"]["recompute_ops"] == full
    assert sum(c[2] == "recompute" for c in res["full"]["bwd_comm"]) == 4  # 2 layers x 2 all-reduces
    assert sum(c[2] == "recompute" for c in res["block"]["bwd_comm"]) == 2  # only the first layer
    sel = res["selective"]["recompute_ops"]
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in sel
    assert not any(n.startswith(("aten.mm", "c10d.")) for n in sel)
    assert res["plain"]["recompute_ops"] == []


def test_fp8_marks_gemms(res):
    """With --fp8-format every GEMM of the layer (fwd and bwd) runs under gemm_dtype fp8."""
    assert res["fp8"]["gemm_dtypes"] == ["fp8"]
    assert res["plain"]["gemm_dtypes"] == ["None"]


def test_hidden_dropout_is_one_fused_kernel_each_way(res):
    """Bias-dropout-add runs aten.native_dropout (fwd) and native_dropout_backward, twice per layer."""
    assert res["fp8"]["dropout"] == ["aten.native_dropout.default"] * 2 + ["aten.native_dropout_backward.default"] * 2
    assert res["plain"]["dropout"] == []


DELAYED = """
from models import parallel_state
from models.config import ModelConfig, ParallelConfig, TrainConfig
from models.layers import fp8 as te_fp8
from models.transformer import TransformerBlock
ann = PhaseAnnotator(); set_annotator(ann)
ps = parallel_state.initialize(ParallelConfig(world_size=4, tp=2, amax_reduction_group=True), 1)
mcfg = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16)
block = TransformerBlock(mcfg, TrainConfig(fp8="hybrid"), ps, layers=range(2), post_process=False)
block.fp8_scaling = te_fp8.DelayedScaling.for_stage([block], ps.amax_group)
out = {"gemms": block.fp8_scaling.num_gemms, "amax_ranks": sorted(dist.get_process_group_ranks(ps.amax_group))}
for name in ("delayed", "tensorwise"):
    x = torch.randn(16, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    log = OpLog(ann)
    with te_fp8.recipe(name), log:
        y = block(x)
        n_fwd = len(log.ops)
        y.backward(torch.ones_like(y))
    ops = [[o["name"], o["shapes"]] for o in log.ops]
    bwd = ops[n_fwd:]
    i = next((k for k, o in enumerate(bwd) if o == ["aten.clone.default", [[16]]]), len(bwd))
    out[name] = {"fwd_tail": ops[n_fwd - 3:n_fwd], "bwd_update": bwd[i:i + 3],
                 "gemms_after_update": sum(1 for o in bwd[i:] if o[0].startswith("aten.mm")),
                 "max_reductions": sum(1 for o in log.ops if o["name"] == "c10d.allreduce_.default"
                                       and o["shapes"][0] in ([24], [16]))}
result = out
"""


def test_delayed_scaling_reduces_amaxes_at_each_region_exit():
    """Two layers x 4 fp8 GEMMs: the forward ends with the 24 forward amaxes (3 a GEMM) copied out,
    all-reduced over the amax group (tp x dp = all 4 ranks) and the history [1024, 24] reduced; after
    the backward's last GEMM the same runs on the 16 gradient amaxes (2 a GEMM). Current scaling
    does none."""
    r = run_fake(DELAYED, rank=1, world=4)
    assert r["gemms"] == 8 and r["amax_ranks"] == [0, 1, 2, 3]
    assert r["delayed"]["fwd_tail"] == [["aten.clone.default", [[24]]], ["c10d.allreduce_.default", [[24]]],
                                        ["aten.amax.default", [[1024, 24]]]]
    assert r["delayed"]["bwd_update"] == [["aten.clone.default", [[16]]], ["c10d.allreduce_.default", [[16]]],
                                          ["aten.amax.default", [[1024, 16]]]]
    assert r["delayed"]["gemms_after_update"] == 0  # after the region's last GEMM
    assert r["tensorwise"]["max_reductions"] == 0


NVFP4_LAYERS = """
from models import parallel_state
from models.config import ModelConfig, ParallelConfig, TrainConfig
from models.layers import fp8 as te_fp8
from models.transformer import TransformerBlock
ann = PhaseAnnotator(); set_annotator(ann)
ps = parallel_state.initialize(ParallelConfig(world_size=2, tp=2, sequence_parallel=True), 1)
mcfg = ModelConfig(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32, add_bias_linear=False)
block = TransformerBlock(mcfg, TrainConfig(fp8="e2m1", fp8_recipe="nvfp4", bf16_layers=(1, 1)), ps,
                         layers=range(4), post_process=False)
x = torch.randn(16, 2, 64, dtype=torch.bfloat16, requires_grad=True)
log = OpLog(ann)
with te_fp8.recipe("nvfp4"), log:
    y = block(x)
    n_fwd = len(log.ops)
    y.backward(torch.ones_like(y))
result = dict(fwd=[str(o["gemm_dtype"]) for o in log.ops[:n_fwd] if o["name"].startswith("aten.mm")],
              quantizes=sum(o["name"] == "heterosim.nvfp4_quantize.default" for o in log.ops),
              transposes=sum(o["name"] == "aten.clone.default" for o in log.ops))
"""


def test_nvfp4_gemms_with_the_first_and_last_layers_in_bf16():
    """--fp4-format e2m1 --first-last-layers-bf16 on 4 layers: layer 0 and 3 run their 4 forward
    GEMMs in bf16, layers 1 and 2 in fp4. The two fp4 layers quantize each GEMM's input and output
    gradient once (2 layers x 4 GEMMs x 2 = 16 quantizes) and transpose nothing."""
    r = run_fake(NVFP4_LAYERS, rank=0, world=2)
    assert r["fwd"] == ["None"] * 4 + ["fp4"] * 8 + ["None"] * 4
    assert (r["quantizes"], r["transposes"]) == (16, 0)
