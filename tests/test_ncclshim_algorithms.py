"""ncclshim.algorithms: the registry, every built-in entry on hand-checked cases, and a toy entry.

Times are NCCL's model by hand (``docs/nccl.md`` §2): ``time = lat + nBytes / (1000 * algBw)``
in us with algBw in GB/s. Graph facts used below (``tests/test_ncclshim_graph.py`` checks them):
DGX A100: 12 channels at 20 GB/s per node (8 x 24 across 2 nodes); DGX H100: NVLS heads 8 at
40 GB/s intra, 48 inter across 2 nodes; 4 H100 nodes with one GPU each: 2 channels at 24 GB/s.
"""

import dataclasses
from collections import defaultdict

import pytest

from heterosim.errors import UnsupportedCollectiveError
from ncclshim import plan
from ncclshim import algorithms
from ncclshim.algorithms import Algorithm
from ncclshim.constants import ALGOS, BASE_LAT_US, HW_LAT_US
from ncclshim.flows import template
from ncclshim.graph import analyze
from ncclshim.view import preset_view
from ncclshim.tuning import cost, parse_env

GiB, MiB = 1 << 30, 1 << 20
BUILTIN = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT", "COHERENT_RING")


def _sent(p):
    out = defaultdict(float)
    for f in p.flows:
        out[f.src] += f.bytes
    return dict(out)


def _coherent(view):
    """The same view with every node's fabric declaring coherent memory (seed 003)."""
    nodes = tuple(dataclasses.replace(n, fabric=dataclasses.replace(n.fabric, coherent=True)) for n in view.nodes)
    return dataclasses.replace(view, nodes=nodes)


def test_builtins_are_registered_in_nccl_order_then_extensions():
    """The scan order is NCCL's (nccl_tuner.h), then COHERENT_RING; every entry reads its own tables."""
    assert algorithms.names() == BUILTIN
    assert algorithms.names()[:len(ALGOS)] == ALGOS
    for entry in algorithms.entries():
        assert entry.tables in BASE_LAT_US and entry.tables in HW_LAT_US["NET"]
    assert algorithms.get("COHERENT_RING").tables == "RING"
    assert algorithms.spellings()["collnet"] == {"COLLNET_DIRECT", "COLLNET_CHAIN"}


def test_unknown_algorithm_is_one_error_listing_the_names():
    """get(), cost() and template() name the unknown algorithm and list the registered ones."""
    msg = ("unknown collective algorithm 'RINGG'; valid: TREE, RING, COLLNET_DIRECT, COLLNET_CHAIN, NVLS, "
           "NVLS_TREE, PAT, COHERENT_RING")
    with pytest.raises(UnsupportedCollectiveError) as e:
        algorithms.get("RINGG")
    assert str(e.value) == msg
    v = preset_view("dgx-a100")
    g = analyze((0, 1), v)
    with pytest.raises(UnsupportedCollectiveError, match="unknown collective algorithm 'RINGG'"):
        cost("all_reduce", "RINGG", "SIMPLE", g, parse_env(None))
    with pytest.raises(UnsupportedCollectiveError, match="unknown collective algorithm 'RINGG'"):
        template("all_reduce", "RINGG", g, v)
    with pytest.raises(UnsupportedCollectiveError, match="unknown collective algorithm 'RINGG'"):
        algorithms.unregister("RINGG")


def test_ring_two_ranks_all_reduce():
    """2 A100s: algBw = 12 ch x 20 GB/s x 2/2 = 240; lat = 8.4 + 2 x 3.4 us; each rank sends S."""
    p = plan("all_reduce", GiB, (0, 1), preset_view("dgx-a100"))
    assert (p.algo, p.proto, p.nchannels) == ("RING", "SIMPLE", 24)
    assert p.latency_s == pytest.approx(15.2e-6)
    assert p.time_s == pytest.approx((15.2 + GiB / (1000 * 240)) * 1e-6)
    assert _sent(p) == pytest.approx({0: GiB, 1: GiB})


def test_tree_two_nodes_all_reduce():
    """16 A100s, 1 MiB: Tree LL128 busBw min(min(192 x 0.92, 8 x 23.6) x 120/128, 8 x 20) = 160, algBw 80,
    x0.6 correction at log2(1 MiB / 64) = 14; lat = 14 + 2 x (7 x 1.25 + 1 x 8.5) us."""
    p = plan("all_reduce", MiB, range(16), preset_view("dgx-a100", 2))
    assert (p.algo, p.proto) == ("TREE", "LL128")
    assert p.latency_s == pytest.approx(48.5e-6)
    assert p.time_s == pytest.approx((48.5 + MiB / (1000 * 80 * 0.6)) * 1e-6)


