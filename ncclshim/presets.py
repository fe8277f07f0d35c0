"""Built-in server presets and the router for them, so ncclshim runs without ``replay/``.

Each preset is one server type (GPUs, NVSwitch/NVLink or PCIe tree, CPU sockets, NICs) repeated
over ``nodes`` nodes on a rail-optimized network: NIC ``r`` of every node connects to leaf switch
``rail{r}``; the leaves meet at a non-blocking ``spine``. Vertex names: ``n{k}.gpu{i}``,
``n{k}.nvs``, ``n{k}.sw{j}`` (PCIe switch), ``n{k}.cpu{s}``, ``n{k}.nic{r}``, ``rail{r}``, ``spine``.

NB: the spine links get the summed NIC bandwidth of their rail (no oversubscription); a fabric
with oversubscription or adaptive routing is replay's to describe. Link latencies are physical
(sub-microsecond per hop) and are *not* what NCCL's cost model uses (``research/nccl.md`` §2.3).
"""

from __future__ import annotations

from dataclasses import dataclass

from heterosim.errors import TopologyError
from ncclshim.topology import (
    GPU,
    NIC,
    Link,
    Node,
    NodeFabric,
    TopologyView,
    nccl_nic_bw,
    nccl_nvlink_bw,
    nccl_pcie_bw,
)

__all__ = ["ServerSpec", "PRESETS", "build_preset", "build_cluster", "ServerRouter"]

# Per-direction PCIe payload rate, B/s per lane after 128b/130b encoding (Gen3+) or 8b/10b.
_PCIE_LANE_BPS = {3: 8e9 * 128 / 130 / 8, 4: 16e9 * 128 / 130 / 8, 5: 32e9 * 128 / 130 / 8, 6: 64e9 / 8}
# NCCL's CPU interconnect bandwidths (``topo.h``), B/s: Intel SPR 22, AMD 16 GB/s.
_CPU_LINK_NCCL_BW = {"intel": 22e9, "amd": 16e9, "arm": 6e9, "other": 6e9}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSpec:
    """One server type; ``build_cluster`` repeats it."""

    gpu_type: str
    sm: int
    gpus: int
    fabric: NodeFabric
    nvlink_bw: float = 0.0
    """Physical NVLink bandwidth per GPU per direction, B/s (A100 12 x 25 GB/s = 300e9)."""
    pcie_switches: int = 4
    sockets: int = 2
    nics: int = 8
    nic_gbps: float = 200.0
    """NIC line rate, Gb/s."""
    cpu_link_bw: float = 64e9
    """Physical socket-to-socket bandwidth per direction, B/s (UPI / xGMI)."""


PRESETS: dict[str, ServerSpec] = {
    # DGX A100: 6 NVSwitches, 12 NVLink3 lanes per GPU (25 GB/s/dir each), 4 PCIe Gen4 switches
    # each holding 2 GPUs and 2 HDR NICs, AMD Rome host.
    "dgx-a100": ServerSpec(
        gpu_type="A100-SXM4-80GB", sm=80, gpus=8, nvlink_bw=300e9, nics=8, nic_gbps=200.0,
        fabric=NodeFabric(kind="nvswitch", nvls=False, nvlink_lanes=12, pcie_gen=4, cpu_vendor="amd"),
    ),
    # DGX H100: 4 NVSwitch3 chips with NVLink SHARP, 18 NVLink4 lanes per GPU, 8 x 400G NDR
    # (ConnectX-7) on Gen5 switches, Intel Sapphire Rapids host.
    "dgx-h100": ServerSpec(
        gpu_type="H100-SXM5-80GB", sm=90, gpus=8, nvlink_bw=450e9, nics=8, nic_gbps=400.0,
        fabric=NodeFabric(kind="nvswitch", nvls=True, nvlink_lanes=18, pcie_gen=5, cpu_vendor="intel"),
    ),
    # HGX H20: Hopper with the full 900 GB/s NVLink (18 lanes) and NVLS; NIC count assumed 8 x 400G.
    "hgx-h20": ServerSpec(
        gpu_type="H20", sm=90, gpus=8, nvlink_bw=450e9, nics=8, nic_gbps=400.0,
        fabric=NodeFabric(kind="nvswitch", nvls=True, nvlink_lanes=18, pcie_gen=5, cpu_vendor="intel"),
    ),
    # 8 x L40S PCIe Gen4 server: no NVLink; 4 PCIe switches (2 GPUs + 1 NIC each), 2 sockets.
    "l40s-pcie": ServerSpec(
        gpu_type="L40S", sm=89, gpus=8, nics=4, nic_gbps=200.0,
        fabric=NodeFabric(kind="pcie", pcie_gen=4, cpu_vendor="intel"),
    ),
}


def build_preset(name: str, *, nodes: int = 1) -> TopologyView:
    """``nodes`` copies of preset ``name`` on a rail-optimized network."""
    if name not in PRESETS:
        raise TopologyError(f"unknown cluster preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}")
    return build_cluster([PRESETS[name]] * nodes, name=f"{name}x{nodes}")


