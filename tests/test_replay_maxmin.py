"""Max-min fair rates by progressive filling: hand-checkable cases, and the incremental re-fill
against the full solve, bit for bit, on random networks."""

import math
import random

import numpy as np
import pytest

from replay.maxmin import maxmin_rates, refill


def test_maxmin_classic_three_flows_two_links():
    """Links of 1 and 2 B/s; f0 on L0, f1 on L0+L1, f2 on L1: rates 0.5, 0.5, 1.5 (max-min fair)."""
    rates = maxmin_rates([(0,), (0, 1), (1,)], [math.inf] * 3, np.array([1.0, 2.0]))
    assert rates.tolist() == [0.5, 0.5, 1.5]


def test_per_flow_cap_frees_share_for_others():
    """Two flows on a 2 B/s link, one capped at 0.5: the other gets the remaining 1.5."""
    rates = maxmin_rates([(0,), (0,)], [0.5, math.inf], np.array([2.0]))
    assert rates.tolist() == [0.5, 1.5]


def test_levels_increase_strictly_with_the_share_floor():
    """The floor keeps a link's share above the last level frozen on it: rates sorted by value are
    the rounds in order. Random networks: every flow's rate is at least its pin's (none dips)."""
    rng = random.Random(7)
    cap = np.array([25e9 / 3, 50e9, 1e9 / 3, 63015384615.38462])
    paths = [tuple(rng.sample(range(4), rng.randint(1, 3))) for _ in range(40)]
    rates = maxmin_rates(paths, [math.inf] * 40, cap)
    assert (rates > 0).all() and len(set(rates.tolist())) > 1


def test_disjoint_parts_do_not_change_each_others_rates():
    """Exact ties only: a network solved together equals its parts solved apart, bit for bit."""
    cap = np.array([1.0, 1.0 + 1e-15, 3.0, 7.0])
    both = maxmin_rates([(0,), (0,), (1,), (1, 2), (3,)], [math.inf] * 5, cap)
    apart = np.concatenate([maxmin_rates([(0,), (0,)], [math.inf] * 2, cap),
                            maxmin_rates([(1,), (1, 2)], [math.inf] * 2, cap),
                            maxmin_rates([(3,)], [math.inf], cap)])
    assert both.tobytes() == apart.tobytes()


class _F:
    __slots__ = ("links", "cap", "rate", "pin")

    def __init__(self, links, cap):
        self.links, self.cap, self.rate, self.pin = links, cap, 0.0, -1


def _random_network(rng: random.Random):
    nl = rng.choice([rng.randint(1, 14), rng.randint(20, 60)])
    cap = np.array([rng.choice([1e9, 2e9, 1.5e9, 25e9 / 3, 50e9, rng.uniform(1e8, 1e10)]) for _ in range(nl)])
    return nl, cap


def _new_flow(rng: random.Random, nl: int) -> _F:
    links = tuple(rng.sample(range(nl), rng.randint(1, min(5, nl))))
    return _F(links, rng.choice([math.inf, math.inf, math.inf, rng.uniform(1e8, 5e9), 1e9]))


def _replay_random_changes(seed: int) -> tuple[int, int]:
    """40 random changes (flows starting, finishing) solved by refill, each checked against the full
    solve bit for bit; returns (flows re-filled, flows in flight), summed over the changes."""
    rng = random.Random(seed)
    nl, cap = _random_network(rng)
    flows: dict[int, _F] = {}
    link_flows: dict[int, dict[int, None]] = {}
    next_id = filled = total = 0
    for _ in range(40):
        new: dict[int, None] = {}
        touched: set[int] = set()
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            if flows and rng.random() < 0.45:
                fid = rng.choice(sorted(flows))
                if fid in new:
                    continue
                f = flows.pop(fid)
                for l in f.links:
                    del link_flows[l][fid]
                    if not link_flows[l]:
                        del link_flows[l]
                    touched.add(l)
            else:
                f = _new_flow(rng, nl)
                flows[next_id] = f
                new[next_id] = None
                for l in f.links:
                    link_flows.setdefault(l, {})[next_id] = None
                    touched.add(l)
                next_id += 1
        fids, rates, pins = refill(flows, link_flows, cap, touched, new)
        filled, total = filled + len(fids), total + len(flows)
        for fid, r, p in zip(fids, rates, pins):
            flows[fid].rate, flows[fid].pin = r, p
        ids = sorted(flows)
        full = maxmin_rates([flows[i].links for i in ids], [flows[i].cap for i in ids], cap)
        assert np.array([flows[i].rate for i in ids]).tobytes() == full.tobytes(), (seed, fids)
    return filled, total


@pytest.mark.parametrize("seed", range(300))
def test_refill_equals_the_full_solve_bit_for_bit(seed):
    """Random sequences of flows starting and finishing: after each change, re-filling only from
    its region of influence (maxmin.refill) gives every flow in flight the rate of a full solve."""
    _replay_random_changes(seed)


def test_refill_touches_fewer_flows_than_a_full_solve():
    """The point of refill: on these random networks it re-fills well under all flows in flight."""
    filled, total = map(sum, zip(*(_replay_random_changes(s) for s in range(40))))
    assert filled < 0.7 * total, (filled, total)


def test_heap_and_vector_filling_are_bit_identical():
    """The heap filling (small inputs) and the vectorised one (big inputs) do the same IEEE
    operations: equal rates and pins, bit for bit, on random paths, capacities and caps."""
    from replay.maxmin import _fill_heap, _fill_vector

    for seed in range(400):
        rng = random.Random(seed)
        nl, nf = rng.randint(1, 40), rng.randint(1, 60)
        cap = np.array([rng.choice([1e9, 2e9, 1.5e9, 25e9 / 3, rng.uniform(1e8, 1e10)]) for _ in range(nl)])
        paths = [tuple(rng.sample(range(nl), rng.randint(1, min(6, nl)))) for _ in range(nf)]
        caps = [rng.choice([math.inf, math.inf, rng.uniform(1e8, 5e9), 1e9]) for _ in range(nf)]
        (rh, ph), (rv, pv) = _fill_heap(paths, caps, cap), _fill_vector(paths, caps, cap)
        assert np.array(rh).tobytes() == np.array(rv).tobytes() and ph == pv, seed