def test_nvls_one_node_all_reduce():
    """8 H100s: NCCL's estimate 25 us + S / 272 GB/s (busBw 8 heads x min(40 x 0.85 x 7/8 x 2, 60)
    = 476, algBw x 8/14) chooses NVLS; the call runs as the measured 18.19 us + 9/8 of S per GPU link
    at 0.919 x 18 x 20.6 GB/s, plus a 2-loop pipeline fill per channel (16 channels, loops of 8 heads
    x 128 KiB at 1 GiB), plus 0.642 us per chunk step: 1 GiB / (16 x 1 MiB) = 64 loops of 8 steps.
    Every GPU sends 9/8 of S up through the switch (ld_reduce reads + its slice's multicast store)."""
    p = plan("all_reduce", GiB, range(8), preset_view("dgx-h100"))
    assert (p.algo, p.proto, p.nchannels) == ("NVLS", "SIMPLE", 16)
    assert p.latency_s == pytest.approx(18.19e-6)
    assert p.nccl_time_s == pytest.approx((25 + GiB / (1000 * 476 * 8 / 14)) * 1e-6)
    rate = 0.919 * 18 * 20.6
    stream = (GiB + 16 * 2 * 8 * 128 * 1024) * 9 / 8 / (1000 * rate)
    assert p.time_s == pytest.approx((18.19 + stream + 64 * 8 * 0.642) * 1e-6)
    assert _sent(p) == pytest.approx({r: GiB * 9 / 8 for r in range(8)})


def test_nvls_step_cost():
    """64 MiB runs in 64 KiB chunks: 8 loops of 8 x 64 KiB per channel (64 chunk steps), 2 of fill:
    18.19 + (64 + 16) MiB x 9/8 / (0.919 x 370.8 GB/s) + 64 x 0.642 = 336.2 us. Just below, 64 MiB
    - 64 KiB takes 32 KiB chunks: 16 loops of 256 KiB (64 steps more, half the fill bytes)."""
    from ncclshim.algorithms.sharp import nvls_stream

    assert nvls_stream(64 * MiB, 8, 16) == (80 * MiB * 9 / 8, 64)
    at = plan("all_reduce", 64 * MiB, range(8), preset_view("dgx-h100")).time_s * 1e6
    assert at == pytest.approx(18.19 + 80 * MiB * 9 / 8 / (1000 * 0.919 * 18 * 20.6) + 64 * 0.642)
    assert at == pytest.approx(336.2, abs=0.05)
    below = plan("all_reduce", 64 * MiB - 64 * 1024, range(8), preset_view("dgx-h100")).time_s * 1e6
    assert nvls_stream(64 * MiB - 64 * 1024, 8, 16) == ((72 * MiB - 64 * 1024) * 9 / 8, 128)
    assert below == pytest.approx(18.19 + (72 * MiB - 64 * 1024) * 9 / 8 / (1000 * 0.919 * 18 * 20.6) + 128 * 0.642)


def test_nvls_chunk_steps_follow_nccl():
    """calcCollChunking with 16 channels x 8 heads = 128 ops: 128 KiB from 1 GiB, 64 KiB from 64 MiB,
    32 KiB from 8 MiB, 16 KiB below."""
    from ncclshim.algorithms.sharp import nvls_chunk
    assert [nvls_chunk(s, 128) for s in (GiB, GiB - 1, 64 * MiB, 64 * MiB - 1, 8 * MiB, 8 * MiB - 1, 1)] == \
        [131072, 65536, 65536, 32768, 32768, 16384, 16384]


def test_nvls_tree_two_nodes_all_reduce():
    """16 H100s: per channel min(59.5, 2 x 48, cap 57.7) -> busBw 8 x 57.7, algBw x16/30;
    lat = 25 + 2 x log2(2) x 20.9 us."""
    p = plan("all_reduce", GiB, range(16), preset_view("dgx-h100", 2))
    assert (p.algo, p.proto) == ("NVLS_TREE", "SIMPLE")
    assert p.latency_s == pytest.approx(66.8e-6)
    assert p.time_s == pytest.approx((66.8 + GiB / (1000 * 8 * 57.7 * 16 / 30)) * 1e-6)


def test_pat_one_gpu_per_node_all_gather():
    """4 H100 nodes, one GPU each, 1 MiB: PAT busBw 2 x 24 x 0.75 = 36 = algBw; lat = 8 + log2(4) x 14 / 3.5
    + 4 x 2.8 = 27.2 us; beats the ring's LL (21.6 + S/27.2k) and Simple (50.4 + S/64k)."""
    p = plan("all_gather", MiB, (0, 8, 16, 24), preset_view("dgx-h100", 4))
    assert (p.algo, p.proto) == ("PAT", "SIMPLE")
    assert p.time_s == pytest.approx((27.2 + MiB / (1000 * 36)) * 1e-6)
    assert _sent(p) == pytest.approx({r: 0.75 * MiB for r in (0, 8, 16, 24)})


