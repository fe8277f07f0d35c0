"""``python -m capture`` end to end on a tiny hand-written TP/DP script (tests/scripts/tiny_tp.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from heterosim.trace.store import load_trace

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "scripts" / "tiny_tp.py")


def run(*args, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "capture", *args], capture_output=True, text=True, cwd=ROOT, env=e)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("cap") / "tiny"
    p = run("--world-size", "4", "-o", str(out), TINY)
    assert p.returncode == 0, p.stderr
    return out


def test_trace_contents(tiny):
    """Hand-computed totals: 3 micro-batches of a 64-wide 2-GEMM MLP on 4 ranks, TP2 all-reduces, DP grad sync."""
    t = load_trace(tiny)
    assert t.world_size == 4 and len(t.roles) == 1 and t.roles[0].ranks == (0, 1, 2, 3)
    assert {g.dim for g in t.groups.values()} == {"world", "tp", "dp"}
    p = run("--inspect", str(tiny), "--json")
    s = json.loads(p.stdout)
    # per rank per micro-batch: fwd 2 GEMMs of 2*4*64*64, bwd 3 GEMMs; 3 micro-batches, 4 ranks
    assert s["model_flops"] == 4 * 3 * 5 * 2 * 4 * 64 * 64
    # TP: one all-reduce of y (4x64 bf16 = 512 B) per micro-batch; DP: w1.grad (64x64 bf16) once
    assert s["comm_bytes_by_dim"] == {"dp": 4 * 8192, "tp": 4 * 3 * 512}
    assert s["roles"][0]["comm_calls_by_dim"] == {"dp": 1, "tp": 3}


def test_blocks_are_referenced_not_repeated(tiny):
    """The first micro-batch's forward block is reused; the async DP all-reduce is waited later."""
    role = load_trace(tiny).roles[0]
    blocks = [s.block for s in role.program]
    assert len(set(blocks)) < len(blocks)
    ops = role.ops()
    ar = [o for o in ops if o.phase == "grad_sync" and o.kind == "collective"]
    waits = [o for o in ops if o.kind == "wait" and o.target == ar[0].id]
    assert len(ar) == 1 and len(waits) == 1 and waits[0].id > ar[0].id
    assert [o.mb for o in ops if o.kind == "collective" and o.phase == "fwd"] == [0, 1, 2]


def test_captures_are_byte_identical(tiny, tmp_path):
    """Two captures of the same command give byte-identical traces."""
    p = run("--world-size", "4", "-o", str(tmp_path / "again"), TINY)
    assert p.returncode == 0, p.stderr
    for f in sorted(x.relative_to(tiny) for x in tiny.rglob("*") if x.is_file()):
        assert (tiny / f).read_bytes() == (tmp_path / "again" / f).read_bytes(), f


def test_ranks_all_matches_auto(tiny, tmp_path):
    """--ranks all finds the same single role (identical programs up to group membership)."""
    p = run("--world-size", "4", "--ranks", "all", "-o", str(tmp_path / "all"), TINY)
    assert p.returncode == 0, p.stderr
    a, b = load_trace(tiny), load_trace(tmp_path / "all")
    assert [r.ranks for r in a.roles] == [r.ranks for r in b.roles]
    assert [o.name for o in a.roles[0].ops()] == [o.name for o in b.roles[0].ops()]


def test_failing_script_leaves_no_trace(tmp_path):
    """A script that raises: non-zero exit, its traceback on stderr, nothing written."""
    out = tmp_path / "never"
    p = run("--world-size", "2", "-o", str(out), TINY, "--fail")
    assert p.returncode == 1
    assert "RuntimeError: tiny_tp was asked to fail" in p.stderr and "Traceback" in p.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_bad_sizes_and_ranks(tmp_path):
    """World sizes that do not divide and ranks outside the world get one clear error."""
    p = run("--world-size", "6", "--nproc-per-node", "4", "-o", str(tmp_path / "x"), TINY)
    assert p.returncode == 2
    assert "world size 6 is not a multiple of --nproc-per-node 4" in p.stderr
    p = run("--world-size", "4", "--ranks", "0,9", "-o", str(tmp_path / "x"), TINY)
    assert p.returncode == 2 and "ranks [9] are outside the world (0..3)" in p.stderr
    p = run("--world-size", "4", "-o", str(tmp_path / "x"), "no_such_script.py")
    assert p.returncode == 2 and "script 'no_such_script.py' does not exist" in p.stderr


def _tree(p):
    return sorted(str(x.relative_to(p)) for x in p.rglob("*"))


