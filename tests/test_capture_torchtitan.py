"""torchtitan's own Llama 3 trainer (``python -m torchtitan.train``, torchtitan 0.2.2) captured
unmodified from its TOML config (examples/torchtitan_llama3_debug.toml): FSDP x TP on a DeviceMesh.

The debug model: dim h = 256, l = 6 layers, 16 heads, SwiGLU FFN of f = 768 (torchtitan's
``multiple_of`` 256 rounding of 2/3 x 4h), vocabulary V = 2048, untied embedding and output. Per
layer 4 h^2 attention weights (n_kv_heads = n_heads) + 3 h f FFN weights + 2 h RMSNorm weights;
plus V h embedding, V h output and h final norm.

FLOPs (Megatron's convention, what ``model_flops`` counts: GEMM + attention, attention full, no
recompute), per token: 6 x (l (4 h^2 + 3 h f) + V h) for the linear layers (2 per multiply-add,
x3 for forward + backward) and 12 l s h for attention (QK^T and PV, 4 s h per token per layer
forward, x3). Tokens per iteration: dp x local batch x s.

Pipeline parallelism (torchtitan's split of the 6 layers over 2 stages, 1F1B): stage 0 holds the
embedding and layers 0-2, stage 1 layers 3-5, the final norm and the output. Each micro-batch's
activation (and its gradient) crosses stages as the sequence-parallel shard, s / tp x h bf16.
Selective activation checkpointing re-runs some GEMMs in backward: phase ``recompute``, outside
``model_flops`` (still in ``hardware``).

FSDP bytes: TP shards every attention / FFN weight, the embedding and the output by tp; the norms
stay whole. FSDP all-gathers each rank's TP shard in bf16 (2 bytes a parameter, forward) and
reduce-scatters its gradient in fp32 (4 bytes, ``mixed_precision_reduce``).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

from heterosim.trace.ir import flop_totals  # noqa: E402
from heterosim.trace.store import load_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
H, L, F, V, S, BATCH = 256, 6, 768, 2048, 2048, 8
DP, TP = 16, 4
LINEAR = L * (4 * H * H + 3 * H * F) + V * H  # GEMM weights a token meets (embedding is a lookup)
NORMS = L * 2 * H + H
PARAMS_PER_TP_RANK = (L * (4 * H * H + 3 * H * F) + 2 * V * H) // TP + NORMS


def _capture(tmp_path: Path, *args: str, world: int = DP * TP) -> subprocess.CompletedProcess:
    subprocess.run([sys.executable, str(ROOT / "examples" / "torchtitan_assets.py"), str(tmp_path / "assets")],
                   check=True, cwd=ROOT)
    return subprocess.run(
        [sys.executable, "-m", "capture", "--world-size", str(world),
         "-o", str(tmp_path / "trace"), "-m", "torchtitan.train",
         "--job.config_file", str(ROOT / "examples" / "torchtitan_llama3_debug.toml"),
         "--model.hf_assets_path", str(tmp_path / "assets" / "tokenizer"),
         "--training.dataset_path", str(tmp_path / "assets" / "c4_test"),
         "--job.dump_folder", str(tmp_path / "out"), *args],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_torchtitan_fsdp_tp_bytes_flops_groups(tmp_path):
    """64 ranks, dp_shard 16 x tp 4: one role; mesh groups labelled; FSDP bytes and model FLOPs
    equal the hand counts above."""
    p = _capture(tmp_path, "--parallelism.data_parallel_shard_degree", str(DP),
                 "--parallelism.tensor_parallel_degree", str(TP), "--parallelism.disable_loss_parallel",
                 "--activation_checkpoint.mode", "none")
    assert p.returncode == 0, p.stderr[-3000:]
    t = load_trace(tmp_path / "trace")
    assert [r.ranks for r in t.roles] == [tuple(range(DP * TP))]
    assert t.meta["roles_check"]["result"] == "communication matches"
    sizes = {(g.dim, len(g.ranks)) for g in t.groups.values()}
    assert {("dp", DP), ("tp", TP)} <= sizes  # the mesh's dp_shard and tp axes found and labelled
    ops = t.roles[0].ops()
    fsdp = [o for o in ops if o.collective in ("all_gather", "reduce_scatter") and t.groups[o.group].dim == "dp"]
    fwd_ag = sum(o.comm_bytes for o in fsdp if o.collective == "all_gather" and o.phase == "fwd")
    rs = sum(o.comm_bytes for o in fsdp if o.collective == "reduce_scatter")
    assert fwd_ag == 2 * PARAMS_PER_TP_RANK == 3_086_848
    assert rs == 4 * PARAMS_PER_TP_RANK
    tokens = DP * BATCH * S
    formula = tokens * (6 * LINEAR + 12 * L * S * H)
    assert flop_totals(t)["model"] == pytest.approx(formula, rel=0.02)
    assert flop_totals(t)["model"] == pytest.approx(formula, rel=1e-6)  # in fact exact


def test_torchtitan_reads_a_module(tmp_path):
    """``-m`` names a module; one whose package is missing is refused before any rank runs."""
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", "8", "-o", str(tmp_path / "t"),
                        "-m", "no_such_package_xyz.train"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "no package 'no_such_package_xyz'" in p.stderr


def test_torchtitan_pp_tp_fsdp_loss_parallel_selective_ac(tmp_path):
    """8 ranks, dp_shard 2 x tp 2 x pp 2, torchtitan's defaults otherwise (loss parallel, selective
    AC, 1F1B): one role per stage; stage p2p matched in count and bytes; FSDP bytes per stage and
    model FLOPs equal the hand counts; the recomputed GEMMs are labelled recompute."""
    dp, tp, pp, batch = 2, 2, 2, 2
    p = _capture(tmp_path, "--parallelism.data_parallel_shard_degree", str(dp),
                 "--parallelism.tensor_parallel_degree", str(tp), "--parallelism.pipeline_parallel_degree", str(pp),
                 "--training.local_batch_size", str(batch), "--training.steps", "2", world=dp * tp * pp)
    assert p.returncode == 0, p.stderr[-3000:]
    t = load_trace(tmp_path / "trace")
    assert [r.ranks for r in t.roles] == [(0, 1, 2, 3), (4, 5, 6, 7)]  # pp is the mesh's outer axis
    assert t.meta["roles_check"]["result"] == "communication matches"
    layer = (4 * H * H + 3 * H * F) // tp + 2 * H
    emb = V * H // tp
    per_stage = [emb + 3 * layer, 3 * layer + H + emb]
    act = S // tp * H * 2  # one micro-batch (1 sequence), sequence-parallel shard, bf16
    for role, params in zip(t.roles, per_stage):
        ops = role.ops()
        fsdp = [o for o in ops if o.collective in ("all_gather", "reduce_scatter") and t.groups[o.group].dim == "dp"]
        assert sum(o.comm_bytes for o in fsdp if o.collective == "all_gather" and o.phase == "fwd") == 2 * params
        assert sum(o.comm_bytes for o in fsdp if o.collective == "reduce_scatter") == 4 * params
        p2p = [o for o in ops if o.collective in ("send", "recv")]
        assert all(t.groups[o.group].dim == "pp" and o.comm_bytes == act for o in p2p)
        # stage 0 sends activations, receives their gradients; stage 1 the other way round
        assert sum(o.collective == "send" for o in p2p) == sum(o.collective == "recv" for o in p2p) == batch
    assert per_stage == [1_541_632, 1_541_888]
    tokens = dp * batch * S
    formula = tokens * (6 * LINEAR + 12 * L * S * H)
    totals = flop_totals(t)
    assert totals["model"] == pytest.approx(formula, rel=1e-6)
    assert totals["hardware"] > 1.1 * totals["model"]  # selective AC's recompute, counted only here
