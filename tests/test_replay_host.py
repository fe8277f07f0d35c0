"""The host dispatch model (replay.host): the max-plus scan by hand, and a job that turns host-bound."""

from __future__ import annotations

import numpy as np
import pytest

from heterosim.cluster import load_cluster
from heterosim.cluster.parse import parse_spec
from heterosim.cluster.spec import DEFAULT_DISPATCH_US, HostDispatch
from heterosim.errors import ConfigError, ReplayError, TopologyError
from replay.engine import run_fast
from replay.host import (LAUNCH_QUEUE_DEPTH, block_host, dispatch_by_gpu_type, dispatch_costs,
                         host_bound_durations, role_leads, sync_flags, with_host)
from replay.reference import run_reference
from tests.cluster_specs import tiny
from tests.test_replay_engine import comp, make_trace, toy_workload

US = 1e-6


def test_scan_gpu_bound_and_host_bound():
    """Two 10 us kernels: dispatched at 4 us each the GPU runs 4..14, 14..24; at 30 us, 30..40, 60..70."""
    d = np.array([10, 10]) * US
    assert host_bound_durations(d, np.full(2, 4 * US), np.zeros(2, bool)) == pytest.approx([14 * US, 10 * US])
    assert host_bound_durations(d, np.full(2, 30 * US), np.zeros(2, bool)) == pytest.approx([40 * US, 30 * US])


def test_scan_zero_dispatch_is_identity():
    """With no host cost the GPU durations come back unchanged."""
    d = np.array([3.0, 0.0, 5.0, 1.0]) * US
    assert host_bound_durations(d, np.zeros(4), np.zeros(4, bool)).tolist() == d.tolist()


def test_sync_makes_the_cpu_wait_for_the_gpu():
    """A 100 us kernel, then a sync op: the CPU issues the 3rd op only after the GPU ends at 101 us.

    c = 1 us each. Without the sync the 3rd op starts at 101 (queued); with it, the CPU reads the
    result at 101 and issues op 3 at 102 (its own dispatch) and op 2 (the sync, 0 us) at 101+1."""
    d = np.array([100, 0, 1]) * US
    c = np.full(3, 1 * US)
    free = host_bound_durations(d, c, np.zeros(3, bool))
    assert free.sum() == pytest.approx(102 * US)
    synced = host_bound_durations(d, c, np.array([False, True, False]))
    # op 1 (sync) issued at max(2, 101) + 1 = 102, ends at 102; op 2 issued at 103, ends at 104
    assert synced.tolist() == pytest.approx([101 * US, 1 * US, 2 * US])


def test_gap_before_a_comm_op_lands_on_the_next_compute_op():
    """Comm ops keep 0 (the engine ignores them); their dispatch delays the next compute op."""
    d = np.array([10, 0, 10]) * US
    c = np.array([1, 20, 1]) * US
    eff = host_bound_durations(d, c, np.zeros(3, bool), np.array([True, False, True]))
    # op0 1..11; comm issued at 21; op2 issued at 22, runs 22..32
    assert eff.tolist() == pytest.approx([11 * US, 0.0, 21 * US])


def test_bad_input_is_one_clear_error():
    with pytest.raises(ReplayError, match="one GPU time, dispatch cost, sync flag and compute flag per op"):
        host_bound_durations(np.zeros(2), np.zeros(3), np.zeros(2, bool))
    with pytest.raises(ReplayError, match="must be >= 0 seconds"):
        host_bound_durations(np.array([-1.0]), np.zeros(1), np.zeros(1, bool))


def test_classes_and_sync_names():
    per = {"fwd": 1.0, "bwd": 2.0, "nograd": 3.0, "collective": 4.0, "wait": 5.0}
    got = dispatch_costs(["compute", "compute", "compute", "compute", "collective", "p2p", "wait"],
                         ["fwd", "recompute", "bwd", "optimizer", "grad_sync", "fwd", "fwd"], per)
    assert got.tolist() == [1.0, 1.0, 2.0, 3.0, 4.0, 4.0, 5.0]
    assert sync_flags({"host_sync": [False, True, False]}).tolist() == [False, True, False]
    graph = dispatch_costs(["compute"] * 3, ["fwd"] * 3, per, ["graph", "in_graph", "eager"])
    assert graph.tolist() == [3.0, 0.0, 1.0]  # a graph replay: one nograd launch for its kernels


