"""Max-min fair link sharing (replay.flows): hand-computed rates and completion times."""

from __future__ import annotations

import math

import numpy as np
import pytest

from heterosim.errors import ReplayError
from replay.flows import FlowSpec, FluidNetwork, PhaseSpec, TransferSpec, solo_time


def one(links, nbytes, latency=0.0, cap=math.inf):
    return TransferSpec(phases=(PhaseSpec(latency_s=latency, flows=(FlowSpec(links=links, nbytes=nbytes, max_rate_Bps=cap),)),))


def run_all(net, items, t=0.0):
    """Start single-transfer batches at t and run the network dry; returns {key: completion time}."""
    out = {}
    for key, spec in items:
        out.update({k: ends[0] if ends else t for k, ends in net.start(key, [spec], t)})
    while not net.idle():
        t, done = net.step()
        out.update({k: ends[0] for k, ends in done})
    return out


def test_single_flow_time_is_latency_plus_bytes_over_bandwidth():
    """1e9 B over a 1e9 B/s link after 1 ms of latency: 1.001 s."""
    assert solo_time(one((0,), 1e9, latency=1e-3), [1e9]) == pytest.approx(1.001, rel=1e-12)


def test_two_flows_on_one_link_each_get_half():
    """Two transfers of 1e9 B sharing a 1e9 B/s link (a NIC) both finish at 2 s."""
    net = FluidNetwork([1e9, 5e9])
    assert run_all(net, [("a", one((0, 1), 1e9)), ("b", one((0,), 1e9))]) == {"a": 2.0, "b": 2.0}


def test_short_flow_finishing_frees_bandwidth():
    """0.5e9 B and 1e9 B share 1e9 B/s: the short one ends at 1 s, the long one at 1.5 s."""
    net = FluidNetwork([1e9])
    assert run_all(net, [("s", one((0,), 0.5e9)), ("l", one((0,), 1e9))]) == {"s": 1.0, "l": 1.5}


def test_late_arrival_slows_a_running_flow():
    """A 1e9 B flow alone for 0.5 s, then shared with a second: ends at 0.5 + 0.5e9/0.5e9 = 1.5 s."""
    for solo in (True, False):
        net = FluidNetwork([1e9], solo=solo)
        net.start("a", [one((0,), 1e9)], 0.0)
        net.start("b", [one((0,), 1e9)], 0.5)
        done = {}
        while not net.idle():
            t, got = net.step()
            done.update({k: ends[0] for k, ends in got})
        assert done == {"a": pytest.approx(1.5), "b": pytest.approx(2.0)}


def test_phases_run_in_sequence_with_their_latencies():
    """Two phases of (1 us + 1 s): 2.000002 s; a per-flow cap of 0.25e9 B/s makes a phase 4 s."""
    ph = PhaseSpec(latency_s=1e-6, flows=(FlowSpec(links=(0,), nbytes=1e9),))
    assert solo_time(TransferSpec(phases=(ph, ph)), [1e9]) == pytest.approx(2.000002, rel=1e-12)
    assert solo_time(one((0,), 1e9, cap=0.25e9), [1e9]) == pytest.approx(4.0)


def test_empty_and_zero_byte_transfers_complete_at_once():
    """No phases, or zero-byte flows: complete at the start time."""
    net = FluidNetwork([1e9])
    assert net.start("e", [TransferSpec()], 3.0) == [("e", [3.0])]
    assert net.start("z", [one((0,), 0)], 3.0) == [("z", [3.0])]


def test_disjoint_components_are_solved_separately():
    """Flows on disjoint links do not disturb each other's completion times."""
    net = FluidNetwork([1e9, 2e9])
    assert run_all(net, [("a", one((0,), 1e9)), ("b", one((1,), 1e9))]) == {"a": 1.0, "b": 0.5}


def test_bad_capacities_and_time_travel_are_errors():
    """Non-positive capacities and starting a transfer in the past are refused."""
    with pytest.raises(ReplayError, match="positive bytes/s"):
        FluidNetwork([1e9, 0.0])
    net = FluidNetwork([1e9])
    net.start("a", [one((0,), 1e9)], 0.0)
    net.step()
    with pytest.raises(ReplayError, match="before its time"):
        net.start("b", [one((0,), 1.0)], 0.5)


