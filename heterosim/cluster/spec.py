"""The cluster spec: the YAML schema (version 1) as frozen dataclasses, and their canonical dict.

A cluster is a list of *node groups*. Each group has one GPU type (a name of the GPU registry,
:mod:`heterosim.cluster.gpus`), a *node type* (what is inside one server) and a node count.
Between the nodes runs one *fabric*. Example (the ``dgx-a100`` preset, shortened)::

    schema_version: 1
    name: dgx-a100
    node_types:
      dgx-a100:
        gpus_per_node: 8
        nvlink: {kind: nvswitch, lanes: 12, lane_GBps: 25, nvswitches: 6}
        pcie: {gen: 4, switches: [{socket: 0, gpus: [0, 1], nics: [0, 1]}, ...]}
        cpu: {sockets: 2, vendor: amd}
        nics: {count: 8, bw_Gbps: 200}
    node_groups:
      - {name: a100, gpu: A100-SXM4-80GB, node_type: dgx-a100}    # nodes: from the world size
    fabric: {kind: rail_optimized, nodes_per_leaf: 20}

Units: bandwidths are per direction, ``bw_GBps`` in 1e9 B/s, NIC ``bw_Gbps`` in 1e9 bit/s,
``latency_us`` in microseconds; everything is stored in SI (B/s, s). :mod:`heterosim.cluster.parse`
validates a YAML dict into these records (``parse_spec``, ``read_spec``) and writes them back
(``write_spec``); ``ClusterSpec.to_dict()`` gives the canonical form: ``parse_spec(s.to_dict())
== s`` for every spec. The full reference is ``docs/clusters.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Mapping

from heterosim.cluster.sockets import SocketSpec, socket_rate
from heterosim.errors import TopologyError

__all__ = [
    "SCHEMA_VERSION",
    "INTRA_KINDS",
    "FABRIC_KINDS",
    "ROUTINGS",
    "DEFAULT_LATENCY_US",
    "DISPATCH_CLASSES",
    "CUDA_LAUNCH_US",
    "FRAMEWORK_US",
    "DEFAULT_DISPATCH_US",
    "GRACE_DISPATCH_FACTOR",
    "HostDispatch",
    "PcieSwitch",
    "NicSpec",
    "NodeType",
    "NodeGroup",
    "FabricEdge",
    "Fabric",
    "ClusterSpec",
]

SCHEMA_VERSION = 1
INTRA_KINDS: tuple[str, ...] = ("nvswitch", "nvlink_mesh", "pcie")
FABRIC_KINDS: tuple[str, ...] = ("rail_optimized", "leaf_spine", "explicit", "none")
ROUTINGS: tuple[str, ...] = ("ecmp", "adaptive")
"""How a two-tier fabric spreads flows over its spines (:class:`Fabric`, ``routing``)."""

# Per-hop link latencies used when the YAML gives none. NB: NCCL's cost model charges a latency per
# algorithm step by path type (src/graph/tuning.cc hwLatencies, Ring/LL: NVLINK 0.6 us, PCI 1.0 us,
# NET 2.7 us; docs/nccl.md §2.1). We split each step over the cables it crosses: GPU->NVSwitch->
# GPU is two 0.3 us hops, GPU->PCIe switch->GPU two 0.5 us hops, and a same-rail network step
# GPU->sw->NIC->leaf->NIC->sw->GPU six 0.5 us hops (3.0 us, near NCCL's 2.7). Switch-internal
# forwarding, cable length and queueing are ignored.
DEFAULT_LATENCY_US: dict[str, float] = {"nvlink": 0.3, "pcie": 0.5, "cpu": 1.0, "net": 0.5}

DISPATCH_CLASSES: tuple[str, ...] = ("fwd", "bwd", "nograd", "collective", "wait")
"""Op classes the host charges for (``replay.host``): forward op with autograd, backward op, op
outside autograd (optimizer), collective or p2p launch, wait."""

CUDA_LAUNCH_US = 3.8
"""Host-side cost of one ``cudaLaunchKernel``, us: NVIDIA's *Getting Started with CUDA Graphs*
(A. Gray, NVIDIA Technical Blog, 2019) launches a 2.9 us kernel back to back on a stream at 3.8 us
per kernel (V100, CUDA 10.1): the CPU, not the GPU, sets that pace, so one launch costs the host
3.8 us. A replication of that experiment on an RTX 5070 Ti with CUDA 13.0 (*pegainfer (3): From
Launch Overhead to CUDA Graph*, susun-blog.com, 2025) puts a launch at about 4-6 us. Added to the
framework cost that ``benchmarks/bench_dispatch.py`` measures without a GPU."""

FRAMEWORK_US: dict[str, float] = {"fwd": 7.13, "bwd": 6.59, "nograd": 1.69, "collective": 4.93, "wait": 0.29}
"""Eager framework cost per op of each class, us, without the launch: benchmarks/bench_dispatch.py,
minimum of 7 x 2000 ops, torch 2.13 (CPU build), one thread of an "Intel(R) Xeon(R) Processor"
(cloud VM, 2 vCPUs, load average 4-6); the collective on torch's ``fake`` process group. NB: a
server core at a higher clock issues faster; measure the training hosts and state them."""

DEFAULT_DISPATCH_US: dict[str, float] = {
    k: round(v + (0.0 if k == "wait" else CUDA_LAUNCH_US), 2) for k, v in FRAMEWORK_US.items()}
"""CPU time to issue one op of each class, us, when the YAML gives none (``cpu.dispatch_us``): the
framework cost plus one kernel launch (a wait launches nothing)."""

GRACE_DISPATCH_FACTOR = round(37.08 / 13.48, 2)
"""How much longer an NVIDIA Grace host (Arm Neoverse V2) takes to issue an eager op than the x86
server CPUs :data:`DEFAULT_DISPATCH_US` stands for: a ``torch.nn.Linear`` forward costs the CPU
37.08 us on a GB200 and 13.48 us on a DGX H100's Xeon Platinum 8480C, same script and shapes
(NVIDIA/TransformerEngine issue 2053, "High CPU overhead on Grace systems", 2025; GH200: 33.17 us).
NB: one op's ratio for every class of op."""

