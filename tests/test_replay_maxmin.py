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
