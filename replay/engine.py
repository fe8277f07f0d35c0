"""The fast engine: the reference engine's semantics, run once per class of equivalent ranks.

Ranks of one role on the same GPU type, whose groups hold ranks of the same classes and whose
p2p peers are of the same class, run the same ops at the same times: the engine simulates one
representative per *class* (found by colour refinement, Weisfeiler-Lehman style, over the process
groups) and reports its times for every member. The network still carries every replica of every
transfer (the 16 DP copies of a TP all-reduce are 16 transfers) so link sharing stays exact. If
replicas of one class-level transfer end at different times (the network is not symmetric for
them), ``symmetry="exact"`` splits the classes by that outcome and restarts, so the answer equals
the per-rank reference (:mod:`replay.reference`); ``"max"`` lets all replicas end with the slowest;
``"auto"`` (default) is exact within a class budget, then max (see :func:`run_fast`).

Compute between two comm / wait ops is one *span*: its length comes from prefix sums of the
block's prices (one ``price_block`` per distinct (block, GPU type)), computed with the array
namespace of :mod:`replay.backend`. With ``w.overlap_slowdown > 0`` a span runs at ``1 - F`` speed
while a comm op of the class is in flight and ends at an event (the reference's rule, see
:mod:`replay.reference`), instead of being added up ahead of time.

This module chooses the classes and the symmetry mode; :mod:`replay.engine_sim` runs one pass.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from heterosim.errors import ReplayError

from .engine_sim import _Asymmetric, _Sim, _Unfold
from .expand import RoleSkeleton, Workload, rank_classes
from .fastrun import FastRun

__all__ = ["FastRun", "run_fast"]


def run_fast(w: Workload, *, xp: Any = np, progress: Callable[[int], None] | None = None,
             symmetry: str = "auto", max_classes: int | None = None, max_restarts: int = 16,
             periodic: bool = True) -> FastRun:
    """Simulate ``w`` class by class.

    ``symmetry``:

    - ``exact``: split classes until every replica of every class-level transfer ends at the same
      time; then the result equals :func:`replay.reference.run_reference` for every rank. It can
      end with one class per rank (slow for big jobs) when the network is irregular (ECMP
      collisions, uneven links).
    - ``max``: keep the classes found from the program and GPU types; replicas that end at
      different times all end at the slowest one (a collective's replicas are usually bound
      together by later DP / pipeline synchronisation anyway). ``FastRun.asymmetric`` counts these
      transfers and their largest relative spread.
    - ``auto`` (default): ``exact`` while it needs at most ``max_classes`` classes (default
      max(64, 4 x the starting classes)) and ``max_restarts`` restarts, else ``max``.

    ``periodic``: advance a repeating steady 1F1B phase by whole periods (:mod:`replay.periodic`;
    an approximation within 1e-9 of the iteration time, tested); False simulates every event.

    With ``w._cache["fold"]`` (:func:`replay.simulate.build_workload` sets it where the job folds),
    the network runs folded by a node shift (:mod:`replay.fold`); ``FastRun.fold`` says whether it
    stayed so.
    """
    if symmetry not in ("exact", "max", "auto"):
        raise ReplayError(f"unknown symmetry mode {symmetry!r}; valid: exact, max, auto")
    trace = w.trace
    world = trace.world_size
    skeletons: dict[int, RoleSkeleton] = {}
    base = rank_classes(trace, w.gpu_type, [() for _ in range(world)])
    fold = [True]

    def sim(class_of: list[int], **kw: Any) -> FastRun:
        # A transfer that does not fold meeting folded ones in flight: run again, unfolded.
        if fold[0]:
            try:
                return _Sim(w, class_of, skeletons, xp, periodic=periodic, fold=True, **kw).run(progress)
            except _Unfold:
                fold[0] = False
        run = _Sim(w, class_of, skeletons, xp, periodic=periodic, fold=False, **kw).run(progress)
        if w.link_sharing and w._cache.get("fold") is not None:
            run.fold = "off"
        return run

    if symmetry == "max":
        return sim(base, exact=False)
    if symmetry == "exact":
        max_restarts = world
    limit = world if symmetry == "exact" else (max_classes or max(64, 4 * (max(base) + 1)))
    refiner = _Refiner(w, limit, max_restarts)
    class_of = base
    while True:
        try:
            run = sim(class_of, exact=True, refine=refiner.split)
        except _Asymmetric as e:
            refiner.restarts += 1
            class_of = e.class_of
            continue
        run.restarts = refiner.restarts
        return run


class _Refiner:
    """Splits classes by how the replicas of a transfer ended (``exact`` mode), within the limits:
    at most ``limit`` classes and ``max_restarts`` restarts."""

    def __init__(self, w: Workload, limit: int, max_restarts: int) -> None:
        self.w = w
        self.limit = limit
        self.max_restarts = max_restarts
        self.restarts = 0
        self.extra: list[tuple] = [() for _ in range(w.trace.world_size)]
        """Per rank, the index of its replica group at each split so far (colour refinement input)."""

    def split(self, groups: list[list[int]]) -> list[int] | None:
        """The classes of ranks refined by ``groups`` (ranks whose replicas ended together, earliest
        first), or None to go on in ``max`` mode past the limits."""
        new_extra = list(self.extra)
        for idx, ranks in enumerate(groups):
            for r in ranks:
                new_extra[r] = new_extra[r] + (idx,)
        new = rank_classes(self.w.trace, self.w.gpu_type, new_extra)
        if max(new) + 1 > self.limit or self.restarts >= self.max_restarts:
            return None
        self.extra = new_extra
        return new
