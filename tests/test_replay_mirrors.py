"""Mirrored lanes (replay.mirrors): replicas of colliding batches simulated once, bit for bit."""

from __future__ import annotations

import math
import random

import pytest

from replay.flows import FlowSpec, FluidNetwork, PhaseSpec, TransferSpec


def p2p(links, nbytes, latency=0.0):
    return TransferSpec(phases=(PhaseSpec(latency_s=latency, flows=(FlowSpec(links=links, nbytes=nbytes),)),))


def _drain(net: FluidNetwork, until: float = math.inf) -> dict:
    got = {}
    while not net.idle() and net.next_time() <= until:
        _, done = net.step()
        got.update({k: list(e) for k, e in done})
    return got


def _run(events, caps, **kw) -> tuple[dict, FluidNetwork]:
    """Start ``(t, key, specs)`` batches in time order and run the network dry: {key: ends}."""
    net = FluidNetwork(caps, **kw)
    got: dict = {}
    for t, key, specs in events:
        got.update(_drain(net, t))
        got.update({k: list(e) for k, e in net.start(key, specs, t, shape=specs if net.solo_enabled else None)})
    got.update(_drain(net))
    return got, net


def test_two_replicas_of_two_colliding_p2p_share_their_nic_link_as_one_lane():
    """Lane r (r = 0, 1): A sends 1e9 B over (nic_r, x_r) from t = 0, B sends 1e9 B over (nic_r,
    y_r) from t = 0.2; every link moves 1e9 B/s. A runs alone for 0.2 s (0.2e9 B), then both get
    half the NIC: A's last 0.8e9 B take 1.6 s (ends 1.8), B has then moved 0.8e9 B and its last
    0.2e9 B take 0.2 s alone (ends 2.0). Lane 1 is lane 0 with its links renamed: the mirror runs
    lane 0 only, and gives the fluid model's end times bit for bit."""
    nic, x, y = (0, 1), (2, 3), (4, 5)
    a = [p2p((nic[r], x[r]), 1e9) for r in range(2)]
    b = [p2p((nic[r], y[r]), 1e9) for r in range(2)]
    events = [(0.0, "A", a), (0.2, "B", b)]
    net = FluidNetwork([1e9] * 6)
    net.start("A", a, 0.0, shape=a)
    _drain(net, 0.2)
    net.start("B", b, 0.2, shape=b)
    assert len(net._flows) == 2  # lane 0's two flows stand for four
    assert net.mirrored_batches == 1
    mirrored, _ = _run(events, [1e9] * 6)
    plain, _ = _run(events, [1e9] * 6, mirror=False)
    fluid, _ = _run(events, [1e9] * 6, solo=False)
    assert mirrored == plain  # bit for bit
    assert mirrored["A"] == [pytest.approx(1.8, rel=1e-12)] * 2
    assert mirrored["B"] == [pytest.approx(2.0, rel=1e-12)] * 2
    assert fluid["A"] == pytest.approx(mirrored["A"], rel=1e-12)
    assert fluid["B"] == pytest.approx(mirrored["B"], rel=1e-12)


def test_a_third_batch_joins_the_mirror_and_one_that_breaks_the_lanes_unfolds_it():
    """C (aligned, on x_r) joins the lanes of A and B; D hits lane 1 only, so the mirror unfolds
    into real flows: every end time stays the plain model's, bit for bit."""
    nic, x, y = (0, 1), (2, 3), (4, 5)
    a = [p2p((nic[r], x[r]), 1e9) for r in range(2)]
    b = [p2p((nic[r], y[r]), 1e9, latency=0.01) for r in range(2)]
    c = [p2p((x[r],), 5e8) for r in range(2)]
    d = [p2p((y[1],), 3e8)]
    events = [(0.0, "A", a), (0.2, "B", b), (0.5, "C", c), (0.9, "D", d)]
    mirrored, net = _run(events, [1e9] * 6)
    plain, _ = _run(events, [1e9] * 6, mirror=False)
    assert net.mirrored_batches == 2
    assert mirrored == plain
    assert not net._mirror_of and not net._reserved


def test_a_batch_touching_two_mirrors_merges_them():
    """Two mirrors on disjoint links of the same lanes (A with B, E with F); G touches both in
    every lane, so they become one: still the plain model's end times, bit for bit."""
    lanes = [tuple(range(8 * r, 8 * r + 8)) for r in range(3)]
    a = [p2p((ls[0], ls[1]), 1e9) for ls in lanes]
    b = [p2p((ls[0], ls[2]), 6e8) for ls in lanes]
    e = [p2p((ls[4], ls[5]), 8e8) for ls in lanes]
    f = [p2p((ls[4], ls[6]), 4e8) for ls in lanes]
    g = [p2p((ls[1], ls[5]), 5e8) for ls in lanes]
    events = [(0.0, "A", a), (0.0, "E", e), (0.1, "B", b), (0.15, "F", f), (0.3, "G", g)]
    mirrored, net = _run(events, [1e9] * 24)
    plain, _ = _run(events, [1e9] * 24, mirror=False)
    assert net.mirrored_batches == 3
    assert mirrored == plain


