"""The validation report (heterosim.validation.report): signed percentages, fp8 pairs, tables, JSON."""

from __future__ import annotations

import json

import pytest

from heterosim.validation.report import CaseResult, Comparison, Report, _signed_pct


def test_an_error_that_rounds_to_zero_prints_plus_zero():
    """-0.00001 prints +0.0%, not -0.0% (the 1T row of the README table)."""
    assert _signed_pct(-1e-5) == "+0.0%" and _signed_pct(1e-5) == "+0.0%"
    assert _signed_pct(-0.0751) == "-7.5%" and _signed_pct(0.114) == "+11.4%"


def test_fp8_pairs_and_precision_summary():
    """Runs whose flags differ only by --fp8-format pair up: measured ratio 6/10 = 0.6, predicted
    6.6/10.5 = 0.62857, error +4.76%; 16-bit and fp8 MAPE apart (5% and 10%)."""
    def run(cid, fp8, meas, pred, world=8):
        flags = ["--num-layers", "2", "--bf16"] + (["--fp8-format", "hybrid"] if fp8 else [])
        return CaseResult(id=cid, category="end_to_end", status="ok", detail={"flags": flags, "world_size": world},
                          comparisons=(Comparison(metric="iteration_time_s", measured=meas, predicted=pred,
                                                  error=pred / meas - 1),))

    rep = Report(cases=(run("a-bf16", False, 10.0, 10.5), run("a-fp8", True, 6.0, 6.6),
                        run("b-fp8", True, 6.0, 6.6, world=16)))
    (pair,) = rep.fp8_pairs()
    assert (pair["fp8"], pair["bf16"], pair["measured"]) == ("a-fp8", "a-bf16", 0.6)
    assert pair["predicted"] == pytest.approx(6.6 / 10.5) and pair["error"] == pytest.approx(6.6 / 10.5 / 0.6 - 1)
    text = rep.table()
    assert "16-bit runs: MAPE 5.0% over 1; worst a-bf16 +5.0%" in text
    assert "fp8 runs: MAPE 10.0% over 2; worst a-fp8 +10.0%" in text
    assert "fp8/16-bit time ratio: mean |error| 4.8% over 1 pairs; worst a-fp8 +4.8%" in text
    assert "| a-fp8 | a-bf16 | 0.600 | 0.629 | +4.8% |" in rep.table(markdown=True)
    assert json.loads(rep.to_json())["fp8_pairs"][0]["fp8"] == "a-fp8"
    assert "fp8_pairs" not in json.loads(Report(cases=rep.cases[:1]).to_json())


def test_fp8_only_flags_do_not_keep_a_pair_apart():
    """An fp8 run with the fp8-only flags of FP8_FLAGS (--fp8-param-gather, --tp-comm-overlap-fp8-buf
    NAME: the Llama 3.1 405B recipe's fp8 rows) still pairs with its bf16 twin; a flag the bf16 run
    lacks and that is not fp8-only keeps them apart."""
    def run(cid, extra):
        return CaseResult(id=cid, category="end_to_end", status="ok",
                          detail={"flags": ["--num-layers", "2", "--bf16", *extra], "world_size": 8},
                          comparisons=(Comparison(metric="iteration_time_s", measured=1.0, predicted=1.0, error=0.0),))

    fp8 = ["--fp8-format", "hybrid", "--fp8-param-gather", "--tp-comm-overlap-fp8-buf", "proj_fprop,fc2_fprop"]
    assert [p["fp8"] for p in Report(cases=(run("b", []), run("f", fp8))).fp8_pairs()] == ["f"]
    assert Report(cases=(run("b", []), run("f", [*fp8, "--sequence-parallel"]))).fp8_pairs() == []


def test_fp4_runs_pair_with_their_bf16_twin_and_summarise_apart():
    """An NVFP4 run (--fp4-format e2m1 --fp4-recipe nvfp4) pairs with the bf16 run of its
    configuration as fp8 runs do, and its error is summarised under fp4: ratio 5/10 measured,
    5.5/10 predicted, +10%."""
    def run(cid, extra, meas, pred):
        return CaseResult(id=cid, category="end_to_end", status="ok",
                          detail={"flags": ["--num-layers", "2", "--bf16", *extra], "world_size": 8},
                          comparisons=(Comparison(metric="iteration_time_s", measured=meas, predicted=pred,
                                                  error=pred / meas - 1),))

    rep = Report(cases=(run("b", [], 10.0, 10.0), run("f8", ["--fp8-format", "hybrid"], 7.0, 7.0),
                        run("f4", ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"], 5.0, 5.5)))
    assert [(p["fp8"], p["bf16"]) for p in rep.fp8_pairs()] == [("f8", "b"), ("f4", "b")]
    assert rep.fp8_pairs()[1]["error"] == pytest.approx(0.1)
    assert "fp4 runs: MAPE 10.0% over 1; worst f4 +10.0%" in rep.table()


def test_torchtitan_float8_runs_pair_with_their_bf16_twin():
    """A torchtitan row's Float8 converter (--model.converters quantize.linear.float8 and its recipe)
    makes it an fp8 run that pairs with the bf16 row of its configuration: 1.92 / 2.457 = 0.7814
    measured, 1.781 / 2.14 = 0.8322 predicted."""
    def run(cid, extra, meas, pred):
        return CaseResult(id=cid, category="end_to_end", status="ok",
                          detail={"flags": ["--model.flavor", "8B", *extra, "--compile.enable"], "world_size": 8},
                          comparisons=(Comparison(metric="iteration_time_s", measured=meas, predicted=pred,
                                                  error=pred / meas - 1),))

    f8 = ["--model.converters", "quantize.linear.float8", "--quantize.linear.float8.recipe_name", "tensorwise"]
    rep = Report(cases=(run("b", [], 2.457, 2.14), run("f8", f8, 1.92, 1.781)))
    (pair,) = rep.fp8_pairs()
    assert (pair["fp8"], pair["bf16"]) == ("f8", "b")
    assert pair["measured"] == pytest.approx(1.92 / 2.457) and pair["predicted"] == pytest.approx(1.781 / 2.14)
    assert "fp8 runs: MAPE 7.2% over 1" in rep.table()
