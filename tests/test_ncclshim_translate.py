"""ncclshim.translate: one-node groups planned on the first node of their kind and moved over equal
the plans made where they are, field by field."""

import pytest

from ncclshim import Planner
from ncclshim.translate import NodeTranslator
from ncclshim.view import preset_view

_MB = 1 << 20
CASES = [("all_reduce", 4), ("all_reduce", 8 * _MB), ("all_reduce", 1 << 30), ("all_gather", 64 * _MB),
         ("reduce_scatter", 8 * _MB), ("broadcast", 2 * _MB), ("all_to_all", 8 * _MB), ("send", 4 * _MB)]


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100", "hgx-h20", "l40s-pcie"])
@pytest.mark.parametrize("coll,nbytes", CASES)
def test_translated_plans_equal_direct_ones(preset, coll, nbytes):
    view = preset_view(preset, nodes=3)
    fast, direct = Planner(view), Planner(view, translate=False)
    per = len(view.nodes[0].gpus)
    node2 = view.nodes[2].gpus
    groups = [node2[:2], node2[1::2] if per >= 4 else node2, node2] if coll != "send" else [node2[:2], node2[-1:0:-1][:2]]
    for local in groups:
        ranks = tuple(local)
        if len(ranks) < 2 or (coll == "send" and len(ranks) != 2):
            continue
        for dtype in ("bf16",):
            if nbytes % (len(ranks) * 2):
                continue
            got = fast.plan(coll, nbytes, ranks, dtype=dtype)
            want = direct.plan(coll, nbytes, ranks, dtype=dtype)
            assert got == want, (coll, nbytes, ranks)
    assert fast._translator.canonical(2) == 0


def test_node_kinds_and_link_renaming():
    view = preset_view("dgx-a100", nodes=3)
    t = NodeTranslator(view)
    assert [t.canonical(n) for n in range(3)] == [0, 0, 0]
    assert t.source(tuple(view.nodes[0].gpus[:4])) is None  # the first node plans for itself
    assert t.source((view.nodes[1].gpus[0], view.nodes[2].gpus[0])) is None  # two nodes: not one-node
    node, canon = t.source((view.nodes[2].gpus[3], view.nodes[2].gpus[5]))
    assert (node, canon) == (2, (3, 5))
    m = t._link_map(0, 2)
    for a, b in m.items():  # every node-0 link has its node-2 copy, same ends but the node
        la, lb = view.links[a], view.links[b]
        assert (la.src.replace("n0.", "n2.", 1), la.dst.replace("n0.", "n2.", 1)) == (lb.src, lb.dst)
        assert (la.kind, la.bw, la.latency) == (lb.kind, lb.bw, lb.latency)
    assert len(m) == sum(1 for l in view.links if l.src.startswith("n0.") and l.dst.startswith("n0."))


def test_nodes_of_another_kind_plan_for_themselves():
    view = preset_view("mixed-a100-h100", nodes=2)
    t = NodeTranslator(view)
    kinds = {}
    for n, nd in enumerate(view.nodes):
        kinds.setdefault(view.gpus[nd.gpus[0]].gpu_type, []).append(t.canonical(n))
    for canon in kinds.values():
        assert len(set(canon)) == 1  # one first node per GPU type
    assert len({c[0] for c in kinds.values()}) == len(kinds)  # and a different one for each type
