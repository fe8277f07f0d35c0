"""``python -m kernel_db`` end to end: gpus, show, price (table and --json), profile --device cpu, calibrate.

Most tests call ``kernel_db.__main__.main`` in-process (same argv, same output); one runs the module
as a subprocess to pin the ``python -m`` entry point."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from heterosim.trace.store import write_trace

from test_kernel_db_profile import small_trace

ROOT = Path(__file__).resolve().parents[1]


def run_subprocess(*args):
    env = dict(os.environ)
    env.pop("HETEROSIM_KERNEL_DB", None)
    return subprocess.run([sys.executable, "-m", "kernel_db", *args], capture_output=True, text=True, cwd=ROOT, env=env)


def run(*args):
    """In-process ``main(args)``; returns an object with returncode, stdout, stderr like subprocess."""
    import contextlib
    import io
    import types

    from kernel_db.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(args))
        except SystemExit as e:  # argparse errors
            rc = e.code
    return types.SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue())


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    return str(write_trace(small_trace(), tmp_path_factory.mktemp("t") / "trace"))


def test_gpus_lists_catalogue():
    """`python -m kernel_db gpus` prints every catalogue GPU; --json gives datasheet figures with sources."""
    p = run_subprocess("gpus")
    assert p.returncode == 0 and "H100-SXM5-80GB" in p.stdout and "MI300X" in p.stdout
    doc = json.loads(run("gpus", "--json").stdout)
    h100 = next(g for g in doc if g["name"] == "H100-SXM5-80GB")
    assert h100["peak_TFLOPs"]["bf16"] == pytest.approx(989.4) and h100["sources"]
    assert (h100["tensor_clock_ratio"], h100["board_spread"]) == (0.86, 0.015)  # measured; gpus.yaml [BOARD-SPREAD]
    a100 = next(g for g in doc if g["name"] == "A100-SXM4-80GB")
    assert (a100["tensor_clock_ratio"], a100["board_spread"]) == (1.0, 0.0)  # holds boost: no spread
    h100_line = next(line for line in p.stdout.splitlines() if line.startswith("H100-SXM5-80GB "))
    assert h100_line.split()[-2:] == ["0.860", "1.5%"]


def test_price_json_roofline_then_measured(trace_dir, tmp_path):
    """Without a DB every second is roofline; after `profile --device cpu`, pricing on cpu is all measured."""
    db = str(tmp_path / "k.csv")
    p = run("price", trace_dir, "--gpu", "H100", "--db", db, "--json")
    assert (p.returncode, p.stderr.strip()) == (2, f"error: kernel DB {db} does not exist; create it with python -m "
                                                   "kernel_db profile --db FILE, or leave the option out to price by "
                                                   "roofline")
    doc = json.loads(run("price", trace_dir, "--gpu", "H100", "--json").stdout)
    assert set(doc["seconds_by_source"]) == {"roofline"}
    assert doc["compute_seconds_per_role"]["0"] == pytest.approx(doc["seconds_by_source"]["roofline"])
    p = run("profile", trace_dir, "--device", "cpu", "--db", db, "--warmup", "1", "--repeats", "3")
    assert p.returncode == 0, p.stderr
    assert "CPU-host: measured 5, already in DB 0, failed 0" in p.stdout
    doc = json.loads(run("price", trace_dir, "--gpu", "cpu", "--db", db, "--json").stdout)
    assert doc["fraction_by_source"] == {"measured": pytest.approx(1.0)}
    table = run("price", trace_dir, "--gpu", "cpu", "--db", db).stdout
    assert "measured" in table and "aten.mm.default" in table
    assert "CPU-host  profile:cpu" in run("show", "--db", db).stdout


def test_profile_without_gpu_exits_nonzero(trace_dir, tmp_path):
    """Profiling for CUDA on a CPU-only host says so and exits 2."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    p = run("profile", trace_dir, "--db", str(tmp_path / "k.csv"))
    assert p.returncode == 2 and "error: no CUDA GPU is visible to torch" in p.stderr


