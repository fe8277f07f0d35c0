"""ncclshim.view: the TopologyView of a cluster (records, link ids, NCCL bandwidths, PXN routes),
cached per cluster, and preset_view for a preset or cluster file."""

from __future__ import annotations

import pytest
import yaml

from heterosim.cluster import load_cluster
from heterosim.errors import TopologyError
from ncclshim.graph import analyze
from ncclshim.view import build_view, preset_view, topology_view


def names(view, path):
    """Vertex sequence of a view path."""
    return [view.links[path[0]].src] + [view.links[i].dst for i in path]


def test_records_match_cluster():
    """GPUs, nodes and NICs carry the cluster's types, switches, sockets and rails."""
    c = load_cluster("mixed-a100-h100", num_gpus=32)
    v = topology_view(c)
    assert (len(v.gpus), len(v.nodes), len(v.nics), len(v.links)) == (32, 4, 32, len(c.links))
    g = v.gpus[21]
    assert (g.node, g.local_index, g.gpu_type, g.sm, g.pcie_switch, g.cpu_socket, g.nics) == (
        2, 5, "H100-SXM5-80GB", 90, 2, 1, (21,))
    assert v.gpus[0].sm == 80 and v.nics[21].rail == 5 and v.nics[21].bw == 50e9
    a100, h100 = v.nodes[0].fabric, v.nodes[3].fabric
    assert (a100.kind, a100.nvls, a100.nvlink_lanes, a100.pcie_gen, a100.cpu_vendor) == (
        "nvswitch", False, 12, 4, "amd")
    assert (h100.nvls, h100.nvlink_lanes, h100.pcie_gen, h100.cpu_vendor) == (True, 18, 5, "intel")
    assert v.nodes[1].gpus == tuple(range(8, 16)) and v.nodes[1].nics == tuple(range(8, 16))


def test_links_are_cluster_links():
    """Link i of the view is link i of the cluster (same ends, bandwidths, latency)."""
    c = load_cluster("dgx-a100", num_gpus=16)
    v = topology_view(c)
    for i in (0, 57, len(c.links) - 1):
        link = v.links[i]
        assert link.id == i
        assert link.src == c.network.vertices[c.links.src[i]]
        assert (link.bw, link.latency, link.nccl_bw) == (c.links.bw[i], c.links.latency[i], c.links.nccl_bw[i])
    nv = v.links[c.route(0, 1)[0]]
    assert (nv.kind, nv.bw, nv.model_bw) == ("nvlink", 300e9, 240e9)


def test_view_cached():
    """topology_view is built once per cluster; build_view builds anew."""
    c = load_cluster("dgx-h100", num_gpus=8)
    assert topology_view(c) is topology_view(c)
    assert build_view(c) is not topology_view(c) and build_view(c).links == topology_view(c).links


def test_pxn_relays_to_destination_rail():
    """GPU 0 -> GPU 12 (rail 4): with PXN, NVLink to GPU 4 and out of NIC 4 on rail 4; without,
    out of its own NIC 0 and across rails through a spine."""
    v = topology_view(load_cluster("dgx-a100", num_gpus=16))
    assert names(v, v.route(0, 12, 0, pxn=True)) == [
        "n0.gpu0", "n0.nvs", "n0.gpu4", "n0.sw2", "n0.nic4", "leaf4.0", "n1.nic4", "n1.sw2", "n1.gpu4"]
    plain = names(v, v.route(0, 12, 0, pxn=False))
    assert plain[:4] == ["n0.gpu0", "n0.sw0", "n0.nic0", "leaf0.0"]
    assert plain[4].startswith("spine") and plain[5:] == ["leaf4.0", "n1.nic4", "n1.sw2", "n1.gpu4"]


def test_rail_nic_on_own_switch_used_directly():
    """GPU 0 -> GPU 9 (rail 1): NIC 1 sits on GPU 0's PCIe switch, so it is used without relay."""
    v = topology_view(load_cluster("dgx-a100", num_gpus=16))
    assert names(v, v.route(0, 9, 0, pxn=True)) == [
        "n0.gpu0", "n0.sw0", "n0.nic1", "leaf1.0", "n1.nic1", "n1.sw0", "n1.gpu1"]


