"""Built-in cluster presets: the YAML files in ``heterosim/cluster/presets/``, listed by name.

Presets are data: each file is a cluster spec (schema in :mod:`heterosim.cluster.spec`); copy
one to start a cluster file of your own. ``python -m replay clusters`` prints :func:`list_presets`. A
preset fixes the node shape but not the node count: :func:`heterosim.cluster.load_cluster` takes
that from the trace's world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from heterosim.cluster.parse import read_spec
from heterosim.errors import TopologyError

__all__ = ["PRESET_DIR", "PresetInfo", "list_presets", "preset_names", "preset_path"]

PRESET_DIR = Path(__file__).with_name("presets")


@dataclass(frozen=True, slots=True, kw_only=True)
class PresetInfo:
    """One line of ``python -m replay clusters``."""

    name: str
    description: str
    gpus: tuple[str, ...]
    """GPU catalogue names, one per node group."""
    gpus_per_node: tuple[int, ...]
    """GPUs per node, one per node group."""
    intra: tuple[str, ...]
    """Intra-node fabric per node group: nvswitch, nvlink_mesh or pcie."""
    nic_Gbps: tuple[float, ...]
    """NIC line rate per node group (the fastest NIC of its node type), Gb/s."""
    nics_per_node: tuple[int, ...]
    fabric: str
    """Inter-node fabric kind."""
    path: Path

    @property
    def summary(self) -> str:
        """The description's headline (up to its first colon), for one-line listings."""
        return self.description.split(":", 1)[0].strip()


def preset_names() -> list[str]:
    """Names of the built-in presets, sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    """The YAML file of preset ``name``.

    Raises:
        TopologyError: unknown name; the message lists the presets.
    """
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise TopologyError(f"unknown cluster preset {name!r}; presets: {', '.join(preset_names())}")
    return path


@lru_cache(maxsize=None)
def _info(name: str) -> PresetInfo:
    spec = read_spec(preset_path(name))
    types = [spec.node_type(g.node_type) for g in spec.node_groups]
    return PresetInfo(
        name=spec.name, description=" ".join(spec.description.split()),
        gpus=tuple(g.gpu for g in spec.node_groups),
        gpus_per_node=tuple(t.gpus_per_node for t in types),
        intra=tuple(t.intra for t in types),
        nic_Gbps=tuple(max((n.bw * 8 / 1e9 for n in t.nics), default=0.0) for t in types),
        nics_per_node=tuple(len(t.nics) for t in types),
        fabric=spec.fabric.kind, path=preset_path(name))


def list_presets() -> list[PresetInfo]:
    """Every built-in preset, sorted by name (for ``python -m replay clusters``)."""
    return [_info(n) for n in preset_names()]
