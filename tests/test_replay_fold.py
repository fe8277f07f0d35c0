"""The network folded by a node shift (replay/fold.py): which jobs fold, how links and ranks map,
and that folded runs give the unfolded run's times."""

import sys
from pathlib import Path

import pytest

from heterosim.cluster import load_cluster
from replay import latency as latency_mod
from replay import fold as fold_mod
from replay.engine import run_fast
from replay.simulate import _pricer, build_workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_replay import Shape, synth_trace  # noqa: E402


def _workload(tp=4, pp=2, dp=4, cluster="dgx-h100", slowdown=0.0, vpp=1, batch=16):
    c = Shape("t", 8, 2048, 16, 16, 8192, 51200, 2048, tp, pp, dp, batch, cluster, vpp=vpp)
    trace = synth_trace(c)
    cl = load_cluster(cluster, num_gpus=trace.world_size)
    return build_workload(trace, cl, _pricer(None, cl.catalogue), overlap_slowdown=slowdown), cl


def _names(cl, link):
    net = cl.network
    return net.vertices[net.links.src[link]], net.vertices[net.links.dst[link]]


def test_a_tp4_dp4_job_on_dgx_h100_folds_two_nodes_into_one():
    """TP4 x PP2 x DP4 on 8-GPU nodes: a node holds two DP lanes, so a stage's two nodes form one
    orbit of the shift; node 0 (stage 0) and node 2 (stage 1) represent them. Node 1's links map
    onto node 0's, rank 8 (lane 2 of stage 0) onto rank 0."""
    w, cl = _workload()
    f = w._cache["fold"]
    assert f.order == 2
    assert [n for n, rep in enumerate(f.rep_node) if rep] == [0, 2]
    assert f.rep_rank[8] == 0 and f.rep_rank[13] == 5 and f.rep_rank[16] == 16 and f.rep_rank[27] == 19
    net = cl.network
    for l in range(len(net.links)):
        a, b = _names(cl, l)
        if a == "n1.gpu3" and b == "n1.nvs":
            assert _names(cl, f.rep_link[l]) == ("n0.gpu3", "n0.nvs")
        if a.startswith("n0.") or b.startswith("n0."):
            assert f.rep_link.get(l, l) == l  # a representative's links stand for themselves


@pytest.mark.parametrize("slowdown", [0.0, 0.16])
def test_folded_runs_give_the_unfolded_times(slowdown):
    """Every class's finish, compute, comm starts and ends equal the unfolded run's to 1e-12
    (the quotient does the same share formula per link)."""
    w, _ = _workload(slowdown=slowdown)
    on = run_fast(w)
    fold = w._cache.pop("fold")
    off = run_fast(w)
    assert fold is not None and on.fold == "on" and on.folded_transfers > 100 and off.fold == "none"
    for a, b in zip(on.times, off.times):
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-12)
        assert a.compute_s == pytest.approx(b.compute_s, rel=1e-12)
        assert list(a.comm_end) == pytest.approx(list(b.comm_end), rel=1e-12)
        assert list(a.comm_start) == pytest.approx(list(b.comm_start), rel=1e-12)


def _runs_without_folding_dp_allreduces(monkeypatch):
    """(run with the fold, run without it, calls refused): the big DP all-reduces of the TP4 x PP2
    x DP4 job declared unfoldable."""
    w, _ = _workload(slowdown=0.16)
    off_fold = w._cache.pop("fold")
    off = run_fast(w)
    w._cache["fold"] = off_fold
    real = fold_mod.Fold.batch
    seen = []

    def batch(self, specs, replica_ranks):
        nbytes = [sum(f.nbytes for ph in s.phases for f in ph.flows) for s in specs]
        if len(replica_ranks[0]) == 4 and max(nbytes) > 1e8:  # the big DP all-reduces
            seen.append(1)
            return None
        return real(self, specs, replica_ranks)

    monkeypatch.setattr(fold_mod.Fold, "batch", batch)
    return run_fast(w), off, seen


