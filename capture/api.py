"""The capture library API: run a script as the ranks that matter and write the trace.

Each captured rank runs in its own worker process (``python -m capture.worker``), because
torch.distributed's state is per process; workers run in parallel, one per CPU core.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

from capture.ir import write_trace
from capture.roles import group_by_program, merge_captures, parse_rank_list, roles_from_groups
from capture.runner import RankCapture
from heterosim.errors import CaptureError, ConfigError, ScriptError

__all__ = ["capture", "capture_command"]


def capture_command(script: str, script_args: Sequence[str], world_size: int, nproc_per_node: int, ranks: str) -> list[str]:
    """The canonical command recorded in the trace header (no output path: traces stay comparable)."""
    return [
        "python", "-m", "capture", "--world-size", str(world_size), "--nproc-per-node", str(nproc_per_node),
        "--ranks", ranks, script, *script_args,
    ]


def _run_worker(script: str, args: Sequence[str], rank: int, world: int, nproc: int, tmp: Path) -> RankCapture:
    out = tmp / f"rank_{rank}.json"
    cmd = [
        sys.executable, "-m", "capture.worker", "--rank", str(rank), "--world-size", str(world),
        "--nproc-per-node", str(nproc), "--out", str(out), "--", script, *args,
    ]
    env = dict(os.environ)
    # Workers share the cores: keep each to one intra-op thread.
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONWARNINGS"] = env.get("PYTHONWARNINGS", "ignore")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        err = proc.stderr.strip() or proc.stdout.strip()
        raise ScriptError(f"capturing rank {rank} failed (exit status {proc.returncode}):\n{err}")
    return RankCapture.from_json(json.loads(out.read_text()))


def capture(
    script: str,
    script_args: Sequence[str],
    out: str | os.PathLike,
    *,
    world_size: int,
    nproc_per_node: int | None = None,
    ranks: str = "auto",
    jobs: int | None = None,
    on_rank_done: Callable[[int, int], None] | None = None,
) -> Path:
    """Capture ``script`` on a fake ``world_size`` job and write the trace directory ``out``.

    ``ranks``: ``auto`` (one rank per role), ``all`` (every rank; roles by identical programs) or a
    list like ``"0,8-11"`` (representatives; roles as for auto). ``on_rank_done(done, total)`` is
    called after each captured rank (progress). Nothing is written if any rank fails.
    """
    if world_size < 1:
        raise ConfigError(f"--world-size must be >= 1, got {world_size}")
    nproc = nproc_per_node or min(world_size, 8)
    if world_size % nproc:
        raise ConfigError(
            f"world size {world_size} is not a multiple of --nproc-per-node {nproc}; "
            "pass --nnodes N --nproc-per-node G or a world size that divides"
        )
    if not os.path.isfile(script):
        raise CaptureError(f"script {script!r} does not exist")
    jobs = jobs or max(1, os.cpu_count() or 1)
    command = capture_command(script, script_args, world_size, nproc, ranks)
    with tempfile.TemporaryDirectory(prefix="heterosim-capture-") as td:
        tmp = Path(td)

        def run(rs: Sequence[int], done0: int, total: int) -> list[RankCapture]:
            results: list[RankCapture] = []
            with ThreadPoolExecutor(max_workers=jobs) as ex:
                futs = [ex.submit(_run_worker, script, script_args, r, world_size, nproc, tmp) for r in rs]
                for i, f in enumerate(futs):
                    results.append(f.result())
                    if on_rank_done:
                        on_rank_done(done0 + i + 1, total)
            return results

        if ranks == "all":
            caps = run(range(world_size), 0, world_size)
            roles = group_by_program(caps)
            reps = None
        else:
            first = run([0], 0, 0)[0]
            roles = roles_from_groups(first.groups, world_size)
            reps = [r[0] for r in roles] if ranks == "auto" else parse_rank_list(ranks, world_size)
            rest = [r for r in reps if r != 0]
            if on_rank_done:
                on_rank_done(1, 1 + len(rest))
            caps = [first, *run(rest, 1, 1 + len(rest))]
        trace = merge_captures(caps, roles, command, representatives=reps)
    return write_trace(trace, out)
