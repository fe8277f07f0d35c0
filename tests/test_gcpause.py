"""heterosim.gcpause.paused_gc: the cyclic collector is off inside and as it was after."""

import gc

import pytest

from heterosim.gcpause import paused_gc


def test_paused_inside_and_restored_after_even_on_error():
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), paused_gc():
        raise ValueError("boom")
    assert gc.isenabled()


def test_nested_and_already_disabled_stay_as_the_caller_set_them():
    with paused_gc():
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_simulate_leaves_the_collector_on():
    from replay.simulate import simulate
    from tests.test_replay_engine import comp, make_trace

    trace = make_trace(8, {}, [(list(range(8)), {"A": [comp(1e12)]}, [("A", 0)])])
    assert simulate(trace, "dgx-a100").iteration_time_s > 0
    assert gc.isenabled()


def test_resuming_moves_the_survivors_to_the_oldest_generation_without_a_collection():
    """After the pause the youngest generation is empty and no collection ran; a cycle made during
    it is still freed by a full collection."""
    import weakref

    runs = []
    cb = lambda phase, info: runs.append(phase)  # noqa: E731
    gc.callbacks.append(cb)
    try:
        with paused_gc():
            keep = [[i] for i in range(50_000)]

            class Node:
                pass

            a = Node()
            a.me = a
            ref = weakref.ref(a)
            del a
        assert gc.get_count()[0] < 700 and runs == []
        gc.collect()
        assert ref() is None and len(keep) == 50_000
    finally:
        gc.callbacks.remove(cb)


def test_as_a_decorator_each_call_pauses_and_resumes():
    @paused_gc()
    def inside():
        return gc.isenabled()

    assert inside() is False and inside() is False and gc.isenabled()
