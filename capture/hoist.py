"""Side-stream work placed where a GPU would start it, not where the host issued it.

Replay issues each op of a rank at its place in the program: a collective starts once the compute
issued before it has finished (``replay/reference.py``). That is right for work on the default
stream, and for NCCL called from it. Work the script puts on a *side* stream waits only for what
that stream waits for: its own earlier work, the events and streams it was told to wait on, and
the data it reads. FSDP2 issues layer i+1's all-gather on its own stream when the host reaches
layer i+1, while the GPU is still busy with layer i (the host runs ahead); the all-gather needs
only its copy-in and the previous copy-out, so on a GPU it overlaps layer i's compute.

:func:`hoist` moves every side-stream op (compute or communication, never a wait) of a finished
segment up to the earliest place those constraints allow: after the op it last depends on, after
its stream's previous op, and after the point its stream last synchronized with (the recorder
records those ops as the row's ``_after``, from ``capture/streams.py``). Nothing else moves, and
an op still comes after everything it depends on, so the program stays a valid order.

Approximation: the host is assumed to run arbitrarily far ahead (a real host thread issues a
layer's kernels in tens of microseconds, far ahead of GPU time for the models this tool is for);
compute moved up still runs on the one compute stream, in the new order.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["hoist"]


def hoist(rows: list[dict[str, Any]], events: list[list[int]], base: int) -> tuple[list[dict], list[list[int]]]:
    """Reorder ``rows`` (ids ``base..base+len-1``; ``deps``/``target``/``coalesced`` are backward
    distances) and re-file memory ``events`` (``[pos, category, bytes]`` before row ``pos``)."""
    if not any("_after" in r for r in rows):
        return rows, events
    # Sort keys: a default-stream row keeps its index; a side row goes just after the latest row
    # it must follow (key k + 0.5 after row k; ties keep program order), never later than it was.
    keys: list[float] = []
    for i, r in enumerate(rows):
        after = r.pop("_after", None)
        if after is None:
            keys.append(float(i))
            continue
        oid = base + i
        preds = [a - base for a in after if a >= base] + [oid - d - base for d in r.get("deps", ()) if oid - d >= base]
        earliest = math.floor(max((keys[p] for p in preds), default=-1.0)) + 0.5
        keys.append(earliest if earliest < i else float(i))
    order = sorted(range(len(rows)), key=lambda i: (keys[i], i))
    if order == list(range(len(rows))):
        return rows, events
    new_at = {old: new for new, old in enumerate(order)}

    def moved(old_abs: int) -> int:
        j = old_abs - base
        return base + new_at[j] if 0 <= j < len(rows) else old_abs

    out = []
    for new, old in enumerate(order):
        r = rows[old]
        me_old, me_new = base + old, base + new
        r["deps"] = sorted(me_new - moved(me_old - d) for d in r.get("deps", ()))
        for col in ("target", "coalesced"):
            if r.get(col):
                r[col] = me_new - moved(me_old - r[col])
        out.append(r)
    n = len(rows)
    refiled = [[new_at[p] if p < n else p, c, b] for p, c, b in events]
    refiled.sort(key=lambda e: e[0])  # stable: events before one op keep their order
    return out, refiled