def test_solo_batches_materialize_exactly():
    """A solo batch (two link-disjoint transfers) hit mid-flight by a third equals the pure fluid run."""
    ph = lambda links, n, lat=0.0: TransferSpec(phases=(PhaseSpec(latency_s=lat, flows=(FlowSpec(links=links, nbytes=n),)),
                                                        PhaseSpec(flows=(FlowSpec(links=links, nbytes=n / 2),))))
    out = {}
    for solo in (True, False):
        net = FluidNetwork([1e9, 2e9, 1e9], solo=solo)
        got = {}
        net.start("ab", [ph((0,), 1e9, 1e-3), ph((1,), 1e9)], 0.0)
        t = 0.0
        while net.next_time() < 0.7:
            t, done = net.step()
            got.update(dict(done))
        net.start("c", [ph((0, 2), 1e9)], 0.7)
        while not net.idle():
            t, done = net.step()
            got.update(dict(done))
        out[solo] = got
    assert out[True].keys() == out[False].keys() == {"ab", "c"}
    for k in out[True]:
        np.testing.assert_allclose(out[True][k], out[False][k], rtol=1e-12)
    # ab[1] alone: 1e9/2e9 + 0.5e9/2e9 = 0.75 s; ab[0]: 1 ms + 0.699 s alone, then shares link 0.
    assert out[True]["ab"][1] == pytest.approx(0.75)


def test_link_sharing_replicas_run_as_one_solo_group():
    """Replicas sharing a link form a group: alone they split it (2 s each); a later transfer on
    that link materializes the group; every end time equals the plain fluid model's."""
    out = {}
    for solo in (True, False):
        net = FluidNetwork([1e9, 1e9, 1e9], solo=solo)
        got = {}
        net.start("pair", [one((0, 1), 1e9), one((0, 2), 1e9), one((2,), 0.5e9)], 0.0)
        while net.next_time() < 1.0:
            _, done = net.step()
            got.update(dict(done))
        net.start("late", [one((1,), 1e9)], 1.0)
        while not net.idle():
            _, done = net.step()
            got.update(dict(done))
        out[solo] = got
    for k in ("pair", "late"):
        np.testing.assert_allclose(out[True][k], out[False][k], rtol=1e-12)
    assert FluidNetwork([1e9, 1e9, 1e9]).start("x", [one((0,), 1e9)], 0.0) == []


def _drain(net: FluidNetwork, until: float = math.inf) -> dict:
    got = {}
    while not net.idle() and net.next_time() <= until:
        _, done = net.step()
        got.update(dict(done))
    return got


def test_solo_batch_never_starts_on_a_link_a_fluid_transfer_reserved():
    """A fluid transfer waiting out its latency holds no flows yet, but its links stay reserved:
    a later batch on one of them must share with it (as the plain fluid model does), not run solo."""
    one = lambda links, n, lat=0.0: TransferSpec(phases=(PhaseSpec(latency_s=lat, flows=(FlowSpec(links=links, nbytes=n),)),))
    out = {}
    for solo in (True, False):
        net = FluidNetwork([1e9, 1e9], solo=solo)
        got = {}
        net.start("x", [one((0,), 1e9)], 0.0)  # solo on link 0
        got.update(_drain(net, 0.1))
        net.start("a", [one((0, 1), 1e8, lat=0.2)], 0.1)  # collides with x: fluid, 0.2 s latency
        net.start("b", [one((1,), 3e8)], 0.15)  # link 1 has no flow yet, but a will use it at 0.3
        got.update(_drain(net))
        out[solo] = got
    for k in ("x", "a", "b"):
        np.testing.assert_allclose(out[True][k], out[False][k], rtol=1e-12)
    # b moves 1.5e8 B alone (0.15 .. 0.3); a (1e8 B) and b share link 1 at 0.5e9 B/s until a ends
    # at 0.5; b's last 0.5e8 B take 0.05 s alone: 0.55 (0.45 if it had wrongly run solo).
    assert out[True]["b"] == [pytest.approx(0.55)]
    assert out[True]["a"] == [pytest.approx(0.5)]


