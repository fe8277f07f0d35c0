"""Tests for heterosim.validation.validate: capture (cached) + replay of cases, errors, MAPE, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from heterosim.errors import ConfigError

_HW_A100 = {"gpu": "NVIDIA A100-SXM4-80GB", "gpus_per_node": 8, "system": "DGX A100",
            "intra_node": "NVLink3 + NVSwitch (12 links x 25 GB/s per direction)",
            "inter_node": "InfiniBand HDR, 8 x 200 Gb/s HCAs per node"}
E2E = {
    "id": "small-1gpu", "category": "end_to_end", "hardware": _HW_A100,
    "model": {"layers": 2, "hidden": 1024, "heads": 8, "ffn": 4096, "seq_len": 1024, "vocab": 2048,
              "arch": "GPT (MHA, GeLU MLP, LayerNorm, learned pos)"},
    "parallelism": {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "sequence_parallel": False, "recompute": "full"},
    "batch": {"micro": 4, "global": 4}, "precision": "fp16 mixed precision",
    "measured": {"iteration_time_s": 0.05, "tflops_per_gpu": 100.0},
    "notes": "TFLOP/s counted with F = 96*B*s*l*h^2*(...) which INCLUDES the recompute forward.",
}
COLL = {
    "id": "coll-8", "category": "collective", "hardware": {**_HW_A100, "system": "8-GPU box", "inter_node": "n/a"},
    "collective": {"op": "all_reduce", "tool": "all_reduce_perf -b 8 -e 4G -f 2 -g 8"},
    "measured": {"single_node_8gpu_busbw_GBps": 230.0, "theoretical_busbw_GBps": 240,
                 "single_hca_busbw_GBps": 24},
}


def _write(tmp: Path, cases: list[dict]) -> Path:
    p = tmp / "cases.yaml"
    p.write_text(yaml.safe_dump({"schema_version": 1, "cases": cases}))
    return p


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("validate")
    return tmp, _write(tmp, [E2E, COLL, {"id": "spec-x", "category": "spec"}]), tmp / "cache"


@pytest.fixture(scope="module")
def report(env):
    from heterosim.validation.validate import validate

    _, path, cache = env
    return validate(path, cache_dir=cache)


def test_end_to_end_case(report, env):
    """An end-to-end case is captured and replayed; time and TFLOP/s (its FLOP convention) compare."""
    from heterosim.trace.ir import flop_totals
    from heterosim.trace.store import load_trace

    r = next(c for c in report.cases if c.id == "small-1gpu")
    assert r.status == "ok" and r.detail["flop_convention"] == "hardware"
    t, tf = r.comparisons
    assert t.metric == "iteration_time_s" and t.measured == 0.05
    assert t.error == pytest.approx(t.predicted / 0.05 - 1)
    trace = load_trace(next(Path(env[2]).iterdir()))
    assert tf.predicted == pytest.approx(flop_totals(trace)["hardware"] / t.predicted / 1e12)
    assert tf.error == pytest.approx(tf.predicted / 100.0 - 1)
    assert [c.id for c in report.cases] == ["small-1gpu", "coll-8"]  # spec cases are not predictions


def test_collective_case_matches_preset_plan(report):
    """A busbw figure is planned at the tool's largest size on a node built from the words; the
    result equals ncclshim on the dgx-a100 preset (same NVSwitch). Per-device and theoretical
    figures are not compared."""
    import ncclshim
    from heterosim.cluster import load_cluster
    from ncclshim.view import topology_view

    r = next(c for c in report.cases if c.id == "coll-8")
    (c,) = r.comparisons
    view = topology_view(load_cluster("dgx-a100", num_gpus=8))
    want = ncclshim.plan("all_reduce", 4 << 30, list(range(8)), view, dtype="fp32").busbw / 1e9
    assert c.predicted == pytest.approx(want, rel=1e-6)
    assert c.measured == 230.0 and "4096 MiB" in c.note
    assert any("single_hca_busbw_GBps" in a for a in r.assumptions)


def test_mape_and_worst(report):
    """MAPE is the mean |error| of the primary figures; worst is the largest |error|."""
    errs = report.errors("end_to_end") + report.errors("collective")
    assert len(errs) == 2
    s = report.summary_dict()
    assert s["collective"]["mape"] == pytest.approx(abs(errs[1][1]))
    assert s["end_to_end"]["worst"]["id"] == "small-1gpu"
    text = report.table()
    assert "end_to_end: MAPE" in text and "coll-8" in text
    assert report.table(markdown=True).startswith("| case | metric | measured | predicted | error |")


def test_json_is_byte_identical(report, env):
    """Re-running (from the trace cache) gives byte-identical JSON; a cache hit does not capture."""
    import capture.api
    from heterosim.validation.validate import validate

    def boom(*a, **k):
        raise AssertionError("captured again despite the cache")

    orig = capture.api.capture
    capture.api.capture = boom
    try:
        again = validate(env[1], cache_dir=env[2])
    finally:
        capture.api.capture = orig
    assert again.to_json() == report.to_json()
    assert json.loads(report.to_json())["schema_version"] == 1


def test_sensitivity_gemm_efficiency(env):
    """Halving the Ampere GEMM efficiency slows the 1-GPU case by exactly the extra GEMM time
    (serial, no communication), by less than 2x overall (memory-bound ops do not change), and
    leaves the collective case unchanged: a calibration constant acts by its physics, alike on
    every case."""
    import numpy as np

    from heterosim.trace.store import load_trace
    from kernel_db import Pricer
    from kernel_db.roofline import load_efficiency
    from heterosim.validation.cases import load_cases
    from heterosim.validation.validate import run_case

    tmp, path, cache = env
    src = Path(__import__("kernel_db").__file__).parent / "data" / "efficiency.yaml"
    doc = yaml.safe_load(src.read_text())
    doc["arch"]["ampere"]["gemm"]["eff_max"] /= 2
    (tmp / "eff.yaml").write_text(yaml.safe_dump(doc))
    slow = Pricer(efficiency=load_efficiency(tmp / "eff.yaml"))
    base = Pricer()
    e2e, coll = load_cases(path)[:2]
    r0 = run_case(e2e, cache_dir=cache, kernel_db=base)
    r1 = run_case(e2e, cache_dir=cache, kernel_db=slow)
    t0, t1 = r0.comparisons[0].predicted, r1.comparisons[0].predicted
    trace = load_trace(next(Path(cache).iterdir()))
    role = trace.roles[0]
    extra = 0.0
    for seg in role.program:
        blk = role.blocks[seg.block]
        gemm = np.array([k == "gemm" for k in blk.columns["kernel_class"]])
        a = base.price_block(blk, "A100-SXM4-80GB")[0]
        b = slow.price_block(blk, "A100-SXM4-80GB")[0]
        extra += float(np.sum((b - a)[gemm]))
        assert np.allclose(a[~gemm], b[~gemm])
    assert extra > 0
    assert t1 - t0 == pytest.approx(extra, rel=1e-6)
    assert 1.0 < t1 / t0 < 2.0
    c0 = run_case(coll, kernel_db=base).comparisons[0].predicted
    c1 = run_case(coll, kernel_db=slow).comparisons[0].predicted
    assert c0 == c1


def test_only_unknown_id(env):
    """--only with an id not in the file is one error listing the ids."""
    from heterosim.validation.validate import validate

    with pytest.raises(ConfigError, match=r"--only 'nope': no such case in .*; ids: coll-8, small-1gpu, spec-x"):
        validate(env[1], only=["nope"], cache_dir=env[2])


def test_missing_feature_message():
    """A capture failure naming an unsupported feature becomes a missing_feature result."""
    from heterosim.validation.validate import _missing_feature

    assert _missing_feature("Traceback...\nConfigError: --cp-comm-type a2a is not supported") == \
        "ConfigError: --cp-comm-type a2a is not supported"
    assert _missing_feature("some other failure") is None
    assert _missing_feature("Traceback...\nNotImplementedError: Operator aten.x.default does not have a sharding "
                            "strategy registered.") == ("NotImplementedError: Operator aten.x.default does not have "
                                                        "a sharding strategy registered.")


def test_cli_json_and_plot(env, capsys, tmp_path):
    """python -m replay validate --only ID --json prints one JSON object; --plot writes a PNG."""
    from replay.__main__ import main

    assert main(["validate", str(env[1]), "--only", "coll-8", "--json", "--plot", str(tmp_path / "v.png"),
                 "--cache-dir", str(env[2])]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["collective"]["compared"] == 1
    assert (tmp_path / "v.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unfused_attention_case_runs(tmp_path):
    """A case whose run predates flash attention is captured with Megatron's unfused core attention."""
    from heterosim.trace.store import load_trace
    from heterosim.validation.validate import validate

    case = {**E2E, "id": "unfused", "model": {**E2E["model"], "attention": "unfused"}}
    rep = validate(_write(tmp_path, [case]), cache_dir=tmp_path / "c")
    (r,) = rep.cases
    assert r.status == "ok" and r.primary is not None and r.primary.predicted > 0
    assert any("attention: unfused" in a for a in r.assumptions)
    (trace_dir,) = [p.parent for p in (tmp_path / "c").rglob("trace.json")]
    ops = {n for role in load_trace(trace_dir).roles for b in role.blocks.values() for n in b.columns["name"]}
    assert "aten.baddbmm.default" in ops and not any("scaled_dot_product" in n for n in ops)


