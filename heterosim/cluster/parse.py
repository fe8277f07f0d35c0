"""Validating a cluster YAML dict into a :class:`~heterosim.cluster.spec.ClusterSpec`, and the files.

:func:`parse_spec` checks every key of the schema (:mod:`heterosim.cluster.spec`): unknown keys,
missing keys and out-of-range values raise one :class:`~heterosim.errors.TopologyError` that
names the key path and the fix. Defaults come from the bandwidth tables
(:mod:`heterosim.cluster.bandwidth`) and the spec's latencies. :func:`read_spec` parses a YAML
file (errors name it); :func:`write_spec` writes the canonical YAML of a spec, atomically.
"""

from __future__ import annotations

import math

import os
from pathlib import Path
from typing import Any, Mapping

from heterosim.cluster.bandwidth import NCCL_CPU_GBPS, NVLINK_LANE_GBPS, PCIE_LANE_GBPS
from heterosim.cluster.gpus import GpuSpec, load_catalogue, spec_from_entry
from heterosim.cluster.sockets import CLOUD_AUTO, MAX_THREADS, SocketSpec
from heterosim.cluster.spec import (
    DEFAULT_DISPATCH_US,
    DEFAULT_LATENCY_US,
    DISPATCH_CLASSES,
    FABRIC_KINDS,
    ROUTINGS,
    GB,
    SCHEMA_VERSION,
    US,
    ClusterSpec,
    Fabric,
    FabricEdge,
    HostDispatch,
    NicSpec,
    NodeGroup,
    NodeType,
    PcieSwitch,
)
from heterosim.errors import TopologyError

__all__ = ["parse_spec", "read_spec", "write_spec"]


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


# Physical range of a value by the unit its key names: a bandwidth from 1 MB/s to 1 PB/s, a
# latency up to one second. Outside it a value is a typo (1e-300 GB/s would print a 300-digit
# iteration time; .inf spins the max-min solver), not a cluster.
_UNIT_RANGES = {"_GBps": (1e-3, 1e6, "GB/s"), "_Gbps": (8e-3, 8e6, "Gb/s"), "latency_us": (0.0, 1e6, "us")}


def _num(v: Any, where: str, *, positive: bool = True, integer: bool = False) -> float:
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok:
        kind = "an integer" if integer else "a number"
        raise TopologyError(f"{where}: expected {kind}, got {v!r}")
    if not math.isfinite(v):
        raise TopologyError(f"{where}: must be a finite number, got {v!r}")
    if positive and not v > 0:
        raise TopologyError(f"{where}: must be > 0, got {v!r}")
    if not positive and v < 0:
        raise TopologyError(f"{where}: must be >= 0, got {v!r}")
    for suffix, (lo, hi, unit) in _UNIT_RANGES.items():
        if where.endswith(suffix) and not lo <= v <= hi:
            raise TopologyError(f"{where}: {v!r} {unit} is outside the physical range {lo:g}..{hi:g} {unit}")
    return v


MAX_COUNT = 1 << 20
"""The largest count a cluster file may give (nodes, shares, leaves; the largest cluster built)."""
MAX_RADIX = 1024
"""The most ports a fabric switch may have (leaf nodes, spines): today's largest are 64-256."""
MAX_PER_NODE = 1024
"""The largest per-node count (GPUs, NICs, sockets, lanes, switches, PCIe width): beyond any server."""


def _int(v: Any, where: str, *, positive: bool = True, hi: int = MAX_COUNT) -> int:
    n = int(_num(v, where, positive=positive, integer=True))
    if n > hi:  # checked before anything is built from it: a 2**70 loop never ends
        raise TopologyError(f"{where}: {n} is more than {hi:,}; give a realistic count")
    return n


