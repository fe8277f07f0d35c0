"""ncclshim.tuning: NCCL's bandwidth/latency table, call time and choice, hand-computed (§2)."""

import pytest

from heterosim.errors import UnsupportedCollectiveError
from ncclshim.graph import analyze
from ncclshim.view import preset_view
from ncclshim.tuning import cost, parse_env, select

S = parse_env(None)


def _g(preset, nodes=1):
    v = preset_view(preset, nodes=nodes)
    return analyze(tuple(range(len(v.gpus))), v)


def test_ring_costs_on_dgx_a100():
    """A100 node: ring Simple algBw = 240*8/14, latency 8.4 + 14*3.4 us; LL capped at 87.7 busBw."""
    g = _g("dgx-a100")
    assert cost("all_reduce", "RING", "SIMPLE", g, S) == pytest.approx((240 * 8 / 14, 8.4 + 14 * 3.4))
    assert cost("all_reduce", "RING", "LL", g, S) == pytest.approx((87.7 * 8 / 14, 6.6 + 14 * 0.6))
    assert cost("all_reduce", "RING", "LL128", g, S) == pytest.approx((220.8 * 8 / 14, 14.0 + 14 * 1.9))
    assert cost("all_gather", "RING", "SIMPLE", g, S) == pytest.approx((240 * 8 / 7, 8.4 + 7 * 3.4))
    assert cost("broadcast", "RING", "SIMPLE", g, S) == pytest.approx((240 * 8 / 8, 8.4 + 3.4))


def test_tree_costs_on_dgx_a100():
    """Tree Simple busBw = min(240*0.92, 12*24) -> algBw half of it; latency 8.4 + 2*7*4.0."""
    g = _g("dgx-a100")
    assert cost("all_reduce", "TREE", "SIMPLE", g, S) == pytest.approx((220.8 / 2, 8.4 + 2 * 7 * 4.0))
    assert cost("all_gather", "TREE", "SIMPLE", g, S) == (0.0, 0.0)


def test_nvls_cost_on_dgx_h100():
    """NVLS: 8 * min(40*0.85*7/8*2, 60) = 476 busBw, algBw 476*8/14 = 272, latency 25 us."""
    g = _g("dgx-h100")
    bw, lat = cost("all_reduce", "NVLS", "SIMPLE", g, S)
    assert bw == pytest.approx(476 * 8 / 14) and lat == pytest.approx(25.0)
    assert cost("all_reduce", "NVLS", "LL", g, S) == (0.0, 0.0)
    assert cost("all_reduce", "NVLS", "SIMPLE", _g("dgx-a100"), S) == (0.0, 0.0)


def test_multi_node_ring_latency_counts_network_steps():
    """2 DGX A100 (AMD, 16 ranks): ring Simple AR latency 8.4 + (30-2)*max(3.4, 2*3) + 2*14 us."""
    g = _g("dgx-a100", nodes=2)
    bw, lat = cost("all_reduce", "RING", "SIMPLE", g, S)
    assert bw == pytest.approx(8 * 24 * 16 / 30)
    assert lat == pytest.approx(8.4 + 28 * 6.0 + 2 * 14.0)


def test_selection_follows_nccl():
    """H100 node: small AR on LL/LL128 rings, large on NVLS; A100 node: large on Ring Simple;
    multi-node small and medium AR on Tree."""
    h = _g("dgx-h100")
    small = select("all_reduce", 4096, h, S)
    assert (small.algo, small.proto in ("LL", "LL128")) == ("RING", True)
    assert select("all_reduce", 1 << 30, h, S).algo == "NVLS"
    big = select("all_reduce", 1 << 30, _g("dgx-a100"), S)
    assert (big.algo, big.proto) == ("RING", "SIMPLE")
    for nodes in (2, 4):
        g = _g("dgx-a100", nodes)
        assert select("all_reduce", 64 << 10, g, S).algo == "TREE"
        assert select("all_reduce", 1 << 20, g, S).algo == "TREE"