def test_jobs_runs_cases_in_forked_workers_with_the_same_report(env):
    """validate(jobs=2) forks one process per case, largest world first, and reports exactly what
    jobs=1 does, in the file's order; --jobs 0 is refused."""
    from replay.__main__ import main
    from heterosim.validation.validate import validate

    times: list[tuple[str, float]] = []
    one = validate(env[1], cache_dir=env[2], finished=lambda i, s: times.append((i, s)))
    assert sorted(i for i, _ in times) == sorted(r.id for r in one.cases) and all(s >= 0 for _, s in times)
    seen: list[str] = []
    two = validate(env[1], cache_dir=env[2], jobs=2, progress=seen.append, finished=lambda i, s: times.append((i, s)))
    assert len(times) == 2 * len(one.cases)
    assert two.to_json() == one.to_json()
    assert [r.id for r in two.cases] == [r.id for r in one.cases]
    assert seen[0] == "small-1gpu"  # an end-to-end case before the collective one
    assert main(["validate", str(env[1]), "--jobs", "0", "--cache-dir", str(env[2])]) == 2


def test_a_malformed_case_fails_alone(tmp_path):
    """hardware as a list, a measured -1 and an unreadable tool size: each case fails or skips alone."""
    from heterosim.validation.validate import validate

    bad_hw = {**COLL, "id": "hw-list", "hardware": ["A100", "DGX"]}
    negative = {**COLL, "id": "negative", "measured": {"single_node_8gpu_busbw_GBps": -1,
                                                        "two_node_16gpu_busbw_GBps": 150.0}}
    bad_tool = {**COLL, "id": "bad-tool", "collective": {"op": "all_reduce", "tool": "all_reduce_perf -e 4Q"}}
    rep = validate(_write(tmp_path, [bad_hw, COLL, negative, bad_tool]), cache_dir=tmp_path / "cache")
    by = {c.id: c for c in rep.cases}
    assert by["hw-list"].status == "error"
    assert by["hw-list"].message == ("ConfigError: case 'hw-list': section(s) hardware must be a mapping of "
                                     "'key: value' lines, found list")
    assert by["coll-8"].status == "ok"
    assert [c.measured for c in by["negative"].comparisons] == [150.0]
    assert any("not a number: -1" in a for a in by["negative"].assumptions)
    assert by["bad-tool"].status == "error" and "size '4Q' is not understood" in by["bad-tool"].message
    assert rep.summary_dict()["collective"]["compared"] == 2


