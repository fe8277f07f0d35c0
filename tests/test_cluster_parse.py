"""heterosim.cluster.parse: schema validation (key paths, versions, values) and the YAML files."""

from __future__ import annotations

import pytest
import yaml

from cluster_specs import PRESETS, tiny
from heterosim.cluster.parse import parse_spec, read_spec, write_spec
from heterosim.cluster.presets import preset_path
from heterosim.errors import TopologyError


def test_unknown_key_names_path():
    """Unknown keys name their key path and the valid keys."""
    spec = tiny()
    spec["node_types"]["box"]["pcie"]["speed"] = 3
    with pytest.raises(TopologyError, match=r"node_types.box.pcie: unknown key 'speed'; valid keys: "
                                            r"\['bw_GBps', 'gen', 'latency_us', 'switches', 'width'\]"):
        parse_spec(spec)
    with pytest.raises(TopologyError, match=r"cluster spec: unknown key 'nodes'"):
        parse_spec(tiny(nodes=3))


def test_schema_version_checked():
    """Only schema_version 1 loads; a missing one is a missing key."""
    with pytest.raises(TopologyError, match="schema_version 2 is not supported; this HeteroSim reads "
                                            "schema_version 1"):
        parse_spec(tiny(schema_version=2))
    spec = tiny()
    del spec["schema_version"]
    with pytest.raises(TopologyError, match="missing key 'schema_version'"):
        parse_spec(spec)


def test_value_errors():
    """Bad values are caught with their key path: negative bandwidth, bad PCIe gen, bad fabric."""
    spec = tiny()
    spec["node_types"]["box"]["nics"] = {"count": 2, "bw_Gbps": -1}
    with pytest.raises(TopologyError, match=r"node_types.box.nics.bw_Gbps: must be > 0, got -1"):
        parse_spec(spec)
    spec = tiny()
    spec["node_types"]["box"]["pcie"]["gen"] = 7
    with pytest.raises(TopologyError, match=r"unknown PCIe generation 7; valid: \[1, 2, 3, 4, 5, 6\]"):
        parse_spec(spec)
    with pytest.raises(TopologyError, match=r"fabric.kind: unknown 'torus'; valid: \['rail_optimized', "
                                            r"'leaf_spine', 'explicit', 'none'\]"):
        parse_spec(tiny(fabric={"kind": "torus"}))
    with pytest.raises(TopologyError, match=r"fabric.routing: unknown 'random'; valid: \['ecmp', 'adaptive'\]"):
        parse_spec(tiny(fabric={"kind": "rail_optimized", "routing": "random"}))
    assert parse_spec(tiny(fabric={"kind": "leaf_spine", "routing": "adaptive"})).fabric.routing == "adaptive"
    spec = tiny()
    spec["node_types"]["box"]["nics"] = {"count": 3, "bw_Gbps": 100}
    with pytest.raises(TopologyError, match="3 NICs cannot split 2 GPUs evenly"):
        parse_spec(spec)


def test_pcie_switch_membership_checked():
    """Every GPU and NIC hangs off exactly one listed PCIe switch."""
    spec = tiny()
    spec["node_types"]["box"]["pcie"]["switches"] = [{"socket": 0, "gpus": [0], "nics": [0, 1]}]
    with pytest.raises(TopologyError, match="GPU 1 hangs off 0 PCIe switches; every GPU must be "
                                            "listed under exactly one switch"):
        parse_spec(spec)


