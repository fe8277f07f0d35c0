"""heterosim.cluster.cluster: load_cluster sizes a spec to the job, resolves GPU types, describes it."""

from __future__ import annotations

import copy

import pytest
import yaml

from cluster_specs import tiny
from heterosim.cluster import load_cluster
from heterosim.errors import TopologyError, UnknownGPUError


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
                                            r"dgx-a100, dgx-b200, dgx-h100, hgx-a100-4gpu, hgx-h20, l40s-pcie, "
                                            r"mixed-a100-h100\)"):
        load_cluster("dgx-z100", num_gpus=8)


def test_unknown_gpu_type():
    """A GPU type missing from the GPU registry names the group and lists known GPUs."""
    spec = tiny(node_groups=[{"name": "g", "gpu": "Z9000", "node_type": "box"}])
    with pytest.raises(UnknownGPUError, match=r"node_groups\[0\] \(g\).gpu: unknown GPU 'Z9000'; "
                                              r"known GPUs: .*A100-SXM4-80GB"):
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


def test_yaml_file_loads_like_the_dict(tmp_path):
    """load_cluster takes a YAML file path (str or Path) like the dict; its errors name the file."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny()))
    assert load_cluster(str(path), num_gpus=4).num_nodes == 2
    path.write_text("schema_version: 1\nname: [unclosed\n")
    with pytest.raises(TopologyError, match=f"cluster file {path}: not valid YAML"):
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
