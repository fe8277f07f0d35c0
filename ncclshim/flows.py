"""Point-to-point flows of every collective algorithm, as fractions of the collective's size.

A *flow template* is a tuple of :data:`FlowSpec` ``(src, dst, fraction, channel, path, phase)``:
``fraction * nbytes`` payload bytes move from GPU ``src`` to GPU ``dst`` over ``path`` (link ids).
Templates depend on the group and the algorithm, not on the size, so the planner builds one per
(collective, algorithm, group) and scales it.

Granularity (what the replay engine shares links between): NCCL pipelines every algorithm over
8-slot FIFOs, so each algorithm is ONE phase whose flows run together; one flow per distinct ring
or tree edge, aggregated over NCCL's runtime channels (duplicated channels follow the same paths,
``research/nccl.md`` §7) and over all pipeline steps. Bytes per GPU follow §1.4/§7:

- RING all_reduce: every hop of every distinct ring carries ``2(n-1)/n * S / R`` (R rings).
- RING all_gather / reduce_scatter / COHERENT_RING all_reduce: ``(n-1)/n * S / R`` per hop.
- RING broadcast / reduce: a chain from (to) the root, ``S / R`` per hop.
- TREE all_reduce: two mirrored binary trees over nodes (``trees.cc:ncclGetDtree``) plus an
  intra-node chain; each tree carries ``S/2`` up and ``S/2`` down every edge.
- NVLS: the switch reduces and multicasts; every GPU's uplink and downlink carry ``S`` (all_gather
  / reduce_scatter: ``(n-1)/n * S``, what the multicast delivers to each downlink). Written as
  flows GPU i -> GPU i+1 through the switch so that each link's load is exact (the flow's ``dst``
  is then the GPU whose downlink it loads, not a receiver of i's data).
- NVLS_TREE: NVLS inside nodes plus, per local head j, a double binary tree between the heads j of
  all nodes (same rail) carrying ``S / ppn / 2`` per tree per direction.
- PAT (one GPU per node): dimension ``i`` pairs ``r`` with ``r +- 2^i`` and carries ``2^i/n * S``
  (all dimensions sum to ``(n-1)/n * S``).
- COLLNET: every GPU heads 1/ppn of the data and exchanges ``S/ppn`` with the SHARP switch
  (written as rail-neighbour flows); Direct scatters/gathers inside the node all-to-all, Chain
  runs one chain per head (``S/ppn`` per edge and direction); Direct all_gather/reduce_scatter
  receive the other nodes' shards from the multicast and spread them over NVLink.
- all_to_all: every ordered pair, ``S/n``, listed in NCCL's ``ncclP2pSchedule`` order.
- send/recv: one flow of ``S``.
"""

from __future__ import annotations

from heterosim.errors import UnsupportedCollectiveError
from ncclshim.graph import GroupGraph, node_segment
from ncclshim.topology import TopologyView

__all__ = ["FlowSpec", "template", "btree_parent", "dtree_parents", "p2p_schedule"]

FlowSpec = tuple[int, int, float, int, tuple[int, ...], int]
"""(src GPU, dst GPU, fraction of nbytes, channel, path link ids, phase)."""


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


def p2p_schedule(n: int, local: int) -> tuple[int, ...]:
    """Send deltas of NCCL's grouped send/recv rounds (``init.cc:ncclP2pSchedule``).

    Ranks form groups of ``gcd(8, local)``; group deltas follow ``(x^2+x)/2 mod pow2Up(nGroups)``
    (values >= nGroups skipped), and inside a group local deltas run 0..size-1. Round ``k`` sends
    to ``rank + delta[k]``. Delta 0 (self) is dropped.
    """
    from math import gcd

    size = gcd(8, local) if n % gcd(8, local) == 0 else 1
    groups = n // size
    pow2 = 1
    while pow2 < groups:
        pow2 <<= 1
    out, seen = [], set()
    for x in range(pow2):
        gd = (x * x + x) // 2 % pow2
        if gd >= groups or gd in seen:
            continue
        seen.add(gd)
        for ld in range(size):
            d = (gd * size + ld) % n
            if d:
                out.append(d)
    return tuple(out)


def _chains(g: GroupGraph, view: TopologyView, pattern: int) -> list[list[int]]:
    if g.n_nodes == 1:
        return [list(g.node_members[0])]
    return [node_segment(m, pattern, view)[0] for m in g.node_members]


def _nic_channel(view: TopologyView, dst: int, pattern: int, g: GroupGraph) -> int:
    """Router channel that lands on the NIC the pattern's ring enters ``dst``'s node by."""
    members = next(m for m in g.node_members if dst in m)
    _, nic = node_segment(members, pattern, view)
    nics = view.gpus[dst].nics
    return nics.index(nic) if nic in nics else 0


def _ring(g: GroupGraph, frac: float) -> list[FlowSpec]:
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


def _tree(g: GroupGraph, view: TopologyView, pxn: bool) -> list[FlowSpec]:
    out: list[FlowSpec] = []
    patterns = len(g.rings)
    t_parents = dtree_parents(g.n_nodes)
    share = 0.5 / patterns  # each of the 2 trees x R patterns carries S / (2R) per direction
    for p in range(patterns):
        chains = _chains(g, view, p)
        for t, parents in enumerate(t_parents):
            ch = p + t * patterns
            for chain in chains:
                for a, b in zip(chain, chain[1:]):
                    out.append((b, a, share, ch, view.route(b, a, 0, pxn=pxn), 0))
                    out.append((a, b, share, ch, view.route(a, b, 0, pxn=pxn), 0))
            for k, par in enumerate(parents):
                if par < 0:
                    continue
                child, parent = chains[k][0], chains[par][0]
                out.append((child, parent, share, ch,
                            view.route(child, parent, _nic_channel(view, parent, p, g), pxn=pxn), 0))
                out.append((parent, child, share, ch,
                            view.route(parent, child, _nic_channel(view, child, p, g), pxn=pxn), 0))
    return out


