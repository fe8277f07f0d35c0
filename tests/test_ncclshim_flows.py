"""ncclshim.flows: trees, schedules and the bytes every algorithm puts on each GPU (§1.4, §7)."""

from collections import defaultdict

import pytest

from ncclshim.flows import btree_parent, dtree_parents, p2p_schedule, template
from ncclshim.graph import analyze
from ncclshim.view import preset_view


def _sent(specs):
    out = defaultdict(float)
    for src, _, frac, *_ in specs:
        out[src] += frac
    return dict(out)


def test_binary_tree_matches_ncclGetBtree():
    """n=4: 0 is the root with child 2; 1 and 3 hang off 2. n=5: 0 -> 4 -> 2 -> {1, 3}."""
    assert [btree_parent(r, 4) for r in range(4)] == [-1, 2, 0, 2]
    assert [btree_parent(r, 5) for r in range(5)] == [-1, 2, 4, 2, 0]


def test_double_tree_leaves_and_interiors_swap():
    """With an even node count the mirror tree makes every leaf of tree 0 interior in tree 1."""
    t0, t1 = dtree_parents(8)
    leaves = [{r for r in range(8) if r not in set(t)} for t in (t0, t1)]
    assert leaves[0] == {1, 3, 5, 7} and leaves[1] == {0, 2, 4, 6}
    assert sorted(t1).count(-1) == 1 and t1.index(-1) == 7
    t0, t1 = dtree_parents(3)  # odd: shifted by one
    assert t0 == (-1, 2, 0) and t1 == (1, -1, 0)


def test_p2p_schedule_visits_every_peer_once():
    """NCCL's quadratic group schedule covers every non-zero delta exactly once."""
    for n, local in ((8, 8), (16, 8), (24, 8), (12, 4), (5, 1)):
        deltas = p2p_schedule(n, local)
        assert sorted(deltas) == list(range(1, n))
    assert p2p_schedule(16, 8)[:8] == (1, 2, 3, 4, 5, 6, 7, 8)


def test_ring_all_reduce_bytes_per_rank():
    """Each rank sends 2(n-1)/n of the buffer in a ring all-reduce: 1 for 2 ranks, 1.75 for 8."""
    v = preset_view("dgx-a100", nodes=2)
    for ranks in ((0, 1), tuple(range(8)), tuple(range(16))):
        g = analyze(ranks, v)
        n = len(ranks)
        sent = _sent(template("all_reduce", "RING", g, v))
        assert sent == pytest.approx({r: 2 * (n - 1) / n for r in ranks})


def test_ring_gather_and_coherent_ring_bytes():
    """all_gather, reduce_scatter and the coherent ring send (n-1)/n per rank."""
    v = preset_view("dgx-h100")
    g = analyze(tuple(range(8)), v)
    for coll, algo in (("all_gather", "RING"), ("reduce_scatter", "RING"), ("all_reduce", "COHERENT_RING")):
        assert _sent(template(coll, algo, g, v)) == pytest.approx({r: 7 / 8 for r in range(8)})


def test_broadcast_and_reduce_chains():
    """Broadcast: a chain from the root (root never receives); reduce: a chain into the root."""
    v = preset_view("dgx-a100")
    g = analyze(tuple(range(8)), v)
    b = template("broadcast", "RING", g, v, root=3)
    assert len(b) == 7 and all(dst != 3 for _, dst, *_ in b) and b[0][0] == 3
    r = template("reduce", "RING", g, v, root=3)
    assert len(r) == 7 and all(src != 3 for src, *_ in r) and r[-1][1] == 3
    assert sum(f for _, _, f, *_ in r) == pytest.approx(7)


def test_tree_moves_half_per_tree_each_way():
    """A one-node tree is a chain, used by two trees, each carrying S/2 up and S/2 down an edge:
    7 edges x 2 directions x 2 trees x 1/2 = 14 buffer-lengths in all."""
    v = preset_view("dgx-a100")
    g = analyze(tuple(range(8)), v)
    specs = template("all_reduce", "TREE", g, v)
    assert sum(f for _, _, f, *_ in specs) == pytest.approx(14.0)
    assert max(_sent(specs).values()) == pytest.approx(2.0)


def test_two_node_tree_crosses_the_network_once_per_tree():
    """2 nodes: each tree has one inter-node edge; a node's NICs carry S up + S down in total."""
    v = preset_view("dgx-a100", nodes=2)
    g = analyze(tuple(range(16)), v)
    specs = template("all_reduce", "TREE", g, v)
    out_of_node0 = sum(f for src, dst, f, *_ in specs if src < 8 <= dst)
    assert out_of_node0 == pytest.approx(1.0)


def test_nvls_loads_every_uplink_and_downlink_with_the_buffer():
    """NVLS: the switch reads every GPU's buffer for the heads' ld_reduce and multicasts each head's
    slice, so each of the 8 GPUs' links carries (8+1)/8 of S each way."""
    v = preset_view("dgx-h100")
    g = analyze(tuple(range(8)), v)
    load = defaultdict(float)
    for *_, frac, _, path, _ in template("all_reduce", "NVLS", g, v):
        for link in path:
            load[link] += frac
    assert len(load) == 16 and set(load.values()) == {9 / 8}


def test_pat_dimensions_sum_to_n_minus_one_over_n():
    """PAT over 4 nodes: dimension 0 sends 1/4, dimension 1 2/4, to r-1 and r-2 (all_gather)."""
    v = preset_view("dgx-h100", nodes=4)
    ranks = (0, 8, 16, 24)
    g = analyze(ranks, v)
    specs = template("all_gather", "PAT", g, v)
    assert {(s, d, f) for s, d, f, *_ in specs if s == 8} == {(8, 0, 0.25), (8, 24, 0.5)}
    assert _sent(specs) == pytest.approx({r: 0.75 for r in ranks})


def test_all_to_all_pairs():
    """all_to_all: n(n-1) flows of S/n, first round to rank+1."""
    v = preset_view("dgx-h100", nodes=2)
    g = analyze(tuple(range(16)), v)
    specs = template("all_to_all", "P2P", g, v)
    assert len(specs) == 16 * 15 and {f for _, _, f, *_ in specs} == {1 / 16}
    assert [(s, d) for s, d, *_ in specs[:2]] == [(0, 1), (1, 2)]


def test_pxn_disable_keeps_traffic_off_nvlink():
    """Without PXN, cross-node all_to_all flows never ride NVLink."""
    v = preset_view("dgx-h100", nodes=2)
    g = analyze(tuple(range(16)), v, pxn=False)
    specs = template("all_to_all", "P2P", g, v, pxn=False)
    cross = [p for s, d, _, _, p, _ in specs if (s < 8) != (d < 8)]
    assert cross and all(v.links[i].kind != "nvlink" for p in cross for i in p)
