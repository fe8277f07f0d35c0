"""The cluster's physical network: vertices, directed links, and routing with ECMP.

Every cable is two directed *links*, each with its own bandwidth (B/s) and latency (s); a link id is
its row in :class:`LinkTable`, which is what the replay engine shares max-min fairly. Vertices are
named ``n<node>.gpu<i>``, ``n<node>.nvs`` (the NVSwitch plane, one vertex as in NCCL's topology),
``n<node>.sw<j>`` (PCIe switch), ``n<node>.cpu<s>``, ``n<node>.nic<k>``, and fabric switches
``leaf<rail>.<pod>`` / ``leaf<pod>`` / ``spine<s>`` (or the names of an explicit fabric).

Routing (:meth:`Network.route`):

- inside a node: minimum-weight path, weight of a link ``round(1000 / bw_GBps)`` (at least 1), so
  NVLink wins over PCIe and fewer/faster hops win -- the order NCCL's ``ncclTopoSetPaths`` ranks
  paths by (type, then bandwidth, then hops; docs/nccl.md §3.2). NB: NCCL's choice to send
  intra-node traffic over the NIC when that is faster (``ncclTopoCheckNet``) is not modelled;
- between nodes: source GPU -> its NIC for this channel -> fabric -> the destination GPU's NIC
  for this channel -> destination GPU; the fabric part is the fewest-hop path;
- ECMP: when several paths tie, the one at index ``crc32("src>dst#channel") % count`` of the
  sorted list is taken, so routes are deterministic and spread over channels (like a switch hashing
  a flow's 5-tuple; real hashes differ, so collisions are plausible, not reproduced);
- adaptive routing (``fabric.routing: adaptive``, two-tier fabrics): the switches spread every
  flow's packets over all spines by load, so the spine layer is one logical switch ``spines`` and a
  leaf's uplinks one cable of their summed capacity each way. NB: this is ideal load balancing; it
  ignores AR's per-packet granularity and reordering cost. InfiniBand uses it by default (OpenSM's
  ``ar_updn`` routing engine enables AR, "InfiniBand Cluster Bring-up Procedure"; NCCL's
  ``net_ib.cc`` sets ``ar = 1`` on IB link layers, ``NCCL_IB_ADAPTIVE_ROUTING``);
- :attr:`Network.never_binding`: links that can never limit a flow. A leaf's pooled uplink in a
  fabric that is not oversubscribed carries at most what the NICs under the leaf send, which is at
  most its capacity, so max-min rates are the same with or without it in a path; the replay
  leaves these links out of link sharing (their latency stays in the route).

Building is structural (templates per node type, replicated with offsets), so a 16,384-GPU
cluster builds in well under a second; the networkx graph is built only when asked for.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from heterosim.cluster.bandwidth import NCCL_CPU_GBPS, nccl_nvlink_bw, nccl_pcie_bw
from heterosim.cluster.spec import Fabric, NicSpec, NodeType
from heterosim.errors import TopologyError

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["LINK_KINDS", "PATH_TYPES", "LinkTable", "Network", "ecmp_index"]

LINK_KINDS: tuple[str, ...] = ("nvlink", "pcie", "cpu", "net")
"""Kinds of link: NVLink (GPU-NVSwitch or GPU-GPU), PCIe, CPU-CPU interconnect, network cable."""
PATH_TYPES: tuple[str, ...] = ("LOC", "NVL", "NVB", "PIX", "PXB", "PHB", "SYS", "NET")
"""NCCL path types (include/graph.h) that a route can have, best first."""


def ecmp_index(src: int, dst: int, channel: int, count: int) -> int:
    """Which of ``count`` equal-cost paths the flow (src, dst, channel) takes (stable hash)."""
    if count == 1:
        return 0
    return zlib.crc32(f"{src}>{dst}#{channel}".encode()) % count


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkTable:
    """All directed links as parallel arrays; a link id is a row."""

    src: np.ndarray
    """Source vertex id (int64)."""
    dst: np.ndarray
    bw: np.ndarray
    """Bandwidth, B/s (float64)."""
    latency: np.ndarray
    """Latency, s (float64)."""
    kind: np.ndarray
    """Index into :data:`LINK_KINDS` (int8)."""
    nccl_bw: np.ndarray
    """What NCCL's topology detection believes the link carries, B/s (docs/nccl.md §3.1)."""

    def __len__(self) -> int:
        return len(self.src)


