"""Python's cyclic garbage collector paused around work that allocates millions of objects.

A replay builds millions of small, long-lived objects (a wait record per blocked wait, a key per
comm point, the expanded points of every role). CPython's cyclic collector runs every 700 net
allocations and now and then walks every tracked object of the process (a full collection once
the objects that survived since the last one exceed a quarter of the old generation), so it
takes a share of the run that grows with the heap: a quarter of replaying the SC'21 GPT-1T job
(2026-11-27, `docs/replay.md`). Reference counting still frees everything not in a cycle while
the collector is paused; what is in a cycle waits for the next full collection after it resumes.

Resuming as is would cost one more walk: the allocation count is then in the millions, so the
first allocation after `gc.enable` collects the youngest generation, every object made during the
pause (1.5 s after the Llama 3.1 405B replay, 0.7 s after the 1T one). Instead the survivors go to
the oldest generation unexamined: `gc.freeze()` moves every tracked object to the permanent
generation and zeroes the count, `gc.unfreeze()` puts them all back into the oldest generation
(CPython's "Garbage Collector interface" documents both; freezing is meant for objects that live
long, which these do). A cycle among them is found by the next full collection, as any old object's.

Not used by capture: there a tensor freed by a collection moves the recorded memory events.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

__all__ = ["paused_gc"]


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Disable automatic cyclic collection inside the block, or the decorated function
    (``@paused_gc()``); restore the previous state after (nested uses are fine: an inner block
    leaves the collector as the outer one set it), the objects that survived it moved to the
    oldest generation."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.freeze()  # the pause's survivors to the oldest generation, unexamined (docstring)
            gc.unfreeze()
            gc.enable()
