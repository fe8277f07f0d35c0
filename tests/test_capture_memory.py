"""Device memory from the capture: allocator rounding, the program walk, and models/pretrain_gpt.py
against the published formulas.

- Weights and optimizer: Megatron's ``report_theoretical_memory``
  (megatron/training/theoretical_memory_usage.py, ``compute_weight_and_optimizer_memory``):
  ``18`` bytes per parameter, ``6 + 12 / DP`` with the distributed optimizer: 2 (bf16 weight) +
  4 (fp32 main grad, which the fp32 masters use as their gradient) + 12 (fp32 master + two fp32
  Adam moments, sharded over DP by the distributed optimizer).
- Activations per layer: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models", Table 2): ``34 s b h + 5 a s^2 b`` bytes without parallelism or recompute;
  ``s b h (10 + 24/t + 5as/(ht))`` with tensor parallelism, ``s b h (34/t + 5as/(ht))`` with
  sequence parallelism too, ``34 s b h / t`` with selective recompute on top.
"""

import subprocess
import sys

import pytest

from heterosim.errors import TraceSchemaError
from heterosim.trace.ir import Block, Role, Segment, Trace, GroupInfo
from heterosim.trace.memory import POOL_ALLOWANCE, RoleMemory, allocator_sizes, memory_peak
from heterosim.trace.store import load_trace, write_trace
from tests.test_capture_megatron import ROOT, SCRIPT, capture, inspect

MiB = 1 << 20


def test_allocator_rounding_like_the_cuda_caching_allocator():
    assert allocator_sizes(0) == (0, 0)
    assert allocator_sizes(1) == (512, 0)
    assert allocator_sizes(512) == (512, 0)
    assert allocator_sizes(513) == (1024, 0)
    assert allocator_sizes(10 * MiB - 1) == (10 * MiB, 0)  # shares a 20 MiB large-pool segment
    assert allocator_sizes(10 * MiB) == (10 * MiB, 0)  # own segment, already 2 MiB-aligned
    assert allocator_sizes(11 * MiB) == (11 * MiB, 1 * MiB)  # own segment of 12 MiB


def _role(memory, program):
    blocks = {"f": Block.from_rows([{"kind": "compute", "kernel_class": "gemm"}] * 2),
              "b": Block.from_rows([{"kind": "compute", "kernel_class": "gemm"}])}
    return Role(0, 0, (0,), blocks, [Segment(b, mb) for b, mb in program], memory)


def test_program_walk_replays_block_events_per_reference():
    # baseline 100 parameters; forward allocates 10 activations (+1 temporary), backward frees them.
    mem = RoleMemory((100, 0, 0, 0, 0, 0),
                     {"f": [[0, 3, 10], [1, 4, 1], [2, 4, -1]], "b": [[1, 3, -10]]}, [[2, 4, 5], [4, 4, -5]])
    role = _role(mem, [("f", 0), ("f", 1), ("b", 0), ("b", 1)])
    p = memory_peak(mem, role.program)
    # f, f: 100+10+1 -> 110 -> 120+1 = 121 peak; gap +5 before b0 -> 125; b0 -10, b1 -10, -5 -> 100
    assert p.allocated == 125 and p.end == 100 and p.baseline == 100
    assert p.at_peak == {"parameters": 100, "gradients": 0, "optimizer": 0, "activations": 20, "other": 5}
    assert p.reserved == 125 + POOL_ALLOWANCE and p.peak_segment == 2



def _walk_event_by_event(mem, program):
    """memory_peak's rule applied one event at a time (what the per-block sweeps must equal)."""
    run = list(mem.baseline)
    alloc, slack = sum(run[:5]), run[5]
    peak, peak_res, at, where = alloc, alloc + slack, list(run), -1
    for j in range(len(program) + 1):
        evs = [(c, b) for s, c, b in mem.gaps if s == j]
        if j < len(program):
            evs += [(c, b) for _, c, b in mem.blocks.get(program[j].block, ())]
        for cat, b in evs:
            run[cat] += b
            if cat == 5:
                slack += b
            else:
                alloc += b
            if b > 0:
                if alloc > peak:
                    peak, at, where = alloc, list(run), j
                peak_res = max(peak_res, alloc + slack)
    return peak, peak_res + POOL_ALLOWANCE, at[:5], alloc, where


@pytest.mark.parametrize("seed", range(40))
def test_program_walk_per_block_equals_the_walk_event_by_event(seed):
    """Folding a block's events once (net change, highest rise, first event reaching it) gives
    the peaks, their composition and the peak segment of applying every event in turn."""
    import random

    rng = random.Random(seed)
    mem = RoleMemory(tuple(rng.randrange(0, 50) for _ in range(6)),
                     {b: [[0, rng.randrange(6), rng.choice([-1, 1]) * rng.randrange(0, 20)]
                          for _ in range(rng.randrange(0, 6))] for b in ("f", "b")},
                     [[rng.randrange(0, 9), rng.randrange(6), rng.randrange(-10, 10)] for _ in range(3)])
    role = _role(mem, [(rng.choice("fb"), m) for m in range(8)])
    p = memory_peak(mem, role.program)
    peak, reserved, at, end, where = _walk_event_by_event(mem, role.program)
    assert (p.allocated, p.reserved, list(p.at_peak.values()), p.end, p.peak_segment) == (
        peak, reserved, at, end, where)


