"""In-switch reduction (SHARP) algorithms: NVLS, NVLS_TREE (NVLink SHARP) and CollNet (network SHARP).

NVLS (``tuning.cc``, ``docs/nccl.md`` §2.2-§2.3): the NVSwitch reduces and multicasts.
Per-channel speed = min(NVLS intra speed x efficiency x (nCh-1)/nCh x (2 for all_reduce, else
(ppn-1)/ppn), inter speed); NVLS_TREE doubles the inter speed up to two nodes and is capped per
channel. All-reduce converts bus->alg like a ring; all_gather / reduce_scatter do not. NVLS needs
an NVSwitch with SHARP, two heads or more, and one node (several only with CollNet for
all_reduce); NVLS_TREE needs several nodes. Runtime channels: 16 on Hopper, 24 (one node) / 32
(several) on Blackwell (``enqueue.cc``).

CollNet (``NCCL_COLLNET_ENABLE`` and a view declaring ``collnet``, several nodes): Direct (needs an
NVSwitch node of at most 8 ranks) scatters to ppn heads inside the node, Chain chains them; both
exchange with the switch once per head. All-reduce algBw is half of busBw; Direct
all_gather / reduce_scatter reach ppn x min(intra, 0.9 x inter).

Flows (§7): NVLS all-reduce loads every GPU's uplink and downlink with ``(p+1)/p * S`` for p GPUs
of a node (the switch reads each GPU's whole buffer for the heads' ``multimem.ld_reduce`` and the
GPU's head slice goes up once more for ``multimem.st``; down, the slice's reduction and the
multicast of all p slices; nccl-tests#239), all_gather / reduce_scatter ``(n-1)/n * S`` (what the
multicast delivers), written as flows GPU i -> GPU i+1 through the switch
so that each link's load is exact (the flow's ``dst`` is the GPU whose downlink it loads, not a
receiver of i's data). NVLS_TREE adds, per local head j, a double binary tree between the heads j
of all nodes carrying ``S / ppn / 2`` per tree per direction. CollNet: every GPU heads 1/ppn of the
data and exchanges ``S/ppn`` with the SHARP switch, written as rail-neighbour flows. NB: these load
NIC links exactly but ignore the switch's internal reduction.
"""

from __future__ import annotations

import math

from ncclshim.algorithms.entry import (
    Algorithm,
    FlowSpec,
    Query,
    hw_latencies,
    log2i,
    nccl_steps,
    scale,
    small_message_channels,
    support_rows,
    tree_corrected,
)
from ncclshim.algorithms.tree import dtree_parents
from ncclshim.constants import (
    NVLS_CHUNK_SIZE,
    NVLS_CHUNK_STEPS,
    NVLS_EFFICIENCY,
    NVLS_PIPELINE_STAGES,
    NVLS_RUN_EFFICIENCY,
    NVLS_RUN_LATENCY_US,
    NVLS_STEP_US,
    PER_CH_MAX_NVLS_TREE_BW,
    SUPPORT,
)
from ncclshim.graph import GroupGraph
from ncclshim.topology import TopologyView

__all__ = ["NVLS", "NVLS_TREE", "COLLNET_DIRECT", "COLLNET_CHAIN", "ENTRIES", "sharp_heads", "nvls_chunk",
           "nvls_stream"]

_COLLNET_THREAD_THRESHOLD = 512
"""Bytes per thread below which NCCL drops a CollNet channel (``enqueue.cc``)."""


# --- NVLS, NVLS_TREE ---------------------------------------------------------------------------

def _nvls_usable(q: Query) -> bool:
    """NVLS is on (NCCL_NVLS_ENABLE) and the NVLS graph has 2 channels or more (the graph gives none
    without an NVSwitch with SHARP on SM90+; ``docs/nccl.md`` §1.1)."""
    return q.s.nvls and q.g.nvls_channels >= 2