def test_pcie_server_has_no_pxn():
    """Without NVLink there is no PXN relay: the L40S GPU leaves through its own NIC."""
    v = topology_view(load_cluster("l40s-pcie", num_gpus=16))
    p = names(v, v.route(0, 12, 0, pxn=True))
    assert p[:3] == ["n0.gpu0", "n0.sw0", "n0.nic0"] and p[-3:] == ["n1.nic2", "n1.sw2", "n1.gpu4"]
    assert v.path_bw(v.route(0, 12, 0, pxn=True)) == 25e9


def test_same_node_and_self():
    """A route to oneself is empty; same-node routes ignore pxn."""
    v = topology_view(load_cluster("dgx-h100", num_gpus=8))
    assert v.route(3, 3) == ()
    assert v.route(0, 7, 1, pxn=False) == v.route(0, 7, 1, pxn=True)
    assert v.path_latency(v.route(0, 7)) == pytest.approx(0.6e-6)


# NCCL's channel search on the presets, as it was on ncclshim's former hand-built servers
# (same channels, bandwidths in GB/s and path types; NVLS channels on Hopper).
_GRAPH_KEY = ("n_channels", "bw_intra", "bw_inter", "type_intra", "type_inter", "nvls_channels")
_GRAPHS = {
    "dgx-a100": [[8, 24, 24, "NVL", "PIX", 0], [1, 24, 24, "NVL", "PIX", 0], [12, 20.0, 20.0, "NVL", "PIX", 0]],
    "dgx-h100": [[8, 48, 48, "NVL", "PIX", 8], [2, 24.0, 24.0, "NVL", "PIX", 0], [12, 30.0, 30.0, "NVL", "PIX", 4]],
    "hgx-h20": [[8, 48, 48, "NVL", "PIX", 8], [2, 24.0, 24.0, "NVL", "PIX", 0], [12, 30.0, 30.0, "NVL", "PIX", 4]],
    "l40s-pcie": [[1, 20, 20, "SYS", "PIX", 0], [1, 24, 24, "NVL", "PIX", 0], [1, 20, 20, "PHB", "PIX", 0]],
}


@pytest.mark.parametrize("name", sorted(_GRAPHS))
def test_nccl_graph_search_on_presets(name):
    """Two nodes: all 16 GPUs, one GPU per node, and 4 GPUs of one node."""
    v = preset_view(name, nodes=2)
    for ranks, want in zip((tuple(range(16)), (0, 8), (0, 1, 2, 3)), _GRAPHS[name]):
        g = analyze(ranks, v)
        assert [getattr(g, k) for k in _GRAPH_KEY] == want


def test_sharp_and_coherent_memory_reach_the_view():
    """fabric.sharp turns on CollNet (multi-node only); coherent_memory marks the node fabric."""
    spec = {
        "schema_version": 1, "name": "cxl",
        "node_types": {"b": {"gpus_per_node": 2, "pcie": {"gen": 5}, "coherent_memory": True,
                             "nics": {"count": 2, "bw_Gbps": 400}}},
        "node_groups": [{"name": "g", "gpu": "H100", "node_type": "b"}],
        "fabric": {"kind": "rail_optimized", "sharp": True},
    }
    two = topology_view(load_cluster(spec, num_gpus=4))
    assert two.collnet and two.nodes[0].fabric.coherent
    assert not topology_view(load_cluster(spec, num_gpus=2)).collnet
    assert not topology_view(load_cluster("dgx-h100", num_gpus=16)).collnet


def test_mesh_graph_search():
    """HGX A100 4-GPU (NVLink mesh, 4 lanes per pair): NCCL prices the GPU's 12 lanes; 4 rings."""
    v = preset_view("hgx-a100-4gpu", nodes=2)
    assert v.nodes[0].fabric.nvlink_lanes == 12
    for ranks, want in zip((tuple(range(8)), (0, 4), (0, 1)),
                           ([4, 24, 24, "NVL", "PIX"], [1, 24, 24, "NVL", "PIX"], [4, 20.0, 20.0, "NVL", "PIX"])):
        g = analyze(ranks, v)
        assert [getattr(g, k) for k in _GRAPH_KEY[:5]] == want


