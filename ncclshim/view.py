"""Build ncclshim's :class:`~ncclshim.topology.TopologyView` from a :class:`~heterosim.cluster.Cluster`.

ncclshim reads the cluster model (:mod:`heterosim.cluster`); this is where. :func:`topology_view`
gives a cluster's view (built once per cluster, shared by its placements); :func:`preset_view`
is the one-liner for tests, benchmarks and ``python -m ncclshim bench``: a preset or cluster file
sized to ``nodes`` nodes of each node group.

The view carries every GPU (type, compute capability, PCIe switch, socket, local NICs), node
(fabric kind, NVLS, NVLink lanes, PCIe generation, CPU vendor), NIC (rail = its index in the node)
and directed link of the cluster's network, with link ids equal to the cluster's link ids, so
flows that ncclshim plans index straight into ``cluster.links``. Routes come from
:class:`ClusterRouter`, which follows NCCL's transport choices on top of the cluster's routing:

- same node: the cluster's intra-node route (NVLink/NVSwitch, else the PCIe tree);
- across nodes (``ncclTopoGetNetDev`` with ``NCCL_P2P_PXN_LEVEL=2``; docs/nccl.md §3.4): the
  destination receives on its NIC ``dst.nics[channel % len]``, whose rail is ``r``. The source
  sends through its own node's rail-``r`` NIC when that NIC is on its PCIe switch; otherwise, with
  ``pxn`` and an NVLink path to the GPU that owns that NIC, it relays over NVLink to that GPU
  (PXN); otherwise it sends through its own NIC ``src.nics[channel % len]`` and the packet
  changes rail inside the fabric (through a spine on a rail-optimized fabric).
"""

from __future__ import annotations

import os

from heterosim.cluster import LINK_KINDS, Cluster, load_cluster, preset_names, preset_path, read_spec
from heterosim.errors import TopologyError
from ncclshim.topology import GPU, NIC, Link, Node, NodeFabric, TopologyView

__all__ = ["ClusterRouter", "build_view", "topology_view", "preset_view"]


class ClusterRouter:
    """ncclshim :class:`~ncclshim.topology.Router` over a cluster (see the module docstring)."""

    __slots__ = ("_c", "_cache")

    def __init__(self, cluster: Cluster) -> None:
        self._c = cluster
        self._cache: dict[tuple[int, int, int, bool], tuple[int, ...]] = {}

    def __call__(self, src: int, dst: int, channel: int, *, pxn: bool) -> tuple[int, ...]:
        key = (src, dst, channel, pxn)
        path = self._cache.get(key)
        if path is None:
            path = self._route(src, dst, channel, pxn)
            self._cache[key] = path
        return path

    def _route(self, src: int, dst: int, channel: int, pxn: bool) -> tuple[int, ...]:
        c, net = self._c, self._c.network
        na, nb = int(c.gpu_node[src]), int(c.gpu_node[dst])
        ga, gb = int(c.gpu_local[src]), int(c.gpu_local[dst])
        if na == nb:
            return c.route(src, dst, channel)
        dst_nics = net.require_nics(nb, gb)
        rail = dst_nics[channel % len(dst_nics)]
        own = net.require_nics(na, ga)
        t = net.node_type(na)
        if rail < len(t.nics):
            if rail in own or t.nic_switch[rail] == t.gpu_switch[ga]:
                return c.route(src, dst, channel, src_nic=rail, dst_nic=rail)
            owners = t.nics[rail].gpus
            if pxn and owners:
                relay = net.intra_path(na, f"gpu{ga}", f"gpu{owners[0]}", channel)
                if net.path_type(relay) == "NVL":
                    proxy = int(c.node_gpu_base[na]) + owners[0]
                    return relay + c.route(proxy, dst, channel, src_nic=rail, dst_nic=rail)
        return c.route(src, dst, channel, src_nic=own[channel % len(own)], dst_nic=rail)


