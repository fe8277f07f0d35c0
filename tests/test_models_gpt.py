"""Tests of ``models.gpt.GPTModel``: real training at world size 1 and pipeline stages in a
fake 16-rank world (tp 2, pp 2, cp 2, dp 2)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from test_models_mappings import ROOT, run_fake

TRAIN = """
import os, json, torch, torch.distributed as dist
torch.set_num_threads(1)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
dist.init_process_group("gloo", rank=0, world_size=1)
from models import parallel_state
from models.config import ModelConfig, ParallelConfig, TrainConfig
from models.gpt import GPTModel
torch.manual_seed(0)
out = {}
for name, kw, tkw in (
        ("llama", dict(activation="swiglu", normalization="RMSNorm", position_embedding_type="rope",
                       num_query_groups=2, add_bias_linear=False), dict(recompute_granularity="selective")),
        ("gpt", dict(untie_embeddings_and_output_weights=True),
         dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=1)),
        ("moe", dict(num_experts=4, moe_router_topk=2, activation="squared_relu"), {})):
    mcfg = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=128,
                       hidden_dropout=0.0, **kw)
    pcfg = ParallelConfig(world_size=1)
    ps = parallel_state.initialize(pcfg, 0)
    model = GPTModel(mcfg, pcfg, TrainConfig(params_dtype="fp32", **tkw), ps, layers=range(2),
                     pre_process=True, post_process=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 128, (4, 33))
    losses = []
    for it in range(8):
        loss = model(tokens[:, :-1], tokens[:, 1:])
        opt.zero_grad(); loss.backward(); opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        logits = model(tokens[:, :-1])
        ref = torch.nn.functional.cross_entropy(logits.reshape(-1, 128), tokens[:, 1:].reshape(-1))
        ours = model(tokens[:, :-1], tokens[:, 1:])
    out[name] = dict(losses=losses, ref=ref.item(), ours=ours.item(),
                     shared=len(model.shared_embedding_params()),
                     tied=model.output_layer.weight is getattr(model.word_embeddings, "weight"))
print("RESULT" + json.dumps(out))
"""


def test_loss_decreases_with_real_tensors():
    """World size 1 (gloo, fp32), LLaMA-, GPT- and MoE-style: the loss starts near ln(V), falls
    over 8 AdamW steps, and the vocab-parallel cross-entropy equals F.cross_entropy."""
    import json
    import math

    proc = subprocess.run([sys.executable, "-c", TRAIN], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1][6:])
    for name, r in res.items():
        losses = r["losses"]
        assert abs(losses[0] - math.log(128)) < 0.3, (name, losses[0])
        assert losses[-1] < 0.7 * losses[0], (name, losses)
        assert all(b < a for a, b in zip(losses[2:], losses[3:])), (name, losses)
        assert r["ours"] == pytest.approx(r["ref"], rel=1e-5)
        assert r["shared"] == 0  # pp == 1: nothing for the embedding group
    assert res["llama"]["tied"] and not res["gpt"]["tied"] and sorted(res) == ["gpt", "llama", "moe"]


STAGES = """
from models import parallel_state
from models.config import ModelConfig, ParallelConfig, TrainConfig
from models.gpt import GPTModel
ann = PhaseAnnotator(); set_annotator(ann)
pcfg = ParallelConfig(world_size=16, tp=2, pp=2, cp=2, sequence_parallel=True)
mcfg = ModelConfig(num_layers=4, hidden_size=128, num_attention_heads=4, seq_length=64, vocab_size=512,
                   activation="swiglu", normalization="RMSNorm", position_embedding_type="rope")
ps = parallel_state.initialize(pcfg, 5)
chunks = ps.stage_layers(mcfg.num_layers)
tcfg = TrainConfig(micro_batch_size=2, global_batch_size=16)
first = GPTModel(mcfg, pcfg, tcfg, ps, layers=chunks[0][0], pre_process=True, post_process=False)
last = GPTModel(mcfg, pcfg, tcfg, ps, layers=chunks[1][0], pre_process=False, post_process=True)
log = OpLog(ann)
with log:
    ids = torch.randint(0, 512, (2, 64))
    h = first(ids)
    y = torch.randn(last.hidden_shape(2), dtype=torch.bfloat16, requires_grad=True)
    loss = last(y, torch.randint(0, 512, (2, 64)))
    loss.backward()
    h.backward(torch.ones_like(h))
