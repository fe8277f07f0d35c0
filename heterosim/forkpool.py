"""Run independent tasks in forked worker processes, ``jobs`` at a time, results back over pipes.

Capture (one process per rank: torch.distributed's state is per process) and ``replay validate``
(one process per case) both use this. Forking, not spawning, is the point: a forked child keeps
what the parent already imported (torch, FakeTensorMode, the kernel tables), which saves each
worker seconds. The caller must not have started threads before calling (fork safety).

Semantics:

- ``fn(task)`` runs in the child; its return value is pickled back to the parent. Results come
  back in task order whatever the start ``order``.
- The first task to fail stops the pool: the other workers are killed and the failure is raised
  in the parent. A :class:`~heterosim.errors.HeteroSimError` raised by ``fn`` is re-raised as the
  same exception (type and message: it is the user's to read); anything else (a bug) becomes an
  ``error`` (default ``RuntimeError``) carrying the child's traceback. A worker that dies without
  answering (killed by the OOM killer, ``os._exit``) is a failure of that kind too.
- Children leave through ``os._exit`` so they never run the parent's ``atexit`` handlers.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence, TypeVar

from heterosim.errors import HeteroSimError

__all__ = ["run_forked"]

T = TypeVar("T")
R = TypeVar("R")


def _child(conn: Any, fn: Callable[[Any], Any], task: Any) -> None:
    payload: tuple[str, Any, str]
    try:
        payload = ("ok", fn(task), "")
    except HeteroSimError as e:
        payload = ("error", e, "")
    except BaseException:  # noqa: BLE001 -- shipped to the parent, which raises it
        payload = ("bug", None, traceback.format_exc())
    try:
        try:
            conn.send(payload)
        except Exception:  # noqa: BLE001 -- an unpicklable result or exception: send its text
            conn.send(("bug", None, traceback.format_exc()))
    finally:
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def run_forked(
    tasks: Sequence[T],
    fn: Callable[[T], R],
    *,
    jobs: int,
    order: Sequence[int] | None = None,
    name: Callable[[int], str] = lambda i: f"task {i}",
    on_start: Callable[[int], None] | None = None,
    on_done: Callable[[int], None] | None = None,
    error: type[Exception] = RuntimeError,
) -> list[R]:
    """``[fn(t) for t in tasks]``, each call in its own forked process, at most ``jobs`` at once.

    ``order``: the indices in the order to start them (default: task order). ``name(i)`` names task
    ``i`` in failure messages. ``on_start(i)`` / ``on_done(i)`` run in the parent when task ``i``
    starts / has answered successfully (progress bars). ``error``: the exception type raised for a
    worker that crashed or died (capture passes its ``CaptureError`` so its CLI reports it cleanly).
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    ctx = mp.get_context("fork")
    pending = list(range(len(tasks)) if order is None else order)
    if sorted(pending) != list(range(len(tasks))):
        raise ValueError("order must be a permutation of the task indices")
    results: list[Any] = [None] * len(tasks)
    running: dict[Any, tuple[Any, int]] = {}
    try:
        while pending or running:
            while pending and len(running) < jobs:
                i = pending.pop(0)
                if on_start is not None:
                    on_start(i)
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child, args=(send, fn, tasks[i]), daemon=False)
                proc.start()
                send.close()
                running[recv] = (proc, i)
            for recv in wait(list(running)):
                proc, i = running.pop(recv)
                try:
                    kind, value, text = recv.recv()
                except EOFError:
                    kind, value, text = "bug", None, f"its worker died without answering (exit status {proc.exitcode})"
                finally:
                    recv.close()
                proc.join()
                if kind == "error":
                    raise value
                if kind == "bug":
                    raise error(f"{name(i)} failed in its worker:\n{text}")
                results[i] = value
                if on_done is not None:
                    on_done(i)
    finally:
        for recv, (proc, _) in running.items():
            proc.kill()
            proc.join()
            recv.close()
    return results
