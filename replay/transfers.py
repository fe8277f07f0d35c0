"""What goes onto the network: transfers, their phases and flows, and the fluid network's records.

A *transfer* (:class:`TransferSpec`) is what one collective (or one send/recv pair) puts on the
network: a sequence of *phases*; a phase (:class:`PhaseSpec`) waits its latency, then starts its
flows together and ends when the last one has arrived; the next phase starts then. A *flow*
(:class:`FlowSpec`) moves ``nbytes`` over a path of directed links (indices into the capacity
vector), optionally capped at ``max_rate_Bps`` (a per-channel limit). :mod:`replay.expand` builds
the specs from NCCL's plans; :class:`replay.flows.FluidNetwork` runs them.

The underscored classes are that network's bookkeeping (a flow in flight, a transfer in flight,
a batch of replicas, a group of replicas run alone, a batch shape's cached solo run); they hold
no behaviour and only :mod:`replay.flows` uses them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

__all__ = ["FlowSpec", "PhaseSpec", "TransferSpec"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowSpec:
    """Bytes from one GPU to another over a path of link indices."""

    links: tuple[int, ...]
    nbytes: float
    max_rate_Bps: float = math.inf
    """Cap on this flow's rate (e.g. one NCCL channel's throughput); inf: links alone decide."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseSpec:
    """Wait ``latency_s``, then run ``flows`` concurrently until the last one is done."""

    latency_s: float = 0.0
    flows: tuple[FlowSpec, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferSpec:
    """Phases run one after another; an empty spec takes zero time."""

    phases: tuple[PhaseSpec, ...] = ()


class _Flow:
    __slots__ = ("links", "remaining", "rate", "t_last", "tid", "version", "cap", "pin")

    def __init__(self, links: tuple[int, ...], nbytes: float, cap: float, tid: int, now: float):
        self.links = links
        self.remaining = float(nbytes)
        self.rate = 0.0
        self.t_last = now
        self.tid = tid
        self.version = 0
        self.cap = cap
        self.pin = -1  # the link whose share froze its rate in the last solve (-1: its cap)


class _Transfer:
    __slots__ = ("key", "spec", "phase", "pending", "t0", "links", "mirror")

    def __init__(self, key: Hashable, spec: TransferSpec, t0: float = 0.0, links: tuple[int, ...] = ()):
        self.key = key  # (batch id, replica index)
        self.spec = spec
        self.phase = -1
        self.pending = 0
        self.t0 = t0
        self.links = links  # every link of every phase, reserved while it is in flight (fast path on)
        self.mirror: Any = None  # the replay.mirrors.Mirror it runs lane 0 of: it stands for every lane


class _Batch:
    __slots__ = ("key", "left", "ends", "solo", "solo_links", "t0", "specs", "version", "groups", "partial",
                 "info")

    def __init__(self, key: Hashable, n: int):
        self.key = key
        self.left = n
        self.ends: list[float] = [math.nan] * n
        self.solo: list[int] = []
        """Groups (indices into ``groups``) running on the fast path."""
        self.solo_links: Sequence[int] = ()
        self.groups: Sequence[_Group] = ()
        self.partial = False
        """Not every group ran solo from the start: release links group by group."""
        self.t0 = 0.0
        self.specs: Sequence[TransferSpec] = ()
        self.version = 0
        self.info: _ShapeInfo | None = None
        """Set while the whole batch runs solo without per-link ownership (see :mod:`replay.holds`)."""


class _Group:
    """Replicas of a batch connected by shared links, run together alone from t = 0 (cached)."""

    __slots__ = ("members", "links", "rel_ends", "specs", "fluid", "shape")

    def __init__(self, members: tuple[int, ...], links: tuple[int, ...], rel_ends: list[float],
                 specs: tuple[TransferSpec, ...], fluid: bool = False):
        self.members = members  # replica indices in the batch
        self.links = links  # union of their links
        self.rel_ends = rel_ends  # end of each member, from the group's start
        self.specs = specs
        self.fluid = fluid  # from now on run as fluid flows, never solo
        self.shape: _ShapeInfo | None = None  # the batch shape it belongs to


class _ShapeInfo:
    __slots__ = ("links", "groups", "rel_ends", "keep", "all_links", "link_set", "simple", "longest",
                 "shortest", "group_ids", "clashers", "holder")

    def __init__(self, links: list[tuple[int, ...]], groups: list[_Group], n: int, keep: Any):
        self.links = links  # each replica's distinct links
        self.groups = groups
        for g in groups:
            g.shape = self
        self.rel_ends = [0.0] * n  # each replica's end from the batch start when its group runs alone
        for g in groups:
            for j, e in zip(g.members, g.rel_ends):
                self.rel_ends[j] = e
        self.keep = keep  # the caller's shape object, kept alive (its id is the cache key)
        self.all_links = tuple(l for g in groups for l in g.links)
        self.link_set = frozenset(self.all_links)
        self.simple = all(e > 0 for e in self.rel_ends) and not any(g.fluid for g in groups)
        """Every replica takes time and may run solo: the all-solo bulk path applies when its links
        are free."""
        self.longest = max(self.rel_ends, default=0.0)
        self.shortest = min(self.rel_ends, default=0.0)
        self.group_ids = list(range(len(groups)))  # shared by bulk batches (never mutated in place)
        self.clashers: list[_ShapeInfo] | None = None
        """Shapes sharing a link with this one, itself included (:class:`replay.holds.Holds`)."""
        self.holder = -1
        """Id of the bulk solo batch of this shape in flight, -1 if none."""
