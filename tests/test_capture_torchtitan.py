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


def _capture(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    subprocess.run([sys.executable, str(ROOT / "examples" / "torchtitan_assets.py"), str(tmp_path / "assets")],
                   check=True, cwd=ROOT)
    return subprocess.run(
        [sys.executable, "-m", "capture", "--world-size", str(DP * TP),
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
