"""replay.latency: which transfers are latency-bound (hand values at the 1/64 boundary) and the
per-shape cache of their times alone."""

import math

import numpy as np

from replay.latency import LATENCY_BOUND, BoundTimes, latency_bound
from replay.transfers import FlowSpec, PhaseSpec, TransferSpec

CAP = np.array([1e9, 1e8])


def spec(*phases):
    """Phases given as (latency_s, [(links, nbytes[, max_rate]), ...])."""
    return TransferSpec(phases=tuple(PhaseSpec(latency_s=lat, flows=tuple(
        FlowSpec(links=f[0], nbytes=f[1], max_rate_Bps=f[2] if len(f) > 2 else math.inf) for f in flows))
        for lat, flows in phases))


def test_the_bound_is_one_64th_of_the_phase_latency_at_the_narrowest_link():
    """64 us of latency: 1,000 B at 1e9 B/s (1 us, exactly 1/64) is bound, 1,001 B is not; over the
    1e8 B/s link too (the narrowest of the path), 100 B is (1 us) and 101 B is not."""
    assert LATENCY_BOUND == 1 / 64
    assert latency_bound(spec((64e-6, [((0,), 1000.0)])), CAP)
    assert not latency_bound(spec((64e-6, [((0,), 1001.0)])), CAP)
    assert latency_bound(spec((64e-6, [((0, 1), 100.0)])), CAP)
    assert not latency_bound(spec((64e-6, [((0, 1), 101.0)])), CAP)


def test_a_rate_cap_a_later_phase_or_a_phase_without_latency_can_break_it():
    """A 1e7 B/s cap makes 1,000 B take 100 us; the second phase decides as much as the first; a
    phase without latency moving bytes is never bound, one moving none always is."""
    assert not latency_bound(spec((64e-6, [((0,), 1000.0, 1e7)])), CAP)
    assert not latency_bound(spec((64e-6, [((0,), 10.0)]), (64e-6, [((0,), 2000.0)])), CAP)
    assert not latency_bound(spec((0.0, [((0,), 1.0)])), CAP)
    assert latency_bound(spec((0.0, [((0,), 0.0)])), CAP)
    assert latency_bound(spec((64e-6, [((0,), 2000.0)])), CAP, bound=1 / 32)


def test_bound_times_are_per_replica_and_cached_by_shape():
    """Every replica bound: each one's time alone (from ``alone``, asked once per replica and
    shape); one replica not bound: None for the batch."""
    asked = []

    def alone(s):
        asked.append(s)
        return 1.0 + len(asked)

    bt = BoundTimes(CAP, LATENCY_BOUND)
    small, big = spec((64e-6, [((0,), 100.0)])), spec((64e-6, [((0,), 1e6)]))
    shape = object()
    assert bt([small, small], shape, alone) == [2.0, 3.0]
    assert bt([small, small], shape, alone) == [2.0, 3.0] and len(asked) == 2
    assert bt([small, big], object(), alone) is None and len(asked) == 2
