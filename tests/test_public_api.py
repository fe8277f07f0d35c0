"""The notebook API: ``from capture import capture``, ``from replay import simulate``, DataFrames."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "scripts" / "tiny_tp.py"


def test_capture_then_simulate_then_dataframe(tmp_path):
    """Capture a 8-rank script, replay it on dgx-a100, and read per-op times as a table."""
    from capture import capture
    from replay import simulate

    out = capture(str(TINY), [], tmp_path / "t", world_size=8)
    r = simulate(out, "dgx-a100")
    ops = r.to_dataframe("ops")
    assert set(ops["rank"]) == {min(c.ranks) for c in r.classes}
    assert (ops["end_s"] >= ops["start_s"]).all() and ops["end_s"].max() <= r.iteration_time_s * (1 + 1e-12)
    assert r.to_dataframe("ranks")["rank"].tolist() == list(range(8))


def test_importing_the_packages_loads_no_torch():
    """``import capture`` and ``import replay`` stay light: torch loads only when capturing."""
    code = "import sys, capture, replay, heterosim.trace; print('torch' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"


def test_a_script_error_says_why_in_the_exception(tmp_path):
    """A script that exits through argparse: the ScriptError a notebook sees carries its message."""
    import pytest

    from capture import capture
    from heterosim.errors import ScriptError

    script = tmp_path / "bad_args.py"
    script.write_text("import argparse\nargparse.ArgumentParser(prog='bad').parse_args(['--nope'])\n")
    with pytest.raises(ScriptError, match=r"exited with status 2 as rank 0; its last error output:\n(.|\n)*"
                                          r"  bad: error: unrecognized arguments: --nope"):
        capture(str(script), [], tmp_path / "t", world_size=2)
    assert not (tmp_path / "t").exists()