def test_bulk_solo_batch_is_demoted_when_hit():
    """Whole-batch solo runs hold their links by shape; a colliding batch demotes and materializes
    only the group it hits, and the result equals the plain fluid model."""
    one = lambda links, n: TransferSpec(phases=(PhaseSpec(flows=(FlowSpec(links=links, nbytes=n),)),))
    out, solos = {}, {}
    for solo in (True, False):
        net = FluidNetwork([1e9] * 4, solo=solo)
        got = {}
        net.start("ab", [one((0,), 1e9), one((1,), 1e9)], 0.0)
        net.start("cd", [one((2,), 1e9), one((3,), 5e8)], 0.0)  # disjoint from ab: bulk solo too
        got.update(_drain(net, 0.2))
        net.start("e", [one((1,), 1e9)], 0.2)  # hits ab's second replica only
        got.update(_drain(net))
        out[solo], solos[solo] = got, net.solo_batches
    for k in ("ab", "cd", "e"):
        np.testing.assert_allclose(out[True][k], out[False][k], rtol=1e-12)
    assert out[True]["ab"] == pytest.approx([1.0, 1.8])  # 0.2 s alone, then 0.8e9 B at half rate: 1.6 s more
    assert out[True]["e"] == [pytest.approx(2.0)]  # 0.8e9 B at half rate, then 0.2e9 B alone
    assert solos[True] == 2  # cd, and ab whose first replica stayed solo, end on the fast path


def random_batches(seed: int) -> dict:
    """{solo: {batch key: ends}} for random batches run with the fast path on and off."""
    import random

    rng = random.Random(seed)
    nlinks = 8

    def spec():
        return TransferSpec(phases=tuple(
            PhaseSpec(latency_s=rng.choice([0.0, 0.0, 0.05]),
                      flows=tuple(FlowSpec(links=tuple(rng.sample(range(nlinks), rng.randint(1, 2))),
                                           nbytes=rng.choice([0.0, 1e8, 3e8, 1e9]),
                                           max_rate_Bps=rng.choice([math.inf, math.inf, 5e8]))
                                  for _ in range(rng.randint(1, 2))))
            for _ in range(rng.randint(1, 2))))

    shapes = [[spec() for _ in range(rng.randint(1, 3))] for _ in range(5)]
    starts = sorted((rng.uniform(0, 3), i, rng.randrange(len(shapes))) for i in range(14))
    caps = [rng.choice([1e9, 2e9]) for _ in range(nlinks)]
    out = {}
    for solo in (True, False):
        net = FluidNetwork(caps, solo=solo)
        got: dict = {}
        for t, i, s in starts:
            got.update(_drain(net, t))
            got.update(dict(net.start(i, shapes[s], t, shape=shapes[s] if solo else None)))
        got.update(_drain(net))
        out[solo] = got
    assert out[True].keys() == out[False].keys() == {i for _, i, _ in starts}
    return out


@pytest.mark.parametrize("seed", range(16))
def test_fast_path_equals_plain_fluid_on_random_batches(seed):
    """Random batches (reused shapes, latencies, several phases, shared and private links) started at
    random times: the fast path (bulk solo, demotion, reservations, materialization) ends every
    transfer when the plain fluid model does, to 1e-9."""
    out = random_batches(seed)
    for k in out[False]:
        np.testing.assert_allclose(out[True][k], out[False][k], rtol=1e-9)


def test_group_state_snapshots_equal_a_fresh_replay():
    """The cached per-step states of a group's solo run give, for any dt in any order, exactly
    (bit for bit) the state a fresh replay of the group up to dt reaches."""
    specs = (TransferSpec(phases=(PhaseSpec(latency_s=1e-3, flows=(FlowSpec(links=(0, 1), nbytes=3e8),
                                                                    FlowSpec(links=(1,), nbytes=1e8))),
                                  PhaseSpec(flows=(FlowSpec(links=(2,), nbytes=2e8),)))),
             one((1, 2), 5e8))
    net = FluidNetwork([1e9, 2e9, 1e9])
    info = net._shape(list(specs))
    (g,) = info.groups

    def fresh(dt):
        scratch = FluidNetwork([1e9, 2e9, 1e9], solo=False)
        scratch.start(0, list(specs), 0.0)
        while scratch.next_time() <= dt:
            scratch.step()
        return scratch

    for dt in (0.9, 0.0, 0.2, 1e-3, 0.9, 0.35, 5.0):
        ref = fresh(dt)
        got = net._group_state(g, dt)
        assert set(got) == {tr.key[1] for tr in ref._transfers.values()}
        for tid, tr in ref._transfers.items():
            phase, t_start, flows = got[tr.key[1]]
            assert phase == tr.phase
            assert (t_start == ref._pending_start[tid]) if tid in ref._pending_start else math.isnan(t_start)
            assert sorted(flows) == sorted((f.links, f.remaining, f.rate, f.cap, f.t_last)
                                           for f in ref._flows.values() if f.tid == tid)


