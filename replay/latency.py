"""Latency-bound transfers: priced alone, outside the links' max-min sharing.

A transfer is *latency-bound* when each of its flows, at the narrowest link of its path (or its
rate cap), would move its bytes in at most :data:`LATENCY_BOUND` of its phase's latency: a few-kB
all-reduce, e.g. Transformer Engine's delayed-scaling amax reductions over the tensor x
data-parallel group. :class:`replay.flows.FluidNetwork` prices a batch whose every replica is
latency-bound as if each replica ran alone on idle links: it neither takes bandwidth from the
flows in flight nor yields any to them, and it holds no link (so a replica that does not fold
under the node shift of :mod:`replay.fold` runs beside folded ones).

What that ignores: sharing a link with ``k`` flows, such a flow gets at least ``1/(k+1)`` of it
under max-min fairness (Bertsekas & Gallager, *Data Networks*, 2nd ed., 6.5.2), so its phase is
mispriced by at most ``k x LATENCY_BOUND`` of the latency; each flow it would have slowed loses
under ``LATENCY_BOUND`` of that latency.
"""

from __future__ import annotations

import math
from typing import Callable, Hashable, Sequence

import numpy as np

from .transfers import TransferSpec

__all__ = ["LATENCY_BOUND", "BoundTimes", "latency_bound"]

LATENCY_BOUND = 1 / 64
"""The fraction of a phase's latency below which a flow's bytes count as latency-bound. Measured on
the replay of GPT-3 175B fp8 at 1,024 H100s (``validation/hopper_cases.yaml``): the amax
all-reduces sit at 2^-7 .. 2^-20 of their latency, every bandwidth-bound transfer at 2^-3 or
above, so the rule separates the two with a wide margin on both sides."""


def latency_bound(spec: TransferSpec, capacity: np.ndarray, bound: float = LATENCY_BOUND) -> bool:
    """Whether every flow of ``spec`` moves its bytes, at the narrowest link of its path (or its
    rate cap), in at most ``bound`` x its phase's latency. A phase without latency that moves bytes
    never is; flows of no bytes always are."""
    for ph in spec.phases:
        lim = bound * ph.latency_s
        for f in ph.flows:
            if f.nbytes <= 0:
                continue
            rate = min(min((float(capacity[l]) for l in f.links), default=math.inf), f.max_rate_Bps)
            if f.nbytes > lim * rate:
                return False
    return True


class BoundTimes:
    """``(specs, shape, alone) -> each replica's time alone`` if every replica of the batch is
    latency-bound, else None; cached by ``shape`` (the caller's name for that list of specs, kept
    alive) or the specs' identity. ``alone(spec)`` gives a replica's time alone on idle links."""

    def __init__(self, capacity: np.ndarray, bound: float):
        self.capacity, self.bound = capacity, bound
        self._cache: dict[Hashable, tuple[object, list[float] | None]] = {}

    def __call__(self, specs: Sequence[TransferSpec], shape: Hashable,
                 alone: Callable[[TransferSpec], float]) -> list[float] | None:
        k = id(shape) if shape is not None else tuple(map(id, specs))
        v = self._cache.get(k)
        if v is not None and (v[0] is shape if shape is not None else all(a is b for a, b in zip(v[0], specs))):
            return v[1]
        times = ([alone(sp) for sp in specs]
                 if all(latency_bound(sp, self.capacity, self.bound) for sp in specs) else None)
        self._cache[k] = (shape if shape is not None else tuple(specs), times)
        return times
