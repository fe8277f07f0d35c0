"""python -m ncclshim: the bench command line."""

import json

from ncclshim.__main__ import main


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


def test_cluster_sized_by_nodes(capsys):
    """--nodes N gives N nodes of a preset (of each node group of a mixed one)."""
    assert main(["bench", "--cluster", "dgx-h100", "--nodes", "2", "--min-bytes", "1M", "--max-bytes", "1M",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"] == 16
    assert main(["bench", "--cluster", "mixed-a100-h100", "--min-bytes", "1M", "--max-bytes", "1M", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"] == 16 and out["cluster"] == "mixed-a100-h100"


def test_bench_reads_a_cluster_file(tmp_path, capsys):
    """--cluster takes a cluster YAML file as well as a preset name."""
    from heterosim.cluster import preset_path

    path = tmp_path / "mine.yaml"
    path.write_text(preset_path("l40s-pcie").read_text().replace("name: l40s-pcie", "name: mine"))
    assert main(["bench", "--cluster", str(path), "--nodes", "3", "--min-bytes", "1M", "--max-bytes", "1M",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cluster"] == "mine" and out["gpus"] == 24


def test_nodes_must_be_positive(capsys):
    """--nodes 0 is one error line and exit status 2."""
    assert main(["bench", "--cluster", "dgx-a100", "--nodes", "0"]) == 2
    assert "error: --nodes must be >= 1, got 0" in capsys.readouterr().err


def test_sweeps_prints_a_table_per_sweep(capsys):
    """`sweeps` compares ncclshim with the shipped published sweeps (six: NVLS x2, NCCL's default choice,
    ring all-reduce, reduce-scatter, all-gather), one markdown table each."""
    assert main(["sweeps"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# tolerance 5%")
    assert text.count("| size | measured us |") == 6 and "| 16 GiB |" in text and "| figure |" in text


def test_sweeps_bad_file_exits_2(tmp_path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text("schema_version: 7\n")
    assert main(["sweeps", str(f)]) == 2
    assert "schema_version 7 is not supported" in capsys.readouterr().err
