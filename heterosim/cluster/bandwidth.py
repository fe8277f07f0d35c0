"""Link bandwidths, twice: what the hardware moves, and what NCCL's topology detection believes.

The cluster network carries both figures on every link (``LinkTable.bw`` and ``.nccl_bw``):
flows are timed on the physical rate; NCCL's channel search and cost model (``ncclshim``) use
the believed one. This module is the one place both tables live.

Physical (per direction, after link-level encoding):

- :data:`PCIE_LANE_GBPS`: one PCIe lane per generation (PCI-SIG base specifications);
- :data:`NVLINK_LANE_GBPS`: one NVLink3/4 lane (A100/H100 datasheets).

What NCCL believes (``src/graph/topo.h``, ``topo.cc``; docs/nccl.md §3.1):

- :func:`nccl_nvlink_bw` (``ncclTopoNVLinkBw``, priced per lane by compute capability),
  :func:`nccl_pcie_bw` (``width * laneSpeed / 80``), :func:`nccl_nic_bw` (``speed / 8000``),
  :data:`NCCL_CPU_GBPS` (socket interconnect by CPU vendor);
- :func:`arch_index`: NCCL's compute-capability bucket, which its tuning tables are indexed by.
"""

from __future__ import annotations

from heterosim.errors import TopologyError

__all__ = [
    "PCIE_LANE_GBPS",
    "NVLINK_LANE_GBPS",
    "NCCL_CPU_GBPS",
    "arch_index",
    "nccl_nvlink_bw",
    "nccl_pcie_bw",
    "nccl_nic_bw",
]

# Payload rate of one PCIe lane per direction, GB/s: 8b/10b encoding up to Gen2, 128b/130b for
# Gen3-5, FLIT mode (~1) for Gen6 (PCI-SIG base specifications). Gen4 x16 = 31.5 GB/s.
PCIE_LANE_GBPS: dict[int, float] = {1: 2.5 * 0.8 / 8, 2: 5 * 0.8 / 8, 3: 8 * 128 / 130 / 8,
                                    4: 16 * 128 / 130 / 8, 5: 32 * 128 / 130 / 8, 6: 64 / 8}
# NVLink3/4 lane: 50 Gb/s x 4 signal pairs = 25 GB/s per direction (A100/H100 datasheets:
# 12 lanes = 600 GB/s and 18 lanes = 900 GB/s bidirectional).
NVLINK_LANE_GBPS = 25.0
# CPU socket interconnect as NCCL models it, GB/s (graph/topo.h; docs/nccl.md §3.1: Intel
# SPR 22, AMD 16, ARM 6). NB: the cluster spec uses it as the physical default too; real
# UPI/xGMI links are faster, but GPU traffic rarely crosses sockets and NCCL's figure is what
# such P2P achieves.
NCCL_CPU_GBPS: dict[str, float] = {"intel": 22.0, "amd": 16.0, "arm": 6.0, "other": 6.0}
# NCCL's PCIe lane speed per generation (``laneSpeed`` in topo.cc), in units of 1/80 GB/s per
# lane after its x80 scaling: Gen3 x16 -> 16 * 60 / 80 = 12 GB/s.
_NCCL_PCIE_LANE = {1: 15, 2: 30, 3: 60, 4: 120, 5: 240, 6: 480}


def arch_index(sm: int) -> int:
    """NCCL's compute-capability index: Volta(<80)=0, Ampere(80-89)=1, Hopper(90-99)=2, Blackwell=3."""
    return 0 if sm < 80 else 1 if sm < 90 else 2 if sm < 100 else 3


def nccl_nvlink_bw(sm: int, lanes: int) -> float:
    """What NCCL assigns to ``lanes`` NVLink lanes of an SM``sm`` GPU, in B/s (``ncclTopoNVLinkBw``).

    Per lane: SM60 18, SM70 20, SM80 20, SM86 12, SM90 20.6, SM100 40.1 GB/s.
    """
    per_lane = 40.1 if sm >= 100 else 20.6 if sm >= 90 else 12.0 if sm == 86 else 20.0 if sm >= 70 else 18.0
    return lanes * per_lane * 1e9


def nccl_pcie_bw(gen: int, width: int) -> float:
    """NCCL's PCIe link bandwidth in B/s: ``width * laneSpeed / 80`` GB/s (Gen3 x16 = 12 GB/s)."""
    if gen not in _NCCL_PCIE_LANE:
        raise TopologyError(f"PCIe generation {gen} is unknown; use one of {sorted(_NCCL_PCIE_LANE)}")
    return width * _NCCL_PCIE_LANE[gen] / 80 * 1e9


def nccl_nic_bw(gbit_per_s: float) -> float:
    """NCCL's NIC bandwidth in B/s: ``speed(Mb/s) / 8000`` GB/s, i.e. the line rate over 8."""
    return gbit_per_s * 1000 / 8000 * 1e9
