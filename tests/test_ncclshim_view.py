"""ncclshim's TopologyView built from a cluster: records, link ids, NCCL bandwidths, PXN routes."""

from __future__ import annotations

import pytest

from ncclshim.topology import TopologyView
from replay.cluster import load_cluster


def names(view, path):
    """Vertex sequence of a view path."""
    return [view.links[path[0]].src] + [view.links[i].dst for i in path]


def test_records_match_cluster():
    """GPUs, nodes and NICs carry the cluster's types, switches, sockets and rails."""
    c = load_cluster("mixed-a100-h100", num_gpus=32)
    v = c.topology_view()
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
    v = c.topology_view()
    for i in (0, 57, len(c.links) - 1):
        link = v.links[i]
        assert link.id == i
        assert link.src == c.network.vertices[c.links.src[i]]
        assert (link.bw, link.latency, link.nccl_bw) == (c.links.bw[i], c.links.latency[i], c.links.nccl_bw[i])
    nv = v.links[c.route(0, 1)[0]]
    assert (nv.kind, nv.bw, nv.model_bw) == ("nvlink", 300e9, 240e9)


def test_view_cached():
    """topology_view() is built once per cluster."""
    c = load_cluster("dgx-h100", num_gpus=8)
    assert c.topology_view() is c.topology_view()


def test_pxn_relays_to_destination_rail():
    """GPU 0 -> GPU 12 (rail 4): with PXN, NVLink to GPU 4 and out of NIC 4 on rail 4; without,
    out of its own NIC 0 and across rails through a spine."""
    v = load_cluster("dgx-a100", num_gpus=16).topology_view()
    assert names(v, v.route(0, 12, 0, pxn=True)) == [
        "n0.gpu0", "n0.nvs", "n0.gpu4", "n0.sw2", "n0.nic4", "leaf4.0", "n1.nic4", "n1.sw2", "n1.gpu4"]
    plain = names(v, v.route(0, 12, 0, pxn=False))
    assert plain[:4] == ["n0.gpu0", "n0.sw0", "n0.nic0", "leaf0.0"]
    assert plain[4].startswith("spine") and plain[5:] == ["leaf4.0", "n1.nic4", "n1.sw2", "n1.gpu4"]


def test_rail_nic_on_own_switch_used_directly():
    """GPU 0 -> GPU 9 (rail 1): NIC 1 sits on GPU 0's PCIe switch, so it is used without relay."""
    v = load_cluster("dgx-a100", num_gpus=16).topology_view()
    assert names(v, v.route(0, 9, 0, pxn=True)) == [
        "n0.gpu0", "n0.sw0", "n0.nic1", "leaf1.0", "n1.nic1", "n1.sw0", "n1.gpu1"]


def test_pcie_server_has_no_pxn():
    """Without NVLink there is no PXN relay: the L40S GPU leaves through its own NIC."""
    v = load_cluster("l40s-pcie", num_gpus=16).topology_view()
    p = names(v, v.route(0, 12, 0, pxn=True))
    assert p[:3] == ["n0.gpu0", "n0.sw0", "n0.nic0"] and p[-3:] == ["n1.nic2", "n1.sw2", "n1.gpu4"]
    assert v.path_bw(v.route(0, 12, 0, pxn=True)) == 25e9


def test_same_node_and_self():
    """A route to oneself is empty; same-node routes ignore pxn."""
    v = load_cluster("dgx-h100", num_gpus=8).topology_view()
    assert v.route(3, 3) == ()
    assert v.route(0, 7, 1, pxn=False) == v.route(0, 7, 1, pxn=True)
    assert v.path_latency(v.route(0, 7)) == pytest.approx(0.6e-6)


@pytest.mark.parametrize("name,nodes", [("dgx-a100", 2), ("dgx-h100", 2), ("hgx-h20", 2), ("l40s-pcie", 2)])
def test_parity_with_ncclshim_presets(name, nodes):
    """NCCL's channel search sees the same graph on our presets as on ncclshim's own servers."""
    graph = pytest.importorskip("ncclshim.graph")
    mine = load_cluster(name, num_gpus=8 * nodes).topology_view()
    ref = TopologyView.simple(name, nodes=nodes)
    for ranks in (tuple(range(8 * nodes)), tuple(range(0, 8 * nodes, 8)), (0, 1, 2, 3)):
        a, b = graph.analyze(ranks, mine), graph.analyze(ranks, ref)
        key = ("n_channels", "bw_intra", "bw_inter", "type_intra", "type_inter", "nvls_channels")
        assert [getattr(a, k) for k in key] == [getattr(b, k) for k in key]


def test_sharp_and_coherent_memory_reach_the_view():
    """fabric.sharp turns on CollNet (multi-node only); coherent_memory marks the node fabric."""
    spec = {
        "schema_version": 1, "name": "cxl",
        "node_types": {"b": {"gpus_per_node": 2, "pcie": {"gen": 5}, "coherent_memory": True,
                             "nics": {"count": 2, "bw_Gbps": 400}}},
        "node_groups": [{"name": "g", "gpu": "H100", "node_type": "b"}],
        "fabric": {"kind": "rail_optimized", "sharp": True},
    }
    two = load_cluster(spec, num_gpus=4).topology_view()
    assert two.collnet and two.nodes[0].fabric.coherent
    assert not load_cluster(spec, num_gpus=2).topology_view().collnet
    assert not load_cluster("dgx-h100", num_gpus=16).topology_view().collnet


def test_mesh_parity_with_ncclshim_servers():
    """HGX A100 4-GPU (NVLink mesh, 4 lanes per pair): same NCCL graph as ncclshim's own server."""
    graph = pytest.importorskip("ncclshim.graph")
    from ncclshim.presets import ServerSpec, build_cluster
    from ncclshim.topology import NodeFabric

    server = ServerSpec(gpu_type="A100-SXM4-80GB", sm=80, gpus=4, nvlink_bw=300e9, pcie_switches=2, sockets=1,
                        nics=4, nic_gbps=200, fabric=NodeFabric(kind="nvlink_mesh", nvlink_lanes=12, pcie_gen=4,
                                                                cpu_vendor="amd"))
    mine = load_cluster("hgx-a100-4gpu", num_gpus=8).topology_view()
    ref = build_cluster([server] * 2)
    assert mine.nodes[0].fabric.nvlink_lanes == 12
    for ranks in (tuple(range(8)), (0, 4), (0, 1)):
        a, b = graph.analyze(ranks, mine), graph.analyze(ranks, ref)
        key = ("n_channels", "bw_intra", "bw_inter", "type_intra", "type_inter")
        assert [getattr(a, k) for k in key] == [getattr(b, k) for k in key]
