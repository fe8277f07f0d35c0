"""python -m ncclshim: the bench command line."""

import json

from ncclshim.__main__ import main, resolve_cluster


def test_bench_json(capsys):
    """--json prints one object with a schema version and one row per size."""
    rc = main(["bench", "--cluster", "dgx-a100", "--nodes", "2", "--op", "all_reduce", "--min-bytes", "1M",
               "--max-bytes", "4M", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["schema_version"] == 1 and out["gpus"] == 16
    assert [r["size_bytes"] for r in out["rows"]] == [1 << 20, 1 << 21, 1 << 22]


def test_bench_table(capsys):
    """Without --json the nccl-tests-like table is printed."""
    assert main(["bench", "--cluster", "dgx-h100", "--op", "all_reduce", "--min-bytes", "1G", "--max-bytes", "1G"]) == 0
    text = capsys.readouterr().out
    assert "NVLS" in text and text.startswith("# all_reduce on")


def test_bench_errors_exit_2(capsys):
    """Bad input: exit status 2 and one line on stderr."""
    assert main(["bench", "--cluster", "nope", "--op", "all_reduce"]) == 2
    assert "error: cluster 'nope' is neither a preset" in capsys.readouterr().err
    assert main(["bench", "--cluster", "dgx-a100", "--op", "gather"]) == 2
    assert "--op 'gather' is not a collective" in capsys.readouterr().err


def test_cluster_resolution_sizes_nodes():
    """A preset resolves (through replay when importable) to nodes x 8 GPUs."""
    assert len(resolve_cluster("dgx-h100", 2).gpus) == 16


def test_cluster_resolution_without_replay(monkeypatch):
    """Without replay importable, the built-in presets serve --cluster."""
    import sys

    monkeypatch.setitem(sys.modules, "replay.cluster", None)
    view = resolve_cluster("l40s-pcie", 3)
    assert view.name == "l40s-pciex3" and len(view.gpus) == 24


def test_mixed_replay_preset_takes_nodes_per_group():
    """--nodes N on a mixed replay preset means N nodes of each node group."""
    import pytest

    cluster = pytest.importorskip("replay.cluster")
    del cluster
    view = resolve_cluster("mixed-a100-h100", 1)
    assert len(view.gpus) == 16 and {g.sm for g in view.gpus} == {80, 90}