def _nvls_available(q: Query) -> bool:
    """One node; across nodes only with CollNet (SHARP), and only all-reduce here. NB: NCCL also
    allows multi-node all_gather / reduce_scatter with CollNet's iallgather (§2.2); not modelled."""
    return _nvls_usable(q) and (q.g.n_nodes == 1 or (q.collnet and q.coll == "all_reduce"))


def _nvls_tree_available(q: Query) -> bool:
    """Several nodes (NCCL disables NVLS_TREE on one node, ``docs/nccl.md`` §1.1)."""
    return _nvls_usable(q) and q.g.n_nodes > 1


def _nvls_bus(q: Query, tree: bool) -> float:
    """NVLS busBw, GB/s: heads x min(switch speed x efficiency, network speed[, NVLS_TREE cap]) (§2.2)."""
    g = q.g
    arch, ppn = g.arch, g.ppn
    n_ch = min(g.nvls_channels, q.s.max_channels)
    intra = g.nvls_bw_intra * NVLS_EFFICIENCY[arch] * (n_ch - 1) / n_ch
    intra *= 2 if q.coll == "all_reduce" else (ppn - 1) / ppn
    inter = g.nvls_bw_inter * (2 if tree and g.n_nodes <= 2 else 1)
    return n_ch * min(intra, inter, PER_CH_MAX_NVLS_TREE_BW[arch][scale(g)] if tree else math.inf)


def _nvls_bandwidth(q: Query, proto: str) -> float:
    bus = _nvls_bus(q, tree=False)
    if q.coll in ("all_gather", "reduce_scatter"):
        return bus
    n = len(q.g.ranks)
    return bus * n / nccl_steps(q.coll, n)


def _nvls_latency(q: Query, proto: str) -> float:
    """The switch's latency, plus the network's across nodes; no base latency (tuning.cc)."""
    _, intra_lat, inter_lat = hw_latencies(q, "NVLS", proto)
    return intra_lat + (inter_lat if q.g.n_nodes > 1 else 0.0)


def _nvls_channels(q: Query, proto: str, nbytes: int) -> int:
    nc = 16 if q.g.arch == 2 else (24 if q.g.n_nodes == 1 else 32)
    return max(1, min(nc, q.s.max_channels))


def nvls_chunk(nbytes: int, ops: int) -> int:
    """NCCL's NVLS chunk for ``nbytes`` over ``ops`` = channels x heads (``calcCollChunking``)."""
    chunk = NVLS_CHUNK_SIZE
    for factor, smaller in NVLS_CHUNK_STEPS:
        if nbytes < factor * ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def nvls_stream(nbytes: int, heads: int, n_ch: int) -> tuple[float, int]:
    """A one-node NVLS all-reduce of ``nbytes`` by ``n_ch`` channels of ``heads`` heads: the bytes
    each GPU's NVLink carries per direction, pipeline fill included, and the chunk steps each
    channel runs, ``heads`` a loop (see :func:`_nvls_run_time`)."""
    loop = heads * nvls_chunk(nbytes, n_ch * heads)
    fill = (NVLS_PIPELINE_STAGES - 1) * min(loop, nbytes / n_ch)
    return (nbytes + n_ch * fill) * (heads + 1) / heads, heads * math.ceil(nbytes / (n_ch * loop))