def build_view(cluster: Cluster) -> TopologyView:
    """The :class:`~ncclshim.topology.TopologyView` of ``cluster``, built anew (use
    :func:`topology_view`, which builds it once per cluster)."""
    net = cluster.network
    nodes: list[Node] = []
    gpus: list[GPU] = []
    nics: list[NIC] = []
    for n in range(cluster.num_nodes):
        t = net.node_type(n)
        gpu_ids = tuple(cluster.gpus_of_node(n))
        nic_base = len(nics)
        for k, spec in enumerate(t.nics):
            nics.append(NIC(index=nic_base + k, node=n, rail=k, bw=spec.bw, nccl_bw=spec.bw,
                            pcie_switch=t.nic_switch[k]))
        for g in gpu_ids:
            local = int(cluster.gpu_local[g])
            sw = t.gpu_switch[local]
            gpus.append(GPU(index=g, node=n, local_index=local, gpu_type=cluster.gpu_type(g),
                            sm=cluster.sm(g), pcie_switch=sw, cpu_socket=t.switches[sw].socket,
                            nics=tuple(nic_base + k for k in net.nics_of_gpu(n, local))))
        lanes = t.nvlink_lanes if t.intra == "nvswitch" else max(
            (sum(p[2] for p in t.nvlink_pairs if g in p[:2]) for g in range(t.gpus_per_node)),
            default=0)
        fabric = NodeFabric(kind=t.intra, nvls=t.nvls, nvlink_lanes=lanes, pcie_gen=t.pcie_gen,
                            pcie_width=t.pcie_width, cpu_vendor=t.cpu_vendor,
                            coherent=t.coherent_memory)
        nodes.append(Node(index=n, fabric=fabric, gpus=gpu_ids,
                          nics=tuple(range(nic_base, len(nics)))))
    L = net.links
    names = net.vertices
    links = tuple(
        Link(id=i, src=names[a], dst=names[b], kind=LINK_KINDS[k], bw=w, latency=t, nccl_bw=m)
        for i, a, b, k, w, t, m in zip(range(len(L)), L.src.tolist(), L.dst.tolist(), L.kind.tolist(),
                                       L.bw.tolist(), L.latency.tolist(), L.nccl_bw.tolist())
    )
    return TopologyView(name=cluster.name, gpus=tuple(gpus), nodes=tuple(nodes), nics=tuple(nics),
                        links=links, router=ClusterRouter(cluster),
                        collnet=cluster.spec.fabric.sharp and cluster.num_nodes > 1)


def topology_view(cluster: Cluster) -> TopologyView:
    """The view of ``cluster``, built on first use and kept in ``cluster.derived``.

    The view is GPU-indexed, so it does not depend on the placement: the copies that
    :meth:`~heterosim.cluster.Cluster.with_placement` makes share it.
    """
    view = cluster.derived.get("ncclshim.view")
    if view is None:
        view = cluster.derived["ncclshim.view"] = build_view(cluster)
    return view


def preset_view(name: str | os.PathLike, nodes: int = 1) -> TopologyView:
    """The view of preset or cluster file ``name`` with ``nodes`` nodes of every node group whose
    spec leaves the node count open (a spec that fixes every count is taken as written).

    Raises:
        TopologyError: ``name`` is neither a preset nor a file (the message lists the presets),
            or ``nodes`` < 1.
    """
    if nodes < 1:
        raise TopologyError(f"a cluster needs at least one node; pass nodes >= 1, got {nodes}")
    s = str(name)
    if s in preset_names():
        spec = read_spec(preset_path(s))
    elif os.path.isfile(s):
        spec = read_spec(s)
    else:
        raise TopologyError(f"cluster {s!r} is neither a preset ({', '.join(preset_names())}) "
                            "nor a cluster file")
    fixed = sum(spec.node_type(g.node_type).gpus_per_node * g.nodes
                for g in spec.node_groups if g.nodes is not None)
    per_round = sum(spec.node_type(g.node_type).gpus_per_node * g.share
                    for g in spec.node_groups if g.nodes is None)
    return topology_view(load_cluster(spec, num_gpus=fixed + nodes * per_round if per_round else None))
