"""FSDP2 (examples/fsdp_gpt.py) captured unchanged, and side-stream work placed where a GPU starts it
(capture/hoist.py).

Per block 12 h^2 + 13 h parameters, the root module (embeddings, final LayerNorm, head) V h + s h +
2 h + V h; fp32. In one iteration FSDP2 all-gathers the root once (it stays unsharded after
forward) and each block twice (forward, and again in backward), and reduce-scatters every
gradient once: all-gather bytes (gathered size) 4 (root + 2 x blocks), reduce-scatter bytes
(unscattered size) 4 (root + blocks).
"""

import os
import subprocess
import sys
from math import ceil
from pathlib import Path

import pytest

from capture.hoist import hoist
from heterosim.trace.ir import flop_totals
from heterosim.trace.memory import memory_peak
from heterosim.trace.store import load_trace

ROOT = Path(__file__).resolve().parents[1]
L, H, S, V = 2, 64, 64, 4096
BLOCK = 12 * H * H + 13 * H
ROOT_PARAMS = 2 * V * H + S * H + 2 * H
B, WORLD = 2, 8


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp") / "t"
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", str(WORLD), "-o", str(out),
                        str(ROOT / "examples" / "fsdp_gpt.py"), "--layers", str(L), "--hidden", str(H), "--heads", "2",
                        "--seq", str(S), "--vocab", str(V), "--batch", str(B)],
                       capture_output=True, text=True, cwd=ROOT, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    return load_trace(out)


def test_hoist_moves_side_stream_work_up_to_what_it_follows():
    """Rows 0, 1 default; 2 a copy on a side stream that synchronized after row 0; 3 the all-gather
    after it; 4 the default stream's wait. The side rows move before row 1; distances follow."""
    rows = [{"kind": "compute", "deps": []}, {"kind": "compute", "deps": [1]},
            {"kind": "compute", "deps": [], "_after": (10,)}, {"kind": "collective", "deps": [1], "_after": (12,)},
            {"kind": "wait", "deps": [1], "target": 1}]
    events = [[2, 0, 512], [4, 0, -512], [5, 1, 64]]
    out, ev = hoist(rows, events, base=10)
    assert [r["kind"] for r in out] == ["compute", "compute", "collective", "compute", "wait"]
    assert [r["deps"] for r in out] == [[], [], [1], [3], [2]] and out[4]["target"] == 2
    assert ev == [[1, 0, 512], [4, 0, -512], [5, 1, 64]]
    assert "_after" not in out[1] and hoist([{"kind": "compute"}], [], 0) == ([{"kind": "compute"}], [])


def test_fsdp2_volumes_and_prefetch(trace):
    t = trace
    ops = t.roles[0].ops()
    ag = [o for o in ops if o.collective == "all_gather"]
    rs = [o for o in ops if o.collective == "reduce_scatter"]
    assert sum(o.comm_bytes for o in ag) == 4 * (ROOT_PARAMS + 2 * L * BLOCK)
    assert sum(o.comm_bytes for o in rs) == 4 * (ROOT_PARAMS + L * BLOCK)
    assert {t.groups[o.group].dim for o in ag + rs} == {"dp"}  # mesh dim "dp_shard"
    # Forward: every all-gather is issued before the first GEMM of block 0 (each waits only for its
    # copy-in and the copy-out two layers back), and each is waited for before its block runs.
    fwd_ag = [o for o in ag if o.phase == "fwd"]
    first_gemm = min(o.id for o in ops if o.kernel_class == "gemm" and o.module.startswith("blocks.0"))
    assert len(fwd_ag) == 1 + L and all(o.id < first_gemm for o in fwd_ag)
    waits = {o.target: o.id for o in ops if o.kind == "wait"}
    assert all(o.id in waits for o in ag + rs)
    for i in range(L):
        gemm = min(o.id for o in ops if o.kernel_class == "gemm" and o.module.startswith(f"blocks.{i}"))
        assert waits[fwd_ag[1 + i].id] < gemm


def test_model_flops_match_megatrons_formula(trace):
    """FSDP2 moves parameters, not FLOPs: the model FLOPs are the DDP example's, Megatron's
    72 B s l h^2 (1 + s/6h + V/12lh) over all ranks within 2% (derived in
    tests/test_capture_ddp.py: causal attention counted full as the formula does, no recompute,
    untied head; here in fp32, no autocast). The all-gathered weights feed the same GEMMs."""
    formula = 72 * B * S * L * H**2 * (1 + S / (6 * H) + V / (12 * L * H)) * WORLD
    assert flop_totals(trace)["model"] == pytest.approx(formula, rel=0.02)


def test_sharded_parameters_and_adamw_state_are_counted_as_such(trace):
    """FSDP2's parameters are DTensors: their shards' storages count as parameters and AdamW's
    states as optimizer memory. Rank 0 holds the first ceil(d0 / 8) rows of each fp32 parameter
    (d0 its dim 0, the rest of its shape k), each in its own storage, which the caching allocator
    rounds up to 512 bytes; AdamW keeps two moments of that shape on the device, and its scalar
    step per parameter on the host (torch.optim's default, neither fused nor capturable: no device
    memory). Per block the 12 parameters (LayerNorms, qkv, proj, MLP weights and biases), the
    root's 5 (embeddings, final LayerNorm, head): 322,560 bytes of parameters here."""
    block = [(H, 1), (H, 1), (3 * H, H), (3 * H, 1), (H, H), (H, 1), (H, 1), (H, 1), (4 * H, H), (4 * H, 1),
             (H, 4 * H), (H, 1)]
    params = L * block + [(V, H), (S, H), (H, 1), (H, 1), (V, H)]
    shards = sum(-(-4 * ceil(d0 / WORLD) * k // 512) * 512 for d0, k in params)
    role = trace.roles[0]
    m = memory_peak(role.memory, role.program).at_peak
    assert (m["parameters"], m["optimizer"]) == (shards, 2 * shards) == (322_560, 645_120)
