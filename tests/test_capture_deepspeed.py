"""DeepSpeed ZeRO stages 1, 2 and 3 (examples/deepspeed_gpt.py) captured unchanged, 8 ranks.

Hand counts, from DeepSpeed 0.19's sources (``deepspeed/runtime/zero/stage_1_and_2.py``,
``stage3.py``, ``partition_parameters.py``). The GPT has P = 2 V h + s h + 2 h + L (12 h^2 + 13 h)
parameters, bf16; every parameter's numel here divides by 8, so no partition is padded.

- ZeRO-1 and 2 (the same communication in 0.19): the gradients fill one bucket (``reduce_bucket_size``
  5e8 elements), reduced by one all-reduce (``use_multi_rank_bucket_allreduce``, the default) of
  P elements of the communication dtype: bf16, or fp32 with ``communication_data_type``. After
  the step, one all-gather of the parameters' flat buffer (P bf16, padded to a multiple of 2 x 8).
- ZeRO-3 without prefetch or persistent parameters: every module's parameters are all-gathered in
  forward and again in backward (one all-gather per module), 2 x 2P bytes; the gradients are
  reduce-scattered in buckets of ``reduce_bucket_size`` (h^2 here), P elements of the
  communication dtype in all.

Model FLOPs (Megatron's convention, ``heterosim.trace.ir.flop_totals``): per rank
72 B s L h^2 (1 + s / 6h + V / 12 L h).
"""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from heterosim.trace.ir import flop_totals  # noqa: E402
from heterosim.trace.store import load_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
W, L, H, S, V, B = 8, 2, 64, 64, 4096, 2
P = 2 * V * H + S * H + 2 * H + L * (12 * H * H + 13 * H)
MODEL_FLOPS = 72 * B * S * L * H * H * (1 + S / (6 * H) + V / (12 * L * H))


def _capture(tmp_path: Path, stage: int, *extra: str) -> tuple:
    out = tmp_path / f"zero{stage}"
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", str(W), "-o", str(out),
                        str(ROOT / "examples" / "deepspeed_gpt.py"), "--stage", str(stage), "--layers", str(L),
                        "--hidden", str(H), "--heads", "2", "--seq", str(S), "--vocab", str(V), "--batch", str(B),
                        *extra], capture_output=True, text=True, cwd=ROOT, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    t = load_trace(out)
    comm: Counter = Counter()
    for o in t.roles[0].ops():
        if o.kind == "collective":
            comm[(o.collective, o.dtype)] += o.comm_bytes
    return t, comm


def test_zero1_reduces_bf16_gradients_and_gathers_parameters(tmp_path):
    t, comm = _capture(tmp_path, 1)
    assert comm[("all_reduce", "bf16")] == 2 * P
    assert comm[("all_gather", "bf16")] == 2 * P
    assert not comm[("reduce_scatter", "bf16")]
    assert flop_totals(t)["model"] == pytest.approx(W * MODEL_FLOPS, rel=0.02)


def test_zero2_fp32_communication_doubles_the_gradient_bytes(tmp_path):
    """``communication_data_type: fp32``: the same all-reduce in fp32 (4 bytes per element); the
    parameter all-gather stays bf16."""
    t, comm = _capture(tmp_path, 2, "--fp32-comm")
    assert comm[("all_reduce", "fp32")] == 4 * P + 4  # + the fp32 gradient-norm all-reduce
    assert comm[("all_gather", "bf16")] == 2 * P and not comm[("all_reduce", "bf16")]
    # DeepSpeed reads its overflow flag every step (.item()): a host synchronization in the trace.
    assert any(o.name == "aten._local_scalar_dense.default" for o in t.roles[0].ops())


def test_zero3_gathers_in_forward_and_backward_and_reduce_scatters(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"zero_optimization": {"stage3_prefetch_bucket_size": 0,
                                                      "stage3_param_persistence_threshold": 0}}))
    t, comm = _capture(tmp_path, 3, "--ds-config", str(cfg), "--fp32-comm")
    ops = t.roles[0].ops()
    gathers = Counter(o.phase for o in ops if o.collective == "all_gather")
    gathered = Counter()
    for o in ops:
        if o.collective == "all_gather":
            gathered[o.phase] += o.comm_bytes
    modules = 2 + 6 * L + 2  # tok, pos; ln1, qkv, proj, ln2, mlp.0, mlp.2 per block; ln, head
    assert gathers == {"fwd": modules, "bwd": modules}
    assert gathered == {"fwd": 2 * P, "bwd": 2 * P}
    assert comm[("reduce_scatter", "fp32")] == 4 * P
    assert flop_totals(t)["model"] == pytest.approx(W * MODEL_FLOPS, rel=0.02)
