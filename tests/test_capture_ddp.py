"""A plain DDP script (examples/ddp_gpt.py) captured unchanged: volumes, buckets, one steady iteration, replay.

Parameters of the example (see its docstring): 12 h^2 + 13 h per layer, V h + s h embeddings,
2 h final LayerNorm, V h untied head. DDP all-reduces every gradient once per iteration in fp32,
so the all-reduce bytes of one iteration are 4 x parameters.
"""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from heterosim.trace.ir import flop_totals
from heterosim.trace.store import load_trace

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "examples" / "ddp_gpt.py")
L, H, S, V = 2, 64, 64, 4096
ARGS = ["--layers", str(L), "--hidden", str(H), "--heads", "2", "--seq", str(S), "--vocab", str(V), "--batch", "2"]
PARAMS = L * (12 * H * H + 13 * H) + V * H + S * H + 2 * H + V * H
B, WORLD = 2, 8


def capture(out, *extra, world=8):
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", str(world), *extra, "-o", str(out),
                        SCRIPT, *ARGS], capture_output=True, text=True, cwd=ROOT, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    return p.stderr


@pytest.fixture(scope="module")
def trace3(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp") / "t"
    said = capture(out)
    assert "ran 3 iterations (optimizer.step boundaries); the trace holds iteration 3" in said
    return out


def test_allreduce_bytes_equal_parameter_bytes(trace3):
    t = load_trace(trace3)
    ops = t.roles[0].ops()
    ar = [o for o in ops if o.collective == "all_reduce"]
    assert sum(o.comm_bytes for o in ar) == 4 * PARAMS
    assert {t.groups[o.group].dim for o in ar} == {"dp"}
    # Buckets filled from the last parameter, first one 1 MiB: the head's gradient (V h fp32 = 1 MiB)
    # goes first, early in backward; the rest together (under 25 MiB).
    assert [o.comm_bytes for o in ar] == [4 * V * H, 4 * (PARAMS - V * H)]
    first_bwd = min(o.id for o in ops if o.phase == "bwd")
    last_bwd = max(o.id for o in ops if o.phase == "bwd")
    assert first_bwd < ar[0].id < ar[1].id < last_bwd
    waits = [o for o in ops if o.kind == "wait"]
    assert sorted(w.target for w in waits) == [o.id for o in ar] and all(w.id > ar[1].id for w in waits)


def test_one_steady_iteration_is_kept(trace3):
    """A loop of 3 iterations: the trace holds one forward, one backward, one AdamW step."""
    t = load_trace(trace3)
    ops = t.roles[0].ops()
    assert t.meta["iterations"] == {"source": "optimizer.step", "seen": 3, "kept": 3, "stopped_early": False}
    assert Counter(o.name for o in ops)["aten.embedding.default"] == 2  # token + position, once
    phases = [o.phase for o in ops]
    assert phases == sorted(phases, key=["fwd", "bwd", "optimizer"].index)
    assert "optimizer" in phases


def test_iterations_option_stops_the_script_with_the_same_steady_iteration(trace3, tmp_path):
    said = capture(tmp_path / "t2", "--iterations", "2")
    assert "ran 2 iterations (optimizer.step boundaries, then stopped (--iterations)); the trace holds iteration 2" in said
    two, three = load_trace(tmp_path / "t2").roles[0].ops(), load_trace(trace3).roles[0].ops()
    assert [(o.name, o.deps, o.comm_bytes) for o in two] == [(o.name, o.deps, o.comm_bytes) for o in three]


def test_replays_on_a_dgx_h100_node(trace3):
    p = subprocess.run([sys.executable, "-m", "replay", "simulate", str(trace3), "--cluster", "dgx-h100", "--json"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["iteration_time_s"] > 0 and "dp" in json.dumps(r["breakdown"])


def test_default_adamw_is_captured_as_multi_tensor_kernels(trace3):
    """torch.optim.AdamW with its defaults takes the foreach path on a GPU: a handful of
    multi-tensor kernels over all parameters, not a loop of per-parameter ops; every optimizer
    op of the kept iteration is a _foreach_ kernel reading all the parameters it updates."""
    role = load_trace(trace3).roles[0]
    names = [n for b in role.blocks.values() for n, ph in zip(b.columns["name"], b.columns["phase"])
             if ph == "optimizer"]
    assert names and all(n.startswith("aten._foreach_") for n in names) and len(names) <= 12


def test_model_flops_match_megatrons_formula(trace3):
    """Model FLOPs of one iteration, all ranks, are Megatron's 72 B s l h^2 (1 + s/6h + V/12lh)
    (Narayanan et al., SC'21, eq. 3) within 2%.

    Derivation, per rank, forward (a GEMM of m x k by k x n is 2 m k n FLOPs): per layer QKV
    2 B s h 3h = 6 B s h^2, output projection 2 B s h^2, MLP 2 (2 B s h 4h) = 16 B s h^2, so GEMMs
    24 B s h^2; attention QK^T and PV 2 B s^2 h each, 4 B s^2 h; the head 2 B s h V. Backward is
    twice forward (input and weight gradients): 3 l (24 B s h^2 + 4 B s^2 h) + 3 (2 B s h V)
    = 72 B s l h^2 (1 + s/6h + V/12lh). The example matches what the formula assumes: the
    attention is causal (SDPA is_causal=True), and the formula counts it full, as the trace's model
    FLOPs do (flops_full); nothing is recomputed; the head is untied (its GEMM is the V term; the
    embeddings are lookups, 0 FLOPs); biases and LayerNorms are elementwise, in neither. So no
    adjustment term. At these sizes: 72 * 2 * 64 * 2 * 64^2 * (1 + 1/6 + 8/3) = 2.894e8 per rank,
    2.315e9 over 8 ranks.

    The attention ops alone hold 3 l (4 B s^2 h) of it; executed they are 1 + 2.5 times the forward
    (a flash backward recomputes QK^T: 5 GEMMs), and with s = 64 under one 128 x 128 tile the
    causal kernel computes the whole tile: 14 l B s^2 h per rank.
    """
    t = load_trace(trace3)
    formula = 72 * B * S * L * H**2 * (1 + S / (6 * H) + V / (12 * L * H)) * WORLD
    assert flop_totals(t)["model"] == pytest.approx(formula, rel=0.02)
    attn = [o for o in t.roles[0].ops() if o.kernel_class == "attention"]
    assert sum(o.flops_full for o in attn) == 12 * L * B * S**2 * H
    assert sum(o.flops for o in attn) == 14 * L * B * S**2 * H
