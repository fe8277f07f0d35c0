"""Placement: rank -> GPU by default, per pipeline stage, per node group, or explicit."""

from __future__ import annotations

import pytest
import yaml

from heterosim.errors import ConfigError
from heterosim.cluster import load_cluster
from heterosim.cluster.placement import Placement, parse_ranges, placement_for, stage_of


def test_stage_of_megatron_order():
    """stage = rank // (world // pp): pp is the slowest-varying dimension."""
    assert [stage_of(r, 32, 4) for r in (0, 7, 8, 31)] == [0, 0, 1, 3]


def test_parse_ranges():
    """Ints, inclusive 'a-b' ranges and comma lists read as sorted ints."""
    assert parse_ranges("0-3,8", "x") == (0, 1, 2, 3, 8)
    assert parse_ranges([5, "1-2"], "x") == (1, 2, 5)
    with pytest.raises(ConfigError, match="x: range '3-1' runs backwards"):
        parse_ranges("3-1", "x")
    with pytest.raises(ConfigError, match="x: cannot read 'a'"):
        parse_ranges("a", "x")


def test_identity_default():
    """Without a placement rank r runs on GPU r."""
    c = load_cluster("dgx-a100", num_gpus=16)
    assert [c.rank_to_gpu(r) for r in range(16)] == list(range(16))
    assert c.num_ranks == 16


def test_by_stage_puts_stages_on_groups():
    """by_stage maps each pipeline stage to a node group; ranks fill the group's GPUs in order."""
    p = placement_for({"pp": 4}, 32, {"by_stage": {0: "h100", 1: "h100", "2-3": "a100"}})
    c = load_cluster("mixed-a100-h100", num_gpus=32, placement=p)
    assert [c.rank_to_gpu(r) for r in (0, 15, 16, 31)] == [16, 31, 0, 15]
    assert c.gpu_type_of_rank(0) == "H100-SXM5-80GB" and c.gpu_type_of_rank(16) == "A100-SXM4-80GB"


def test_by_stage_pp_from_layout_checked():
    """by_stage must list every stage of the trace's pp exactly once."""
    with pytest.raises(ConfigError, match=r"placement.by_stage: stage 2 has no node group; the job "
                                          r"has pp=4 stages 0..3, list each exactly once"):
        placement_for({"pp": 4}, 32, {"by_stage": {"0-1": "a100", 3: "h100"}})
    with pytest.raises(ConfigError, match="stage 4 does not exist"):
        placement_for({"pp": 4}, 32, {"by_stage": {"0-4": "a100"}})
    with pytest.raises(ConfigError, match="stage 1 is listed twice"):
        placement_for(None, 32, {"by_stage": {"0-1": "a100", 1: "h100"}})


def test_by_stage_without_layout_infers_pp():
    """Without a layout, pp is the number of stages by_stage lists."""
    p = placement_for(None, 8, {"by_stage": {0: "x", 1: "y"}})
    assert p.groups == ("x",) * 4 + ("y",) * 4


def test_by_group():
    """by_group gives rank ranges to groups; every rank exactly once."""
    p = placement_for(None, 32, {"by_group": {"h100": "0-15", "a100": "16-31"}})
    c = load_cluster("mixed-a100-h100", num_gpus=32, placement=p)
    assert c.rank_to_gpu(0) == 16 and c.rank_to_gpu(16) == 0
    with pytest.raises(ConfigError, match=r"placement.by_group: rank 3 is placed on both 'h100' and 'a100'"):
        placement_for(None, 8, {"by_group": {"h100": "0-3", "a100": "3-7"}})
    with pytest.raises(ConfigError, match=r"rank 4 is placed on no node group \(4 ranks unplaced\)"):
        placement_for(None, 8, {"by_group": {"h100": "0-3"}})


def test_group_overflow():
    """A group given more ranks than it has GPUs is refused with the counts."""
    p = placement_for({"pp": 2}, 32, {"by_stage": {0: "a100", 1: "a100"}})
    with pytest.raises(ConfigError, match=r"placement: 32 ranks \(ranks 0..31\) are placed on node "
                                          r"group 'a100', which has 16 GPUs"):
        load_cluster("mixed-a100-h100", num_gpus=32, placement=p)
    p = placement_for(None, 32, {"by_stage": {0: "b200"}})
    with pytest.raises(ConfigError, match=r"node group 'b200' is not in the cluster; groups: \['a100', 'h100'\]"):
        load_cluster("mixed-a100-h100", num_gpus=32, placement=p)


