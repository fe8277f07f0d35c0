"""A cluster to replay on: node groups of GPUs, the links between them, and where each rank runs.

:func:`load_cluster` reads a preset name, a YAML file or a dict (schema in
:mod:`heterosim.cluster.spec`), sizes it to the job, resolves GPU types through the GPU registry
(:mod:`heterosim.cluster.gpus`), builds the network (:mod:`heterosim.cluster.network`) and
applies a placement (:mod:`heterosim.cluster.placement`). ncclshim's view of a cluster is
built by :func:`ncclshim.view.topology_view`.

Vocabulary: a *gpu* is a device of the cluster (numbered node by node, node groups in spec
order); a *rank* is a process of the job; :meth:`Cluster.rank_to_gpu` is the placement.

Example:
    >>> from heterosim.cluster import load_cluster
    >>> c = load_cluster("dgx-a100", num_gpus=16)
    >>> c.num_nodes, c.gpu_type(9), c.node_of(9)
    (2, 'A100-SXM4-80GB', 1)
    >>> [c.network.vertices[c.links.src[i]] for i in c.route(0, 1)]
    ['n0.gpu0', 'n0.nvs']
"""

from __future__ import annotations

import operator
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from heterosim.cluster.gpus import Catalogue, extend_catalogue, get_gpu, load_catalogue
from heterosim.cluster.network import LinkTable, Network
from heterosim.cluster.parse import cluster_gpus, parse_spec, read_spec
from heterosim.cluster.placement import Placement, placement_for
from heterosim.cluster.presets import preset_names, preset_path
from heterosim.cluster.spec import ClusterSpec, NodeGroup
from heterosim.errors import ConfigError, TopologyError, UnknownGPUError

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["Cluster", "load_cluster", "resolve_gpu"]


def resolve_gpu(name: str, catalogue: Catalogue | None = None) -> tuple[str, int]:
    """Catalogue name and compute capability (x10) of GPU ``name`` (any alias) in ``catalogue``
    (default: the GPU registry).

    Raises:
        UnknownGPUError: the name is not in the catalogue (the message lists it).
    """
    g = catalogue.get(name) if catalogue is not None else get_gpu(name)
    return g.name, g.compute_capability


MAX_GPUS = 1 << 20
"""The largest cluster HeteroSim builds (1,048,576 GPUs, the largest world a trace may claim)."""


def _node_counts(spec: ClusterSpec, num_gpus: int | None) -> list[int]:
    """Nodes per group: fixed ``nodes``, the rest split from ``num_gpus`` by ``share``."""
    gpn = [spec.node_type(g.node_type).gpus_per_node for g in spec.node_groups]
    fixed = sum(g.nodes * n for g, n in zip(spec.node_groups, gpn) if g.nodes is not None)
    flex = [i for i, g in enumerate(spec.node_groups) if g.nodes is None]
    if not flex:
        if num_gpus is not None and num_gpus != fixed:
            raise TopologyError(
                f"cluster {spec.name!r} has {fixed} GPUs but the job needs {num_gpus}; change the "
                "node counts (node_groups[].nodes) or drop them to size the cluster to the job"
            )
        return [g.nodes for g in spec.node_groups]  # type: ignore[misc]
    if num_gpus is None:
        raise TopologyError(
            f"cluster {spec.name!r}: node group {spec.node_groups[flex[0]].name!r} has no node "
            "count; pass num_gpus (the trace's world size) or give nodes: in the spec"
        )
    rest = num_gpus - fixed
    # The flexible groups grow together in steps of `unit` GPUs: group i gets share_i * k nodes.
    unit = sum(spec.node_groups[i].share * gpn[i] for i in flex)
    if rest <= 0:
        raise TopologyError(
            f"cluster {spec.name!r}: the groups with a node count already hold {fixed} GPUs, "
            f"leaving none of the job's {num_gpus} for group "
            f"{spec.node_groups[flex[0]].name!r}; lower their nodes: or give the group nodes: 0"
        )
    if rest % unit:
        shape = " + ".join(f"{spec.node_groups[i].share}x{gpn[i]}" for i in flex)
        raise TopologyError(
            f"cluster {spec.name!r}: {num_gpus} GPUs do not fill whole nodes"
            + (f" ({fixed} in fixed groups)" if fixed else "")
            + f"; the {'groups take' if len(flex) > 1 else 'nodes hold'} GPUs in steps of "
            f"{unit} ({shape}); use a world size that is "
            + (f"{fixed} plus " if fixed else "") + f"a multiple of {unit}"
        )
    k = rest // unit
    return [g.nodes if g.nodes is not None else g.share * k for g in spec.node_groups]