class _FullSolveNetwork(FluidNetwork):
    """The network with every solve a full progressive filling of all flows in flight."""

    def _solve(self, touched):
        from replay.maxmin import _fill

        fids = sorted(self._flows)
        rates, pins = _fill([self._flows[f].links for f in fids], [self._flows[f].cap for f in fids], self.capacity)
        return fids, rates, pins


@pytest.mark.parametrize("seed", range(12))
def test_incremental_solves_give_the_full_solves_end_times_bit_for_bit(seed):
    """Random multi-phase transfers with caps and latencies, started at random times on shared
    links: re-filling only each event's region of influence ends every transfer at exactly the
    times full solves give (same rates at every event, hence the same events)."""
    import random

    rng = random.Random(seed)
    nl = rng.randint(4, 30)
    cap = [rng.choice([1e9, 2e9, 25e9 / 3, 50e9, rng.uniform(1e8, 1e10)]) for _ in range(nl)]
    work = []
    for k in range(rng.randint(5, 25)):
        phases = tuple(PhaseSpec(latency_s=rng.choice([0.0, 1e-6, 3e-5]), flows=tuple(
            FlowSpec(links=tuple(rng.sample(range(nl), rng.randint(1, min(5, nl)))), nbytes=rng.uniform(1e6, 1e9),
                     max_rate_Bps=rng.choice([math.inf, math.inf, rng.uniform(1e8, 5e9)]))
            for _ in range(rng.randint(1, 4)))) for _ in range(rng.randint(1, 3)))
        work.append((rng.uniform(0, 0.5), f"t{k}", TransferSpec(phases=phases)))
    work.sort()
    out = []
    for net in (FluidNetwork(cap, solo=False), _FullSolveNetwork(cap, solo=False)):
        got, queue = {}, list(work)
        while queue or not net.idle():
            if queue and queue[0][0] <= net.next_time():
                t, key, spec = queue.pop(0)
                got.update(dict(net.start(key, [spec], t)))
            else:
                got.update(dict(net.step()[1]))
        out.append(got)
    assert out[0].keys() == {k for _, k, _ in work}
    assert out[0] == out[1]


def test_big_groups_run_fluid_after_their_first_materialization(monkeypatch):
    """A group over the snapshot limit (here: any) is replayed when first hit, then its shape starts
    it as fluid flows; every end equals the pure fluid run's."""
    import replay.flows as flows_mod

    monkeypatch.setattr(flows_mod, "_SOLO_MAX_FLOWS", 0)
    ab = [one((0,), 1e9), one((1,), 1e9)]
    c = [one((0, 2), 1e9)]
    out = {}
    for solo in (True, False):
        net = FluidNetwork([1e9, 2e9, 1e9], solo=solo)
        got = {}
        for k, t0 in enumerate((0.0, 10.0)):
            net.start(f"ab{k}", ab, t0, shape="ab")
            while net.next_time() < t0 + 0.5:
                got.update(dict(net.step()[1]))
            net.start(f"c{k}", c, t0 + 0.5, shape="c")
            while not net.idle():
                got.update(dict(net.step()[1]))
        out[solo] = got
        if solo:
            info = net._shape_info[id("ab")]
            assert [g.fluid for g in info.groups] == [True, False] and not info.simple
    assert out[True].keys() == out[False].keys() == {"ab0", "c0", "ab1", "c1"}
    for k in out[True]:
        np.testing.assert_allclose(out[True][k], out[False][k], rtol=1e-12)