GB = 1e9
US = 1e-6


# --------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True, slots=True, kw_only=True)
class PcieSwitch:
    """One PCIe switch inside a node: the CPU socket above it, the GPUs and NICs below it."""

    socket: int
    gpus: tuple[int, ...]
    """Local GPU indices (0 .. gpus_per_node-1)."""
    nics: tuple[int, ...]
    """Local NIC indices."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NicSpec:
    """One network interface: its speed and the local GPUs it serves (its rail is its index)."""

    bw: float
    """Line rate per direction, B/s."""
    gpus: tuple[int, ...]
    rdma: bool = True
    """InfiniBand or RoCE with GPUDirect RDMA; False: Ethernet, NCCL's socket transport."""
    socket: SocketSpec = SocketSpec()
    """How the socket transport runs (used when ``rdma`` is False; :mod:`heterosim.cluster.sockets`)."""

    @property
    def rate(self) -> float:
        """What the NIC moves per direction, B/s: its line rate, or what NCCL's socket transport
        gets through it (one connection per GPU it serves) when it has no RDMA."""
        return self.bw if self.rdma else socket_rate(self.bw, len(self.gpus), self.socket)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostDispatch:
    """CPU seconds one rank's host spends issuing an op, per class (:data:`DISPATCH_CLASSES`).

    All zero: the host is never the bottleneck (what the simulator assumed before it had a host).
    """

    fwd: float = DEFAULT_DISPATCH_US["fwd"] * US
    """A forward (or recomputed) op: Python call, dispatcher, autograd recording, launch."""
    bwd: float = DEFAULT_DISPATCH_US["bwd"] * US
    """A backward op: the C++ autograd engine's node, dispatcher, launch."""
    nograd: float = DEFAULT_DISPATCH_US["nograd"] * US
    """An op outside autograd (optimizer, gradient scaling): Python call, dispatcher, launch."""
    collective: float = DEFAULT_DISPATCH_US["collective"] * US
    """A collective or p2p call: Python, c10d, NCCL kernel launch."""
    wait: float = DEFAULT_DISPATCH_US["wait"] * US
    """``Work.wait()`` of an async collective (a stream wait; the CPU does not block)."""

    def seconds(self) -> dict[str, float]:
        """Class -> seconds."""
        return {k: getattr(self, k) for k in DISPATCH_CLASSES}

    @property
    def active(self) -> bool:
        """True when any class costs time."""
        return any(v > 0 for v in self.seconds().values())


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeType:
    """What is inside one server: GPUs, their NVLink/NVSwitch or PCIe wiring, CPU sockets, NICs."""

    name: str
    gpus_per_node: int
    intra: Literal["nvswitch", "nvlink_mesh", "pcie"]
    """How GPUs talk to each other: one NVSwitch fabric, direct NVLink pairs, or only PCIe."""
    nvlink_lanes: int = 0
    """nvswitch: NVLink lanes per GPU (12 on A100, 18 on H100)."""
    nvlink_lane_bw: float = 0.0
    """Physical bandwidth of one NVLink lane per direction, B/s (25e9 for NVLink3 and 4)."""
    nvlink_pairs: tuple[tuple[int, int, int], ...] = ()
    """nvlink_mesh: (gpu_a, gpu_b, lanes) for every directly linked pair."""
    nvlink_latency: float = DEFAULT_LATENCY_US["nvlink"] * US
    nvswitches: int = 0
    """NVSwitch chips (informational; the NVSwitch plane is one vertex, as in NCCL's topology)."""
    nvls: bool = False
    """NVSwitch can reduce in the switch (NVLink SHARP, Hopper and later)."""
    pcie_gen: int
    pcie_width: int = 16
    pcie_bw: float
    """One PCIe link (GPU, NIC or switch uplink) per direction, B/s: the payload rate of
    gen x width unless the YAML gives a measured ``bw_GBps``."""
    pcie_latency: float = DEFAULT_LATENCY_US["pcie"] * US
    cpu_vendor: Literal["intel", "amd", "arm", "other"] = "intel"
    """Host CPU family; NCCL's socket-link bandwidth and network overhead depend on it."""
    sockets: int = 1
    socket_bw: float = 0.0
    """CPU-to-CPU interconnect per direction, B/s (NCCL's figure for the vendor by default)."""
    socket_latency: float = DEFAULT_LATENCY_US["cpu"] * US
    dispatch: HostDispatch = HostDispatch()
    """What the host CPU spends issuing each op (``cpu.dispatch_us``; replay.host)."""
    switches: tuple[PcieSwitch, ...]
    nics: tuple[NicSpec, ...] = ()
    coherent_memory: bool = False
    """GPUs of the node share cache-coherent memory (CXL-style, seed 003); ncclshim then offers
    its coherent ring all-reduce."""

    @property
    def gpu_switch(self) -> tuple[int, ...]:
        """PCIe switch of every local GPU."""
        return _switch_of(self.switches, "gpus", self.gpus_per_node)

    @property
    def nic_switch(self) -> tuple[int, ...]:
        """PCIe switch of every local NIC."""
        return _switch_of(self.switches, "nics", len(self.nics))

    @property
    def nvlink_bw(self) -> float:
        """nvswitch: NVLink bandwidth per GPU per direction, B/s (lanes x lane bandwidth)."""
        return self.nvlink_lanes * self.nvlink_lane_bw

    def nics_of(self, gpu: int) -> tuple[int, ...]:
        """Local NICs that serve local GPU ``gpu`` (its rails), in NIC order."""
        return tuple(i for i, n in enumerate(self.nics) if gpu in n.gpus)


