"""NCCL's view of one communicator: rings, trees, NVLS heads and the channel search.

``analyze(ranks, view, pxn=...)`` returns a :class:`GroupGraph`: the per-node member lists, the
ring of every search channel (with the links each hop crosses), and the outcome of an emulated
``ncclTopoCompute`` for the RING (and BALANCED_TREE) and NVLS patterns: channel count, per-channel
speeds ``bw_intra``/``bw_inter`` in GB/s, worst path types, and the bottleneck link.

The channel search (``search.cc``; ``docs/nccl.md`` §3.3) is emulated greedily: at a trial
speed ``s`` (NCCL's speed arrays), channels are added one at a time, each subtracting ``s`` from the
NCCL-model bandwidth of every link its ring crosses, until a link would go negative, ``maxCh`` (32)
is reached, or ``nCh * s >= totalBw``; the first speed yielding a channel wins, then pass 2 raises
the speed with the channel count fixed, then ``ncclTopoDupChannels`` doubles channels at high
speeds. NB: this ignores NCCL's search over alternative ring orders and NIC pairings
(``crossNic``, ``sameChannels``), its search timeout and its tree-specific graph; the tree graph
is taken equal to the ring graph (NCCL searches it with ``min = max = ring.nChannels``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from heterosim.cluster.bandwidth import arch_index
from heterosim.cluster.spec import DEFAULT_LATENCY_US
from heterosim.errors import TopologyError
from ncclshim.constants import INTER_SPEEDS, INTRA_SPEEDS, MAX_CHANNELS
from ncclshim.topology import TopologyView, per_view

__all__ = ["Hop", "Ring", "GroupGraph", "analyze", "path_type", "node_segment", "extra_latency_us",
           "latency_stated"]

_MAX_RING_CHANNELS = MAX_CHANNELS // 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Hop:
    """One edge of a ring: GPU ``src`` sends to GPU ``dst`` over ``path``."""

    src: int
    dst: int
    path: tuple[int, ...]
    inter: bool
    """Crosses nodes (priced with NET latency)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ring:
    """The ring of one search channel: ``order`` lists GPU indices; ``hops[i]`` is order[i]->order[i+1]."""

    order: tuple[int, ...]
    hops: tuple[Hop, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupGraph:
    """What NCCL's init computes for a communicator over ``ranks`` (GPU indices)."""

    ranks: tuple[int, ...]
    node_members: tuple[tuple[int, ...], ...]
    """Members per node, nodes in order of first appearance in ``ranks``, members by local index."""
    n_nodes: int
    ppn: int
    """Most ranks on one node (NCCL assumes equal ranks per node)."""
    arch: int
    """Lowest arch index among members (the slowest member picks the tables)."""
    same_sm: bool
    cpu_vendor: str
    rings: tuple[Ring, ...]
    """Distinct rings, one per search channel before duplication (duplicates share paths)."""
    n_channels: int
    """Ring/tree search channels after ``ncclTopoDupChannels`` (NCCL's ``graph.nChannels``)."""
    bw_intra: float
    """Per-channel speed inside nodes, GB/s (after duplication)."""
    bw_inter: float
    runtime_channels: int
    """``comm->nChannels``: search channels x2, x2 again on multi-node Hopper below 16."""
    type_intra: str
    type_inter: str
    nvls_channels: int
    """NVLS heads (0 when NVLS is unavailable)."""
    nvls_bw_intra: float
    nvls_bw_inter: float
    coherent: bool
    """Every member's node declares coherent shared memory."""
    bottleneck: int | None
    """Link id most loaded by the rings relative to its NCCL bandwidth (None for one GPU)."""
    lat_intra_us: float = 0.0
    """The cluster's latency of one intra-node ring step beyond the reference its links default
    to (:func:`extra_latency_us`), us; added to NCCL's intra-node hardware latency."""
    lat_inter_us: float = 0.0
    """The same for one inter-node (network) ring step, us; added to NCCL's NET latency."""
    gpu_bw: float = 0.0
    """NCCL's bandwidth out of one GPU inside its node (NVLinks, else PCIe), slowest member, GB/s
    (the search's ``totalBw``)."""


def path_type(view: TopologyView, path: tuple[int, ...]) -> str:
    """NCCL's path type of a GPU->GPU or GPU->NIC path built from the view's links."""
    return _path_type(_link_traits(view), path)


def _path_type(traits: tuple[tuple[str, bool, bool, str | None], ...], path: tuple[int, ...]) -> str:
    kinds = [traits[i] for i in path]
    net = next((j for j, k in enumerate(kinds) if k[0] == "net"), None)
    if net is not None:
        kinds = kinds[:net]
        if any(k[0] == "nvlink" for k in kinds):
            return "PXN"
    if kinds and all(k[0] == "nvlink" for k in kinds):
        return "NVL" if sum(1 for k in kinds if k[1]) <= 1 else "NVB"
    if any(k[0] == "cpu" for k in kinds):
        return "SYS"
    if any(k[2] for k in kinds):
        return "PHB"
    switches = {k[3] for k in kinds if k[3] is not None}
    return "PIX" if len(switches) <= 1 else "PXB"


def _link_traits(view: TopologyView) -> tuple[tuple[str, bool, bool, str | None], ...]:
    """Per link what :func:`path_type` reads: (kind, ends at a GPU, ends at a CPU, the PCIe switch
    it ends at or None)."""
    return per_view("traits", view, lambda v: tuple(
        (k.kind, ".gpu" in k.dst, ".cpu" in k.dst, k.dst if ".sw" in k.dst else None) for k in v.links))


def latency_stated(view: TopologyView) -> bool:
    """Whether any link's latency differs from its kind's default; when none does, every path's
    :func:`extra_latency_us` is exactly 0 and callers may skip the sums."""
    return per_view("latency", view, lambda v: any(extra_latency_us(v, (i,)) != 0.0 for i in range(len(v.links))))


def extra_latency_us(view: TopologyView, path: tuple[int, ...]) -> float:
    """Latency of ``path`` beyond what its links have by default, us (negative when faster).

    NCCL's ``hwLatencies`` (``docs/nccl.md`` §2.1) are one step's latency measured on real
    systems: software, protocol and wire together. The wire part of such a system is what a
    cluster file gets when it states no ``latency_us`` (``DEFAULT_LATENCY_US``, per cable, in
    :mod:`heterosim.cluster.spec`), so a cluster's own latencies enter NCCL's model as the
    difference: a step over cables stated slower (faster) than their default costs that much more
    (less). NB: this keeps NCCL's constant for any path of default cables, however many switch
    hops it crosses (a spine hop with default latencies adds nothing).
    """
    extra = 0.0
    for i in path:
        link = view.links[i]
        extra += link.latency - DEFAULT_LATENCY_US.get(link.kind, link.latency * 1e6) * 1e-6
    return extra * 1e6


def _mean_extra_us(view: TopologyView, paths: list[tuple[int, ...]]) -> float:
    """Mean :func:`extra_latency_us` over ring hops: a chunk crosses every hop of the ring in turn,
    so a ring's steps add up to the mean hop times their count (NCCL's per-step model)."""
    return sum(extra_latency_us(view, p) for p in paths) / len(paths) if paths else 0.0


_TYPE_RANK = {"LOC": 0, "NVL": 1, "NVB": 2, "C2C": 3, "PIX": 4, "PXB": 5, "P2C": 6, "PXN": 7, "PHB": 8, "SYS": 9}


def _worst(types: list[str], default: str) -> str:
    return max(types, key=_TYPE_RANK.__getitem__) if types else default


def _members_by_node(ranks: tuple[int, ...], view: TopologyView) -> tuple[tuple[int, ...], ...]:
    order: dict[int, list[int]] = {}
    for r in ranks:
        order.setdefault(view.gpus[r].node, []).append(r)
    return tuple(tuple(sorted(m, key=lambda g: view.gpus[g].local_index)) for m in order.values())


def node_segment(members: tuple[int, ...], channel: int, view: TopologyView) -> tuple[list[int], int]:
    """Order of one node's members in the ring of ``channel`` and the NIC it enters through.

    The ring enters at the member owning the channel's NIC (NICs of the members, by rail, channel
    ``c`` takes NIC ``c mod count``) and leaves at a member sharing that NIC's PCIe switch, so the
    NIC serves both directions (``NET n -> GPU a -> ... -> GPU x -> NET n``, §3.3).
    """
    nics = sorted({n for g in members for n in view.gpus[g].nics}, key=lambda n: view.nics[n].rail)
    if not nics:
        return list(members), -1
    nic = nics[channel % len(nics)]
    entry = next((g for g in members if view.gpus[g].nics[:1] == (nic,)), None)
    if entry is None:
        entry = next(g for g in members if nic in view.gpus[g].nics)
    i = members.index(entry)
    rest = list(members[i + 1:] + members[:i])
    sw = view.nics[nic].pcie_switch
    partner = [g for g in rest if view.gpus[g].pcie_switch == sw]
    if partner:
        rest.remove(partner[0])
        rest.append(partner[0])
    return [entry, *rest], nic


def _build_ring(nodes: tuple[tuple[int, ...], ...], channel: int, view: TopologyView, pxn: bool) -> Ring:
    if len(nodes) == 1:  # one node: NCCL's rings follow the local order (no NIC to enter by)
        segs = [(list(nodes[0]), -1)]
    else:
        segs = [node_segment(m, channel, view) for m in nodes]
    order = [g for seg, _ in segs for g in seg]
    hops = []
    for k, (seg, _) in enumerate(segs):
        for a, b in zip(seg, seg[1:]):
            hops.append(Hop(src=a, dst=b, path=view.route(a, b, 0, pxn=pxn), inter=False))
        nseg, nic = segs[(k + 1) % len(segs)]
        if len(segs) == 1:
            if len(seg) > 1:
                hops.append(Hop(src=seg[-1], dst=seg[0], path=view.route(seg[-1], seg[0], 0, pxn=pxn), inter=False))
            continue
        dst = nseg[0]
        ch = view.gpus[dst].nics.index(nic) if nic >= 0 else 0
        hops.append(Hop(src=seg[-1], dst=dst, path=view.route(seg[-1], dst, ch, pxn=pxn), inter=True))
    return Ring(order=tuple(order), hops=tuple(hops))


def _channels_at(speed: float, loads: list[Counter], cap: dict[int, float], total: float, max_ch: int) -> int:
    """Greedy channel count at ``speed`` GB/s (see module docstring)."""
    left = dict(cap)
    n = 0
    while n < max_ch:
        load = loads[n % len(loads)]
        if any(left[link] < cnt * speed - 1e-9 for link, cnt in load.items()):
            break
        for link, cnt in load.items():
            left[link] -= cnt * speed
        n += 1
        if n * speed >= total:
            break
    return n


def analyze(ranks: tuple[int, ...], view: TopologyView, *, pxn: bool = True) -> GroupGraph:
    """Emulate NCCL's communicator init for ``ranks`` (distinct GPU indices, >= 2)."""
    if len(set(ranks)) != len(ranks):
        raise TopologyError(f"ranks {list(ranks)} repeat a GPU; each rank of a group needs its own GPU")
    for r in ranks:
        if not 0 <= r < len(view.gpus):
            raise TopologyError(f"rank GPU {r} is not in the topology ({len(view.gpus)} GPUs)")
    gpus = [view.gpus[r] for r in ranks]
    nodes = _members_by_node(ranks, view)
    n_nodes, ppn = len(nodes), max(len(m) for m in nodes)
    arch = min(arch_index(g.sm) for g in gpus)
    fabrics = [view.nodes[view.gpus[m[0]].node].fabric for m in nodes]
    vendors = {f.cpu_vendor for f in fabrics}
    vendor = "amd" if "amd" in vendors else next(iter(vendors))

    # Rings repeat with the NIC rotation period; build one per distinct channel pattern.
    period = 1 if n_nodes == 1 else max(len({n for g in m for n in view.gpus[g].nics}) for m in nodes) or 1
    rings = tuple(_build_ring(nodes, c, view, pxn) for c in range(period))
    loads = [Counter(link for hop in ring.hops for link in hop.path) for ring in rings]
    used = set().union(*loads)
    cap = {i: view.links[i].model_bw / 1e9 for i in used}

    intra_hops = [h.path for ring in rings for h in ring.hops if not h.inter]
    inter_hops = [h.path for ring in rings for h in ring.hops if h.inter]
    stated = latency_stated(view)
    traits = _link_traits(view)
    type_intra = _worst([_path_type(traits, p) for p in set(intra_hops)], "NVL")
    type_inter = _worst([_path_type(traits, p) for p in set(inter_hops)], "PIX")
    # totalBw: one GPU's summed intra-node bandwidth (its NVLinks, else its PCIe link), slowest member.
    total = _total_bw(view, rings) or 1e-9
    max_bw = min((min(cap[i] for i in p) for p in (inter_hops or intra_hops) if p), default=0.0)
    speeds = (INTER_SPEEDS if n_nodes > 1 else INTRA_SPEEDS)[arch]
    n_ch, speed = 0, 0.0
    for s in speeds:
        if s <= max_bw + 1e-9:
            n_ch = _channels_at(s, loads, cap, total, _MAX_RING_CHANNELS)
            if n_ch:
                speed = s
                break
    if not n_ch:  # below the slowest speed: one channel at what the path carries
        n_ch, speed = 1, max(max_bw, 1e-3)
    for s in sorted(speeds):  # pass 2: raise speed, channel count fixed
        if speed < s <= max_bw + 1e-9 and _channels_at(s, loads, cap, float("inf"), n_ch) >= n_ch:
            speed = s
    ring_speed = speed
    if speed >= 25 and not (min(g.sm for g in gpus) > 80 and speed < 50 and n_ch > 4):
        n_ch, speed = min(2 * n_ch, _MAX_RING_CHANNELS), speed / 2  # ncclTopoDupChannels
    runtime = 2 * n_ch
    if arch >= 2 and n_nodes > 1 and speed > 45 and runtime < 16:
        runtime *= 2
    # The bottleneck is judged on hardware bandwidth: the link with the most ring bytes per B/s.
    total_load: Counter = Counter()
    for load in loads:
        total_load.update(load)
    util = {i: cnt / view.links[i].bw for i, cnt in total_load.items()}
    top = max(util.values(), default=0.0)
    bottleneck = min((i for i, u in util.items() if u >= top * (1 - 1e-9)),
                     key=lambda i: (view.links[i].bw, i), default=None)

    nvls_ch, nvls_intra, nvls_inter = 0, 0.0, 0.0
    # NCCL sets up NVLS only for more than two GPUs in the node (src/transport/nvls.cc, ncclNvlsInit:
    # "gpuCount <= 2" returns without it).
    if all(f.kind == "nvswitch" and f.nvls for f in fabrics) and arch >= 2 and ppn > 2:
        nvls_ch = min(32, ppn)
        nvls_intra = next((s for s in INTRA_SPEEDS[arch] if (nvls_ch + 1) * s <= total + 1e-9), 0.0)
        ceiling = 2 * nvls_intra
        if n_nodes > 1:
            ceiling = min(ceiling, max_bw)
            nvls_inter = next((s for s in INTER_SPEEDS[arch] if s <= ceiling + 1e-9), 0.0)
        else:  # NB: pass 2 raises bwInter; we take the ring search's speed, capped at 2*bwIntra.
            nvls_inter = min(ring_speed, ceiling)
        if nvls_ch < 2 or nvls_intra == 0:
            nvls_ch = 0
    return GroupGraph(
        ranks=ranks, node_members=nodes, n_nodes=n_nodes, ppn=ppn, arch=arch,
        same_sm=len({g.sm for g in gpus}) == 1 or all(g.sm >= 90 for g in gpus), cpu_vendor=vendor,
        rings=rings, n_channels=n_ch, bw_intra=speed, bw_inter=speed, runtime_channels=min(runtime, MAX_CHANNELS),
        type_intra=type_intra, type_inter=type_inter, nvls_channels=nvls_ch, nvls_bw_intra=nvls_intra,
        nvls_bw_inter=nvls_inter, coherent=all(f.coherent for f in fabrics), gpu_bw=total,
        lat_intra_us=_mean_extra_us(view, intra_hops) if stated else 0.0,
        lat_inter_us=_mean_extra_us(view, inter_hops) if stated else 0.0,
        bottleneck=bottleneck,
    )


def _out_bw(view: TopologyView) -> dict[str, dict[str, float]]:
    """Per vertex, NCCL bandwidth summed over its outgoing links by kind (built once per view)."""
    def build(v: TopologyView) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for link in v.links:
            per_kind = out.setdefault(link.src, {})
            per_kind[link.kind] = per_kind.get(link.kind, 0.0) + link.model_bw
        return out

    return per_view("out_bw", view, build)


def _total_bw(view: TopologyView, rings: tuple[Ring, ...]) -> float:
    """Smallest over members of a GPU's NCCL bandwidth out of its NVLinks (else PCIe), GB/s."""
    vertex = {}
    for ring in rings:
        for hop in ring.hops:
            if hop.path:
                vertex.setdefault(hop.src, view.links[hop.path[0]].src)
    out = _out_bw(view)
    totals = [out[v].get("nvlink") or out[v].get("pcie", 0.0) for v in set(vertex.values())]
    return min(totals) / 1e9 if totals else 0.0