def test_explicit_ranks():
    """An explicit list gives each rank's GPU; duplicates and bad lengths are refused."""
    c = load_cluster("dgx-a100", num_gpus=16, placement={"ranks": list(range(8, 16)) + list(range(8))})
    assert c.rank_to_gpu(0) == 8 and c.rank_to_gpu(8) == 0
    with pytest.raises(ConfigError, match="ranks 0 and 1 are both on GPU 0; each GPU runs one rank"):
        load_cluster("dgx-a100", num_gpus=16, placement={"ranks": [0, 0] + list(range(2, 16))})
    with pytest.raises(ConfigError, match="placement.ranks lists 2 GPUs but the job has 16 ranks"):
        load_cluster("dgx-a100", num_gpus=16, placement={"ranks": [0, 1]})


def test_one_form_only():
    """Exactly one of by_stage, by_group, ranks."""
    with pytest.raises(ConfigError, match=r"give exactly one of \['by_stage', 'by_group', 'ranks'\], "
                                          r"got keys \['by_group', 'ranks'\]"):
        placement_for(None, 8, {"ranks": [0], "by_group": {}})


def test_placement_file(tmp_path):
    """A placement file carries schema_version 1 and a placement section."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"schema_version": 1, "placement": {"by_stage": {0: "h100", 1: "a100"}}}))
    p = placement_for({"pp": 2}, 32, path)
    assert p.groups[0] == "h100" and p.to_dict() == {"by_stage": {0: "h100", 1: "a100"}}
    path.write_text(yaml.safe_dump({"schema_version": 3, "placement": {"ranks": [0]}}))
    with pytest.raises(ConfigError, match="schema_version 3 is not supported"):
        placement_for(None, 1, path)


def test_placement_in_cluster_spec():
    """A cluster spec's placement section applies when no placement is passed."""
    spec = {
        "schema_version": 1, "name": "two",
        "node_types": {"box": {"gpus_per_node": 2, "pcie": {"gen": 4}, "nics": {"count": 1, "bw_Gbps": 100}}},
        "node_groups": [{"name": "a", "gpu": "A100", "node_type": "box", "nodes": 1},
                        {"name": "h", "gpu": "H100", "node_type": "box", "nodes": 1}],
        "fabric": {"kind": "leaf_spine"},
        "placement": {"by_group": {"h": "0-1", "a": "2-3"}},
    }
    c = load_cluster(spec)
    assert [c.gpu_type_of_rank(r)[:4] for r in range(4)] == ["H100", "H100", "A100", "A100"]
    assert "placement: {'by_group'" in c.describe()


def test_with_placement_shares_network():
    """with_placement re-places ranks on the same network object, leaving the original alone."""
    c = load_cluster("mixed-a100-h100", num_gpus=32)
    d = c.with_placement({"by_stage": {0: "h100", 1: "a100"}}, layout={"pp": 2})
    assert d.network is c.network and d.rank_to_gpu(0) == 16 and c.rank_to_gpu(0) == 0
    assert d.derived is c.derived  # placement-independent views built by other layers are shared


def test_placement_world_mismatch():
    """A Placement built for another world size is refused."""
    with pytest.raises(ConfigError, match="placement covers 4 ranks but the job has 8"):
        placement_for(None, 8, Placement(gpus=(0, 1, 2, 3)))
    c = load_cluster("dgx-a100", num_gpus=8)
    with pytest.raises(ConfigError, match=r"rank 8 is not placed; the placement covers ranks 0..7"):
        c.rank_to_gpu(8)


def test_load_cluster_checks_stages_against_layout():
    """load_cluster(layout=...) checks a by_stage placement against the trace's pp."""
    spec = {"by_stage": {0: "h100", 1: "a100"}}
    c = load_cluster("mixed-a100-h100", num_gpus=32, placement=spec, layout={"pp": 2})
    assert c.rank_to_gpu(0) == 16
    with pytest.raises(ConfigError, match="stage 2 has no node group; the job has pp=4 stages"):
        load_cluster("mixed-a100-h100", num_gpus=32, placement=spec, layout={"pp": 4})


def test_malformed_placement_file_and_huge_range_are_one_error(tmp_path):
    """A placement YAML that does not parse, and a range of 10**11 GPUs, each give one ConfigError."""
    p = tmp_path / "place.yaml"
    p.write_text("schema_version: 1\nplacement: {by_group: [a100: 0-7\n")
    with pytest.raises(ConfigError, match=rf"^placement file {p}: not valid YAML"):
        placement_for(None, 8, p)
    with pytest.raises(ConfigError, match=r"^gpus: range '0-99999999999' must lie in 0\.\.1048575$"):
        parse_ranges("0-99999999999", "gpus")
