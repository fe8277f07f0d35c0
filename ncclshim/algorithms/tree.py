"""Tree algorithms: NCCL's double binary TREE and PAT (parallel aggregated trees), and NCCL's trees.

TREE (all_reduce only; ``tuning.cc``, ``docs/nccl.md`` §2.2-§2.4): busBw is channels x speed
x0.92 capped per channel; LL divides by 3.8, LL128 keeps 7/9 (one node) or 120/128; algBw is half
of busBw (a reduce up and a broadcast down). Latency: 2 x (ppn-1 intra steps + log2(nodes) network
steps). The call time scales the bandwidth by ``treeCorrectionFactor`` for sizes up to 256 MiB.

PAT (all_gather / reduce_scatter with one rank per node, Simple): busBw x0.75, no bus->alg
conversion; latency log2(nodes) network steps / 3.5 + 2.8 us per rank.

Flows (§7): TREE runs two mirrored binary trees over the nodes (``trees.cc:ncclGetDtree``) plus an
intra-node chain; each tree carries S/2 up and S/2 down every edge. PAT dimension ``i`` pairs
``r`` with ``r +- 2^i`` and carries ``2^i/n * S`` (all dimensions sum to ``(n-1)/n * S``).
NB: PAT's dimensions are one pipelined phase here; NCCL runs them as aggregated steps.
"""

from __future__ import annotations

from ncclshim.algorithms.entry import (
    Algorithm,
    FlowSpec,
    Query,
    hw_latencies,
    ll_row,
    log2i,
    scale,
    small_message_channels,
    support_rows,
    tree_corrected,
)
from ncclshim.constants import (
    LL_MAX_BW,
    PER_CH_MAX_TREE_BW,
    PER_CH_MAX_TREE_LL128_BW,
    SUPPORT,
    THREAD_THRESHOLD,
)
from ncclshim.graph import GroupGraph, node_segment
from ncclshim.topology import TopologyView

__all__ = ["TREE", "PAT", "ENTRIES", "btree_parent", "dtree_parents"]

_TREE_THREADS = 640
"""NCCL_MAX_NTHREADS of tree-shaped kernels (TREE, PAT), for the small-message channel reduction."""


def btree_parent(rank: int, n: int) -> int:
    """Parent of ``rank`` in NCCL's binary tree over ``n`` ranks (``trees.cc:ncclGetBtree``); -1 = root."""
    if rank == 0:
        return -1
    bit = rank & -rank
    up = (rank ^ bit) | (bit << 1)
    return rank ^ bit if up >= n else up


