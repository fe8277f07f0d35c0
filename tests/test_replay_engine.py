"""The fast engine (replay.engine) against hand-computed times and against the reference engine.

The helpers at the top build small traces and a toy network; other replay tests import them.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from heterosim.trace.ir import Block, GroupInfo, Role, Segment, Trace
from heterosim.errors import ReplayError, TraceMismatchError
from replay.engine import run_fast
from replay.expand import rank_classes
from replay.expand import CommInstance, Workload
from replay.flows import FlowSpec, PhaseSpec, TransferSpec
from replay.reference import run_reference

# --------------------------------------------------------------------------------------------
# Builders (shared with the other replay tests)


def comp(flops: float, phase: str = "fwd", name: str = "aten.mm.default") -> dict:
    return dict(kind="compute", name=name, kernel_class="gemm", phase=phase, flops=flops,
                flops_full=flops, dtype="bf16")


def coll(collective: str, group: str, nbytes: int, stream: str | None = None, phase: str = "fwd") -> dict:
    return dict(kind="collective", name=f"c10d.{collective}", kernel_class="comm", phase=phase,
                collective=collective, group=group, comm_bytes=nbytes, stream=stream or f"comm:{group}")


def p2p(direction: str, group: str, peer: int, nbytes: int, stream: str | None = None) -> dict:
    return dict(kind="p2p", name=f"c10d.{direction}", kernel_class="comm", phase="fwd", collective=direction,
                group=group, peer=peer, comm_bytes=nbytes, stream=stream or f"p2p:{group}:{peer}:{direction}")


def wait(distance: int) -> dict:
    return dict(kind="wait", name="c10d.wait", kernel_class="comm", target=distance)


def make_trace(world: int, groups: dict[str, tuple], roles: list[tuple], layout: dict | None = None) -> Trace:
    """roles: (ranks, {block: rows}, [(block, mb), ...]); the captured rank is the first."""
    return Trace(
        world_size=world,
        groups={g: GroupInfo(tuple(v[0]), v[1], v[2]) for g, v in groups.items()},
        roles=[
            Role(i, ranks[0], tuple(ranks), {b: Block.from_rows(rows) for b, rows in blocks.items()},
                 [Segment(b, mb) for b, mb in prog])
            for i, (ranks, blocks, prog) in enumerate(roles)
        ],
        layout=layout or {},
    )


def toy_workload(trace: Trace, *, speed: dict | None = None, gpu_type=None, node=None, bw=None,
                 latency: float = 0.0, link_sharing: bool = True, nic_bw: float | None = None) -> Workload:
    """Every rank on its own GPU with an egress (2g) and ingress (2g+1) link of ``bw[g]`` B/s.

    Compute op seconds = flops / speed[gpu type]. A ring collective of n ranks is one phase: each
    member sends its ring neighbour 2(n-1)/n*S (all_reduce) or (n-1)/n*S bytes. With ``nic_bw``,
    flows between nodes also cross the source node's NIC (link 2*world + node).
    """
    world = trace.world_size
    speed = speed or {"A": 1e12, "B": 2e12}
    gpu_type = gpu_type or ["A"] * world
    node = node or list(range(world))
    bw = bw or [1e9] * world
    cap = [bw[g // 2] for g in range(2 * world)]
    if nic_bw is not None:
        cap += [nic_bw] * (max(node) + 1)

    def durations(role_id, block, gpu):
        cols = trace.roles[role_id].blocks[block].columns
        return np.array([f / speed[gpu] if k == "compute" else 0.0 for k, f in zip(cols["kind"], cols["flops"])])

    def path(a, b):
        links = (2 * a, 2 * b + 1)
        if nic_bw is not None and node[a] != node[b]:
            links += (2 * world + node[a],)
        return links

    def transfer(inst: CommInstance) -> TransferSpec:
        rk = inst.ranks
        n = len(rk)
        if inst.collective == "send":
            flows = (FlowSpec(links=path(rk[0], rk[1]), nbytes=inst.nbytes),)
        else:
            f = 2 * (n - 1) / n if inst.collective == "all_reduce" else (n - 1) / n
            flows = tuple(FlowSpec(links=path(rk[i], rk[(i + 1) % n]), nbytes=f * inst.nbytes) for i in range(n))
        return TransferSpec(phases=(PhaseSpec(latency_s=latency, flows=flows),))

    return Workload(trace=trace, gpu_type=list(gpu_type), node=list(node), durations=durations,
                    transfer=transfer, capacity_Bps=cap, link_sharing=link_sharing)


def random_case(seed: int) -> Workload:
    """A random pipeline x data x tensor parallel job with GPipe p2p, TP and DP collectives."""
    rng = random.Random(seed)
    tp, pp, dp = rng.choice([1, 2]), rng.choice([1, 2, 3]), rng.choice([1, 2])
    world = tp * pp * dp
    mbs = rng.randint(1, 3)
    groups: dict[str, tuple] = {}
    gid = 0

    def rank(t, d, s):
        return t + tp * (d + dp * s)

    def add(ranks, dim):
        nonlocal gid
        groups[str(gid)] = (ranks, dim, dim)
        gid += 1
        return str(gid - 1)

    tpg = {(d, s): add([rank(t, d, s) for t in range(tp)], "tp") for d in range(dp) for s in range(pp)}
    dpg = {(t, s): add([rank(t, d, s) for d in range(dp)], "dp") for t in range(tp) for s in range(pp)}
    ppg = {(t, d): add([rank(t, d, s) for s in range(pp)], "pp") for t in range(tp) for d in range(dp)}
    roles = []
    act = rng.choice([4096, 65536, 1 << 20])
    for s in range(pp):
        tg, dg, pg = tpg[(0, s)], dpg[(0, s)], ppg[(0, 0)]
        fwd, bwd = [], []
        if s > 0:
            fwd += [p2p("recv", pg, s - 1, act), wait(1)]
        deferred = rng.random() < 0.5
        for _ in range(rng.randint(1, 3)):
            fwd.append(comp(rng.uniform(1e8, 1e10)))
            if tp > 1:
                fwd.append(coll("all_reduce", tg, rng.choice([1 << 16, 1 << 20])))
                if deferred:
                    fwd += [comp(rng.uniform(1e8, 1e9)), wait(2)]
                else:
                    fwd.append(wait(1))
        if s < pp - 1:
            fwd.append(p2p("send", pg, s + 1, act))
            bwd += [p2p("recv", pg, s + 1, act), wait(1)]
        bwd.append(comp(rng.uniform(1e8, 2e10), "bwd"))
        if s > 0:
            bwd.append(p2p("send", pg, s - 1, act))
        opt = [coll("all_reduce", dg, rng.choice([1 << 20, 1 << 24]), phase="grad_sync"), comp(1e9, "optimizer"),
               wait(2)] if dp > 1 else [comp(1e9, "optimizer")]
        prog = [("fwd", m) for m in range(mbs)] + [("bwd", m) for m in range(mbs)] + [("opt", -1)]
        roles.append(([rank(t, d, s) for d in range(dp) for t in range(tp)],
                      {"fwd": fwd, "bwd": bwd, "opt": opt}, prog))
    trace = make_trace(world, groups, roles, layout={"tp": tp, "pp": pp, "dp": dp})
    mode = rng.choice(["same", "same", "stage", "rank"])
    stage_gpu = [rng.choice("AB") for _ in range(pp)]
    gpu_type = ["A" if mode == "same" else stage_gpu[r // (tp * dp)] if mode == "stage" else rng.choice("AB")
                for r in range(world)]
    bw = [rng.choice([1e9, 2e9]) if rng.random() < 0.2 else 1e9 for _ in range(world)]
    node = [r // rng.choice([1, 2]) for r in range(world)]
    return toy_workload(trace, gpu_type=gpu_type, bw=bw, node=node, latency=rng.choice([0.0, 1e-5]),
                        link_sharing=rng.random() < 0.8, nic_bw=rng.choice([None, 1.5e9]))


def assert_same(w: Workload, rel: float = 1e-9, fluid_rel: float | None = None) -> None:
    """The fast engine equals the reference to ``rel`` on the same network (solo fast path on in
    both), and the reference on the plain fluid network to ``fluid_rel`` (default ``rel``)."""
    fast = run_fast(w)
    _assert_times(w, run_reference(w), fast, rel)
    _assert_times(w, run_reference(w, solo=False), fast, rel if fluid_rel is None else fluid_rel)


def _assert_times(w: Workload, ref: dict, fast, rel: float) -> None:
    for r in range(w.trace.world_size):
        a, b = ref[r], fast.rank_times(r)
        assert b.finish_s == pytest.approx(a.finish_s, rel=rel), f"rank {r}"
        assert b.compute_s == pytest.approx(a.compute_s, rel=rel)
        np.testing.assert_allclose(b.comm_end, a.comm_end, rtol=rel)
        np.testing.assert_allclose(b.comm_start, a.comm_start, rtol=rel)
        assert sum(x.t_end - x.t_block for x in b.waits) == pytest.approx(
            sum(x.t_end - x.t_block for x in a.waits), rel=rel, abs=1e-15)


# --------------------------------------------------------------------------------------------


def two_rank_gemm_allreduce(overlap: bool) -> Workload:
    """1e12 FLOP GEMM (1 s at 1e12 FLOP/s) and an all-reduce of 1e9 B (1 s at 1 GB/s per rank)."""
    rows = [coll("all_reduce", "0", 10**9), comp(1e12), wait(2)] if overlap else \
           [comp(1e12), coll("all_reduce", "0", 10**9), wait(1)]
    trace = make_trace(2, {"0": ([0, 1], "dp", "dp")}, [([0, 1], {"b": rows}, [("b", 0)])])
    return toy_workload(trace)


def test_two_ranks_gemm_then_allreduce_serialises():
    """GEMM 1 s then a 2-rank ring all-reduce of 1e9 B (each sends 2*(1/2)*1e9 B at 1 GB/s): 2 s."""
    run = run_fast(two_rank_gemm_allreduce(overlap=False))
    t = run.rank_times(0)
    assert t.finish_s == pytest.approx(2.0, rel=1e-12)
    assert t.compute_s == pytest.approx(1.0)
    assert [(x.t_block, x.t_end, x.dim) for x in t.waits] == [(pytest.approx(1.0), pytest.approx(2.0), "dp")]


def test_two_ranks_allreduce_overlaps_gemm():
    """The all-reduce issued before the GEMM runs during it: max(1 s, 1 s) = 1 s, no exposed wait."""
    run = run_fast(two_rank_gemm_allreduce(overlap=True))
    assert run.rank_times(1).finish_s == pytest.approx(1.0, rel=1e-12)
    assert run.rank_times(1).waits == []


def test_classes_merge_identical_ranks_and_split_gpu_types():
    """Ranks of one role on one GPU type form one class; a different GPU type splits it."""
    w = random_case(3)
    same = rank_classes(w.trace, ["A"] * w.trace.world_size)
    assert len(set(same)) <= len(w.trace.roles) * 2
    mixed = rank_classes(w.trace, ["A"] + ["B"] * (w.trace.world_size - 1))
    assert mixed[0] not in mixed[1:]


def test_dp_replicas_contend_for_a_shared_nic():
    """Two 2-rank all-reduces (node 0 -> node 1) share node 0's 1 GB/s NIC: each gets half, 2 s."""
    rows = [coll("all_reduce", "g", 10**9), wait(1)]
    groups = {"0": ([0, 2], "dp", "dp"), "1": ([1, 3], "dp", "dp")}
    trace = make_trace(4, groups, [([0, 1, 2, 3], {"b": [dict(r, group="0" if r["kind"] != "wait" else "")
                                                        for r in rows]}, [("b", 0)])])
    w = toy_workload(trace, node=[0, 0, 1, 1], bw=[1e12] * 4, nic_bw=1e9)
    run = run_fast(w)
    assert run.rank_times(0).finish_s == pytest.approx(2.0, rel=1e-9)
    assert len(run.classes) == 1
    assert_same(w)


