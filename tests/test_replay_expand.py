"""replay.expand.build_skeleton: a role's points (its comm and wait ops) with the compute between them,
checked by hand on a two-rank toy job (compute seconds = flops / 1e12)."""

import numpy as np
import pytest

from replay.expand import build_skeleton
from tests.test_replay_engine import comp, coll, make_trace, p2p, toy_workload, wait


def _workload(prog):
    blocks = {
        # 1 s, a send, 2 s, the wait on the send (distance 2: the op two places back)
        "A": [comp(1e12), p2p("send", "pp", 1, 1 << 20), comp(2e12), wait(2)],
        # 3 s and no comm at all: its compute is carried onto the next point
        "B": [comp(3e12)],
        # an all-reduce, then a wait on the send of the block before (distance 4 reaches into it)
        "C": [coll("all_reduce", "pp", 1 << 10), wait(4)],
    }
    peer = {"A": [comp(1e12), p2p("recv", "pp", 0, 1 << 20), wait(1)], "C": [coll("all_reduce", "pp", 1 << 10),
                                                                          wait(1)]}
    trace = make_trace(2, {"pp": ([0, 1], "pp", "pp")},
                       [([0], blocks, prog), ([1], peer, [("A", 0), ("C", -1)])])
    return toy_workload(trace)


def test_points_spans_and_targets_by_hand():
    w = _workload([("A", 0), ("B", 0), ("A", 1), ("C", -1)])
    sk = build_skeleton(w, 0, ["A"])
    # points: send, wait | (B has none) | send, wait | all_reduce, wait
    assert sk.kind == ["p2p", "wait", "p2p", "wait", "collective", "wait"]
    assert sk.op_id == [1, 3, 6, 8, 9, 10]  # A is ops 0-3, B op 4, A 5-8, C 9-10
    assert sk.mb == [0, 0, 1, 1, -1, -1]
    # each wait points at its send; C's wait reaches back into the second A's send (op 6 = point 2)
    assert sk.target == [-1, 0, -1, 2, -1, 2]
    assert sk.coalesced == [0, 1, 2, 3, 4, 5]  # nothing launched together: each its own
    assert sk.num_ops == 11
    # compute before each point: 1; 2; B's 3 s + the second A's 1 s; 2; 0; 0; tail 0
    np.testing.assert_array_equal(sk.spans["A"], [1.0, 2.0, 4.0, 2.0, 0.0, 0.0, 0.0])
    assert sk.phase_compute["A"] == {"fwd": 1.0 + 2.0 + 3.0 + 1.0 + 2.0, "other": 0.0}
    assert sk.sig[0] == sk.sig[2] and sk.sig[0] != sk.sig[4]  # both sends look alike to the network


def test_every_block_with_points_carries_each_tail_onto_the_next_block():
    w = _workload([("A", 0), ("A", 1), ("C", -1)])
    sk = build_skeleton(w, 0, ["A"])
    np.testing.assert_array_equal(sk.spans["A"], [1.0, 2.0, 1.0, 2.0, 0.0, 0.0, 0.0])
    assert sk.target == [-1, 0, -1, 2, -1, 2]


def test_a_wait_on_an_op_that_is_not_a_point_is_an_error():
    trace_blocks = {"A": [comp(1e12), wait(1)]}  # waits on a compute op
    trace = make_trace(1, {}, [([0], trace_blocks, [("A", 0), ("A", 1)])])
    w = toy_workload(trace)
    with pytest.raises(KeyError):
        build_skeleton(w, 0, ["A"])
