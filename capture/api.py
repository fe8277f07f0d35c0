"""The capture library API: run a script as the ranks that matter and write the trace.

Each captured rank runs in its own process, forked from this one, because torch.distributed's
state is per process; workers run in parallel, one per CPU core (``python -m capture.worker``
runs one rank standalone, for debugging).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import warnings
from pathlib import Path
from typing import Callable, Iterator, Sequence

from heterosim.trace.store import check_trace_output, write_trace
from capture import opcache
from capture.objectp2p import MAILBOX_ENV, WAIT_ENV
from capture.rolecheck import check_roles, comm_signature
from capture.roles import group_by_program, merge_captures, parse_rank_list, roles_from_groups
from capture.runner import DEFAULT_GPU, RankCapture, run_rank
from heterosim.errors import CaptureError, ConfigError, ScriptError
from heterosim.forkpool import run_forked

__all__ = ["capture", "capture_command", "DEFAULT_RANK_TIMEOUT_S", "MAX_WORLD_SIZE"]

"""What reading a device value (``.item()``, ``float(loss)``) does during capture: fail with a hint
(tensors hold no data), or read as 0 (``False`` / ``0`` / ``0.0``)."""

DEFAULT_RANK_TIMEOUT_S = 1800.0
"""Seconds one captured rank may run by default (the largest rank we capture, LLaMA-3 405B's at
16,384 GPUs, takes under a minute on 2 CPUs): a script that loops forever ends with an error."""

MAX_WORLD_SIZE = 1 << 20
"""The largest world a capture accepts (1,048,576 ranks): beyond any cluster built, and small
enough that per-rank tables stay in memory."""


def capture_command(script: str, script_args: Sequence[str], world_size: int, nproc_per_node: int, ranks: str,
                    module: bool = False) -> list[str]:
    """The canonical command recorded in the trace header (no output path: traces stay comparable)."""
    return [
        "python", "-m", "capture", "--world-size", str(world_size), "--nproc-per-node", str(nproc_per_node),
        "--ranks", ranks,
        *(["-m"] if module else []), script, *script_args,
    ]


def rank_json(script: str, args: Sequence[str], rank: int, world: int, nproc: int, gpu: str = DEFAULT_GPU,
              iterations: int | None = None, module: bool = False) -> str:
    """Capture one rank; its ``RankCapture`` as the JSON text traces are merged from.

    Text, not the object, crosses the worker's pipe, so the parent rebuilds exactly what
    ``python -m capture.worker`` writes to ``rank_R.json``.
    """
    cap = run_rank(script, list(args), rank, world, nproc, gpu, iterations, module)
    return json.dumps(cap.to_json(), sort_keys=True, separators=(",", ":"))


def _capture_rank(job: tuple[str, tuple[str, ...], int, int, int, str, int | None, bool]) -> tuple[str, list]:
    """Body of a forked worker (``heterosim.forkpool``): one rank's JSON text, and the fake outputs
    its recorder learnt (``capture/opcache.py``) for the ranks forked after it."""
    script, args, rank, world, nproc, gpu, iterations, module = job
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.simplefilter("ignore")
    opcache.start_exporting()
    try:
        return rank_json(script, args, rank, world, nproc, gpu, iterations, module), opcache.exported()
    except ScriptError as e:
        raise ScriptError(f"capturing rank {rank} failed:\n{e}") from None


def _run_ranks(
    script: str,
    args: Sequence[str],
    ranks: Sequence[int],
    world: int,
    nproc: int,
    jobs: int,
    on_done: Callable[[], None] | None,
    timeout: float | None = None,
    gpu: str = DEFAULT_GPU,
    iterations: int | None = None,
    module: bool = False,
) -> list[RankCapture]:
    """Capture ``ranks``, ``jobs`` at a time, each in a process forked from this one.

    Forking after torch and FakeTensorMode's imports are loaded here saves each rank the few
    seconds of importing them again. The main thread starts no other thread, so forking is safe.
    What each rank's recorder learnt about fake outputs is taken in here as it finishes, so ranks
    forked later (the other roles, after rank 0) skip FakeTensorMode for calls it already answered.
    """
    rs = list(ranks)

    def learnt(i: int, value: tuple[str, list]) -> str:
        opcache.absorb(value[1])  # exact keys: the ranks forked next start with these outputs known
        return value[0]

    texts = run_forked([(script, tuple(args), r, world, nproc, gpu, iterations, module) for r in rs],
                       _capture_rank, jobs=jobs,
                       name=lambda i: f"capturing rank {rs[i]}", on_done=(lambda i: on_done()) if on_done else None,
                       on_result=learnt, error=CaptureError, timeout=timeout)
    return [RankCapture.from_json(json.loads(t)) for t in texts]


def _check_program(script: str, module: bool) -> None:
    """Refuse a script file that does not exist, or a module (``-m``) whose package is not installed."""
    if not module:
        if not os.path.isfile(script):
            raise CaptureError(f"script {script!r} does not exist")
        return
    import importlib.util

    # Only the top-level package: finding ``a.b`` imports ``a``, which the forked workers would
    # inherit already imported (with whatever it read at import time, sys.argv included).
    top = script.split(".")[0]
    try:
        found = bool(top) and importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise CaptureError(f"module {script!r}: no package {top!r} here (is it installed?)")


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
    force: bool = False,
    timeout: float | None = DEFAULT_RANK_TIMEOUT_S,
    gpu: str = DEFAULT_GPU,
    iterations: int | None = None,
    module: bool = False,
) -> Path:
    """Capture ``script`` on a fake ``world_size`` job and write the trace directory ``out``.

    ``ranks``: ``auto`` (one rank per role), ``all`` (every rank; roles by identical programs) or a
    list like ``"0,8-11"`` (representatives; roles as for auto). ``on_rank_done(done, total)`` is
    called after each captured rank (progress). Nothing is written if any rank fails. ``out`` may
    be new, an empty directory or a previous trace (``force``: also a regular file); anything else
    is refused before the script runs (:func:`heterosim.trace.store.check_trace_output`). ``timeout``:
    seconds one rank may run (None: no limit); a rank over it stops the capture with an error.
    ``gpu``: the GPU the fake CUDA device reports to the script (a GPU catalogue name).
    ``iterations``: stop the script once that many training iterations are complete (None: let it
    run to its end); the trace holds the last complete one (:mod:`capture.iterations`).
    ``module``: ``script`` is a module name, run as ``python -m`` (``torchrun -m``) runs it.
    """
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ConfigError(f"--world-size must be between 1 and {MAX_WORLD_SIZE:,} ranks, got {world_size}")
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be >= 1 worker process, got {jobs}")
    if iterations is not None and iterations < 1:
        raise ConfigError(f"--iterations must be >= 1 training iteration, got {iterations}")
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
        raise ConfigError(f"--timeout must be a positive number of seconds per rank, got {timeout}")
    nproc = nproc_per_node or min(world_size, 8)
    if world_size % nproc:
        raise ConfigError(
            f"world size {world_size} is not a multiple of --nproc-per-node {nproc}; "
            "pass --nnodes N --nproc-per-node G or a world size that divides"
        )
    from heterosim.cluster.gpus import get_gpu

    get_gpu(gpu)  # an unknown name fails here, once, with the catalogue's list
    _check_program(script, module)
    listed = parse_rank_list(ranks, world_size) if ranks not in ("auto", "all") else None  # checked before any work
    check_trace_output(out, force=force)
    jobs = jobs or max(1, os.cpu_count() or 1)
    # Load what every worker needs before forking them (FakeTensorMode imports dynamo lazily).
    import torch._dynamo  # noqa: F401

    command = capture_command(script, script_args, world_size, nproc, ranks, module)
    done = [0, 0]

    def tick() -> None:
        done[0] += 1
        if on_rank_done:
            on_rank_done(done[0], done[1])

    def run(rs: Sequence[int], alone: bool = False) -> list[RankCapture]:
        # Ranks share sent Python objects through a mailbox (capture.objectp2p); a receive may wait
        # for a sender running beside it, never when the rank runs alone.
        wait = "0" if alone or len(rs) == 1 else str(timeout or DEFAULT_RANK_TIMEOUT_S)
        with _env({WAIT_ENV: wait}):
            return _run_ranks(script, script_args, rs, world_size, nproc, jobs, tick, timeout, gpu, iterations,
                              module)

    with tempfile.TemporaryDirectory(prefix="heterosim-mailbox-") as box, _env({MAILBOX_ENV: box}):
        trace = _capture_roles(run, ranks, listed, world_size, done, command)
    return write_trace(trace, out, force=force)


def _capture_roles(run: Callable[..., list[RankCapture]], ranks: str, listed: list[int] | None, world_size: int,
                   done: list[int], command: list[str]):
    """Capture the representatives (or every rank), prove the roles, merge into one trace."""
    if ranks == "all":
        done[1] = world_size
        caps = run(range(world_size))
        roles = group_by_program(caps)
        reps = None
    else:
        done[1] = 1
        first = run([0], alone=True)[0]
        roles = roles_from_groups(first.groups, world_size)
        reps = [r[0] for r in roles] if listed is None else listed
        rest = [r for r in reps if r != 0]
        done[1] = 1 + len(rest)
        caps = [first, *run(rest)]

    def run_more(rs: Sequence[int]) -> list[RankCapture]:
        done[1] += len(rs)
        return run(rs)

    caps, roles, reps, check = prove_roles(caps, roles, reps, run_more)
    trace = merge_captures(caps, roles, command, representatives=reps)
    trace.meta["roles_check"] = check
    return trace


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    """Environment variables set for the workers forked inside, restored after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def prove_roles(
    caps: list[RankCapture],
    roles: list[tuple[int, ...]],
    reps: Sequence[int] | None,
    run: Callable[[Sequence[int]], list[RankCapture]],
) -> tuple[list[RankCapture], list[tuple[int, ...]], list[int] | None, dict]:
    """Check that ``roles`` replay consistently (:func:`capture.rolecheck.check_roles`); where they
    do not, capture every rank of the roles involved (``run``) and split them by identical programs.

    Returns the captures, the roles, their representatives and what was done (for the trace
    header). A mismatch that remains once every rank involved is captured is the script's own:
    a CaptureError says where (replay would deadlock there).
    """
    by_rank = {c.rank: c for c in caps}
    allowed = set(reps) if reps is not None else set(by_rank)
    rep_of = [next((r for r in rs if r in by_rank and r in allowed), None) for rs in roles]
    if None in rep_of:
        return caps, roles, reps, {}  # merge_captures names the role without a captured rank
    sigs = {r: comm_signature(by_rank[r]) for r in rep_of}
    bad, problems = check_roles(caps[0].groups, roles, [sigs[r] for r in rep_of])
    if not bad:
        return caps, roles, reps, {"result": "communication matches", "extra_ranks_captured": 0}
    more = sorted({r for i in bad for r in roles[i]} - set(by_rank))
    caps = [*caps, *run(more)]
    by_rank = {c.rank: c for c in caps}
    split: list[tuple[tuple[int, ...], int]] = []
    for i, rs in enumerate(roles):
        if i in bad:
            split += [(sub, sub[0]) for sub in group_by_program([by_rank[r] for r in rs])]
        else:
            split.append((rs, rep_of[i]))
    split.sort(key=lambda x: x[0][0])
    roles, reps = [s for s, _ in split], [r for _, r in split]
    for r in reps:
        sigs.setdefault(r, comm_signature(by_rank[r]))
    bad, left = check_roles(caps[0].groups, roles, [sigs[r] for r in reps])
    if bad:
        raise CaptureError("the script's ranks do not communicate consistently (replay would deadlock): "
                           + "; ".join(left))
    return caps, roles, reps, {"result": "communication matches once roles were split by program",
                               "mismatch_first_seen": problems[:3], "extra_ranks_captured": len(more)}
