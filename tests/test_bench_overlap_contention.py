"""benchmarks/bench_overlap_contention.py: the table of saved runs (by hand and from the stored H200
runs) and its errors; the measurement itself needs a GPU (docs/replay.md)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_overlap_contention as b  # noqa: E402


def _run(alone, points):
    rows = [{"class": "gemm_bf16", "blocks": 0, "mode": "-", "t_s": alone}]
    rows += [{"class": "gemm_bf16", "blocks": c, "mode": m, "t_s": t, "slowdown": 1 - alone / t}
             for (c, m), t in points.items()]
    return {"schema_version": 1, "sms": 132, "rows": rows}


def test_table_by_hand():
    """2 ms alone; 2.5 ms beside 33 waiting CTAs loses 1 - 2/2.5 = 0.20 of the speed, 4 ms beside
    33 streaming ones 0.50; a second run's 2.2 ms alone and 2.75 ms is again 0.20."""
    one = _run(2e-3, {(33, "spin"): 2.5e-3, (33, "copy"): 4e-3})
    two = _run(2.2e-3, {(33, "spin"): 2.75e-3})
    assert b.table([one, two]).splitlines() == [
        "| class | alone (ms) | 33 CTAs (0.25) |",
        "|---|---|---|",
        "| gemm_bf16 | 2.00/2.20 | 0.20/0.20 · 0.50 |",
    ]


def test_stored_h200_runs(capsys):
    """The table of docs/replay.md regenerates from the stored runs: fp8 GEMMs beside 16 CTAs lose
    0.12 (waiting) and 0.15 (streaming) of their speed, an HBM stream nothing beside waiting CTAs."""
    runs = sorted(str(p) for p in (ROOT / "benchmarks" / "data").glob("overlap_contention_h200_*.json"))
    assert len(runs) == 2
    assert b.main(["--table", *runs]) == 0
    out = capsys.readouterr().out
    fp8 = next(line for line in out.splitlines() if line.startswith("| gemm_fp8 |")).split(" | ")
    assert fp8[4] == "0.12 · 0.15"
    stream = next(line for line in out.splitlines() if line.startswith("| stream |")).split(" | ")
    assert stream[2].startswith("0.00 · ")


def test_not_a_saved_run(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"rows": []}))
    assert b.main(["--table", str(bad)]) == 2
    assert capsys.readouterr().err == (f"bench_overlap_contention: {bad} is not a saved run (schema_version 1 "
                                       f"with rows); write one with --json\n")


def test_unknown_class(capsys):
    assert b.main(["--classes", "gemm_bf16,gemm_fp4"]) == 2
    assert capsys.readouterr().err.startswith("bench_overlap_contention: unknown class 'gemm_fp4'; valid: gemm_bf16, ")


def test_needs_a_gpu(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the measurement would run")
    assert b.main(["--classes", "norm"]) == 2
    assert capsys.readouterr().err == ("bench_overlap_contention needs a CUDA GPU, CuPy and NVML (nvidia-ml-py): "
                                       "no CUDA GPU found\n")
