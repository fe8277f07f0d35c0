"""capture.blocks: a recorded block without its waits on communication issued before it, or without
the communication a phase issued inside it (by hand); first forwards that share a block."""

import torch

from capture.blocks import _without_rows


def test_block_without_rows_recounts_distances_and_events():
    """Rows 0 A, 1 wait on an op before the block, 2 B reading A, 3 wait on B: the bare block is
    A, B (dep 1 back), wait (1 back); events before row 2 move before B, the end stays the end;
    the output written by B is now row 1."""
    rows = [{"kind": "compute", "name": "A", "deps": []},
            {"kind": "wait", "name": "wait", "target": 7, "deps": []},
            {"kind": "compute", "name": "B", "deps": [2]},
            {"kind": "wait", "name": "wait", "target": 1, "deps": [1]}]
    mem = [[1, 2, 100], [2, 2, -100], [4, 3, 5]]
    meta = (("__tensor__", (2,), torch.bfloat16, False, 2, True, ()), 3)
    out, events, meta2 = _without_rows(rows, [1], mem, meta)
    assert [r["name"] for r in out] == ["A", "B", "wait"]
    assert [r["deps"] for r in out] == [[], [1], [1]] and out[2]["target"] == 1
    assert events == [[1, 2, 100], [1, 2, -100], [3, 3, 5]]
    assert meta2 == (("__tensor__", (2,), torch.bfloat16, False, 1, True, ()), 3)
    assert rows[2]["deps"] == [2]  # the recorded block is left as it was


def test_block_without_rows_refuses_what_it_cannot_move():
    """A dropped wait another op depends on, or one carrying a host sync: no bare block."""
    on_wait = [{"kind": "wait", "target": 3, "deps": []}, {"kind": "compute", "deps": [1]}]
    assert _without_rows(on_wait, [0], [], None) is None
    synced = [{"kind": "wait", "target": 3, "deps": [], "host_sync": True}, {"kind": "compute", "deps": []}]
    assert _without_rows(synced, [0], [], None) is None


def test_block_without_its_gathers_drops_their_waits_and_the_dependencies_on_them():
    """Rows 0 gather (param_gather), 1 A, 2 wait on the gather, 3 B reading A and the gathered
    weights, 4 gather, 5 wait on it: without rows 0, 2, 4, 5 the block is A, B with B's dependency
    on the gather gone (the bare run finds that writer outside the block) and on A kept."""
    rows = [{"kind": "collective", "name": "ag", "deps": []},
            {"kind": "compute", "name": "A", "deps": []},
            {"kind": "wait", "name": "wait", "target": 2, "deps": [2]},
            {"kind": "compute", "name": "B", "deps": [2, 3]},
            {"kind": "collective", "name": "ag", "deps": []},
            {"kind": "wait", "name": "wait", "target": 1, "deps": [1]}]
    mem = [[3, 2, 64], [6, 2, -64]]
    out, events, _ = _without_rows(rows, [0, 2, 4, 5], mem, None)
    assert [(r["name"], r["deps"]) for r in out] == [("A", []), ("B", [1])]
    assert events == [[1, 2, 64], [2, 2, -64]]
    coalesced = [{"kind": "collective", "deps": []}, {"kind": "collective", "deps": [], "coalesced": 1}]
    assert _without_rows(coalesced, [0], [], None) is None  # launched with a dropped op


def _ops(role):
    """A role's program expanded: every op as (micro-batch, chunk, its row), in order."""
    out = []
    for s in role.program:
        cols = role.blocks[s.block].columns
        names = sorted(cols)
        out += [(s.mb, s.chunk, *(repr(cols[c][i]) for c in names)) for i in range(len(cols["kind"]))]
    return out


def test_first_forwards_share_a_block_where_outstanding_communication_matches(tmp_path, monkeypatch):
    # PP2 x VPP6 x DP2, overlapped parameter all-gathers: each chunk's first forward waits for its
    # chunk's gathers, issued before it. Where the communication still outstanding sits at the
    # same distances with the same sizes as at the last recorded one, the block is referenced:
    # chunks 3 and 4 use chunk 2's on the first stage. Chunks 0 and 1 differ in what precedes
    # them (the embedding's forward), the last chunk has no next chunk's gathers in flight, and on
    # the last stage chunk 4 has chunk 5's (with the output layer's bucket). The expanded program
    # and memory are the ones recorded without sharing.
    from capture.api import capture
    from capture.commrec import CommRecorder
    from heterosim.trace.memory import memory_peak
    from heterosim.trace.store import load_trace
    from tests.test_capture_megatron import SCRIPT

    flags = ["--num-layers", "12", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--vocab-size", "128", "--max-position-embeddings", "32", "--micro-batch-size", "1",
             "--global-batch-size", "8", "--bf16", "--use-distributed-optimizer", "--overlap-grad-reduce",
             "--overlap-param-gather", "--pipeline-model-parallel-size", "2",
             "--num-layers-per-virtual-pipeline-stage", "1"]
    shared = load_trace(capture(SCRIPT, flags, tmp_path / "shared", world_size=4, jobs=1))
    monkeypatch.setattr(CommRecorder, "_outstanding", lambda self, pos: None)
    alone = load_trace(capture(SCRIPT, flags, tmp_path / "alone", world_size=4, jobs=1))
    for a, b, shares in zip(shared.roles, alone.roles, ([2, 3, 4], [2, 3])):
        first = {}  # chunk -> its first micro-batch's forward (the largest block there that waits)
        for s in a.program:
            cols = a.blocks[s.block].columns
            if s.mb == 0 and "wait" in cols["kind"] and set(cols["phase"]) == {"fwd"}:
                if len(cols["kind"]) > len(a.blocks[first.get(s.chunk, s.block)].columns["kind"]):
                    first[s.chunk] = s.block
                first.setdefault(s.chunk, s.block)
        assert sorted(first) == [0, 1, 2, 3, 4, 5]
        assert {first[c] for c in shares} == {first[shares[0]]} and len(set(first.values())) == 7 - len(shares)
        assert len(a.blocks) == len(b.blocks) - (len(shares) - 1)
        assert _ops(a) == _ops(b)
        assert memory_peak(a.memory, a.program) == memory_peak(b.memory, b.program)
