"""ncclshim.graph: the emulated channel search and the rings NCCL builds (docs/nccl.md §2.5, §3.3)."""

import pytest

from heterosim.errors import TopologyError
from ncclshim.graph import analyze, path_type
from heterosim.cluster import load_cluster
from ncclshim.view import preset_view, topology_view


def _all(view):
    return tuple(range(len(view.gpus)))


def test_dgx_a100_single_node_search():
    """A100: 6 rings at 40 GB/s, duplicated to 12 x 20 (busBw 240) and 24 runtime channels."""
    g = analyze(_all(preset_view("dgx-a100")), preset_view("dgx-a100"))
    assert (g.n_channels, g.bw_intra, g.runtime_channels, g.type_intra) == (12, 20.0, 24, "NVL")
    assert g.nvls_channels == 0


def test_dgx_h100_single_node_search_and_nvls_graph():
    """H100: 6 x 60 duplicated to 12 x 30 (busBw 360); NVLS 8 heads at bwIntra 40, bwInter 60."""
    v = preset_view("dgx-h100")
    g = analyze(_all(v), v)
    assert (g.n_channels, g.bw_intra, g.runtime_channels) == (12, 30.0, 24)
    assert (g.nvls_channels, g.nvls_bw_intra, g.nvls_bw_inter) == (8, 40, 60)


def test_nvls_needs_more_than_two_gpus_of_a_node():
    """NCCL's ncclNvlsInit returns without NVLS for a node of two GPUs or fewer: two H100s of a DGX
    H100 get no NVLS heads, three get three."""
    v = preset_view("dgx-h100")
    assert analyze((0, 1), v).nvls_channels == 0
    assert analyze((0, 1, 2), v).nvls_channels == 3


def test_multi_node_searches_are_nic_bound():
    """8 x HDR (25 GB/s) gives 8 channels at 24 (busBw 192); 8 x NDR behind Gen5 gives 8 x 48,
    not duplicated, 16 runtime channels."""
    a = preset_view("dgx-a100", nodes=4)
    g = analyze(_all(a), a)
    assert (g.n_channels, g.bw_inter, g.runtime_channels, g.type_inter) == (8, 24, 16, "PIX")
    h = preset_view("dgx-h100", nodes=4)
    g = analyze(_all(h), h)
    assert (g.n_channels, g.bw_inter, g.runtime_channels) == (8, 48, 16)
    assert (g.nvls_channels, g.nvls_bw_inter) == (8, 48)


def test_rings_enter_and_leave_each_node_through_one_nic():
    """Channel c enters a node at the GPU owning NIC c and leaves from its PCIe-switch partner."""
    v = preset_view("dgx-a100", nodes=2)
    g = analyze(_all(v), v)
    assert len(g.rings) == 8
    assert g.rings[0].order == (0, 2, 3, 4, 5, 6, 7, 1, 8, 10, 11, 12, 13, 14, 15, 9)
    assert g.rings[3].order[:8] == (3, 4, 5, 6, 7, 0, 1, 2)
    for ring in g.rings:
        assert sorted(ring.order) == list(range(16)) and len(ring.hops) == 16
        assert sum(h.inter for h in ring.hops) == 2


def test_single_node_rings_follow_local_order():
    """One node: one distinct ring 0 -> 1 -> ... -> 7 -> 0 (duplicated channels share it)."""
    v = preset_view("dgx-h100")
    g = analyze((4, 5, 6, 7), v)
    assert [r.order for r in g.rings] == [(4, 5, 6, 7)]
    assert [(h.src, h.dst) for h in g.rings[0].hops] == [(4, 5), (5, 6), (6, 7), (7, 4)]


def test_path_types():
    """NVSwitch paths are NVL, one PCIe switch PIX, through a CPU PHB, across sockets SYS, NVLink
    relay to a NIC PXN."""
    v = preset_view("dgx-a100", nodes=2)
    assert path_type(v, v.route(0, 1)) == "NVL"
    assert path_type(v, v.route(1, 8)) == "PIX"
    assert path_type(v, v.route(3, 8)) == "PXN"
    p = preset_view("l40s-pcie")
    assert path_type(p, p.route(0, 2)) == "PHB"
    assert path_type(p, p.route(0, 7)) == "SYS"


def test_pcie_server_is_bound_by_the_cpu_link():
    """L40S: the ring crosses the 22 GB/s (NCCL) socket link, so one channel at 20 GB/s, type SYS."""
    v = preset_view("l40s-pcie")
    g = analyze(_all(v), v)
    assert (g.n_channels, g.bw_intra, g.type_intra) == (1, 20, "SYS")


def test_heterogeneous_group_is_bounded_by_its_slowest_member():
    """An A100 node + an H100 node: Ampere tables, no LL128 sameness, NVLS off, HDR-NIC bound; the
    bottleneck is an A100 NIC link."""
    v = topology_view(load_cluster("mixed-a100-h100", num_gpus=16))
    g = analyze(_all(v), v)
    assert (g.arch, g.same_sm, g.nvls_channels) == (1, False, 0)
    assert (g.n_channels, g.bw_inter) == (8, 24)
    link = v.links[g.bottleneck]
    assert link.kind == "net" and link.src.startswith("n0.nic")


def test_bad_groups_are_refused():
    """Repeated GPUs and GPUs outside the view are errors naming the problem."""
    v = preset_view("dgx-a100")
    with pytest.raises(TopologyError, match=r"ranks \[0, 1, 1\] repeat a GPU"):
        analyze((0, 1, 1), v)
    with pytest.raises(TopologyError, match=r"rank GPU 9 is not in the topology \(8 GPUs\)"):
        analyze((0, 9), v)