def test_read_spec_errors_name_the_file(tmp_path):
    """read_spec reads a YAML file like the dict; its errors name the file."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny()))
    assert read_spec(path) == parse_spec(tiny())
    path.write_text("schema_version: 1\nname: [unclosed\n")
    with pytest.raises(TopologyError, match=f"cluster file {path}: not valid YAML"):
        read_spec(path)
    bad = tiny()
    bad["fabric"]["spine"] = 2
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(TopologyError, match=f"cluster file {path}: fabric: unknown key 'spine'"):
        read_spec(path)


@pytest.mark.parametrize("name", PRESETS)
def test_write_spec_byte_identical(name, tmp_path):
    """write_spec is deterministic and read_spec(write_spec(s)) == s."""
    spec = read_spec(preset_path(name))
    a, b = write_spec(spec, tmp_path / "a.yaml"), write_spec(spec, tmp_path / "b.yaml")
    assert a.read_bytes() == b.read_bytes()
    assert read_spec(a) == spec
    assert write_spec(read_spec(a), tmp_path / "c.yaml").read_bytes() == a.read_bytes()


def _a100(edit):
    spec = yaml.safe_load(preset_path("dgx-a100").read_text())
    edit(spec["node_types"]["dgx-a100"])
    return spec


@pytest.mark.parametrize("edit, message", [
    (lambda t: t["nvlink"].update(lane_GBps=float("inf")),
     "node_types.dgx-a100.nvlink.lane_GBps: must be a finite number, got inf"),
    (lambda t: t["nics"].update(bw_Gbps=1e-300),
     r"node_types.dgx-a100.nics.bw_Gbps: 1e-300 Gb/s is outside the physical range 0.008..8e\+06 Gb/s"),
    (lambda t: t["nics"].update(bw_Gbps=float("inf")), "node_types.dgx-a100.nics.bw_Gbps: must be a finite number"),
    (lambda t: t["nvlink"].update(latency_us=float("nan")), "node_types.dgx-a100.nvlink.latency_us: must be a finite"),
    (lambda t: t["pcie"].update(latency_us=5e6), r"latency_us: 5000000.0 us is outside the physical range 0..1e\+06 us"),
])
def test_numbers_must_be_finite_and_physical(edit, message):
    """Infinite, NaN and absurd bandwidths or latencies are one TopologyError naming key and unit."""
    with pytest.raises(TopologyError, match=message):
        parse_spec(_a100(edit))


def test_a_cluster_past_a_million_gpus_is_refused_before_it_is_built():
    import time

    from heterosim.cluster import load_cluster

    t0 = time.monotonic()
    with pytest.raises(TopologyError, match=r"^cluster 'dgx-a100' would have 800,000,000 GPUs; HeteroSim builds "
                                            r"clusters of at most 1,048,576 GPUs: use fewer nodes$"):
        load_cluster("dgx-a100", num_gpus=800_000_000)
    assert time.monotonic() - t0 < 5


def test_fuzzed_cluster_file_gives_a_cluster_or_a_typed_error():
    """Any value at any path of a preset: parsing and building a 16-GPU cluster raise only
    HeteroSimError, in bounded time."""
    pytest.importorskip("hypothesis")
    import time

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from fuzzing import mutated
    from heterosim.cluster import load_cluster
    from heterosim.errors import HeteroSimError

    docs = [yaml.safe_load(preset_path(n).read_text()) for n in ("dgx-a100", "mixed-a100-h100", "l40s-pcie")]

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def check(data):
        doc = mutated(data, data.draw(st.sampled_from(docs)))
        t0 = time.monotonic()
        try:
            load_cluster(parse_spec(doc), num_gpus=16)
        except HeteroSimError:
            pass
        assert time.monotonic() - t0 < 5

    check()


def test_an_accelerator_defined_in_the_file_round_trips_and_is_checked():
    """A cluster file's gpus: section survives write/parse; a NaN peak names the entry and unit."""
    from test_replay_cli import ACME

    spec = tiny(gpus=[ACME])
    spec["node_groups"][0]["gpu"] = "ACME-X1"
    parsed = parse_spec(spec)
    assert parse_spec(parsed.to_dict()) == parsed and parsed.gpus[0]["name"] == "ACME-X1"
    bad = dict(ACME, peak_TFLOPs=dict(ACME["peak_TFLOPs"], bf16=float("nan")))
    with pytest.raises(TopologyError, match=r"^gpus\[0\]: ACME-X1: peak_TFLOPs.bf16 must be a finite number > 0 "
                                            r"TFLOP/s, got nan$"):
        parse_spec(tiny(gpus=[bad]))
