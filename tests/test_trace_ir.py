"""Trace schema: round trips, expansion of referenced blocks, and clear errors for bad traces."""

import json

import pytest

from heterosim.trace.ir import Block, GroupInfo, Role, Segment, Trace, flop_totals, load_trace, write_trace
from heterosim.errors import TraceSchemaError


def _trace() -> Trace:
    blk = Block.from_rows([
        dict(kind="compute", name="aten.mm.default", kernel_class="gemm", flops=8.0, flops_full=8.0,
             dims={"m": 1, "n": 2, "k": 2, "batch": 1}),
        dict(kind="collective", name="c10d.allreduce_.default", kernel_class="comm", collective="all_reduce",
             group="1", comm_bytes=16, stream="comm:1", deps=[1]),
        dict(kind="wait", name="wait", kernel_class="comm", target=1, deps=[1]),
    ])
    attn = Block.from_rows([dict(kind="compute", name="sdpa", kernel_class="attention", phase="recompute",
                                 flops=3.0, flops_full=5.0)])
    return Trace(world_size=2, groups={"0": GroupInfo((0, 1), "world", "world"), "1": GroupInfo((0, 1), "tp", "f0")},
                 roles=[Role(0, 0, (0, 1), {"b0": blk, "b1": attn},
                             [Segment("b0", 0), Segment("b0", 1), Segment("b1", 1)])])


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


def test_flop_totals_follow_megatron_conventions():
    """model excludes recompute, hardware includes it (full attention); executed sums every op."""
    f = flop_totals(_trace())
    # two mm of 8 on two ranks = 32; recompute attention 5 full / 3 executed
    assert f == {"model": 32.0, "hardware": 42.0, "executed": 38.0}


def test_unknown_schema_version_is_rejected(tmp_path):
    """A trace from another schema version names both versions and how to fix it."""
    write_trace(_trace(), tmp_path / "t")
    h = json.loads((tmp_path / "t" / "trace.json").read_text())
    h["schema_version"] = 99
    (tmp_path / "t" / "trace.json").write_text(json.dumps(h))
    with pytest.raises(TraceSchemaError, match="schema_version 99; this HeteroSim reads schema_version 1"):
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


def test_group_translation_by_family():
    """A captured rank's TP group maps to the family member holding another rank."""
    t = Trace(world_size=4, groups={"1": GroupInfo((0, 1), "tp", "f0"), "2": GroupInfo((2, 3), "tp", "f0")},
              roles=[])
    assert t.group_for("1", 3) == "2"
    assert t.peer_global("1", 1, 2) == 3


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
