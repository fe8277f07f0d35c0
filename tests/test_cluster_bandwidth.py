"""heterosim.cluster.bandwidth: physical link rates and what NCCL's topology detection believes."""

import pytest

from heterosim.cluster.bandwidth import (
    NCCL_CPU_GBPS,
    NVLINK_LANE_GBPS,
    PCIE_LANE_GBPS,
    arch_index,
    nccl_nic_bw,
    nccl_nvlink_bw,
    nccl_pcie_bw,
)
from heterosim.errors import TopologyError


def test_physical_lane_rates():
    """Gen4 x16 moves 31.5 GB/s per direction (128b/130b), Gen3 x16 15.75, Gen6 x16 128; an
    NVLink3/4 lane 25 GB/s (12 lanes = 600 GB/s bidirectional on A100)."""
    assert PCIE_LANE_GBPS[4] * 16 == pytest.approx(31.5077, rel=1e-4)
    assert PCIE_LANE_GBPS[3] * 16 == pytest.approx(15.7538, rel=1e-4)
    assert PCIE_LANE_GBPS[6] * 16 == pytest.approx(128.0)
    assert 2 * 12 * NVLINK_LANE_GBPS == 600.0


def test_nccl_cpu_bandwidth_by_vendor():
    """NCCL's socket interconnect: Intel 22, AMD 16, ARM and others 6 GB/s (topo.h)."""
    assert NCCL_CPU_GBPS == {"intel": 22.0, "amd": 16.0, "arm": 6.0, "other": 6.0}


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
