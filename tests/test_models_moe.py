"""Tests of ``models.layers.moe``: balanced routing, exact expert math at one rank, and the
dispatch / combine traffic over EP and TP in a fake 8-rank world."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from heterosim.errors import ConfigError
from models.config import ModelConfig
from models.layers.moe import MoELayer, balanced_permutation
from test_models_mappings import comm_ops, run_fake

SOLO = SimpleNamespace(ep_size=1, tp_size=1, etp_size=1, ep_domain=0, sequence_parallel=False, ep_group=None,
                       tp_group=None)


def test_balanced_permutation_is_expert_major_and_even():
    """6 tokens x top-2 over 4 experts: copy t*2+j goes to expert (t*2+j) % 4, 3 copies each."""
    order = balanced_permutation(6, 2, 4)
    assert order.tolist() == [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]
    assert sorted(order.tolist()) == list(range(12))


def test_moe_output_matches_per_token_experts():
    """out[t] = sum_j softmax(topk(router logits))[t, j] * expert_(t*k+j mod E)(x[t]), SwiGLU experts."""
    torch.manual_seed(0)
    mcfg = ModelConfig(num_layers=2, hidden_size=16, num_attention_heads=2, ffn_hidden_size=32,
                       num_experts=4, moe_router_topk=2, activation="swiglu")
    moe = MoELayer(mcfg, SOLO, dtype=torch.float64, fp8=False)
    x = torch.randn(6, 2, 16, dtype=torch.float64, requires_grad=True)
    y, bias = moe(x)
    assert bias is None and y.shape == x.shape
    tok = x.reshape(12, 16)
    probs = torch.softmax(torch.topk(tok @ moe.router.T, 2, dim=-1)[0], dim=-1)
    rows = []
    for t in range(12):
        acc = 0
        for j in range(2):
            e = (t * 2 + j) % 4
            gate, up = (tok[t] @ moe.fc1[e]).chunk(2)
            acc = acc + probs[t, j] * ((torch.nn.functional.silu(gate) * up) @ moe.fc2[e])
        rows.append(acc)
    torch.testing.assert_close(y.reshape(12, 16), torch.stack(rows), rtol=1e-9, atol=1e-9)
    y.sum().backward()
    assert moe.fc1.grad is not None and moe.router.grad is not None
    assert moe.fc1.allreduce is False and moe.fc2.allreduce is False


def test_moe_config_errors():
    """Experts must split over EP; TP needs sequence parallelism; tokens*topk must split evenly."""
    base = dict(num_layers=1, hidden_size=16, num_attention_heads=2, num_experts=6, moe_router_topk=2)
    with pytest.raises(ConfigError, match="--num-experts 6 must be divisible by --expert-model-parallel-size 4"):
        MoELayer(ModelConfig(**base), SimpleNamespace(**{**vars(SOLO), "ep_size": 4}), dtype=torch.float32, fp8=False)
    with pytest.raises(ConfigError, match=r"MoE with tensor parallelism needs --sequence-parallel"):
        MoELayer(ModelConfig(**base), SimpleNamespace(**{**vars(SOLO), "tp_size": 2, "etp_size": 2}),
                 dtype=torch.float32, fp8=False)
    moe = MoELayer(ModelConfig(**base), SOLO, dtype=torch.float32, fp8=False)
    with pytest.raises(ConfigError, match="5 local tokens x top-2 are not divisible over 6 experts"):
        moe(torch.randn(5, 1, 16))


FAKE = """
from models import parallel_state
from models.config import ModelConfig, ParallelConfig, TrainConfig
from models.layers.moe import MoELayer
ann = PhaseAnnotator(); set_annotator(ann)
ps = parallel_state.initialize(ParallelConfig(world_size=8, tp=2, ep=2, sequence_parallel=True), 3)
mcfg = ModelConfig(num_layers=1, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
                   num_experts=8, moe_router_topk=2)
moe = MoELayer(mcfg, ps, dtype=torch.bfloat16, fp8=True)
x = torch.randn(16, 2, 64, dtype=torch.bfloat16, requires_grad=True)  # s/tp = 16, b = 2
log = OpLog(ann)
with log:
    y, _ = moe(x)
    with ann.scope(phase="bwd"):
        y.backward(torch.ones_like(y))