def test_a_damaged_cached_trace_is_captured_again(tmp_path):
    """A cache entry whose header was damaged is replaced by a fresh capture, not reused."""
    from heterosim.trace.store import load_trace
    from heterosim.validation.validate import capture_cached

    script = Path(__file__).resolve().parent / "scripts" / "tiny_tp.py"
    first = capture_cached([], 4, tmp_path, script=script)
    good = (first / "trace.json").read_bytes()
    (first / "trace.json").write_bytes(b"\x00garbage")
    again = capture_cached([], 4, tmp_path, script=script)
    assert again == first and (again / "trace.json").read_bytes() == good and load_trace(again).world_size == 4


def test_iteration_time_from_a_throughput_or_other_units():
    """tokens/s per GPU: 128 sequences x 8192 tokens / (3600 x 64 GPUs) = 4.5511 s; a step time in ms;
    nothing usable gives None; a torchtitan command line carries its batch and length apart
    (16 x 1024 / (6000 x 8) = 0.34133 s)."""
    from heterosim.validation.cases import CaseInputs
    from heterosim.validation.validate import _time_from_rate

    def inputs(world, flags=("--seq-length", "8192", "--global-batch-size", "128"), **kw):
        return CaseInputs(flags=tuple(flags), world_size=world, cluster={}, gpu="H100", assumptions=(), **kw)

    t, note = _time_from_rate({"tokens_per_s_per_gpu": 3600}, inputs(64))
    assert t == pytest.approx(128 * 8192 / (3600 * 64)) and note == (
        "derived: global batch 128 x seq 8192 / tokens_per_s_per_gpu x 64 GPUs")
    assert _time_from_rate({"tokens_per_s": 1048576}, inputs(64))[0] == pytest.approx(1.0)
    assert _time_from_rate({"samples_per_s": 64}, inputs(8))[0] == pytest.approx(2.0)
    assert _time_from_rate({"iteration_time_ms": 1500}, inputs(8)) == (1.5, "from iteration_time_ms")
    assert _time_from_rate({"mfu": 0.4}, inputs(8)) == (None, "")
    titan = inputs(8, ("--model.flavor", "8B"), module="torchtitan.train", global_batch=16, seq_len=1024)
    assert _time_from_rate({"tokens_per_s_per_gpu": 6000}, titan)[0] == pytest.approx(16 * 1024 / (6000 * 8))


