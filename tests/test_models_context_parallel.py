"""Tests of ``models.layers.context_parallel``: exact numerics of the three CP schemes against
full causal attention (gloo, real tensors, 3 ranks) and the traffic each issues in a fake world."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from test_models_mappings import ROOT, comm_ops, run_fake

REAL = """import os, sys, json, torch, torch.distributed as dist
torch.set_num_threads(1)
def main(rank, world, port, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from models import parallel_state
    from models.config import ParallelConfig
    from models.layers.context_parallel import cp_attention
    from models.layers.context_chunks import cp_chunk_select
    torch.manual_seed(0)
    s, b, h, g, d = 12 * world, 2, 6, 3, 8
    Q = torch.randn(s, b, h, d, dtype=torch.float64); K = torch.randn(s, b, g, d, dtype=torch.float64); V = torch.randn(s, b, g, d, dtype=torch.float64)
    W = torch.randn(s, b, h * d, dtype=torch.float64)
    Q, K, V = (t.float().requires_grad_() for t in (Q, K, V))
    ref = torch.nn.functional.scaled_dot_product_attention(Q.permute(1,2,0,3), K.permute(1,2,0,3), V.permute(1,2,0,3), is_causal=True, enable_gqa=True)
    ref = ref.permute(2, 0, 1, 3).reshape(s, b, h * d)
    (ref * W.float()).sum().backward()
    sel = lambda t: cp_chunk_select(t, 0, world, rank)
    res = {}
    for kind in ("p2p", "all_gather", "a2a"):
        ps = parallel_state.initialize(ParallelConfig(world_size=world, cp=world, cp_comm_type=kind), rank)
        q, k, v = (sel(t.detach()).clone().requires_grad_() for t in (Q, K, V))
        if kind == "a2a" and (h % world or g % world): continue
        o = cp_attention(q, k, v, ps)
        (o * sel(W.float())).sum().backward()
        res[kind] = [float((o - sel(ref)).detach().abs().max()), float((q.grad - sel(Q.grad)).abs().max()),
                     float((k.grad - sel(K.grad)).abs().max()), float((v.grad - sel(V.grad)).abs().max())]
    if rank == 0:
        open(out_path, "w").write(json.dumps(res))
if __name__ == "__main__":
    world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch.multiprocessing.start_processes(main, args=(world, port, out), nprocs=world, start_method="fork")
"""


def test_cp_schemes_match_full_attention(tmp_path):
    """p2p ring, all-gather and a2a CP (cp = 3, GQA 6 heads / 3 groups) give the outputs and
    Q/K/V gradients of full causal attention on the whole sequence, chunk for chunk."""
    script = tmp_path / "cp_real.py"
    script.write_text(REAL)
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, str(script), "3", str(29700 + hash(str(tmp_path)) % 200), str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(out.read_text())
    assert sorted(res) == ["a2a", "all_gather", "p2p"]
    for kind, errs in res.items():
        assert max(errs) < 1e-5, (kind, errs)


FAKE = """
from models import parallel_state
from models.config import ModelConfig, ParallelConfig, TrainConfig
from models.transformer import TransformerBlock
ann = PhaseAnnotator(); set_annotator(ann)
out = {}
for kind, groups in (("p2p", 4), ("all_gather", 4), ("a2a", 8)):
    ps = parallel_state.initialize(ParallelConfig(world_size=8, tp=2, cp=4, cp_comm_type=kind), 5)
    mcfg = ModelConfig(num_layers=1, hidden_size=256, num_attention_heads=8, num_query_groups=groups,
                       seq_length=128, position_embedding_type="rope", hidden_dropout=0.0)
    block = TransformerBlock(mcfg, TrainConfig(), ps, layers=range(1), post_process=False)
    x = torch.randn(32, 2, 256, dtype=torch.bfloat16, requires_grad=True)
    log = OpLog(ann)
    with log:
        y = block(x)
        with ann.scope(phase="bwd"):
            y.backward(torch.ones_like(y))
    ops = [o for o in log.ops if not o["name"].startswith("c10d.allreduce_")]  # TP traffic aside
    out[kind] = dict(comm=comm_ops(ops), peers=sorted({tuple(o["ranks"]) for o in ops if "ranks" in o}),
                     flash=[(o["name"].split(".")[1], o["phase"]) for o in ops if "flash" in o["name"]],
                     cp=[ps.cp_rank, list(ps.cp_ranks)])
result = out
"""


@pytest.fixture(scope="module")
def fake():
    return run_fake(FAKE, rank=5, world=8)


def test_ring_p2p_counts_and_bytes(fake):
    """cp = 4: forward issues 2*(cp-1) K/V p2p (send + recv per step, K and V in one buffer);
    backward 2*(cp-1) for K/V plus 2*cp for the travelling K/V gradient; cp flash kernels each way."""
    r = fake["p2p"]
    assert r["cp"] == [2, [1, 3, 5, 7]]
    kv_bytes = 2 * 2 * 2 * 32 * 32 * 2  # (k, v) x b 2 x ng 2 x s/cp 32 x d 32 x bf16
    fwd = [c for c in r["comm"] if c[2] == "fwd"]
    bwd = [c for c in r["comm"] if c[2] == "bwd"]
    # rank 2 is even: send first, then receive
    assert fwd == [["send", kv_bytes, "fwd"], ["recv_", kv_bytes, "fwd"]] * 3
    assert len(bwd) == 2 * 3 + 2 * 4 and {c[1] for c in bwd} == {kv_bytes}
    assert r["flash"] == [["_scaled_dot_product_flash_attention_for_cpu", "fwd"]] * 4 + [
        ["_scaled_dot_product_flash_attention_for_cpu_backward", "bwd"]] * 4


def test_all_gather_and_a2a_traffic(fake):
    """all_gather: K and V all-gathered (s x b x ng x d bf16 each) forward, reduce-scattered
    backward. a2a: Q, K, V to head-split and the output back, mirrored in backward."""
    full = 128 * 2 * 2 * 32 * 2
    ag = fake["all_gather"]
    assert [c for c in ag["comm"] if c[2] == "fwd"] == [["_allgather_base_", full, "fwd"]] * 2
    assert [c for c in ag["comm"] if c[2] == "bwd"] == [["_reduce_scatter_base_", full, "bwd"]] * 2
    # chunks 2 and 5 of 8: each attends a full prefix block and its causal diagonal block
    assert [f[0] for f in ag["flash"]].count("_scaled_dot_product_flash_attention_for_cpu") == 4
    a2a = fake["a2a"]
    local = 32 * 2 * 4 * 32 * 2  # s/cp x b x heads/tp x d x bf16 (MHA: K, V as big as Q)
    assert a2a["comm"] == [["alltoall_base_", local, "fwd"]] * 4 + [["alltoall_base_", local, "bwd"]] * 4
    assert a2a["flash"] == [["_scaled_dot_product_flash_attention_for_cpu", "fwd"],
                            ["_scaled_dot_product_flash_attention_for_cpu_backward", "bwd"]]