def dtree_parents(n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Parents in NCCL's double binary tree: tree 1 mirrors tree 0 (n even) or shifts it (n odd)."""
    t0 = tuple(btree_parent(r, n) for r in range(n))
    if n % 2 == 0:
        t1 = tuple(-1 if t0[n - 1 - r] < 0 else n - 1 - t0[n - 1 - r] for r in range(n))
    else:
        t1 = tuple(-1 if t0[(r - 1) % n] < 0 else (t0[(r - 1) % n] + 1) % n for r in range(n))
    return t0, t1


def _channels(q: Query, proto: str, nbytes: int) -> int:
    return small_message_channels(q, nbytes, _TREE_THREADS, THREAD_THRESHOLD[proto])


def _tree_bandwidth(q: Query, proto: str) -> float:
    g = q.g
    nodes, arch, sc = g.n_nodes, g.arch, scale(g)
    n_ch = min(g.n_channels, q.s.max_channels)
    bus = n_ch * (g.bw_intra if nodes <= 2 else g.bw_inter)
    bus = min(bus * 0.92, n_ch * PER_CH_MAX_TREE_BW[arch][sc])
    if proto == "LL":
        bus = min(bus / 3.8, LL_MAX_BW[ll_row(g)][sc])
    elif proto == "LL128":
        bus = min(bus * (7 / 9 if nodes == 1 else 120 / 128), n_ch * PER_CH_MAX_TREE_LL128_BW[arch][sc])
    return bus * 0.5


def _tree_latency(q: Query, proto: str) -> float:
    lat, intra_lat, inter_lat = hw_latencies(q, "TREE", proto)
    lat += 2 * ((q.g.ppn - 1) * intra_lat + log2i(q.g.n_nodes) * inter_lat)
    return lat


def _tree_time(q: Query, proto: str, nbytes: int, dtype: str, bw: float, lat: float) -> tuple[float, float]:
    """All-reduce bandwidth x ``treeCorrectionFactor`` for the first 23 sizes (64 B .. 256 MiB)."""
    if q.coll == "all_reduce":
        bw = tree_corrected(proto, nbytes, bw, 23)
    return lat + nbytes / (1000 * bw), lat


def _nic_index(view: TopologyView, dst: int, nic: int) -> int:
    """Router channel of ``dst`` that lands on ``nic`` (0 when ``nic`` is not one of its own)."""
    nics = view.gpus[dst].nics
    return nics.index(nic) if nic in nics else 0


def _tree_flows(coll: str, g: GroupGraph, view: TopologyView, pxn: bool, root: int,
                channels: int | None = None) -> list[FlowSpec]:
    """Both trees of every pattern; with ``channels``, only channels ``0..channels-1`` (pattern
    ``p`` of tree ``t`` is channel ``p + t R``), each flow keeping its fraction of the full set."""
    out: list[FlowSpec] = []
    patterns = len(g.rings)
    t_parents = dtree_parents(g.n_nodes)
    share = 0.5 / patterns  # each of the 2 trees x R patterns carries S / (2R) per direction
    last = 2 * patterns if channels is None else min(channels, 2 * patterns)
    for p in range(min(patterns, last)):
        # each node's chain in the pattern's ring and the NIC the ring enters the node by
        if g.n_nodes == 1:
            chains, entry_nic = [list(g.node_members[0])], []
        else:
            segs = [node_segment(m, p, view) for m in g.node_members]
            chains, entry_nic = [c for c, _ in segs], [nic for _, nic in segs]
        for t, parents in enumerate(t_parents):
            ch = p + t * patterns
            if ch >= last:
                continue
            for chain in chains:
                for a, b in zip(chain, chain[1:]):
                    out.append((b, a, share, ch, view.route(b, a, 0, pxn=pxn), 0))
                    out.append((a, b, share, ch, view.route(a, b, 0, pxn=pxn), 0))
            for k, par in enumerate(parents):
                if par < 0:
                    continue
                child, parent = chains[k][0], chains[par][0]  # chain k is node k's
                out.append((child, parent, share, ch,
                            view.route(child, parent, _nic_index(view, parent, entry_nic[par]), pxn=pxn), 0))
                out.append((parent, child, share, ch,
                            view.route(parent, child, _nic_index(view, child, entry_nic[k]), pxn=pxn), 0))
    return out


TREE = Algorithm(
    name="TREE", spellings=("tree",), protocols=support_rows(SUPPORT, "TREE"), tables="TREE",
    bandwidth=_tree_bandwidth, latency=_tree_latency, time=_tree_time, channels=_channels, flows=_tree_flows,
)


def _pat_available(q: Query) -> bool:
    """One rank per node, more than one node (tuning.cc: PAT needs ``nNodes == nRanks``)."""
    return q.g.n_nodes == len(q.g.ranks) and q.g.n_nodes > 1


def _pat_bandwidth(q: Query, proto: str) -> float:
    g = q.g
    n_ch = min(g.n_channels, q.s.max_channels)
    bus = n_ch * (g.bw_intra if g.n_nodes <= 2 else g.bw_inter)
    bus *= 0.75
    return bus


def _pat_latency(q: Query, proto: str) -> float:
    lat, _, inter_lat = hw_latencies(q, "PAT", proto)
    lat += log2i(q.g.n_nodes) * inter_lat / 3.5 + len(q.g.ranks) * 2.8
    return lat


def _pat_flows(coll: str, g: GroupGraph, view: TopologyView, pxn: bool, root: int) -> list[FlowSpec]:
    n, ranks = len(g.ranks), g.ranks
    out: list[FlowSpec] = []
    remaining, i = n - 1, 0
    while remaining > 0:
        blocks = min(1 << i, remaining)
        remaining -= blocks
        for r in range(n):
            peer = (r + (1 << i)) % n if coll == "reduce_scatter" else (r - (1 << i)) % n
            a, b = ranks[r], ranks[peer]
            out.append((a, b, blocks / n, i, view.route(a, b, 0, pxn=pxn), 0))
        i += 1
    return out


PAT = Algorithm(
    name="PAT", spellings=("pat",), protocols=support_rows(SUPPORT, "PAT"), tables="PAT",
    available=_pat_available, bandwidth=_pat_bandwidth, latency=_pat_latency, channels=_channels,
    flows=_pat_flows,
)

ENTRIES: tuple[Algorithm, ...] = (TREE, PAT)
