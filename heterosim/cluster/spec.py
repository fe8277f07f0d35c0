"""The cluster spec: the YAML schema (version 1), parsed into frozen dataclasses, and back.

A cluster is a list of *node groups*. Each group has one GPU type (a ``kernel_db`` catalogue
name), a *node type* (what is inside one server) and a node count. Between the nodes runs one
*fabric*. Example (the ``dgx-a100`` preset, shortened)::

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
``latency_us`` in microseconds; everything is stored in SI (B/s, s). Unknown keys, missing keys
and out-of-range values raise one :class:`~heterosim.errors.TopologyError` that names the key
path and the fix. ``ClusterSpec.to_dict()`` writes the canonical form: ``parse_spec(s.to_dict())
== s`` for every spec. The full reference is ``docs/clusters.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Mapping

from heterosim.errors import TopologyError

__all__ = [
    "SCHEMA_VERSION",
    "INTRA_KINDS",
    "FABRIC_KINDS",
    "DEFAULT_LATENCY_US",
    "PCIE_LANE_GBPS",
    "NVLINK_LANE_GBPS",
    "NCCL_CPU_GBPS",
    "PcieSwitch",
    "NicSpec",
    "NodeType",
    "NodeGroup",
    "FabricEdge",
    "Fabric",
    "ClusterSpec",
    "parse_spec",
]

SCHEMA_VERSION = 1
INTRA_KINDS: tuple[str, ...] = ("nvswitch", "nvlink_mesh", "pcie")
FABRIC_KINDS: tuple[str, ...] = ("rail_optimized", "leaf_spine", "explicit", "none")

# Per-hop link latencies used when the YAML gives none. NB: NCCL's cost model charges a latency per
# algorithm step by path type (src/graph/tuning.cc hwLatencies, Ring/LL: NVLINK 0.6 us, PCI 1.0 us,
# NET 2.7 us; research/nccl.md §2.1). We split each step over the cables it crosses: GPU->NVSwitch->
# GPU is two 0.3 us hops, GPU->PCIe switch->GPU two 0.5 us hops, and a same-rail network step
# GPU->sw->NIC->leaf->NIC->sw->GPU six 0.5 us hops (3.0 us, near NCCL's 2.7). Switch-internal
# forwarding, cable length and queueing are ignored.
DEFAULT_LATENCY_US: dict[str, float] = {"nvlink": 0.3, "pcie": 0.5, "cpu": 1.0, "net": 0.5}

GB = 1e9
US = 1e-6

# Payload rate of one PCIe lane per direction, GB/s: 8b/10b encoding up to Gen2, 128b/130b for
# Gen3-5, FLIT mode (~1) for Gen6 (PCI-SIG base specifications). Gen4 x16 = 31.5 GB/s.
PCIE_LANE_GBPS: dict[int, float] = {1: 2.5 * 0.8 / 8, 2: 5 * 0.8 / 8, 3: 8 * 128 / 130 / 8,
                                    4: 16 * 128 / 130 / 8, 5: 32 * 128 / 130 / 8, 6: 64 / 8}
# NVLink3/4 lane: 50 Gb/s x 4 signal pairs = 25 GB/s per direction (A100/H100 datasheets:
# 12 lanes = 600 GB/s and 18 lanes = 900 GB/s bidirectional).
NVLINK_LANE_GBPS = 25.0
# CPU socket interconnect as NCCL models it, GB/s (graph/topo.h; research/nccl.md §3.1: Intel
# SPR 22, AMD 16, ARM 6). NB: used as the physical default too; real UPI/xGMI links are faster,
# but GPU traffic rarely crosses sockets and NCCL's figure is what such P2P achieves.
NCCL_CPU_GBPS: dict[str, float] = {"intel": 22.0, "amd": 16.0, "arm": 6.0, "other": 6.0}


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
    """GPU catalogue name (``kernel_db.catalogue``)."""
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
    """Optional placement section, kept as written (see :mod:`replay.placement`)."""

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
        return out


# --------------------------------------------------------------------------------------------
# Parsing helpers


def _keys(d: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    """Check that ``d`` is a mapping with all ``required`` keys and no key outside both lists."""
    if not isinstance(d, Mapping):
        raise TopologyError(f"{where}: expected a mapping, got {type(d).__name__} {d!r}")
    unknown = sorted(str(k) for k in d if k not in required and k not in optional)
    if unknown:
        raise TopologyError(
            f"{where}: unknown key {unknown[0]!r}; valid keys: {sorted(required + optional)}"
        )
    missing = [k for k in required if k not in d]
    if missing:
        raise TopologyError(f"{where}: missing key {missing[0]!r} (required: {list(required)})")
    return dict(d)


def _num(v: Any, where: str, *, positive: bool = True, integer: bool = False) -> float:
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok:
        kind = "an integer" if integer else "a number"
        raise TopologyError(f"{where}: expected {kind}, got {v!r}")
    if positive and not v > 0:
        raise TopologyError(f"{where}: must be > 0, got {v!r}")
    if not positive and v < 0:
        raise TopologyError(f"{where}: must be >= 0, got {v!r}")
    return v


def _int(v: Any, where: str, *, positive: bool = True) -> int:
    return int(_num(v, where, positive=positive, integer=True))


def _indices(v: Any, where: str, limit: int, what: str) -> tuple[int, ...]:
    if not isinstance(v, (list, tuple)):
        raise TopologyError(f"{where}: expected a list of {what} indices, got {v!r}")
    out = tuple(_int(x, where, positive=False) for x in v)
    bad = [x for x in out if x >= limit]
    if bad:
        raise TopologyError(f"{where}: {what} index {bad[0]} out of range 0..{limit - 1}")
    return out


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise TopologyError(f"{where}: expected true or false, got {v!r}")
    return v


def _name(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v:
        raise TopologyError(f"{where}: expected a non-empty string, got {v!r}")
    return v


# --------------------------------------------------------------------------------------------
# Node types


def _parse_nics(raw: Any, where: str, gpn: int) -> tuple[NicSpec, ...]:
    if raw is None:
        return ()
    if isinstance(raw, Mapping):
        # Shorthand {count, bw_Gbps}: NICs split the GPUs evenly (count | gpus or gpus | count).
        d = _keys(raw, where, ("count", "bw_Gbps"))
        count, bw = _int(d["count"], f"{where}.count"), _num(d["bw_Gbps"], f"{where}.bw_Gbps")
        if gpn % count and count % gpn:
            raise TopologyError(
                f"{where}: {count} NICs cannot split {gpn} GPUs evenly; list the NICs one by one "
                "as [{bw_Gbps: ..., gpus: [...]}, ...]"
            )
        per = max(gpn // count, 1)
        return tuple(
            NicSpec(bw=bw * GB / 8, gpus=tuple(range((i * per) % gpn, (i * per) % gpn + per)))
            for i in range(count)
        )
    if not isinstance(raw, list):
        raise TopologyError(f"{where}: expected {{count, bw_Gbps}} or a list of NICs, got {raw!r}")
    nics = []
    for i, item in enumerate(raw):
        w = f"{where}[{i}]"
        d = _keys(item, w, ("bw_Gbps", "gpus"))
        nics.append(NicSpec(bw=_num(d["bw_Gbps"], f"{w}.bw_Gbps") * GB / 8,
                            gpus=_indices(d["gpus"], f"{w}.gpus", gpn, "GPU")))
    return tuple(nics)


def _default_switches(gpn: int, sockets: int, nics: tuple[NicSpec, ...]) -> tuple[PcieSwitch, ...]:
    # NB: without a listed PCIe tree we assume one switch per GPU pair, switches spread evenly over
    # the sockets, each NIC on the switch of the first GPU it serves (the DGX/HGX layout).
    nsw = max(gpn // 2, 1)
    out = []
    for j in range(nsw):
        gpus = tuple(g for g in range(gpn) if min(g // 2, nsw - 1) == j)
        nic_ids = tuple(i for i, n in enumerate(nics) if n.gpus and n.gpus[0] in gpus)
        out.append(PcieSwitch(socket=j * sockets // nsw, gpus=gpus, nics=nic_ids))
    return tuple(out)


def _parse_nvlink(raw: Any, where: str, gpn: int) -> dict[str, Any]:
    kind = _keys(raw, where, ("kind",), ("lanes", "lane_GBps", "nvswitches", "nvls",
                                        "latency_us", "pairs"))["kind"]
    if kind == "nvswitch":
        d = _keys(raw, where, ("kind", "lanes"), ("lane_GBps", "nvswitches", "nvls", "latency_us"))
        kw: dict[str, Any] = dict(intra="nvswitch", nvlink_lanes=_int(d["lanes"], f"{where}.lanes"),
                                  nvswitches=_int(d.get("nvswitches", 1), f"{where}.nvswitches"))
        kw["nvls"] = _bool(d.get("nvls", False), f"{where}.nvls")
    elif kind == "mesh":
        d = _keys(raw, where, ("kind", "pairs"), ("lane_GBps", "latency_us"))
        pairs = []
        for i, pr in enumerate(d["pairs"] or ()):
            w = f"{where}.pairs[{i}]"
            if not isinstance(pr, (list, tuple)) or len(pr) != 3:
                raise TopologyError(f"{w}: expected [gpu_a, gpu_b, lanes], got {pr!r}")
            ga, gb = _indices(pr[:2], w, gpn, "GPU")
            if ga == gb:
                raise TopologyError(f"{w}: a GPU cannot link to itself ({ga})")
            pairs.append((ga, gb, _int(pr[2], f"{w}[2]")))
        kw = dict(intra="nvlink_mesh", nvlink_pairs=tuple(pairs))
    else:
        raise TopologyError(f"{where}.kind: unknown {kind!r}; valid: ['mesh', 'nvswitch']")
    kw["nvlink_lane_bw"] = _num(d.get("lane_GBps", NVLINK_LANE_GBPS), f"{where}.lane_GBps") * GB
    if "latency_us" in d:
        kw["nvlink_latency"] = _num(d["latency_us"], f"{where}.latency_us", positive=False) * US
    return kw


def _parse_node_type(name: str, raw: Any) -> NodeType:
    where = f"node_types.{name}"
    d = _keys(raw, where, ("gpus_per_node", "pcie"), ("nvlink", "cpu", "nics", "coherent_memory"))
    gpn = _int(d["gpus_per_node"], f"{where}.gpus_per_node")
    nics = _parse_nics(d.get("nics"), f"{where}.nics", gpn)

    cw = f"{where}.cpu"
    c = _keys(d.get("cpu", {}), cw, (), ("sockets", "vendor", "bw_GBps", "latency_us"))
    sockets = _int(c.get("sockets", 1), f"{cw}.sockets")
    vendor = c.get("vendor", "intel")
    if vendor not in NCCL_CPU_GBPS:
        raise TopologyError(f"{cw}.vendor: unknown {vendor!r}; valid: {sorted(NCCL_CPU_GBPS)}")
    kw: dict[str, Any] = {"intra": "pcie", "cpu_vendor": vendor, "sockets": sockets,
                          "socket_bw": _num(c.get("bw_GBps", NCCL_CPU_GBPS[vendor]),
                                            f"{cw}.bw_GBps") * GB}
    if "latency_us" in c:
        kw["socket_latency"] = _num(c["latency_us"], f"{cw}.latency_us", positive=False) * US

    pw = f"{where}.pcie"
    p = _keys(d["pcie"], pw, ("gen",), ("width", "bw_GBps", "latency_us", "switches"))
    gen = p["gen"]
    if gen not in PCIE_LANE_GBPS:
        raise TopologyError(f"{pw}.gen: unknown PCIe generation {gen!r}; valid: {sorted(PCIE_LANE_GBPS)}")
    width = _int(p.get("width", 16), f"{pw}.width")
    kw.update(pcie_gen=gen, pcie_width=width,
              pcie_bw=_num(p.get("bw_GBps", PCIE_LANE_GBPS[gen] * width), f"{pw}.bw_GBps") * GB)
    if "latency_us" in p:
        kw["pcie_latency"] = _num(p["latency_us"], f"{pw}.latency_us", positive=False) * US
    if "switches" in p:
        switches = []
        for j, s in enumerate(p["switches"] or ()):
            sw = f"{pw}.switches[{j}]"
            sd = _keys(s, sw, ("socket", "gpus"), ("nics",))
            sock = _int(sd["socket"], f"{sw}.socket", positive=False)
            if sock >= sockets:
                raise TopologyError(f"{sw}.socket: {sock} out of range 0..{sockets - 1} "
                                    f"(cpu.sockets is {sockets})")
            switches.append(PcieSwitch(
                socket=sock, gpus=_indices(sd["gpus"], f"{sw}.gpus", gpn, "GPU"),
                nics=_indices(sd.get("nics", []), f"{sw}.nics", len(nics), "NIC")))
        kw["switches"] = tuple(switches)
    else:
        kw["switches"] = _default_switches(gpn, sockets, nics)
    for what, count, attr in (("GPU", gpn, "gpus"), ("NIC", len(nics), "nics")):
        seen = [x for s in kw["switches"] for x in getattr(s, attr)]
        for x in range(count):
            if seen.count(x) != 1:
                raise TopologyError(
                    f"{pw}.switches: {what} {x} hangs off {seen.count(x)} PCIe switches; every "
                    f"{what} must be listed under exactly one switch"
                )
    if "nvlink" in d:
        kw.update(_parse_nvlink(d["nvlink"], f"{where}.nvlink", gpn))
    kw["coherent_memory"] = _bool(d.get("coherent_memory", False), f"{where}.coherent_memory")
    return NodeType(name=name, gpus_per_node=gpn, nics=nics, **kw)


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
                  "latency_us": t.socket_latency / US}
    out["nics"] = [{"bw_Gbps": n.bw * 8 / GB, "gpus": list(n.gpus)} for n in t.nics]
    out["coherent_memory"] = t.coherent_memory
    return out


# --------------------------------------------------------------------------------------------
# Groups, fabric, whole spec


def _parse_group(i: int, raw: Any, types: Mapping[str, NodeType]) -> NodeGroup:
    where = f"node_groups[{i}]"
    d = _keys(raw, where, ("name", "gpu", "node_type"), ("nodes", "share"))
    nt = _name(d["node_type"], f"{where}.node_type")
    if nt not in types:
        raise TopologyError(f"{where}.node_type: {nt!r} is not defined; defined: {sorted(types)}")
    nodes = d.get("nodes")
    return NodeGroup(name=_name(d["name"], f"{where}.name"), gpu=_name(d["gpu"], f"{where}.gpu"),
                     node_type=nt, nodes=None if nodes is None else _int(nodes, f"{where}.nodes", positive=False),
                     share=_int(d.get("share", 1), f"{where}.share"))


def _group_dict(g: NodeGroup) -> dict[str, Any]:
    out: dict[str, Any] = {"name": g.name, "gpu": g.gpu, "node_type": g.node_type}
    if g.nodes is not None:
        out["nodes"] = g.nodes
    out["share"] = g.share
    return out


def _parse_fabric(raw: Any) -> Fabric:
    if raw is None:
        return Fabric(kind="none")
    kind = _keys(raw, "fabric", ("kind",), ("nodes_per_leaf", "spines", "oversubscription",
                                            "latency_us", "sharp", "switches", "edges"))["kind"]
    if kind not in FABRIC_KINDS:
        raise TopologyError(f"fabric.kind: unknown {kind!r}; valid: {list(FABRIC_KINDS)}")
    if kind == "none":
        _keys(raw, "fabric", ("kind",))
        return Fabric(kind="none")
    if kind == "explicit":
        d = _keys(raw, "fabric", ("kind", "edges"), ("switches", "latency_us", "sharp"))
        lat = _num(d.get("latency_us", DEFAULT_LATENCY_US["net"]), "fabric.latency_us",
                   positive=False) * US
        edges = []
        for i, e in enumerate(d["edges"] or ()):
            w = f"fabric.edges[{i}]"
            ed = _keys(e, w, ("a", "b", "bw_GBps"), ("latency_us",))
            edges.append(FabricEdge(
                a=_name(ed["a"], f"{w}.a"), b=_name(ed["b"], f"{w}.b"),
                bw=_num(ed["bw_GBps"], f"{w}.bw_GBps") * GB,
                latency=_num(ed.get("latency_us", lat / US), f"{w}.latency_us",
                             positive=False) * US))
        sw = tuple(_name(s, "fabric.switches") for s in d.get("switches", ()) or ())
        return Fabric(kind="explicit", latency=lat, switches=sw, edges=tuple(edges),
                      sharp=_bool(d.get("sharp", False), "fabric.sharp"))
    d = _keys(raw, "fabric", ("kind",), ("nodes_per_leaf", "spines", "oversubscription",
                                         "latency_us", "sharp"))
    spines = d.get("spines")
    return Fabric(
        kind=kind, nodes_per_leaf=_int(d.get("nodes_per_leaf", 32), "fabric.nodes_per_leaf"),
        spines=None if spines is None else _int(spines, "fabric.spines"),
        oversubscription=_num(d.get("oversubscription", 1.0), "fabric.oversubscription"),
        latency=_num(d.get("latency_us", DEFAULT_LATENCY_US["net"]), "fabric.latency_us",
                     positive=False) * US,
        sharp=_bool(d.get("sharp", False), "fabric.sharp"))


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
    return out


def parse_spec(raw: Mapping[str, Any]) -> ClusterSpec:
    """Validate a cluster dict (as loaded from YAML) and return the :class:`ClusterSpec`.

    Raises:
        TopologyError: naming the first bad key path, what is wrong and what is valid.
    """
    d = _keys(raw, "cluster spec", ("schema_version", "name", "node_types", "node_groups"),
              ("description", "fabric", "placement"))
    if d["schema_version"] != SCHEMA_VERSION:
        raise TopologyError(
            f"cluster spec schema_version {d['schema_version']!r} is not supported; this HeteroSim "
            f"reads schema_version {SCHEMA_VERSION}"
        )
    if not isinstance(d["node_types"], Mapping) or not d["node_types"]:
        raise TopologyError("node_types: expected a non-empty mapping name -> node type")
    types = {str(k): _parse_node_type(str(k), v) for k, v in d["node_types"].items()}
    if not isinstance(d["node_groups"], list) or not d["node_groups"]:
        raise TopologyError("node_groups: expected a non-empty list of groups")
    groups = tuple(_parse_group(i, g, types) for i, g in enumerate(d["node_groups"]))
    names = [g.name for g in groups]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TopologyError(f"node_groups: name {dup[0]!r} is used twice; group names must be unique")
    placement = d.get("placement")
    if placement is not None and not isinstance(placement, Mapping):
        raise TopologyError(f"placement: expected a mapping, got {placement!r}")
    return ClusterSpec(name=_name(d["name"], "name"), description=str(d.get("description", "")),
                       node_types=tuple(types.values()), node_groups=groups,
                       fabric=_parse_fabric(d.get("fabric")), placement=placement)
