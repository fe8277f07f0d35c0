"""--ranks auto: roles from pipeline and context-parallel positions, and the communication check
(capture/rolecheck.py) that makes auto capture more ranks instead of merging programs that differ."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capture.fakeworld import GroupRecord
from capture.rolecheck import CommSignature, check_roles
from capture.roles import roles_from_groups
from heterosim.trace.store import load_trace

ROOT = Path(__file__).resolve().parents[1]


def _run(*args):
    p = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    return p


def test_roles_split_by_pipeline_and_context_parallel_position():
    """World 8, pp groups (0,4) (1,5) (2,6) (3,7) and cp groups (0,1) (2,3) (4,5) (6,7): 4 roles."""
    groups = [GroupRecord("0", tuple(range(8)), "world", "world")]
    groups += [GroupRecord(str(1 + i), (i, i + 4), "f0", "pp") for i in range(4)]
    groups += [GroupRecord(str(5 + i), (2 * i, 2 * i + 1), "f1", "cp") for i in range(4)]
    assert roles_from_groups(groups, 8) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert roles_from_groups(groups[:1], 8) == [tuple(range(8))]


def test_check_roles_finds_what_replay_would_not_match():
    pairs = [GroupRecord("1", (0, 1), "f0"), GroupRecord("2", (2, 3), "f0")]
    send = CommSignature(sends={"f0": {1: (64,)}})
    recv = CommSignature(recvs={"f0": {0: (64,)}})
    assert check_roles(pairs, [(0, 2), (1, 3)], [send, recv]) == (set(), [])
    bad, problems = check_roles(pairs, [(0, 1, 2, 3)], [send])
    assert bad == {0}
    assert problems[:2] == ["rank 0 sends 1 messages to/from rank 1 on group 1, which receives 0 (sizes [64] vs [])",
                            "rank 1 sends 1 messages on group 1 (ranks 0,1) with position 1, which is itself"]
    ar = CommSignature(collectives={"f0": (("all_reduce", 8, "fp32"),)})
    bad, problems = check_roles(pairs, [(0, 2), (1, 3)], [ar, CommSignature()])
    assert bad == {0, 1} and problems[0] == "collectives on group 1 (ranks 0,1) differ between roles (role 0: 1, role 1: 0)"


def test_even_ranks_send_odd_ranks_receive(tmp_path):
    """auto starts from one role; the check captures the other ranks and splits even from odd."""
    out = tmp_path / "t"
    _run("capture", "--world-size", "8", "-o", str(out), str(ROOT / "tests" / "scripts" / "even_odd_p2p.py"))
    t = load_trace(out)
    assert [r.ranks for r in t.roles] == [(0, 2, 4, 6), (1, 3, 5, 7)]
    check = t.meta["roles_check"]
    assert check["extra_ranks_captured"] == 7 and check["result"].startswith("communication matches once roles")
    assert [o.collective for o in t.roles[1].ops() if o.kind == "p2p"] == ["recv", "recv"]
    r = json.loads(_run("replay", "simulate", str(out), "--cluster", "dgx-h100", "--json").stdout)
    assert r["iteration_time_s"] > 0


@pytest.mark.parametrize("mode", ["p2p", "a2a", "all_gather"])
def test_context_parallel_positions_are_roles(tmp_path, mode):
    """Megatron-style CP 2: even CP positions send first on the ring and hold other causal blocks,
    so each position is a role; the check passes with no extra capture and replay has no deadlock."""
    out = tmp_path / "t"
    _run("capture", "--world-size", "8", "-o", str(out), str(ROOT / "models" / "pretrain_gpt.py"), "--preset", "tiny",
         "--num-layers", "2", "--micro-batch-size", "1", "--global-batch-size", "4", "--bf16",
         "--context-parallel-size", "2", "--cp-comm-type", mode, "--train-iters", "1")
    t = load_trace(out)
    assert [r.ranks for r in t.roles] == [(0, 2, 4, 6), (1, 3, 5, 7)]
    assert t.meta["roles_check"] == {"result": "communication matches", "extra_ranks_captured": 0}
    r = json.loads(_run("replay", "simulate", str(out), "--cluster", "dgx-h100", "--json").stdout)
    assert r["iteration_time_s"] > 0 and "cp" in json.dumps(r["breakdown"])
