"""Python's cyclic garbage collector paused around work that allocates millions of objects.

A replay builds millions of small, long-lived objects (a wait record per blocked wait, a key per
comm point, the expanded points of every role). CPython's cyclic collector runs every 700 net
allocations and now and then walks every tracked object of the process (a full collection once
the objects that survived since the last one exceed a quarter of the old generation), so it
takes a share of the run that grows with the heap: 30% of replaying the SC'21 GPT-1T job
(2026-11-27, `docs/replay.md`). Reference counting still frees everything not in a cycle while
the collector is paused; what is in a cycle waits for the next collection after it resumes.
The CPython documentation suggests this for allocation-heavy phases (`gc.disable`, "Garbage
Collector interface"); `gc.freeze` would not do here, since the objects are created during the
phase, not before it.

Not used by capture: there a tensor freed by a collection moves the recorded memory events.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

__all__ = ["paused_gc"]


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Disable automatic cyclic collection inside the block; restore the previous state after
    (nested uses are fine: an inner block leaves the collector as the outer one set it)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
