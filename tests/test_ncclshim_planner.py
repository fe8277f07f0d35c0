"""ncclshim.planner: plan(), its time semantics against a fluid replay, caches, errors, validation."""

from collections import defaultdict

import pytest

from heterosim.errors import UnsupportedCollectiveError
from ncclshim import Planner, busbw_factor, is_trivial, plan
from heterosim.cluster import load_cluster, preset_path, read_spec
from ncclshim.view import preset_view, topology_view

PRESETS = ("dgx-a100", "dgx-h100", "hgx-h20", "l40s-pcie")

A100 = preset_view("dgx-a100")
A100x2 = preset_view("dgx-a100", nodes=2)
A100x4 = preset_view("dgx-a100", nodes=4)
H100 = preset_view("dgx-h100")
H100x2 = preset_view("dgx-h100", nodes=2)


def fluid_replay(p, view):
    """Run a plan's flows alone: phases in order, max-min fair rates over Link.bw, each flow
    moving bytes/efficiency wire bytes; return latency_s + the phases' makespan."""
    total = p.latency_s
    phases = defaultdict(list)
    for f in p.flows:
        phases[f.phase].append([f.bytes / p.efficiency, f.path])
    for phase in sorted(phases):
        active = [f for f in phases[phase] if f[0] > 0 and f[1]]
        while active:
            rate, left = {}, {}
            on = defaultdict(list)
            for i, (_, path) in enumerate(active):
                for link in path:
                    on[link].append(i)
            cap = {link: view.links[link].bw for link in on}
            while len(rate) < len(active):  # progressive filling
                link = min((lk for lk in on if any(i not in rate for i in on[lk])),
                           key=lambda lk: cap[lk] / sum(i not in rate for i in on[lk]))
                share = cap[link] / sum(i not in rate for i in on[link])
                for i in on[link]:
                    if i not in rate:
                        rate[i] = share
                        for lk in active[i][1]:
                            cap[lk] -= share
            dt = min(active[i][0] / rate[i] for i in range(len(active)))
            total += dt
            for i in range(len(active)):
                active[i][0] -= rate[i] * dt
            active = [f for f in active if f[0] > 1e-6]
    return total


def _sent(p):
    out = defaultdict(float)
    for f in p.flows:
        out[f.src] += f.bytes
    return dict(out)


def test_ring_all_reduce_moves_2_n_minus_1_over_n_per_rank():
    """2-rank and 8-rank ring all-reduce: every rank sends 2(n-1)/n * S."""
    ring = {"NCCL_ALGO": "Ring"}
    S = 1 << 28
    p2 = plan("all_reduce", S, (0, 1), A100, env=ring)
    assert _sent(p2) == pytest.approx({0: S, 1: S})
    p8 = plan("all_reduce", S, range(8), A100, env=ring)
    assert _sent(p8) == pytest.approx({r: 2 * 7 / 8 * S for r in range(8)})
    assert (p8.algo, p8.proto) == ("RING", "SIMPLE")


def test_busbw_factors_equal_nccl_tests():
    """nccl-tests: AR 2(n-1)/n; AG, RS, alltoall (n-1)/n; broadcast, reduce, sendrecv 1."""
    n = 8
    assert busbw_factor("all_reduce", n) == pytest.approx(14 / 8)
    for c in ("all_gather", "reduce_scatter", "all_to_all"):
        assert busbw_factor(c, n) == pytest.approx(7 / 8)
    for c in ("broadcast", "reduce", "send", "recv"):
        assert busbw_factor(c, n) == 1.0
    p = plan("all_gather", 8 << 20, range(8), A100)
    assert p.busbw == pytest.approx(p.algbw * 7 / 8) and p.algbw == pytest.approx((8 << 20) / p.time_s)