def test_a_transfer_that_does_not_fold_restarts_the_run_unfolded(monkeypatch):
    """Declaring the gradient all-reduces unfoldable: the first one to start while folded
    transfers are in flight (or on an idle network) runs unfolded, and the times still equal the
    unfolded run's."""
    on, off, seen = _runs_without_folding_dp_allreduces(monkeypatch)
    assert seen and on.fold == "off"
    for a, b in zip(on.times, off.times):
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-12)


def test_a_latency_bound_transfer_that_does_not_fold_runs_beside_folded_ones(monkeypatch):
    """With every transfer latency-bound (the bound raised past any transfer's bytes) and the big
    DP all-reduces declared unfoldable, those run unfolded beside the folded ones: priced alone on
    no link, they need no restart (``fold`` stays "on"), and the times equal an unfolded run's."""
    monkeypatch.setattr(latency_mod, "LATENCY_BOUND", 1e12)
    on, off, seen = _runs_without_folding_dp_allreduces(monkeypatch)
    assert seen and on.fold == "on" and on.folded_transfers > 100
    for a, b in zip(on.times, off.times):
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-12)
        assert list(a.comm_end) == pytest.approx(list(b.comm_end), rel=1e-12)


def test_an_asymmetric_batch_does_not_fold():
    """The replicas of a TP all-reduce fold; with one replica on the other node moving 1% more
    bytes they are no longer images of each other, and the batch does not fold."""
    from replay.flows import FlowSpec, PhaseSpec, TransferSpec
    from replay.expand import CommInstance

    w, _ = _workload()
    f = w._cache["fold"]
    groups = [g for g in w.trace.groups.values() if g.dim == "tp" and g.ranks[0] < 16]
    insts = [CommInstance(collective="all_reduce", nbytes=1 << 24, dtype="bf16", ranks=g.ranks, group="x", dim="tp")
             for g in groups]
    specs = [w.transfer(i) for i in insts]
    ranks = [g.ranks for g in groups]
    folded = f.batch(specs, ranks)
    assert folded is not None and len(folded.specs) == 2  # the two TP groups of node 0
    assert sorted(len(r) for r in folded.replica_ranks) == [8, 8]  # each stands for two groups
    j = next(i for i, g in enumerate(groups) if g.ranks[0] >= 8)
    s = specs[j]
    specs[j] = TransferSpec(phases=tuple(PhaseSpec(latency_s=ph.latency_s, flows=tuple(
        FlowSpec(links=x.links, nbytes=x.nbytes * 1.01, max_rate_Bps=x.max_rate_Bps) for x in ph.flows))
        for ph in s.phases))
    assert f.batch(specs, ranks) is None


def test_no_fold_without_data_parallel_lanes_to_shift():
    """DP 2 on 8-GPU nodes with TP4 puts both lanes on one node: nothing to shift. A cluster of
    mixed GPU types maps H100 ranks onto A100 ranks: no fold either."""
    w, _ = _workload(dp=2)
    assert w._cache["fold"] is None
    w, _ = _workload(tp=8, pp=1, dp=4, cluster="mixed-a100-h100")
    assert w._cache["fold"] is None


def test_larger_dp_groups_beside_the_data_parallel_ones_still_fold():
    """With context parallelism Megatron also makes DP x CP groups (the optimizer's), of dimension
    dp too: the shift is taken from the smallest DP groups and must map the larger ones onto groups
    (here the union of two DP groups maps onto itself)."""
    from heterosim.trace.ir import GroupInfo

    w, cl = _workload()
    trace = w.trace
    dp = sorted((g.ranks for g in trace.groups.values() if g.dim == "dp"), key=lambda r: r[0])
    trace.groups["dp_x_cp"] = GroupInfo(tuple(sorted(dp[0] + dp[1])), "dp", "dp_x_cp")
    gpus = [cl.rank_to_gpu(r) for r in range(trace.world_size)]
    f = fold_mod.build_fold(trace, cl, gpus, cl.network.never_binding)
    assert f is not None and f.order == 2
    # a larger group that the shift does not map onto a group (lanes 0-1 of one DP group and
    # lanes 2-3 of another) prevents the fold
    trace.groups["odd"] = GroupInfo((dp[0][0], dp[0][1], dp[1][2], dp[1][3]), "dp", "odd")
    assert fold_mod.build_fold(trace, cl, gpus, cl.network.never_binding) is None
