"""Cluster specs shared by the heterosim.cluster tests (a small node type with knobs to turn)."""

from __future__ import annotations

__all__ = ["PRESETS", "tiny"]

PRESETS = ["dgx-2", "dgx-a100", "dgx-b200", "dgx-h100", "hgx-a100-4gpu", "hgx-h20", "l40s-pcie", "mixed-a100-h100"]


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