out = dict(h=list(h.shape), h_dtype=str(h.dtype), shape=list(first.hidden_shape(2)), loss=list(loss.shape),
           loss_dtype=str(loss.dtype), grad=list(y.grad.shape),
           layers=[[int(l.layer_number) for l in m.decoder.layers] for m in (first, last)],
           shared=[[list(p.shape) for p in m.shared_embedding_params()] for m in (first, last)],
           comm=comm_ops(log.ops),
           sp_params=sorted(n for n, p in first.named_parameters() if getattr(p, "sequence_parallel", False)))
result = out
"""


def test_pipeline_stages_in_fake_world():
    """Stage 0 maps ids [b, s] to [s/cp/tp, b, h] (CP + SP); the last stage returns a scalar fp32 loss; the
    tied embedding copies are the embedding group's shared params; the loss all-reduces max,
    target logit and sum-exp ([s, b] fp32) over TP."""
    res = run_fake(STAGES, rank=5, world=16)
    assert res["h"] == res["shape"] == [16, 2, 128] and res["h_dtype"] == "torch.bfloat16"
    assert res["loss"] == [] and res["loss_dtype"] == "torch.float32"
    assert res["grad"] == [16, 2, 128]
    assert res["layers"] == [[0, 1], [2, 3]]
    assert res["shared"] == [[[256, 128]], [[256, 128]]]
    ce = [c for c in res["comm"] if c[0] == "allreduce_"]
    assert [c[1] for c in ce] == [32 * 2 * 4] * 3  # [s/cp, b] fp32
    assert res["sp_params"] == sorted(
        [f"decoder.layers.{i}.{n}" for i in (0, 1) for n in (
            "input_layernorm.weight", "pre_mlp_layernorm.weight",  # norms see sequence-split input
            "self_attention.linear_proj.bias", "mlp.linear_fc2.bias")])  # row-parallel biases too


def test_sequence_must_split_over_cp_and_tp():
    """s must divide by 2*cp, and s/cp by tp under sequence parallelism; the message names them."""
    from types import SimpleNamespace

    from heterosim.errors import ConfigError
    from models.config import ModelConfig, ParallelConfig, TrainConfig
    from models.gpt import GPTModel

    mcfg = ModelConfig(num_layers=1, hidden_size=16, num_attention_heads=2, seq_length=12)
    ps = SimpleNamespace(cp_size=4, tp_size=1, sequence_parallel=False)
    with pytest.raises(ConfigError, match="seq length 12 must be divisible by 2\\*context-parallel size 8"):
        GPTModel(mcfg, ParallelConfig(world_size=4, cp=4), TrainConfig(), ps, layers=range(1),
                 pre_process=True, post_process=True)
    ps = SimpleNamespace(cp_size=2, tp_size=4, sequence_parallel=True)
    with pytest.raises(ConfigError, match="with sequence parallelism seq length / cp = 6 must be divisible "
                                          "by tensor-parallel size 4"):
        GPTModel(mcfg, ParallelConfig(world_size=8, cp=2, tp=4), TrainConfig(), ps, layers=range(1),
                 pre_process=True, post_process=True)


EQUIV = """
from models import parallel_state
from models.config import ModelConfig, ParallelConfig, TrainConfig
from models.gpt import GPTModel
mcfg = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, seq_length=16,
                   vocab_size=64, activation="swiglu", normalization="RMSNorm", position_embedding_type="rope",
                   add_bias_linear=False, hidden_dropout=0.0)
tc = TrainConfig(params_dtype="fp32")
torch.manual_seed(0)
ref_pcfg = ParallelConfig(world_size=world)
ref = GPTModel(mcfg, ref_pcfg, tc, parallel_state.initialize(ref_pcfg, rank), layers=range(2),
               pre_process=True, post_process=True)
tokens = torch.randint(0, 64, (2, 17))
loss_ref = ref(tokens[:, :-1], tokens[:, 1:])
loss_ref.backward()
full = dict(ref.named_parameters())