def _nvls_intra(g: GroupGraph, view: TopologyView, frac: float = 1.0) -> list[FlowSpec]:
    out = []
    for members in g.node_members:
        m = len(members)
        for i, a in enumerate(members):
            b = members[(i + 1) % m]
            out.append((a, b, frac, 0, view.route(a, b, 0), 0))
    return out


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


def _pat(g: GroupGraph, view: TopologyView, coll: str, pxn: bool) -> list[FlowSpec]:
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


def _collnet(g: GroupGraph, view: TopologyView, algo: str, pxn: bool) -> list[FlowSpec]:
    out: list[FlowSpec] = []
    ppn = g.ppn
    for members in g.node_members:
        if algo == "COLLNET_DIRECT":
            for a in members:
                for b in members:
                    if a != b:  # scatter to head b, and head a's result gathered back to b
                        out.append((a, b, 2.0 / ppn, 0, view.route(a, b, 0, pxn=pxn), 0))
        else:  # one chain per channel, headed by a different GPU each, carrying S/ppn
            for j in range(len(members)):
                chain = members[j:] + members[:j]
                for a, b in zip(chain, chain[1:]):
                    out.append((b, a, 1.0 / len(members), j, view.route(b, a, 0, pxn=pxn), 0))
                    out.append((a, b, 1.0 / len(members), j, view.route(a, b, 0, pxn=pxn), 0))
    return out + _sharp_heads(g, view, ppn, pxn)


def _collnet_gather(g: GroupGraph, view: TopologyView, pxn: bool) -> list[FlowSpec]:
    """CollNet Direct all_gather / reduce_scatter: every GPU is a head for 1/ppn of the data.

    all_gather: each node's NICs receive the other nodes' ``(n-ppn)/n * S`` from the SHARP
    multicast (``(n-ppn)/(n*ppn) * S`` per head) and forward it over NVLink to the other local
    GPUs, which also exchange their own node's shards (``1/n * S`` per pair). reduce_scatter is
    the same traffic reversed; the loads per link are the same.
    """
    n, ppn = len(g.ranks), g.ppn
    remote = (n - ppn) / (n * ppn)
    out: list[FlowSpec] = []
    for members in g.node_members:
        for a in members:
            for b in members:
                if a != b:
                    out.append((a, b, remote + 1.0 / n, 0, view.route(a, b, 0, pxn=pxn), 0))
    return out + [(a, b, remote, c, path, ph) for a, b, _, c, path, ph in _sharp_heads(g, view, ppn, pxn)]


def _sharp_heads(g: GroupGraph, view: TopologyView, heads: int, pxn: bool) -> list[FlowSpec]:
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


def _all_to_all(g: GroupGraph, view: TopologyView, pxn: bool) -> list[FlowSpec]:
    n, ranks = len(g.ranks), g.ranks
    deltas = p2p_schedule(n, g.ppn)
    return [(ranks[r], ranks[(r + d) % n], 1.0 / n, 0, view.route(ranks[r], ranks[(r + d) % n], 0, pxn=pxn), 0)
            for d in deltas for r in range(n)]


def template(coll: str, algo: str, g: GroupGraph, view: TopologyView, *, pxn: bool = True,
             root: int = 0) -> tuple[FlowSpec, ...]:
    """Flow template of ``coll`` run with ``algo`` over the group ``g`` (``root``: GPU index)."""
    n = len(g.ranks)
    if coll == "all_to_all":
        return tuple(_all_to_all(g, view, pxn))
    if coll in ("send", "recv"):
        a, b = g.ranks
        return ((a, b, 1.0, 0, view.route(a, b, 0, pxn=pxn), 0),)
    if algo == "RING":
        if coll == "all_reduce":
            return tuple(_ring(g, 2 * (n - 1) / n))
        if coll in ("all_gather", "reduce_scatter"):
            return tuple(_ring(g, (n - 1) / n))
        if coll == "broadcast":
            return tuple(_chain_from_root(g, root))
        return tuple(_reduce_chain(g, view, root, pxn))
    if algo == "COHERENT_RING":
        return tuple(_ring(g, (n - 1) / n))
    if algo == "TREE":
        return tuple(_tree(g, view, pxn))
    if algo == "NVLS":
        if coll in ("all_gather", "reduce_scatter"):  # multicast in: each downlink gets the others' shards
            return tuple(_nvls_intra(g, view, (n - 1) / n))
        if g.n_nodes == 1:
            return tuple(_nvls_intra(g, view))
        # Multi-node NVLS needs CollNet: each head exchanges S/ppn with the SHARP switch.
        return tuple(_nvls_intra(g, view) + _sharp_heads(g, view, g.ppn, pxn))
    if algo == "NVLS_TREE":
        return tuple(_nvls_intra(g, view) + _heads_dtree(g, view, pxn, 0.5 / g.ppn))
    if algo == "PAT":
        return tuple(_pat(g, view, coll, pxn))
    if algo == "COLLNET_DIRECT" and coll in ("all_gather", "reduce_scatter"):
        return tuple(_collnet_gather(g, view, pxn))
    if algo.startswith("COLLNET"):
        return tuple(_collnet(g, view, algo, pxn))
    raise UnsupportedCollectiveError(f"no flow model for {coll} with {algo}")


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