def _nvls_run_time(q: Query, proto: str, nbytes: int, lat: float) -> tuple[float, float] | None:
    """One-node NVLS all-reduce as it runs, us: (latency + a pipelined stream of loops, latency).

    - Latency: the measured run-time latency of the architecture (:data:`NVLS_RUN_LATENCY_US`) plus
      what the cluster's cables add beyond the default (``GroupGraph.lat_intra_us``, as
      :func:`~ncclshim.algorithms.entry.hw_latencies` adds it to NCCL's); NCCL's ``lat`` where none
      was measured.
    - Traffic: per loop a head reduces its chunk out of all n GPUs (``multimem.ld_reduce``) and
      multicasts it back (``multimem.st``), and GPUs scatter into / gather out of the NVLS buffers,
      so each GPU's NVLink carries ``(n+1)/n`` of the buffer per direction (S. Jeaugey,
      nccl-tests#239: "algobw = busbw * n / (n+1)", busbw there being the link's rate).
    - Rate: NCCL's NVLink bandwidth of the GPU (``GroupGraph.gpu_bw``, 18 x 20.6 GB/s on H100) times
      the measured streaming efficiency (:data:`NVLS_RUN_EFFICIENCY`), shared by the NVLS channels.
    - Ramp: each channel moves its share in loops of ``heads x chunk`` (NCCL's chunk steps,
      :func:`nvls_chunk`) through ``NVLS_PIPELINE_STAGES`` warp groups; the first loop fills the
      pipeline, so ``stages - 1`` loops' worth is added per channel; and each chunk step (``heads``
      a loop) pays a fixed handshake (:data:`NVLS_STEP_US`), which is why small chunks stream slower.

    NB: ignores the NVSwitch's reduction latency beyond the measured latency, the HBM traffic of the
    copies, and SM limits: the channels are taken to saturate the links even when
    NCCL_MAX_NCHANNELS leaves few CTAs. Other NVLS uses keep NCCL's estimate (None).
    """
    g = q.g
    if q.coll != "all_reduce" or g.n_nodes != 1 or g.gpu_bw <= 0:
        return None
    run_lat = NVLS_RUN_LATENCY_US[g.arch]
    if run_lat is not None:
        lat = max(0.0, run_lat + g.lat_intra_us)
    heads = g.nvls_channels  # one head per local GPU (NCCL_MAX_NCHANNELS caps the CTAs, not the heads)
    link_bytes, steps = nvls_stream(nbytes, heads, _nvls_channels(q, proto, nbytes))
    return lat + link_bytes / (1000 * NVLS_RUN_EFFICIENCY[g.arch] * g.gpu_bw) + steps * NVLS_STEP_US[g.arch], lat


def _nvls_intra(g: GroupGraph, view: TopologyView, frac: float = 1.0) -> list[FlowSpec]:
    out = []
    for members in g.node_members:
        m = len(members)
        for i, a in enumerate(members):
            b = members[(i + 1) % m]
            out.append((a, b, frac, 0, view.route(a, b, 0), 0))
    return out


def _nvls_flows(coll: str, g: GroupGraph, view: TopologyView, pxn: bool, root: int) -> list[FlowSpec]:
    n = len(g.ranks)
    if coll in ("all_gather", "reduce_scatter"):  # multicast in: each downlink gets the others' shards
        return _nvls_intra(g, view, (n - 1) / n)
    if g.n_nodes == 1:
        return _nvls_intra(g, view, (g.ppn + 1) / g.ppn)
    # Multi-node NVLS needs CollNet: each head exchanges S/ppn with the SHARP switch.
    return _nvls_intra(g, view, (g.ppn + 1) / g.ppn) + sharp_heads(g, view, g.ppn, pxn)


NVLS = Algorithm(
    name="NVLS", spellings=("nvls",), protocols=support_rows(SUPPORT, "NVLS"), tables="NVLS",
    available=_nvls_available,
    bandwidth=_nvls_bandwidth, latency=_nvls_latency, channels=_nvls_channels, flows=_nvls_flows,
    run_time=_nvls_run_time,
)


def _nvls_tree_bandwidth(q: Query, proto: str) -> float:
    n = len(q.g.ranks)
    return _nvls_bus(q, tree=True) * n / nccl_steps(q.coll, n)


def _nvls_tree_latency(q: Query, proto: str) -> float:
    lat, intra_lat, inter_lat = hw_latencies(q, "NVLS_TREE", proto)
    lat += intra_lat + 2 * log2i(q.g.n_nodes) * inter_lat
    return lat