def test_memory_is_optional_in_the_trace(tmp_path):
    mem = RoleMemory((1, 2, 3, 4, 5, 0), {"f": [[0, 3, 7]]}, [[1, 4, -2]])
    t = Trace(world_size=1, groups={"0": GroupInfo((0,), "world", "0")}, roles=[_role(mem, [("f", 0)])])
    write_trace(t, tmp_path / "with")
    assert load_trace(tmp_path / "with").roles[0].memory == mem
    t.roles[0].memory = None
    write_trace(t, tmp_path / "without")  # an old trace: no memory part at all
    assert load_trace(tmp_path / "without").roles[0].memory is None
    bad = RoleMemory((1, 2, 3, 4, 5, 0), {"f": [[9, 3, 7]]}, [])
    t.roles[0].memory = bad
    write_trace(t, tmp_path / "bad")
    with pytest.raises(TraceSchemaError, match="position"):
        load_trace(tmp_path / "bad")


# h=256 makes the allocator's 512-byte rounding of small tensors (biases, norms) < 0.5%.
MODEL = ["--preset", "tiny", "--bf16", "--hidden-size", "256", "--ffn-hidden-size", "1024",
         "--num-attention-heads", "4", "--micro-batch-size", "2"]


def _params(h, f, V, s, L):
    layer = 2 * h + 3 * h * h + 3 * h + h * h + h + 2 * h + h * f + f + f * h + h
    return L * layer + V * h + s * h + 2 * h


@pytest.mark.parametrize("distopt", [False, True])
def test_weights_and_optimizer_match_megatron(tmp_path, distopt):
    dp = 4
    t = capture(tmp_path / "t", dp, *MODEL, "--num-layers", "2", "--global-batch-size", "8",
                *(["--use-distributed-optimizer"] if distopt else []))
    m = inspect(tmp_path / "t")["roles"][0]["memory"]["at_peak"]
    P = _params(256, 1024, 1000, 64, 2)
    megatron = P * (6 + 12 / dp if distopt else 18)  # theoretical_memory_usage.py
    # bf16 parameters, fp32 main-grad buffer (--bf16 accumulates in fp32), fp32 master + moments;
    # within 1%: the buffers are padded (to lcm(dp, 128) elements with the distributed optimizer).
    assert m["parameters"] + m["gradients"] + m["optimizer"] == pytest.approx(megatron, rel=0.01)
    assert m["parameters"] == pytest.approx(2 * P, rel=0.01)
    assert m["optimizer"] == pytest.approx(12 * P / (dp if distopt else 1), rel=0.01)
    assert m["gradients"] == pytest.approx(4 * P, rel=0.01)
    assert m["other"] <= 512  # nothing else lives at the peak (no optimizer-side masks or copies)
    assert t.roles[0].memory is not None


def test_activation_memory_per_layer_matches_korthikanti(tmp_path):
    s, b, h, a = 64, 2, 256, 4
    act = {}
    for L in (2, 4):
        capture(tmp_path / f"L{L}", 1, *MODEL, "--num-layers", str(L), "--global-batch-size", "2",
                "--attention-backend", "unfused", "--attention-dropout", "0.1", "--hidden-dropout", "0.1")
        act[L] = inspect(tmp_path / f"L{L}")["roles"][0]["memory"]["at_peak"]["activations"]
    per_layer = (act[4] - act[2]) / 2
    assert per_layer == pytest.approx(34 * s * b * h + 5 * a * s * s * b, rel=0.02)


GPT3_LAYER = ["--preset", "gpt3-175b", "--bf16", "--micro-batch-size", "1", "--global-batch-size", "1",
              "--seq-length", "2048", "--tensor-model-parallel-size", "8", "--attention-backend", "unfused",
              "--attention-dropout", "0.1", "--hidden-dropout", "0.1"]