@pytest.mark.parametrize("view,coll,size,ranks,env", [
    (A100, "all_reduce", 1 << 30, range(8), None),
    (A100, "all_reduce", 64 << 10, range(8), None),
    (H100, "all_reduce", 1 << 30, range(8), None),
    (A100x2, "all_reduce", 1 << 30, range(16), None),
    (A100x2, "all_reduce", 1 << 20, range(16), None),
    (A100x4, "all_reduce", 16 << 20, range(32), {"NCCL_ALGO": "Tree"}),
    (H100x2, "all_reduce", 1 << 30, range(16), None),
    (A100x2, "all_gather", 1 << 30, range(16), None),
    (A100x2, "broadcast", 1 << 28, range(16), None),
    (A100x2, "all_to_all", 1 << 28, range(16), None),
    (H100, "send", 1 << 28, (0, 5), None),
])
def test_flows_alone_reproduce_time(view, coll, size, ranks, env):
    """latency_s + the flows replayed alone (max-min over Link.bw at efficiency) == time_s."""
    p = plan(coll, size, tuple(ranks), view, env=env)
    assert 0 < p.efficiency <= 1
    assert p.flow_time_s == pytest.approx(p.time_s)
    assert fluid_replay(p, view) == pytest.approx(p.time_s, rel=0.03)


def test_small_calls_use_only_their_channels():
    """A 4-byte all-reduce over 2 nodes runs on one channel (NCCL's small-message reduction): its
    flows are one tree (channel 0), 15 edges of 16 ranks, each carrying the whole 4 bytes up and
    down; forced onto 32 channels (NCCL_MIN_NCHANNELS) it spreads over every channel of the
    template. Both move the same payload in total."""
    small = plan("all_reduce", 4, tuple(range(16)), A100x2, dtype="fp32")
    assert (small.algo, small.proto, small.nchannels) == ("TREE", "LL", 1)
    assert {f.channel for f in small.flows} == {0}
    assert len(small.flows) == 2 * 15 and all(f.bytes == pytest.approx(4) for f in small.flows)
    full = plan("all_reduce", 4, tuple(range(16)), A100x2, dtype="fp32", env={"NCCL_MIN_NCHANNELS": "32"})
    assert full.nchannels > max(f.channel for f in full.flows)  # every channel of the template used
    assert sum(f.bytes for f in full.flows) == pytest.approx(sum(f.bytes for f in small.flows))
    assert small.flow_time_s == pytest.approx(small.time_s)


def test_plans_are_cached_and_groups_share_decisions():
    """The same call returns the same Plan object; every TP group of a cluster shares one NCCL
    decision (the group-topology signature), while flows follow each group's own links."""
    planner = Planner(A100x4)
    a = planner.plan("all_reduce", 1 << 24, tuple(range(8)))
    assert planner.plan("all_reduce", 1 << 24, list(range(8))) is a
    b = planner.plan("all_reduce", 1 << 24, tuple(range(8, 16)))
    assert len(planner._choices) == 1
    assert (a.algo, a.proto, a.time_s) == (b.algo, b.proto, b.time_s)
    assert {f.src for f in b.flows} == set(range(8, 16))
    assert plan("all_reduce", 1 << 24, range(8), A100x4) is plan("all_reduce", 1 << 24, range(8), A100x4)


def test_errors_are_clear():
    """Unknown collectives/dtypes, one-rank groups, sizes that do not divide -> one clear error."""
    with pytest.raises(UnsupportedCollectiveError, match="unknown collective 'allreduce'; valid: broadcast, reduce, "
                                                         "all_gather, reduce_scatter, all_reduce, all_to_all, send, recv"):
        plan("allreduce", 8, range(8), A100)
    with pytest.raises(UnsupportedCollectiveError, match=r"all_reduce on a group of 1 rank\(s\) moves nothing; skip "
                                                         r"one-rank groups \(ncclshim.is_trivial\(ranks\)\)"):
        plan("all_reduce", 8, [3], A100)
    with pytest.raises(UnsupportedCollectiveError, match=r"all_gather of 1000 bytes over 8 ranks: the size must be a "
                                                         r"multiple of ranks x element size \(8 x 2 B for bf16\)"):
        plan("all_gather", 1000, range(8), A100)
    with pytest.raises(UnsupportedCollectiveError, match="unknown dtype 'bfloat16'; valid: fp64"):
        plan("all_reduce", 8, range(8), A100, dtype="bfloat16")
    with pytest.raises(UnsupportedCollectiveError, match=r"send takes ranks=\(src, dst\), got 3 ranks"):
        plan("send", 8, (0, 1, 2), A100)
    with pytest.raises(UnsupportedCollectiveError, match="nbytes must be a non-negative integer, got -1"):
        plan("all_reduce", -1, range(8), A100)
    with pytest.raises(UnsupportedCollectiveError, match="NCCL_ALGO='Bogus': unknown name 'Bogus'"):
        plan("all_reduce", 8, range(8), A100, env={"NCCL_ALGO": "Bogus"})


