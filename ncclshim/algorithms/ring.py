"""Ring algorithms: NCCL's RING and HeteroSim's COHERENT_RING extension.

RING (``tuning.cc``, ``docs/nccl.md`` §1.4, §2.2-§2.4): busBw is channels x per-channel speed
(intra-node speed up to two nodes, inter-node beyond), capped for LL / LL128; algBw is busBw x
n / nsteps. Latency: one step latency per ring step, network steps at the NET latency; broadcast
and reduce pay one hop (one distinct ring) or one per rank. Multi-node Simple all-reduce latency
x1.4 (x1.9 on Volta). FP8 data on more than 8 ranks puts every ring last in NCCL's choice
(``tuning.select``).

COHERENT_RING (seed 003, HCSim; not NCCL's): an all-reduce for fabrics whose members share
cache-coherent memory: the reduce-scatter half of a ring suffices because the reduced chunks are
readable in place, so it takes n-1 steps instead of 2(n-1). It is priced as NCCL's ring with
``nsteps = n-1`` (Simple only: coherent loads and stores need no flag-per-line protocol) and
offered only when every member declares ``coherent``. NB: this ignores the cost of the remote
reads themselves, which the ring's bandwidth term stands in for.

Flows (§7): every hop of every distinct ring carries ``2(n-1)/n * S / R`` for all_reduce (R
rings), ``(n-1)/n * S / R`` for all_gather / reduce_scatter and the coherent ring; broadcast and
reduce run a chain from (to) the root, ``S / R`` per hop.
"""

from __future__ import annotations

from ncclshim.algorithms.entry import (
    Algorithm,
    FlowSpec,
    Query,
    hw_class,
    hw_latencies,
    ll_row,
    nccl_steps,
    scale,
    small_message_channels,
    support_rows,
)
from ncclshim.constants import (
    HW_LAT_US,
    LL_MAX_BW,
    NET_OVERHEAD_US,
    PER_CH_MAX_RING_LL128_BW,
    PROTOS,
    SUPPORT,
    THREAD_THRESHOLD,
)
from ncclshim.graph import GroupGraph
from ncclshim.topology import TopologyView

__all__ = ["RING", "COHERENT_RING", "ENTRIES", "ring_flows"]

_STEPPED = ("all_reduce", "all_gather", "reduce_scatter")


def _bus(q: Query, proto: str) -> float:
    """Ring busBw, GB/s: channels x speed, LL at half the wire and capped, LL128 x0.92 and capped."""
    g = q.g
    n_ch = min(g.n_channels, q.s.max_channels)
    bus = n_ch * (g.bw_intra if g.n_nodes <= 2 else g.bw_inter)
    if proto == "LL":
        bus = min(LL_MAX_BW[ll_row(g)][scale(g)], bus * 0.5)
    elif proto == "LL128":
        bus = min(bus * 0.92, n_ch * PER_CH_MAX_RING_LL128_BW[g.arch][scale(g)])
    return bus


def _latency(q: Query, proto: str, steps: int, net_steps: int) -> float:
    """Ring latency, us: ``steps`` ring steps of which ``net_steps`` cross the network (stepped
    collectives); broadcast / reduce: one hop when every channel follows one ring
    (``graph->sameChannels``), else one per rank, Tree's hop latency for Simple ("waiting for
    proper chunk modeling", tuning.cc). Their hop is NCCL's ``hw[a]``: the intra-node class on one
    node, NET on several (with the cluster's network latency excess)."""
    g = q.g
    lat, intra_lat, inter_lat = hw_latencies(q, "RING", proto)
    if q.coll in _STEPPED:
        overhead = NET_OVERHEAD_US[g.cpu_vendor] * (3 if proto == "SIMPLE" else 1) if g.n_nodes > 1 else 0.0
        intra_lat = max(intra_lat, overhead)
        lat += (steps - net_steps) * intra_lat + net_steps * inter_lat
        return lat
    hw, extra = (hw_class(g), g.lat_intra_us) if g.n_nodes == 1 else ("NET", g.lat_inter_us)
    row = "TREE" if proto == "SIMPLE" and len(g.rings) > 1 else "RING"
    hop = max(0.0, HW_LAT_US[hw][row][PROTOS.index(proto)] + extra)
    return lat + (hop if len(g.rings) == 1 else len(g.ranks) * hop)


def _ring_bandwidth(q: Query, proto: str) -> float:
    n = len(q.g.ranks)
    return _bus(q, proto) * n / nccl_steps(q.coll, n)


def _ring_latency(q: Query, proto: str) -> float:
    g = q.g
    nodes = g.n_nodes
    net_steps = (2 * (nodes - 1) if q.coll == "all_reduce" else nodes - 1) if nodes > 1 else 0
    return _latency(q, proto, nccl_steps(q.coll, len(g.ranks)), net_steps)


