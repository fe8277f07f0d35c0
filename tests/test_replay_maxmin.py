"""Max-min fair rates by progressive filling, on hand-checkable cases."""

import math

import numpy as np

from replay.maxmin import maxmin_rates


def test_maxmin_classic_three_flows_two_links():
    """Links of 1 and 2 B/s; f0 on L0, f1 on L0+L1, f2 on L1: rates 0.5, 0.5, 1.5 (max-min fair)."""
    rates = maxmin_rates([(0,), (0, 1), (1,)], [math.inf] * 3, np.array([1.0, 2.0]))
    np.testing.assert_allclose(rates, [0.5, 0.5, 1.5])


def test_per_flow_cap_frees_share_for_others():
    """Two flows on a 2 B/s link, one capped at 0.5: the other gets the remaining 1.5."""
    rates = maxmin_rates([(0,), (0,)], [0.5, math.inf], np.array([2.0]))
    np.testing.assert_allclose(rates, [0.5, 1.5])


def test_heap_and_vector_filling_are_bit_identical():
    """The event-driven filling (small components) and the vectorised one (big components) do the
    same IEEE operations: equal bit for bit on random paths, capacities and caps."""
    import random

    from replay.maxmin import _filling_heap, _filling_vector

    for seed in range(400):
        rng = random.Random(seed)
        nl, nf = rng.randint(1, 12), rng.randint(1, 30)
        cap = np.array([rng.choice([1e9, 2e9, 1.5e9, 25e9 / 3, rng.uniform(1e8, 1e10)]) for _ in range(nl)])
        paths = [tuple(rng.sample(range(nl), rng.randint(1, min(4, nl)))) for _ in range(nf)]
        caps = [rng.choice([math.inf, math.inf, rng.uniform(1e8, 5e9), 1e9]) for _ in range(nf)]
        assert _filling_heap(paths, caps, cap).tobytes() == _filling_vector(paths, caps, cap).tobytes(), seed