@pytest.mark.parametrize("seed", range(24))
def test_fast_equals_reference_on_random_cases(seed):
    """On random TP x PP x DP jobs, toy networks, mixed GPU types: equal to 1e-9 relative."""
    assert_same(random_case(seed))


def test_asymmetric_replicas_split_classes():
    """Replicas on unequal links end at different times: classes split, times still match."""
    rows = [coll("all_reduce", "0", 10**9), wait(1), comp(1e9)]
    groups = {"0": ([0, 1], "dp", "dp"), "1": ([2, 3], "dp", "dp")}
    trace = make_trace(4, groups, [([0, 1, 2, 3], {"b": rows}, [("b", 0)])])
    w = toy_workload(trace, bw=[1e9, 1e9, 2e9, 2e9])
    run = run_fast(w)
    assert run.restarts >= 1
    assert run.rank_times(0).finish_s == pytest.approx(1.0 + 1e-3)
    assert run.rank_times(2).finish_s == pytest.approx(0.5 + 1e-3)
    assert_same(w)


def test_mismatched_collective_names_ranks_and_ops():
    """Rank 1 issues a different size: one TraceMismatchError naming both ranks and ops."""
    groups = {"0": ([0, 1], "dp", "dp")}
    trace = make_trace(2, groups, [([0], {"b": [coll("all_reduce", "0", 100), wait(1)]}, [("b", 0)]),
                                   ([1], {"b": [coll("all_reduce", "0", 200), wait(1)]}, [("b", 0)])])
    w = toy_workload(trace)
    msg = ("collective mismatch on group 0 sequence 0: rank 0 issued all_reduce of 100 B (op 0 "
           "(c10d.all_reduce)) but rank 1 issued all_reduce of 200 B (op 0 (c10d.all_reduce)); the "
           "ranks of a group must issue the same collectives in the same order")
    with pytest.raises(TraceMismatchError, match=r"^" + __import__("re").escape(msg)):
        run_fast(w)
    with pytest.raises(TraceMismatchError, match="rank 0 issued all_reduce of 100 B"):
        run_reference(w)


