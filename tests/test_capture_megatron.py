"""Capturing models/pretrain_gpt.py: FLOPs and collective volumes against Megatron's formulas.

FLOP formulas (Narayanan et al., SC'21, eq. 3 and the recompute variant):
model    = 72 B s l h^2 (1 + s/6h + V/12lh)
hardware = 96 B s l h^2 (1 + s/6h + V/16lh) with full recomputation.
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
SCRIPT = str(ROOT / "models" / "pretrain_gpt.py")
SOFTMAX = "heterosim.scaled_upper_triang_masked_softmax.default"
SOFTMAX_BWD = "heterosim.scaled_upper_triang_masked_softmax_backward.default"


def capture(out, world, *args, ranks="auto"):
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", str(world), "--ranks", ranks,
                        "-o", str(out), SCRIPT, *args], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    return load_trace(out)


def inspect(out):
    p = subprocess.run([sys.executable, "-m", "capture", "--inspect", str(out), "--json"], capture_output=True,
                       text=True, cwd=ROOT)
    return json.loads(p.stdout)


def megatron_flops(m, B, recompute=False):
    s, l, h, V = m["seq_length"], m["num_layers"], m["hidden_size"], m["vocab_size"]
    if recompute:
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


TINY = ["--preset", "tiny", "--num-layers", "4", "--micro-batch-size", "1", "--bf16"]


@pytest.mark.parametrize("world,tp,pp,extra", [
    (4, 1, 1, []),
    (8, 2, 2, []),
    (8, 4, 2, ["--sequence-parallel"]),
])
def test_model_flops_match_megatron(tmp_path, world, tp, pp, extra):
    """model_flops equals 72 B s l h^2 (1 + s/6h + V/12lh) within 1% for several layouts."""
    gbs = 8
    out = tmp_path / "t"
    t = capture(out, world, *TINY, "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size",
                str(pp), "--global-batch-size", str(gbs), *extra)
    s = inspect(out)
    assert len(t.roles) == pp
    assert s["model_flops"] == pytest.approx(megatron_flops(t.model, gbs), rel=0.01)
    assert s["hardware_flops"] == pytest.approx(s["model_flops"], rel=1e-12)


@pytest.mark.parametrize("world,tp,pp", [(4, 2, 2), (2, 1, 1)])
def test_full_recompute_hardware_flops(tmp_path, world, tp, pp):
    """With full recomputation hardware_flops equals 96 B s l h^2 (1 + s/6h + V/16lh)."""
    out = tmp_path / "t"
    t = capture(out, world, *TINY, "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size",
                str(pp), "--global-batch-size", "4", "--recompute-granularity", "full", "--recompute-method",
                "uniform", "--recompute-num-layers", "1")
    s = inspect(out)
    assert s["hardware_flops"] == pytest.approx(megatron_flops(t.model, 4, recompute=True), rel=0.01)
    assert s["model_flops"] == pytest.approx(megatron_flops(t.model, 4), rel=0.01)
    assert any(o.phase == "recompute" for o in t.roles[0].iter_ops())


def test_collective_volumes(tmp_path):
    """TP all-reduce 2bsh bytes, 2 per layer fwd + 2 bwd; DP sync = 4 bytes/param (--bf16 reduces
    fp32 main grads, as Megatron forces); p2p = 2 x micro-batches."""
    out = tmp_path / "t"
    gbs, mbs = 8, 1
    t = capture(out, 8, *TINY, "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                "--global-batch-size", str(gbs))
    m = t.model
    b, s, h = mbs, m["seq_length"], m["hidden_size"]
    nmb = gbs // (mbs * 2)
    layers_per_stage = m["num_layers"] // 2
    for role in t.roles:
        ops = role.ops()
        tp_ar = [o for o in ops if o.kind == "collective" and o.collective == "all_reduce"
                 and t.groups[o.group].dim == "tp" and o.comm_bytes == 2 * b * s * h and ".layers." in o.module]
        by_phase = Counter(o.phase for o in tp_ar)
        assert by_phase["fwd"] == 2 * layers_per_stage * nmb
        assert by_phase["bwd"] == 2 * layers_per_stage * nmb
        sends = [o for o in ops if o.kind == "p2p" and o.collective == "send"]
        assert len(sends) == nmb  # one boundary per stage: activations (stage 0) or grads (stage 1)
        dp = [o for o in ops if o.kind == "collective" and t.groups[o.group].dim == "dp"]
        grad_bytes = sum(o.comm_bytes for o in dp if o.phase == "grad_sync")
        assert grad_bytes == 4 * stage_params(m, tp=2, stage=role.id, pp=2)
        emb = [o for o in ops if o.phase == "grad_sync" and o.kind == "collective" and t.groups[o.group].dim == "pp"]
        assert [o.comm_bytes for o in emb] == [4 * (m["vocab_size"] // 2) * h]  # tied embedding grads (fp32)


def stage_params(m, tp, stage, pp):
    """Parameters one TP rank of a GPT pipeline stage holds (LayerNorm, biases, tied embeddings)."""
    h, f, V, s = m["hidden_size"], m["ffn_hidden_size"], m["vocab_size"], m["seq_length"]
    layer = (2 * h                      # input layer norm
             + h * 3 * h // tp + 3 * h // tp  # qkv column-parallel weight + bias
             + h // tp * h + h            # proj row-parallel weight + (unsplit) bias
             + 2 * h                      # pre-MLP layer norm
             + h * f // tp + f // tp      # fc1
             + f // tp * h + h)           # fc2
    n = layer * m["num_layers"] // pp
    if stage == 0:
        n += V // tp * h + s * h          # word + learned position embeddings
    if stage == pp - 1:
        n += 2 * h + V // tp * h          # final layer norm + the tied output-embedding copy
    return n


def test_ranks_all_equals_auto_expanded(tmp_path):
    """--ranks all on world 8 (tp2 pp2 dp2) finds the same roles and programs as --ranks auto."""
    args = [*TINY, "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
            "--global-batch-size", "8"]
    auto = capture(tmp_path / "auto", 8, *args)
    full = capture(tmp_path / "all", 8, *args, ranks="all")
    assert [r.ranks for r in auto.roles] == [r.ranks for r in full.roles] == [tuple(range(4)), tuple(range(4, 8))]
    for ra, rf in zip(auto.roles, full.roles):
        fa = [(o.name, o.kind, o.comm_bytes, auto.groups[o.group].family if o.group else "") for o in ra.iter_ops()]
        ff = [(o.name, o.kind, o.comm_bytes, full.groups[o.group].family if o.group else "") for o in rf.iter_ops()]
        assert fa == ff


def test_capture_is_deterministic(tmp_path):
    """Two captures of the same pretrain_gpt command are byte-identical."""
    args = [*TINY, "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
            "--global-batch-size", "8", "--use-distributed-optimizer"]
    a, b = tmp_path / "a", tmp_path / "b"
    capture(a, 8, *args)
    capture(b, 8, *args)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files and all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


def test_sequence_parallel_volumes(tmp_path):
    """With SP each layer's forward has 2 all-gathers and 2 reduce-scatters of 2bsh bytes (bf16),
    and its backward re-gathers the column-parallel inputs: 4 all-gathers and 2 reduce-scatters."""
    gbs = 4
    t = capture(tmp_path / "t", 4, *TINY, "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
                "2", "--global-batch-size", str(gbs), "--sequence-parallel")
    m = t.model
    size = 2 * 1 * m["seq_length"] * m["hidden_size"]
    nmb, layers = gbs, m["num_layers"] // 2  # world 4 = tp2 x pp2: dp 1, so gbs micro-batches of 1
    for role in t.roles:
        counts = Counter((o.phase, o.collective) for o in role.iter_ops()
                         if o.kind == "collective" and ".layers." in o.module and o.comm_bytes == size
                         and t.groups[o.group].dim == "tp")
        assert counts[("fwd", "all_gather")] == 2 * layers * nmb
        assert counts[("fwd", "reduce_scatter")] == 2 * layers * nmb
        assert counts[("bwd", "all_gather")] == 4 * layers * nmb
        assert counts[("bwd", "reduce_scatter")] == 2 * layers * nmb


def test_unfused_attention_ops_bytes_and_flops(tmp_path):
    """--attention-backend unfused --attention-dropout 0.1 (tp 2, b 2, s 64, 2 heads of 16 per rank,
    bf16, full recompute): each layer's core attention records forward baddbmm [b*np, sq, sk]
    (full GEMM FLOPs, the beta=0 output buffer not read), one Megatron causal softmax
    (heterosim.scaled_upper_triang_masked_softmax), one native_dropout, bmm and the layout copy, and
    no SDPA op; backward 4 bmm-class GEMMs plus dropout and the softmax's backward op. The softmax
    reads 2 B x the s(s+1)/2 unmasked scores of each of the b*np score matrices (grad and output:
    twice that backward) and writes 2 B x b*np*s^2. Totals: model = 72 B s l h^2 (...), hardware = 96 B s l h^2 (...)."""
    t = capture(tmp_path / "t", 2, "--preset", "tiny", "--num-layers", "2", "--bf16", "--micro-batch-size", "2",
                "--global-batch-size", "2", "--tensor-model-parallel-size", "2", "--attention-backend", "unfused",
                "--attention-dropout", "0.1", "--recompute-granularity", "full", "--recompute-method", "uniform",
                "--recompute-num-layers", "1")
    b, np_, s, d = 2, 2, 64, 16
    n = b * np_ * s * s
    ops = list(t.roles[0].iter_ops())
    assert not [o for o in ops if "scaled_dot_product" in o.name]
    for layer in range(2):
        core = [o for o in ops if o.kind == "compute" and f"layers.{layer}.self_attention.core_attention" in o.module]
        fwd = [o for o in core if o.phase == "fwd"]
        assert [o.name for o in fwd] == ["aten.baddbmm.default", SOFTMAX,
                                         "aten.native_dropout.default", "aten.bmm.default", "aten.clone.default"]
        assert [o.name for o in core if o.phase == "bwd"] == [
            "aten.bmm.default", "aten.bmm.default", "aten.native_dropout_backward.default",
            SOFTMAX_BWD, "aten.bmm.default", "aten.mul.Scalar", "aten.bmm.default",
            "aten.mul.Scalar"]
        scores, soft, drop, ctx, _ = fwd
        assert (scores.kernel_class, scores.dims) == ("gemm", {"m": s, "n": s, "k": d, "batch": b * np_})
        assert scores.flops == scores.flops_full == ctx.flops == 2 * n * d
        assert (scores.bytes_read, scores.bytes_written) == (2 * 2 * b * np_ * s * d, 2 * n)  # q, k; scores
        assert (soft.kernel_class, soft.dims, soft.dtype) == ("softmax", {"numel": n}, "bf16")
        seen = b * np_ * s * (s + 1) // 2  # unmasked scores
        assert (soft.bytes_read, soft.bytes_written) == (2 * seen, 2 * n) == (16640, 32768)
        assert drop.bytes_written == 2 * n + n  # probabilities and the bool keep-mask
        soft_bwd = next(o for o in core if o.name == SOFTMAX_BWD)
        assert (soft_bwd.kernel_class, soft_bwd.bytes_read, soft_bwd.bytes_written) == ("softmax", 4 * seen, 2 * n)
        assert soft_bwd.signature == f"{SOFTMAX_BWD}:bf16:{b * np_}x{s}x{s},{b * np_}x{s}x{s}"
    # Recomputed ops carry the module of the backward op that triggered them, so count by name.
    rec = Counter(o.name for o in ops if o.phase == "recompute")
    names = ("aten.baddbmm.default", SOFTMAX, "aten.native_dropout.default", "aten.bmm.default")
    assert [rec[x] for x in names] == [2] * 4
    assert not [o for o in ops if o.name.startswith("aten._masked_softmax")]
    assert Counter(o.name for o in ops)[SOFTMAX_BWD] == 2  # one per layer backward
    totals = flop_totals(t)
    assert totals["model"] == pytest.approx(megatron_flops(t.model, 2), rel=0.01)
    assert totals["hardware"] == pytest.approx(megatron_flops(t.model, 2, recompute=True), rel=0.01)


@pytest.mark.parametrize("backend,impl", [("auto", None), ("fused", "fused"), ("flash", "flash")])
def test_attention_backend_tags_the_kernels(tmp_path, backend, impl):
    """--attention-backend flash / fused (Transformer Engine's FlashAttention-2 / cuDNN backends)
    records the implementation as dims["impl"] of every attention op, forward and backward (2 layers:
    2 + 2 ops); auto records none."""
    t = capture(tmp_path / "t", 1, *TINY, "--num-layers", "2", "--global-batch-size", "1",
                "--attention-backend", backend)
    att = [o for o in t.roles[0].iter_ops() if o.kind == "compute" and o.kernel_class == "attention"]
    assert len(att) == 4 and sorted(o.phase for o in att) == ["bwd", "bwd", "fwd", "fwd"]
    assert {o.dims.get("impl") for o in att} == {impl}


def test_sm_margin_tags_the_pipelined_gemms(tmp_path):
    """--tp-comm-overlap-sm-margin proj_fprop=24: the attention projection's forward GEMMs (the
    pipelined reduce-scatter's chunks) carry dims.sm_margin 24; FC2's forward and every backward
    GEMM carry none."""
    t = capture(tmp_path / "t", 2, *TINY, "--num-layers", "1", "--global-batch-size", "1",
                "--tensor-model-parallel-size", "2", "--sequence-parallel", "--tp-comm-overlap",
                "--tp-comm-overlap-sm-margin", "proj_fprop=24")
    gemms = [o for o in t.roles[0].iter_ops() if o.kind == "compute" and o.kernel_class == "gemm"]
    tagged = [o for o in gemms if o.dims.get("sm_margin")]
    assert tagged and {o.dims["sm_margin"] for o in tagged} == {24}
    assert all("linear_proj" in o.module and o.phase == "fwd" for o in tagged)
    assert [o for o in gemms if "linear_proj" in o.module and o.phase == "fwd"] == tagged