def test_measured_figures_with_commas_suffixes_and_units():
    """'3,890' is 3,890 (it read as 3), '3.9K' 3,900; a value that carries its unit is read by it
    where the key does not say: 2300 ms, 3,890 tokens/s/GPU (64 x 8192 / (3890 x 8) = 16.847 s),
    31K tokens/s for the job, 12.5 samples/s; an MFU alone gives no time."""
    from heterosim.validation.cases import CaseInputs
    from heterosim.validation.validate import _num, _time_from_rate

    assert _num("3,890") == (3890.0, False) and _num("3.9K tokens/s") == (3900.0, False)
    assert _num("~200 (still rising)") == (200.0, True) and _num("1,234.5") == (1234.5, False)
    ci = CaseInputs(flags=("--seq-length", "8192", "--global-batch-size", "64"), world_size=8, cluster={},
                    gpu="H100", assumptions=())
    assert _time_from_rate({"step_time": "2300 ms"}, ci) == (2.3, "from step_time (2300 ms)")
    assert _time_from_rate({"iteration_time": "2.3 s"}, ci) == (2.3, "from iteration_time (2.3 s)")
    t, note = _time_from_rate({"throughput": "3,890 tokens/s/GPU"}, ci)
    assert t == pytest.approx(64 * 8192 / (3890 * 8)) and note == (
        "derived: 524,288 tokens / throughput (3,890 tokens/s/GPU)")
    assert _time_from_rate({"throughput": "31K tokens/s"}, ci)[0] == pytest.approx(64 * 8192 / 31000)
    assert _time_from_rate({"throughput": "12.5 samples/s"}, ci)[0] == pytest.approx(64 / 12.5)
    assert _time_from_rate({"tokens_per_s_per_gpu": "3,890"}, ci)[0] == pytest.approx(64 * 8192 / (3890 * 8))
    assert _time_from_rate({"mfu": "38%"}, ci) == (None, "")