def test_missing_partner_deadlock_is_an_error_not_a_hang():
    """A recv with no send: both engines raise, naming the rank, op and missing partner."""
    groups = {"0": ([0, 1], "pp", "pp")}
    trace = make_trace(2, groups, [([0], {"b": [comp(1e9)]}, [("b", 0)]),
                                   ([1], {"b": [p2p("recv", "0", 0, 64), wait(1)]}, [("b", 0)])])
    w = toy_workload(trace)
    for run in (run_fast, run_reference):
        with pytest.raises(TraceMismatchError) as e:
            run(w)
        assert "p2p recv on group 0" in str(e.value) and "no matching send on rank 0" in str(e.value)
        assert "rank 1 is blocked at op 1 (c10d.wait) waiting for op 0" in str(e.value)


def test_max_symmetry_keeps_classes_and_uses_the_slowest_replica():
    """symmetry='max': one class, every rank ends with the slower replica; 'auto' past its class
    budget switches to it in place; unknown modes are refused."""
    rows = [coll("all_reduce", "0", 10**9), wait(1), comp(1e9)]
    groups = {"0": ([0, 1], "dp", "dp"), "1": ([2, 3], "dp", "dp")}
    trace = make_trace(4, groups, [([0, 1, 2, 3], {"b": rows}, [("b", 0)])])
    w = toy_workload(trace, bw=[1e9, 1e9, 2e9, 2e9])
    run = run_fast(w, symmetry="max")
    assert len(run.classes) == 1 and run.symmetry == "max" and run.asymmetric == 1
    assert [run.rank_times(r).finish_s for r in range(4)] == [pytest.approx(1.0 + 1e-3)] * 4
    assert run.max_spread == pytest.approx(0.5)
    auto = run_fast(w, max_classes=1)
    assert auto.symmetry == "max" and auto.restarts == 0 and auto.rank_times(2).finish_s == pytest.approx(1.001)
    with pytest.raises(ReplayError, match="unknown symmetry mode 'fast'; valid: exact, max, auto"):
        run_fast(w, symmetry="fast")