def test_trivial_and_empty_calls():
    """One-rank groups are trivial; a zero-byte call moves nothing and takes no time."""
    assert is_trivial([5]) and is_trivial([]) and not is_trivial([0, 1])
    p = plan("all_reduce", 0, range(8), A100)
    assert (p.algo, p.time_s, p.flows) == ("NONE", 0.0, ())


def test_validation_against_public_nccl_tests_numbers():
    """Large-size busbw within 5% of published measurements: DGX A100 node 230-232.5 GB/s
    (nccl-tests#149, #175), DGX A100 multi-node 8x HDR 192 GB/s (nccl#812), DGX H100 NVLS
    ~480 GB/s and ring ~370 GB/s (nccl-tests#212)."""
    big = 8 << 30
    assert plan("all_reduce", big, range(8), A100).busbw / 1e9 == pytest.approx(230, rel=0.05)
    assert plan("all_reduce", big, range(8), A100).busbw / 1e9 == pytest.approx(232.54, rel=0.05)
    for view in (A100x2, A100x4):
        n = len(view.gpus)
        assert plan("all_reduce", big, range(n), view, env={"NCCL_ALGO": "Ring"}).busbw / 1e9 == \
            pytest.approx(192, rel=0.05)
    assert plan("all_reduce", big, range(8), H100).busbw / 1e9 == pytest.approx(480, rel=0.05)
    assert plan("all_reduce", big, range(8), H100, env={"NCCL_ALGO": "Ring"}).busbw / 1e9 == \
        pytest.approx(370, rel=0.05)


def test_heterogeneous_ring_names_its_bottleneck():
    """An A100 node + an H100 node: the ring runs at the A100's HDR NICs (as fast as two A100
    nodes, no faster) and says which link bounds it."""
    v = topology_view(load_cluster("mixed-a100-h100", num_gpus=16))
    p = plan("all_reduce", 1 << 30, range(16), v, env={"NCCL_ALGO": "Ring"})
    link = v.links[p.bottleneck]
    assert link.kind == "net" and link.src.startswith("n0.nic")
    assert p.time_s == pytest.approx(plan("all_reduce", 1 << 30, range(16), A100x2, env={"NCCL_ALGO": "Ring"}).time_s)


def test_coherent_fabric_uses_the_coherent_ring():
    """Seed 003: a coherent fabric all-reduces in n-1 steps: (n-1)/n * S per rank, faster than ring."""
    spec = read_spec(preset_path("dgx-a100")).to_dict()
    spec["node_types"]["dgx-a100"]["coherent_memory"] = True
    v = topology_view(load_cluster(spec, num_gpus=8))
    S = 1 << 30
    p = plan("all_reduce", S, range(8), v)
    assert p.algo == "COHERENT_RING"
    assert _sent(p) == pytest.approx({r: 7 / 8 * S for r in range(8)})
    assert p.time_s < plan("all_reduce", S, range(8), A100).time_s
    assert plan("all_reduce", S, range(8), v, env={"NCCL_ALGO": "^CoherentRing"}).algo == "RING"


def test_pcie_server_plans():
    """A PCIe L40S server never uses LL128, and its all-reduce is bounded near 20 GB/s busbw."""
    v = preset_view("l40s-pcie")
    for size in (1 << 10, 1 << 20, 1 << 30):
        assert plan("all_reduce", size, range(8), v).proto != "LL128"
    assert plan("all_reduce", 1 << 30, range(8), v).busbw / 1e9 == pytest.approx(20, rel=0.05)


