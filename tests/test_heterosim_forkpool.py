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