# --------------------------------------------------------------------------------------------
# Overlap slowdown


def slowed(w: Workload, s: float) -> Workload:
    return dataclasses.replace(w, overlap_slowdown=s)


def late_issue_overlap(s: float) -> Workload:
    """Rank 0: all-reduce (4e6 B: 4 ms), GEMM 10 ms, wait. Rank 1 computes 2 ms before issuing it."""
    groups = {"0": ([0, 1], "dp", "dp")}
    r0 = [coll("all_reduce", "0", 4 * 10**6), comp(1e10), wait(2)]
    r1 = [comp(2e9), coll("all_reduce", "0", 4 * 10**6), comp(1e10), wait(2)]
    trace = make_trace(2, groups, [([0], {"b": r0}, [("b", 0)]), ([1], {"b": r1}, [("b", 0)])])
    return slowed(toy_workload(trace), s)


def test_overlap_slowdown_stretches_a_gemm_under_an_allreduce():
    """GEMM 10 ms overlapping an all-reduce of 4 ms at slowdown 0.5: 4 ms at half speed cover 2 ms of
    work, then 8 ms: 12 ms, all of it compute."""
    rows = [coll("all_reduce", "0", 4 * 10**6), comp(1e10), wait(2)]
    trace = make_trace(2, {"0": ([0, 1], "dp", "dp")}, [([0, 1], {"b": rows}, [("b", 0)])])
    for w in (slowed(toy_workload(trace), 0.5), slowed(toy_workload(trace, link_sharing=False), 0.5)):
        t = run_fast(w).rank_times(0)
        assert t.finish_s == pytest.approx(0.012, rel=1e-12)
        assert t.compute_s == pytest.approx(0.012, rel=1e-12)
        assert t.comm_end.tolist() == [pytest.approx(0.004)] and t.waits == []
    assert run_fast(slowed(toy_workload(trace), 0.0)).rank_times(0).finish_s == pytest.approx(0.010)