def test_a_pooled_uplink_that_cannot_saturate_changes_no_time():
    """Links 0-3: four NICs up (1 GB/s each), 4-7: four NICs down, 8: a leaf's pooled uplink of
    4 GB/s that every flow also crosses. The NICs cannot send more than 4 GB/s together, so the pool
    never limits anyone: leaving it out of the paths (what ``Network.never_binding`` allows) gives
    the same completion times. Hand check: flows 0->4 and 1->4 share NIC-down 4 (0.5 GB/s each,
    2 GB each -> 4 s), flow 2->5 runs alone at 1 GB/s (3 GB -> 3 s)."""
    rng = np.random.default_rng(7)
    cap = [1e9] * 8 + [4e9]
    flows = [(0, 4, 2e9), (1, 4, 2e9), (2, 5, 3e9)] + [
        (int(rng.integers(4)), 4 + int(rng.integers(4)), float(rng.uniform(1e8, 3e9))) for _ in range(20)]
    with_pool = run_all(FluidNetwork(cap), [(i, one((a, 8, b), n)) for i, (a, b, n) in enumerate(flows[:3])])
    assert with_pool == {0: pytest.approx(4.0), 1: pytest.approx(4.0), 2: pytest.approx(3.0)}
    for solo in (True, False):
        a = run_all(FluidNetwork(cap, solo=solo), [(i, one((x, 8, y), n)) for i, (x, y, n) in enumerate(flows)])
        b = run_all(FluidNetwork(cap, solo=solo), [(i, one((x, y), n)) for i, (x, y, n) in enumerate(flows)])
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-12) for k in a)


def _big_then_small(small_bytes, solo, **kw):
    """A 1e9 B transfer on a 1e9 B/s link from 0 s; at 0.5 s one of ``small_bytes`` after 100 us of
    latency on the same link. Returns {key: end}."""
    net = FluidNetwork([1e9], solo=solo, **kw)
    net.start("big", [one((0,), 1e9)], 0.0)
    while net.next_time() < 0.5:
        net.step()
    net.start("small", [one((0,), small_bytes, latency=1e-4)], 0.5)
    done = {}
    while not net.idle():
        done.update({k: ends[0] for k, ends in net.step()[1]})
    return done


@pytest.mark.parametrize("solo", [True, False])
def test_a_latency_bound_transfer_is_priced_alone_and_takes_no_bandwidth(solo):
    """1 kB at 1e9 B/s is 1 us, 1/100 of its 100 us latency (<= 1/64): it ends at its time alone,
    0.5 + 1e-4 + 1e-6 s, and the 1e9 B transfer still ends at 1 s."""
    assert _big_then_small(1e3, solo) == {"small": pytest.approx(0.500101, rel=1e-12), "big": pytest.approx(1.0, rel=1e-12)}


@pytest.mark.parametrize("solo", [True, False])
def test_a_transfer_above_the_latency_bound_shares_the_link(solo):
    """10 kB is 10 us, 1/10 of the latency: from 0.5001 s both flows get 0.5e9 B/s, so the small one
    takes 20 us (ends 0.50012 s) and the big one ends 10 us late (1.00001 s). With the bound off
    (``latency_bound=0``) the 1 kB transfer shares too: 2 us, the big one 1 us late."""
    assert _big_then_small(1e4, solo) == {"small": pytest.approx(0.50012, rel=1e-12), "big": pytest.approx(1.00001, rel=1e-12)}
    assert _big_then_small(1e3, solo, latency_bound=0) == {"small": pytest.approx(0.500102, rel=1e-12),
                                                        "big": pytest.approx(1.000001, rel=1e-12)}


def test_a_batch_is_latency_bound_only_when_every_replica_is():
    """Each replica's time alone (1 kB on a 1e9 B/s link after 100 us; the same on a 1e8 B/s link
    is 10 us, 1/10 of the latency: not bound); a flow capped at 1e7 B/s (100 us) is not bound
    either; a phase without latency moving bytes never is."""
    net = FluidNetwork([1e9, 1e8])
    small = one((0,), 1e3, latency=1e-4)
    assert net.latency_bound_times([small, small]) == [pytest.approx(1.01e-4, rel=1e-12)] * 2
    assert net.latency_bound_times([small, one((1,), 1e3, latency=1e-4)]) is None
    assert net.latency_bound_times([one((0,), 1e3, latency=1e-4, cap=1e7)]) is None
    assert net.latency_bound_times([one((0,), 1.0)]) is None
    assert FluidNetwork([1e9], latency_bound=0).latency_bound_times([small]) is None