def test_a_stated_peak_memory_is_compared_with_the_allocator_peak():
    """'peak_memory_GiB' (what training logs print: max_memory_reserved) against the largest reserved
    peak over the job's roles, 'peak_memory_allocated_GiB' against the allocated one: 70 / 80 GiB
    predicted against 82.4 measured -> 80 / 82.4 - 1 = -2.91%."""
    from types import SimpleNamespace

    from heterosim.validation.validate import _memory_comparison

    gib = 2**30
    res = SimpleNamespace(memory=(SimpleNamespace(peak=SimpleNamespace(reserved=70 * gib, allocated=60 * gib)),
                                  SimpleNamespace(peak=SimpleNamespace(reserved=80 * gib, allocated=75 * gib))))
    c = _memory_comparison({"peak_memory_GiB": 82.4, "tokens_per_s": 1}, res)
    assert (c.metric, c.measured, c.predicted) == ("peak_memory_GiB", 82.4, 80.0)
    assert c.error == pytest.approx(80 / 82.4 - 1)
    assert "torch.cuda.max_memory_reserved" in c.note
    c = _memory_comparison({"peak_memory_allocated_GiB": "75 (rank 0)"}, res)
    assert (c.metric, c.predicted, c.error) == ("peak_memory_allocated_GiB", 75.0, 0.0)
    assert _memory_comparison({"tokens_per_s": 1}, res) is None
    assert _memory_comparison({"peak_memory_GiB": 80}, SimpleNamespace(memory=())) is None


def test_cases_run_in_this_process_are_collected_one_by_one(tmp_path, monkeypatch):
    """jobs=1 runs a full garbage collection after every case, so what a case left in reference
    cycles is gone before the next one starts (Python's own full collections can come many cases later)."""
    import heterosim.validation.validate as v

    calls: list[int] = []
    monkeypatch.setattr(v.gc, "collect", lambda *a: calls.append(1) or 0)
    rep = v.validate(_write(tmp_path, [COLL, {**COLL, "id": "coll-8b"}]), cache_dir=tmp_path / "cache")
    assert [c.status for c in rep.cases] == ["ok", "ok"] and len(calls) == 2


