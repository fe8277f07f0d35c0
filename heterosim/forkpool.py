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
- Children die with the parent: each asks the kernel for SIGKILL when its parent dies
  (``PR_SET_PDEATHSIG``, Linux), so a parent killed by SIGKILL or SIGTERM leaves no worker
  behind; an interrupted parent (Ctrl-C) kills its workers on the way out.
- ``timeout``: seconds one task may run; a task over it is killed and reported as an ``error``.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import pickle
import signal
import sys
import time
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence, TypeVar

from heterosim.errors import HeteroSimError

__all__ = ["run_forked"]

T = TypeVar("T")
R = TypeVar("R")


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _readable(e: HeteroSimError) -> HeteroSimError:
    """``e`` if the parent can unpickle it, else an error of its type (or the base) with its text:
    an argument that pickles by a name unpickling cannot resolve (a ``torch.memory_format``) would
    otherwise fail in the parent, far from its cause."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 -- any unpicklable argument: keep the message
        try:
            out = type(e)(str(e))
            pickle.loads(pickle.dumps(out))
            return out
        except Exception:  # noqa: BLE001 -- a constructor taking other arguments
            return HeteroSimError(f"{type(e).__name__}: {e}")


def _child(conn: Any, fn: Callable[[Any], Any], task: Any, parent: int) -> None:
    _die_with_parent(parent)
    payload: tuple[str, Any, str]
    try:
        payload = ("ok", fn(task), "")
    except HeteroSimError as e:
        payload = ("error", _readable(e), "")
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
    on_result: Callable[[int, Any], Any] | None = None,
    error: type[Exception] = RuntimeError,
    timeout: float | None = None,
) -> list[R]:
    """``[fn(t) for t in tasks]``, each call in its own forked process, at most ``jobs`` at once.

    ``order``: the indices in the order to start them (default: task order). ``name(i)`` names task
    ``i`` in failure messages. ``on_start(i)`` / ``on_done(i)`` run in the parent when task ``i``
    starts / has answered successfully (progress bars). ``on_result(i, value)`` runs in the parent as
    task ``i``'s value arrives, before another task is started; what it returns is kept as the
    result (a worker's by-product taken in, here a cache that later forks inherit). ``error``: the exception type raised for a
    worker that crashed or died (capture passes its ``CaptureError`` so its CLI reports it cleanly).
    ``timeout``: seconds each task may run before it is killed and reported as ``error``.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    ctx = mp.get_context("fork")
    pending = list(range(len(tasks)) if order is None else order)
    if sorted(pending) != list(range(len(tasks))):
        raise ValueError("order must be a permutation of the task indices")
    results: list[Any] = [None] * len(tasks)
    running: dict[Any, tuple[Any, int]] = {}
    started: dict[Any, float] = {}
    parent = os.getpid()
    try:
        while pending or running:
            while pending and len(running) < jobs:
                i = pending.pop(0)
                if on_start is not None:
                    on_start(i)
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child, args=(send, fn, tasks[i], parent), daemon=False)
                proc.start()
                send.close()
                running[recv] = (proc, i)
                started[recv] = time.monotonic()
            left = None
            if timeout is not None:
                left = max(0.0, min(started[r] for r in running) + timeout - time.monotonic())
            ready = wait(list(running), timeout=left)
            if not ready:
                late = min(running, key=lambda r: started[r])
                raise error(f"{name(running[late][1])} did not finish within {timeout:g} s; it was stopped "
                            "(raise the time limit, e.g. capture --timeout, if it needs longer)")
            for recv in ready:
                proc, i = running.pop(recv)
                started.pop(recv)
                try:
                    kind, value, text = recv.recv()
                except EOFError:
                    proc.join()  # the exit status is known only once the worker is reaped
                    kind, value, text = "bug", None, f"its worker died without answering (exit status {proc.exitcode})"
                except Exception as e:  # noqa: BLE001 -- an answer that does not unpickle here
                    kind, value, text = "bug", None, f"its answer could not be read: {type(e).__name__}: {e}"
                finally:
                    recv.close()
                proc.join()
                if kind == "error":
                    raise value
                if kind == "bug":
                    raise error(f"{name(i)} failed in its worker:\n{text}")
                results[i] = value if on_result is None else on_result(i, value)
                if on_done is not None:
                    on_done(i)
    finally:
        for recv, (proc, _) in running.items():
            proc.kill()
            proc.join()
            recv.close()
    return results
