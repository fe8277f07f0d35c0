"""Plans of one-node groups, translated from the first node of the same kind.

Inside one node a group's plan reads nothing but that node: its fabric, its GPUs (type, SM, PCIe
switch, CPU socket, NICs by position), its NICs (rail, rates, PCIe switch) and the links between
its own vertices (``n{k}.gpu3 -> n{k}.nvs``: kind, rates, latency). Two nodes equal in all of
these give equal plans up to renaming: the group of node ``n`` on local GPUs ``g1..gk`` has the
plan of the same local GPUs on the first node ``c`` of its kind, with every GPU index and link id
moved from ``c`` to ``n``. :class:`~ncclshim.planner.Planner` plans one-node groups on ``c`` once
and translates for the other nodes (``tests/test_ncclshim_translate.py`` checks the translated
plans equal to the ones planned directly, field by field). A plan whose paths leave the node (none
does today; a future algorithm might) is not translated: it is planned where it is.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ncclshim.topology import TopologyView

__all__ = ["NodeTranslator"]

_LOCAL = re.compile(r"^n(\d+)\.(.*)$")


class NodeTranslator:
    """The node kinds of one view and the link renaming between nodes of a kind (built lazily)."""

    def __init__(self, view: TopologyView) -> None:
        self.view = view
        self._links: dict[int, dict[tuple[str, str], int]] | None = None
        self._canon: dict[int, int] = {}
        self._first: dict[tuple, int] = {}
        self._maps: dict[tuple[int, int], dict[int, int]] = {}

    def _index(self) -> dict[int, dict[tuple[str, str], int]]:
        """Node -> its own links by (local source, local destination) name."""
        if self._links is None:
            links: dict[int, dict[tuple[str, str], int]] = {}
            for link in self.view.links:
                a, b = _LOCAL.match(link.src), _LOCAL.match(link.dst)
                if a and b and a.group(1) == b.group(1):
                    links.setdefault(int(a.group(1)), {})[(a.group(2), b.group(2))] = link.id
            self._links = links
        return self._links

    def _signature(self, node: int) -> tuple:
        v = self.view
        nd = v.nodes[node]
        nic_pos = {n: i for i, n in enumerate(nd.nics)}
        gpus = tuple((g.gpu_type, g.sm, g.pcie_switch, g.cpu_socket, tuple(nic_pos.get(n, -1) for n in g.nics))
                     for g in (v.gpus[i] for i in nd.gpus))
        nics = tuple((c.rail, c.bw, c.nccl_bw, c.pcie_switch) for c in (v.nics[i] for i in nd.nics))
        own = self._index().get(node, {})
        links = tuple(sorted((k, v.links[i].kind, v.links[i].bw, v.links[i].latency, v.links[i].nccl_bw)
                             for k, i in own.items()))
        return nd.fabric, gpus, nics, links

    def canonical(self, node: int) -> int:
        """The first node equal to ``node`` (itself when it is the first of its kind)."""
        canon = self._canon
        while len(canon) <= node:  # nodes are kinded in index order, so "first" is the lowest index
            n = len(canon)
            canon[n] = self._first.setdefault(self._signature(n), n)
        return canon[node]

    def source(self, ranks: tuple[int, ...]) -> tuple[int, tuple[int, ...]] | None:
        """``(node, the same local GPUs on its first node)`` when ``ranks`` lie on one node that is
        not the first of its kind; None otherwise."""
        gpus = self.view.gpus
        node = gpus[ranks[0]].node
        for r in ranks:
            if gpus[r].node != node:
                return None
        c = self.canonical(node)
        if c == node:
            return None
        base = self.view.nodes[c].gpus
        return node, tuple(base[gpus[r].local_index] for r in ranks)

    def _link_map(self, src: int, dst: int) -> dict[int, int]:
        m = self._maps.get((src, dst))
        if m is None:
            links = self._index()
            there = links.get(dst, {})
            m = self._maps[(src, dst)] = {i: there[k] for k, i in links.get(src, {}).items() if k in there}
        return m

    def translate(self, plan: Any, node: int, ranks: tuple[int, ...]) -> Any | None:
        """``plan`` (planned on ``node``'s first node of its kind) moved onto ``node`` for ``ranks``;
        None when one of its paths leaves that node."""
        c = self.canonical(node)
        lm = self._link_map(c, node)
        gpu_map = dict(zip(plan.ranks, ranks))
        try:
            flows = tuple([f._replace(src=gpu_map[f.src], dst=gpu_map[f.dst], path=tuple([lm[l] for l in f.path]))
                           for f in plan.flows])
            bottleneck = None if plan.bottleneck is None else lm[plan.bottleneck]
        except KeyError:
            return None
        return replace(plan, ranks=ranks, flows=flows, bottleneck=bottleneck)
