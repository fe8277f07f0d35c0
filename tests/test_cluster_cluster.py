"""Cluster specs: presets, YAML schema, sizing from the world size, GPU types, errors, round trips."""

from __future__ import annotations

import copy

import pytest
import yaml

from heterosim.errors import TopologyError, UnknownGPUError
from replay.cluster import load_cluster, read_spec, write_spec
from replay.cluster_presets import list_presets, preset_names, preset_path
from replay.cluster_spec import parse_spec

PRESETS = ["dgx-2", "dgx-a100", "dgx-h100", "hgx-a100-4gpu", "hgx-h20", "l40s-pcie", "mixed-a100-h100"]


def tiny(**over):
    """A 2-GPU PCIe node type, one NIC per GPU, two groups' worth of knobs."""
    spec = {
        "schema_version": 1,
        "name": "tiny",
        "node_types": {
            "box": {
                "gpus_per_node": 2,
                "pcie": {"gen": 4, "bw_GBps": 20},
                "nics": {"count": 2, "bw_Gbps": 100},
            }
        },
        "node_groups": [{"name": "g", "gpu": "A100", "node_type": "box"}],
        "fabric": {"kind": "rail_optimized", "nodes_per_leaf": 4},
    }
    spec.update(over)
    return spec


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


@pytest.mark.parametrize("name", PRESETS)
def test_preset_round_trip(name):
    """parse(to_dict(spec)) == spec, also through a YAML dump, for every preset."""
    spec = read_spec(preset_path(name))
    assert parse_spec(spec.to_dict()) == spec
    assert parse_spec(yaml.safe_load(yaml.safe_dump(spec.to_dict()))) == spec
    assert spec.to_dict() == parse_spec(spec.to_dict()).to_dict()


def test_preset_sized_from_world():
    """A per-node preset gets num_gpus / gpus_per_node nodes; GPUs are numbered node by node."""
    c = load_cluster("dgx-a100", num_gpus=32)
    assert (c.num_gpus, c.num_nodes) == (32, 4)
    assert c.node_of(17) == 2 and c.local_index(17) == 1
    assert c.gpu_type(31) == "A100-SXM4-80GB" and c.sm(0) == 80
    assert list(c.gpus_of_node(3)) == list(range(24, 32))
    assert c.rank_to_gpu(5) == 5 and c.gpu_type_of_rank(5) == "A100-SXM4-80GB"


def test_world_not_whole_nodes():
    """A world size that does not fill whole nodes is one clear error naming the step."""
    with pytest.raises(TopologyError, match=r"12 GPUs do not fill whole nodes; the nodes hold GPUs "
                                            r"in steps of 8 \(1x8\); use a world size that is a "
                                            r"multiple of 8"):
        load_cluster("dgx-h100", num_gpus=12)


def test_num_gpus_required_without_node_counts():
    """A preset without node counts needs num_gpus."""
    with pytest.raises(TopologyError, match="has no node count; pass num_gpus"):
        load_cluster("dgx-a100")


def test_mixed_pool_split_by_share():
    """Groups without nodes split the world by share: 32 GPUs -> 2 A100 + 2 H100 nodes."""
    c = load_cluster("mixed-a100-h100", num_gpus=32)
    assert c.num_nodes == 4
    assert [c.gpu_type(g) for g in (0, 15, 16, 31)] == [
        "A100-SXM4-80GB", "A100-SXM4-80GB", "H100-SXM5-80GB", "H100-SXM5-80GB"]
    assert c.gpu_types == ("A100-SXM4-80GB", "H100-SXM5-80GB")
    assert c.group_gpus["h100"] == tuple(range(16, 32))
    with pytest.raises(TopologyError, match=r"in steps of 16 \(1x8 \+ 1x8\)"):
        load_cluster("mixed-a100-h100", num_gpus=24)


def test_fixed_and_shared_groups():
    """Fixed node counts are honoured; the rest of the world goes to the groups without one."""
    spec = tiny(node_groups=[
        {"name": "a", "gpu": "A100", "node_type": "box", "nodes": 1},
        {"name": "h", "gpu": "H100", "node_type": "box", "share": 2},
    ])
    c = load_cluster(spec, num_gpus=10)  # 2 fixed + 8 shared -> 4 h-nodes
    assert c.num_nodes == 5 and c.gpu_type(1) == "A100-SXM4-80GB" and c.gpu_type(2) == "H100-SXM5-80GB"


def test_fixed_size_mismatch():
    """A fully sized cluster refuses a job of another size, naming both numbers."""
    spec = tiny(node_groups=[{"name": "g", "gpu": "A100", "node_type": "box", "nodes": 2}])
    assert load_cluster(spec).num_gpus == 4
    with pytest.raises(TopologyError, match="cluster 'tiny' has 4 GPUs but the job needs 8"):
        load_cluster(spec, num_gpus=8)


