"""Results (replay.result, replay.simulate.summarize): breakdown, MFU, tokens/s, JSON, heterogeneity."""

from __future__ import annotations

import json

import pytest

from heterosim.cluster.spec import DEFAULT_DISPATCH_US

from heterosim.trace.ir import flop_totals
from replay.engine import run_fast
from replay.result import Breakdown, rank_breakdown
from replay.simulate import simulate, summarize
from test_replay_engine import coll, comp, make_trace, random_case, toy_workload, two_rank_gemm_allreduce, wait
from test_replay_reference import one_f_one_b


def summary(w, peak=1e12, **kw):
    run = run_fast(w)
    return summarize(run, w, cluster_name="toy", peak_flops=[peak] * w.trace.world_size, dtype="bf16", **kw)


def test_breakdown_of_gemm_then_allreduce():
    """Serial case: compute 1 s, exposed DP comm 1 s (intra-node), nothing else; overlapped: 0 s comm."""
    b = summary(two_rank_gemm_allreduce(False)).breakdown
    assert (b.compute_s, b.exposed_comm_s, b.bubble_s, b.idle_s) == (pytest.approx(1.0), {"dp": pytest.approx(1.0)},
                                                                    0.0, pytest.approx(0.0, abs=1e-12))
    assert b.exposed_intra_node_s == 0.0 and b.exposed_inter_node_s == pytest.approx(1.0)  # toy: 1 rank per node
    o = summary(two_rank_gemm_allreduce(True)).breakdown
    assert o.exposed_comm_s == {} and o.compute_s == pytest.approx(1.0)


def test_mfu_and_tflops_hand_computed():
    """2 ranks x 1e12 model FLOPs in 2 s on 1e12 FLOP/s GPUs: 0.5 TFLOP/s per GPU, MFU 0.5."""
    r = summary(two_rank_gemm_allreduce(False))
    assert r.model_flops == 2e12 == flop_totals(r._workload.trace)["model"]
    assert r.tflops_per_gpu == pytest.approx(0.5)
    assert r.mfu == pytest.approx(0.5)


def test_tokens_per_second_from_layout():
    """global_batch_size 8 x seq_length 1024 tokens in a 2 s iteration: 4096 tokens/s."""
    w = two_rank_gemm_allreduce(False)
    w.trace.layout.update(global_batch_size=8, seq_length=1024)
    r = summary(w)
    assert r.tokens_per_iteration == 8192 and r.tokens_per_s == pytest.approx(4096.0)


@pytest.mark.parametrize("seed", range(8))
def test_parts_add_up_to_the_iteration_for_every_rank(seed):
    """compute + exposed comm + bubble + idle == iteration time, rank by rank."""
    r = summary(random_case(seed))
    for c in r.classes:
        assert c.breakdown.total_s == pytest.approx(r.iteration_time_s, rel=1e-9)
    assert r.breakdown.total_s == pytest.approx(r.iteration_time_s, rel=1e-9)


def test_pipeline_bubble_in_the_breakdown():
    """1F1B p=4, m=8, F=1 s, B=2 s: every stage's bubble is (p-1)(F+B) = 9 s of a 33 s iteration."""
    r = summary(toy_workload(one_f_one_b(4, 8)))
    assert r.iteration_time_s == pytest.approx(33.0)
    for c in r.classes:
        assert c.breakdown.bubble_s == pytest.approx(9.0)
        assert c.breakdown.compute_s == pytest.approx(24.0)
    assert r.critical_path[-1].end_s == pytest.approx(33.0)
    assert all(a.end_s == pytest.approx(b.start_s) for a, b in zip(r.critical_path, r.critical_path[1:]))


def test_heterogeneous_pipeline_lies_between_and_fast_stages_wait():
    """Half the stages on 2x faster GPUs: time between all-slow and all-fast; fast stages idle more."""
    trace = one_f_one_b(4, 8)
    slow = summary(toy_workload(trace, gpu_type=["A"] * 4)).iteration_time_s
    fast = summary(toy_workload(trace, gpu_type=["B"] * 4)).iteration_time_s
    mixed = summary(toy_workload(trace, gpu_type=["A", "A", "B", "B"]))
    assert fast < mixed.iteration_time_s < slow
    by = mixed.breakdown_by_gpu
    assert by["B"].bubble_s > by["A"].bubble_s
    assert by["B"].compute_s == pytest.approx(by["A"].compute_s / 2)