class _Template:
    """One node type's vertices and links with local names; paths computed on first use."""

    def __init__(self, t: NodeType, sm: int) -> None:
        self.t = t
        names = [f"gpu{i}" for i in range(t.gpus_per_node)]
        if t.intra == "nvswitch":
            names.append("nvs")
        names += [f"sw{j}" for j in range(len(t.switches))]
        names += [f"cpu{s}" for s in range(t.sockets)]
        names += [f"nic{k}" for k in range(len(t.nics))]
        self.names = names
        self.index = {n: i for i, n in enumerate(names)}
        # (src, dst, bw, latency, kind index, nccl_bw)
        links: list[tuple[int, int, float, float, int, float]] = []

        def cable(a: str, b: str, bw: float, lat: float, kind: str, nccl: float) -> None:
            k = LINK_KINDS.index(kind)
            links.append((self.index[a], self.index[b], bw, lat, k, nccl))
            links.append((self.index[b], self.index[a], bw, lat, k, nccl))

        if t.intra == "nvswitch":
            for g in range(t.gpus_per_node):
                cable(f"gpu{g}", "nvs", t.nvlink_bw, t.nvlink_latency, "nvlink",
                      nccl_nvlink_bw(sm, t.nvlink_lanes))
        for a, b, lanes in t.nvlink_pairs:
            cable(f"gpu{a}", f"gpu{b}", lanes * t.nvlink_lane_bw, t.nvlink_latency, "nvlink",
                  nccl_nvlink_bw(sm, lanes))
        pcie_nccl = nccl_pcie_bw(t.pcie_gen, t.pcie_width)
        for j, sw in enumerate(t.switches):
            cable(f"sw{j}", f"cpu{sw.socket}", t.pcie_bw, t.pcie_latency, "pcie", pcie_nccl)
            for g in sw.gpus:
                cable(f"gpu{g}", f"sw{j}", t.pcie_bw, t.pcie_latency, "pcie", pcie_nccl)
            for k in sw.nics:
                # NB: a NIC is limited by its PCIe slot as well as its line rate; the slot is
                # this link, the line rate the NIC's fabric link.
                cable(f"nic{k}", f"sw{j}", t.pcie_bw, t.pcie_latency, "pcie", pcie_nccl)
        for s in range(1, t.sockets):
            # NB: sockets are chained 0-1-2...; two-socket servers (all presets) are exact.
            cable(f"cpu{s - 1}", f"cpu{s}", t.socket_bw, t.socket_latency, "cpu",
                  NCCL_CPU_GBPS[t.cpu_vendor] * 1e9)
        self.links = links
        cols = list(zip(*links)) if links else [()] * 6
        self.arrays = tuple(np.asarray(c, dtype=dt) for c, dt in zip(
            cols, (np.int64, np.int64, np.float64, np.float64, np.int8, np.float64)))
        self.weight = [max(1, round(1000.0 / (lk[2] / 1e9))) for lk in links]
        self.out: list[list[int]] = [[] for _ in names]
        for li, (a, *_) in enumerate(links):
            self.out[a].append(li)
        self._paths: dict[tuple[int, int], list[tuple[int, ...]]] = {}
        self.gpu_nics = [self._nics_for(g) for g in range(t.gpus_per_node)]

    def _nics_for(self, g: int) -> tuple[int, ...]:
        own = self.t.nics_of(g)
        if own or not self.t.nics:
            return own
        # A GPU no NIC lists uses the NICs nearest to it (NCCL's "local" NICs: best path).
        cost = [self.cost(self.index[f"gpu{g}"], self.index[f"nic{k}"]) for k in range(len(self.t.nics))]
        return tuple(k for k, c in enumerate(cost) if c == min(cost))

    def cost(self, a: int, b: int) -> int:
        p = self.paths(a, b)[0]
        return sum(self.weight[li] for li in p)

    def paths(self, a: int, b: int) -> list[tuple[int, ...]]:
        """All minimum-weight link paths a -> b, sorted; NICs are never transit vertices."""
        key = (a, b)
        if key not in self._paths:
            self._paths[key] = self._search(a, b)
        return self._paths[key]

    def _search(self, a: int, b: int) -> list[tuple[int, ...]]:
        if a == b:
            return [()]
        import heapq

        n = len(self.names)
        dist = [float("inf")] * n
        dist[a] = 0
        heap = [(0, a)]
        while heap:
            d, v = heapq.heappop(heap)
            if d > dist[v]:
                continue
            if v != a and self.names[v].startswith("nic"):
                continue  # a NIC ends a path inside a node, never relays
            for li in self.out[v]:
                u, w = self.links[li][1], d + self.weight[li]
                if w < dist[u]:
                    dist[u] = w
                    heapq.heappush(heap, (w, u))
        if dist[b] == float("inf"):
            raise TopologyError(
                f"node type {self.t.name!r}: {self.names[b]} is unreachable from {self.names[a]}; "
                "connect it through a PCIe switch or NVLink"
            )
        out: list[tuple[int, ...]] = []

        def back(v: int, suffix: tuple[int, ...]) -> None:
            if v == a:
                out.append(suffix)
                return
            for li, (x, y, *_) in enumerate(self.links):
                if y == v and dist[x] + self.weight[li] == dist[v] and (
                    x == a or not self.names[x].startswith("nic")
                ):
                    back(x, (li,) + suffix)

        back(b, ())
        return sorted(out)