def _nvls_tree_time(q: Query, proto: str, nbytes: int, dtype: str, bw: float, lat: float) -> tuple[float, float]:
    """Blackwell and later: all-reduce bandwidth x ``treeCorrectionFactor`` for the first 24 sizes."""
    if q.coll == "all_reduce" and q.g.arch >= 3:
        bw = tree_corrected(proto, nbytes, bw, 24)
    return lat + nbytes / (1000 * bw), lat


def _nvls_tree_flows(coll: str, g: GroupGraph, view: TopologyView, pxn: bool, root: int) -> list[FlowSpec]:
    return _nvls_intra(g, view, (g.ppn + 1) / g.ppn) + _heads_dtree(g, view, pxn, 0.5 / g.ppn)


def _heads_dtree(g: GroupGraph, view: TopologyView, pxn: bool, share: float) -> list[FlowSpec]:
    out: list[FlowSpec] = []
    parents2 = dtree_parents(g.n_nodes)
    for j in range(g.ppn):
        heads = [m[j % len(m)] for m in g.node_members]
        for t, parents in enumerate(parents2):
            for k, par in enumerate(parents):
                if par < 0:
                    continue
                a, b = heads[k], heads[par]
                out.append((a, b, share, j + t * g.ppn, view.route(a, b, 0, pxn=pxn), 0))
                out.append((b, a, share, j + t * g.ppn, view.route(b, a, 0, pxn=pxn), 0))
    return out


NVLS_TREE = Algorithm(
    name="NVLS_TREE", spellings=("nvlstree",), protocols=support_rows(SUPPORT, "NVLS_TREE"), tables="NVLS_TREE",
    available=_nvls_tree_available, bandwidth=_nvls_tree_bandwidth, latency=_nvls_tree_latency,
    time=_nvls_tree_time, channels=_nvls_channels, flows=_nvls_tree_flows,
)


# --- CollNet -----------------------------------------------------------------------------------

def _direct_available(q: Query) -> bool:
    """CollNet on, several nodes, NVSwitch nodes of at most 8 local ranks (``NCCL_MAX_DIRECT_ARITY`` + 1;
    ``docs/nccl.md`` §1.1)."""
    return q.collnet and q.g.n_nodes > 1 and q.nvswitch and q.g.ppn <= 8


def _chain_available(q: Query) -> bool:
    """CollNet on (plugin and ``collnetEnable``) and several nodes (``docs/nccl.md`` §1.1)."""
    return q.collnet and q.g.n_nodes > 1


def _collnet_channels(q: Query, proto: str, nbytes: int) -> int:
    return small_message_channels(q, nbytes, 640 if proto == "LL128" else 512, _COLLNET_THREAD_THRESHOLD)


def sharp_heads(g: GroupGraph, view: TopologyView, heads: int, pxn: bool) -> list[FlowSpec]:
    """Each of ``heads`` heads per node sends ``S/heads`` up to the SHARP switch and receives the
    result: written as a flow to the same-rail head of the next node, which loads exactly one
    NIC uplink and one NIC downlink per head."""
    out: list[FlowSpec] = []
    nodes = g.node_members
    for j in range(heads):
        for k, members in enumerate(nodes):
            nxt = nodes[(k + 1) % len(nodes)]
            a, b = members[j % len(members)], nxt[j % len(nxt)]
            out.append((a, b, 1.0 / heads, j, view.route(a, b, 0, pxn=pxn), 0))
    return out


def _direct_bandwidth(q: Query, proto: str) -> float:
    g = q.g
    n_ch = min(g.n_channels, q.s.max_channels)
    bus = n_ch * g.bw_intra
    if q.coll in ("all_gather", "reduce_scatter"):
        bus = g.ppn * min(g.bw_intra, 0.9 * g.bw_inter)
    else:
        f = g.ppn / n_ch
        bus /= f - (f - 1) / 2
        bus *= 0.85 if g.arch >= 2 else 1.0
    return bus * 0.5 if q.coll == "all_reduce" else bus


