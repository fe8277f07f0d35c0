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
        assert e["ph"] in ("X", "M", "C")
        assert isinstance(e["name"], str) and e["name"]
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert isinstance(e["ts"], float | int) and isinstance(e["dur"], float | int)
            assert e["ts"] >= 0 and e["dur"] >= 0
        elif e["ph"] == "C":  # counter: numeric series in args
            assert e["args"] and all(isinstance(v, float | int) for v in e["args"].values())
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


G = 1 << 30


def memory_trace():
    """Eight TP ranks: forward f allocates 3 GiB of activations at its first op and a 1 GiB
    temporary freed inside; backward b frees the 3 GiB; 2 GiB of parameters throughout."""
    from heterosim.trace.memory import RoleMemory

    groups = {"tp": (list(range(8)), "tp", "tp")}
    f = [comp(1e12), comp(1e12), coll("all_reduce", "tp", 1 << 20), wait(1), comp(1e12)]
    b = [comp(2e12, phase="bwd"), comp(2e12, phase="bwd")]
    trace = make_trace(8, groups, [(list(range(8)), {"f": f, "b": b}, [("f", 0), ("b", 0)])])
    trace.roles[0].memory = RoleMemory((2 * G, 0, 0, 0, 0, 0),
                                       {"f": [[0, 3, 3 * G], [1, 4, G], [2, 4, -G]], "b": [[2, 3, -3 * G]]}, [])
    return trace


def test_memory_counter_follows_the_blocks():
    """Per segment a sample of its highest total at its first op and of its end total at its
    last op, in time order, within the iteration."""
    from replay.timeline import timeline_events

    res = simulate(memory_trace(), "dgx-a100")
    check_chrome_trace({"traceEvents": timeline_events(res, [0]), "displayTimeUnit": "ms"})
    ev = [e for e in timeline_events(res, [0]) if e["ph"] == "C"]
    assert [e["name"] for e in ev] == ["memory (GiB)"] * 4
    totals = [round(sum(e["args"].values()), 6) for e in ev]
    assert totals == [6.0, 5.0, 5.0, 2.0]  # f: peak 2+3+1, end 5; b: 5 at start, 2 at end
    ts = [e["ts"] for e in ev]
    assert ts == sorted(ts) and ts[0] == 0.0
    assert ts[-1] <= res.iteration_time_s * 1e6 + 1e-6 and ev[0]["args"]["activations"] == 3.0


def test_plot_has_a_memory_panel_when_memory_was_recorded(tmp_path):
    """A third panel (memory per role against capacity) makes the PNG taller."""
    def height(trace):
        path = tmp_path / "p.png"
        simulate(trace, "dgx-a100").write_plot(path)
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        return int.from_bytes(data[20:24], "big")  # IHDR height
    with_memory = memory_trace()
    without = memory_trace()
    without.roles[0].memory = None
    assert height(with_memory) > height(without)