result = dict(comm=comm_ops(log.ops), ranks=sorted({tuple(o["ranks"]) for o in log.ops if "ranks" in o}),
              casts=[[o["shapes"][0], o["phase"]] for o in log.ops
                     if o["name"] == "aten._to_copy.default" and len(o["shapes"][0]) == 3],
              bmm=[[o["shapes"][:2], o["phase"], o["gemm_dtype"]] for o in log.ops if o["name"].startswith("aten.bmm")],
              ep=list(ps.ep_ranks), local=moe.fc1.shape[0])
"""


def test_moe_dispatch_combine_traffic_in_fake_world():
    """EP 2, TP 2 (SP), 8 experts top-2, 32 local tokens: token counts (8 int64) all-gathered over
    EP, a2a of the 64 token copies over EP and then of their 64 routing weights (Megatron-core's
    probs all-to-all), all-gather / reduce-scatter over TP, one batched GEMM per projection for the
    4 local experts, its input cast to fp8 (and its output gradient in the backward); the backward
    runs the probs' collectives before the tokens'."""
    r = run_fake(FAKE, rank=3, world=8)
    assert r["ep"] == [1, 3] and r["local"] == 4
    copies, weights = 32 * 2 * 64 * 2, 32 * 2 * 2  # T*k rows x h (or 1) x bf16
    fwd = [c[:2] for c in r["comm"] if c[2] == "fwd"]
    assert fwd == [["_allgather_base_", 2 * 8 * 8], ["alltoall_base_", copies], ["alltoall_base_", weights],
                   ["_allgather_base_", 2 * copies], ["_allgather_base_", 2 * weights],
                   ["_reduce_scatter_base_", 2 * copies], ["alltoall_base_", copies]]
    bwd = [c[:2] for c in r["comm"] if c[2] == "bwd"]
    assert bwd == [["alltoall_base_", copies], ["_allgather_base_", 2 * copies], ["_reduce_scatter_base_", 2 * weights],
                   ["_reduce_scatter_base_", 2 * copies], ["alltoall_base_", weights], ["alltoall_base_", copies]]
    # each local expert sees n = 32*2/8 = 8 copies from each of tp*ep = 4 sources
    assert r["bmm"][:2] == [[[[4, 32, 64], [4, 64, 64]], "fwd", "fp8"], [[[4, 32, 64], [4, 64, 64]], "fwd", "fp8"]]
    assert len(r["bmm"]) == 2 + 4 and all(b[2] == "fp8" for b in r["bmm"])
    # Transformer Engine's GroupedLinear quantizes each projection's bf16 input, and its output gradient
    assert r["casts"] == [[[4, 32, 64], "fwd"]] * 2 + [[[4, 32, 64], "bwd"]] * 2
    assert sorted(map(tuple, r["ranks"])) == [(1, 3), (2, 3)]


EP_BODY = """
from types import SimpleNamespace
from models import parallel_state
from models.config import ModelConfig, ParallelConfig
from models.layers.moe import MoELayer
torch.manual_seed(0)
mcfg = ModelConfig(num_layers=1, hidden_size=8, num_attention_heads=2, ffn_hidden_size=12, num_experts=4,
                   moe_router_topk=2, activation="swiglu")
solo = SimpleNamespace(ep_size=1, tp_size=1, etp_size=1, ep_domain=0, sequence_parallel=False, ep_group=None,
                       tp_group=None)
ref = MoELayer(mcfg, solo, dtype=torch.float64, fp8=False)
ps = parallel_state.initialize(ParallelConfig(world_size=world, ep=2), rank)
moe = MoELayer(mcfg, ps, dtype=torch.float64, fp8=False)
with torch.no_grad():
    moe.router.copy_(ref.router)
    moe.fc1.copy_(ref.fc1[2 * ps.ep_rank:2 * ps.ep_rank + 2])
    moe.fc2.copy_(ref.fc2[2 * ps.ep_rank:2 * ps.ep_rank + 2])
x = torch.randn(4, 2, 8, dtype=torch.float64) + rank  # different tokens on each rank
y, _ = moe(x)
y_ref, _ = ref(x)
y.square().sum().backward()
y_ref.square().sum().backward()
g = ref.fc1.grad.clone()
mine = torch.zeros_like(g)
mine[2 * ps.ep_rank:2 * ps.ep_rank + 2] = moe.fc1.grad
dist.all_reduce(mine)  # experts' grads gather tokens from both ranks
dist.all_reduce(g)
result = dict(y=float((y - y_ref).abs().max()), fc1=float((mine - g).abs().max()),
              router=float((moe.router.grad - ref.router.grad).abs().max()))
