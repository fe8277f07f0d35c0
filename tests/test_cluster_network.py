"""The cluster network: link tables built from node types and fabrics, routing and ECMP."""

from __future__ import annotations

import zlib

import networkx as nx
import pytest

from heterosim.errors import TopologyError
from heterosim.cluster import load_cluster, preset_path, read_spec
from heterosim.cluster.network import LINK_KINDS, ecmp_index


def hops(c, path):
    """Vertex sequence of a path."""
    V, L = c.network.vertices, c.links
    return [V[L.src[path[0]]]] + [V[L.dst[i]] for i in path]


def box(nodes_per_leaf=4, **fabric):
    return {
        "schema_version": 1, "name": "box",
        "node_types": {"b": {"gpus_per_node": 2, "pcie": {"gen": 4, "bw_GBps": 20},
                             "nics": {"count": 2, "bw_Gbps": 100}}},
        "node_groups": [{"name": "g", "gpu": "A100", "node_type": "b"}],
        "fabric": {"kind": "rail_optimized", "nodes_per_leaf": nodes_per_leaf, **fabric},
    }


def a100(routing):
    """The dgx-a100 preset (adaptive routing, InfiniBand) with ``routing`` instead."""
    d = read_spec(preset_path("dgx-a100")).to_dict()
    d["fabric"] = {**d["fabric"], "routing": routing}
    return d


def test_dgx_a100_link_count_by_hand():
    """2 DGX A100 nodes: 29 cables per node (8 GPU-NVS, 8 GPU-PCIe, 8 NIC-PCIe, 4 switch-CPU,
    1 CPU-CPU), 16 NIC-leaf cables, 8 rail leaves x 20 spines under ECMP, x one pooled uplink
    under adaptive routing; two links per cable."""
    c = load_cluster(a100("ecmp"), num_gpus=16)
    assert len(c.links) == 2 * (2 * 29 + 16 + 8 * 20)
    c = load_cluster("dgx-a100", num_gpus=16)
    assert len(c.links) == 2 * (2 * 29 + 16 + 8)
    kinds = [LINK_KINDS[k] for k in c.links.kind]
    assert kinds.count("nvlink") == 2 * 16 and kinds.count("cpu") == 2 * 2
    assert not c.links.bw.flags.writeable


def test_nvswitch_route_and_numbers():
    """Same-node GPUs on NVSwitch: GPU -> nvs -> GPU, 300 GB/s, NCCL sees 12 x 20 GB/s, 0.6 us."""
    c = load_cluster("dgx-a100", num_gpus=8)
    p = c.route(0, 5)
    assert hops(c, p) == ["n0.gpu0", "n0.nvs", "n0.gpu5"]
    assert c.links.bw[list(p)].tolist() == [300e9, 300e9]
    assert c.links.nccl_bw[list(p)].tolist() == [240e9, 240e9]
    assert sum(c.links.latency[list(p)]) == pytest.approx(0.6e-6)
    assert c.network.path_type(p) == "NVL" and c.route(3, 3) == ()


def test_h100_nccl_nvlink_and_pcie_gen5():
    """H100: NCCL prices 18 lanes x 20.6 GB/s; Gen5 x16 PCIe is 48 GB/s to NCCL, 63 GB/s payload."""
    c = load_cluster("dgx-h100", num_gpus=8)
    p = c.route(0, 1)
    assert c.links.nccl_bw[p[0]] == pytest.approx(18 * 20.6e9)
    q = c.route(0, 0 + 1, src_nic=0)  # same node: NIC ignored
    assert q == p
    pcie = [i for i in range(len(c.links)) if LINK_KINDS[c.links.kind[i]] == "pcie"]
    assert c.links.nccl_bw[pcie[0]] == pytest.approx(48e9)
    assert c.links.bw[pcie[0]] == pytest.approx(16 * 32e9 * 128 / 130 / 8)


def test_same_rail_cross_node():
    """GPU i to GPU i of another node: own NIC, one rail leaf, no spine; 25 GB/s, six 0.5 us hops."""
    c = load_cluster("dgx-a100", num_gpus=16)
    p = c.route(2, 10)
    assert hops(c, p) == ["n0.gpu2", "n0.sw1", "n0.nic2", "leaf2.0", "n1.nic2", "n1.sw1", "n1.gpu2"]
    assert min(c.links.bw[list(p)]) == 25e9
    assert sum(c.links.latency[list(p)]) == pytest.approx(3.0e-6)
    assert c.network.path_type(p) == "NET"