def test_time_adds_latency_and_bytes_over_bandwidth():
    """time = lat + nBytes/(1000*bw) us; the Tree correction factor scales bw at 64 KiB (LL: 0.6)."""
    g = _g("dgx-a100")
    c = select("all_reduce", 1 << 30, g, S)
    assert c.time_s == pytest.approx((8.4 + 14 * 3.4 + (1 << 30) / (1000 * 240 * 8 / 14)) * 1e-6)
    only_tree_ll = parse_env({"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"})
    t = select("all_reduce", 64 << 10, g, only_tree_ll)
    bw = min(220.8 / 3.8, 87.7) / 2 * 0.6  # logSize = log2(65536/64) = 10 -> LL factor 0.6
    assert t.time_s == pytest.approx((6.8 + 2 * 7 * 0.6 + (64 << 10) / (1000 * bw)) * 1e-6)


def test_ring_simple_multi_node_latency_multiplier():
    """Multi-node ring Simple AR multiplies the latency by 1.4 (SM80+) once a rank-channel gets >= 64 B."""
    g = _g("dgx-a100", nodes=2)
    only = parse_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"})
    c = select("all_reduce", 1 << 30, g, only)
    assert c.latency_s == pytest.approx(1.4 * (8.4 + 28 * 6.0 + 2 * 14.0) * 1e-6)


def test_environment_overrides():
    """NCCL_ALGO / NCCL_PROTO restrict the scan, '^' excludes, NCCL_NVLS_ENABLE=0 drops NVLS."""
    h = _g("dgx-h100")
    assert select("all_reduce", 1 << 30, h, parse_env({"NCCL_ALGO": "Ring"})).algo == "RING"
    assert select("all_reduce", 1 << 30, h, parse_env({"NCCL_ALGO": "^NVLS,nvlstree"})).algo == "RING"
    assert select("all_reduce", 1 << 30, h, parse_env({"NCCL_NVLS_ENABLE": "0"})).algo == "RING"
    assert select("all_reduce", 4096, h, parse_env({"NCCL_PROTO": "Simple"})).proto == "SIMPLE"
    assert parse_env({"NCCL_ALGO": "collnet"}).algos == {"COLLNET_DIRECT", "COLLNET_CHAIN"}
    assert parse_env({"NCCL_PXN_DISABLE": "1"}).pxn is False
    capped = parse_env({"NCCL_MAX_NCHANNELS": "4"})
    assert select("all_reduce", 1 << 30, _g("dgx-a100"), capped).nchannels == 4


def test_bad_environment_is_named():
    """Unknown names and non-integers in NCCL variables are errors naming the variable."""
    with pytest.raises(UnsupportedCollectiveError, match="NCCL_ALGO='Rign': unknown name 'Rign'; valid names: "):
        parse_env({"NCCL_ALGO": "Rign"})
    with pytest.raises(UnsupportedCollectiveError, match="NCCL_MAX_NCHANNELS='many' is not an integer"):
        parse_env({"NCCL_MAX_NCHANNELS": "many"})


def test_forced_unavailable_algorithm_is_an_error():
    """Forcing NVLS on an A100 node leaves nothing to choose: one clear error."""
    with pytest.raises(UnsupportedCollectiveError, match="no NCCL algorithm/protocol is available for all_reduce "
                                                         "on 8 ranks over 1 node"):
        select("all_reduce", 1 << 20, _g("dgx-a100"), parse_env({"NCCL_ALGO": "NVLS"}))


def test_ll128_needs_nvlink():
    """LL128 is off on a PCIe-only server."""
    assert cost("all_reduce", "RING", "LL128", _g("l40s-pcie"), S) == (0.0, 0.0)


def test_fp8_ring_all_reduce_beyond_8_ranks_is_excluded():
    """FP8 ring all-reduce on more than 8 ranks competes at 1024x, so another algorithm wins."""
    g = _g("dgx-h100", nodes=2)
    ring = parse_env({"NCCL_ALGO": "Ring,Tree"})
    assert select("all_reduce", 1 << 30, g, ring, dtype="bf16").algo == "RING"
    assert select("all_reduce", 1 << 30, g, ring, dtype="fp8_e4m3").algo == "TREE"


def test_fp8_penalty_orders_the_choice_of_every_collective_but_not_its_time():
    """NCCL's x1024 applies to every ring collective (its code tests dtype and ranks, not the
    function); with the ring the only candidate it still runs, at its real time."""
    g = _g("dgx-h100", nodes=2)
    bf16 = select("all_gather", 1 << 30, g, S, dtype="bf16")
    fp8 = select("all_gather", 1 << 30, g, S, dtype="fp8")
    assert (fp8.algo, fp8.proto) == (bf16.algo, bf16.proto) == ("RING", "SIMPLE")
    assert fp8.time_s == bf16.time_s
    forced = parse_env({"NCCL_ALGO": "Ring"})
    assert select("all_reduce", 1 << 30, g, forced, dtype="fp8").time_s == \
        select("all_reduce", 1 << 30, g, forced, dtype="bf16").time_s