@lru_cache(maxsize=256)
def _switch_of(switches: tuple[PcieSwitch, ...], attr: str, count: int) -> tuple[int, ...]:
    out = [0] * count
    for j, s in enumerate(switches):
        for x in getattr(s, attr):
            out[x] = j
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeGroup:
    """Nodes of one kind: GPU type, node type and how many (None: derived from the world size)."""

    name: str
    gpu: str
    """GPU type: a name or alias of the GPU registry (:mod:`heterosim.cluster.gpus`)."""
    node_type: str
    nodes: int | None = None
    share: int = 1
    """Weight of this group when the node count is derived (groups without ``nodes``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FabricEdge:
    """An explicit fabric cable between two endpoints (``n<node>.nic<i>`` or a switch name)."""

    a: str
    b: str
    bw: float
    latency: float = DEFAULT_LATENCY_US["net"] * US


@dataclass(frozen=True, slots=True, kw_only=True)
class Fabric:
    """The network between nodes.

    ``rail_optimized``: NIC ``i`` of every node in a pod plugs into leaf ``(rail i, pod)``; leaves
    join through ``spines`` spine switches. ``leaf_spine``: all NICs of a node plug into their
    pod's one leaf. Leaf uplink capacity is its *design* downlink capacity (``nodes_per_leaf``
    nodes, present or not) / ``oversubscription``, split evenly over the spines. ``explicit``:
    switches and cables listed by hand.
    """

    kind: Literal["rail_optimized", "leaf_spine", "explicit", "none"]
    nodes_per_leaf: int = 32
    spines: int | None = None
    """Spine switches (None: nodes_per_leaf, one uplink per downlink as in a non-blocking pod)."""
    oversubscription: float = 1.0
    latency: float = DEFAULT_LATENCY_US["net"] * US
    """Per cable (NIC-leaf, leaf-spine), s."""
    sharp: bool = False
    """Switches reduce in the network (InfiniBand SHARP with NCCL's CollNet plugin)."""
    routing: Literal["ecmp", "adaptive"] = "ecmp"
    """Two-tier fabrics: ``ecmp`` hashes each flow onto one spine (Ethernet / RoCE switches by
    default); ``adaptive`` spreads every flow over all spines by load (InfiniBand adaptive
    routing: on by default in OpenSM and used by NCCL on IB links), so a leaf's uplinks act as one
    pool (:mod:`heterosim.cluster.network`)."""
    switches: tuple[str, ...] = ()
    edges: tuple[FabricEdge, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """A parsed cluster YAML (see the module docstring)."""

    name: str
    description: str = ""
    node_types: tuple[NodeType, ...]
    node_groups: tuple[NodeGroup, ...]
    fabric: Fabric
    placement: Mapping[str, Any] | None = None
    """Optional placement section, kept as written (see :mod:`heterosim.cluster.placement`)."""
    gpus: tuple[Mapping[str, Any], ...] = ()
    """Accelerators this file defines (entries of the ``gpus.yaml`` schema), kept as written;
    validated by the parser, added to the GPU registry for this cluster only."""

    def node_type(self, name: str) -> NodeType:
        """The node type called ``name``."""
        for t in self.node_types:
            if t.name == name:
                return t
        raise TopologyError(
            f"node type {name!r} is not defined; defined: {[t.name for t in self.node_types]}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The canonical YAML-ready dict (SI values converted back to the units in the keys)."""
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "name": self.name}
        if self.description:
            out["description"] = self.description
        out["node_types"] = {t.name: _node_type_dict(t) for t in self.node_types}
        out["node_groups"] = [_group_dict(g) for g in self.node_groups]
        out["fabric"] = _fabric_dict(self.fabric)
        if self.placement is not None:
            out["placement"] = dict(self.placement)
        if self.gpus:
            out["gpus"] = [dict(g) for g in self.gpus]
        return out


# --------------------------------------------------------------------------------------------
# Canonical dict form (``ClusterSpec.to_dict``; what ``write_spec`` writes)


def _node_type_dict(t: NodeType) -> dict[str, Any]:
    out: dict[str, Any] = {"gpus_per_node": t.gpus_per_node}
    if t.intra == "nvswitch":
        out["nvlink"] = {"kind": "nvswitch", "lanes": t.nvlink_lanes,
                         "lane_GBps": t.nvlink_lane_bw / GB, "nvswitches": t.nvswitches,
                         "nvls": t.nvls, "latency_us": t.nvlink_latency / US}
    elif t.intra == "nvlink_mesh":
        out["nvlink"] = {"kind": "mesh", "lane_GBps": t.nvlink_lane_bw / GB,
                         "pairs": [list(p) for p in t.nvlink_pairs],
                         "latency_us": t.nvlink_latency / US}
    out["pcie"] = {"gen": t.pcie_gen, "width": t.pcie_width, "bw_GBps": t.pcie_bw / GB,
                   "latency_us": t.pcie_latency / US,
                   "switches": [{"socket": s.socket, "gpus": list(s.gpus), "nics": list(s.nics)}
                                for s in t.switches]}
    out["cpu"] = {"sockets": t.sockets, "vendor": t.cpu_vendor, "bw_GBps": t.socket_bw / GB,
                  "latency_us": t.socket_latency / US,
                  "dispatch_us": {k: v / US for k, v in t.dispatch.seconds().items()}}
    out["nics"] = [_nic_dict(n) for n in t.nics]
    out["coherent_memory"] = t.coherent_memory
    return out


def _nic_dict(n: NicSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"bw_Gbps": n.bw * 8 / GB, "gpus": list(n.gpus)}
    if not n.rdma:
        s = n.socket
        out["rdma"] = False
        out["socket"] = {"threads": s.threads, "socks_per_thread": s.socks_per_thread,
                         "stream_Gbps": s.stream_bw * 8 / GB, "latency_us": s.latency / US}
        if s.flow_bw > 0:
            out["socket"]["flow_Gbps"] = s.flow_bw * 8 / GB
    return out


def _group_dict(g: NodeGroup) -> dict[str, Any]:
    out: dict[str, Any] = {"name": g.name, "gpu": g.gpu, "node_type": g.node_type}
    if g.nodes is not None:
        out["nodes"] = g.nodes
    out["share"] = g.share
    return out


def _fabric_dict(f: Fabric) -> dict[str, Any]:
    if f.kind == "none":
        return {"kind": "none"}
    if f.kind == "explicit":
        return {"kind": "explicit", "latency_us": f.latency / US, "sharp": f.sharp,
                "switches": list(f.switches),
                "edges": [{"a": e.a, "b": e.b, "bw_GBps": e.bw / GB, "latency_us": e.latency / US}
                          for e in f.edges]}
    out: dict[str, Any] = {"kind": f.kind, "nodes_per_leaf": f.nodes_per_leaf}
    if f.spines is not None:
        out["spines"] = f.spines
    out.update(oversubscription=f.oversubscription, latency_us=f.latency / US, sharp=f.sharp)
    if f.routing != "ecmp":
        out["routing"] = f.routing
    return out