def test_a_block_entered_with_a_lead():
    """The CPU 25 us ahead: two 10 us kernels dispatched at 30 us each run at 5..15 and 35..45."""
    d = np.array([10, 10]) * US
    eff = host_bound_durations(d, np.full(2, 30 * US), np.zeros(2, bool), lead_s=25 * US)
    assert eff == pytest.approx([15 * US, 30 * US])
    # a sync on the first op: the CPU waits for the GPU, the lead is gone
    synced = host_bound_durations(d, np.full(2, 30 * US), np.array([True, False]), lead_s=25 * US)
    assert synced == pytest.approx([40 * US, 30 * US])


def test_block_summary_gives_the_scan_s_exit_lead():
    """exit(L) = D - C + max(L, M) without syncs; with one, what the block leaves after it."""
    d = np.array([10, 10, 0, 50]) * US
    c = np.array([4, 4, 20, 4]) * US
    m = np.array([True, True, False, True])
    h = block_host(d, c, np.zeros(4, bool), m)
    # M = max(4, 8 - 10, 32 - 20) = 12 us (the last kernel, issued at 32, has 20 us of GPU work before it)
    assert h.deficit_s == pytest.approx(12 * US) and h.drift_s == pytest.approx((70 - 32) * US)
    for lead in (0.0, 5 * US, 40 * US):
        eff = host_bound_durations(d, c, np.zeros(4, bool), m, lead_s=lead)
        # the block's end minus the CPU's time after its last op, from the durations themselves
        assert h.exit_lead(lead) == pytest.approx(eff.sum() - (c.sum() - lead))
    s = block_host(d, c, np.array([False, False, True, False]), m)
    assert s.synced_exit_s is not None and s.exit_lead(1.0) == s.exit_lead(0.0)


def test_the_lead_is_carried_across_blocks_and_capped_by_the_queue():
    """a: 1000 kernels of 100 us issued at 10 us each (D - C = 90000 us, M = 10 us); b: 100 kernels
    of 1 us issued at 10 us (D - C = -900 us; M = 1000 - 99 = 901 us: host-bound alone).

    The launch queue caps the lead after a at the GPU time of the last 1024 ops (a's 1000, b's last
    24): 100024 us, after b at b's 100 and a's last 924: 92500 us. Program [a, b] from lead 0:
    a -> 90010, b -> 89110; a -> min(179110, 100024), b -> min(99124, 92500); then it repeats: b is
    entered 100024 us ahead (its stall is absorbed), a 92500 us ahead."""
    d_a, d_b = np.full(1000, 100 * US), np.full(100, 1 * US)
    blocks = {"a": block_host(d_a, np.full(1000, 10 * US), np.zeros(1000, bool)),
              "b": block_host(d_b, np.full(100, 10 * US), np.zeros(100, bool))}
    assert blocks["b"].deficit_s == pytest.approx(901 * US)
    leads = role_leads(["a", "b"], blocks)
    assert leads["b"] == pytest.approx(100024 * US) and leads["a"] == pytest.approx(92500 * US)
    eff = host_bound_durations(d_b, np.full(100, 10 * US), np.zeros(100, bool), lead_s=leads["b"])
    assert eff == pytest.approx(d_b)  # b's kernels run back to back


def test_queue_caps_of_repeated_windows_equal_the_walk_bit_for_bit():
    """_queue_caps copies the cap of an earlier segment whose window holds the same blocks; on a
    loop with a warm-up, a steady phase and wrap-around every cap equals walking the window back."""
    from replay.host import _queue_caps

    rng = np.random.default_rng(3)
    blocks = {name: block_host(rng.uniform(1, 50, n) * US, np.full(n, 5 * US), np.zeros(n, bool))
              for name, n in (("w", 700), ("f", 130), ("s", 2), ("r", 1), ("b", 260), ("o", 90))}
    program = ["w", "f", "s"] * 3 + ["f", "s", "r", "b", "s"] * 40 + ["r", "b", "s"] * 3 + ["o"]

    def walk(i):
        left, total, k = LAUNCH_QUEUE_DEPTH, 0.0, 0
        while left > 0:
            h = blocks[program[(i - k) % len(program)]]
            take = min(left, h.tail_s.size - 1)
            total += float(h.tail_s[take])
            left -= take
            k += 1
        return total

    caps = _queue_caps(program, blocks)
    assert [c.hex() for c in caps] == [walk(i).hex() for i in range(len(program))]


