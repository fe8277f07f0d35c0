"""NCCL's socket transport (heterosim.cluster.sockets): rates and latencies by hand."""

from __future__ import annotations

import pytest

from heterosim.cluster import load_cluster
from heterosim.cluster.parse import parse_spec
from heterosim.cluster.sockets import STACK_LATENCY_US, STREAM_GBPS, SocketSpec, socket_rate, socket_streams
from heterosim.errors import TopologyError

GB = 1e9


def test_nccl_clamps_threads_and_sockets():
    """net_socket.cc: at most 64 sockets; 16 threads x 8 sockets becomes 16 x 4."""
    assert socket_streams(0, 1) == (0, 0)
    assert socket_streams(2, 8) == (2, 16)
    assert socket_streams(16, 8) == (16, 64)
    assert socket_streams(3, 30) == (3, 63)


@pytest.mark.parametrize("line_Gbps, gpus, spec, expect_GBps", [
    (100, 1, SocketSpec(), STREAM_GBPS),  # the proxy's one stream
    (10, 1, SocketSpec(), 1.25),  # the line rate
    (100, 8, SocketSpec(), 12.5),  # 8 GPUs x 2.3 > 12.5: the line
    (100, 1, SocketSpec(threads=2, socks_per_thread=8, flow_bw=1.25 * GB), 2 * STREAM_GBPS),  # AWS: 2 threads
    (100, 1, SocketSpec(threads=2, socks_per_thread=8, flow_bw=0.125 * GB), 16 * 0.125),  # 1 Gb/s flows
])
def test_socket_rate_by_hand(line_Gbps, gpus, spec, expect_GBps):
    assert socket_rate(line_Gbps * GB / 8, gpus, spec) == pytest.approx(expect_GBps * GB)


def _eth(nic: dict) -> dict:
    return {"schema_version": 1, "name": "eth",
            "node_types": {"box": {"gpus_per_node": 1, "pcie": {"gen": 4}, "nics": nic}},
            "node_groups": [{"name": "g", "gpu": "A100", "node_type": "box", "nodes": 2}],
            "fabric": {"kind": "leaf_spine", "nodes_per_leaf": 2}}


def test_cluster_file_names_the_transport():
    """rdma defaults to true; rdma: false takes NCCL's generic socket settings or a cloud's."""
    s = parse_spec(_eth({"count": 1, "bw_Gbps": 100}))
    assert s.node_types[0].nics[0].rdma
    s = parse_spec(_eth({"count": 1, "bw_Gbps": 100, "rdma": False, "socket": {"cloud": "aws", "flow_Gbps": 10}}))
    nic = s.node_types[0].nics[0]
    assert (nic.rdma, nic.socket.threads, nic.socket.socks_per_thread) == (False, 2, 8)
    assert nic.socket.flow_bw == pytest.approx(1.25 * GB)
    assert parse_spec(s.to_dict()) == s


@pytest.mark.parametrize("nic, message", [
    ({"count": 1, "bw_Gbps": 100, "socket": {}},
     "node_types.box.nics.socket: only a NIC without RDMA uses NCCL's socket transport; set rdma: false or drop socket"),
    ({"count": 1, "bw_Gbps": 100, "rdma": False, "socket": {"cloud": "azure"}},
     "node_types.box.nics.socket.cloud: unknown 'azure'; valid: ['aws', 'gcp', 'other']"),
    ({"count": 1, "bw_Gbps": 100, "rdma": False, "socket": {"threads": 17}},
     "node_types.box.nics.socket.threads: 17 is more than 16; give a realistic count"),
])
def test_bad_socket_settings(nic, message):
    with pytest.raises(TopologyError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_spec(_eth(nic))


def test_socket_nic_cable_moves_the_socket_rate_and_adds_the_stack_latency():
    """The NIC's fabric cable: hardware 2.3 GB/s, NCCL's view 12.5 GB/s, 0.5 + 4.0 / 2 us."""
    c = load_cluster(_eth({"count": 1, "bw_Gbps": 100, "rdma": False}), num_gpus=2)
    L = c.network.links
    up = [i for i in range(len(L.src)) if c.network.vertices[L.src[i]] == "n0.nic0"
          and c.network.vertices[L.dst[i]] == "leaf0"]
    assert len(up) == 1
    i = up[0]
    assert L.bw[i] == pytest.approx(STREAM_GBPS * GB) and L.nccl_bw[i] == pytest.approx(12.5 * GB)
    assert L.latency[i] == pytest.approx((0.5 + STACK_LATENCY_US / 2) * 1e-6)


def test_all_reduce_over_sockets_by_hand():
    """64 MiB all-reduce, 2 nodes x 1 GPU: each GPU sends S through its NIC. RDMA: NCCL's time at
    line rate. Sockets: the same choice (NCCL sees the line rate), latency + 2 network steps x (2 NIC
    cables x 4 us / 2)
    x 1.4 (multi-node Simple ring), and the flows move at 2.3 GB/s: latency + S / 2.3 GB/s."""
    import ncclshim
    from ncclshim.view import topology_view
    from replay.simulate import simulate
    from tests.test_replay_engine import coll, make_trace, wait

    S = 64 << 20
    trace = make_trace(2, {"dp": ([0, 1], "dp", "dp")}, [((0, 1), {"b": [coll("all_reduce", "dp", S), wait(1)]},
                                                            [("b", 0)])])
    plans, times = {}, {}
    for rdma in (True, False):
        c = load_cluster(_eth({"count": 1, "bw_Gbps": 100, "rdma": rdma}), num_gpus=2)
        plans[rdma] = ncclshim.plan("all_reduce", S, [0, 1], topology_view(c))
        times[rdma] = simulate(trace, c, host=False).iteration_time_s
    assert (plans[False].algo, plans[False].proto) == (plans[True].algo, plans[True].proto) == ("RING", "SIMPLE")
    assert plans[False].latency_s - plans[True].latency_s == pytest.approx(2 * STACK_LATENCY_US * 1.4 * 1e-6)
    assert times[True] == pytest.approx(plans[True].time_s, rel=1e-9)
    assert times[False] == pytest.approx(plans[False].latency_s + S / (STREAM_GBPS * GB), rel=1e-9)
    assert plans[False].flow_time_s == pytest.approx(times[False], rel=1e-9)  # time_s stays NCCL's estimate


def test_v100_t4_pipeline_over_ethernet_without_rdma():
    """The 16-stage V100 + T4 pipeline over 25 Gb/s Ethernet (tests/test_replay_cli.py) replays with
    socket NICs. One NIC serves 8 GPUs: 8 x 2.3 GB/s > 3.125, so the line rate still binds; a
    send from stage 7 to stage 8 pays one network step's stack latency more: 2 cables x 2 us."""
    import copy

    import ncclshim
    from ncclshim.view import topology_view
    from replay.simulate import simulate
    from test_replay_cli import _mixed_ethernet
    from test_replay_reference import one_f_one_b

    rdma = _mixed_ethernet("T4")
    socket = copy.deepcopy(rdma)
    socket["node_types"]["box"]["nics"]["rdma"] = False
    c = load_cluster(socket, num_gpus=16)
    assert c.spec.node_types[0].nics[0].rate == pytest.approx(25 / 8 * GB)
    assert simulate(one_f_one_b(16, 4), c).iteration_time_s > 0
    lat = [ncclshim.plan("send", 1 << 20, [7, 8], topology_view(load_cluster(s, num_gpus=16))).latency_s
           for s in (rdma, socket)]
    assert lat[1] - lat[0] == pytest.approx(STACK_LATENCY_US * 1e-6)
