"""The steady 1F1B phase advanced by whole periods (replay/periodic.py): where it applies, the fast
engine's times stay within 1e-9 of simulating every event, and of the per-rank reference."""

import gc
import random

import numpy as np
import pytest

from replay.engine import run_fast
from replay.periodic import SkippedBlockers, point_period
from replay.reference import run_reference
from tests.test_replay_engine import assert_same, coll, comp, make_trace, p2p, toy_workload, wait


def one_f_one_b_case(seed: int, pp: int = 6, mbs: int = 40, overlap: bool = False, every: int = 0,
                     gather: int = -1):
    """TP2 x PP ``pp`` x DP2, ``mbs`` micro-batches in 1F1B, random stage speeds, no shared NIC (every
    transfer runs solo, the state the skip can move). ``overlap``: each backward also reduces a
    gradient bucket over DP while its compute runs (issued before it, waited after it). ``every``:
    stage 0's forward of every ``every``-th micro-batch computes 50% longer (as the first chunk of an
    interleaved stage holds the embedding), so its period is ``every`` times the others'. ``gather``:
    stage 0's forward of that micro-batch also all-gathers over DP on a stream used nowhere else (once
    per iteration, as the distributed optimizer's parameter all-gathers)."""
    rng = random.Random(seed)
    tp, dp = 2, 2
    world = tp * pp * dp

    def rank(t, d, s):
        return t + tp * (d + dp * s)

    groups: dict[str, tuple] = {}
    for d in range(dp):
        for s in range(pp):
            groups[f"tp{d}_{s}"] = ([rank(t, d, s) for t in range(tp)], "tp", "tp")
    for t in range(tp):
        for s in range(pp):
            groups[f"dp{t}_{s}"] = ([rank(t, d, s) for d in range(dp)], "dp", "dp")
        for d in range(dp):
            groups[f"pp{t}_{d}"] = ([rank(t, d, s) for s in range(pp)], "pp", "pp")
    roles = []
    for s in range(pp):
        tg, dg, pg = f"tp0_{s}", f"dp0_{s}", "pp0_0"
        fwd, bwd = ([p2p("recv", pg, s - 1, 1 << 20), wait(1)] if s else []), []
        fwd += [comp(rng.uniform(1e9, 3e9)), coll("all_reduce", tg, 1 << 20), wait(1)]
        if s < pp - 1:
            fwd.append(p2p("send", pg, s + 1, 1 << 20))
            bwd += [p2p("recv", pg, s + 1, 1 << 20), wait(1)]
        if overlap:
            bwd += [coll("all_reduce", dg, 1 << 21, phase="bwd"), comp(rng.uniform(2e9, 6e9), "bwd"),
                    coll("all_reduce", tg, 1 << 20, phase="bwd"), wait(1), wait(4)]
        else:
            bwd += [comp(rng.uniform(2e9, 6e9), "bwd"), coll("all_reduce", tg, 1 << 20, phase="bwd"), wait(1)]
        if s:
            bwd.append(p2p("send", pg, s - 1, 1 << 20))
        opt = [coll("all_reduce", dg, 1 << 22, phase="grad_sync"), wait(1), comp(1e9, "optimizer")]
        blocks = {"fwd": fwd, "bwd": bwd, "opt": opt}
        if every and s == 0:
            blocks["fwd_e"] = [dict(op, flops=1.5 * op["flops"], flops_full=1.5 * op["flops_full"]) if op["kind"] == "compute" else op for op in fwd]

        if gather >= 0 and s == 0:
            blocks["fwd_g"] = [coll("all_gather", dg, 1 << 22, stream="param_ag"), wait(1)] + blocks[f"fwd{'_e' if every else ''}"]

        def f(m):
            if s == 0 and m == gather:
                return ("fwd_g", m)
            return ("fwd_e" if every and s == 0 and m % every == 0 else "fwd", m)

        warm = min(pp - s - 1, mbs)
        prog = [f(m) for m in range(warm)]
        for i in range(mbs - warm):
            prog += [f(warm + i), ("bwd", i)]
        prog += [("bwd", m) for m in range(mbs - warm, mbs)] + [("opt", -1)]
        roles.append(([rank(t, d, s) for d in range(dp) for t in range(tp)], blocks, prog))
    trace = make_trace(world, groups, roles, layout={"tp": tp, "pp": pp, "dp": dp})
    return toy_workload(trace, latency=1e-5)