def test_a_sync_drops_the_lead():
    """A block whose first op syncs is entered with no lead, however far ahead the CPU was."""
    d, c = np.full(10, 100 * US), np.full(10, 10 * US)
    s = np.zeros(10, bool)
    s[0] = True
    h = block_host(d, c, s)
    assert h.exit_lead(0.0) == pytest.approx(910 * US)  # the GPU ends at 10 + 1000, the CPU at 100
    eff = host_bound_durations(d, c, s, lead_s=h.exit_lead(0.0))
    assert eff.sum() == pytest.approx(10 * US + 1000 * US)  # the first dispatch shows again


def _chain_trace(n: int, item: bool):
    """Two iterations of one block of ``n`` forward ops; with ``item``, the loop reads the loss back
    (``loss.item()``) at the end of each iteration, so each block's first op is a host sync."""
    rows = [{**comp(1e6), "host_sync": item and i == 0} for i in range(n)]
    return make_trace(1, {}, [((0,), {"f": rows}, [("f", 0), ("f", 1)])])


@pytest.mark.parametrize("speed,item_us,free_us", [
    # GPU op = 1e6 FLOP / speed, d; dispatch c = 10 us; blocks of 10 ops.
    # With .item() the CPU waits at every block start: the block takes c + 10 d while d >= c
    # (one dispatch shows), 10 c + d below (the host issues 10 ops, the GPU runs the last).
    # Without it the CPU runs ahead across blocks and iterations: an iteration takes max(10 d, 10 c).
    (1e10, 2 * (10 + 10 * 100), 2 * 10 * 100),  # d = 100 us: GPU-bound
    (1e11, 2 * (10 + 10 * 10), 2 * 10 * 10),  # d = 10 us: the turning point
    (1e12, 2 * (10 * 10 + 1), 2 * 10 * 10),  # d = 1 us: host-bound
    (1e13, 2 * (10 * 10 + 0.1), 2 * 10 * 10),  # d = 0.1 us: a faster GPU buys nothing
])
def test_a_loop_with_item_turns_host_bound_as_the_gpu_gets_faster(speed, item_us, free_us):
    """Both engines agree with the arithmetic, with and without a .item() per iteration."""
    for item, expect_us in ((True, item_us), (False, free_us)):
        trace = _chain_trace(10, item)
        w = toy_workload(trace, speed={"A": speed})
        w.durations = with_host(w.durations, trace, {"A": {"fwd": 10 * US, "bwd": 0.0, "nograd": 0.0,
                                                           "collective": 0.0, "wait": 0.0}})
        fast = max(t.finish_s for t in run_fast(w).times)
        assert fast == pytest.approx(expect_us * US, rel=1e-9), item
        assert run_reference(w)[0].finish_s == pytest.approx(fast, rel=1e-12)


def test_a_graph_replay_costs_one_launch():
    """10 forward kernels of 1 us, the host issuing an op in 10 us and a graph replay in 5 (nograd):
    eager they take 10 x 10 + 1 = 101 us (host-bound); replayed as one CUDA graph 5 + 10 x 1 = 15 us."""
    d = np.full(10, 1 * US)
    per = {"fwd": 10 * US, "bwd": 0.0, "nograd": 5 * US, "collective": 0.0, "wait": 0.0}
    eager = dispatch_costs(["compute"] * 10, ["fwd"] * 10, per)
    graphed = dispatch_costs(["compute"] * 10, ["fwd"] * 10, per, ["graph"] + ["in_graph"] * 9)
    assert host_bound_durations(d, eager, np.zeros(10, bool)).sum() == pytest.approx(101 * US)
    assert host_bound_durations(d, graphed, np.zeros(10, bool)).sum() == pytest.approx(15 * US)


def test_cluster_file_states_dispatch_per_node_type():
    """cpu.dispatch_us: a number for all classes or a per-class map; missing classes default; it
    round-trips through to_dict."""
    spec = tiny()
    spec["node_types"]["box"]["cpu"] = {"dispatch_us": {"fwd": 20}}
    s = parse_spec(spec)
    got = s.node_types[0].dispatch
    assert got.fwd == pytest.approx(20 * US) and got.bwd == pytest.approx(DEFAULT_DISPATCH_US["bwd"] * US)
    assert parse_spec(s.to_dict()) == s
    spec["node_types"]["box"]["cpu"] = {"dispatch_us": 0}
    assert not parse_spec(spec).node_types[0].dispatch.active
    assert HostDispatch().active  # the default charges the host
    spec["node_types"]["box"]["cpu"] = {"dispatch_us": {"bwd": 2e6}}
    with pytest.raises(TopologyError, match=r"node_types.box.cpu.dispatch_us.bwd: 2000000.0 us per op is more "
                                            r"than a second; give microseconds"):
        parse_spec(spec)
    spec["node_types"]["box"]["cpu"] = {"dispatch_us": {"launch": 3}}
    with pytest.raises(TopologyError, match=r"node_types.box.cpu.dispatch_us: unknown key 'launch'; valid keys: "
                                            r"\['bwd', 'collective', 'fwd', 'nograd', 'wait'\]"):
        parse_spec(spec)