def test_unknown_preset():
    """An unknown name is neither a preset nor a file; the error lists the presets."""
    with pytest.raises(TopologyError, match=r"cluster 'dgx-z100' is neither a preset \(dgx-2, "
                                            r"dgx-a100, dgx-h100, hgx-a100-4gpu, hgx-h20, l40s-pcie, "
                                            r"mixed-a100-h100\)"):
        load_cluster("dgx-z100", num_gpus=8)


def test_unknown_key_names_path():
    """Unknown keys name their key path and the valid keys."""
    spec = tiny()
    spec["node_types"]["box"]["pcie"]["speed"] = 3
    with pytest.raises(TopologyError, match=r"node_types.box.pcie: unknown key 'speed'; valid keys: "
                                            r"\['bw_GBps', 'gen', 'latency_us', 'switches', 'width'\]"):
        load_cluster(spec, num_gpus=2)
    with pytest.raises(TopologyError, match=r"cluster spec: unknown key 'nodes'"):
        load_cluster(tiny(nodes=3), num_gpus=2)


def test_schema_version_checked():
    """Only schema_version 1 loads; a missing one is a missing key."""
    with pytest.raises(TopologyError, match="schema_version 2 is not supported; this HeteroSim reads "
                                            "schema_version 1"):
        load_cluster(tiny(schema_version=2), num_gpus=2)
    spec = tiny()
    del spec["schema_version"]
    with pytest.raises(TopologyError, match="missing key 'schema_version'"):
        load_cluster(spec, num_gpus=2)


def test_unknown_gpu_type():
    """A GPU type missing from the kernel_db catalogue names the group and lists known GPUs."""
    spec = tiny(node_groups=[{"name": "g", "gpu": "Z9000", "node_type": "box"}])
    with pytest.raises(UnknownGPUError, match=r"node_groups\[0\] \(g\).gpu: unknown GPU 'Z9000'; "
                                              r"known GPUs: .*A100-SXM4-80GB"):
        load_cluster(spec, num_gpus=2)


def test_value_errors():
    """Bad values are caught with their key path: negative bandwidth, bad PCIe gen, bad fabric."""
    spec = tiny()
    spec["node_types"]["box"]["nics"] = {"count": 2, "bw_Gbps": -1}
    with pytest.raises(TopologyError, match=r"node_types.box.nics.bw_Gbps: must be > 0, got -1"):
        load_cluster(spec, num_gpus=2)
    spec = tiny()
    spec["node_types"]["box"]["pcie"]["gen"] = 7
    with pytest.raises(TopologyError, match=r"unknown PCIe generation 7; valid: \[1, 2, 3, 4, 5, 6\]"):
        load_cluster(spec, num_gpus=2)
    with pytest.raises(TopologyError, match=r"fabric.kind: unknown 'torus'; valid: \['rail_optimized', "
                                            r"'leaf_spine', 'explicit', 'none'\]"):
        load_cluster(tiny(fabric={"kind": "torus"}), num_gpus=2)
    spec = tiny()
    spec["node_types"]["box"]["nics"] = {"count": 3, "bw_Gbps": 100}
    with pytest.raises(TopologyError, match="3 NICs cannot split 2 GPUs evenly"):
        load_cluster(spec, num_gpus=2)


def test_pcie_switch_membership_checked():
    """Every GPU and NIC hangs off exactly one listed PCIe switch."""
    spec = tiny()
    spec["node_types"]["box"]["pcie"]["switches"] = [{"socket": 0, "gpus": [0], "nics": [0, 1]}]
    with pytest.raises(TopologyError, match="GPU 1 hangs off 0 PCIe switches; every GPU must be "
                                            "listed under exactly one switch"):
        load_cluster(spec, num_gpus=2)


def test_multi_node_needs_fabric_and_nics():
    """Several nodes need a fabric, and their GPUs need NICs to reach each other."""
    with pytest.raises(TopologyError, match="the cluster has 2 nodes but fabric kind 'none'"):
        load_cluster(tiny(fabric={"kind": "none"}), num_gpus=4)
    spec = tiny()
    del spec["node_types"]["box"]["nics"]
    c = load_cluster(spec, num_gpus=4)
    with pytest.raises(TopologyError, match=r"node 0 \(node type 'box'\) has no NIC"):
        c.route(0, 2)