class Cluster:
    """GPUs, nodes, network and placement of one cluster; build it with :func:`load_cluster`.

    Attributes:
        name: the spec's name.
        spec: the parsed :class:`~heterosim.cluster.spec.ClusterSpec`.
        num_gpus, num_nodes: sizes.
        network: the :class:`~heterosim.cluster.network.Network` (vertices, links, routes).
        gpu_types: distinct GPU catalogue names, in node-group order.
        gpu_type_ids: per GPU, index into ``gpu_types`` (int array, read-only).
        gpu_node: per GPU, its node (int array, read-only).
        rank_gpu: per rank, its GPU (int array, read-only).
        derived: placement-independent objects that other layers build from this cluster once
            (ncclshim's topology view), by key; :meth:`with_placement` copies share it.
    """

    def __init__(self, spec: ClusterSpec, nodes: list[int], placement: Placement) -> None:
        self.spec = spec
        self.name = spec.name
        self.catalogue: Catalogue = extend_catalogue(load_catalogue(), cluster_gpus(spec.gpus),
                                                     f"cluster {spec.name!r}")
        """The GPU registry plus the accelerators the cluster file defines: what prices this cluster."""
        groups = spec.node_groups
        gpu_names: list[str] = []
        sms: list[int] = []
        for i, g in enumerate(groups):
            try:
                nm, sm = resolve_gpu(g.gpu, self.catalogue)
            except UnknownGPUError as e:
                raise UnknownGPUError(f"node_groups[{i}] ({g.name}).gpu: {e}") from None
            gpu_names.append(nm)
            sms.append(sm)
        self.gpu_types: tuple[str, ...] = tuple(dict.fromkeys(gpu_names))
        node_types, node_sms, node_group = [], [], []
        for i, (g, n) in enumerate(zip(groups, nodes)):
            node_types += [spec.node_type(g.node_type)] * n
            node_sms += [sms[i]] * n
            node_group += [i] * n
        if not node_types:
            raise TopologyError(f"cluster {spec.name!r} has no nodes")
        self.network = Network(node_types, node_sms, spec.fabric)
        gpn = np.array([t.gpus_per_node for t in node_types], dtype=np.int64)
        self.node_gpu_base = np.concatenate([[0], np.cumsum(gpn)])
        self.num_nodes = len(node_types)
        self.num_gpus = int(self.node_gpu_base[-1])
        self.gpu_node = np.repeat(np.arange(self.num_nodes), gpn)
        self.gpu_local = np.arange(self.num_gpus) - self.node_gpu_base[self.gpu_node]
        self.node_group = np.asarray(node_group, dtype=np.int64)
        self.gpu_group = self.node_group[self.gpu_node]
        group_type = np.array([self.gpu_types.index(nm) for nm in gpu_names], dtype=np.int64)
        self.gpu_type_ids = group_type[self.gpu_group]
        self.group_gpus = {g.name: tuple(int(x) for x in np.flatnonzero(self.gpu_group == i))
                           for i, g in enumerate(groups)}
        self._sms = sms
        self.placement = placement
        self.rank_gpu = np.asarray(placement.resolve(self.num_gpus, self.group_gpus), dtype=np.int64)
        for arr in (self.gpu_node, self.gpu_local, self.gpu_group, self.gpu_type_ids, self.rank_gpu,
                    self.node_gpu_base, self.node_group):
            arr.setflags(write=False)
        self.derived: dict[str, Any] = {}

    # ---- GPUs and nodes -------------------------------------------------------------------
    def _check_gpu(self, gpu: int) -> int:
        if not 0 <= gpu < self.num_gpus:
            raise TopologyError(f"GPU {gpu} does not exist; cluster {self.name!r} has GPUs "
                                f"0..{self.num_gpus - 1}")
        return int(gpu)

    def gpu_type(self, gpu: int) -> str:
        """Catalogue name of ``gpu``'s type (:attr:`catalogue` resolves it)."""
        return self.gpu_types[self.gpu_type_ids[self._check_gpu(gpu)]]

    def sm(self, gpu: int) -> int:
        """Compute capability x10 of ``gpu``."""
        return self._sms[self.gpu_group[self._check_gpu(gpu)]]

    def node_of(self, gpu: int) -> int:
        """Node (server) index of ``gpu``."""
        return int(self.gpu_node[self._check_gpu(gpu)])

    def local_index(self, gpu: int) -> int:
        """Index of ``gpu`` inside its node."""
        return int(self.gpu_local[self._check_gpu(gpu)])

    def group_of(self, gpu: int) -> NodeGroup:
        """The node group ``gpu`` belongs to."""
        return self.spec.node_groups[self.gpu_group[self._check_gpu(gpu)]]

    def gpus_of_node(self, node: int) -> range:
        """Global GPU indices of ``node``."""
        return range(int(self.node_gpu_base[node]), int(self.node_gpu_base[node + 1]))

    # ---- ranks ----------------------------------------------------------------------------
    @property
    def num_ranks(self) -> int:
        """Ranks the placement places (the cluster size under the identity placement)."""
        return len(self.rank_gpu)

    def rank_to_gpu(self, rank: int) -> int:
        """GPU that runs ``rank``."""
        if not 0 <= rank < len(self.rank_gpu):
            raise ConfigError(f"rank {rank} is not placed; the placement covers ranks "
                              f"0..{len(self.rank_gpu) - 1}")
        return int(self.rank_gpu[rank])

    def gpu_type_of_rank(self, rank: int) -> str:
        """GPU catalogue name of the GPU running ``rank``."""
        return self.gpu_type(self.rank_to_gpu(rank))

    def with_placement(self, placement: Placement | Mapping[str, Any] | str | os.PathLike | None,
                       *, layout: Mapping[str, Any] | None = None) -> "Cluster":
        """The same cluster with another placement; the network and :attr:`derived` (e.g. the
        placement-independent topology view) are shared, not rebuilt."""
        p = placement_for(layout, self.num_gpus, placement)
        other = object.__new__(Cluster)
        for k, v in self.__dict__.items():
            other.__dict__[k] = v
        other.placement = p
        other.rank_gpu = np.asarray(p.resolve(self.num_gpus, self.group_gpus), dtype=np.int64)
        other.rank_gpu.setflags(write=False)
        return other

    # ---- network --------------------------------------------------------------------------
    @property
    def links(self) -> LinkTable:
        """Every directed link (bandwidth, latency, kind) as arrays; a link id is a row."""
        return self.network.links

    @property
    def graph(self) -> "nx.DiGraph":
        """The network as a networkx DiGraph (see :attr:`Network.graph`)."""
        return self.network.graph

    def route(self, src: int, dst: int, channel: int = 0, *, src_nic: int | None = None,
              dst_nic: int | None = None) -> tuple[int, ...]:
        """Link ids from GPU ``src`` to GPU ``dst`` (``src_nic``/``dst_nic``: local NIC indices)."""
        a, b = self._check_gpu(src), self._check_gpu(dst)
        return self.network.route((int(self.gpu_node[a]), int(self.gpu_local[a])),
                                  (int(self.gpu_node[b]), int(self.gpu_local[b])), channel,
                                  src_nic=src_nic, dst_nic=dst_nic)

    # ---- text -----------------------------------------------------------------------------
    def describe(self) -> str:
        """A few lines for humans: groups, node shape, fabric, size, placement."""
        lines = [f"cluster {self.name}: {self.num_gpus} GPUs on {self.num_nodes} nodes, "
                 f"{len(self.links)} directed links"]
        for i, g in enumerate(self.spec.node_groups):
            t = self.spec.node_type(g.node_type)
            n = int(np.sum(self.node_group == i))
            intra = {"nvswitch": f"NVSwitch {t.nvlink_bw / 1e9:g} GB/s/dir per GPU"
                                 + (" (NVLS)" if t.nvls else ""),
                     "nvlink_mesh": f"NVLink mesh ({len(t.nvlink_pairs)} pairs)",
                     "pcie": f"PCIe Gen{t.pcie_gen} x{t.pcie_width} only"}[t.intra]
            speeds = [nic.bw * 8 / 1e9 for nic in t.nics]
            nics = ", ".join(f"{speeds.count(bw)}x {bw:g} Gb/s" for bw in sorted(set(speeds)))
            gpu = self.gpu_type(self.group_gpus[g.name][0]) if n else g.gpu
            lines.append(f"  group {g.name}: {n} nodes x {t.gpus_per_node} {gpu} "
                         f"({t.name}; {intra}; NICs {nics or 'none'})")
        f = self.spec.fabric
        if f.kind in ("rail_optimized", "leaf_spine"):
            lines.append(f"  fabric: {f.kind}, {f.nodes_per_leaf} nodes per leaf, "
                         f"oversubscription {f.oversubscription:g}:1")
        else:
            lines.append(f"  fabric: {f.kind}" + (f", {len(f.edges)} cables" if f.edges else ""))
        src = self.placement.to_dict()
        lines.append(f"  placement: {src if src else 'rank r on GPU r'}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Cluster({self.name!r}, num_gpus={self.num_gpus}, num_nodes={self.num_nodes})"


def load_cluster(spec: str | os.PathLike | Mapping[str, Any] | ClusterSpec, *,
                 num_gpus: int | None = None,
                 placement: Placement | Mapping[str, Any] | str | os.PathLike | None = None,
                 layout: Mapping[str, Any] | None = None) -> Cluster:
    """Build a :class:`Cluster`.

    Args:
        spec: a preset name (``python -m replay clusters``), the path of a cluster YAML file, a
            dict in the same schema, or a parsed :class:`ClusterSpec`.
        num_gpus: GPUs the job needs (the trace's world size). Node groups without ``nodes`` are
            sized from it (``num_gpus / gpus_per_node`` nodes for a one-group preset).
        placement: a :class:`Placement` (see :func:`heterosim.cluster.placement.placement_for`), a
            placement dict or file; None uses the spec's ``placement:`` section or rank r -> GPU r.
        layout: the trace layout (``Trace.layout``); its ``pp`` gives each rank's pipeline stage
            for a ``by_stage`` placement (without it, pp = the number of stages listed).

    Raises:
        TopologyError: unknown preset or file, a bad spec, or a GPU count that does not fit.
        UnknownGPUError: a GPU type missing from the GPU registry.
        ConfigError: a bad placement.
    """
    if isinstance(spec, ClusterSpec):
        parsed = spec
    elif isinstance(spec, Mapping):
        parsed = parse_spec(spec)
    elif isinstance(spec, (str, os.PathLike)):
        s = str(spec)
        if s in preset_names():
            parsed = read_spec(preset_path(s))
        elif Path(s).is_file():
            parsed = read_spec(Path(s))
        else:
            raise TopologyError(f"cluster {s!r} is neither a preset ({', '.join(preset_names())}) "
                                "nor an existing YAML file")
    else:
        raise TopologyError(f"cluster spec must be a preset name, a path or a dict, got "
                            f"{type(spec).__name__}")
    if num_gpus is not None:
        try:
            if isinstance(num_gpus, bool):
                raise TypeError
            num_gpus = operator.index(num_gpus)  # accepts numpy integers too
        except TypeError:
            raise TopologyError(f"num_gpus must be a positive int, got {num_gpus!r}") from None
        if num_gpus <= 0:
            raise TopologyError(f"num_gpus must be a positive int, got {num_gpus!r}")
    nodes = _node_counts(parsed, num_gpus)
    total = sum(n * parsed.node_type(g.node_type).gpus_per_node
                for g, n in zip(parsed.node_groups, nodes))
    if total > MAX_GPUS:  # checked before any per-GPU table is built
        raise TopologyError(f"cluster {parsed.name!r} would have {total:,} GPUs; HeteroSim builds clusters of "
                            f"at most {MAX_GPUS:,} GPUs: use fewer nodes")
    chosen = placement if placement is not None else parsed.placement
    return Cluster(parsed, nodes, placement_for(layout, total, chosen))
