"""The clash index and lazy ends of bulk solo batches (replay.holds) against the plain answers."""

from __future__ import annotations

import random

import pytest

from replay.flows import FluidNetwork
from replay.holds import Holds, SoloEnds, end_span
from replay.transfers import FlowSpec, PhaseSpec, TransferSpec, _Group, _ShapeInfo


def shape(links_per_replica: list[tuple[int, ...]], rel: list[float] | None = None) -> _ShapeInfo:
    """A shape whose replica j uses ``links_per_replica[j]`` alone (one group per replica)."""
    rel = rel or [1.0] * len(links_per_replica)
    groups = [_Group((j,), ls, [e], ()) for j, (ls, e) in enumerate(zip(links_per_replica, rel))]
    return _ShapeInfo(list(links_per_replica), groups, len(links_per_replica), None)


def test_clashers_are_the_shapes_sharing_a_link_and_itself():
    h = Holds()
    a, b, c, d = shape([(0, 1), (2,)]), shape([(1,)]), shape([(3,), (4,)]), shape([(2, 3)])
    for s in (a, b, c, d):
        h.register(s)
    assert set(a.clashers) == {a, b, d}  # b on link 1, d on link 2
    assert set(b.clashers) == {a, b}
    assert set(c.clashers) == {c, d}  # d on link 3
    assert set(d.clashers) == {a, c, d}
    h.hold(7, b)
    assert not h.free(a) and h.free(c) and h.free(d)
    h.hold(9, c)
    assert h.colliding(d) == [9] and h.colliding(a) == [7]
    assert h.release(7) is b and b.holder == -1 and h.free(a)


@pytest.mark.parametrize("seed", range(8))
def test_clash_index_answers_what_link_set_intersection_answers(seed):
    rng = random.Random(seed)
    shapes = [shape([tuple(rng.sample(range(40), rng.randint(1, 3))) for _ in range(rng.randint(1, 4))])
              for _ in range(30)]
    h = Holds()
    for s in shapes:
        h.register(s)
    for bid in range(200):  # batch ids increase, as the network's do
        s = rng.choice(shapes)
        plain = [bid for bid, o in h.held.items() if not s.link_set.isdisjoint(o.link_set)]
        assert h.colliding(s) == plain and h.free(s) == (not plain)
        if not plain and s.holder < 0:
            h.hold(bid, s)
        elif h.held and rng.random() < 0.5:
            h.release(rng.choice(list(h.held)))


def test_solo_ends_give_the_written_out_ends_bit_for_bit():
    rng = random.Random(1)
    rel = [rng.uniform(1e-6, 1e-2) for _ in range(192)]
    info = shape([(j,) for j in range(192)], rel)
    for t0 in (0.0, 0.1, 20.662394826906, 1e6 / 3):
        ends = SoloEnds(t0, info)
        plain = [t0 + d for d in rel]
        assert list(ends) == plain and ends[5] == plain[5] and len(ends) == 192 and ends == plain
        assert end_span(ends) == (min(plain), max(plain)) == end_span(plain)
    assert end_span(SoloEnds(1.0, shape([(0,), (1,)], [0.5, 0.25]))) == (1.25, 1.5)


def test_network_reports_bulk_batches_lazily_with_the_same_ends():
    """Two replicas on private links (1e9 B/s) moving 1e9 and 5e8 B, started at 0.5 s: a bulk solo
    batch, reported as SoloEnds equal to [1.5, 1.0]; the plain fluid model gives the same."""
    one = lambda links, n: TransferSpec(phases=(PhaseSpec(flows=(FlowSpec(links=links, nbytes=n),)),))
    specs = [one((0,), 1e9), one((1,), 5e8)]
    got = {}
    for solo in (True, False):
        net = FluidNetwork([1e9, 1e9], solo=solo)
        assert net.start("k", specs, 0.5) == []
        done = []
        while not done:
            _, done = net.step()
        got[solo] = done
    assert type(got[True][0][1]) is SoloEnds
    assert got[True] == got[False] == [("k", [1.5, 1.0])]
