"""The standalone single-rank worker: writes the rank's JSON, or the script's error and status 3."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "scripts" / "tiny_tp.py")


def run(out, *extra):
    return subprocess.run([sys.executable, "-m", "capture.worker", "--rank", "1", "--world-size", "4",
                           "--nproc-per-node", "4", "--out-dir", str(out), "--", TINY, *extra],
                          capture_output=True, text=True, cwd=ROOT)


def test_worker_writes_rank_json_and_reports_failures(tmp_path):
    """Success: rank_1.json holds rank 1's groups; failure: exit 3 with the script's exception."""
    p = run(tmp_path / "ok")
    assert p.returncode == 0, p.stderr
    d = json.loads((tmp_path / "ok" / "rank_1.json").read_text())
    assert d["rank"] == 1 and [g[1] for g in d["groups"]][:2] == [[0, 1, 2, 3], [0, 1]]
    p = run(tmp_path / "bad", "--fail")
    assert p.returncode == 3 and "RuntimeError: tiny_tp was asked to fail" in p.stderr
    assert not (tmp_path / "bad" / "rank_1.json").exists()