@pytest.mark.parametrize("extra, table2", [
    ([], lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
    (["--sequence-parallel"], lambda s, b, h, a, t: s * b * h * (34 / t + 5 * a * s / (h * t))),
    (["--sequence-parallel", "--recompute-granularity", "selective"], lambda s, b, h, a, t: 34 * s * b * h / t),
], ids=["tp", "tp-sp", "tp-sp-selective"])
def test_gpt3_175b_layer_activations_match_korthikanti_table2(tmp_path, extra, table2):
    """A GPT-3 175B layer (h 12288, 96 heads, s 2048, b 1) at TP 8: one layer's activations (the
    difference of a 2- and a 1-layer capture) within 2% of Korthikanti et al.'s Table 2 row."""
    act = {}
    for L in (1, 2):
        capture(tmp_path / f"L{L}", 8, *GPT3_LAYER, *extra, "--num-layers", str(L))
        act[L] = inspect(tmp_path / f"L{L}")["roles"][0]["memory"]["at_peak"]["activations"]
    assert act[2] - act[1] == pytest.approx(table2(2048, 1, 12288, 96, 8), rel=0.02)


def test_out_of_memory_is_reported_and_sharding_fixes_it(tmp_path):
    # 4 layers of h=12288: 7.3e9 parameters, ~20 bytes each on one GPU: far over 80 GiB.
    big = ["--preset", "gpt3-175b", "--bf16", "--num-layers", "4", "--micro-batch-size", "1",
           "--global-batch-size", "8"]
    for tp, oom in ((1, True), (8, False)):
        out = tmp_path / f"tp{tp}"
        capture(out, 8, *big, "--tensor-model-parallel-size", str(tp))
        p = subprocess.run([sys.executable, "-m", "replay", "simulate", str(out), "--cluster", "dgx-a100",
                            "--no-progress"], capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 0, p.stderr
        assert ("out of memory on ranks 0-7 (A100-SXM4-80GB): needs" in p.stdout) == oom, p.stdout
        if oom:
            p = subprocess.run([sys.executable, "-m", "replay", "simulate", str(out), "--cluster", "dgx-a100",
                                "--no-progress", "--fail-on-oom", "--json"], capture_output=True, text=True, cwd=ROOT)
            assert p.returncode == 3 and "needs" in p.stderr and "of 80.0" in p.stderr


def test_pipeline_iteration_is_steady(tmp_path):
    # TP2 + SP + PP2: all-gather buffers are freed once waited, every micro-batch's activations are
    # freed by its backward: each stage ends the iteration where it started.
    t = capture(tmp_path / "t", 4, "--preset", "tiny", "--bf16", "--num-layers", "2", "--micro-batch-size", "1",
                "--global-batch-size", "4", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                "--pipeline-model-parallel-size", "2")
    peaks = [memory_peak(r.memory, r.program) for r in t.roles]
    for p in peaks:
        assert abs(p.end - p.baseline) < 0.01 * p.baseline
    assert all(p.at_peak["activations"] > 0 for p in peaks)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlapped-param-gather", "plain"])
def test_interleaved_iteration_is_steady_and_chunks_share_blocks(tmp_path, overlap):
    # PP2 x VPP3 x DP2. With the distributed optimizer's overlapped param all-gathers each chunk's
    # first forward waits for them; the next forward's block is that one without those waits,
    # referenced (not run). Chunks built alike share their backward (and plain forward) blocks:
    # stage 0 holds embedding + 2 alike, stage 1 2 alike + the loss chunk, so 2 backward blocks a
    # stage, not 3. Either way no autograd graph frees its activations a second time.
    flags = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"] if overlap else []
    t = capture(tmp_path / "t", 4, "--num-layers", "6", "--hidden-size", "64", "--num-attention-heads", "4",
                "--seq-length", "32", "--vocab-size", "128", "--max-position-embeddings", "32",
                "--micro-batch-size", "1", "--global-batch-size", "8", "--bf16", *flags,
                "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1")
    for r in t.roles:
        p = memory_peak(r.memory, r.program)
        assert abs(p.end - p.baseline) < 0.01 * p.allocated
        fwd, bwd = {}, {}  # (chunk, micro-batch) -> its forward / backward: the largest such block there
        for s in r.program:
            cols = r.blocks[s.block].columns
            for phase, into in (("fwd", fwd), ("bwd", bwd)):
                if set(cols["phase"]) == {phase} and len(cols["kind"]) > len(r.blocks[into.get((s.chunk, s.mb), s.block)]):
                    into[(s.chunk, s.mb)] = s.block
                if set(cols["phase"]) == {phase}:
                    into.setdefault((s.chunk, s.mb), s.block)
        assert len({bwd[(c, 0)] for c in range(3)}) == 2
        for chunk in range(3):
            a, b = r.blocks[fwd[(chunk, 0)]].columns, r.blocks[fwd[(chunk, 1)]].columns
            outside = [i for i, (k, d) in enumerate(zip(a["kind"], a["target"])) if k == "wait" and d > i]
            assert bool(outside) == overlap
            assert [n for i, n in enumerate(a["name"]) if i not in outside] == b["name"]


def test_tracker_resize_counts_a_shard_of_a_kept_buffer():
    """A 4 MiB buffer the job holds 1/8 of (Annotator.shard): counted as 512 KiB from then on (one
    event for the difference), and its free returns 512 KiB."""
    import gc

    import torch

    from capture.memory import MemoryTracker
    from heterosim.trace.memory import PARAMETERS

    tr = MemoryTracker()
    t = torch.empty(4 << 20, dtype=torch.uint8)
    tr.note(t, PARAMETERS)
    assert (tr.allocated, tr.take()) == (4 << 20, [(PARAMETERS, 4 << 20)])
    tr.resize(t, (4 << 20) // 8)
    assert (tr.allocated, tr.take()) == (512 << 10, [(PARAMETERS, (512 << 10) - (4 << 20))])
    del t
    gc.collect()
    assert (tr.allocated, tr.take()) == (0, [(PARAMETERS, -(512 << 10))])