def test_one_gpu_type_needs_one_host_figure():
    """Two node types holding the same GPU type with different dispatch figures are refused."""
    spec = tiny()
    box2 = {**spec["node_types"]["box"], "cpu": {"dispatch_us": 1}}
    spec["node_types"]["box2"] = box2
    spec["node_groups"] = [{"name": "a", "gpu": "A100", "node_type": "box", "nodes": 1},
                           {"name": "b", "gpu": "A100", "node_type": "box2", "nodes": 1}]
    c = load_cluster(spec, num_gpus=4)
    with pytest.raises(ConfigError, match="GPU type A100-SXM4-80GB sits in node types with different cpu.dispatch_us"):
        dispatch_by_gpu_type(c, ["A100-SXM4-80GB"])


def _one_gpu(name: str, bf16_TFLOPs: float) -> dict:
    """One node, one accelerator defined in the file, a host that issues a forward op in 20 us."""
    acme = {"name": name, "vendor": "acme", "arch": "acme1", "compute_capability": 0,
            "peak_TFLOPs": {"fp32": 10.0, "tf32": 20.0, "bf16": bf16_TFLOPs, "fp16": bf16_TFLOPs, "fp8": 100.0},
            "hbm_bw_GBps": 800, "memory_GiB": 32, "sm_count": 64, "l2_MiB": 16, "nvlink_bw_GBps": 0,
            "pcie_bw_GBps": 32, "tdp_W": 300, "sources": "a test accelerator: figures chosen by hand"}
    return {"schema_version": 1, "name": "one", "gpus": [acme],
            "node_types": {"box": {"gpus_per_node": 1, "pcie": {"gen": 4}, "cpu": {"dispatch_us": {"fwd": 20}}}},
            "node_groups": [{"name": "g", "gpu": name, "node_type": "box", "nodes": 1}]}


def test_simulate_reads_the_host_from_the_cluster_file():
    """10 GEMMs of 1 GFLOP per iteration, the loop reading a value back at its end (the first op is
    a host sync), on a 50 TFLOP/s accelerator (GPU-bound: 20 us + 10 d) and on a 5000 TFLOP/s one
    (host-bound: 10 x 20 us + d), d the op's price on that accelerator; host=False gives 10 d.
    Without the read back the CPU runs ahead across iterations: max(10 d, 10 x 20 us)."""
    from heterosim.trace.ir import Op
    from kernel_db import Pricer
    from replay.simulate import simulate

    got = {}
    for item in (True, False):
        rows = [{**comp(1e9), "host_sync": item and i == 0} for i in range(10)]
        trace = make_trace(1, {}, [((0,), {"f": rows}, [("f", 0)])])
        for name, peak in (("ACME-SLOW", 50.0), ("ACME-FAST", 5000.0)):
            spec = _one_gpu(name, peak)
            c = load_cluster(spec, num_gpus=1)
            d = Pricer(None, c.catalogue).price(Op(id=0, kind="compute", name="aten.mm.default", kernel_class="gemm",
                                                   phase="fwd", flops=1e9, flops_full=1e9, dtype="bf16"), name).seconds
            r = simulate(trace, spec, overlap_slowdown=0.0)
            got[name, item] = (d, r.iteration_time_s, simulate(trace, spec, host=False).iteration_time_s)
    d, t, off = got["ACME-SLOW", True]
    assert d > 20 * US and t == pytest.approx(20 * US + 10 * d, rel=1e-9) and off == pytest.approx(10 * d, rel=1e-9)
    assert got["ACME-SLOW", False][1] == pytest.approx(10 * d, rel=1e-9)
    d, t, off = got["ACME-FAST", True]
    assert d < 20 * US and t == pytest.approx(10 * 20 * US + d, rel=1e-9) and off == pytest.approx(10 * d, rel=1e-9)
    assert got["ACME-FAST", False][1] == pytest.approx(10 * 20 * US, rel=1e-9)
