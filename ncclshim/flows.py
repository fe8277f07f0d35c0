"""Point-to-point flows of every collective call, as fractions of the collective's size.

A *flow template* is a tuple of :data:`FlowSpec` ``(src, dst, fraction, channel, path, phase)``:
``fraction * nbytes`` payload bytes move from GPU ``src`` to GPU ``dst`` over ``path`` (link ids).
Templates depend on the group and the algorithm, not on the size, so the planner builds one per
(collective, algorithm, group) and scales it.

Granularity (what the replay engine shares links between): NCCL pipelines every algorithm over
8-slot FIFOs, so each algorithm is ONE phase whose flows run together; one flow per distinct ring
or tree edge, aggregated over NCCL's runtime channels (duplicated channels follow the same paths,
``docs/nccl.md`` §7) and over all pipeline steps. Bytes per GPU follow §1.4/§7.

Each collective algorithm's flows are its registry entry's (:mod:`ncclshim.algorithms`; shapes in
the docstrings of ``algorithms/ring.py``, ``tree.py``, ``sharp.py``). This module adds the grouped
point-to-point operations, which are no NCCL algorithm:

- all_to_all: every ordered pair, ``S/n``, listed in NCCL's ``ncclP2pSchedule`` order.
- send/recv: one flow of ``S``.
"""

from __future__ import annotations

from ncclshim import algorithms
from ncclshim.algorithms.entry import FlowSpec
from ncclshim.algorithms.tree import btree_parent, dtree_parents
from ncclshim.graph import GroupGraph
from ncclshim.topology import TopologyView

__all__ = ["FlowSpec", "template", "btree_parent", "dtree_parents", "p2p_schedule"]


def p2p_schedule(n: int, local: int) -> tuple[int, ...]:
    """Send deltas of NCCL's grouped send/recv rounds (``init.cc:ncclP2pSchedule``).

    Ranks form groups of ``gcd(8, local)``; group deltas follow ``(x^2+x)/2 mod pow2Up(nGroups)``
    (values >= nGroups skipped), and inside a group local deltas run 0..size-1. Round ``k`` sends
    to ``rank + delta[k]``. Delta 0 (self) is dropped.
    """
    from math import gcd

    size = gcd(8, local) if n % gcd(8, local) == 0 else 1
    groups = n // size
    pow2 = 1
    while pow2 < groups:
        pow2 <<= 1
    out, seen = [], set()
    for x in range(pow2):
        gd = (x * x + x) // 2 % pow2
        if gd >= groups or gd in seen:
            continue
        seen.add(gd)
        for ld in range(size):
            d = (gd * size + ld) % n
            if d:
                out.append(d)
    return tuple(out)


def _all_to_all(g: GroupGraph, view: TopologyView, pxn: bool) -> list[FlowSpec]:
    n, ranks = len(g.ranks), g.ranks
    deltas = p2p_schedule(n, g.ppn)
    return [(ranks[r], ranks[(r + d) % n], 1.0 / n, 0, view.route(ranks[r], ranks[(r + d) % n], 0, pxn=pxn), 0)
            for d in deltas for r in range(n)]


def template(coll: str, algo: str, g: GroupGraph, view: TopologyView, *, pxn: bool = True,
             root: int = 0, channels: int | None = None) -> tuple[FlowSpec, ...]:
    """Flow template of ``coll`` run with ``algo`` over the group ``g`` (``root``: GPU index).

    all_to_all and send/recv are grouped point-to-point (``algo`` is not read); the collectives
    take the flows of ``algo``'s registry entry (:mod:`ncclshim.algorithms`). ``channels``: only
    the flows of run-time channels ``0..channels-1``, for RING and TREE (``FlowBuilder``).

    Raises:
        UnsupportedCollectiveError: ``algo`` is not a registered algorithm.
    """
    if coll == "all_to_all":
        return tuple(_all_to_all(g, view, pxn))
    if coll in ("send", "recv"):
        a, b = g.ranks
        return ((a, b, 1.0, 0, view.route(a, b, 0, pxn=pxn), 0),)
    build = algorithms.get(algo).flows
    return tuple(build(coll, g, view, pxn, root) if channels is None else build(coll, g, view, pxn, root, channels))