def test_overlap_slowdown_counts_from_the_transfer_start_not_the_issue():
    """Rank 1 issues its side at 2 ms, so the all-reduce runs 2..6 ms. Rank 0's GEMM: 2 ms full speed,
    4 ms at half (2 ms of work), 6 ms left: ends at 12 ms (13 ms if the wait for the peer counted).
    Rank 1: 2 ms, then its GEMM: 4 ms at half speed (2 ms of work) and 8 ms: 14 ms."""
    run = run_fast(late_issue_overlap(0.5))
    assert run.rank_times(0).finish_s == pytest.approx(0.012, rel=1e-12)
    assert run.rank_times(1).finish_s == pytest.approx(0.014, rel=1e-12)
    assert run.rank_times(1).compute_s == pytest.approx(0.014, rel=1e-12)
    assert_same(late_issue_overlap(0.5))


@pytest.mark.parametrize("seed", range(12))
def test_fast_equals_reference_with_overlap_slowdown(seed):
    """With overlap slowdown on, the class engine equals the per-rank reference to 1e-9."""
    assert_same(slowed(random_case(seed), 0.3))


def test_overlap_slowdown_must_be_a_fraction():
    """1.0 would stop compute forever: a fraction in [0, 1) or one error naming it."""
    with pytest.raises(ReplayError, match=r"overlap_slowdown must be a fraction in \[0, 1\) .* got 1\.0"):
        slowed(two_rank_gemm_allreduce(True), 1.0)
    with pytest.raises(ReplayError, match="got -0.1"):
        slowed(two_rank_gemm_allreduce(True), -0.1)


