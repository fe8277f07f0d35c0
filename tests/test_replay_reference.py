"""The reference engine (replay.reference): hand-computed overlap, pipeline and sharing cases."""

from __future__ import annotations

import pytest

from heterosim.errors import TraceMismatchError
from replay.reference import run_reference
from test_replay_engine import (coll, comp, late_issue_overlap, make_trace, p2p, slowed, toy_workload,
                                two_rank_gemm_allreduce, wait)


def one_f_one_b(p: int, m: int, F: float = 1e12, B: float = 2e12):
    """A p-stage 1F1B pipeline of m micro-batches; forward F FLOPs, backward B, free p2p."""
    groups = {"pp": (list(range(p)), "pp", "pp")}
    roles = []
    for s in range(p):
        f, b = [], []
        if s > 0:
            f += [p2p("recv", "pp", s - 1, 0), wait(1)]
        f.append(comp(F))
        if s < p - 1:
            f.append(p2p("send", "pp", s + 1, 0))
            b += [p2p("recv", "pp", s + 1, 0), wait(1)]
        b.append(comp(B, "bwd"))
        if s > 0:
            b.append(p2p("send", "pp", s - 1, 0))
        warm = min(p - s - 1, m)
        prog = [("f", i) for i in range(warm)]
        for i in range(m - warm):
            prog += [("f", warm + i), ("b", i)]
        prog += [("b", i) for i in range(m - warm, m)]
        roles.append(([s], {"f": f, "b": b}, prog))
    return make_trace(p, groups, roles, layout={"pp": p})


def test_gemm_and_allreduce_overlapped_vs_not():
    """GEMM 1 s and all-reduce 1 s: 2 s when the wait follows the issue, 1 s when the GEMM overlaps."""
    assert run_reference(two_rank_gemm_allreduce(False))[0].finish_s == pytest.approx(2.0)
    assert run_reference(two_rank_gemm_allreduce(True))[0].finish_s == pytest.approx(1.0)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 4), (2, 3)])
def test_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(p, m):
    """1F1B: iteration (m+p-1)(F+B); stage 0 waits (p-1)(F+B), the bubble fraction (p-1)/(m+p-1)."""
    out = run_reference(toy_workload(one_f_one_b(p, m)))  # F = 1 s, B = 2 s at 1e12 FLOP/s
    it = max(t.finish_s for t in out.values())
    assert it == pytest.approx((m + p - 1) * 3.0)
    blocked = sum(x.t_end - x.t_block for x in out[0].waits)
    assert blocked / it == pytest.approx((p - 1) / (m + p - 1))
    assert all(x.dim == "pp" for x in out[0].waits)


def test_two_allreduces_sharing_a_nic_take_twice_as_long():
    """Two node-crossing all-reduces (1e9 B, 2 ranks) on one 1 GB/s NIC: 2 s instead of 1 s."""
    groups = {"0": ([0, 2], "dp", "dp"), "1": ([1, 3], "dp", "dp")}
    rows = [coll("all_reduce", "0", 10**9), wait(1)]
    trace = make_trace(4, groups, [([0, 1, 2, 3], {"b": rows}, [("b", 0)])])
    out = run_reference(toy_workload(trace, node=[0, 0, 1, 1], bw=[1e12] * 4, nic_bw=1e9))
    assert [out[r].finish_s for r in range(4)] == [pytest.approx(2.0)] * 4
    assert out[0].waits[0].inter_node is True
    alone = make_trace(2, {"0": ([0, 1], "dp", "dp")}, [([0, 1], {"b": rows}, [("b", 0)])])
    assert run_reference(toy_workload(alone, node=[0, 1], bw=[1e12] * 2, nic_bw=1e9))[0].finish_s == pytest.approx(1.0)


def test_coalesced_send_recv_do_not_serialise_on_one_stream():
    """A coalesced send+recv pair on one stream (batch_isend_irecv) between two ranks completes."""
    groups = {"0": ([0, 1], "pp", "pp")}
    def rows(peer):
        return [dict(p2p("send", "0", peer, 10**9), stream="s"),
                dict(p2p("recv", "0", peer, 10**9), stream="s", coalesced=1), wait(1), wait(2)]
    trace = make_trace(2, groups, [([0], {"b": rows(1)}, [("b", 0)]), ([1], {"b": rows(0)}, [("b", 0)])])
    out = run_reference(toy_workload(trace))
    assert out[0].finish_s == pytest.approx(1.0)  # the two directions use different links


def test_collectives_in_different_order_deadlock_with_a_clear_error():
    """Rank 0 runs A then B, rank 1 B then A on the same stream: a named mismatch, not a hang."""
    groups = {"a": ([0, 1], "tp", "tp"), "b": ([0, 1], "dp", "dp")}
    r0 = [coll("all_reduce", "a", 8, stream="s"), coll("all_reduce", "b", 8, stream="s"), wait(1), wait(2)]
    r1 = [coll("all_reduce", "b", 8, stream="s"), coll("all_reduce", "a", 8, stream="s"), wait(1), wait(2)]
    trace = make_trace(2, groups, [([0], {"x": r0}, [("x", 0)]), ([1], {"x": r1}, [("x", 0)])])
    with pytest.raises(TraceMismatchError, match=r"all_reduce on group a sequence 0: ranks \[0\] issued it"):
        run_reference(toy_workload(trace))


def test_without_link_sharing_each_transfer_takes_its_idle_time():
    """link_sharing=False: the two NIC-sharing all-reduces each take their alone time, 1 s."""
    from replay.engine import run_fast

    groups = {"0": ([0, 2], "dp", "dp"), "1": ([1, 3], "dp", "dp")}
    trace = make_trace(4, groups, [([0, 1, 2, 3], {"b": [coll("all_reduce", "0", 10**9), wait(1)]}, [("b", 0)])])
    w = toy_workload(trace, node=[0, 0, 1, 1], bw=[1e12] * 4, nic_bw=1e9, link_sharing=False)
    assert run_reference(w)[0].finish_s == pytest.approx(1.0)
    assert run_fast(w).rank_times(3).finish_s == pytest.approx(1.0)


def test_reference_overlap_slowdown_hand_computed():
    """Reference engine: GEMM 10 ms under a 4 ms all-reduce at slowdown 0.5 takes 12 ms; with the
    peer issuing 2 ms late the all-reduce runs 2..6 ms: rank 0 ends at 2 + 4 + 6 = 12 ms, rank 1 (its
    GEMM starts at 2 ms) at 2 + 4 + 8 = 14 ms."""
    rows = [coll("all_reduce", "0", 4 * 10**6), comp(1e10), wait(2)]
    trace = make_trace(2, {"0": ([0, 1], "dp", "dp")}, [([0, 1], {"b": rows}, [("b", 0)])])
    out = run_reference(slowed(toy_workload(trace), 0.5))
    assert out[0].finish_s == pytest.approx(0.012, rel=1e-12) and out[0].compute_s == pytest.approx(0.012)
    late = run_reference(late_issue_overlap(0.5))
    assert [late[r].finish_s for r in (0, 1)] == [pytest.approx(0.012, rel=1e-12), pytest.approx(0.014, rel=1e-12)]
    assert late[0].comm_start.tolist() == [pytest.approx(0.002)]
