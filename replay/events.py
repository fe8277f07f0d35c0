"""The engines' event queue: one heap of typed events, and the network's clock beside it.

Both engines (:mod:`replay.reference`, per rank; :mod:`replay.engine_sim`, per class) run the same
loop: take the earliest of the network's next event (:meth:`replay.flows.FluidNetwork.next_time`,
which the network keeps in its own heap, since a flow's end moves whenever rates change) and the
earliest queued event, handle it, repeat. Events of one instant run in a fixed order, the order of
:class:`Ev` after the network's: a transfer that ends at ``t`` frees its members before anything
else at ``t`` reads them, and a compute span that ends at ``t`` is seen before a comm op that
becomes ready at ``t``. Within one kind, events run in the order they were pushed (a counter), so
a run is deterministic: the same inputs give the same event order, bit for bit.

An entry is ``(time, kind, seq, a, b)``: ``a, b`` are the kind's payload (:class:`Ev` says which);
``seq`` is unique, so two entries never compare their payloads.
"""

from __future__ import annotations

import heapq
import math
from enum import IntEnum
from typing import Any, Iterable

__all__ = ["Ev", "EventQueue", "NETWORK"]

NETWORK = -1
"""What :meth:`EventQueue.next` returns when the network's event comes first."""


class Ev(IntEnum):
    """Queued event kinds, in the order they run at equal times (after the network's)."""

    TIMER = 0
    """A transfer of fixed duration ends (link sharing off): ``a`` its instance key, ``b`` its
    replicas' end times (``None`` in the reference engine)."""
    REACH = 1
    """A compute span in progress ends (overlap slowdown on): ``a`` the rank or class, ``b`` the
    span's version (an event whose version is stale was re-planned and is skipped)."""
    READY = 2
    """A comm op becomes ready on its stream: ``a`` the rank or class, ``b`` the op or point."""


class EventQueue:
    """A heap of ``(time, kind, seq, a, b)``; see the module docstring."""

    __slots__ = ("heap", "_seq")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, Any, Any]] = []
        self._seq = 0

    def push(self, t: float, kind: Ev, a: Any, b: Any = None) -> None:
        heapq.heappush(self.heap, (t, kind, self._seq, a, b))
        self._seq += 1

    def next(self, t_net: float) -> tuple[float, int, Any, Any] | None:
        """Pop the earliest event: ``(t, kind, a, b)``, or ``(t_net, NETWORK, None, None)`` (not
        popped: the caller steps the network) when the network's is due first or at the same time;
        None when neither has one."""
        heap = self.heap
        if heap and heap[0][0] < t_net:
            t, kind, _, a, b = heapq.heappop(heap)
            return t, kind, a, b
        if t_net < math.inf:
            return t_net, NETWORK, None, None
        return None

    def of_kind(self, kind: Ev) -> list[tuple[float, int, int, Any, Any]]:
        """The queued events of ``kind``, earliest first (ties in push order)."""
        return sorted(e for e in self.heap if e[1] == kind)

    def replace(self, entries: Iterable[tuple[float, int, int, Any, Any]]) -> None:
        """Replace the queue's content with ``entries`` (their kinds and seqs kept)."""
        self.heap[:] = entries
        heapq.heapify(self.heap)

    def __len__(self) -> int:
        return len(self.heap)
