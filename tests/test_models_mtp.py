"""Multi-token prediction (models/layers/mtp.py): the loss it adds, its parameters, and its TP traffic."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from test_models_mappings import ROOT, run_fake

REAL = """
import os, json, torch, torch.distributed as dist
import torch.nn.functional as F
torch.set_num_threads(1)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
dist.init_process_group("gloo", rank=0, world_size=1)
from models import parallel_state
from models.config import ModelConfig, ParallelConfig, TrainConfig
from models.gpt import GPTModel
torch.manual_seed(0)
mcfg = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, vocab_size=64, hidden_dropout=0.0,
                   activation="swiglu", normalization="RMSNorm", position_embedding_type="rope", add_bias_linear=False,
                   untie_embeddings_and_output_weights=True, mtp_num_layers=2, mtp_loss_scaling_factor=0.3)
pcfg = ParallelConfig(world_size=1)
ps = parallel_state.initialize(pcfg, 0)
model = GPTModel(mcfg, pcfg, TrainConfig(params_dtype="fp32"), ps, layers=range(2), pre_process=True, post_process=True)
tokens = torch.randint(0, 64, (2, 17))
ids, labels = tokens[:, :-1], tokens[:, 1:]
total = model(ids, labels)
rot = model.rotary(ids.device)
model.decoder(model._embed(ids), rot)  # again, to read the output before the final norm
h = model.decoder.prenorm_output
layers, model.mtp_layers = model.mtp_layers, None
main = model(ids, labels)
extra, nxt = [], labels
for layer in layers:
    h = layer(h, model.word_embeddings(nxt), rot)
    nxt = torch.roll(nxt, -1, dims=1)
    extra.append(F.cross_entropy(model.output_layer(h).reshape(-1, 64), nxt.transpose(0, 1).reshape(-1)))
model.mtp_layers = layers
total.backward()
print("RESULT" + json.dumps(dict(total=total.item(), main=main.item(), mtp=[e.item() for e in extra],
      eh=list(layers[0].eh_proj.weight.shape), grad=float(layers[1].eh_proj.weight.grad.abs().sum()))))
"""


def test_mtp_adds_its_scaled_losses_to_the_main_one():
    """Two depths, scaling 0.3: loss = main + 0.3 x mean(depth losses), depth k predicting the labels
    rolled by k from [enorm(embed(labels rolled by k - 1)), hnorm(h)] through eh_proj (2h -> h)."""
    proc = subprocess.run([sys.executable, "-c", REAL], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1][6:])
    assert r["total"] == pytest.approx(r["main"] + 0.3 * sum(r["mtp"]) / 2, rel=1e-6)
    assert r["eh"] == [32, 64] and r["grad"] > 0


TP2 = """
from models import parallel_state
from models.config import ModelConfig, ParallelConfig, TrainConfig
from models.layers.mtp import MTPLayer
ann = PhaseAnnotator(); set_annotator(ann)
ps = parallel_state.initialize(ParallelConfig(world_size=2, tp=2, sequence_parallel=True), 1)
mcfg = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, add_bias_linear=False,
                   normalization="RMSNorm")
m = MTPLayer(mcfg, TrainConfig(), ps, dtype=torch.bfloat16)
h = torch.randn(8, 2, 64, dtype=torch.bfloat16)
log = OpLog(ann)
with log:
    m(h, torch.randn(8, 2, 64, dtype=torch.bfloat16), None)
result = [c[:2] for c in comm_ops(log.ops)][:2]
"""


def test_tp2_eh_proj_gathers_its_input_then_its_output_columns():
    """TP 2 with SP, 8 of 16 tokens per rank: eh_proj all-gathers the [16, 2, 128] concatenation, then
    its [16, 2, 32] output columns are all-gathered to [16, 2, 64] (and scattered back to the rank's
    tokens, no communication)."""
    assert run_fake(TP2, rank=1, world=2) == [["_allgather_base_", 16 * 2 * 128 * 2],
                                              ["_allgather_base_", 16 * 2 * 32 * 2 * 2]]
