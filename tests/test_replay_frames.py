"""Result.to_dataframe (replay.frames): classes, ranks and per-op simulated times as pandas tables."""

from __future__ import annotations

import pytest

from heterosim.errors import ConfigError
from replay.engine import run_fast
from replay.simulate import summarize
from test_replay_engine import two_rank_gemm_allreduce


def result(overlap: bool):
    w = two_rank_gemm_allreduce(overlap)
    return summarize(run_fast(w), w, cluster_name="toy", peak_flops=[1e12] * 2, dtype="bf16")


def test_ops_of_gemm_then_allreduce_by_hand():
    """GEMM 0-1 s, then the 2-rank all-reduce 1-2 s, then the wait blocked 1-2 s (hand-computed)."""
    ops = result(False).to_dataframe("ops")
    assert list(ops["rank"]) == [0, 0, 0]
    assert list(ops["kind"]) == ["compute", "collective", "wait"]
    assert ops["start_s"].tolist() == pytest.approx([0.0, 1.0, 1.0])
    assert ops["end_s"].tolist() == pytest.approx([1.0, 2.0, 2.0])
    assert ops.loc[1, "bytes"] == 10**9 and ops.loc[0, "kernel_class"] == "gemm"


def test_overlapped_allreduce_runs_under_the_gemm():
    """Issued before the GEMM, the all-reduce runs 0-1 s beside it; the wait then blocks 0 s."""
    ops = result(True).to_dataframe("ops", ranks=[1])
    assert list(ops["kind"]) == ["collective", "compute", "wait"]
    assert ops["start_s"].tolist() == pytest.approx([0.0, 0.0, 1.0])
    assert ops["duration_s"].tolist() == pytest.approx([1.0, 1.0, 0.0])


def test_classes_and_ranks_tables_agree_with_the_result():
    """One class of two ranks; the ranks table lists every rank with its class's breakdown."""
    r = result(False)
    classes = r.to_dataframe("classes")
    ranks = r.to_dataframe()  # default: classes
    assert ranks.equals(classes)
    assert classes["num_ranks"].sum() == r.world_size == 2
    assert classes.loc[0, "compute_s"] == pytest.approx(1.0) and classes.loc[0, "exposed_dp_s"] == pytest.approx(1.0)
    per_rank = r.to_dataframe("ranks")
    assert per_rank["rank"].tolist() == [0, 1] and per_rank["class"].tolist() == [0, 0]
    assert per_rank["finish_s"].tolist() == pytest.approx([2.0, 2.0])


def test_unknown_table_and_bad_ranks_are_one_error():
    r = result(False)
    with pytest.raises(ConfigError, match=r"^unknown table 'op'; valid tables: classes, ranks, ops$"):
        r.to_dataframe("op")
    with pytest.raises(ConfigError, match=r"^ranks \[5\] are outside the world \(0\.\.1\)$"):
        r.to_dataframe("ops", ranks=[5])