class Network:
    """Vertices, links and routes of a whole cluster (see the module docstring).

    Args:
        node_types: the node type of every node, in node order.
        sms: compute capability x10 of every node's GPUs (NCCL prices NVLink lanes by it).
        fabric: the inter-node fabric.
    """

    def __init__(self, node_types: Sequence[NodeType], sms: Sequence[int], fabric: Fabric) -> None:
        templates: dict[tuple[str, int], _Template] = {}
        for t, sm in zip(node_types, sms):
            if (t.name, sm) not in templates:
                templates[(t.name, sm)] = _Template(t, sm)
        self._tpl = [templates[(t.name, sm)] for t, sm in zip(node_types, sms)]
        nn = len(node_types)
        nv = np.array([len(t.names) for t in self._tpl], dtype=np.int64)
        nl = np.array([len(t.links) for t in self._tpl], dtype=np.int64)
        self.vertex_base = np.concatenate([[0], np.cumsum(nv)])
        self.link_base = np.concatenate([[0], np.cumsum(nl)])
        names: list[str] = []
        src, dst, bw, lat, kind, nccl = [], [], [], [], [], []
        for n, tpl in enumerate(self._tpl):
            names += [f"n{n}.{x}" for x in tpl.names]
            src.append(tpl.arrays[0] + self.vertex_base[n])
            dst.append(tpl.arrays[1] + self.vertex_base[n])
            bw.append(tpl.arrays[2])
            lat.append(tpl.arrays[3])
            kind.append(tpl.arrays[4])
            nccl.append(tpl.arrays[5])
        self.num_nodes = nn
        self.nic_vertex: dict[tuple[int, int], int] = {
            (n, k): int(self.vertex_base[n]) + tpl.index[f"nic{k}"]
            for n, tpl in enumerate(self._tpl) for k in range(len(tpl.t.nics))
        }
        self.fabric = fabric
        self._names = names
        self._fab = _FabricBuilder(self, fabric, int(self.link_base[-1]))
        self.never_binding: frozenset[int] = frozenset(self._fab.never_binding)
        """Link ids that can never be the bottleneck of any flow (see the module docstring)."""
        names += self._fab.names
        src.append(np.asarray(self._fab.src, dtype=np.int64))
        dst.append(np.asarray(self._fab.dst, dtype=np.int64))
        bw.append(self._fab.bw)
        lat.append(self._fab.lat)
        kind.append([LINK_KINDS.index("net")] * len(self._fab.src))
        nccl.append(self._fab.nccl)  # NCCL sees a NIC as speed/8000 GB/s = its line rate
        self.vertices: tuple[str, ...] = tuple(names)
        self.links = LinkTable(
            src=np.concatenate(src).astype(np.int64), dst=np.concatenate(dst).astype(np.int64),
            bw=np.concatenate([np.asarray(x, dtype=np.float64) for x in bw]),
            latency=np.concatenate([np.asarray(x, dtype=np.float64) for x in lat]),
            kind=np.concatenate([np.asarray(x, dtype=np.int8) for x in kind]),
            nccl_bw=np.concatenate([np.asarray(x, dtype=np.float64) for x in nccl]))
        L = self.links
        for arr in (L.src, L.dst, L.bw, L.latency, L.kind, L.nccl_bw):
            arr.setflags(write=False)
        self._graph: nx.DiGraph | None = None

    # ---- vertices -------------------------------------------------------------------------
    def vertex(self, node: int, local: str) -> int:
        """Global vertex id of ``local`` (e.g. ``"gpu3"``, ``"nic0"``) on ``node``."""
        return int(self.vertex_base[node]) + self._tpl[node].index[local]

    def nics_of_gpu(self, node: int, local_gpu: int) -> tuple[int, ...]:
        """Local indices of the NICs that ``local_gpu`` on ``node`` sends through, in channel order."""
        return self._tpl[node].gpu_nics[local_gpu]

    def node_type(self, node: int) -> NodeType:
        return self._tpl[node].t

    # ---- routing --------------------------------------------------------------------------
    def intra_path(self, node: int, a: str, b: str, channel: int = 0) -> tuple[int, ...]:
        """Link ids from local vertex ``a`` to ``b`` inside ``node`` (ECMP among ties)."""
        tpl = self._tpl[node]
        ia, ib = tpl.index[a], tpl.index[b]
        paths = tpl.paths(ia, ib)
        base = int(self.link_base[node])
        vb = int(self.vertex_base[node])
        p = paths[ecmp_index(vb + ia, vb + ib, channel, len(paths))]
        return tuple(base + li for li in p)

    def route(self, src: tuple[int, int], dst: tuple[int, int], channel: int = 0, *,
              src_nic: int | None = None, dst_nic: int | None = None) -> tuple[int, ...]:
        """Link ids carrying a flow from GPU ``src`` = (node, local) to GPU ``dst``.

        Between nodes the flow leaves through ``src_nic`` and enters through ``dst_nic`` (local
        NIC indices); by default each side's NIC for ``channel`` (its NICs taken round-robin).
        """
        (na, ga), (nb, gb) = src, dst
        if na == nb:
            return self.intra_path(na, f"gpu{ga}", f"gpu{gb}", channel)
        if src_nic is None:
            nics = self.require_nics(na, ga)
            src_nic = nics[channel % len(nics)]
        if dst_nic is None:
            nics = self.require_nics(nb, gb)
            dst_nic = nics[channel % len(nics)]
        return (self.intra_path(na, f"gpu{ga}", f"nic{src_nic}", channel)
                + self._fab.route(self.nic_vertex[(na, src_nic)], self.nic_vertex[(nb, dst_nic)],
                                  channel)
                + self.intra_path(nb, f"nic{dst_nic}", f"gpu{gb}", channel))

    def require_nics(self, node: int, g: int) -> tuple[int, ...]:
        """:meth:`nics_of_gpu`, or an error naming the node when it has no NIC at all."""
        nics = self._tpl[node].gpu_nics[g]
        if not nics:
            raise TopologyError(
                f"node {node} (node type {self._tpl[node].t.name!r}) has no NIC, so its GPUs "
                "cannot reach other nodes; add nics: to the node type"
            )
        return nics

    def path_type(self, path: Sequence[int]) -> str:
        """NCCL path type of a route (one of :data:`PATH_TYPES`; docs/nccl.md §3.2)."""
        if not path:
            return "LOC"
        kinds = {LINK_KINDS[k] for k in self.links.kind[list(path)]}
        if "net" in kinds:
            return "NET"
        if "cpu" in kinds:
            return "SYS"
        names = [self.vertices[int(self.links.dst[li])] for li in path[:-1]]
        if "pcie" in kinds:
            if any(".cpu" in v for v in names):
                return "PHB"
            return "PIX" if sum(".sw" in v for v in names) <= 1 else "PXB"
        return "NVB" if any(".gpu" in v for v in names) else "NVL"

    # ---- networkx view --------------------------------------------------------------------
    @property
    def graph(self) -> "nx.DiGraph":
        """The network as a networkx DiGraph (built on first use): vertex attrs ``kind``,
        ``node``; edge attrs ``id``, ``bw`` (B/s), ``latency`` (s), ``kind``."""
        if self._graph is None:
            import networkx as nx

            g = nx.DiGraph()
            for v, name in enumerate(self.vertices):
                head, _, tail = name.partition(".")
                if head.startswith("n") and head[1:].isdigit() and tail:
                    kind = tail.rstrip("0123456789")
                    g.add_node(name, kind=kind, node=int(head[1:]))
                else:
                    g.add_node(name, kind="switch", node=-1)
            L = self.links
            for li in range(len(L)):
                g.add_edge(self.vertices[int(L.src[li])], self.vertices[int(L.dst[li])], id=li,
                           bw=float(L.bw[li]), latency=float(L.latency[li]),
                           kind=LINK_KINDS[int(L.kind[li])])
            self._graph = g
        return self._graph


