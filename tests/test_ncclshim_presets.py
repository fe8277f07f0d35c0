"""ncclshim.presets: the built-in servers and NCCL-like routes over them."""

import pytest

from heterosim.errors import TopologyError
from ncclshim.presets import PRESETS, ServerSpec, build_cluster, build_preset
from ncclshim.topology import NodeFabric


def _names(view, path):
    return [f"{view.links[i].src}>{view.links[i].dst}" for i in path]


def test_dgx_a100_inventory():
    """A DGX A100 node: 8 GPUs, 8 HDR NICs, one NIC per GPU on a shared Gen4 switch, AMD host."""
    v = build_preset("dgx-a100", nodes=2)
    assert (len(v.gpus), len(v.nics), len(v.nodes)) == (16, 16, 2)
    assert [g.nics[0] for g in v.gpus[:8]] == list(range(8))
    assert [g.pcie_switch for g in v.gpus[:8]] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert v.nodes[1].fabric.cpu_vendor == "amd" and not v.nodes[1].fabric.nvls
    # per node: 8 NIC-switch + 8 NIC-rail + 8 GPU-switch + 8 GPU-NVSwitch + 4 switch-CPU + 1 CPU-CPU,
    # both directions; plus 8 rail-spine pairs.
    assert len(v.links) == 2 * (2 * (8 + 8 + 8 + 8 + 4 + 1) + 8)


def test_nccl_bandwidths_of_dgx_a100_links():
    """NCCL sees 12 x 20 GB/s NVLink, Gen4 x16 = 24 GB/s PCIe and a 25 GB/s HDR NIC."""
    v = build_preset("dgx-a100")
    kinds = {}
    for link in v.links:
        kinds.setdefault((link.kind, link.src.split(".")[-1][:3]), link)
    assert kinds[("nvlink", "gpu")].model_bw == pytest.approx(240e9)
    assert kinds[("nvlink", "gpu")].bw == pytest.approx(300e9)
    assert kinds[("pcie", "gpu")].model_bw == pytest.approx(24e9)
    assert kinds[("net", "nic")].model_bw == pytest.approx(25e9)


def test_routes_follow_nccl_transport_choices():
    """Same node: through the NVSwitch. Across nodes: the destination's rail, directly when the
    rail's NIC shares the source's PCIe switch, relayed over NVLink (PXN) otherwise, and across
    the spine without PXN."""
    v = build_preset("dgx-a100", nodes=2)
    assert _names(v, v.route(0, 1)) == ["n0.gpu0>n0.nvs", "n0.nvs>n0.gpu1"]
    assert _names(v, v.route(1, 8)) == ["n0.gpu1>n0.sw0", "n0.sw0>n0.nic0", "n0.nic0>rail0", "rail0>n1.nic0",
                                        "n1.nic0>n1.sw0", "n1.sw0>n1.gpu0"]
    assert _names(v, v.route(3, 8))[:3] == ["n0.gpu3>n0.nvs", "n0.nvs>n0.gpu0", "n0.gpu0>n0.sw0"]
    assert _names(v, v.route(3, 8, pxn=False))[:5] == ["n0.gpu3>n0.sw1", "n0.sw1>n0.nic3", "n0.nic3>rail3",
                                                       "rail3>spine", "spine>rail0"]


def test_pcie_server_routes_through_the_cpus():
    """Without NVLink, GPUs on different switches meet at the CPU; other sockets cross the CPU link."""
    v = build_preset("l40s-pcie")
    assert _names(v, v.route(0, 1)) == ["n0.gpu0>n0.sw0", "n0.sw0>n0.gpu1"]
    assert _names(v, v.route(0, 7)) == ["n0.gpu0>n0.sw0", "n0.sw0>n0.cpu0", "n0.cpu0>n0.cpu1", "n0.cpu1>n0.sw3",
                                        "n0.sw3>n0.gpu7"]


def test_multi_nic_gpu_picks_nic_by_channel():
    """Two GPUs share two NICs on an L40S-like switch with 2 NICs: the channel rotates the NIC."""
    spec = ServerSpec(gpu_type="L40S", sm=89, gpus=4, pcie_switches=2, sockets=1, nics=4, nic_gbps=200.0,
                      fabric=NodeFabric(kind="pcie"))
    v = build_cluster([spec, spec])
    assert v.gpus[0].nics == (0, 1) and v.gpus[1].nics == (1, 0)
    assert "rail0>n1.nic0" in _names(v, v.route(0, 4, 0))
    assert "rail1>n1.nic1" in _names(v, v.route(0, 4, 1))


def test_spine_is_non_blocking():
    """Each rail's spine link carries the summed bandwidth of that rail's NICs."""
    v = build_preset("dgx-h100", nodes=4)
    spine = [link for link in v.links if link.src == "rail2" and link.dst == "spine"]
    assert len(spine) == 1 and spine[0].bw == pytest.approx(4 * 50e9)


def test_build_is_deterministic():
    """Same inputs give the same links in the same order."""
    assert build_preset("hgx-h20", nodes=2).links == build_preset("hgx-h20", nodes=2).links


def test_gpu_without_nic_cannot_leave_its_node():
    """A node with no NICs gives one clear error when a route must leave it."""
    spec = ServerSpec(gpu_type="A100", sm=80, gpus=2, nvlink_bw=300e9, pcie_switches=1, sockets=1, nics=0,
                      fabric=NodeFabric(kind="nvswitch", nvlink_lanes=12))
    v = build_cluster([spec, spec])
    with pytest.raises(TopologyError, match=r"GPU 0 \(node 0\) has no NIC, so it cannot reach another node"):
        v.route(0, 2)


def test_presets_listed():
    """The four built-in servers exist and an empty cluster is refused."""
    assert sorted(PRESETS) == ["dgx-a100", "dgx-h100", "hgx-h20", "l40s-pcie"]
    with pytest.raises(TopologyError, match="a cluster needs at least one node"):
        build_cluster([])