def _list(v: Any, where: str, what: str) -> list:
    if v is None:
        return []
    if not isinstance(v, list):
        raise TopologyError(f"{where}: expected a list of {what}, got {v!r:.60}")
    return v


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
        d = _keys(raw, where, ("count", "bw_Gbps"), ("rdma", "socket"))
        count, bw = _int(d["count"], f"{where}.count", hi=MAX_PER_NODE), _num(d["bw_Gbps"], f"{where}.bw_Gbps")
        transport = _parse_transport(d, where)
        if gpn % count and count % gpn:
            raise TopologyError(
                f"{where}: {count} NICs cannot split {gpn} GPUs evenly; list the NICs one by one "
                "as [{bw_Gbps: ..., gpus: [...]}, ...]"
            )
        per = max(gpn // count, 1)
        return tuple(
            NicSpec(bw=bw * GB / 8, gpus=tuple(range((i * per) % gpn, (i * per) % gpn + per)), **transport)
            for i in range(count)
        )
    if not isinstance(raw, list):
        raise TopologyError(f"{where}: expected {{count, bw_Gbps}} or a list of NICs, got {raw!r}")
    nics = []
    for i, item in enumerate(raw):
        w = f"{where}[{i}]"
        d = _keys(item, w, ("bw_Gbps", "gpus"), ("rdma", "socket"))
        nics.append(NicSpec(bw=_num(d["bw_Gbps"], f"{w}.bw_Gbps") * GB / 8,
                            gpus=_indices(d["gpus"], f"{w}.gpus", gpn, "GPU"), **_parse_transport(d, w)))
    return tuple(nics)


_SOCKET_KEYS = ("cloud", "threads", "socks_per_thread", "stream_Gbps", "flow_Gbps", "latency_us")


def _parse_transport(d: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A NIC's ``rdma`` (default true) and, without RDMA, its ``socket`` settings (NCCL's socket
    transport, :mod:`heterosim.cluster.sockets`; ``cloud`` picks NCCL's auto-detected threads)."""
    rdma = _bool(d.get("rdma", True), f"{where}.rdma")
    if rdma:
        if "socket" in d:
            raise TopologyError(f"{where}.socket: only a NIC without RDMA uses NCCL's socket transport; "
                                "set rdma: false or drop socket")
        return {}
    sw = f"{where}.socket"
    s = _keys(d.get("socket", {}), sw, (), _SOCKET_KEYS)
    cloud = s.get("cloud", "other")
    if cloud not in CLOUD_AUTO:
        raise TopologyError(f"{sw}.cloud: unknown {cloud!r}; valid: {sorted(CLOUD_AUTO)}")
    nt, ns = CLOUD_AUTO[cloud]
    threads = _int(s.get("threads", nt), f"{sw}.threads", positive=False, hi=MAX_THREADS)
    kw: dict[str, Any] = {"threads": threads,
                          "socks_per_thread": _int(s.get("socks_per_thread", ns), f"{sw}.socks_per_thread")}
    if "stream_Gbps" in s:
        kw["stream_bw"] = _num(s["stream_Gbps"], f"{sw}.stream_Gbps") * GB / 8
    if "flow_Gbps" in s:
        kw["flow_bw"] = _num(s["flow_Gbps"], f"{sw}.flow_Gbps") * GB / 8
    if "latency_us" in s:
        kw["latency"] = _num(s["latency_us"], f"{sw}.latency_us", positive=False) * US
    return {"rdma": False, "socket": SocketSpec(**kw)}


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


def _parse_dispatch(raw: Any, where: str) -> HostDispatch:
    """``cpu.dispatch_us``: one number for every class, or {class: us}; missing classes default."""

    def us(v: Any, w: str) -> float:
        v = _num(v, w, positive=False)
        if v > 1e6:  # a second per op is a typo (ms or ns for us), not a host
            raise TopologyError(f"{w}: {v!r} us per op is more than a second; give microseconds")
        return v * US

    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        v = us(raw, where)
        return HostDispatch(**{k: v for k in DISPATCH_CLASSES})
    d = _keys(raw, where, (), DISPATCH_CLASSES)
    return HostDispatch(**{k: us(d.get(k, DEFAULT_DISPATCH_US[k]), f"{where}.{k}") for k in DISPATCH_CLASSES})


def _parse_nvlink(raw: Any, where: str, gpn: int) -> dict[str, Any]:
    kind = _keys(raw, where, ("kind",), ("lanes", "lane_GBps", "nvswitches", "nvls",
                                        "latency_us", "pairs"))["kind"]
    if kind == "nvswitch":
        d = _keys(raw, where, ("kind", "lanes"), ("lane_GBps", "nvswitches", "nvls", "latency_us"))
        kw: dict[str, Any] = dict(intra="nvswitch", nvlink_lanes=_int(d["lanes"], f"{where}.lanes", hi=MAX_PER_NODE),
                                  nvswitches=_int(d.get("nvswitches", 1), f"{where}.nvswitches", hi=MAX_PER_NODE))
        kw["nvls"] = _bool(d.get("nvls", False), f"{where}.nvls")
    elif kind == "mesh":
        d = _keys(raw, where, ("kind", "pairs"), ("lane_GBps", "latency_us"))
        pairs = []
        for i, pr in enumerate(_list(d["pairs"], f"{where}.pairs", "GPU pairs")):
            w = f"{where}.pairs[{i}]"
            if not isinstance(pr, (list, tuple)) or len(pr) != 3:
                raise TopologyError(f"{w}: expected [gpu_a, gpu_b, lanes], got {pr!r}")
            ga, gb = _indices(pr[:2], w, gpn, "GPU")
            if ga == gb:
                raise TopologyError(f"{w}: a GPU cannot link to itself ({ga})")
            pairs.append((ga, gb, _int(pr[2], f"{w}[2]", hi=MAX_PER_NODE)))
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
    gpn = _int(d["gpus_per_node"], f"{where}.gpus_per_node", hi=MAX_PER_NODE)
    nics = _parse_nics(d.get("nics"), f"{where}.nics", gpn)

    cw = f"{where}.cpu"
    c = _keys(d.get("cpu", {}), cw, (), ("sockets", "vendor", "bw_GBps", "latency_us", "dispatch_us"))
    sockets = _int(c.get("sockets", 1), f"{cw}.sockets", hi=MAX_PER_NODE)
    vendor = c.get("vendor", "intel")
    if not isinstance(vendor, str) or vendor not in NCCL_CPU_GBPS:
        raise TopologyError(f"{cw}.vendor: unknown {vendor!r}; valid: {sorted(NCCL_CPU_GBPS)}")
    kw: dict[str, Any] = {"intra": "pcie", "cpu_vendor": vendor, "sockets": sockets,
                          "socket_bw": _num(c.get("bw_GBps", NCCL_CPU_GBPS[vendor]),
                                            f"{cw}.bw_GBps") * GB}
    if "latency_us" in c:
        kw["socket_latency"] = _num(c["latency_us"], f"{cw}.latency_us", positive=False) * US
    if "dispatch_us" in c:
        kw["dispatch"] = _parse_dispatch(c["dispatch_us"], f"{cw}.dispatch_us")

    pw = f"{where}.pcie"
    p = _keys(d["pcie"], pw, ("gen",), ("width", "bw_GBps", "latency_us", "switches"))
    gen = p["gen"]
    if isinstance(gen, bool) or not isinstance(gen, int) or gen not in PCIE_LANE_GBPS:
        raise TopologyError(f"{pw}.gen: unknown PCIe generation {gen!r}; valid: {sorted(PCIE_LANE_GBPS)}")
    width = _int(p.get("width", 16), f"{pw}.width", hi=MAX_PER_NODE)
    kw.update(pcie_gen=gen, pcie_width=width,
              pcie_bw=_num(p.get("bw_GBps", PCIE_LANE_GBPS[gen] * width), f"{pw}.bw_GBps") * GB)
    if "latency_us" in p:
        kw["pcie_latency"] = _num(p["latency_us"], f"{pw}.latency_us", positive=False) * US
    if "switches" in p:
        switches = []
        for j, s in enumerate(_list(p["switches"], f"{pw}.switches", "PCIe switches")):
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


def _parse_fabric(raw: Any) -> Fabric:
    if raw is None:
        return Fabric(kind="none")
    kind = _keys(raw, "fabric", ("kind",), ("nodes_per_leaf", "spines", "oversubscription",
                                            "latency_us", "sharp", "routing", "switches", "edges"))["kind"]
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
                                         "latency_us", "sharp", "routing"))
    spines = d.get("spines")
    routing = d.get("routing", "ecmp")
    if routing not in ROUTINGS:
        raise TopologyError(f"fabric.routing: unknown {routing!r}; valid: {list(ROUTINGS)}")
    return Fabric(
        kind=kind, nodes_per_leaf=_int(d.get("nodes_per_leaf", 32), "fabric.nodes_per_leaf", hi=MAX_RADIX),
        spines=None if spines is None else _int(spines, "fabric.spines", hi=MAX_RADIX),
        oversubscription=_num(d.get("oversubscription", 1.0), "fabric.oversubscription"),
        latency=_num(d.get("latency_us", DEFAULT_LATENCY_US["net"]), "fabric.latency_us",
                     positive=False) * US,
        sharp=_bool(d.get("sharp", False), "fabric.sharp"), routing=routing)