def shard(name, p, t, r):
    dim = getattr(p, "partition_dim", None) if getattr(p, "tensor_model_parallel", False) else None
    if dim is None:
        return lambda x: x
    if name.endswith("linear_fc1.weight"):  # SwiGLU: each rank holds its slice of gate and of up
        return lambda x: x.view(2, x.shape[0] // 2, -1).chunk(t, dim=1)[r].reshape(-1, x.shape[-1])
    return lambda x: x.chunk(t, dim=dim)[r]

result = {}
for case, pkw in (("tp", dict(tp=2)), ("tp_sp", dict(tp=2, sequence_parallel=True)),
                  ("cp_p2p", dict(cp=2)), ("cp_ag", dict(cp=2, cp_comm_type="all_gather"))):
    pcfg = ParallelConfig(world_size=world, **pkw)
    ps = parallel_state.initialize(pcfg, rank)
    m = GPTModel(mcfg, pcfg, tc, ps, layers=range(2), pre_process=True, post_process=True)
    cuts = {n: shard(n, p, ps.tp_size, ps.tp_rank) for n, p in m.named_parameters()}
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(cuts[n](full[n]))
    loss = m(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    loss = loss.detach().clone()
    if ps.cp_size > 1:  # each CP rank averages its own half of the tokens
        dist.all_reduce(loss, group=ps.cp_group)
        loss /= ps.cp_size
    err = 0.0
    for n, p in m.named_parameters():
        g = p.grad.clone()
        if ps.cp_size > 1:
            dist.all_reduce(g, group=ps.cp_group)
            g /= ps.cp_size
        if getattr(p, "sequence_parallel", False):
            dist.all_reduce(g, group=ps.tp_group)
        err = max(err, float((g - cuts[n](full[n].grad)).abs().max()))
    result[case] = dict(loss=abs(float(loss) - float(loss_ref)), grad=err, n=len(cuts))
"""


def test_tp_and_cp_models_equal_the_single_rank_model(tmp_path):
    """2 gloo ranks, LLaMA-style (GQA, SwiGLU, RoPE, RMSNorm, tied embeddings): sharding a
    single-rank model's weights into TP 2 (with and without SP) or running it under CP 2 (ring and
    all-gather) gives the same loss and, after Megatron's gradient sums (CP average, TP sum of
    sequence-parallel params), the same gradients for all 14 parameters."""
    from test_models_mappings import run_gloo

    res = run_gloo(EQUIV, world=2, tmp_path=tmp_path)
    assert sorted(res) == ["cp_ag", "cp_p2p", "tp", "tp_sp"]
    for case, r in res.items():
        assert r["n"] == 14, case
        assert r["loss"] < 2e-6 and r["grad"] < 1e-6, (case, r)


TIED = """
from models import parallel_state
from models.config import ModelConfig, ParallelConfig, TrainConfig
from models.gpt import GPTModel
torch.manual_seed(rank)  # different init on each stage
mcfg = ModelConfig(num_layers=2, hidden_size=16, num_attention_heads=2, seq_length=8, vocab_size=32)
pcfg = ParallelConfig(world_size=world, pp=2)
ps = parallel_state.initialize(pcfg, rank)
m = GPTModel(mcfg, pcfg, TrainConfig(params_dtype="fp32"), ps, layers=range(rank, rank + 1),
             pre_process=ps.is_first_stage, post_process=ps.is_last_stage)
(w,) = m.shared_embedding_params()
other = torch.empty_like(w)
dist.broadcast(other.copy_(w), src=0)  # the first stage's embedding table
flag = torch.tensor([int(torch.equal(w, other))])
dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # rank 0 reports whether the last stage matched
result = dict(equal=bool(flag.item()), shared=bool(w.shared_embedding), shape=list(w.shape))
"""


def test_tied_embedding_copy_synced_between_first_and_last_stage(tmp_path):
    """pp 2 over 2 gloo ranks: both stages join the embedding-group all-reduce at construction,
    after which the last stage's output weight equals the first stage's word embeddings."""
    from test_models_mappings import run_gloo

    res = run_gloo(TIED, world=2, tmp_path=tmp_path)
    assert res == {"equal": True, "shared": True, "shape": [32, 16]}