def _close(a, b, rel=1e-9):
    for ta, tb in zip(a.times, b.times):
        assert ta.finish_s == pytest.approx(tb.finish_s, rel=rel)
        assert ta.compute_s == pytest.approx(tb.compute_s, rel=rel)
        np.testing.assert_allclose(ta.comm_end, tb.comm_end, rtol=rel)
        np.testing.assert_allclose(ta.comm_start, tb.comm_start, rtol=rel)
        assert [w.point for w in ta.waits] == [w.point for w in tb.waits]
        assert sum(w.t_end - w.t_block for w in ta.waits) == pytest.approx(
            sum(w.t_end - w.t_block for w in tb.waits), rel=rel, abs=1e-15)
        np.testing.assert_allclose([w.t_end for w in ta.waits], [w.t_end for w in tb.waits], rtol=rel)
    assert [{p: c for p, (c, _) in d.items()} for d in a.blocker] == [{p: c for p, (c, _) in d.items()}
                                                                      for d in b.blocker]


def test_point_period_finds_the_steady_1f1b_repetition():
    """A stage's points repeat with one forward and one backward micro-batch between the warm-up
    and the cool-down."""
    w = one_f_one_b_case(0)
    run = run_fast(w, periodic=False)
    sk = run.skeletons[0]
    L, lo, hi = point_period(sk, sk.spans["A"].tolist())
    # stage 0: forward all_reduce, wait, send; backward recv, wait, all_reduce, wait
    assert L == 7
    assert hi - lo >= 4 * L and all(sk.sig[q] == sk.sig[q + L] for q in range(lo, hi - L))


@pytest.mark.parametrize("seed", [0, 1, 3, 4, 5])
def test_skipping_the_steady_phase_keeps_every_time_within_1e9(seed):
    """Periods are skipped, and every class's times, waits and blockers match simulating every
    event to 1e-9; the per-rank reference agrees too."""
    w = one_f_one_b_case(seed)
    on, off = run_fast(w), run_fast(w, periodic=False)
    assert on.periods_skipped > 0 and off.periods_skipped == 0
    _close(on, off)
    assert_same(w)


def test_a_run_that_skipped_leaves_no_reference_cycle():
    """The skipper refers to its simulation weakly (the simulation holds the skipper), so a run's
    state goes as soon as its result is dropped, not at the collector's next full pass: 70 replays
    in one process otherwise held 17 GB (``validate --jobs 1``)."""
    w = one_f_one_b_case(0)
    gc.collect()
    gc.disable()
    try:
        run = run_fast(w)
        assert run.periods_skipped > 0
        del run
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage if type(o).__module__.startswith("replay.")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert "_Sim" not in left and "Skipper" not in left and "FluidNetwork" not in left


@pytest.mark.parametrize("seed", [0, 3])
def test_waits_end_in_program_order_with_and_without_skipping(seed):
    """Each class's waits end in increasing time (the compute stream only moves forward), also where
    the skip wrote them: ``replay.simulate.critical_path`` bisects them by their end."""
    w = one_f_one_b_case(seed, every=3)
    for run in (run_fast(w), run_fast(w, periodic=False)):
        for rt in run.times:
            ends = [x.t_end for x in rt.waits]
            assert ends and all(a < b for a, b in zip(ends, ends[1:]))


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_classes_of_different_periods_skip_together(seed):
    """Stage 0 repeats only every third micro-batch (its heavier forward), the other stages every
    one: the checkpoints are stage 0's, every other class advances three of its periods between
    two of them, and the skip keeps every time within 1e-9 of the event-by-event run."""
    w = one_f_one_b_case(seed, every=3)
    on, off = run_fast(w), run_fast(w, periodic=False)
    sks = on.skeletons
    L0 = point_period(sks[0], sks[0].spans["A"].tolist())[0]
    L1 = point_period(sks[1], sks[1].spans["A"].tolist())[0]
    assert (L0, L1) == (3 * 7, 10)  # stage 0: 7 points per micro-batch (as above); stage 1 adds recv + wait, send
    assert on.periods_skipped > 0 and off.periods_skipped == 0
    _close(on, off)


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_a_stream_used_once_does_not_delay_the_skip(seed):
    """Stage 0's forward of micro-batch 5 (its first after the warm-up) all-gathers on a stream of its
    own, used nowhere else. That launch has completed by the checkpoints, so where it sits does not
    matter: as many periods are skipped as without it, and every time stays within 1e-9 of the
    event-by-event run."""
    plain = run_fast(one_f_one_b_case(seed, every=3))
    w = one_f_one_b_case(seed, every=3, gather=5)
    on, off = run_fast(w), run_fast(w, periodic=False)
    assert on.periods_skipped == plain.periods_skipped > 0
    _close(on, off)


