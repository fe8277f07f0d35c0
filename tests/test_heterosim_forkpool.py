"""heterosim.forkpool: results in task order, start order honoured, failures stop the pool."""

from __future__ import annotations

import os

import pytest

from heterosim.errors import CaptureError, ConfigError
from heterosim.forkpool import run_forked


def _square(x: int) -> int:
    return x * x


def _pid(_: int) -> int:
    return os.getpid()


def _config_error(x: int) -> int:
    if x == 2:
        raise ConfigError("task 2 has a bad flag; pass --good")
    return x


def _bug(x: int) -> int:
    return 1 // (x - 1)


def _die(x: int) -> int:
    if x == 1:
        os._exit(7)
    return x


def test_results_come_back_in_task_order():
    started, done = [], []
    out = run_forked([3, 1, 4, 1, 5], _square, jobs=2, order=[4, 3, 2, 1, 0],
                     on_start=started.append, on_done=done.append)
    assert out == [9, 1, 16, 1, 25]
    assert started == [4, 3, 2, 1, 0]
    assert sorted(done) == [0, 1, 2, 3, 4]


def test_each_task_runs_in_its_own_child():
    pids = run_forked([0, 1, 2], _pid, jobs=3)
    assert len(set(pids)) == 3 and os.getpid() not in pids


def test_a_heterosim_error_comes_back_as_itself():
    with pytest.raises(ConfigError, match=r"^task 2 has a bad flag; pass --good$"):
        run_forked([0, 1, 2, 3], _config_error, jobs=1)


def _error_with_unreadable_argument(x: int) -> int:
    local = type("Local", (), {"__module__": "no_such_module_here"})()
    raise ConfigError(f"task {x} failed", local)


def _unreadable_result(x: int) -> object:
    return type("Local", (), {"__module__": "no_such_module_here"})()


def test_an_error_the_parent_could_not_unpickle_comes_back_as_its_text():
    """An error whose argument pickles by a name the parent cannot resolve is sent as its own type
    with its text; a result like that is a failure naming what could not be read."""
    with pytest.raises(ConfigError, match=r"^\('task 0 failed', <"):
        run_forked([0], _error_with_unreadable_argument, jobs=1)
    with pytest.raises(RuntimeError, match=r"^task 0 failed in its worker:\n"):
        run_forked([0], _unreadable_result, jobs=1)


def test_a_bug_comes_back_with_the_child_traceback_and_the_task_name():
    with pytest.raises(RuntimeError, match=r"(?s)^case one failed in its worker:\n.*ZeroDivisionError"):
        run_forked([0, 1, 2], _bug, jobs=2, name=lambda i: ["case zero", "case one", "case two"][i])


def test_a_worker_that_dies_without_answering_is_a_failure():
    with pytest.raises(RuntimeError, match=r"task 1 failed in its worker:\nits worker died without answering "
                                           r"\(exit status 7\)"):
        run_forked([0, 1, 2], _die, jobs=1)


def test_bad_arguments():
    with pytest.raises(ValueError, match="jobs must be >= 1, got 0"):
        run_forked([1], _square, jobs=0)
    with pytest.raises(ValueError, match="order must be a permutation of the task indices"):
        run_forked([1, 2], _square, jobs=1, order=[0, 0])


def test_the_failure_type_is_the_callers():
    """Capture asks for CaptureError, so its CLI reports a dead worker as one clean error."""
    with pytest.raises(CaptureError, match=r"^capturing rank 1 failed in its worker:\nits worker died"):
        run_forked([0, 1], _die, jobs=2, name=lambda i: f"capturing rank {i}", error=CaptureError)


def _sleep(x: float) -> float:
    import time

    time.sleep(x)
    return x


def test_a_task_over_the_time_limit_is_stopped_with_one_error():
    """A task that would run 60 s is killed after 0.5 s; the error names it and the fix."""
    import time

    t0 = time.monotonic()
    with pytest.raises(CaptureError, match=r"^task 1 did not finish within 0\.5 s; it was stopped \(raise the time limit"):
        run_forked([0.0, 60.0], _sleep, jobs=2, timeout=0.5, error=CaptureError)
    assert time.monotonic() - t0 < 10


def test_workers_die_with_their_parent(tmp_path):
    """SIGKILL of the parent: its forked worker (sleeping 60 s) is gone within seconds (PDEATHSIG)."""
    import signal
    import subprocess
    import sys
    import time

    pidfile = tmp_path / "worker.pid"
    code = ("import os, time, sys; sys.path.insert(0, %r)\n"
            "from heterosim.forkpool import run_forked\n"
            "def f(_):\n"
            "    open(%r, 'w').write(str(os.getpid())); time.sleep(60)\n"
            "run_forked([0], f, jobs=1)\n") % (str(os.getcwd()), str(pidfile))
    parent = subprocess.Popen([sys.executable, "-c", code])
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text():
            break
        time.sleep(0.1)
    worker = int(pidfile.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(50):
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(worker, signal.SIGKILL)
        pytest.fail("the worker outlived its parent")


_SEEN: list[int] = []  # what the parent took in; a child forked later inherits it


def _sees(x: int) -> tuple[int, list[int]]:
    return x, list(_SEEN)


def test_a_result_is_taken_in_before_the_next_fork():
    """``on_result`` runs in the parent as each value arrives and its return value is kept: with one
    job, each child sees what every earlier child handed back."""
    _SEEN.clear()

    def take(i: int, value: tuple[int, list[int]]) -> int:
        _SEEN.append(value[0])
        return value[0] * 10 + len(value[1])

    assert run_forked([7, 8, 9], _sees, jobs=1, on_result=take) == [70, 81, 92]
    assert _SEEN == [7, 8, 9]