def test_the_launch_scripts_nccl_env_reaches_the_replay_under_the_callers(monkeypatch):
    """A DGX Cloud row replays with its recipe's NCCL_NVLS_ENABLE=0; what the caller passes is
    added, and wins where both name a variable."""
    import importlib

    import heterosim.cluster
    import heterosim.validation.validate as v
    from heterosim.validation.cases import load_cases

    class Stop(Exception):
        pass

    seen = []

    def fake_simulate(trace, cluster, kernel_db=None, *, nccl_env=None, **kw):
        seen.append(nccl_env)
        raise Stop

    monkeypatch.setattr(v, "cached_trace", lambda flags, world, cache, **kw: (None, type("T", (), {"layout": None})()))
    monkeypatch.setattr(heterosim.cluster, "load_cluster", lambda *a, **k: None)
    monkeypatch.setattr(importlib.import_module("replay.simulate"), "simulate", fake_simulate)
    hopper = Path(__file__).resolve().parents[1] / "validation" / "hopper_cases.yaml"
    case = next(c for c in load_cases(hopper) if c.id == "e2e-dgxc-v24.11.1-llama3.1-8b-bf16-8gpu")
    for caller, want in ((None, {"NCCL_NVLS_ENABLE": "0"}),
                         ({"NCCL_ALGO": "Ring"}, {"NCCL_NVLS_ENABLE": "0", "NCCL_ALGO": "Ring"}),
                         ({"NCCL_NVLS_ENABLE": "1"}, {"NCCL_NVLS_ENABLE": "1"})):
        with pytest.raises(Stop):
            v._e2e(case, None, caller, None)
        assert seen.pop() == want


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_case_past_its_time_limit_fails_alone(tmp_path, monkeypatch, jobs):
    """case_timeout 0.5 s: a case that computes for 3 s is stopped and reported as an error naming
    the limit and the ways round it; the other case runs (in this process and in forked workers)."""
    import time

    import heterosim.validation.validate as v

    real = v.run_case

    def slow(case, **kw):
        if case.id == "coll-slow":
            end = time.process_time() + 3
            while time.process_time() < end:
                pass
        return real(case, **kw)

    monkeypatch.setattr(v, "run_case", slow)
    t0 = time.perf_counter()
    rep = v.validate(_write(tmp_path, [{**COLL, "id": "coll-slow"}, COLL]), cache_dir=tmp_path / "cache",
                     jobs=jobs, case_timeout=0.5)
    by = {c.id: c for c in rep.cases}
    assert by["coll-8"].status == "ok" and time.perf_counter() - t0 < 2.5
    assert by["coll-slow"].status == "error"
    assert by["coll-slow"].message == (
        "TimeLimitError: case coll-slow ran past its 0.5 s CPU-time limit and was stopped; run it alone with a "
        "larger --case-timeout (0: no limit), or replay its cached trace with python -m replay simulate")
    with pytest.raises(ConfigError, match=r"case timeout -1: give seconds >= 0 \(0: no limit\)"):
        v.validate(_write(tmp_path, [COLL]), case_timeout=-1)


def test_time_waited_does_not_count_against_the_limit(tmp_path, monkeypatch):
    """The limit is CPU time: a case that waits 1 s (a loaded machine, a capture worker it waits on)
    under a 0.5 s limit is not stopped."""
    import time

    import heterosim.validation.validate as v

    real = v.run_case

    def waits(case, **kw):
        time.sleep(1.0)
        return real(case, **kw)

    monkeypatch.setattr(v, "run_case", waits)
    rep = v.validate(_write(tmp_path, [COLL]), cache_dir=tmp_path / "cache", case_timeout=0.5)
    assert [c.status for c in rep.cases] == ["ok"]


def test_power_capped_boards_run_at_the_slowest_and_the_case_says_so(tmp_path):
    """Two H100s (power-capped, 1.5% board spread): tensor work at the slower of two boards, 0.86 x
    (1 - 0.5895 x 0.015) = 0.852 of boost (Blom's z for 2 draws), printed with the case; with
    ``slowest_board=False`` at the mean board's 0.86, and the prediction is faster."""
    from heterosim.validation.validate import validate

    hw = {"gpu": "NVIDIA H100 80GB HBM3 (SXM5)", "gpus_per_node": 8, "system": "DGX H100",
          "intra_node": "NVLink4 + NVSwitch", "inter_node": "InfiniBand NDR, 8 x 400 Gb/s"}
    case = {**E2E, "id": "h100-2gpu", "hardware": hw, "precision": "bf16",
            "parallelism": {**E2E["parallelism"], "dp": 2}, "batch": {"micro": 4, "global": 8}}
    path, cache = _write(tmp_path, [case]), tmp_path / "cache"
    slow, mean = (validate(path, cache_dir=cache, slowest_board=s).cases[0] for s in (True, False))
    note = [a for a in slow.assumptions if a.startswith("tensor clock")]
    assert note == ["tensor clock 0.852 of boost: the expected slowest of 2 H100-SXM5-80GB boards (mean board "
                    "0.860; docs/calibration.md, board-to-board spread)"]
    assert not any(a.startswith("tensor clock") for a in mean.assumptions)
    assert slow.comparisons[0].predicted > mean.comparisons[0].predicted