def test_cross_rail_goes_through_a_spine_by_ecmp():
    """GPU 0 -> GPU 9 (NIC 0 -> NIC 1) crosses rails via spine crc32(src>dst#ch) % 20."""
    c = load_cluster(a100("ecmp"), num_gpus=16)
    net = c.network
    a, b = net.nic_vertex[(0, 0)], net.nic_vertex[(1, 1)]
    for ch in range(4):
        p = c.route(0, 9, ch, src_nic=0, dst_nic=1)
        s = zlib.crc32(f"{a}>{b}#{ch}".encode()) % 20
        assert hops(c, p)[3:6] == ["leaf0.0", f"spine{s}", "leaf1.0"]
    spines = {hops(c, c.route(0, 9, ch, src_nic=0, dst_nic=1))[4] for ch in range(32)}
    assert len(spines) > 5  # channels spread over the spines


def test_spine_uplinks_sized_by_design():
    """A rail leaf built for 20 nodes of 25 GB/s with 20 spines has 25 GB/s per uplink even when
    only 2 nodes are present; oversubscription 2 halves it."""
    c = load_cluster(a100("ecmp"), num_gpus=16)
    V, L = c.network.vertices, c.links
    up = [i for i in range(len(L)) if V[L.src[i]] == "leaf0.0" and V[L.dst[i]].startswith("spine")]
    assert len(up) == 20 and set(L.bw[up].tolist()) == {25e9}
    c2 = load_cluster(box(oversubscription=2.0, spines=2), num_gpus=4)
    V, L = c2.network.vertices, c2.links
    up = [i for i in range(len(L)) if V[L.src[i]] == "leaf0.0" and V[L.dst[i]].startswith("spine")]
    assert L.bw[up].tolist() == [4 * 12.5e9 / (2.0 * 2)] * 2


def test_pods_and_single_leaf():
    """Nodes fill pods of nodes_per_leaf; one pod and one rail means no spine at all."""
    c = load_cluster(box(nodes_per_leaf=2), num_gpus=8)  # 4 nodes -> 2 pods x 2 rails
    leaves = sorted(v for v in c.network.vertices if v.startswith("leaf"))
    assert leaves == ["leaf0.0", "leaf0.1", "leaf1.0", "leaf1.1"]
    one = load_cluster({**box(), "fabric": {"kind": "leaf_spine", "nodes_per_leaf": 8}}, num_gpus=8)
    assert not any(v.startswith("spine") for v in one.network.vertices)
    assert hops(one, one.route(0, 2))[3] == "leaf0"


def test_pcie_tree_path_types():
    """L40S server: PIX on one switch, PHB through the CPU, SYS across sockets (docs/nccl.md §3.2)."""
    c = load_cluster("l40s-pcie", num_gpus=8)
    assert [c.network.path_type(c.route(0, g)) for g in (1, 2, 7)] == ["PIX", "PHB", "SYS"]
    assert hops(c, c.route(0, 7)) == ["n0.gpu0", "n0.sw0", "n0.cpu0", "n0.cpu1", "n0.sw3", "n0.gpu7"]
    assert min(c.links.bw[list(c.route(0, 1))]) == 25e9


def test_nvlink_mesh_relays_through_gpu():
    """A 4-GPU NVLink ring: 0 -> 2 has two equal 2-hop NVLink paths (NVB), picked by ECMP."""
    spec = {
        "schema_version": 1, "name": "ring",
        "node_types": {"r": {"gpus_per_node": 4, "pcie": {"gen": 4},
                             "nvlink": {"kind": "mesh", "pairs": [[0, 1, 4], [1, 2, 4], [2, 3, 4], [3, 0, 4]]}}},
        "node_groups": [{"name": "g", "gpu": "A100", "node_type": "r", "nodes": 1}],
    }
    c = load_cluster(spec)
    assert hops(c, c.route(0, 1)) == ["n0.gpu0", "n0.gpu1"]
    mids = {hops(c, c.route(0, 2, ch))[1] for ch in range(16)}
    assert mids == {"n0.gpu1", "n0.gpu3"}
    assert c.network.path_type(c.route(0, 2)) == "NVB"
    assert c.links.bw[c.route(0, 1)[0]] == 100e9