"""


def test_expert_parallel_equals_all_experts_on_one_rank(tmp_path):
    """EP 2 over 2 gloo ranks (4 experts, 2 local): each rank's output and router gradient equal
    a one-rank layer holding all experts; expert gradients summed over ranks agree too."""
    from test_models_mappings import run_gloo

    res = run_gloo(EP_BODY, world=2, tmp_path=tmp_path)
    for key, err in res.items():
        assert err < 1e-12, (key, err)


def test_shared_experts_add_a_dense_mlp_on_every_token():
    """--moe-shared-expert-intermediate-size 6: the layer's output is the routed experts' plus a
    SwiGLU MLP of width 6 applied to every token (Megatron-core's SharedExpertMLP)."""
    from types import SimpleNamespace

    from models.config import ModelConfig
    from models.layers.moe import MoELayer

    torch.manual_seed(0)
    solo = SimpleNamespace(ep_size=1, tp_size=1, etp_size=1, ep_domain=0, sequence_parallel=False, ep_group=None,
                           tp_group=None, async_tp_allreduce=True)
    mcfg = ModelConfig(num_layers=1, hidden_size=8, num_attention_heads=2, ffn_hidden_size=12, num_experts=4,
                       moe_router_topk=2, activation="swiglu", moe_shared_expert_intermediate_size=6)
    moe = MoELayer(mcfg, solo, dtype=torch.float64, fp8=False)
    x = torch.randn(4, 2, 8, dtype=torch.float64)
    y, _ = moe(x)
    shared = moe.shared_experts
    moe.shared_experts = None
    routed, _ = moe(x)
    a, g = torch.chunk(x @ shared.linear_fc1.weight.t(), 2, dim=-1)
    assert torch.allclose(y, routed + (torch.nn.functional.silu(a) * g) @ shared.linear_fc2.weight.t(), atol=1e-12)


def test_expert_tensor_parallel_one_keeps_whole_experts_and_no_tp_collectives():
    """--expert-tensor-parallel-size 1 with TP 2, EP 2 on 8 ranks: rank 3's EP group is ranks 2, 3 (consecutive,
    TP peers included), its experts are whole (fc1 [4, 64, 128]), and the dispatch runs no TP collective:
    counts all-gather, a2a of the tokens and of their weights, experts, a2a back; each local expert sees 8 copies
    from each of the 2 EP sources."""
    body = FAKE.replace("ParallelConfig(world_size=8, tp=2, ep=2, sequence_parallel=True)",
                        "ParallelConfig(world_size=8, tp=2, ep=2, etp=1, sequence_parallel=True)")
    body = body.replace("local=moe.fc1.shape[0])", "local=list(moe.fc1.shape))")
    r = run_fake(body, rank=3, world=8)
    assert r["ep"] == [2, 3] and r["local"] == [4, 64, 128]
    copies, weights = 32 * 2 * 64 * 2, 32 * 2 * 2
    fwd = [c[:2] for c in r["comm"] if c[2] == "fwd"]
    assert fwd == [["_allgather_base_", 2 * 8 * 8], ["alltoall_base_", copies], ["alltoall_base_", weights],
                   ["alltoall_base_", copies]]
    assert r["bmm"][:2] == [[[[4, 16, 64], [4, 64, 128]], "fwd", "fp8"], [[[4, 16, 128], [4, 128, 64]], "fwd", "fp8"]]


def test_dispatcher_reads_its_splits_back_once_per_layer_forward(tmp_path):
    """Megatron-core's dropless all-to-all dispatcher waits on the device-to-host copy of its splits
    before the EP all-to-all: captured, the op after that copy (the dispatch all-to-all) is a host
    sync, once per MoE layer and micro-batch forward (tiny: 8 layers, one micro-batch of 2 per DP
    rank -> 8); no backward op is one."""
    from capture import capture
    from heterosim.trace import load_trace
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    argv = ["--preset", "tiny", "--bf16", "--num-experts", "4", "--moe-router-topk", "2",
            "--expert-model-parallel-size", "2", "--global-batch-size", "4"]
    ops = load_trace(capture(str(root / "models" / "pretrain_gpt.py"), argv, tmp_path / "t",
                             world_size=2)).roles[0].ops()
    synced = [i for i, o in enumerate(ops) if o.host_sync and o.phase == "fwd"]
    assert len(synced) == 8 and all(ops[i].name == "c10d.alltoall_base_.default" for i in synced)
    assert all(ops[i - 1].name == "aten._to_copy.default" for i in synced)
    assert not [o for o in ops if o.host_sync and o.phase == "bwd"]


FLEX_BODY = """
from types import SimpleNamespace
from models import parallel_state
from models.config import ModelConfig, ParallelConfig
from models.layers.moe import MoELayer
from models.layers.moe_flex import token_experts
torch.manual_seed(0)
E, k = 8, 3
mcfg = ModelConfig(num_layers=1, hidden_size=8, num_attention_heads=2, ffn_hidden_size=12, num_experts=E,
                   moe_router_topk=k, activation="swiglu")
solo = SimpleNamespace(ep_size=1, tp_size=1, etp_size=1, ep_domain=0, sequence_parallel=False, ep_group=None,
                       tp_group=None)
ref = MoELayer(mcfg, solo, dtype=torch.float64, fp8=False)
ps = parallel_state.initialize(ParallelConfig(world_size=world, ep=4, ep_nvl_domain=2), rank)
moe = MoELayer(mcfg, ps, dtype=torch.float64, fp8=False)
lo = 2 * ps.ep_rank
with torch.no_grad():
    moe.router.copy_(ref.router)
    moe.fc1.copy_(ref.fc1[lo:lo + 2])
    moe.fc2.copy_(ref.fc2[lo:lo + 2])
x = torch.randn(4, 2, 8, dtype=torch.float64) + rank
y, _ = moe(x)
tok = x.reshape(8, 8)
probs = torch.softmax(torch.topk(tok @ ref.router.T, k, dim=-1)[0], dim=-1)
every = ref.experts(tok.repeat(E, 1), torch.ones(E * 8, 1, dtype=torch.float64)).view(E, 8, 8)  # unweighted
y_ref = torch.stack([sum(probs[t, j] * every[e, t] for j, e in enumerate(token_experts(t, k, E)))
                     for t in range(8)]).view(4, 2, 8)
y.square().sum().backward()
y_ref.square().sum().backward()
g = ref.fc1.grad.clone()
mine = torch.zeros_like(g)
mine[lo:lo + 2] = moe.fc1.grad
dist.all_reduce(mine)
dist.all_reduce(g)
result = dict(y=float((y - y_ref).abs().max()), fc1=float((mine - g).abs().max()),
              router=float((moe.router.grad - ref.router.grad).abs().max()))
"""


@pytest.mark.parametrize("fused", [False, True])
def test_flex_dispatcher_equals_all_experts_on_one_rank(tmp_path, fused):
    """EP 4 in two NVLink domains of 2 (4 gloo ranks, 8 experts, top-3): the two-level exchange
    with the weights travelling beside the tokens, applied in the experts' fused weighted SwiGLU,
    gives on every rank the output and router gradient of a one-rank layer with all experts under
    the same routing; expert gradients agree; with the permute inside HybridEP's kernels too."""
    from test_models_mappings import run_gloo

    body = FLEX_BODY.replace('activation="swiglu")', f'activation="swiglu", moe_permute_fusion_into_hybridep={fused})')
    res = run_gloo(body, world=4, tmp_path=tmp_path)
    for key, err in res.items():  # float64; the sums run in another order (per rank, then per domain)
        assert err < 1e-10, (key, err)


def test_flex_plan_sends_a_token_once_per_domain_and_rank():
    """Top-8 of 256 experts over EP 32 in 4 domains of 8, 4,096 tokens: each expert still gets
    T*k/E = 128 copies from each rank; a token crosses to about 2.7 other domains (a uniform draw:
    3 x (1 - C(192, 8) / C(256, 8)) = 2.711) where the all-to-all dispatcher sends 8 x 3/4 = 6
    copies; in its domain it reaches each rank holding one of its experts once."""
    from math import comb

    from models.layers.moe_flex import flex_plan

    p = flex_plan(4096, 8, 256, 32, 8, 5)
    remote = (sum(p.in1) - p.in1[0]) / 4096
    assert abs(remote - 3 * (1 - comb(192, 8) / comb(256, 8))) < 0.05
    assert len(p.expand) == 8 * 32 * 128
    assert set(p.expand) == set(range(sum(p.out2)))  # each row arriving feeds at least one local expert
    assert p.out1 == (p.in1[0],) * 4 and len(p.send2) == sum(p.in2)


@pytest.mark.parametrize("fused", [False, True])
def test_flex_exchange_moves_rows_inside_its_kernels(tmp_path, monkeypatch, fused):
    """HybridEP (2 ranks per NVLink domain, EP 4, tiny: 8 MoE layers, one micro-batch): the rows the
    dispatch gathers and forwards, and the sums the combine makes, are recorded as the communication
    kernels' own work (kernel class comm, no compute time); the sort into expert order and back is
    Megatron-core's permute / unpermute (2 gathers, tokens and weights, and 1 sum per layer forward;
    the reverse in the backward) unless --moe-permute-fusion-into-hybridep puts it in HybridEP too.
    The host reads back the receive sizes before each dispatch and the experts' token counts after it."""
    from collections import Counter
    from pathlib import Path

    from capture import capture
    from heterosim.trace import load_trace

    monkeypatch.setenv("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", "2")
    root = Path(__file__).resolve().parents[1]
    argv = ["--preset", "tiny", "--bf16", "--swiglu", "--num-experts", "8", "--moe-router-topk", "2",
            "--expert-model-parallel-size", "4", "--global-batch-size", "8", "--moe-token-dispatcher-type", "flex",
            "--moe-flex-dispatcher-backend", "hybridep"] + (["--moe-permute-fusion-into-hybridep"] if fused else [])
    ops = load_trace(capture(str(root / "models" / "pretrain_gpt.py"), argv, tmp_path / "t",
                             world_size=4)).roles[0].ops()
    rows = Counter((o.phase, o.name, o.kernel_class) for o in ops
                   if o.name in ("aten.index_select.default", "aten.index_add.default"))
    in_kernel = {k: n for k, n in rows.items() if k[2] == "comm"}
    priced = {k: n for k, n in rows.items() if k[2] != "comm"}
    assert priced == ({} if fused else {("fwd", "aten.index_select.default", "copy"): 16,
                                        ("fwd", "aten.index_add.default", "copy"): 8,
                                        ("bwd", "aten.index_add.default", "copy"): 16,
                                        ("bwd", "aten.index_select.default", "copy"): 8})
    # two gathers (to the other domain, then forwarded in it) and two sums (back) per layer and direction
    assert in_kernel[("fwd", "aten.index_select.default", "comm")] == 16 + (16 if fused else 0)
    assert in_kernel[("fwd", "aten.index_add.default", "comm")] == 16 + (8 if fused else 0)
    # two host reads per layer forward: the receive sizes before the dispatch, and TEGroupedMLP's
    # tokens_per_expert.tolist() once the exchange is done (the first op after it is the unpack)
    synced = [(ops[i - 1].name, o.name) for i, o in enumerate(ops) if o.host_sync]
    assert synced == [("aten._to_copy.default", "aten.cat.default"),
                      ("aten._to_copy.default", "aten.clone.default")] * 8


def test_current_scaling_quantizes_each_expert_apart():
    """Under current scaling (fp8-cs) Transformer Engine's split_quantize runs one amax, scale and cast
    per expert (only delayed scaling has a fused multi-tensor cast-transpose): with 4 local experts,
    each projection's input [4, 32, 64] is 4 casts of [32, 64] forward and its output gradient 4
    backward, each after its amax (2 x 4 + 2 x 4 = 16)."""
    body = FAKE.replace("with log:\n    y, _ = moe(x)",
                        "from models.layers import fp8 as te_fp8\nwith log, te_fp8.recipe('tensorwise'):\n    y, _ = moe(x)")
    body = body.replace("bmm=[", 'per_expert=[o["phase"] for o in log.ops if o["name"] == "aten._to_copy.default" '
                        'and o["shapes"][0] == [32, 64]], amax=sum(o["name"].startswith("aten.linalg_vector_norm") '
                        "for o in log.ops), bmm=[")
    r = run_fake(body, rank=3, world=8)
    assert r["per_expert"] == ["fwd"] * 8 + ["bwd"] * 8 and r["amax"] == 16