def _direct_latency(q: Query, proto: str) -> float:
    lat, intra_lat, inter_lat = hw_latencies(q, "COLLNET_DIRECT", proto)
    ppn = q.g.ppn
    lat += 2 * (min(1, ppn - 1) * intra_lat + (ppn - 1) * 0.4) + inter_lat
    return lat


def _direct_flows(coll: str, g: GroupGraph, view: TopologyView, pxn: bool, root: int) -> list[FlowSpec]:
    """all_reduce: all-to-all scatter to the heads and gather back; all_gather / reduce_scatter:
    each node's NICs receive the other nodes' ``(n-ppn)/n * S`` from the SHARP multicast
    (``(n-ppn)/(n*ppn) * S`` per head) and forward it over NVLink to the other local GPUs, which
    also exchange their own node's shards (``1/n * S`` per pair); reduce_scatter is the same
    traffic reversed, so the loads per link are the same."""
    ppn = g.ppn
    out: list[FlowSpec] = []
    if coll in ("all_gather", "reduce_scatter"):
        n = len(g.ranks)
        remote = (n - ppn) / (n * ppn)
        for members in g.node_members:
            for a in members:
                for b in members:
                    if a != b:
                        out.append((a, b, remote + 1.0 / n, 0, view.route(a, b, 0, pxn=pxn), 0))
        return out + [(a, b, remote, c, path, ph) for a, b, _, c, path, ph in sharp_heads(g, view, ppn, pxn)]
    for members in g.node_members:
        for a in members:
            for b in members:
                if a != b:  # scatter to head b, and head a's result gathered back to b
                    out.append((a, b, 2.0 / ppn, 0, view.route(a, b, 0, pxn=pxn), 0))
    return out + sharp_heads(g, view, ppn, pxn)


COLLNET_DIRECT = Algorithm(
    name="COLLNET_DIRECT", spellings=("collnetdirect", "collnet"), protocols=support_rows(SUPPORT, "COLLNET_DIRECT"),
    tables="COLLNET_DIRECT",
    available=_direct_available,
    bandwidth=_direct_bandwidth, latency=_direct_latency, channels=_collnet_channels, flows=_direct_flows,
)


def _chain_bandwidth(q: Query, proto: str) -> float:
    g = q.g
    bus = min(g.n_channels, q.s.max_channels) * g.bw_intra
    return bus * 0.5 if q.coll == "all_reduce" else bus


def _chain_latency(q: Query, proto: str) -> float:
    lat, intra_lat, inter_lat = hw_latencies(q, "COLLNET_CHAIN", proto)
    lat += 2 * (q.g.ppn - 1) * intra_lat + inter_lat
    return lat


def _chain_flows(coll: str, g: GroupGraph, view: TopologyView, pxn: bool, root: int) -> list[FlowSpec]:
    """One chain per channel, headed by a different GPU each, carrying S/ppn per edge and direction."""
    out: list[FlowSpec] = []
    for members in g.node_members:
        for j in range(len(members)):
            chain = members[j:] + members[:j]
            for a, b in zip(chain, chain[1:]):
                out.append((b, a, 1.0 / len(members), j, view.route(b, a, 0, pxn=pxn), 0))
                out.append((a, b, 1.0 / len(members), j, view.route(a, b, 0, pxn=pxn), 0))
    return out + sharp_heads(g, view, g.ppn, pxn)


COLLNET_CHAIN = Algorithm(
    name="COLLNET_CHAIN", spellings=("collnetchain", "collnet"), protocols=support_rows(SUPPORT, "COLLNET_CHAIN"),
    tables="COLLNET_CHAIN", available=_chain_available,
    bandwidth=_chain_bandwidth, latency=_chain_latency, channels=_collnet_channels, flows=_chain_flows,
)

ENTRIES: tuple[Algorithm, ...] = (NVLS, NVLS_TREE, COLLNET_DIRECT, COLLNET_CHAIN)