def test_dgx2_shares_nics():
    """DGX-2: 16 V100s, 8 NICs each serving two GPUs; NCCL prices 6 Volta lanes at 20 GB/s."""
    c = load_cluster("dgx-2", num_gpus=32)
    v = topology_view(c)
    assert (c.num_nodes, v.gpus[3].nics, v.gpus[19].nics) == (2, (1,), (9,))
    assert v.links[c.route(0, 1)[0]].nccl_bw == 120e9 and c.sm(0) == 70


def test_view_shared_by_placements():
    """The view is GPU-indexed, so with_placement copies share it."""
    c = load_cluster("mixed-a100-h100", num_gpus=32)
    view = topology_view(c)
    d = c.with_placement({"by_stage": {0: "h100", 1: "a100"}}, layout={"pp": 2})
    assert topology_view(d) is view


def _hops(view, path):
    return [f"{view.links[i].src}>{view.links[i].dst}" for i in path]


def test_preset_view_dgx_a100_inventory():
    """A DGX A100 node: 8 GPUs, 8 HDR NICs, one NIC per GPU on a shared Gen4 switch, AMD host."""
    v = preset_view("dgx-a100", nodes=2)
    assert v.name == "dgx-a100" and (len(v.gpus), len(v.nics), len(v.nodes)) == (16, 16, 2)
    assert [g.nics[0] for g in v.gpus[:8]] == list(range(8))
    assert [g.pcie_switch for g in v.gpus[:8]] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert v.nodes[1].fabric.cpu_vendor == "amd" and not v.nodes[1].fabric.nvls
    # per node: 8 GPU-NVSwitch + 4 switch-CPU + 8 GPU-switch + 8 NIC-switch + 1 CPU-CPU cables;
    # 16 NIC-leaf cables; 8 rail leaves x one pooled uplink (adaptive routing); both directions each.
    assert len(v.links) == 2 * (2 * (8 + 4 + 8 + 8 + 1) + 16 + 8)


def test_preset_view_nccl_bandwidths_of_dgx_a100_links():
    """NCCL sees 12 x 20 GB/s NVLink, Gen4 x16 = 24 GB/s PCIe and a 25 GB/s HDR NIC."""
    v = preset_view("dgx-a100")
    kinds = {}
    for link in v.links:
        kinds.setdefault((link.kind, link.src.split(".")[-1][:3]), link)
    assert kinds[("nvlink", "gpu")].model_bw == pytest.approx(240e9)
    assert kinds[("nvlink", "gpu")].bw == pytest.approx(300e9)
    assert kinds[("pcie", "gpu")].model_bw == pytest.approx(24e9)
    assert v.nics[0].nccl_bw == pytest.approx(25e9)


def test_preset_view_routes_follow_nccl_transport_choices():
    """Same node: through the NVSwitch. Across nodes: the destination's rail, directly when the
    rail's NIC shares the source's PCIe switch, relayed over NVLink (PXN) otherwise, and across
    a spine without PXN."""
    v = preset_view("dgx-a100", nodes=2)
    assert _hops(v, v.route(0, 1)) == ["n0.gpu0>n0.nvs", "n0.nvs>n0.gpu1"]
    assert _hops(v, v.route(1, 8)) == ["n0.gpu1>n0.sw0", "n0.sw0>n0.nic0", "n0.nic0>leaf0.0",
                                       "leaf0.0>n1.nic0", "n1.nic0>n1.sw0", "n1.sw0>n1.gpu0"]
    assert _hops(v, v.route(3, 8))[:3] == ["n0.gpu3>n0.nvs", "n0.nvs>n0.gpu0", "n0.gpu0>n0.sw0"]
    plain = _hops(v, v.route(3, 8, pxn=False))
    assert plain[:3] == ["n0.gpu3>n0.sw1", "n0.sw1>n0.nic3", "n0.nic3>leaf3.0"]
    assert plain[3].startswith("leaf3.0>spine") and plain[4].endswith(">leaf0.0")


