"""ncclshim.topology: NCCL's bandwidth helpers, the view's records and its validation."""

import dataclasses

import pytest

from heterosim.errors import TopologyError
from ncclshim.topology import (
    GPU,
    Link,
    TopologyView,
    arch_index,
    nccl_nic_bw,
    nccl_nvlink_bw,
    nccl_pcie_bw,
)


def test_nvlink_bw_per_lane_follows_ncclTopoNVLinkBw():
    """NVLink lanes are priced 20 GB/s on SM80, 20.6 on SM90, 12 on SM86, 40.1 on SM100."""
    assert nccl_nvlink_bw(80, 12) == pytest.approx(240e9)
    assert nccl_nvlink_bw(90, 18) == pytest.approx(370.8e9)
    assert nccl_nvlink_bw(86, 4) == pytest.approx(48e9)
    assert nccl_nvlink_bw(100, 18) == pytest.approx(721.8e9)
    assert nccl_nvlink_bw(70, 6) == pytest.approx(120e9)


def test_pcie_and_nic_bw_follow_nccl_formulas():
    """PCIe is width*laneSpeed/80 GB/s (Gen3 x16 = 12, Gen4 = 24, Gen5 = 48); a NIC is Gb/s / 8."""
    assert nccl_pcie_bw(3, 16) == pytest.approx(12e9)
    assert nccl_pcie_bw(4, 16) == pytest.approx(24e9)
    assert nccl_pcie_bw(5, 16) == pytest.approx(48e9)
    assert nccl_pcie_bw(4, 8) == pytest.approx(12e9)
    assert nccl_nic_bw(400) == pytest.approx(50e9)
    assert nccl_nic_bw(200) == pytest.approx(25e9)


def test_unknown_pcie_generation_is_named():
    """An unknown PCIe generation is rejected with the valid ones listed."""
    with pytest.raises(TopologyError, match=r"PCIe generation 9 is unknown; use one of \[1, 2, 3, 4, 5, 6\]"):
        nccl_pcie_bw(9, 16)


def test_arch_index_buckets():
    """Volta < 80 <= Ampere < 90 <= Hopper < 100 <= Blackwell."""
    assert [arch_index(s) for s in (70, 80, 86, 89, 90, 100, 120)] == [0, 1, 1, 1, 2, 3, 3]


def test_link_model_bw_defaults_to_hardware_bw():
    """A link without nccl_bw is seen by NCCL at its hardware bandwidth."""
    a = Link(id=0, src="a", dst="b", kind="pcie", bw=31.5e9, latency=0.0)
    b = Link(id=0, src="a", dst="b", kind="pcie", bw=31.5e9, latency=0.0, nccl_bw=24e9)
    assert (a.model_bw, b.model_bw) == (31.5e9, 24e9)


def test_view_rejects_misnumbered_records():
    """GPU indices and link ids must equal their positions; bandwidths must be positive."""
    v = TopologyView.simple("dgx-a100")
    bad_gpu = dataclasses.replace(v.gpus[1], index=5)
    with pytest.raises(TopologyError, match=r"gpus\[1\] has index 5; indices must equal positions"):
        dataclasses.replace(v, gpus=(v.gpus[0], bad_gpu) + v.gpus[2:])
    bad_link = dataclasses.replace(v.links[0], bw=0.0)
    with pytest.raises(TopologyError, match=r"link 0 \(n0.nic0->n0.sw0\) has bandwidth 0.0; must be > 0"):
        dataclasses.replace(v, links=(bad_link,) + v.links[1:])
    ghost = GPU(index=0, node=3, local_index=0, gpu_type="A100", sm=80, pcie_switch=0, cpu_socket=0)
    with pytest.raises(TopologyError, match="GPU 0 is on node 3, but there are 1 nodes"):
        dataclasses.replace(v, gpus=(ghost,) + v.gpus[1:])


def test_route_helpers():
    """A route to oneself is empty; a path's bandwidth is its slowest link, its latency the sum."""
    v = TopologyView.simple("dgx-a100", nodes=2)
    assert v.route(3, 3) == ()
    path = v.route(0, 8)
    assert v.path_bw(path) == pytest.approx(25e9)  # the HDR NIC
    assert v.path_latency(path) == pytest.approx(sum(v.links[i].latency for i in path))
    assert v.path_bw(()) == float("inf")
    assert v.fabric(9).kind == "nvswitch"


def test_simple_rejects_unknown_preset():
    """Unknown presets list the valid names."""
    with pytest.raises(TopologyError, match="unknown cluster preset 'dgx-z'; valid presets: dgx-a100, dgx-h100, "
                                            "hgx-h20, l40s-pcie"):
        TopologyView.simple("dgx-z")
