"""Folding the network by a node shift: one node of each orbit stands for all of them.

A data-parallel job on a homogeneous cluster is symmetric: shift every pipeline stage's nodes by
one (data-parallel lane ``d`` -> ``d + k``, ``k`` the lanes a node holds) and every process group
maps onto a group of its kind, every rank onto a rank of its role. Every class-level transfer
(the replicas of one comm op, all started at once) is then mapped onto itself, and so is the
network's whole state: every flow has the rate and end time of its image.

The *fold* simulates the quotient network: each link stands for its orbit (its copies on the
shifted nodes) and the network carries only the flows whose source GPU is on a representative
node (the first node of each orbit), their links mapped onto the representative node's copies.
Each link of the quotient then carries exactly as many flows as each link of its orbit does in
the full network (flow ``f`` crossing copy ``i`` of link ``L`` stands for the flow of source node
``-i`` that crosses copy 0), so progressive filling computes each share with the same formula
(:mod:`replay.maxmin`); the order in which frozen rates are subtracted from a link may differ, so
rates may differ in the last bits. A replica lying wholly on other nodes is left out: its image on
the representative nodes ends when it does.

Conditions (checked; otherwise there is no fold and the network runs as it is): the shift maps
nodes onto nodes, groups onto groups, ranks onto ranks of the same role and GPU type; every link a
folded flow crosses has a node endpoint and an image (a leaf switch shared by the shifted nodes
maps to itself; links that can bind and join no node, e.g. an oversubscribed spine, prevent the
fold) and no folded flow crosses two copies of one link. A batch folds when its flows, all mapped
onto representative links, are ``m`` (the shift's order) copies of the ones kept, and every replica
has an image among those kept (:meth:`Fold.batch`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from .flows import FlowSpec, PhaseSpec, TransferSpec

__all__ = ["Fold", "FoldedBatch", "build_fold"]

_NODE = re.compile(r"^n(\d+)\.(.*)$")
_UNIT = re.compile(r"\.\d+$")


@dataclass(frozen=True, slots=True)
class FoldedBatch:
    """A class-level transfer on the quotient network: the specs of the replicas kept and, per
    kept replica, the ranks of every replica it stands for."""

    specs: tuple[TransferSpec, ...]
    replica_ranks: tuple[tuple[int, ...], ...]


class Fold:
    """The quotient by one node shift (see the module docstring)."""

    def __init__(self, order: int, rep_link: dict[int, int], rep_rank: Sequence[int],
                 rep_node: Sequence[bool], link_node: dict[int, int], rank_node: Sequence[int]):
        self.order = order
        """Nodes per orbit (the shift's order)."""
        self.rep_link = rep_link
        """Link -> its copy on the orbit's representative node (links with a node endpoint)."""
        self.rep_rank = rep_rank
        """Rank -> its image on the representative nodes."""
        self.rep_node = rep_node
        """Node -> whether it represents its orbit."""
        self.link_node = link_node
        """Link -> the node of its source endpoint (else of its destination)."""
        self.rank_node = rank_node
        """Rank -> its node."""

    def batch(self, specs: Sequence[TransferSpec], replica_ranks: Sequence[Sequence[int]]) -> FoldedBatch | None:
        """The folded batch, or None when the batch is not symmetric under the shift."""
        rep_link, link_node, rep_node, m = self.rep_link, self.link_node, self.rep_node, self.order
        kept_specs: list[TransferSpec] = []
        kept_keys: list[frozenset] = []
        all_flows: Counter = Counter()
        kept_flows: Counter = Counter()
        keys = [frozenset(self.rep_rank[r] for r in ranks) for ranks in replica_ranks]
        for spec, key, ranks in zip(specs, keys, replica_ranks):
            phases, any_kept, any_flow = [], False, False
            for pi, ph in enumerate(spec.phases):
                flows = []
                for f in ph.flows:
                    if f.nbytes <= 0 or not f.links:
                        continue
                    try:
                        links = tuple(rep_link[l] for l in f.links)
                    except KeyError:
                        return None  # a link without a node endpoint or without an image
                    item = (pi, ph.latency_s, links, f.nbytes, f.max_rate_Bps)
                    all_flows[item] += 1
                    any_flow = True
                    if rep_node[link_node[f.links[0]]]:
                        if len(set(links)) != len(links):
                            return None  # crosses two copies of one link: its share would count twice
                        flows.append(FlowSpec(links=links, nbytes=f.nbytes, max_rate_Bps=f.max_rate_Bps))
                        kept_flows[item] += 1
                        any_kept = True
                phases.append(PhaseSpec(latency_s=ph.latency_s, flows=tuple(flows)))
            # a replica moving no bytes stands for its orbit when its first rank is on a
            # representative node
            if any_kept or (not any_flow and rep_node[self.rank_node[ranks[0]]]):
                kept_specs.append(TransferSpec(phases=tuple(phases)))
                kept_keys.append(key)
        if not kept_specs or len(set(kept_keys)) != len(kept_keys) or set(keys) != set(kept_keys):
            return None
        if any(all_flows[k] != m * n for k, n in kept_flows.items()) or len(all_flows) != len(kept_flows):
            return None
        members: dict[frozenset, list[int]] = {k: [] for k in kept_keys}
        for ranks, key in zip(replica_ranks, keys):
            members[key].extend(ranks)
        return FoldedBatch(specs=tuple(kept_specs), replica_ranks=tuple(tuple(members[k]) for k in kept_keys))


def _shift(trace: Any, node: Sequence[int], gpu_type: Sequence[str]) -> list[int] | None:
    """The rank permutation that moves every data-parallel lane on by the lanes of one node, or
    None when the job has no such symmetry."""
    world = trace.world_size
    # The data-parallel groups proper: with context parallelism there are also DP x CP ones (the
    # optimizer's), larger; the shift must map those onto groups too (checked below).
    sizes = [len(g.ranks) for g in trace.groups.values() if g.dim == "dp" and len(g.ranks) > 1]
    if not sizes:
        return None
    dp = {tuple(g.ranks): None for g in trace.groups.values() if g.dim == "dp" and len(g.ranks) == min(sizes)}
    sigma = [-1] * world
    for g in dp:  # each rank set once (one data-parallel group may be created under several names)
        ranks = list(g)
        n = len(ranks)
        k = sum(1 for r in ranks if node[r] == node[ranks[0]])
        if n % k or n == k:
            return None
        for i, r in enumerate(ranks):
            if sigma[r] >= 0:
                return None  # in two data-parallel groups
            sigma[r] = ranks[(i + k) % n]
    if min(sigma) < 0:
        return None
    role = [0] * world
    for ro in trace.roles:
        for r in ro.ranks:
            role[r] = ro.id
    image_node: dict[int, int] = {}
    for r in range(world):
        s = sigma[r]
        if role[s] != role[r] or gpu_type[s] != gpu_type[r] or image_node.setdefault(node[r], node[s]) != node[s]:
            return None
    groups = {(g.dim, frozenset(g.ranks)) for g in trace.groups.values()}
    for g in trace.groups.values():
        if (g.dim, frozenset(sigma[r] for r in g.ranks)) not in groups:
            return None
    return sigma


def build_fold(trace: Any, cluster: Any, gpus: Sequence[int],
               never_binding: frozenset[int] = frozenset()) -> Fold | None:
    """The fold of ``trace`` placed on ``cluster`` (``gpus``: each rank's GPU), or None."""
    world = trace.world_size
    node = [int(cluster.gpu_node[g]) for g in gpus]
    gpu_type = [cluster.gpu_type(g) for g in gpus]
    sigma = _shift(trace, node, gpu_type)
    if sigma is None:
        return None
    pi: dict[int, int] = {}
    for r in range(world):
        pi[node[r]] = node[sigma[r]]
    # orbits of nodes
    rep_of: dict[int, tuple[int, int]] = {}  # node -> (representative, steps from it)
    order = 0
    for n0 in sorted(pi):
        if n0 in rep_of:
            continue
        n, i = n0, 0
        while n not in rep_of:
            rep_of[n] = (n0, i)
            n, i = pi[n], i + 1
        if n != n0:
            return None
        if order and i != order:
            return None  # orbits of different lengths
        order = i
    if order < 2:
        return None
    inv = {v: k for k, v in pi.items()}
    net = cluster.network
    names = net.vertices
    L = net.links
    cap = L.bw.tolist()

    def switch(name: str) -> str:
        # A switch outside the nodes, up to its scalable unit ("leaf3.0" and "leaf3.1" are the rail-3
        # leaves of two units): a NIC's link to its leaf has the leaf's counterpart in any unit, and
        # what lies beyond the leaf (leaf-spine links) must never bind, else no flow folds (below).
        return _UNIT.sub("", name)

    def norm(name: str) -> str:
        return name if _NODE.match(name) else switch(name)

    by_ends = {(norm(names[a]), norm(names[b])): i for i, (a, b) in enumerate(zip(L.src.tolist(), L.dst.tolist()))
               if _NODE.match(names[a]) or _NODE.match(names[b])}

    def back(name: str, steps: int) -> str | None:
        mt = _NODE.match(name)
        if mt is None:
            return switch(name)
        n = int(mt.group(1))
        if n not in inv:
            return None
        for _ in range(steps):
            n = inv[n]
        return f"n{n}.{mt.group(2)}"

    rep_link: dict[int, int] = {}
    link_node: dict[int, int] = {}
    for i, (a, b) in enumerate(zip(L.src.tolist(), L.dst.tolist())):
        if i in never_binding:
            continue
        sa, sb = names[a], names[b]
        ma, mb = _NODE.match(sa), _NODE.match(sb)
        home = int((ma or mb).group(1)) if (ma or mb) else None
        if home is None or home not in rep_of:
            continue
        steps = rep_of[home][1]
        ra, rb = back(sa, steps), back(sb, steps)
        j = by_ends.get((ra, rb)) if ra is not None and rb is not None else None
        if j is None or cap[j] != cap[i]:
            continue
        rep_link[i] = j
        link_node[i] = home
    inv_sigma = [0] * world
    for r, s in enumerate(sigma):
        inv_sigma[s] = r
    rep_rank = [0] * world
    for r in range(world):
        s = r
        for _ in range(rep_of[node[r]][1]):
            s = inv_sigma[s]
        rep_rank[r] = s
    rep_node = [False] * (max(pi) + 1)
    for n, (n0, _) in rep_of.items():
        rep_node[n] = n == n0
    return Fold(order, rep_link, rep_rank, rep_node, link_node, node)