def test_json_is_one_deterministic_object_with_the_contract_keys():
    """--json contract: iteration_time_s, tflops_per_gpu, mfu, breakdown; identical across runs."""
    a = summary(random_case(5)).to_json()
    b = summary(random_case(5)).to_json()
    assert a == b
    d = json.loads(a)
    assert d["schema_version"] == 1
    for k in ("iteration_time_s", "tflops_per_gpu", "mfu", "breakdown", "classes", "critical_path"):
        assert k in d
    assert set(d["breakdown"]) == {"compute_s", "exposed_comm_s", "exposed_intra_node_s", "exposed_inter_node_s",
                                   "bubble_s", "idle_s"}


def test_weighted_mean_and_rank_lookup():
    """Breakdown.mean weights by rank count; rank_breakdown finds a rank's class."""
    a = Breakdown(compute_s=1.0, exposed_comm_s={"tp": 1.0}, exposed_intra_node_s=1.0, exposed_inter_node_s=0.0,
                  bubble_s=0.0, idle_s=0.0)
    b = Breakdown(compute_s=4.0, exposed_comm_s={}, exposed_intra_node_s=0.0, exposed_inter_node_s=0.0,
                  bubble_s=0.0, idle_s=0.0)
    m = Breakdown.mean([(a, 3), (b, 1)])
    assert (m.compute_s, m.exposed_comm_s) == (pytest.approx(1.75), {"tp": pytest.approx(0.75)})
    r = summary(random_case(3))
    assert r.rank_breakdown(0) is r.classes[r._run.class_of[0]].breakdown
    with pytest.raises(KeyError, match="rank 99 is not in this result"):
        r.rank_breakdown(99)


def test_simulate_on_a_preset_prices_with_kernel_db_and_plans_with_ncclshim():
    """A 16-rank TP-8 x DP-2 job on dgx-a100: roofline-priced compute, RING/NVLS-planned comm."""
    groups = {"tp": (list(range(8)), "tp", "tp"), "tp1": (list(range(8, 16)), "tp", "tp")}
    groups.update({f"dp{i}": ([i, i + 8], "dp", "dp") for i in range(8)})
    rows = [comp(4e12), coll("all_reduce", "tp", 64 << 20), wait(1), comp(4e12),
            coll("all_reduce", "dp0", 256 << 20, phase="grad_sync"), wait(1)]
    trace = make_trace(16, groups, [(list(range(16)), {"b": rows}, [("b", 0)])])
    r = simulate(trace, "dgx-a100")
    assert r.gpu_counts == {"A100-SXM4-80GB": 16}
    assert set(r.price_sources_s) == {"roofline"}
    # compute = priced GPU time + the time the GPU waits for its host to issue (replay.host): none
    # here. The steady iteration is GPU-bound, so the CPU's lead from the iteration before (carried
    # across blocks, no value read back) already covers the first op's dispatch
    # (DEFAULT_DISPATCH_US["fwd"], which an iteration entered with the GPU idle would wait for).
    assert r.stats["host_stall_s"] == 0.0 < DEFAULT_DISPATCH_US["fwd"]
    assert r.price_sources_s["roofline"] == pytest.approx(16 * r.breakdown.compute_s)
    assert r.breakdown.exposed_inter_node_s > 0 and r.breakdown.exposed_intra_node_s > 0
    assert r.stats["symmetry"] == "exact"
    ref = simulate(trace, "dgx-a100", engine="reference")
    assert ref.iteration_time_s == pytest.approx(r.iteration_time_s, rel=1e-9)


def pipeline_trace(p: int, m: int, width: int, F: float, B: float):
    """``width`` independent p-stage 1F1B pipelines; stage s holds ranks s*width .. s*width+width-1."""
    from test_replay_engine import p2p

    groups = {f"pp{i}": ([i + width * s for s in range(p)], "pp", "pp") for i in range(width)}
    roles = []
    for s in range(p):
        f, b = [], []
        if s > 0:
            f += [p2p("recv", "pp0", s - 1, 1 << 20), wait(1)]
        f.append(comp(F))
        if s < p - 1:
            f.append(p2p("send", "pp0", s + 1, 1 << 20))
            b += [p2p("recv", "pp0", s + 1, 1 << 20), wait(1)]
        b.append(comp(B, "bwd"))
        if s > 0:
            b.append(p2p("send", "pp0", s - 1, 1 << 20))
        warm = min(p - s - 1, m)
        prog = [("f", i) for i in range(warm)]
        for i in range(m - warm):
            prog += [("f", warm + i), ("b", i)]
        prog += [("b", i) for i in range(m - warm, m)]
        roles.append(([s * width + i for i in range(width)], {"f": f, "b": b}, prog))
    return make_trace(p * width, groups, roles, layout={"pp": p, "dp": width})


