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
