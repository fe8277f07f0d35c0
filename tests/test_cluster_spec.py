"""heterosim.cluster.spec: the records and their canonical dict (round trips, derived fields)."""

from __future__ import annotations

import pytest
import yaml

from cluster_specs import PRESETS, tiny
from heterosim.cluster.parse import parse_spec, read_spec
from heterosim.cluster.presets import preset_path
from heterosim.errors import TopologyError


@pytest.mark.parametrize("name", PRESETS)
def test_preset_round_trip(name):
    """parse(to_dict(spec)) == spec, also through a YAML dump, for every preset."""
    spec = read_spec(preset_path(name))
    assert parse_spec(spec.to_dict()) == spec
    assert parse_spec(yaml.safe_load(yaml.safe_dump(spec.to_dict()))) == spec
    assert spec.to_dict() == parse_spec(spec.to_dict()).to_dict()


def test_random_values_round_trip():
    """Unit conversions survive the round trip for arbitrary bandwidths and latencies."""
    import random

    rng = random.Random(7)
    for _ in range(50):
        spec = tiny()
        t = spec["node_types"]["box"]
        t["pcie"].update(bw_GBps=rng.uniform(1, 100), latency_us=rng.uniform(0, 3))
        t["nics"] = [{"bw_Gbps": rng.uniform(10, 800), "gpus": [0]}, {"bw_Gbps": 100, "gpus": [1]}]
        t["nvlink"] = {"kind": "nvswitch", "lanes": rng.randint(1, 18), "lane_GBps": rng.uniform(5, 50)}
        spec["fabric"].update(oversubscription=rng.uniform(1, 4), latency_us=rng.uniform(0, 2))
        parsed = parse_spec(spec)
        assert parse_spec(parsed.to_dict()) == parsed


def test_node_type_derived_fields():
    """Switch of each GPU and NIC, NVLink bandwidth per GPU and a GPU's NICs come from the records."""
    t = read_spec(preset_path("dgx-a100")).node_type("dgx-a100")
    assert t.gpu_switch == (0, 0, 1, 1, 2, 2, 3, 3)
    assert t.nic_switch == (0, 0, 1, 1, 2, 2, 3, 3)
    assert t.nvlink_bw == pytest.approx(12 * 25e9)
    assert t.nics_of(5) == (5,)


def test_default_pcie_tree_and_nic_split():
    """Without a listed PCIe tree: one switch per GPU pair over the sockets; NICs split the GPUs."""
    raw = tiny()
    raw["node_types"]["box"].update(gpus_per_node=4, cpu={"sockets": 2},
                                    nics={"count": 2, "bw_Gbps": 100})
    t = parse_spec(raw).node_type("box")
    assert [(s.socket, s.gpus, s.nics) for s in t.switches] == [(0, (0, 1), (0,)), (1, (2, 3), (1,))]
    assert [n.gpus for n in t.nics] == [(0, 1), (2, 3)] and t.nics[0].bw == pytest.approx(12.5e9)


def test_unknown_node_type_lists_the_defined_ones():
    """ClusterSpec.node_type fails loudly and names the node types it has."""
    with pytest.raises(TopologyError, match=r"node type 'gpu-box' is not defined; defined: \['box'\]"):
        parse_spec(tiny()).node_type("gpu-box")
