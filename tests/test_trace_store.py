"""Traces on disk (heterosim.trace.store): round trips, atomic writes, and one clear error for every damage."""

import json

import pytest

from heterosim.errors import TraceSchemaError
from heterosim.trace.ir import Role
from heterosim.trace.store import load_trace, write_trace
from test_trace_ir import _trace


def test_round_trip_is_byte_identical(tmp_path):
    """write(load(write(t))) gives the same bytes; expansion keeps ids, deps and wait targets."""
    write_trace(_trace(), tmp_path / "a")
    t = load_trace(tmp_path / "a")
    write_trace(t, tmp_path / "b")
    for f in ("trace.json", "roles/role_0000.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    ops = t.roles[0].ops()
    assert [o.id for o in ops] == list(range(7))
    assert ops[4].deps == (3,) and ops[5].target == 4 and ops[4].mb == 1
    assert ops[6].kernel_class == "attention"


def test_unknown_schema_version_is_rejected(tmp_path):
    """A trace from another schema version names both versions and how to fix it."""
    write_trace(_trace(), tmp_path / "t")
    h = json.loads((tmp_path / "t" / "trace.json").read_text())
    h["schema_version"] = 99
    (tmp_path / "t" / "trace.json").write_text(json.dumps(h))
    with pytest.raises(TraceSchemaError, match="schema_version 99; this HeteroSim reads schema_version 1 and 2"):
        load_trace(tmp_path / "t")


def test_v1_trace_loads_without_host_syncs(tmp_path):
    """A v1 trace (no host_sync column) loads with host_sync False on every op, and re-writes as v2."""
    write_trace(_trace(), tmp_path / "t")
    for f in ("trace.json", "roles/role_0000.json"):
        doc = json.loads((tmp_path / "t" / f).read_text())
        doc["schema_version"] = 1
        for bd in doc.get("blocks", {}).values():
            del bd["columns"]["host_sync"], bd["columns"]["launch"]
        (tmp_path / "t" / f).write_text(json.dumps(doc))
    t = load_trace(tmp_path / "t")
    assert [o.host_sync for o in t.roles[0].ops()] == [False] * 7
    write_trace(t, tmp_path / "b")
    write_trace(_trace(), tmp_path / "c")
    assert (tmp_path / "b" / "roles/role_0000.json").read_bytes() == (tmp_path / "c" / "roles/role_0000.json").read_bytes()


def test_migrate_v1_to_v2_is_pure():
    """The migration adds one False per op to every block and leaves its input alone."""
    from heterosim.trace.store import migrate_v1_to_v2

    v1 = {"schema_version": 1, "blocks": {"b0": {"n": 2, "columns": {"kind": ["compute", "wait"]}}}, "program": []}
    v2 = migrate_v1_to_v2(v1)
    assert v2["schema_version"] == 2 and v2["blocks"]["b0"]["columns"]["host_sync"] == [False, False]
    assert v2["blocks"]["b0"]["columns"]["launch"] == ["eager", "eager"]
    assert "host_sync" not in v1["blocks"]["b0"]["columns"] and v1["schema_version"] == 1


def test_host_sync_must_be_a_bool(tmp_path):
    """host_sync holds JSON true / false; a number is a schema error naming the column."""
    t = _trace()
    t.roles[0].blocks["b0"].columns["host_sync"][0] = 1
    write_trace(t, tmp_path / "t")
    with pytest.raises(TraceSchemaError, match="column 'host_sync' holds a value that is not a bool"):
        load_trace(tmp_path / "t")


def test_only_compute_ops_join_a_graph(tmp_path):
    """launch is eager / graph / in_graph, and only compute ops may be part of a CUDA-graph replay."""
    t = _trace()
    t.roles[0].blocks["b0"].columns["launch"][1] = "graph"  # op 1 is a collective
    write_trace(t, tmp_path / "t")
    with pytest.raises(TraceSchemaError, match=r"op 1 \(collective\) has launch 'graph'; valid: \('eager', 'graph', "
                                               r"'in_graph'\) \(compute ops only may be part of a CUDA graph\)"):
        load_trace(tmp_path / "t")


def test_missing_trace_and_bad_json(tmp_path):
    """A directory without trace.json, and a damaged role file, give one clear error each."""
    with pytest.raises(TraceSchemaError, match="is not a HeteroSim trace"):
        load_trace(tmp_path)
    write_trace(_trace(), tmp_path / "t")
    (tmp_path / "t" / "roles" / "role_0000.json").write_text("{not json")
    with pytest.raises(TraceSchemaError, match="role_0000.json is not valid JSON"):
        load_trace(tmp_path / "t")


def test_bad_references_are_rejected(tmp_path):
    """Unknown groups, uncovered ranks and waits on compute ops are schema errors."""
    t = _trace()
    t.roles[0].blocks["b0"].columns["group"][1] = "7"
    write_trace(t, tmp_path / "g")
    with pytest.raises(TraceSchemaError, match="unknown process group '7'"):
        load_trace(tmp_path / "g")
    t = _trace()
    t.roles[0] = Role(0, 0, (0,), t.roles[0].blocks, t.roles[0].program)
    write_trace(t, tmp_path / "r")
    with pytest.raises(TraceSchemaError, match=r"ranks \[1\]... belong to no role"):
        load_trace(tmp_path / "r")
    t = _trace()
    t.roles[0].blocks["b0"].columns["target"][2] = 2
    write_trace(t, tmp_path / "w")
    with pytest.raises(TraceSchemaError, match="wait op 2 does not point at a communication op"):
        load_trace(tmp_path / "w")


def test_wait_into_an_earlier_segment_is_checked_per_segment(tmp_path):
    """A block whose wait reaches back before its own start is checked at every segment: op 6 (block
    b1, the third segment) waiting 2 ops back hits op 4, a collective of the second segment; 1 back,
    op 5, a wait: the error names op 6."""
    from heterosim.trace.ir import Block

    def with_wait(target: int):
        t = _trace()
        t.roles[0].blocks["b1"] = Block.from_rows([dict(kind="wait", name="wait", kernel_class="comm", target=target)])
        return t

    write_trace(with_wait(2), tmp_path / "ok")
    assert load_trace(tmp_path / "ok").roles[0].ops()[6].target == 4  # op ids once expanded
    write_trace(with_wait(1), tmp_path / "bad")
    with pytest.raises(TraceSchemaError, match="wait op 6 does not point at a communication op"):
        load_trace(tmp_path / "bad")


def test_failed_write_leaves_old_trace(tmp_path, monkeypatch):
    """Writing is atomic: an error mid-write leaves the previous trace untouched and no temp dir."""
    write_trace(_trace(), tmp_path / "t")
    before = (tmp_path / "t" / "trace.json").read_bytes()
    bad = _trace()
    bad.roles[0].blocks["b0"].columns["flops"][0] = float("nan")
    with pytest.raises(ValueError):
        write_trace(bad, tmp_path / "t")
    assert (tmp_path / "t" / "trace.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def _edit(root, file, fn):
    p = root / file
    doc = json.loads(p.read_text())
    doc = fn(doc)
    p.write_text(json.dumps(doc))


def _set(path, value):
    def fn(doc):
        d = doc
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
        return doc
    return fn


H, R = "trace.json", "roles/role_0000.json"
BAD_TRACES = [
    # (file, edit, message)
    (H, lambda d: [d], "must hold a JSON object, found a list"),
    (H, _set(["world_size"], "four"), "'world_size' must be a int, found 'four'"),
    (H, _set(["world_size"], 10**12), "world_size 1000000000000 is outside 1..1,048,576 ranks"),
    (H, _set(["world_size"], True), "'world_size' must be a int, found True"),
    (H, _set(["format"], "chrome-trace"), "format 'chrome-trace' is not 'heterosim-trace'"),
    (H, _set(["torch_version"], 2.13), "'torch_version' must be a str"),
    (H, _set(["roles", 0, "file"], "../../etc/passwd"), "role file '../../etc/passwd' lies outside the trace directory"),
    (H, _set(["roles", 0, "file"], "/etc/passwd"), "role file '/etc/passwd' lies outside the trace directory"),
    (H, lambda d: (d["roles"][0].pop("file"), d)[1], "missing key 'file'"),
    (H, _set(["roles", 0, "ranks"], [0, 7]), "a role's ranks must be ranks of the world (0..1)"),
    (H, _set(["groups", "1", "ranks"], [0, "1"]), "group 1 has ranks ['1'] outside world size 2"),
    (R, lambda d: (d.pop("blocks"), d)[1], "missing key 'blocks'"),
    (R, _set(["blocks", "b0", "columns", "flops", 0], float("nan")), "column 'flops' holds a value that is not a finite number"),
    (R, _set(["blocks", "b0", "columns", "comm_bytes", 1], -16), "column 'comm_bytes' holds a value that is not a number >= 0"),
    (R, _set(["blocks", "b0", "columns", "name", 0], 3), "column 'name' holds a value that is not a str"),
    (R, _set(["blocks", "b0", "columns", "deps", 1], ["x"]), "op 1 has dependency distance x out of range"),
    (R, _set(["program", 0], ["b0", "0", 0]), "a program entry must be [block, micro-batch, chunk]"),
]


@pytest.mark.parametrize("file, edit, message", BAD_TRACES, ids=[m[:40] for _, _, m in BAD_TRACES])
def test_damaged_trace_is_one_schema_error(tmp_path, file, edit, message):
    """Each damage gives one TraceSchemaError naming the problem (never another exception)."""
    write_trace(_trace(), tmp_path / "t")
    _edit(tmp_path / "t", file, edit)
    with pytest.raises(TraceSchemaError) as e:
        load_trace(tmp_path / "t")
    assert message in str(e.value)


def test_binary_header_is_one_schema_error(tmp_path):
    write_trace(_trace(), tmp_path / "t")
    (tmp_path / "t" / "trace.json").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(TraceSchemaError, match=r"is not a text \(UTF-8 JSON\) file: it is damaged or not a trace$"):
        load_trace(tmp_path / "t")


# ---------------------------------------------------------------- property-based fuzzing
def test_fuzzed_trace_gives_a_trace_or_a_schema_error(tmp_path_factory):
    """Any value put anywhere in a valid header or role file, or any bytes as the header:
    load_trace returns or raises TraceSchemaError, nothing else, quickly."""
    pytest.importorskip("hypothesis")
    import time

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from fuzzing import mutated

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def values(data):
        root = tmp_path_factory.mktemp("fuzz") / "t"
        write_trace(_trace(), root)
        file = data.draw(st.sampled_from([H, R]))
        (root / file).write_text(json.dumps(mutated(data, json.loads((root / file).read_text()))))
        t0 = time.monotonic()
        try:
            load_trace(root)
        except TraceSchemaError:
            pass
        assert time.monotonic() - t0 < 2

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(raw=st.binary(max_size=200))
    def header_bytes(raw):
        root = tmp_path_factory.mktemp("fuzzb") / "t"
        write_trace(_trace(), root)
        (root / "trace.json").write_bytes(raw)
        with pytest.raises(TraceSchemaError):
            load_trace(root)

    values()
    header_bytes()