class _FabricBuilder:
    """Fabric switches and NIC/switch cables, appended after all node-internal links."""

    def __init__(self, net: Network, f: Fabric, link_base: int) -> None:
        self.net, self.f, self.base = net, f, link_base
        self.names: list[str] = []
        self.src: list[int] = []
        self.dst: list[int] = []
        self.bw: list[float] = []
        self.nccl: list[float] = []
        self.lat: list[float] = []
        self._vbase = int(net.vertex_base[-1])
        self.up: dict[int, int] = {}  # NIC vertex -> link id NIC->switch
        self.leaf_of: dict[int, int] = {}  # NIC vertex -> leaf index
        self.never_binding: list[int] = []
        self._cache: dict[tuple[int, int], list[tuple[int, ...]]] = {}
        nics = sorted(net.nic_vertex.items(), key=lambda kv: kv[1])
        if net.num_nodes > 1 and f.kind == "none":
            raise TopologyError(
                f"the cluster has {net.num_nodes} nodes but fabric kind 'none'; give a fabric "
                f"(one of rail_optimized, leaf_spine, explicit)"
            )
        if f.kind in ("rail_optimized", "leaf_spine"):
            self._build_tree(nics)
        elif f.kind == "explicit":
            self._build_explicit(nics)

    def _vertex(self, name: str) -> int:
        self.names.append(name)
        return self._vbase + len(self.names) - 1

    def _cable(self, a: int, b: int, bw: float, lat: float, nic: NicSpec | None = None) -> int:
        """Add a->b then b->a; return the id of a->b (b->a is id + 1).

        A cable from a NIC without RDMA moves what NCCL's socket transport gets through it
        (``NicSpec.rate``) and each crossing adds half a message's trip through the two TCP stacks
        (:mod:`heterosim.cluster.sockets`); NCCL's model still sees the cable's line rate.
        """
        lid = self.base + len(self.src)
        hw = bw
        if nic is not None and not nic.rdma:
            hw, lat = min(bw, nic.rate), lat + nic.socket.latency / 2
        self.src += [a, b]
        self.dst += [b, a]
        self.bw += [hw, hw]
        self.nccl += [bw, bw]
        self.lat += [lat, lat]
        return lid

    def _build_tree(self, nics: list[tuple[tuple[int, int], int]]) -> None:
        f = self.f
        keys: dict[tuple[int, int], list[tuple[int, NicSpec]]] = {}
        per_node: dict[tuple[int, int], dict[int, float]] = {}
        for (node, k), v in nics:
            pod = node // f.nodes_per_leaf
            key = (k, pod) if f.kind == "rail_optimized" else (0, pod)
            nic = self.net.node_type(node).nics[k]
            bw = nic.bw
            keys.setdefault(key, []).append((v, nic))
            slot = per_node.setdefault(key, {})
            slot[node] = slot.get(node, 0.0) + bw
        self.leaves = sorted(keys)
        leaf_v = [self._vertex(f"leaf{r}.{p}" if f.kind == "rail_optimized" else f"leaf{p}")
                  for r, p in self.leaves]
        for i, key in enumerate(self.leaves):
            for v, nic in keys[key]:
                self.up[v] = self._cable(v, leaf_v[i], nic.bw, f.latency, nic)
                self.leaf_of[v] = i
        self.nspines = 0
        if len(self.leaves) > 1:
            adaptive = f.routing == "adaptive"
            self.nspines = 1 if adaptive else (f.spines or f.nodes_per_leaf)
            spine_v = ([self._vertex("spines")] if adaptive else
                       [self._vertex(f"spine{s}") for s in range(self.nspines)])
            self.spine_base = self.base + len(self.src)
            for i, key in enumerate(self.leaves):
                # NB: a leaf is built for nodes_per_leaf nodes whether or not all are present:
                # uplink capacity = nodes_per_leaf x (the fastest attached node's NIC bandwidth
                # on this leaf) / oversubscription, split evenly over the spines (one port per
                # spine in a non-blocking pod), or pooled in one cable under adaptive routing.
                # A two-tier Clos; larger fabrics add a core tier, not modelled.
                design = f.nodes_per_leaf * max(per_node[key].values())
                up_bw = design / (f.oversubscription * self.nspines)
                for s in range(self.nspines):
                    lid = self._cable(leaf_v[i], spine_v[s], up_bw, f.latency)
                    # The NICs under this leaf send at most sum(their rates) <= design; a pooled
                    # uplink of at least that much never saturates before they do.
                    if adaptive and up_bw >= sum(per_node[key].values()):
                        self.never_binding += [lid, lid + 1]

    def _build_explicit(self, nics: list[tuple[tuple[int, int], int]]) -> None:
        import networkx as nx

        named = {f"n{node}.nic{k}": v for (node, k), v in nics}
        spec_of = {v: self.net.node_type(node).nics[k] for (node, k), v in nics}
        for s in self.f.switches:
            head = s.partition(".")[0]
            if (head[:1] == "n" and head[1:].isdigit()) or self.f.switches.count(s) > 1:
                raise TopologyError(
                    f"fabric.switches: {s!r} is "
                    + ("listed twice" if self.f.switches.count(s) > 1 else
                       "named like a node vertex (n<k>.*)")
                    + "; give every switch a unique name such as 'spine0'"
                )
        sw = {s: self._vertex(s) for s in self.f.switches}
        g = nx.DiGraph()
        g.add_nodes_from(named.values())
        g.add_nodes_from(sw.values())
        for i, e in enumerate(self.f.edges):
            ends = []
            for end in (e.a, e.b):
                if end not in named and end not in sw:
                    raise TopologyError(
                        f"fabric.edges[{i}]: endpoint {end!r} is neither a NIC (like "
                        f"{next(iter(named), 'n0.nic0')!r}) nor a switch in fabric.switches "
                        f"{list(self.f.switches)}"
                    )
                ends.append(named.get(end, sw.get(end)))
            lid = self._cable(ends[0], ends[1], e.bw, e.latency, spec_of.get(ends[0], spec_of.get(ends[1])))
            g.add_edge(ends[0], ends[1], id=lid)
            g.add_edge(ends[1], ends[0], id=lid + 1)
        if self.net.num_nodes > 1:
            loose = [n for n, v in named.items() if g.degree(v) == 0]
            if loose:
                raise TopologyError(f"fabric.edges: NIC {loose[0]} is not cabled to anything")
            comps = list(nx.weakly_connected_components(g))
            if len(comps) > 1:
                raise TopologyError(
                    f"fabric.edges: the fabric falls into {len(comps)} disconnected parts; "
                    "add cables so every NIC can reach every other"
                )
        self.g = g

    def route(self, a: int, b: int, channel: int) -> tuple[int, ...]:
        """Link ids from NIC vertex ``a`` to NIC vertex ``b`` across the fabric."""
        if self.f.kind == "explicit":
            key = (a, b)
            if key not in self._cache:
                import networkx as nx

                paths = sorted(
                    tuple(self.g.edges[u, v]["id"] for u, v in zip(p, p[1:]))
                    for p in nx.all_shortest_paths(self.g, a, b)
                )
                self._cache[key] = paths
            paths = self._cache[key]
            return paths[ecmp_index(a, b, channel, len(paths))]
        la, lb = self.leaf_of[a], self.leaf_of[b]
        up, down = self.up[a], self.up[b] + 1
        if la == lb:
            return (up, down)
        s = ecmp_index(a, b, channel, self.nspines)
        return (up, self.spine_base + 2 * (la * self.nspines + s),
                self.spine_base + 2 * (lb * self.nspines + s) + 1, down)
