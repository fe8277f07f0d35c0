"""Perfetto / Chrome trace JSON (replay.timeline) and the plot writer (replay.plots)."""

from __future__ import annotations

import json

import pytest

from heterosim.errors import ConfigError
from replay.engine import run_fast
from replay.simulate import simulate, summarize
from test_replay_engine import coll, comp, make_trace, random_case, wait
from test_replay_reference import one_f_one_b
from test_replay_engine import toy_workload


def toy_result(w):
    return summarize(run_fast(w), w, cluster_name="toy", peak_flops=[1e12] * w.trace.world_size, dtype="bf16")


def check_chrome_trace(doc: dict) -> None:
    """The subset of the Trace Event Format that Perfetto's JSON importer needs."""
    assert isinstance(doc["traceEvents"], list) and doc["traceEvents"]
    assert doc["displayTimeUnit"] in ("ms", "ns")
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M")
        assert isinstance(e["name"], str) and e["name"]
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert isinstance(e["ts"], float | int) and isinstance(e["dur"], float | int)
            assert e["ts"] >= 0 and e["dur"] >= 0
        else:
            assert e["name"] in ("process_name", "thread_name", "process_sort_index")
            assert "args" in e


def test_timeline_schema_and_tracks(tmp_path):
    """One process per rank, a compute track and one track per comm stream; valid Chrome JSON."""
    res = toy_result(random_case(9))
    path = tmp_path / "t.json"
    res.write_timeline(path)
    doc = json.loads(path.read_text())
    check_chrome_trace(doc)
    assert doc["otherData"]["schema_version"] == 1
    pids = {e["pid"] for e in doc["traceEvents"]}
    assert pids == set(range(res.world_size))
    threads = {(e["pid"], e["args"]["name"]) for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert (0, "compute") in threads and any(n.startswith("comm:") for _, n in threads)


def test_compute_and_waits_tile_the_compute_track():
    """On the compute track, compute spans plus waits cover [0, end of compute stream] without gaps."""
    res = toy_result(toy_workload(one_f_one_b(3, 4)))
    from replay.timeline import timeline_events

    for r in range(3):
        ev = sorted((e["ts"], e["dur"]) for e in timeline_events(res, [r]) if e.get("tid") == 0 and e["ph"] == "X")
        t = 0.0
        for ts, dur in ev:
            assert ts == pytest.approx(t, abs=1e-6)
            t = ts + dur
        rt = res._run.rank_times(r)
        assert t == pytest.approx((rt.compute_s + sum(x.t_end - x.t_block for x in rt.waits)) * 1e6)


def test_collectives_are_named_with_algorithm_and_bytes(tmp_path):
    """On a real preset the comm slices read like 'all_reduce RING/SIMPLE 67.1 MB'."""
    groups = {"tp": (list(range(8)), "tp", "tp")}
    trace = make_trace(8, groups, [(list(range(8)), {"b": [comp(1e12), coll("all_reduce", "tp", 64 << 20),
                                                           wait(1)]}, [("b", 0)])])
    res = simulate(trace, "dgx-a100")
    path = tmp_path / "t.json"
    res.write_timeline(path, ranks=[0, 3])
    doc = json.loads(path.read_text())
    check_chrome_trace(doc)
    names = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "comm"]
    assert len(names) == 2 and all(n.startswith("all_reduce ") and n.endswith(" 67.1 MB") for n in names)
    assert "/" in names[0]


def test_timeline_is_byte_identical_and_checks_ranks(tmp_path):
    """Same inputs, same bytes; a rank outside the world is refused with its range."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    toy_result(random_case(4)).write_timeline(a)
    toy_result(random_case(4)).write_timeline(b)
    assert a.read_bytes() == b.read_bytes()
    with pytest.raises(ConfigError, match=r"timeline ranks \[99\] are outside the world"):
        toy_result(random_case(4)).write_timeline(a, ranks=[99])


def test_plot_is_a_png(tmp_path):
    """--plot writes a PNG (magic bytes) with both panels."""
    res = toy_result(toy_workload(one_f_one_b(4, 4)))
    path = tmp_path / "p.png"
    res.write_plot(path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