def deep_pipeline_case(seed: int, pp: int = 16, mbs: int = 64) -> Workload:
    """A 1F1B pipeline of ``pp`` stages x ``mbs`` micro-batches (TP2, DP2, one node per stage whose
    four ranks share a NIC), random stage speeds, TP all-reduces, some slow GPU links."""
    rng = random.Random(seed)
    tp, dp = 2, 2
    world = tp * pp * dp
    groups: dict[str, tuple] = {}

    def rank(t, d, s):
        return t + tp * (d + dp * s)

    def add(name, ranks, dim):
        groups[name] = (ranks, dim, dim)
        return name

    for d in range(dp):
        for s in range(pp):
            add(f"tp{d}_{s}", [rank(t, d, s) for t in range(tp)], "tp")
    for t in range(tp):
        for s in range(pp):
            add(f"dp{t}_{s}", [rank(t, d, s) for d in range(dp)], "dp")
        for d in range(dp):
            add(f"pp{t}_{d}", [rank(t, d, s) for s in range(pp)], "pp")
    act = rng.choice([1 << 20, 1 << 22])
    roles = []
    for s in range(pp):
        tg, dg, pg = f"tp0_{s}", f"dp0_{s}", "pp0_0"
        fwd, bwd = ([p2p("recv", pg, s - 1, act), wait(1)] if s else []), []
        for _ in range(2):
            fwd += [comp(rng.uniform(1e9, 3e9)), coll("all_reduce", tg, 1 << 20), wait(1)]
        if s < pp - 1:
            fwd.append(p2p("send", pg, s + 1, act))
            bwd += [p2p("recv", pg, s + 1, act), wait(1)]
        bwd += [comp(rng.uniform(2e9, 6e9), "bwd"), coll("all_reduce", tg, 1 << 20, phase="bwd"), wait(1)]
        if s:
            bwd.append(p2p("send", pg, s - 1, act))
        opt = [coll("all_reduce", dg, 1 << 24, phase="grad_sync"), wait(1), comp(1e9, "optimizer")]
        warm = min(pp - s - 1, mbs)
        prog = [("fwd", m) for m in range(warm)]
        for i in range(mbs - warm):
            prog += [("fwd", warm + i), ("bwd", i)]
        prog += [("bwd", m) for m in range(mbs - warm, mbs)] + [("opt", -1)]
        roles.append(([rank(t, d, s) for d in range(dp) for t in range(tp)], {"fwd": fwd, "bwd": bwd, "opt": opt},
                      prog))
    trace = make_trace(world, groups, roles, layout={"tp": tp, "pp": pp, "dp": dp})
    bw = [rng.choice([1e9, 2e9]) if rng.random() < 0.1 else 2e9 for _ in range(world)]
    node = [r // (tp * dp) for r in range(world)]
    return toy_workload(trace, gpu_type=["A"] * world, bw=bw, node=node, latency=1e-5, nic_bw=3e9)


@pytest.mark.parametrize("seed,fluid_rel", [(0, 2e-5), (1, 1e-9), (2, 1e-9)])
def test_fast_equals_reference_on_a_deep_1f1b_pipeline(seed, fluid_rel):
    """PP16 x 64 micro-batches, 1F1B, shared NICs and uneven links (so classes split): the fast
    engine equals the per-rank reference on the same network to 1e-9 for every rank. Against the
    plain fluid network, seed 0's NIC contention amplifies the solo path's last-bit rounding
    (docs/replay.md, Known limits) to 9.2e-6 relative at most (measured), so it is held to 2e-5."""
    assert_same(deep_pipeline_case(seed), fluid_rel=fluid_rel)