@pytest.mark.parametrize("make, message", [
    ("dir", "is a directory that is not a HeteroSim trace; it is left as it is"),
    ("file", "is a regular file, not a HeteroSim trace; pass --force to replace it"),
    ("devlink", "is a symlink; the HeteroSim trace is not written through it"),
])
def test_output_that_is_not_a_trace_is_refused_and_kept(tmp_path, make, message):
    """-o onto a user's directory, a regular file or a symlink to a device: exit 2, one line, intact."""
    out = tmp_path / "out"
    if make == "dir":
        out.mkdir()
        (out / "results.csv").write_text("a,b\n1,2\n")
    elif make == "file":
        out.write_text("my notes")
    else:
        out.symlink_to("/dev/null")
    before = _tree(tmp_path)
    p = run("--world-size", "4", "-o", str(out), TINY)
    assert p.returncode == 2
    assert p.stderr.startswith(f"error: output {out} {message}") and len(p.stderr.strip().splitlines()) == 1
    assert _tree(tmp_path) == before
    if make == "dir":
        assert (out / "results.csv").read_text() == "a,b\n1,2\n"
    elif make == "file":
        assert out.read_text() == "my notes"
    else:
        assert os.readlink(out) == "/dev/null" and Path("/dev/null").is_char_device()


def test_force_replaces_a_file_and_a_previous_trace_is_replaced(tiny, tmp_path):
    """--force lets a trace replace a regular file; a previous trace is replaced without it."""
    out = tmp_path / "out"
    out.write_text("old")
    p = run("--world-size", "4", "--force", "-o", str(out), TINY)
    assert p.returncode == 0, p.stderr
    assert load_trace(out).world_size == 4
    p = run("--world-size", "4", "-o", str(out), TINY)
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out"]


def test_bad_numbers_are_refused_before_any_work(tmp_path):
    """Negative jobs, a rank range past the world and a non-positive time limit: exit 2, at once."""
    import time

    for args, message in [
        (["-j", "-3"], "error: --jobs must be >= 1 worker process, got -3"),
        (["--ranks", "0-99999999999"], "error: --ranks '0-99999999999': ranks [99999999999] are outside the world (0..3)"),
        (["--timeout", "0"], "error: --timeout must be a positive number of seconds per rank, got 0.0"),
        (["--world-size", "2000000"], "error: --world-size must be between 1 and 1,048,576 ranks, got 2000000"),
    ]:
        t0 = time.monotonic()
        argv = args if "--world-size" in args else ["--world-size", "4", *args]
        p = run(*argv, "-o", str(tmp_path / "x"), TINY)
        assert (p.returncode, p.stderr.strip()) == (2, message)
        assert time.monotonic() - t0 < 10
    assert list(tmp_path.iterdir()) == []


def test_a_rank_that_never_ends_is_stopped_by_the_timeout(tmp_path):
    """A script looping forever: --timeout 2 stops the capture with one error, nothing written."""
    import time

    script = tmp_path / "loop.py"
    script.write_text("while True:\n    pass\n")
    t0 = time.monotonic()
    p = run("--world-size", "2", "--timeout", "2", "-o", str(tmp_path / "x"), str(script))
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == (
        "error: capturing rank 0 did not finish within 2 s; it was stopped (raise the time limit, e.g. "
        "capture --timeout, if it needs longer)")
    # Bounded (the loop never ends by itself); the bound leaves room for torch's import on a loaded CI host.
    assert time.monotonic() - t0 < 120 and not (tmp_path / "x").exists()


def test_inspect_into_a_closed_pipe_is_quiet(tiny):
    """``capture --inspect T | head -0``: the reader is gone before we write; no traceback, exit 0."""
    r, w = os.pipe()
    os.close(r)
    p = subprocess.run([sys.executable, "-m", "capture", "--inspect", str(tiny)], stdout=w, stderr=subprocess.PIPE,
                       text=True, cwd=ROOT)
    os.close(w)
    assert (p.returncode, p.stderr) == (0, "")


def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    """SIGINT during a capture: 'interrupted; nothing was written', exit 130, no worker left, no output."""
    import signal
    import time

    script = tmp_path / "loop.py"
    running = tmp_path / "running"  # written by the script once a worker runs it
    script.write_text(f"import time\nopen({str(running)!r}, 'w').close()\nwhile True:\n    time.sleep(0.1)\n")
    out = tmp_path / "x"
    # A test run started in the background (``.ci/run &``) inherits SIGINT ignored, as a shell does
    # for asynchronous commands; the capture must see it as a terminal's Ctrl-C would arrive.
    p = subprocess.Popen([sys.executable, "-m", "capture", "--world-size", "2", "-o", str(out), str(script)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, TQDM_DISABLE="1"),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300  # a loaded CI machine may take long to import torch and fork
    while not running.exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.2)
    assert running.exists(), "the capture never started the script"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130
    assert err.strip().splitlines()[-1] == "error: interrupted; nothing was written"
    # Nothing of the capture's left beside the script (and the marker, which every rank's run writes).
    assert not out.exists() and sorted(x.name for x in tmp_path.iterdir()) == ["loop.py", "running"]


def test_the_users_own_models_package_wins(tmp_path):
    """A script beside its own ``models`` package (with ``build``) captures: capture put none of
    HeteroSim's top-level packages into the script's namespace first."""
    script = ROOT / "tests" / "scripts" / "own_models" / "train.py"
    p = run("--world-size", "2", "-o", str(tmp_path / "t"), str(script))
    assert p.returncode == 0, p.stderr
    s = json.loads(run("--inspect", str(tmp_path / "t"), "--json").stdout)
    assert s["comm_bytes_by_dim"] == {"world": 2 * 4 * (64 * 64 + 64) * 2}  # 2 ranks x 4 fp32 grads
