"""Every c10d op and group form of tests/scripts/c10d_ops.py captures, and the trace replays."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from heterosim.trace.store import load_trace

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("c10d") / "t"
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", "8", "-o", str(out),
                        str(ROOT / "tests" / "scripts" / "c10d_ops.py")], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    return out


def _p2p(role):
    return [(o.name.split(".")[1], o.collective, o.peer, o.comm_bytes, o.coalesced >= 0) for o in role.ops()
            if o.kind == "p2p"]


def test_gather_and_scatter_are_grouped_point_to_point(trace):
    """Root 0 receives 7 x 256 B (gather) and sends 7 x 256 B (scatter), each as one grouped launch;
    another rank sends one message to the root and receives one."""
    t = load_trace(trace)
    root = _p2p(t.roles[0])
    assert root[:7] == [("gather_", "recv", p, 256, p > 1) for p in range(1, 8)]
    assert root[7:14] == [("scatter_", "send", p, 256, p > 1) for p in range(1, 8)]
    assert _p2p(t.roles[3])[:2] == [("gather_", "send", 0, 256, False), ("scatter_", "recv", 0, 256, False)]


def test_collectives_and_mesh_groups(trace):
    t = load_trace(trace)
    colls = [(o.collective, o.comm_bytes, t.groups[o.group].dim, len(t.groups[o.group].ranks))
             for o in t.roles[0].ops() if o.kind == "collective"]
    assert colls == [("broadcast", 256, "world", 8), ("all_to_all", 2048, "world", 8), ("all_gather", 2048, "world", 8),
                     ("reduce_scatter", 2048, "world", 8), ("all_gather", 2048, "world", 8),
                     ("all_to_all", 2048, "world", 8), ("all_reduce", 256, "other", 2), ("all_reduce", 256, "tp", 4),
                     ("all_reduce", 256, "dp", 2), ("barrier", 0, "world", 8)]
    assert t.meta["roles_check"]["result"] == "communication matches once roles were split by program"


def test_replays_without_deadlock(trace):
    p = subprocess.run([sys.executable, "-m", "replay", "simulate", str(trace), "--cluster", "dgx-h100", "--json"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["iteration_time_s"] > 0