def test_mixed_a100_h100_pool_pipeline():
    """Stage 0 on A100 nodes, stage 1 on H100 nodes: between all-A100 and all-H100; H100s wait."""
    trace = pipeline_trace(2, 4, 8, F=2e13, B=4e13)
    t = {name: simulate(trace, name).iteration_time_s for name in ("dgx-a100", "dgx-h100")}
    mixed = simulate(trace, "mixed-a100-h100")
    assert mixed.gpu_counts == {"A100-SXM4-80GB": 8, "H100-SXM5-80GB": 8}
    assert t["dgx-h100"] < mixed.iteration_time_s < t["dgx-a100"]
    by = mixed.breakdown_by_gpu
    assert by["H100-SXM5-80GB"].bubble_s > by["A100-SXM4-80GB"].bubble_s
    assert by["H100-SXM5-80GB"].compute_s < by["A100-SXM4-80GB"].compute_s


@pytest.mark.parametrize("seed", range(4))
def test_parts_add_up_with_overlap_slowdown(seed):
    """With overlap slowdown the stretch counts as compute: the parts still add up, rank by rank."""
    import dataclasses

    r = summary(dataclasses.replace(random_case(seed), overlap_slowdown=0.4))
    for c in r.classes:
        assert c.breakdown.total_s == pytest.approx(r.iteration_time_s, rel=1e-9)


def test_a_job_runs_at_its_slowest_boards_tensor_clock():
    """16 H100s: tensor work at the expected slowest board's clock, 0.86 x (1 - z x 0.015) with
    Blom's z = 1.7688 for 16 boards (gpus.yaml [BOARD-SPREAD]); a compute-bound GEMM's time above
    the launch overhead grows by 1 / (1 - 0.0265). Boards that hold boost (A100 SXM4) do not move."""
    trace = make_trace(16, {"w": (list(range(16)), "dp", "dp")}, [(list(range(16)), {"b": [comp(4e13)]}, [("b", 0)])])
    slow, mean = simulate(trace, "dgx-h100"), simulate(trace, "dgx-h100", slowest_board=False)
    z = 1.7688
    assert slow.stats["tensor_clock_ratio"] == {"H100-SXM5-80GB": {
        "boards": 16, "mean_board": 0.86, "priced": pytest.approx(0.86 * (1 - z * 0.015), abs=1e-5)}}
    assert mean.stats["tensor_clock_ratio"]["H100-SXM5-80GB"]["priced"] == 0.86
    assert (slow.options["slowest_board"], mean.options["slowest_board"]) == (True, False)
    launch = 16 * 3.5e-6
    grow = (slow.price_sources_s["roofline"] - launch) / (mean.price_sources_s["roofline"] - launch)
    assert grow == pytest.approx(1 / (1 - z * 0.015), rel=1e-6)
    assert "tensor clock / boost: H100-SXM5-80GB 0.837 (mean board 0.860, slowest of 16)" in slow.summary()
    assert "tensor clock" not in mean.summary()
    a100 = [simulate(trace, "dgx-a100", slowest_board=s) for s in (True, False)]
    assert a100[0].iteration_time_s == a100[1].iteration_time_s
    assert a100[0].stats["tensor_clock_ratio"]["A100-SXM4-80GB"] == {"boards": 16, "mean_board": 1.0, "priced": 1.0}
    mixed = simulate(trace, "mixed-a100-h100").stats["tensor_clock_ratio"]  # each type: its own boards
    assert mixed["H100-SXM5-80GB"] == {"boards": 8, "mean_board": 0.86,
                                       "priced": pytest.approx(0.86 * (1 - 1.4342 * 0.015), abs=1e-5)}
    assert mixed["A100-SXM4-80GB"]["priced"] == 1.0


def test_the_job_catalogue_is_the_clusters_own_where_no_board_spreads():
    """A100 SXM4 boards hold boost: the job prices with the cluster's registry object itself (no
    copy), and a given Pricer over it is used as it is; H100s get a registry of their own."""
    from heterosim.cluster import load_cluster
    from kernel_db import Pricer
    from replay.simulate import _pricer, boards, job_catalogue

    a100 = load_cluster("dgx-a100", num_gpus=16)
    assert boards(a100) == {"A100-SXM4-80GB": 16}
    assert job_catalogue(a100) is a100.catalogue
    given = Pricer(None, a100.catalogue)
    assert _pricer(given, job_catalogue(a100)) is given
    h100 = load_cluster("dgx-h100", num_gpus=16)
    cat = job_catalogue(h100)
    assert cat is not h100.catalogue and cat.get("H100").power_clock_ratio < h100.catalogue.get("H100").power_clock_ratio
    priced = _pricer(Pricer(None, h100.catalogue), cat)
    assert priced.catalogue is cat
