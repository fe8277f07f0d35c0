"""A cluster's stated link latencies enter NCCL's cost model (``ncclshim.graph.extra_latency_us``).

Hand-computed: a DGX H100 network step crosses GPU -> PCIe switch -> NIC -> leaf -> NIC -> PCIe
switch -> GPU, i.e. two ``net`` cables (NIC-leaf, leaf-NIC) and four PCIe ones; an NVSwitch step
two NVLink cables. Defaults (``DEFAULT_LATENCY_US``) are what NCCL's constants already hold.
"""

from dataclasses import replace

import pytest
import yaml

from heterosim.cluster import preset_path
from ncclshim import plan
from ncclshim.graph import analyze, extra_latency_us
from ncclshim.planner import _signature
from ncclshim.tuning import cost, parse_env, select
from ncclshim.view import preset_view

S = parse_env(None)


def _h100_file(tmp_path, name, fabric_us=None, nvlink_us=None):
    spec = yaml.safe_load(preset_path("dgx-h100").read_text())
    if fabric_us is not None:
        spec["fabric"]["latency_us"] = fabric_us
    if nvlink_us is not None:
        spec["node_types"]["dgx-h100"]["nvlink"]["latency_us"] = nvlink_us
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_default_latencies_keep_nccl_constants(tmp_path):
    """A cluster stating the default latencies plans exactly like the preset (NCCL's constants)."""
    stated = preset_view(_h100_file(tmp_path, "same", fabric_us=0.5, nvlink_us=0.3), nodes=2)
    preset = preset_view("dgx-h100", nodes=2)
    g = analyze(tuple(range(16)), stated)
    assert (g.lat_intra_us, g.lat_inter_us) == (0.0, 0.0)
    for size in (8, 1 << 20, 1 << 30):
        assert plan("all_reduce", size, range(16), stated).time_s == plan("all_reduce", size, range(16), preset).time_s


def test_stated_latency_adds_per_step(tmp_path):
    """Fabric cables at 5.5 us (5 over the default) add 2 x 5 = 10 us to every network step;
    NVLink at 1.3 us adds 2 x 1 = 2 us to every NVSwitch step. Ring LL all-reduce on 2 nodes:
    6.6 + 28 intra steps x max(0.6 + 2, 1.0 overhead) + 2 net steps x (2.7 + 10)."""
    v = preset_view(_h100_file(tmp_path, "slow", fabric_us=5.5, nvlink_us=1.3), nodes=2)
    g = analyze(tuple(range(16)), v)
    assert g.lat_inter_us == pytest.approx(10.0)
    assert g.lat_intra_us == pytest.approx(2.0)
    _, lat = cost("all_reduce", "RING", "LL", g, S)
    assert lat == pytest.approx(6.6 + 28 * 2.6 + 2 * 12.7)
    one = analyze(tuple(range(8)), v)
    assert cost("all_reduce", "NVLS", "SIMPLE", one, S)[1] == pytest.approx(25.0 + 2.0)


def test_nvls_run_latency_takes_the_stated_nvlink_latency(tmp_path):
    """One-node NVLS all-reduce: the run-time latency (18.19 us measured) gains what the NVLink
    cables add (2 x 1 us at 1.3 us), as NCCL's 25 us does; so does its run time, by the same 2 us."""
    slow = preset_view(_h100_file(tmp_path, "nvl", nvlink_us=1.3))
    base = preset_view("dgx-h100")
    a, b = plan("all_reduce", 2 << 20, range(8), base), plan("all_reduce", 2 << 20, range(8), slow)
    assert (a.algo, b.algo) == ("NVLS", "NVLS")
    assert (a.latency_s, b.latency_s) == (pytest.approx(18.19e-6), pytest.approx(20.19e-6))
    assert b.time_s - a.time_s == pytest.approx(2e-6)
    assert b.nccl_time_s - a.nccl_time_s == pytest.approx(2e-6)


def test_extra_latency_of_a_path_is_its_excess_over_defaults(tmp_path):
    """A send across nodes: 2 fabric cables at 10.5 us -> 20 us beyond the defaults."""
    v = preset_view(_h100_file(tmp_path, "p2p", fabric_us=10.5), nodes=2)
    assert extra_latency_us(v, v.route(0, 8, 0)) == pytest.approx(20.0)
    base = plan("send", 1 << 10, (0, 8), preset_view("dgx-h100", nodes=2))
    slow = plan("send", 1 << 10, (0, 8), v)
    assert slow.latency_s - base.latency_s == pytest.approx(20e-6)


def test_latency_moves_small_collectives_not_large_ones(tmp_path):
    """Sensitivity: 0.5 us -> 20 us fabric cables; an 8 KiB all-reduce on 2 DGX H100 nodes
    slows by more than 2x, a 4 GiB one by under 1%."""
    fast = preset_view(_h100_file(tmp_path, "fast", fabric_us=0.5), nodes=2)
    slow = preset_view(_h100_file(tmp_path, "slow", fabric_us=20.0), nodes=2)
    ranks = range(16)
    small = plan("all_reduce", 8 << 10, ranks, slow).time_s / plan("all_reduce", 8 << 10, ranks, fast).time_s
    large = plan("all_reduce", 4 << 30, ranks, slow).time_s / plan("all_reduce", 4 << 30, ranks, fast).time_s
    assert small > 2.0
    assert 1.0 <= large < 1.01


def test_signature_holds_ring_count_and_latencies():
    """The shared-choice key holds what the cost model reads: one distinct ring (NCCL's
    sameChannels) prices broadcast with one hop, several rings with one per rank."""
    v = preset_view("dgx-h100", nodes=2)
    g = analyze(tuple(range(16)), v)
    assert len(g.rings) > 1
    one = replace(g, rings=g.rings[:1])
    assert _signature(one) != _signature(g)
    assert _signature(replace(g, lat_inter_us=1.0)) != _signature(g)
    env = parse_env({"NCCL_PROTO": "LL"})
    assert select("broadcast", 1 << 10, one, env).latency_s < select("broadcast", 1 << 10, g, env).latency_s


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100", "hgx-h20", "l40s-pcie", "dgx-2", "mixed-a100-h100"])
def test_presets_state_no_latency_so_nccl_constants_hold(preset):
    """No preset states a latency: every group of 2 nodes sees no step-latency excess."""
    v = preset_view(preset, nodes=2)
    g = analyze(tuple(range(len(v.gpus))), v)
    assert (g.lat_intra_us, g.lat_inter_us) == (pytest.approx(0.0, abs=1e-9), pytest.approx(0.0, abs=1e-9))
