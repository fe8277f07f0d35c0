"""What one run of the fast engine gives: :class:`FastRun`, per-class times for every member rank.

:func:`replay.engine.run_fast` returns it (built by :class:`replay.engine_sim._Sim`);
:func:`replay.simulate.summarize` turns it into a :class:`replay.result.Result`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .expand import CommInstance, RankTimes, RoleSkeleton

__all__ = ["FastRun"]


@dataclass(slots=True, kw_only=True)
class FastRun:
    """Result of :func:`replay.engine.run_fast`: per-class times, reported for every member rank."""

    classes: list[tuple[int, ...]]
    """Ranks of each class (the first is the representative)."""
    class_of: list[int]
    skeletons: dict[int, RoleSkeleton]
    times: list[RankTimes]
    """Per class."""
    point_time: list[np.ndarray]
    """Per class: compute-stream time when each point was reached (after the span before it)."""
    comm_meta: list[list[CommInstance]]
    """Per class, per comm point: the representative's comm instance."""
    blocker: list[dict[int, tuple[int, int]]] = field(default_factory=list)
    """Per class: comm point -> (class, point) of the member that issued it last (it set the start)."""
    symmetry: str = "exact"
    """``exact`` (equals the reference engine) or ``max`` (see :func:`replay.engine.run_fast`)."""
    asymmetric: int = 0
    """``max`` mode: class-level transfers whose replicas ended at different times."""
    max_spread: float = 0.0
    """``max`` mode: largest (slowest - fastest replica) / slowest replica duration."""
    restarts: int = 0
    network_recomputes: int = 0
    periods_skipped: int = 0
    """Steady 1F1B periods advanced in closed form (:mod:`replay.periodic`), 0 if none."""
    folded_transfers: int = 0
    """Class-level transfers run on the network folded by a node shift (:mod:`replay.fold`)."""
    fold: str = "none"
    """``on`` (the network was folded where it could be), ``off`` (a transfer that does not fold
    met folded ones in flight: the run went again unfolded) or ``none`` (the job does not fold)."""

    def rank_times(self, rank: int) -> RankTimes:
        """Times of ``rank`` (those of its class)."""
        return self.times[self.class_of[rank]]
