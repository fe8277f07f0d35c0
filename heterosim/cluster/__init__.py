"""heterosim.cluster: the cluster model that ncclshim and replay both read.

Along the data flow: hardware description (the YAML schema, :mod:`~heterosim.cluster.spec`,
validated by :mod:`~heterosim.cluster.parse`) and the GPU-types registry
(:mod:`~heterosim.cluster.gpus`) -> network (links, routing; networkx graph on demand,
:mod:`~heterosim.cluster.network`) -> placement (:mod:`~heterosim.cluster.placement`) ->
:class:`Cluster`. Presets are data (``presets/*.yaml``, :mod:`~heterosim.cluster.presets`).
Link bandwidths, physical and as NCCL believes them, live in :mod:`~heterosim.cluster.bandwidth`.

Public names:

- :func:`load_cluster` -> :class:`Cluster`; :func:`resolve_gpu`.
- :func:`read_spec`, :func:`write_spec`, :func:`parse_spec`, :class:`ClusterSpec`.
- :func:`list_presets` -> :class:`PresetInfo`; :func:`preset_names`, :func:`preset_path`.
- :func:`placement_for` -> :class:`Placement`; :func:`stage_of`.
- :class:`Network`, :class:`LinkTable`, :data:`LINK_KINDS`.
- :func:`get_gpu`, :func:`load_catalogue` -> :class:`GpuSpec`, :class:`Catalogue`.

This package imports nothing from ``models``, ``capture``, ``kernel_db``, ``ncclshim`` or
``replay``: they read it. ncclshim's view of a cluster is :func:`ncclshim.view.topology_view`.

Example:
    >>> from heterosim.cluster import load_cluster
    >>> c = load_cluster("dgx-h100", num_gpus=16)
    >>> c.num_nodes, c.gpu_type(12)
    (2, 'H100-SXM5-80GB')
"""

from heterosim.cluster.cluster import Cluster, load_cluster, resolve_gpu
from heterosim.cluster.gpus import Catalogue, GpuSpec, get_gpu, load_catalogue
from heterosim.cluster.network import LINK_KINDS, LinkTable, Network
from heterosim.cluster.parse import parse_spec, read_spec, write_spec
from heterosim.cluster.placement import Placement, placement_for, stage_of
from heterosim.cluster.presets import PresetInfo, list_presets, preset_names, preset_path
from heterosim.cluster.spec import ClusterSpec

__all__ = [
    "Cluster", "load_cluster", "resolve_gpu",
    "ClusterSpec", "parse_spec", "read_spec", "write_spec",
    "PresetInfo", "list_presets", "preset_names", "preset_path",
    "Placement", "placement_for", "stage_of",
    "Network", "LinkTable", "LINK_KINDS",
    "Catalogue", "GpuSpec", "get_gpu", "load_catalogue",
]
