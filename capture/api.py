"""The capture library API: run a script as the ranks that matter and write the trace.

Each captured rank runs in its own process, forked from this one, because torch.distributed's
state is per process; workers run in parallel, one per CPU core (``python -m capture.worker``
runs one rank standalone, for debugging).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import tempfile
import traceback
import warnings
from multiprocessing.connection import wait as mp_wait
from pathlib import Path
from typing import Any, Callable, Sequence

from capture.ir import write_trace
from capture.roles import group_by_program, merge_captures, parse_rank_list, roles_from_groups
from capture.runner import RankCapture, run_rank
from heterosim.atomic import atomic_write_text
from heterosim.errors import CaptureError, ConfigError, ScriptError

__all__ = ["capture", "capture_command"]


def capture_command(script: str, script_args: Sequence[str], world_size: int, nproc_per_node: int, ranks: str) -> list[str]:
    """The canonical command recorded in the trace header (no output path: traces stay comparable)."""
    return [
        "python", "-m", "capture", "--world-size", str(world_size), "--nproc-per-node", str(nproc_per_node),
        "--ranks", ranks, script, *script_args,
    ]


def run_and_write(script: str, args: Sequence[str], rank: int, world: int, nproc: int, out_dir: Path) -> int:
    """Capture one rank into ``out_dir/rank_R.json``; on failure write ``rank_R.err``. Returns an exit code."""
    try:
        cap = run_rank(script, list(args), rank, world, nproc)
        atomic_write_text(out_dir / f"rank_{rank}.json", json.dumps(cap.to_json(), sort_keys=True, separators=(",", ":")))
        return 0
    except ScriptError as e:
        (out_dir / f"rank_{rank}.err").write_text(str(e))
        return 3
    except Exception:  # a bug of ours: keep the traceback
        (out_dir / f"rank_{rank}.err").write_text(traceback.format_exc())
        return 4


def _child(script: str, args: Sequence[str], rank: int, world: int, nproc: int, tmp: Path) -> None:
    """Body of a forked worker: run one rank and exit with its status."""
    code = 4
    try:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        warnings.simplefilter("ignore")
        code = run_and_write(script, args, rank, world, nproc, tmp)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run_ranks(
    script: str,
    args: Sequence[str],
    ranks: Sequence[int],
    world: int,
    nproc: int,
    tmp: Path,
    jobs: int,
    on_done: Callable[[], None] | None,
) -> list[RankCapture]:
    """Capture ``ranks``, ``jobs`` at a time, each in a process forked from this one.

    Forking after torch and FakeTensorMode's imports are loaded here saves each rank the few
    seconds of importing them again. The main thread starts no other thread, so forking is safe.
    """
    ctx = mp.get_context("fork")
    todo = list(ranks)
    running: dict[int, Any] = {}
    failed: list[str] = []
    while todo or running:
        while todo and len(running) < jobs and not failed:
            r = todo.pop(0)
            p = ctx.Process(target=_child, args=(script, args, r, world, nproc, tmp), daemon=False)
            p.start()
            running[p.sentinel] = (r, p)
        if not running:
            break
        for sentinel in mp_wait(list(running)):
            r, p = running.pop(sentinel)
            p.join()
            if p.exitcode != 0:
                err = tmp / f"rank_{r}.err"
                msg = err.read_text() if err.exists() else f"worker died with exit code {p.exitcode}"
                failed.append(f"capturing rank {r} failed:\n{msg}")
            elif on_done:
                on_done()
    if failed:
        raise ScriptError(failed[0])
    return [RankCapture.from_json(json.loads((tmp / f"rank_{r}.json").read_text())) for r in ranks]


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
    # Load what every worker needs before forking them (FakeTensorMode imports dynamo lazily).
    import torch._dynamo  # noqa: F401

    command = capture_command(script, script_args, world_size, nproc, ranks)
    with tempfile.TemporaryDirectory(prefix="heterosim-capture-") as td:
        tmp = Path(td)

        done = [0, 0]

        def tick() -> None:
            done[0] += 1
            if on_rank_done:
                on_rank_done(done[0], done[1])

        def run(rs: Sequence[int]) -> list[RankCapture]:
            return _run_ranks(script, script_args, rs, world_size, nproc, tmp, jobs, tick)

        if ranks == "all":
            done[1] = world_size
            caps = run(range(world_size))
            roles = group_by_program(caps)
            reps = None
        else:
            done[1] = 1
            first = run([0])[0]
            roles = roles_from_groups(first.groups, world_size)
            reps = [r[0] for r in roles] if ranks == "auto" else parse_rank_list(ranks, world_size)
            rest = [r for r in reps if r != 0]
            done[1] = 1 + len(rest)
            caps = [first, *run(rest)]
        trace = merge_captures(caps, roles, command, representatives=reps)
    return write_trace(trace, out)