def test_fp8_on_eight_ranks_keeps_the_ring():
    """The partition needs more than 8 ranks: one DGX H100 node chooses alike for fp8 and bf16."""
    g = _g("dgx-h100")
    ring = parse_env({"NCCL_ALGO": "Ring,Tree"})
    assert select("all_reduce", 1 << 30, g, ring, dtype="fp8").algo == "RING"


def test_fp8_reduction_before_hopper_is_an_error():
    """NCCL refuses fp8 reductions below SM90; fp8 all_gather (no reduction) is fine on A100."""
    g = _g("dgx-a100", nodes=2)
    with pytest.raises(UnsupportedCollectiveError, match="reduce_scatter of fp8 data on Ampere GPUs: NCCL reduces "
                                                         "fp8 only on SM90"):
        select("reduce_scatter", 1 << 20, g, S, dtype="fp8")
    assert select("all_gather", 1 << 20, g, S, dtype="fp8").algo == "RING"


def test_small_messages_use_fewer_channels():
    """Channels drop while nBytes < nc * threads * threshold: 64 KiB LL ring on 8 ranks -> 2."""
    c = select("all_reduce", 64 << 10, _g("dgx-a100"), S)
    assert (c.algo, c.proto) == ("RING", "LL")
    assert c.nchannels == 2  # 65536 < nc * 512 * 8 * 8 for nc >= 3


def test_pat_for_one_gpu_per_node():
    """PAT is offered for all_gather only when every node holds one rank of the group."""
    v = preset_view("dgx-h100", nodes=4)
    one_per_node = analyze((0, 8, 16, 24), v)
    assert cost("all_gather", "PAT", "SIMPLE", one_per_node, S)[0] > 0
    assert cost("all_gather", "PAT", "SIMPLE", _g("dgx-h100", 2), S) == (0.0, 0.0)


def test_unknown_collective_for_the_cost_model():
    """select() lists the collectives with a cost model."""
    with pytest.raises(UnsupportedCollectiveError, match="'all_to_all' has no NCCL cost model; valid: broadcast"):
        select("all_to_all", 8, _g("dgx-a100"), S)


def test_collnet_needs_a_sharp_view_and_the_switch_on():
    """CollNet exists only on a view declaring it, and NCCL_COLLNET_ENABLE=0 turns it off."""
    g = _g("dgx-h100", 4)
    forced = parse_env({"NCCL_ALGO": "CollNetDirect"})
    assert cost("all_reduce", "COLLNET_DIRECT", "SIMPLE", g, forced)[0] == 0.0
    assert cost("all_reduce", "COLLNET_DIRECT", "SIMPLE", g, forced, collnet=True)[0] > 0
    off = parse_env({"NCCL_ALGO": "CollNetDirect", "NCCL_COLLNET_ENABLE": "0"})
    assert cost("all_reduce", "COLLNET_DIRECT", "SIMPLE", g, off, collnet=True) == (0.0, 0.0)
    assert cost("all_reduce", "COLLNET_DIRECT", "LL", g, forced, collnet=True) == (0.0, 0.0)


def test_broadcast_latency_depends_on_same_channels():
    """Broadcast on one node (one ring for all channels): + one NVLink hop latency; across nodes
    with a ring per rail: + nRanks hop latencies of NCCL's hw[a], which is NET on several nodes,
    Tree's for Simple (tuning.cc): NET TREE Simple 14 us, NET RING LL 2.7 us."""
    assert cost("broadcast", "RING", "SIMPLE", _g("dgx-a100"), S)[1] == pytest.approx(8.4 + 3.4)
    assert cost("broadcast", "RING", "SIMPLE", _g("dgx-a100", 2), S)[1] == pytest.approx(8.4 + 16 * 14.0)
    assert cost("reduce", "RING", "LL", _g("dgx-a100", 2), S)[1] == pytest.approx(6.6 + 16 * 2.7)