def test_yaml_file_and_errors(tmp_path):
    """A YAML file loads like the dict; its errors name the file."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny()))
    assert load_cluster(str(path), num_gpus=4).num_nodes == 2
    path.write_text("schema_version: 1\nname: [unclosed\n")
    with pytest.raises(TopologyError, match=f"cluster file {path}: not valid YAML"):
        load_cluster(path, num_gpus=4)
    bad = tiny()
    bad["fabric"]["spine"] = 2
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(TopologyError, match=f"cluster file {path}: fabric: unknown key 'spine'"):
        load_cluster(path, num_gpus=4)


def test_unknown_gpu_index():
    """Asking about a GPU that does not exist names the valid range."""
    c = load_cluster(tiny(), num_gpus=4)
    with pytest.raises(TopologyError, match="GPU 4 does not exist; cluster 'tiny' has GPUs 0..3"):
        c.gpu_type(4)


def test_describe():
    """describe() names the size, each group with GPU type and NICs, the fabric and placement."""
    text = load_cluster("mixed-a100-h100", num_gpus=32).describe()
    assert text.splitlines()[0].startswith("cluster mixed-a100-h100: 32 GPUs on 4 nodes")
    assert "group a100: 2 nodes x 8 A100-SXM4-80GB" in text and "NICs 8x 200 Gb/s" in text
    assert "group h100: 2 nodes x 8 H100-SXM5-80GB" in text and "(NVLS)" in text
    assert "fabric: rail_optimized, 32 nodes per leaf, oversubscription 1:1" in text
    assert "placement: rank r on GPU r" in text


def test_input_dict_not_mutated():
    """load_cluster leaves the caller's dict alone and is deterministic."""
    spec = tiny()
    before = copy.deepcopy(spec)
    a = load_cluster(spec, num_gpus=8)
    b = load_cluster(spec, num_gpus=8)
    assert spec == before
    assert a.links.bw.tolist() == b.links.bw.tolist() and a.network.vertices == b.network.vertices


@pytest.mark.parametrize("name", PRESETS)
def test_write_spec_byte_identical(name, tmp_path):
    """write_spec is deterministic and read_spec(write_spec(s)) == s."""
    spec = read_spec(preset_path(name))
    a, b = write_spec(spec, tmp_path / "a.yaml"), write_spec(spec, tmp_path / "b.yaml")
    assert a.read_bytes() == b.read_bytes()
    assert read_spec(a) == spec
    assert write_spec(read_spec(a), tmp_path / "c.yaml").read_bytes() == a.read_bytes()


def test_random_values_round_trip():
    """Unit conversions survive the round trip for arbitrary bandwidths and latencies."""
    import random

    rng = random.Random(7)
    for _ in range(50):
        spec = tiny()
        t = spec["node_types"]["box"]
        t["pcie"].update(bw_GBps=rng.uniform(1, 100), latency_us=rng.uniform(0, 3))
        t["nics"] = [{"bw_Gbps": rng.uniform(10, 800), "gpus": [0]}, {"bw_Gbps": 100, "gpus": [1]}]
        t["nvlink"] = {"kind": "nvswitch", "lanes": rng.randint(1, 18), "lane_GBps": rng.uniform(5, 50)}
        spec["fabric"].update(oversubscription=rng.uniform(1, 4), latency_us=rng.uniform(0, 2))
        parsed = parse_spec(spec)
        assert parse_spec(parsed.to_dict()) == parsed


def test_dgx2_shares_nics():
    """DGX-2: 16 V100s, 8 NICs each serving two GPUs; NCCL prices 6 Volta lanes at 20 GB/s."""
    c = load_cluster("dgx-2", num_gpus=32)
    v = c.topology_view()
    assert (c.num_nodes, v.gpus[3].nics, v.gpus[19].nics) == (2, (1,), (9,))
    assert v.links[c.route(0, 1)[0]].nccl_bw == 120e9 and c.sm(0) == 70


def test_fixed_groups_leave_no_room():
    """Fixed groups that already hold the whole job leave nothing for a sized-by-share group."""
    spec = tiny(node_groups=[
        {"name": "a", "gpu": "A100", "node_type": "box", "nodes": 2},
        {"name": "h", "gpu": "H100", "node_type": "box"},
    ])
    with pytest.raises(TopologyError, match="the groups with a node count already hold 4 GPUs, leaving "
                                            "none of the job's 4 for group 'h'"):
        load_cluster(spec, num_gpus=4)
    with pytest.raises(TopologyError, match=r"use a world size that is 4 plus a multiple of 2"):
        load_cluster(spec, num_gpus=7)
    spec["node_groups"][1]["nodes"] = 0
    c = load_cluster(spec, num_gpus=4)
    assert c.group_gpus["h"] == () and "group h: 0 nodes" in c.describe()


def test_num_gpus_checked():
    """num_gpus is a positive integer (numpy integers count); anything else is refused."""
    import numpy as np

    assert load_cluster("dgx-a100", num_gpus=np.int64(16)).num_gpus == 16
    for bad in (0, -8, 8.0, True, "8"):
        with pytest.raises(TopologyError, match=f"num_gpus must be a positive int, got {bad!r}"):
            load_cluster("dgx-a100", num_gpus=bad)
