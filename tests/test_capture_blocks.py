"""capture.blocks: a recorded block without its waits on communication issued before it (by hand)."""

import torch

from capture.blocks import _without_outside_waits


def test_block_without_outside_waits_recounts_distances_and_events():
    """Rows 0 A, 1 wait on an op before the block, 2 B reading A, 3 wait on B: the bare block is
    A, B (dep 1 back), wait (1 back); events before row 2 move before B, the end stays the end;
    the output written by B is now row 1."""
    rows = [{"kind": "compute", "name": "A", "deps": []},
            {"kind": "wait", "name": "wait", "target": 7, "deps": []},
            {"kind": "compute", "name": "B", "deps": [2]},
            {"kind": "wait", "name": "wait", "target": 1, "deps": [1]}]
    mem = [[1, 2, 100], [2, 2, -100], [4, 3, 5]]
    meta = (("__tensor__", (2,), torch.bfloat16, False, 2, True, ()), 3)
    out, events, meta2 = _without_outside_waits(rows, [1], mem, meta)
    assert [r["name"] for r in out] == ["A", "B", "wait"]
    assert [r["deps"] for r in out] == [[], [1], [1]] and out[2]["target"] == 1
    assert events == [[1, 2, 100], [1, 2, -100], [3, 3, 5]]
    assert meta2 == (("__tensor__", (2,), torch.bfloat16, False, 1, True, ()), 3)
    assert rows[2]["deps"] == [2]  # the recorded block is left as it was


def test_block_without_outside_waits_refuses_what_it_cannot_move():
    """A dropped wait another op depends on, or one carrying a host sync: no bare block."""
    on_wait = [{"kind": "wait", "target": 3, "deps": []}, {"kind": "compute", "deps": [1]}]
    assert _without_outside_waits(on_wait, [0], [], None) is None
    synced = [{"kind": "wait", "target": 3, "deps": [], "host_sync": True}, {"kind": "compute", "deps": []}]
    assert _without_outside_waits(synced, [0], [], None) is None
