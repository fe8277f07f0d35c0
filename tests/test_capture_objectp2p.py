"""Python objects between fake ranks (capture/objectp2p.py): tests/scripts/object_p2p.py."""

import os
import subprocess
import sys
from pathlib import Path

from heterosim.trace.store import load_trace

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "object_p2p.py"
B, K, N = 24, 40, 56


def _capture(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "capture", "--world-size", "4", "-o", str(tmp_path / "t"),
                           str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, env=dict(os.environ))


def test_a_stage_receives_what_its_peer_sent(tmp_path):
    """Rank 2 (stage 1) receives the shape rank 0 sent: its GEMM is [24, 40] x [40, 56]; the
    object's two receives (sizes, then bytes) match the two sends."""
    p = _capture(tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    t = load_trace(tmp_path / "t")
    assert [r.ranks for r in t.roles] == [(0, 1), (2, 3)]
    assert t.meta["roles_check"]["result"] == "communication matches"
    gemms = [o for o in t.roles[1].ops() if o.kernel_class == "gemm"]
    assert [o.flops for o in gemms] == [2 * B * K * N]  # 107,520
    sends = [o.collective for o in t.roles[0].ops() if o.kind == "p2p"]
    recvs = [o.collective for o in t.roles[1].ops() if o.kind == "p2p"]
    assert (sends, recvs) == (["send", "send"], ["recv", "recv"])


def test_an_object_from_a_rank_not_yet_run_is_a_clear_error(tmp_path):
    """Rank 0 runs alone first: an object it receives from rank 2 was never sent."""
    p = _capture(tmp_path, "--backwards")
    assert p.returncode != 0
    assert "rank 0 receives a Python object (recv_object_list) from rank 2, which no rank captured" in p.stderr
