"""Max-min fair rates of flows sharing links, by progressive filling (a pure function).

Progressive filling: raise all rates together, freeze the flows that cross a saturated link (or
reach their own cap), repeat (Bertsekas & Gallager, *Data Networks*, 2nd ed., section 6.5.2).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["maxmin_rates"]

_REL_TOL = 1e-12
"""Events (and fair-share levels) closer than this, relative, count as equal."""


def maxmin_rates(paths: Sequence[tuple[int, ...]], caps: Sequence[float], capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates (B/s) of flows over ``paths`` by progressive filling.

    Each iteration raises every unfrozen flow to the smallest fair share left on any link (or its
    own cap), then freezes the flows that cross a link saturated at that level.
    """
    nf = len(paths)
    lens = np.fromiter((len(p) for p in paths), dtype=np.int64, count=nf)
    flat = np.fromiter((l for p in paths for l in p), dtype=np.int64, count=int(lens.sum()))
    owner = np.repeat(np.arange(nf), lens)
    ulinks, local = np.unique(flat, return_inverse=True)
    rem = capacity[ulinks].astype(np.float64)
    cap = np.asarray(caps, dtype=np.float64)
    rate = np.zeros(nf)
    active = np.ones(nf, dtype=bool)
    nl = ulinks.size
    while active.any():
        on = active[owner]
        count = np.bincount(local[on], minlength=nl)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(count > 0, rem / np.maximum(count, 1), np.inf)
        level = min(float(share.min()), float(cap[active].min()))
        sat_links = share <= level * (1 + _REL_TOL)
        freeze = np.zeros(nf, dtype=bool)
        hit = on & sat_links[local]
        freeze[owner[hit]] = True
        freeze |= active & (cap <= level * (1 + _REL_TOL))
        rate[freeze] = level
        active &= ~freeze
        took = np.bincount(local[freeze[owner]], minlength=nl) * level
        rem = np.maximum(rem - took, 0.0)
    return rate