def _ring_time(q: Query, proto: str, nbytes: int, dtype: str, bw: float, lat: float) -> tuple[float, float]:
    """ncclTopoGetAlgoTime for the ring: multi-node Simple all-reduce latency x1.4 (x1.9 on Volta)
    once every rank-channel gets >= 64 B. (NCCL's fp8 x1024 only orders the choice: ``tuning.select``.)"""
    g = q.g
    n = len(g.ranks)
    if proto == "SIMPLE" and q.coll == "all_reduce" and g.n_nodes > 1 and nbytes / (g.runtime_channels * n) >= 64:
        lat *= 1.9 if g.arch == 0 else 1.4
    return lat + nbytes / (1000 * bw), lat


def _ring_channels(q: Query, proto: str, nbytes: int) -> int:
    """Small-message reduction; LL rings scale the per-thread threshold by the rank count (enqueue.cc)."""
    threshold = THREAD_THRESHOLD[proto] * (len(q.g.ranks) if proto == "LL" else 1)
    return small_message_channels(q, nbytes, 640 if proto == "LL128" else 512, threshold)


def ring_flows(g: GroupGraph, frac: float) -> list[FlowSpec]:
    """Every hop of every distinct ring carries ``frac / R`` of the buffer (R rings)."""
    r = len(g.rings)
    return [(h.src, h.dst, frac / r, c, h.path, 0) for c, ring in enumerate(g.rings) for h in ring.hops]


def _chain_from_root(g: GroupGraph, root: int) -> list[FlowSpec]:
    """Broadcast: each ring rotated to start at the root; the hop back into the root is unused."""
    out = []
    for c, ring in enumerate(g.rings):
        by_src = {h.src: h for h in ring.hops}
        order = list(ring.order)
        i = order.index(root)
        for a in (order[i:] + order[:i])[:-1]:
            h = by_src[a]
            out.append((h.src, h.dst, 1.0 / len(g.rings), c, h.path, 0))
    return out


def _reduce_chain(g: GroupGraph, view: TopologyView, root: int, pxn: bool) -> list[FlowSpec]:
    """Reduce: the ring order reversed so that the chain ends at the root."""
    out: list[FlowSpec] = []
    for c, ring in enumerate(g.rings):
        order = list(ring.order)
        i = order.index(root)
        order = order[i + 1:] + order[: i + 1]  # root last
        for a, b in zip(order, order[1:]):
            out.append((a, b, 1.0 / len(g.rings), c, view.route(a, b, 0, pxn=pxn), 0))
    return out


def _ring_template(coll: str, g: GroupGraph, view: TopologyView, pxn: bool, root: int,
                   channels: int | None = None) -> list[FlowSpec]:
    """The collective's ring flows; with ``channels``, only rings ``0..channels-1`` (same fractions)."""
    n = len(g.ranks)
    if coll == "all_reduce":
        out = ring_flows(g, 2 * (n - 1) / n)
    elif coll in ("all_gather", "reduce_scatter"):
        out = ring_flows(g, (n - 1) / n)
    elif coll == "broadcast":
        out = _chain_from_root(g, root)
    else:
        out = _reduce_chain(g, view, root, pxn)
    return out if channels is None else [sp for sp in out if sp[3] < channels]


RING = Algorithm(
    name="RING", spellings=("ring",), protocols=support_rows(SUPPORT, "RING"), tables="RING",
    bandwidth=_ring_bandwidth, latency=_ring_latency, time=_ring_time, channels=_ring_channels,
    flows=_ring_template,
)


def _coherent_available(q: Query) -> bool:
    """Every member's node declares cache-coherent shared memory (``NodeFabric.coherent``)."""
    return q.g.coherent


def _coherent_bandwidth(q: Query, proto: str) -> float:
    n = len(q.g.ranks)
    return _bus(q, proto) * n / (n - 1)


def _coherent_latency(q: Query, proto: str) -> float:
    """n-1 ring steps; the network is crossed once per node boundary (no all-gather pass)."""
    nodes = q.g.n_nodes
    return _latency(q, proto, len(q.g.ranks) - 1, nodes - 1 if nodes > 1 else 0)


def _coherent_template(coll: str, g: GroupGraph, view: TopologyView, pxn: bool, root: int) -> list[FlowSpec]:
    n = len(g.ranks)
    return ring_flows(g, (n - 1) / n)


COHERENT_RING = Algorithm(
    name="COHERENT_RING", spellings=("coherentring",), protocols={"all_reduce": ("SIMPLE",)}, tables="RING",
    available=_coherent_available, bandwidth=_coherent_bandwidth, latency=_coherent_latency,
    flows=_coherent_template,
)

ENTRIES: tuple[Algorithm, ...] = (RING, COHERENT_RING)