def test_multi_node_all_to_all_is_bound_by_one_nic_per_gpu():
    """With PXN every rail's NIC carries all its node's traffic to that rail: time = latency +
    S * (remote fraction) / 48 GB/s (NCCL's Gen5 switch-to-NIC bandwidth). At 16 H100 nodes that
    is within 6% of the ~48 GB/s busbw NVIDIA quotes for multi-node all_to_all (nccl-tests#267)."""
    v = preset_view("dgx-h100", nodes=16)
    n, S = 128, 1 << 30
    p = plan("all_to_all", S, range(n), v)
    expected = S / (p.latency_s + S * (n - 8) / n / 48e9) * (n - 1) / n
    assert p.busbw == pytest.approx(expected)
    assert p.busbw / 1e9 == pytest.approx(48, rel=0.06)
    assert v.links[p.bottleneck].kind == "net"


def test_same_inputs_same_flows():
    """Two planners on equal views produce identical plans."""
    a = Planner(preset_view("dgx-h100", nodes=2)).plan("all_reduce", 1 << 20, tuple(range(16)))
    b = Planner(preset_view("dgx-h100", nodes=2)).plan("all_reduce", 1 << 20, tuple(range(16)))
    assert a == b


def test_nvlink_mesh_pair():
    """Two GPUs joined by an NVLink bridge route directly over it."""
    spec = {"schema_version": 1, "name": "bridged-pair",
            "node_types": {"pair": {"gpus_per_node": 2, "pcie": {"gen": 5}, "nics": {"count": 1, "bw_Gbps": 400},
                                    "nvlink": {"kind": "mesh", "pairs": [[0, 1, 12]]}}},
            "node_groups": [{"name": "h", "gpu": "H100-PCIe", "node_type": "pair"}]}
    v = topology_view(load_cluster(spec, num_gpus=2))
    p = plan("all_reduce", 1 << 30, (0, 1), v)
    assert [v.links[i].kind for f in p.flows for i in f.path] == ["nvlink", "nvlink"]


def test_p2p_channels_and_protocol():
    """Per-peer channels (ncclTopoGetNchannels): H100 NVSwitch 2*18 -> 32, A100 2*12 -> 16,
    400G NIC ceil(50/14) = 4, 200G 2, PCIe 2; LL while bytes <= channels x 16 KiB."""
    assert plan("send", 1 << 20, (0, 7), H100).nchannels == 32
    assert plan("send", 1 << 20, (0, 7), A100).nchannels == 16
    assert plan("send", 1 << 20, (0, 15), H100x2).nchannels == 4
    assert plan("send", 1 << 20, (0, 15), A100x2).nchannels == 2
    assert plan("send", 1 << 20, (0, 7), preset_view("l40s-pcie")).nchannels == 2
    assert plan("send", 32 * 16384, (0, 7), H100).proto == "LL"
    assert plan("send", 32 * 16384 + 2, (0, 7), H100).proto == "SIMPLE"


def test_invariants_over_presets_groups_and_sizes():
    """Every plan: positive time, efficiency in (0, 1], flows between group members over valid
    links, flows-alone time equal to time_s, busbw = algbw x nccl-tests factor."""
    views = [preset_view(name, nodes=n) for name in PRESETS for n in (1, 3)]
    mixed = read_spec(preset_path("mixed-a100-h100")).to_dict()
    mixed["node_groups"][0]["nodes"], mixed["node_groups"][1]["nodes"] = 1, 2
    views.append(topology_view(load_cluster(mixed)))
    for view in views:
        n_gpus = len(view.gpus)
        for ranks in (tuple(range(n_gpus)), tuple(range(0, n_gpus, 8)), (1, 2, 5, 6), (7, 0)):
            if len(ranks) < 2:
                continue
            n = len(ranks)
            for coll in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"):
                for size in (4096, 1 << 22, 1 << 30):
                    size = size // (2 * n) * (2 * n)
                    p = plan(coll, size, ranks, view)
                    assert p.time_s > p.latency_s > 0
                    assert 0 < p.efficiency <= 1
                    assert p.flow_time_s == pytest.approx(p.time_s)
                    assert p.busbw == pytest.approx(size / p.time_s * busbw_factor(coll, n))
                    for f in p.flows:
                        assert f.src in ranks and f.dst in ranks and f.bytes > 0
                        assert all(0 <= i < len(view.links) for i in f.path)