def test_a_pipeline_that_never_repeats_is_simulated_event_by_event():
    """Seed 2's stages keep drifting against each other (two checkpoints never hold the same state
    within TIME_TOL): nothing is skipped."""
    w = one_f_one_b_case(2, mbs=80)
    assert run_fast(w).periods_skipped == 0


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_skipping_with_overlap_slowdown_keeps_every_time_within_1e9(seed):
    """With compute slowed while its rank's comm is in flight (the DP bucket under the backward
    compute), the compute clock is part of the state moved: periods are skipped and the times,
    compute included, match simulating every event and the per-rank reference."""
    w = one_f_one_b_case(seed, overlap=True)
    full = run_fast(w, periodic=False)
    w.overlap_slowdown = 0.16
    on, off = run_fast(w), run_fast(w, periodic=False)
    assert all(a.compute_s > 1.02 * b.compute_s for a, b in zip(off.times, full.times))  # it overlaps
    assert on.periods_skipped > 0 and off.periods_skipped == 0
    _close(on, off)
    assert_same(w)


@pytest.mark.parametrize("slowdown", [0.0, 0.16])
def test_skipping_on_a_megatron_shaped_1f1b_job_on_dgx_a100(slowdown):
    """The benchmark's GPT-3 175B shape on 64 GPUs (real NCCL plans, adaptive-routing cluster), with
    and without overlap slowdown: the steady phase is skipped and the classes' times stay within
    1e-9 of the event-by-event run."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_replay import CASES, synth_trace

    from heterosim.cluster import load_cluster
    from replay.simulate import _pricer, build_workload

    c = CASES["gpt3-175b-64"]
    trace = synth_trace(c)
    cluster = load_cluster(c.cluster, num_gpus=trace.world_size)
    w = build_workload(trace, cluster, _pricer(None, cluster.catalogue), overlap_slowdown=slowdown)
    on, off = run_fast(w), run_fast(w, periodic=False)
    assert on.periods_skipped > 50
    _close(on, off)


def test_a_period_of_waits_alone_skips_nothing(monkeypatch):
    """A repeating stretch with no issued point (waits only) has no checkpoint: nothing is
    skipped and the run goes event by event (it used to raise StopIteration)."""
    from types import SimpleNamespace

    from replay import periodic

    class Sim(SimpleNamespace):  # a subclass: the skipper holds its sim by weak reference
        pass

    sk = SimpleNamespace(role=0, kind=["comm"] + ["wait"] * 8)
    sim = Sim(classes=[SimpleNamespace(sk=sk, spans=None, rep=0)], w=SimpleNamespace(gpu_type=["A100-SXM4-80GB"]))
    monkeypatch.setattr(periodic, "point_period", lambda sk, spans: (4, 1, 9))
    s = periodic.Skipper(sim)
    assert s.periods == [] and s.anchor_point == -1
    assert not s.is_checkpoint(0, 5)


def test_skipped_blockers_read_as_if_written_out():
    """Points 6..11 skipped in periods of 2 after points 4, 5 (the last period): point 6 + 2j + r is
    blocked by what blocked 4 + r, j + 1 periods on (class 0 advances 2 points a period, class 1 three)."""
    base = {0: (0, 0), 3: (1, 7), 4: (0, 2), 5: (1, 9)}
    b = SkippedBlockers(base, f=6, S=6, D=2, strides=[2, 3])
    assert (b[6], b[7], b[8], b[9], b[10], b[11]) == ((0, 4), (1, 12), (0, 6), (1, 15), (0, 8), (1, 18))
    assert b[3] == (1, 7) and 11 in b and 12 not in b and 2 not in b and b.get(12) is None
    with pytest.raises(KeyError):
        b[12]
    b[13] = (0, 20)  # the cool-down after the skip writes on as usual
    assert len(b) == 11 and dict(b.items()) == {**base, 6: (0, 4), 7: (1, 12), 8: (0, 6), 9: (1, 15), 10: (0, 8),
                                                11: (1, 18), 13: (0, 20)}
    gap = SkippedBlockers({4: (0, 1)}, f=6, S=4, D=2, strides=[1])  # point 5 had no blocker: nor do 7, 9
    assert 7 not in gap and sorted(gap.keys()) == [4, 6, 8]