def _lane_events(seed: int) -> tuple[list, list[float]]:
    """Random batches over ``n`` lanes of 4 links each (one shared NIC link per lane, private
    links, random lengths, latencies and phases); some batches replicate over every lane, some hit
    one lane or span two (they unfold the mirrors they touch)."""
    rng = random.Random(seed)
    n, per = rng.randint(2, 4), 4

    def template():
        return [(rng.choice([0.0, 0.0, 0.02]),
                 [(tuple(sorted(rng.sample(range(per), rng.randint(1, 2)))), rng.choice([1e8, 3e8, 1e9]))
                  for _ in range(rng.randint(1, 2))])
                for _ in range(rng.randint(1, 2))]

    def spec(tpl, lane):
        return TransferSpec(phases=tuple(PhaseSpec(latency_s=lat, flows=tuple(
            FlowSpec(links=tuple(lane * per + l for l in ls), nbytes=nb) for ls, nb in flows)) for lat, flows in tpl))

    shapes = []
    for _ in range(6):
        tpl = template()
        shapes.append([spec(tpl, r) for r in range(n)])
    for _ in range(2):  # strays: one lane, or one replica on two lanes
        tpl = template()
        lanes = rng.sample(range(n), 2)
        stray = spec(tpl, lanes[0])
        if rng.random() < 0.5:
            stray = TransferSpec(phases=stray.phases + spec(template(), lanes[1]).phases)
        shapes.append([stray])
    events = sorted((rng.uniform(0, 4), i, shapes[rng.randrange(len(shapes))]) for i in range(16))
    caps = [rng.choice([1e9, 2e9]) for _ in range(per)] * n
    return events, caps


@pytest.mark.parametrize("seed", range(24))
def test_mirrors_give_the_fast_paths_end_times_bit_for_bit_on_random_lanes(seed):
    """Random replicated batches: mirrors on and off give the same end times, bit for bit, and the
    plain fluid model's to 1e-9."""
    events, caps = _lane_events(seed)
    mirrored, net = _run(events, caps)
    plain, _ = _run(events, caps, mirror=False)
    fluid, _ = _run(events, caps, solo=False)
    assert mirrored == plain
    for k in fluid:
        assert mirrored[k] == pytest.approx(fluid[k], rel=1e-9)
    assert not net._mirror_of and not net._transfers


def test_mirrors_are_used_on_random_lanes():
    """The random lanes above do collide in mirrors (the test is not vacuous)."""
    assert sum(_run(*_lane_events(seed))[1].mirrored_batches for seed in range(24)) > 20


@pytest.mark.parametrize("pp, vpp, dp, tp, cluster", [(4, 2, 8, 2, "dgx-h100"), (4, 3, 4, 4, "dgx-h100"),
                                                    (2, 3, 8, 2, "dgx-a100")])
def test_engine_results_are_the_same_without_mirrors(monkeypatch, pp, vpp, dp, tp, cluster):
    """Interleaved pipelines (2 micro-batches per stage): the fast engine's result is the same with
    and without mirrors, bit for bit, its p2p exchanges ran in mirrors, and it equals the
    reference engine to 1e-9."""
    import sys
    from pathlib import Path

    import replay.engine_sim as engine_sim
    from replay.simulate import simulate

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_replay import Shape, synth_trace

    m = 2 * pp
    trace = synth_trace(Shape("tiny", pp * vpp, 256, 4, 4, 1024, 512, 128, tp, pp, dp, dp * m, cluster, vpp=vpp))
    made: list[FluidNetwork] = []

    def network(mirror):
        def make(cap, **kw):
            made.append(FluidNetwork(cap, mirror=mirror, **kw))
            return made[-1]
        return make

    out = {}
    for mirror in (True, False):
        monkeypatch.setattr(engine_sim, "FluidNetwork", network(mirror))
        out[mirror] = simulate(trace, cluster).to_dict()
    assert sum(net.mirrored_batches for net in made[:1]) > 0
    assert out[True] == out[False]
    ref = simulate(trace, cluster, engine="reference")
    assert out[True]["iteration_time_s"] == pytest.approx(ref.iteration_time_s, rel=1e-9)