def test_bad_inputs(trace_dir):
    """Unknown GPU and a profile without TRACE/--sweep each give one clear error and exit 2."""
    p = run("price", trace_dir, "--gpu", "Q8000")
    assert p.returncode == 2 and "error: unknown GPU 'Q8000'; known GPUs:" in p.stderr
    p = run("profile")
    assert p.returncode == 2 and "profile needs exactly one of TRACE or --sweep KIND" in p.stderr


def test_calibrate_on_cpu_sweep(tmp_path):
    """calibrate reads a DB, prints fits with k-fold error, and writes a loadable efficiency YAML."""
    db = str(tmp_path / "k.csv")
    assert run("profile", "--sweep", "gemm", "--sizes", "32,64", "--dtype", "fp32", "--device", "cpu", "--db", db,
               "--warmup", "0", "--repeats", "2").returncode == 0
    out = str(tmp_path / "eff.yaml")
    p = run("calibrate", "--db", db, "--k", "2", "--out", out, "--json")
    assert p.returncode == 0, p.stderr
    fit = json.loads(p.stdout)["fits"][0]
    assert (fit["gpu"], fit["kernel_class"], fit["rows"]) == ("CPU-host", "gemm", 8)
    assert Path(out).read_text().startswith("arch:")


def test_profile_cpu_on_a_captured_trace(tmp_path):
    """A real `python -m capture` trace (tests/scripts/tiny_tp.py, 4 ranks): profile --device cpu fills a DB
    with every distinct kernel, and price on cpu then takes all of its time from source measured."""
    trace = tmp_path / "tiny"
    cap = subprocess.run([sys.executable, "-m", "capture", "--world-size", "4", "-o", str(trace),
                          str(ROOT / "tests" / "scripts" / "tiny_tp.py")], capture_output=True, text=True, cwd=ROOT)
    assert cap.returncode == 0, cap.stderr
    db = str(tmp_path / "k.csv")
    p = run("profile", str(trace), "--device", "cpu", "--db", db, "--warmup", "1", "--repeats", "3")
    assert p.returncode == 0 and "failed 0" in p.stdout, p.stdout + p.stderr
    doc = json.loads(run("price", str(trace), "--gpu", "cpu", "--db", db, "--json").stdout)
    assert doc["fraction_by_source"] == {"measured": pytest.approx(1.0)}
    assert doc["compute_seconds_per_role"]["0"] > 0


def test_bad_numbers_and_a_damaged_dims_row(trace_dir, tmp_path):
    """--top -5, --k 0 and --sizes 12,abc are one error each; a row with broken dims JSON names its line."""
    for args, message in [
        (["price", trace_dir, "--gpu", "H100", "--top", "-5"], "error: --top must be >= 0 kernels, got -5"),
        (["calibrate", "--k", "0"], "error: --k must be >= 2 folds (k-fold cross-validation), got 0"),
        (["profile", "--sweep", "gemm", "--sizes", "12,abc", "--device", "cpu"],
         "error: --sizes '12,abc': 'abc' is not a positive integer; write e.g. 256,512"),
    ]:
        p = run(*args)
        assert (p.returncode, p.stderr.strip().splitlines()[-1]) == (2, message)
    db = tmp_path / "k.csv"
    p = run("profile", trace_dir, "--device", "cpu", "--db", str(db), "--warmup", "1", "--repeats", "2")
    assert p.returncode == 0, p.stderr
    lines = db.read_text().splitlines()
    lines[2] = lines[2].replace('{"', '{{"', 1)
    db.write_text("\n".join(lines) + "\n")
    for cmd in (["price", trace_dir, "--gpu", "cpu"], ["calibrate"]):
        p = run(*cmd, "--db", str(db))
        assert p.returncode == 2 and f"{db}: line 3: dims" in p.stderr and "is not a JSON object" in p.stderr