def parse_spec(raw: Mapping[str, Any]) -> ClusterSpec:
    """Validate a cluster dict (as loaded from YAML) and return the :class:`ClusterSpec`.

    Raises:
        TopologyError: naming the first bad key path, what is wrong and what is valid.
    """
    d = _keys(raw, "cluster spec", ("schema_version", "name", "node_types", "node_groups"),
              ("description", "fabric", "placement", "gpus"))
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
    gpus = _list(d.get("gpus"), "gpus", "accelerator entries (the gpus.yaml schema)")
    cluster_gpus(gpus)  # validated here: a bad entry is an error of this file
    return ClusterSpec(name=_name(d["name"], "name"), description=str(d.get("description", "")),
                       node_types=tuple(types.values()), node_groups=groups,
                       fabric=_parse_fabric(d.get("fabric")), placement=placement, gpus=tuple(gpus))


def cluster_gpus(entries: Any) -> tuple[GpuSpec, ...]:
    """The accelerators of a cluster file's ``gpus:`` section, validated (TopologyError naming
    the entry); what an entry leaves out of the optional keys comes from the shipped catalogue's
    ``defaults:`` (its launch overhead)."""
    from heterosim.errors import ConfigError

    defaults = load_catalogue().defaults or {}
    out = []
    for i, e in enumerate(entries):
        try:
            out.append(spec_from_entry(e, defaults, f"gpus[{i}]"))
        except ConfigError as err:
            raise TopologyError(str(err)) from None
    return tuple(out)


def read_spec(path: str | os.PathLike) -> ClusterSpec:
    """Parse a cluster YAML file; errors name the file."""
    from heterosim.yamlfile import read_yaml

    path = Path(path)
    raw = read_yaml(path, "cluster file", error=TopologyError)
    try:
        return parse_spec(raw)
    except TopologyError as e:
        raise TopologyError(f"cluster file {path}: {e}") from None


def write_spec(spec: ClusterSpec, path: str | os.PathLike) -> Path:
    """Write ``spec`` as canonical YAML, atomically; the same spec always gives the same bytes and
    ``read_spec(write_spec(s, p)) == s``."""
    import yaml

    from heterosim.atomic import atomic_write_text

    text = yaml.safe_dump(spec.to_dict(), sort_keys=False, default_flow_style=None, width=100)
    atomic_write_text(path, text)
    return Path(path)