def build_cluster(servers: list[ServerSpec], *, name: str = "cluster") -> TopologyView:
    """A view of the given servers (one per node, types may differ) on a rail-optimized network."""
    if not servers:
        raise TopologyError("a cluster needs at least one node; pass nodes >= 1")
    gpus: list[GPU] = []
    nics: list[NIC] = []
    nodes: list[Node] = []
    links: list[Link] = []

    def link(src: str, dst: str, kind: str, bw: float, latency: float, nccl_bw: float = 0.0) -> None:
        for a, b in ((src, dst), (dst, src)):
            links.append(Link(id=len(links), src=a, dst=b, kind=kind, bw=bw, latency=latency, nccl_bw=nccl_bw))

    rails = max(s.nics for s in servers)
    for k, spec in enumerate(servers):
        fab = spec.fabric
        pcie_bw = _PCIE_LANE_BPS[fab.pcie_gen] * fab.pcie_width
        pcie_nccl = nccl_pcie_bw(fab.pcie_gen, fab.pcie_width)
        per_sw_gpu = -(-spec.gpus // spec.pcie_switches)
        per_sw_nic = -(-spec.nics // spec.pcie_switches) if spec.nics else 0
        per_sock_sw = -(-spec.pcie_switches // spec.sockets)
        nic_ids = tuple(range(len(nics), len(nics) + spec.nics))
        for r in range(spec.nics):
            sw = r // per_sw_nic
            nics.append(NIC(index=nic_ids[r], node=k, rail=r, bw=spec.nic_gbps * 1e9 / 8,
                            nccl_bw=nccl_nic_bw(spec.nic_gbps), pcie_switch=sw))
            link(f"n{k}.nic{r}", f"n{k}.sw{sw}", "pcie", pcie_bw, 0.5e-6, pcie_nccl)
            link(f"n{k}.nic{r}", f"rail{r}", "net", spec.nic_gbps * 1e9 / 8, 1.0e-6, nccl_nic_bw(spec.nic_gbps))
        gpu_ids = tuple(range(len(gpus), len(gpus) + spec.gpus))
        for i in range(spec.gpus):
            sw = i // per_sw_gpu
            own = tuple(n for n in nic_ids if nics[n].pcie_switch == sw)
            # NCCL gives each GPU the NICs on its switch, starting at its own index among them.
            own = own[i % len(own):] + own[: i % len(own)] if own else ()
            gpus.append(GPU(index=gpu_ids[i], node=k, local_index=i, gpu_type=spec.gpu_type, sm=spec.sm,
                            pcie_switch=sw, cpu_socket=sw // per_sock_sw, nics=own))
            link(f"n{k}.gpu{i}", f"n{k}.sw{sw}", "pcie", pcie_bw, 0.5e-6, pcie_nccl)
            if fab.kind == "nvswitch":
                link(f"n{k}.gpu{i}", f"n{k}.nvs", "nvlink", spec.nvlink_bw, 0.3e-6,
                     nccl_nvlink_bw(spec.sm, fab.nvlink_lanes))
        if fab.kind == "nvlink_mesh":
            lanes = fab.nvlink_lanes // max(1, spec.gpus - 1)
            for i in range(spec.gpus):
                for j in range(i + 1, spec.gpus):
                    link(f"n{k}.gpu{i}", f"n{k}.gpu{j}", "nvlink", spec.nvlink_bw / max(1, spec.gpus - 1),
                         0.3e-6, nccl_nvlink_bw(spec.sm, lanes))
        for sw in range(spec.pcie_switches):
            link(f"n{k}.sw{sw}", f"n{k}.cpu{sw // per_sock_sw}", "pcie", pcie_bw, 0.5e-6, pcie_nccl)
        for s in range(1, spec.sockets):
            link(f"n{k}.cpu0", f"n{k}.cpu{s}", "cpu", spec.cpu_link_bw, 0.5e-6, _CPU_LINK_NCCL_BW[fab.cpu_vendor])
        nodes.append(Node(index=k, fabric=fab, gpus=gpu_ids, nics=nic_ids))
    for r in range(rails):
        rail_bw = sum(n.bw for n in nics if n.rail == r)
        link(f"rail{r}", "spine", "net", rail_bw, 1.0e-6)
    links_t = tuple(links)
    return TopologyView(name=name, gpus=tuple(gpus), nodes=tuple(nodes), nics=tuple(nics), links=links_t,
                        router=ServerRouter(tuple(gpus), tuple(nodes), tuple(nics), links_t))


class ServerRouter:
    """Routes of :func:`build_cluster` clusters, following NCCL's transport choices.

    - Same node: NVSwitch (``gpu -> nvs -> gpu``), a direct NVLink, or the PCIe tree
      (``gpu -> switch [-> cpu [-> cpu] -> switch] -> gpu``).
    - Across nodes (``ncclTopoGetNetDev``, ``NCCL_P2P_PXN_LEVEL=2``): the destination receives on
      its NIC ``dst.nics[channel % len]``, rail ``r``. With PXN the source sends through its
      node's rail-``r`` NIC: directly if on the source's PCIe switch, else relayed over NVLink by
      the GPU owning that NIC. Without PXN (or without NVLink) the source uses its own NIC and the
      packet crosses rails through the spine.
    """

    __slots__ = ("_gpus", "_nodes", "_nics", "_ids", "_cache")

    def __init__(self, gpus: tuple[GPU, ...], nodes: tuple[Node, ...], nics: tuple[NIC, ...],
                 links: tuple[Link, ...]) -> None:
        self._gpus, self._nodes, self._nics = gpus, nodes, nics
        self._ids = {(link.src, link.dst): link.id for link in links}
        self._cache: dict[tuple[int, int, int, bool], tuple[int, ...]] = {}

    def __call__(self, src: int, dst: int, channel: int, *, pxn: bool) -> tuple[int, ...]:
        g, h = self._gpus[src], self._gpus[dst]
        key = (src, dst, channel % max(1, len(h.nics)), pxn)
        path = self._cache.get(key)
        if path is None:
            path = self._intra(g, h) if g.node == h.node else self._inter(g, h, channel, pxn)
            self._cache[key] = path
        return path

    def _hops(self, vertices: list[str]) -> tuple[int, ...]:
        return tuple(self._ids[(a, b)] for a, b in zip(vertices, vertices[1:]))

    def _pcie(self, k: int, a: str, sw_a: int, sock_a: int, b: str, sw_b: int, sock_b: int) -> list[str]:
        if sw_a == sw_b:
            return [a, f"n{k}.sw{sw_a}", b]
        mid = [f"n{k}.cpu{sock_a}"] + ([f"n{k}.cpu{sock_b}"] if sock_a != sock_b else [])
        if sock_a != sock_b and 0 not in (sock_a, sock_b):
            mid = [f"n{k}.cpu{sock_a}", f"n{k}.cpu0", f"n{k}.cpu{sock_b}"]
        return [a, f"n{k}.sw{sw_a}", *mid, f"n{k}.sw{sw_b}", b]

    def _intra(self, g: GPU, h: GPU) -> tuple[int, ...]:
        k, kind = g.node, self._nodes[g.node].fabric.kind
        a, b = f"n{k}.gpu{g.local_index}", f"n{k}.gpu{h.local_index}"
        if kind == "nvswitch":
            return self._hops([a, f"n{k}.nvs", b])
        if kind == "nvlink_mesh" and (a, b) in self._ids:
            return self._hops([a, b])
        return self._hops(self._pcie(k, a, g.pcie_switch, g.cpu_socket, b, h.pcie_switch, h.cpu_socket))

    def _socket(self, k: int, sw: int) -> int:
        return next(gg.cpu_socket for gg in (self._gpus[i] for i in self._nodes[k].gpus) if gg.pcie_switch == sw)

    def _to_nic(self, g: GPU, nic: NIC) -> list[str]:
        k = g.node
        a = f"n{k}.gpu{g.local_index}"
        return self._pcie(k, a, g.pcie_switch, g.cpu_socket, f"n{k}.nic{nic.rail}", nic.pcie_switch,
                          self._socket(k, nic.pcie_switch))

    def _inter(self, g: GPU, h: GPU, channel: int, pxn: bool) -> tuple[int, ...]:
        if not g.nics or not h.nics:
            bad = g if not g.nics else h
            raise TopologyError(f"GPU {bad.index} (node {bad.node}) has no NIC, so it cannot reach another node; "
                                "give its node NICs in the cluster spec")
        d_nic = self._nics[h.nics[channel % len(h.nics)]]
        node_g = self._nodes[g.node]
        s_nic = self._nics[g.nics[channel % len(g.nics)]]
        head: list[str] = []
        rail_nics = [self._nics[n] for n in node_g.nics if self._nics[n].rail == d_nic.rail]
        if rail_nics and rail_nics[0].index != s_nic.index:
            cand = rail_nics[0]
            if cand.pcie_switch == g.pcie_switch:
                s_nic = cand
            elif pxn:
                owners = [self._gpus[i] for i in node_g.gpus if cand.index in self._gpus[i].nics]
                owner = next((o for o in owners if o.nics[0] == cand.index), owners[0])
                relay = self._nvlink_vertices(g, owner)
                if relay:  # PXN: NVLink to the GPU that owns the destination-rail NIC.
                    head, g, s_nic = relay[:-1], owner, cand
        net = [f"rail{s_nic.rail}"] + (["spine", f"rail{d_nic.rail}"] if s_nic.rail != d_nic.rail else [])
        return self._hops(head + self._to_nic(g, s_nic) + net + self._to_nic(h, d_nic)[::-1])

    def _nvlink_vertices(self, g: GPU, h: GPU) -> list[str]:
        """Vertices of an NVLink path g -> h, or [] when there is none."""
        k = g.node
        a, b = f"n{k}.gpu{g.local_index}", f"n{k}.gpu{h.local_index}"
        kind = self._nodes[k].fabric.kind
        if kind == "nvswitch":
            return [a, f"n{k}.nvs", b]
        if kind == "nvlink_mesh" and (a, b) in self._ids:
            return [a, b]
        return []
