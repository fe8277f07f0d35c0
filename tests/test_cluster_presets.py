"""heterosim.cluster.presets: the built-in presets are data, listed and resolved by name."""

from __future__ import annotations

import pytest

from cluster_specs import PRESETS
from heterosim.cluster.presets import list_presets, preset_names, preset_path
from heterosim.errors import TopologyError


def test_presets_listed():
    """The required presets (and DGX-2) exist and list_presets describes each from its YAML."""
    assert preset_names() == PRESETS
    info = {p.name: p for p in list_presets()}
    assert info["dgx-a100"].gpus == ("A100-SXM4-80GB",)
    assert info["dgx-a100"].nic_Gbps == (200.0,) and info["dgx-a100"].nics_per_node == (8,)
    assert info["dgx-h100"].nic_Gbps == (400.0,) and info["dgx-h100"].intra == ("nvswitch",)
    assert info["l40s-pcie"].intra == ("pcie",) and info["l40s-pcie"].fabric == "leaf_spine"
    assert info["mixed-a100-h100"].gpus == ("A100-SXM4-80GB", "H100-SXM5-80GB")
    assert all(p.description and p.path.is_file() for p in info.values())
    assert info["dgx-h100"].summary == "NVIDIA DGX H100 nodes"


def test_unknown_preset_lists_the_presets():
    """preset_path fails loudly and lists every preset."""
    with pytest.raises(TopologyError, match=r"unknown cluster preset 'dgx-z'; presets: dgx-2, dgx-a100, "
                                            r"dgx-b200, dgx-h100, hgx-a100-4gpu, hgx-h20, l40s-pcie, mixed-a100-h100"):
        preset_path("dgx-z")


def test_presets_ship_as_yaml_with_a_schema_version():
    """Every preset is a YAML file in heterosim/cluster/presets/ that names its schema_version."""
    for name in PRESETS:
        path = preset_path(name)
        assert path.parent.name == "presets" and path.parent.parent.name == "cluster"
        assert "schema_version: 1" in path.read_text()


def test_dgx_b200_is_nvlink5_with_sharp():
    """DGX B200: 8 B200 on NVLink5 (18 lanes x 50 GB/s = 900 GB/s per direction) with NVLink SHARP,
    8 x 400 Gb/s NICs; NCCL's NVLS carries its one-node all-reduce of 1 GiB."""
    from heterosim.cluster import load_cluster
    from ncclshim.planner import Planner
    from ncclshim.view import preset_view

    info = {p.name: p for p in list_presets()}["dgx-b200"]
    assert (info.gpus, info.nic_Gbps, info.nics_per_node) == (("B200",), (400.0,), (8,))
    spec = load_cluster("dgx-b200", num_gpus=16).spec
    (nt,) = spec.node_types
    assert (nt.nvlink_lanes, nt.nvlink_lane_bw, nt.nvls) == (18, 50e9, True)
    assert Planner(preset_view("dgx-b200", 1)).plan("all_reduce", 1 << 30, tuple(range(8))).algo == "NVLS"