def test_preset_view_pcie_server_routes_through_the_cpus():
    """Without NVLink, GPUs on different switches meet at the CPU; other sockets cross the CPU link."""
    v = preset_view("l40s-pcie")
    assert _hops(v, v.route(0, 1)) == ["n0.gpu0>n0.sw0", "n0.sw0>n0.gpu1"]
    assert _hops(v, v.route(0, 7)) == ["n0.gpu0>n0.sw0", "n0.sw0>n0.cpu0", "n0.cpu0>n0.cpu1",
                                       "n0.cpu1>n0.sw3", "n0.sw3>n0.gpu7"]


def _pcie_box(tmp_path, **node_type):
    """A cluster file: 4-GPU PCIe nodes on two switches, one socket, rail-optimized."""
    box = {"gpus_per_node": 4, "cpu": {"sockets": 1},
           "pcie": {"gen": 4, "switches": [{"socket": 0, "gpus": [0, 1], "nics": [0, 1]},
                                           {"socket": 0, "gpus": [2, 3], "nics": [2, 3]}]},
           "nics": [{"bw_Gbps": 200, "gpus": [0, 1]}, {"bw_Gbps": 200, "gpus": [0, 1]},
                    {"bw_Gbps": 200, "gpus": [2, 3]}, {"bw_Gbps": 200, "gpus": [2, 3]}]}
    box.update(node_type)
    path = tmp_path / "box.yaml"
    path.write_text(yaml.safe_dump({
        "schema_version": 1, "name": "box", "node_types": {"box": box},
        "node_groups": [{"name": "g", "gpu": "L40S", "node_type": "box"}],
        "fabric": {"kind": "rail_optimized"}}))
    return path


def test_multi_nic_gpu_picks_nic_by_channel(tmp_path):
    """Two GPUs share two NICs on their switch: the channel picks the NIC (and rail)."""
    v = preset_view(_pcie_box(tmp_path), nodes=2)
    assert v.gpus[0].nics == (0, 1) and v.gpus[1].nics == (0, 1)
    assert "leaf0.0>n1.nic0" in _hops(v, v.route(0, 4, 0))
    assert "leaf1.0>n1.nic1" in _hops(v, v.route(0, 4, 1))


def test_gpu_without_nic_cannot_leave_its_node(tmp_path):
    """A node with no NICs gives one clear error when a route must leave it."""
    path = _pcie_box(tmp_path)
    raw = yaml.safe_load(path.read_text())
    del raw["node_types"]["box"]["nics"]
    for sw in raw["node_types"]["box"]["pcie"]["switches"]:
        sw["nics"] = []
    path.write_text(yaml.safe_dump(raw))
    v = preset_view(path, nodes=2)
    with pytest.raises(TopologyError, match=r"node 1 \(node type 'box'\) has no NIC, so its GPUs cannot "
                                            "reach other nodes"):
        v.route(0, 4)


def test_preset_view_sizes_every_open_group():
    """nodes=N means N nodes of each node group the spec leaves unsized; the build is deterministic."""
    assert len(preset_view("dgx-h100", nodes=2).gpus) == 16
    mixed = preset_view("mixed-a100-h100", nodes=1)
    assert len(mixed.gpus) == 16 and {g.sm for g in mixed.gpus} == {80, 90}
    assert preset_view("hgx-h20", nodes=2).links == preset_view("hgx-h20", nodes=2).links


def test_preset_view_errors():
    """Unknown names list the presets; zero nodes are refused."""
    with pytest.raises(TopologyError, match=r"cluster 'dgx-z' is neither a preset \(dgx-2, dgx-a100, "):
        preset_view("dgx-z")
    with pytest.raises(TopologyError, match="a cluster needs at least one node; pass nodes >= 1, got 0"):
        preset_view("dgx-a100", nodes=0)
