"""megatron-core's GPTModel (examples/mcore_gpt.py) captured unmodified: roles, FLOPs, gradient bytes.

Needs the ``mcore`` extra (megatron-core); skipped without it. A small GPT (h 128, 4 heads, s 128,
V 1024, 2 layers, ffn 4h, learned positions, tied embeddings, biases) in bf16 with fp32 gradient
reduction (Megatron's default with --bf16), so every gradient byte count is 4 x parameters.

Parameters one TP rank holds: per layer 2h + (3h^2 + 3h)/tp + (h^2/tp + h) + 2h + (4h^2 + 4h)/tp +
(4h^2/tp + h) (two LayerNorms, QKV and FC1 column-parallel with split biases, projection and FC2
row-parallel with whole biases); the first stage adds V/tp h + s h (word and position
embeddings), the last the final LayerNorm 2h and its copy of the tied output weight V/tp h.
"""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from heterosim.trace.store import load_trace

pytest.importorskip("megatron.core")
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "examples" / "mcore_gpt.py")
H, HEADS, S, V, L = 128, 4, 128, 1024, 2
MODEL = ["--num-layers", str(L), "--hidden-size", str(H), "--num-attention-heads", str(HEADS),
         "--seq-length", str(S), "--vocab-size", str(V), "--bf16", "--train-iters", "2"]


def capture(out, world, *args):
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", str(world), "-o", str(out), SCRIPT,
                        *MODEL, *args], capture_output=True, text=True, cwd=ROOT, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    s = subprocess.run([sys.executable, "-m", "capture", "--inspect", str(out), "--json"], capture_output=True,
                       text=True, cwd=ROOT)
    return load_trace(out), json.loads(s.stdout)


def layer_params(tp):
    h, f = H, 4 * H
    return 2 * h + (3 * h * h + 3 * h) // tp + (h * h // tp + h) + 2 * h + (h * f + f) // tp + (f * h // tp + h)


def megatron_flops(B):
    """Narayanan et al., SC'21, eq. 3: 72 B s l h^2 (1 + s/6h + V/12lh)."""
    return 72 * B * S * L * H * H * (1 + S / (6 * H) + V / (12 * L * H))


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """TP 2 x PP 2 x DP 2 with sequence parallelism, 4 micro-batches of 1 per replica."""
    return capture(tmp_path_factory.mktemp("mcore") / "t", 8, "--tensor-model-parallel-size", "2",
                   "--pipeline-model-parallel-size", "2", "--sequence-parallel", "--global-batch-size", "8")


def test_roles_are_the_pipeline_stages(pipeline):
    """megatron-core's groups are labelled from their descriptions, so the two stages are the roles."""
    t, _ = pipeline
    assert [r.ranks for r in t.roles] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    dims = Counter(g.dim for g in t.groups.values())
    assert {"tp", "pp", "dp"} <= set(dims)


def test_model_flops_match_megatron(pipeline):
    """The trace's model FLOPs are 72 B s l h^2 (1 + s/6h + V/12lh) for the global batch of 8."""
    _, s = pipeline
    assert s["model_flops"] == pytest.approx(megatron_flops(8), rel=0.02)


def test_gradient_bytes_are_hand_counted(pipeline):
    """DP all-reduce: 4 bytes per parameter of the stage; the tied embedding's gradient between the
    first and last stage (pp); LayerNorm and row-parallel bias gradients over TP (sequence parallel)."""
    t, _ = pipeline
    tp = 2
    expect_dp = [4 * (V // tp * H + S * H + layer_params(tp)),
                 4 * (layer_params(tp) + 2 * H + V // tp * H)]
    expect_sp = [4 * (4 * H + 2 * H), 4 * (4 * H + 2 * H + 2 * H)]  # 2 norms + 2 biases per layer, final norm
    for role, dp_bytes, sp_bytes in zip(t.roles, expect_dp, expect_sp):
        ops = [o for o in role.ops() if o.kind == "collective"]
        dim = {o.id: t.groups[o.group].dim for o in ops}
        assert [o.comm_bytes for o in ops if dim[o.id] == "dp"] == [dp_bytes]
        assert [o.comm_bytes for o in ops if dim[o.id] == "pp"] == [4 * V // tp * H]
        assert [o.comm_bytes for o in ops if dim[o.id] == "tp" and o.collective == "all_reduce"
                and o.module == ""] == [sp_bytes]


def test_sequence_parallel_layers(pipeline):
    """Per layer and micro-batch: all-gathers before QKV and FC1, reduce-scatters after the projection
    and FC2, each of the whole [s, b, h] bf16 activation."""
    t, _ = pipeline
    for role in t.roles:
        fwd = Counter((o.collective, o.module.rsplit(".", 1)[-1], o.comm_bytes) for o in role.ops()
                      if o.kind == "collective" and ".layers." in o.module and o.phase == "fwd")
        act = S * 1 * H * 2
        assert fwd == {("all_gather", "linear_qkv", act): 4, ("all_gather", "linear_fc1", act): 4,
                       ("reduce_scatter", "linear_proj", act): 4, ("reduce_scatter", "linear_fc2", act): 4}


def test_distributed_optimizer_bytes(tmp_path):
    """--use-distributed-optimizer: gradients reduce-scattered in fp32 (4 bytes per parameter) and
    bf16 parameters all-gathered (2 bytes), over the DP group of 4."""
    t, _ = capture(tmp_path / "t", 8, "--tensor-model-parallel-size", "2", "--use-distributed-optimizer")
    ops = [o for o in t.roles[0].ops() if o.kind == "collective" and t.groups[o.group].dim == "dp"]
    params = V // 2 * H + S * H + L * layer_params(2) + 2 * H
    assert sum(o.comm_bytes for o in ops if o.collective == "reduce_scatter") == 4 * params
    assert sum(o.comm_bytes for o in ops if o.collective == "all_gather") == 2 * params