def test_collnet_direct_and_chain_two_nodes_all_reduce():
    """16 H100s with SHARP: Direct busBw 8 x 48 / (1 - 0) x 0.85, algBw half; lat 2 x (3.7 + 7 x 0.4) + 31.
    Chain busBw 8 x 48, algBw half; lat 2 x 7 x 2.8 + 30 us."""
    v = dataclasses.replace(preset_view("dgx-h100", 2), collnet=True)
    d = plan("all_reduce", GiB, range(16), v, env={"NCCL_ALGO": "CollNetDirect"})
    assert (d.algo, d.latency_s) == ("COLLNET_DIRECT", pytest.approx(44e-6))
    assert d.time_s == pytest.approx((44 + GiB / (1000 * 384 * 0.85 / 2)) * 1e-6)
    c = plan("all_reduce", GiB, range(16), v, env={"NCCL_ALGO": "CollNetChain"})
    assert (c.algo, c.latency_s) == ("COLLNET_CHAIN", pytest.approx(69.2e-6))
    assert c.time_s == pytest.approx((69.2 + GiB / (1000 * 192)) * 1e-6)
    off = parse_env({"NCCL_ALGO": "collnet"})  # the view without SHARP has no CollNet
    assert cost("all_reduce", "COLLNET_CHAIN", "SIMPLE", analyze(tuple(range(16)), v), off) == (0.0, 0.0)


def test_coherent_ring_one_node_all_reduce():
    """Coherent A100 node: n-1 = 7 steps, algBw 240 x 8/7; lat 8.4 + 7 x 3.4 us; (n-1)/n of S per rank."""
    p = plan("all_reduce", GiB, range(8), _coherent(preset_view("dgx-a100")))
    assert (p.algo, p.proto) == ("COHERENT_RING", "SIMPLE")
    assert p.time_s == pytest.approx((32.2 + GiB / (1000 * 240 * 8 / 7)) * 1e-6)
    assert _sent(p) == pytest.approx({r: 7 / 8 * GiB for r in range(8)})


# --- a new algorithm is one entry ---------------------------------------------------------------

def _direct_flows(coll, g, view, pxn, root):
    """Every rank sends its shard (1/n of the gathered buffer) straight to every other rank."""
    n = len(g.ranks)
    return [(a, b, 1 / n, 0, view.route(a, b, 0, pxn=pxn), 0) for a in g.ranks for b in g.ranks if a != b]


TOY = Algorithm(
    name="DIRECT", spellings=("direct",), protocols={"all_gather": ("SIMPLE",)}, tables="RING",
    available=lambda q: q.g.n_nodes == 1,  # one switch hop between any two ranks
    bandwidth=lambda q, proto: min(q.g.n_channels, q.s.max_channels) * q.g.bw_intra,  # no bus->alg factor
    latency=lambda q, proto: BASE_LAT_US["RING"][2] + HW_LAT_US["NVLINK"]["RING"][2],  # one step: 8.4 + 3.4
    flows=_direct_flows,
)


@pytest.fixture
def toy():
    algorithms.register(TOY)
    try:
        yield TOY
    finally:
        algorithms.unregister("DIRECT")


def test_a_registered_algorithm_is_planned_with_no_other_edit(toy):
    """DIRECT all_gather on an A100 node: algBw 12 x 20 = 240, lat 11.8 us. At 1 MiB it beats the
    ring (LL 10.8 + S/100.2k); at 64 B the LL ring (10.8 us) still wins; NCCL_ALGO reaches it."""
    assert algorithms.names()[-1] == "DIRECT"
    v = preset_view("dgx-a100")
    p = plan("all_gather", MiB, range(8), v)
    assert (p.algo, p.proto) == ("DIRECT", "SIMPLE")
    assert p.time_s == pytest.approx((11.8 + MiB / (1000 * 240)) * 1e-6)
    assert len(p.flows) == 56 and _sent(p) == pytest.approx({r: 7 / 8 * MiB for r in range(8)})
    assert plan("all_gather", 64, range(8), v).algo == "RING"
    assert plan("all_gather", 64, range(8), v, env={"NCCL_ALGO": "Direct"}).algo == "DIRECT"
    assert plan("all_gather", MiB, range(8), v, env={"NCCL_ALGO": "^direct"}).algo == "RING"
    assert plan("all_reduce", MiB, range(8), v).algo != "DIRECT"  # all_gather only
    with pytest.raises(UnsupportedCollectiveError, match="'DIRECT' is already registered"):
        algorithms.register(TOY)


def test_unregistering_restores_the_builtins():
    """Outside the fixture the toy is gone: its NCCL_ALGO token is unknown again."""
    assert algorithms.names() == BUILTIN
    with pytest.raises(UnsupportedCollectiveError, match="NCCL_ALGO='direct': unknown name 'direct'"):
        parse_env({"NCCL_ALGO": "direct"})


def test_register_checks_spellings_and_protocols():
    """Spellings must be lower case; protocols must be NCCL's."""
    with pytest.raises(UnsupportedCollectiveError, match="lower-case tokens"):
        algorithms.register(dataclasses.replace(TOY, spellings=("Direct",)))
    with pytest.raises(UnsupportedCollectiveError, match=r"unknown protocol\(s\) LL64; valid: LL, LL128, SIMPLE"):
        algorithms.register(dataclasses.replace(TOY, protocols={"all_gather": ("LL64",)}))
    assert algorithms.names() == BUILTIN
