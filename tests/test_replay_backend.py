"""Array backends (replay.backend): numpy always; CuPy lazily, with a clear error without it."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from heterosim.errors import ConfigError
from replay.backend import get_backend
from replay.engine import run_fast
from test_replay_engine import random_case


def test_numpy_is_the_default_namespace():
    """'numpy' gives numpy itself."""
    assert get_backend("numpy") is np


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_cupy_missing_says_what_to_use():
    """Without CuPy, asking for it names the fix."""
    with pytest.raises(ConfigError, match=r"^CuPy is not installed / no GPU: use --backend numpy"):
        get_backend("cupy")


def test_unknown_backend_lists_the_valid_ones():
    """A typo lists numpy and cupy."""
    with pytest.raises(ConfigError, match="unknown backend 'jax'; valid backends are numpy, cupy"):
        get_backend("jax")


@pytest.mark.gpu
def test_cupy_gives_the_same_times_as_numpy():
    """The span arithmetic on CuPy gives the numpy results on random cases."""
    cupy = pytest.importorskip("cupy")
    for seed in range(6):
        w = random_case(seed)
        a, b = run_fast(w), run_fast(random_case(seed), xp=cupy)
        for r in range(w.trace.world_size):
            assert b.rank_times(r).finish_s == pytest.approx(a.rank_times(r).finish_s, rel=1e-12)