def test_explicit_fabric():
    """Explicit cables: NICs to named switches; routes take the fewest hops."""
    spec = box()
    spec["fabric"] = {"kind": "explicit", "switches": ["s0", "s1"], "edges": [
        {"a": "n0.nic0", "b": "s0", "bw_GBps": 10}, {"a": "n0.nic1", "b": "s0", "bw_GBps": 10},
        {"a": "n1.nic0", "b": "s1", "bw_GBps": 10}, {"a": "n1.nic1", "b": "s1", "bw_GBps": 10},
        {"a": "s0", "b": "s1", "bw_GBps": 5, "latency_us": 2}]}
    c = load_cluster(spec, num_gpus=4)
    p = c.route(0, 2)
    assert hops(c, p)[2:6] == ["n0.nic0", "s0", "s1", "n1.nic0"]
    assert min(c.links.bw[list(p)]) == 5e9
    bad = box()
    bad["fabric"] = {"kind": "explicit", "edges": [{"a": "n0.nic0", "b": "s9", "bw_GBps": 1}]}
    with pytest.raises(TopologyError, match=r"fabric.edges\[0\]: endpoint 's9' is neither a NIC"):
        load_cluster(bad, num_gpus=4)
    bad["fabric"] = {"kind": "explicit", "switches": ["n0.core"], "edges": []}
    with pytest.raises(TopologyError, match=r"fabric.switches: 'n0.core' is named like a node vertex"):
        load_cluster(bad, num_gpus=4)
    bad["fabric"] = {"kind": "explicit", "edges": [
        {"a": "n0.nic0", "b": "n1.nic0", "bw_GBps": 1}, {"a": "n0.nic1", "b": "n1.nic1", "bw_GBps": 1}]}
    with pytest.raises(TopologyError, match="the fabric falls into 2 disconnected parts"):
        load_cluster(bad, num_gpus=4)


def test_ecmp_index_stable():
    """ECMP choice is a pure function of (src, dst, channel, count)."""
    assert ecmp_index(3, 7, 1, 1) == 0
    assert ecmp_index(3, 7, 1, 8) == zlib.crc32(b"3>7#1") % 8


def test_networkx_graph_matches_table():
    """The networkx view has one vertex per name and one edge per link, with its attributes."""
    c = load_cluster("dgx-a100", num_gpus=16)
    g = c.graph
    assert g.number_of_nodes() == len(c.network.vertices)
    assert g.number_of_edges() == len(c.links)
    e = g.edges["n0.gpu0", "n0.nvs"]
    assert (e["bw"], e["kind"]) == (300e9, "nvlink") and e["id"] == c.route(0, 1)[0]
    assert g.nodes["n1.nic3"] == {"kind": "nic", "node": 1}
    assert g.nodes["spines"]["kind"] == "switch"
    assert nx.is_strongly_connected(g)


def test_adaptive_routing_pools_a_leafs_uplinks():
    """Adaptive routing: every cross-rail flow goes leaf -> the one logical spine layer -> leaf over
    a pooled uplink of 20 x 25 GB/s, whatever its channel; that uplink can never saturate before
    the leaf's NICs (2 present x 25 GB/s <= 500 GB/s), so it is never binding. Oversubscribed
    4:1 with 20 nodes present it can (500 / 4 < 20 x 25 GB/s)."""
    c = load_cluster("dgx-a100", num_gpus=16)
    V, L = c.network.vertices, c.links
    paths = {c.route(0, 9, ch, src_nic=0, dst_nic=1) for ch in range(8)}
    assert len(paths) == 1
    p = paths.pop()
    assert hops(c, p)[3:6] == ["leaf0.0", "spines", "leaf1.0"]
    assert L.bw[p[3]] == L.bw[p[4]] == 20 * 25e9
    assert sum(L.latency[list(p)]) == pytest.approx(4.0e-6)  # 8 cables of 0.5 us, as with ECMP
    pooled = {i for i in range(len(L)) if "spines" in (V[L.src[i]], V[L.dst[i]])}
    assert len(pooled) == 2 * 8 and c.network.never_binding == pooled
    over = a100("adaptive")
    over["fabric"]["oversubscription"] = 4.0
    assert not load_cluster(over, num_gpus=160).network.never_binding
    assert load_cluster(a100("ecmp"), num_gpus=16).network.never_binding == frozenset()


def test_gpus_sharing_a_nic_share_its_links():
    """L40S GPUs 0 and 1 hang off one switch with one NIC: their cross-node routes share exactly
    the switch->NIC and NIC->leaf links (so max-min sharing halves the NIC between them)."""
    c = load_cluster("l40s-pcie", num_gpus=16)
    a, b = c.route(0, 8), c.route(1, 9)
    shared = sorted(tuple(hops(c, (i,))) for i in set(a) & set(b))
    assert shared == [("leaf0", "n1.nic0"), ("n0.nic0", "leaf0"), ("n0.sw0", "n0.nic0"), ("n1.nic0", "n1.sw0")]
    # DGX A100: one NIC per GPU, so neighbours on a switch share nothing but the fabric.
    d = load_cluster("dgx-a100", num_gpus=16)
    assert not set(d.route(0, 8)) & set(d.route(1, 9))
