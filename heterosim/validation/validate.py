"""``replay validate``: predict published training runs and collective benchmarks, report the error.

For an end-to-end case: :func:`case_inputs` gives ``models/pretrain_gpt.py`` flags
(:func:`heterosim.validation.cases.megatron_flags`), or for a source naming torchtitan the command
line of torchtitan's own trainer (:mod:`heterosim.validation.titan`), the world size and a cluster;
the program is captured (``--ranks auto``; traces cached under ``cache_dir`` by a hash of the
command, the files it names, world size, the code of ``capture/`` and ``models/`` and torchtitan's
version),
replayed with :func:`replay.simulate.simulate`, and compared with the measured iteration time
(measured, or derived by the source from its TFLOP/s) and TFLOP/s per GPU counted in the
source's own FLOP convention (:func:`heterosim.validation.cases.flop_convention`: the SC'21 table counts the
recompute forward, i.e. ``flop_totals(trace)["hardware"]``). For a collective case: every
measured ``*busbw_GBps`` figure is planned by ``ncclshim`` on the case's cluster at the message
size the source used.

Nothing here reads a measured number to set a prediction: calibration lives in
``kernel_db/data`` and ``ncclshim/constants.py`` and applies to every case alike
(``docs/calibration.md``).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import math
import os
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from heterosim.errors import ConfigError, HeteroSimError, TimeLimitError

from .cases import Case, CaseInputs, cluster_for, flop_convention, load_cases, megatron_flags, positive_int
from .phrases import leading_number
from .report import SCHEMA_VERSION, CaseResult, Comparison, Report
from .titan import asset_args, names_torchtitan, titan_inputs, write_assets

__all__ = ["Comparison", "CaseResult", "Report", "validate", "run_case", "case_inputs", "capture_cached", "cached_key",
           "code_version", "DEFAULT_CACHE_DIR", "SCHEMA_VERSION"]

DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "heterosim" / "traces"
_SCRIPT = Path(__file__).resolve().parents[2] / "models" / "pretrain_gpt.py"
# How close F/(T x GPUs) must come to a source's TFLOP/s for a convention to be inferred from a
# case that states both but names no convention (rounding of published 3-4 digit figures).
_INFER_TOL = 0.03


# --------------------------------------------------------------------------------- capturing
def code_version() -> str:
    """Hash of the sources a capture depends on (``capture/``, ``models/``, the trace IR and the
    annotation API)."""
    root = _SCRIPT.parent.parent
    h = hashlib.sha256()
    for pkg in ("capture", "models", "heterosim/trace", "heterosim/annotate.py"):
        paths = [root / pkg] if pkg.endswith(".py") else sorted((root / pkg).rglob("*.py"))
        for p in paths:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def capture_cached(flags: Sequence[str], world_size: int, cache_dir: str | os.PathLike | None = None,
                   *, script: str | os.PathLike = _SCRIPT, module: str = "") -> Path:
    """The trace of ``script flags`` (or ``python -m module flags``) at ``world_size`` (``--ranks
    auto``), captured once per (command, world size, code version) under ``cache_dir``."""
    return cached_trace(flags, world_size, cache_dir, script=script, module=module)[0]


def _module_version(module: str) -> str:
    """The installed version of the distribution a captured module comes from ('' for none)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module.split(".")[0]) if module else ""
    except PackageNotFoundError:
        return ""


def cached_key(flags: Sequence[str], world_size: int, *, script: str | os.PathLike = _SCRIPT, module: str = "") -> str:
    """The cache entry's name for ``script flags`` (or ``-m module flags``) at ``world_size``: a hash
    of them, the content of every file a flag names (torchtitan's config), ``--ranks auto``,
    :func:`code_version` and the module's installed version."""
    what = {"module": module, "version": _module_version(module)} if module else {"script": Path(script).name}
    files = {f: hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in flags if os.path.isfile(f)}
    if files:
        what["files"] = files
    return hashlib.sha256(json.dumps({**what, "flags": list(flags), "world": world_size,
                                      "ranks": "auto", "code": code_version()}).encode()).hexdigest()[:20]


def cached_trace(flags: Sequence[str], world_size: int, cache_dir: str | os.PathLike | None = None,
                 *, script: str | os.PathLike = _SCRIPT, module: str = "") -> tuple[Path, Any]:
    """(directory, loaded trace) of :func:`capture_cached`: the trace is read once, whether it
    comes from the cache or from a fresh capture. A ``module`` capture (torchtitan) reads the
    tokenizer and dataset :func:`heterosim.validation.titan.write_assets` keeps under ``cache_dir``."""
    from capture.api import capture
    from heterosim.errors import TraceSchemaError
    from heterosim.trace.store import load_trace

    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    out = cache / cached_key(flags, world_size, script=script, module=module)
    if (out / "trace.json").is_file():
        try:
            return out, load_trace(out)
        except TraceSchemaError:  # a damaged cache entry (a crash, a full disk): capture it again
            shutil.rmtree(out, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    if module:
        extra = asset_args(write_assets(cache / "torchtitan-assets"))
        with _output_to(out.with_suffix(".log")):  # the trainer's own log, kept beside the entry
            capture(module, [*flags, *extra], out, world_size=world_size, ranks="auto", module=True)
    else:
        capture(str(script), list(flags), out, world_size=world_size, ranks="auto")
    return out, load_trace(out)


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (and so its forked workers') appended to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    try:
        with open(path, "ab") as f:
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        for fd in saved:
            os.close(fd)


def case_inputs(case: Case) -> CaseInputs:
    """What an end-to-end case runs: torchtitan's trainer where its source names torchtitan
    (:func:`heterosim.validation.titan.titan_inputs`), else ``models/pretrain_gpt.py``
    (:func:`heterosim.validation.cases.megatron_flags`)."""
    return titan_inputs(case) if names_torchtitan(case) else megatron_flags(case)


# ------------------------------------------------------------------------------------- cases
def _num(v: Any) -> tuple[float | None, bool]:
    """(value, approximate) of a measured field: 3.53, '~200 (still rising)'; (None, False) else."""
    if isinstance(v, bool):
        return None, False
    if isinstance(v, (int, float)):  # a measured time or rate is finite and positive
        return (float(v), False) if math.isfinite(v) and v > 0 else (None, False)
    got = leading_number(str(v))
    return got if got is not None and got[0] > 0 else (None, False)

_TIME_UNIT = re.compile(r"^[\d.,\s~]*(ms|milliseconds?|s|secs?|seconds?)\b", re.I)
_RATE_UNIT = re.compile(r"^[\d.,\s~kKmM]*(tokens?|tok|samples?|sequences?|seqs?)\s*/\s*s(?:ec)?\b"
                        r"(\s*/\s*gpu|\s+per\s+gpu)?", re.I)


def _from_units(meas: Mapping[str, Any], gbs: int, seq: int, world: int) -> tuple[float | None, str]:
    """(iteration time, note) from a measured value that carries its unit in its text ("step_time:
    2300 ms", "throughput: 3,890 tokens/s/GPU"), for a key that does not say it."""
    for key, value in meas.items():
        text, (v, _) = str(value), _num(value)
        if not v or not isinstance(value, str):
            continue
        t = _TIME_UNIT.match(text)
        if t and re.search(r"time|step|iter|latency", key, re.I):
            return (v / 1000 if t.group(1).lower().startswith("m") else v), f"from {key} ({text.strip()})"
        r = _RATE_UNIT.match(text)
        if r:
            per_gpu = bool(r.group(2)) or "gpu" in key.lower()
            unit = "tokens" if r.group(1).lower().startswith("tok") else "sequences"
            work = gbs * (seq if unit == "tokens" else 1)
            return work / (v * (world if per_gpu else 1)), f"derived: {work:,} {unit} / {key} ({text.strip()})"
    return None, ""


# Measured fields that give the iteration time by another name: (keys, per what).
_TIME_KEYS = {("iteration_time_ms", "step_time_ms", "time_per_step_ms"): 1e-3,
              ("step_time_s", "time_per_step_s", "train_step_time_s", "seconds_per_step"): 1.0}
_RATE_KEYS = {  # tokens (or sequences) per second, whole job or per GPU
    ("tokens_per_s", "tokens_per_sec", "throughput_tokens_per_s"): ("tokens", False),
    ("tokens_per_s_per_gpu", "tokens_per_sec_per_gpu", "tokens_per_gpu_per_s"): ("tokens", True),
    ("samples_per_s", "sequences_per_s", "samples_per_sec"): ("samples", False),
    ("samples_per_s_per_gpu", "sequences_per_s_per_gpu"): ("samples", True),
}


def _time_from_rate(meas: Mapping[str, Any], inputs: CaseInputs) -> tuple[float | None, str]:
    """(iteration time, note) from a measured step time in other units or a throughput: a step
    holds global batch x sequence length tokens (``inputs``' values); None when none is given."""
    for keys, scale in _TIME_KEYS.items():
        for k in keys:
            v, _ = _num(meas.get(k))
            if v:
                return v * scale, f"from {k}"
    f, world = list(inputs.flags), inputs.world_size
    gbs = inputs.global_batch or int(f[f.index("--global-batch-size") + 1])
    seq = inputs.seq_len or int(f[f.index("--seq-length") + 1])
    for keys, (unit, per_gpu) in _RATE_KEYS.items():
        for k in keys:
            v, _ = _num(meas.get(k))
            if v:
                work = gbs * (seq if unit == "tokens" else 1)
                return work / (v * (world if per_gpu else 1)), (
                    f"derived: global batch {gbs}{f' x seq {seq}' if unit == 'tokens' else ''} / {k}"
                    + (f" x {world} GPUs" if per_gpu else ""))
    return _from_units(meas, gbs, seq, world)


_MEMORY_KEYS = {"peak_memory_GiB": "reserved", "peak_memory_reserved_GiB": "reserved",
                "peak_memory_allocated_GiB": "allocated"}
"""A source's peak device memory (GiB) -> the allocator peak it is: a bare "peak memory" is what
training logs print (torchtitan's and Megatron's ``max_memory_reserved``)."""


def _memory_comparison(meas: Mapping[str, Any], res: Any) -> Comparison | None:
    """The measured peak memory against the largest peak over the job's ranks of PyTorch's caching
    allocator (``replay.memory``), where the case gives one and the trace records memory."""
    for key, which in _MEMORY_KEYS.items():
        v, _ = _num(meas.get(key))
        if v and res.memory:
            pred = max(getattr(m.peak, which) for m in res.memory) / 2**30
            return Comparison(metric=key, measured=v, predicted=pred, error=pred / v - 1,
                              note=f"the largest over ranks of torch.cuda.max_memory_{which} (CUDA context and "
                                   "NCCL buffers not counted)")
    return None


def _missing_feature(msg: str) -> str | None:
    """The feature an error says is missing (capture raising on an unsupported flag), or None."""
    low = msg.lower()
    for key in ("not supported", "unsupported", "not implemented", "notimplementederror", "unrecognized arguments"):
        if key in low:
            return msg.strip().splitlines()[-1][:300]
    return None


def _e2e(case: Case, cache_dir: Any, nccl_env: Any, kernel_db: Any, slowest_board: bool = True) -> CaseResult:
    from heterosim.cluster import load_cluster
    from heterosim.trace.ir import flop_totals
    from replay.simulate import simulate

    try:
        inputs: CaseInputs = case_inputs(case)
    except ConfigError as e:
        miss = _missing_feature(str(e))
        if miss:
            return CaseResult(id=case.id, category=case.category, status="missing_feature", message=miss)
        raise
    notes = list(inputs.assumptions)
    try:
        _, trace = cached_trace(inputs.flags, inputs.world_size, cache_dir, module=inputs.module)
    except HeteroSimError as e:
        miss = _missing_feature(str(e))
        if miss:
            return CaseResult(id=case.id, category=case.category, status="missing_feature",
                              assumptions=tuple(notes), message=f"capture cannot run it: {miss}")
        raise
    cluster = load_cluster(inputs.cluster, num_gpus=inputs.world_size, layout=trace.layout)
    # The launch script's NCCL environment, under what the caller sets (an experiment's override).
    res = simulate(trace, cluster, kernel_db, nccl_env={**inputs.nccl_env, **dict(nccl_env or {})},
                   slowest_board=slowest_board)
    t_pred = res.iteration_time_s
    notes += [f"tensor clock {c['priced']:.3f} of boost: the expected slowest of {c['boards']:,} {t} boards "
              f"(mean board {c['mean_board']:.3f}; docs/calibration.md, board-to-board spread)"
              for t, c in res.slowed_clocks.items()]
    flops = flop_totals(trace)
    meas = case.measured
    t_meas, _ = _num(meas.get("iteration_time_s"))
    t_note = ""
    if t_meas is None:
        t_meas, t_note = _time_from_rate(meas, inputs)
        t_meas = t_meas or None
    conv = flop_convention(case)
    tf_meas, _ = _num(meas.get("tflops_per_gpu"))
    if conv is None and tf_meas and t_meas:  # infer which count the source's TFLOP/s used
        for name in ("hardware", "model"):
            if abs(flops[name] / (t_meas * inputs.world_size) / 1e12 / tf_meas - 1) < _INFER_TOL:
                conv = name
                notes.append(f"FLOP convention not stated: its TFLOP/s match the {name} count "
                             f"({'recompute forward counted, 96·B·s·l·h²' if name == 'hardware' else '72·B·s·l·h²'}) "
                             "within 3% of the published time")
                break
    if t_meas is None:
        t_meas, _ = _num(meas.get("iteration_time_s_derived"))
        if t_meas is not None and conv is not None and tf_meas:
            # Re-derive from the published TFLOP/s with the trace's count (exact; the file's
            # derived value is rounded to 2-3 digits).
            t_meas = flops[conv] / (tf_meas * 1e12 * inputs.world_size)
            t_note = f"derived: {conv} FLOPs / (published TFLOP/s x GPUs)"
    comps = []
    if t_meas:
        comps.append(Comparison(metric="iteration_time_s", measured=t_meas, predicted=t_pred,
                                error=t_pred / t_meas - 1, note=t_note))
    if tf_meas and conv is not None:
        tf_pred = flops[conv] / (t_pred * inputs.world_size) / 1e12
        comps.append(Comparison(metric="tflops_per_gpu", measured=tf_meas, predicted=tf_pred,
                                error=tf_pred / tf_meas - 1, note=f"{conv} FLOP count"))
    mem = _memory_comparison(meas, res)
    if mem is not None:
        comps.append(mem)
    b = res.breakdown
    detail = {"world_size": inputs.world_size, "gpu": inputs.gpu, "flags": list(inputs.flags),
              "flop_convention": conv, "compute_s": b.compute_s, "bubble_s": b.bubble_s,
              "exposed_comm_s": dict(b.exposed_comm_s), "mfu": res.mfu}
    if not comps:
        return CaseResult(id=case.id, category=case.category, status="error", assumptions=tuple(notes),
                          message="no measured iteration_time_s or tflops_per_gpu to compare", detail=detail)
    return CaseResult(id=case.id, category=case.category, status="ok", comparisons=tuple(comps),
                      assumptions=tuple(notes), detail=detail)


_WORD_NUM = {"single": 1, "one": 1, "two": 2, "three": 3, "four": 4, "eight": 8}


def _coll(case: Case, nccl_env: Any) -> CaseResult:
    import ncclshim
    from heterosim.cluster import load_cluster
    from ncclshim.view import topology_view

    col, hw = case.collective, case.hardware
    op = str(col.get("op", "all_reduce"))
    gpn = positive_int(hw.get("gpus_per_node") or 8, "hardware.gpus_per_node")
    env = dict(nccl_env or {})
    notes: list[str] = []
    m = re.search(r"NCCL_ALGO=(\w+)", case.notes)
    if m and "NCCL_ALGO" not in env:
        env["NCCL_ALGO"] = m.group(1)
        notes.append(f"NCCL_ALGO={m.group(1)} as the source recommends for representative numbers")
    tool_max = re.search(r"-e\s*(\S+)", str(col.get("tool", "")))  # parse_size refuses what it cannot read
    comps, skipped = [], []
    for key, value in case.measured.items():
        if "busbw" not in key or not key.endswith("_GBps") or key.startswith("theoretical"):
            continue
        if re.search(r"hca|nic|link", key):
            skipped.append(f"{key} (a per-device figure, not a collective of the cluster)")
            continue
        val, approx = _num(value)
        if val is None:
            skipped.append(f"{key} (not a number: {value!r})")
            continue
        nodes_m = re.search(r"(single|one|two|three|four|eight|\d+)_node", key)
        gpus_m = re.search(r"(\d+)gpu", key)
        if nodes_m:
            w = nodes_m.group(1)
            nodes = _WORD_NUM.get(w) or int(w)
        else:
            n = re.search(r"\d+", str(col.get("nodes", 1)))
            nodes = int(n.group()) if n else 1
            if not str(col.get("nodes", 1)).strip().isdigit():
                notes.append(f"nodes {col.get('nodes')!r}: {nodes}")
        ranks = int(gpus_m.group(1)) if gpus_m else positive_int(col.get("ranks") or nodes * gpn, "collective.ranks")
        size_m = re.search(r"at_(\d+)(MB|GB)", key)
        if size_m:
            size = int(size_m.group(1)) << (20 if size_m.group(2) == "MB" else 30)
        elif tool_max:
            from ncclshim.bench import parse_size

            size = parse_size(tool_max.group(1))
        else:
            size = 8 << 30
            notes.append(f"{key}: message size not stated: 8 GiB (nccl-tests' -e 8G peak-bandwidth size)")
        spec, _, hw_notes = cluster_for(hw, ranks)
        notes += [n for n in hw_notes if n not in notes]
        cluster = load_cluster(spec, num_gpus=max(ranks, nodes * min(gpn, ranks)))
        view = topology_view(cluster)
        p = ncclshim.plan(op, size, list(range(ranks)), view, env=env or None, dtype="fp32")
        pred = p.busbw / 1e9
        comps.append(Comparison(metric="busbw_GBps", measured=val, predicted=pred, error=pred / val - 1,
                                note=f"{op} {ranks} GPUs / {nodes} node(s), {size >> 20} MiB, {p.algo}/{p.proto}"
                                     + ("; approximate published value" if approx else "")))
    if skipped:
        notes.append("not compared: " + "; ".join(skipped))
    if not comps:
        return CaseResult(id=case.id, category=case.category, status="error", assumptions=tuple(notes),
                          message="no *busbw_GBps measurement this reader can map")
    return CaseResult(id=case.id, category=case.category, status="ok", comparisons=tuple(comps),
                      assumptions=tuple(notes))


def run_case(case: Case, *, cache_dir: str | os.PathLike | None = None, nccl_env: Any = None,
             kernel_db: Any = None, slowest_board: bool = True) -> CaseResult | None:
    """Predict one case; None for categories that are not predictions (spec, kernel).
    ``slowest_board``: as :func:`replay.simulate.simulate`'s (False: every GPU at its model's mean
    board's clock)."""
    if case.problem:
        raise ConfigError(case.problem)
    if case.category == "end_to_end":
        return _e2e(case, cache_dir, nccl_env, kernel_db, slowest_board)
    if case.category == "collective":
        return _coll(case, nccl_env)
    return None


CASE_TIMEOUT_S = 900.0
"""Default limit of one case (capture and replay), seconds of the CPU time of the process that runs
it: the 70 DGX H100 rows take under 3 minutes each cold on two CPUs; a case past it fails alone
(:class:`TimeLimitError`). CPU time, not wall time, so that whether a case passes does not depend
on what else the machine runs. Capture workers run in processes of their own, each bounded by its
per-rank wall-time limit (``capture --timeout``)."""


def validate(path: str | os.PathLike, *, only: Sequence[str] | None = None,
             cache_dir: str | os.PathLike | None = None, nccl_env: Any = None, kernel_db: Any = None,
             progress: Callable[[str], None] | None = None, jobs: int = 1,
             finished: Callable[[str, float], None] | None = None,
             case_timeout: float | None = CASE_TIMEOUT_S, slowest_board: bool = True) -> Report:
    """Run every end-to-end and collective case of ``path`` (or those in ``only``).

    ``jobs`` > 1 runs that many cases at a time, each in a process forked from this one, largest
    world first (the report keeps the file's order and is the same as with ``jobs=1``).
    ``case_timeout``: seconds of CPU time a case may take (None or 0: no limit; see
    :data:`CASE_TIMEOUT_S`); one that runs past it is stopped and reported as an error, and the run
    goes on.
    ``progress(id)`` is called when a case starts, ``finished(id, seconds)`` when it ends (wall
    seconds, capture included); neither enters the report, which stays the same run to run.
    ``slowest_board``: False prices every GPU at its model's mean board's clock (see
    :func:`replay.simulate.simulate`).
    """
    cases = load_cases(path)
    if only:
        ids = {c.id for c in cases}
        bad = [i for i in only if i not in ids]
        if bad:
            raise ConfigError(f"--only {bad[0]!r}: no such case in {path}; ids: {', '.join(sorted(ids))}")
        cases = [c for c in cases if c.id in set(only)]
    todo = [c for c in cases if c.category in ("end_to_end", "collective")]
    if case_timeout is not None and not (math.isfinite(case_timeout) and case_timeout >= 0):
        raise ConfigError(f"case timeout {case_timeout!r}: give seconds >= 0 (0: no limit)")
    kw = {"cache_dir": cache_dir, "nccl_env": nccl_env, "kernel_db": kernel_db, "timeout": case_timeout or None,
          "slowest_board": slowest_board}
    started: dict[int, float] = {}

    def start(i: int) -> None:
        started[i] = time.perf_counter()
        if progress is not None:
            progress(todo[i].id)

    def end(i: int) -> None:
        if finished is not None:
            finished(todo[i].id, time.perf_counter() - started[i])

    if jobs > 1 and len(todo) > 1:
        from heterosim.forkpool import run_forked

        if any(c.category == "end_to_end" for c in todo):
            # Imported once here, not in every forked case (torch, FakeTensorMode, dynamo: ~2-4 CPU
            # s each); importing starts no thread, so forking stays safe. The model package too:
            # every captured rank of every case imports the same 31 modules (~0.1 CPU s). Its
            # modules bind torch's functions at call time, so they see the capture's patches.
            import capture.api  # noqa: F401
            import models.pretrain_gpt  # noqa: F401
            import replay.simulate  # noqa: F401

        results = run_forked(todo, functools.partial(_run_forked, kw=kw), jobs=jobs,
                             order=sorted(range(len(todo)), key=lambda i: -_size_hint(todo[i])),
                             name=lambda i: f"validate case {todo[i].id}", on_start=start, on_done=end,
                             on_result=_learnt)
    else:
        results = []
        for i, c in enumerate(todo):
            start(i)
            results.append(_run_one(c, kw))
            # What a case left in reference cycles goes now, not at Python's next full collection,
            # which can come many cases later while each case's replay state is up to ~1 GB.
            gc.collect()
            end(i)
    return Report(cases=tuple(r for r in results if r is not None))


def _run_forked(case: Case, kw: dict) -> tuple[CaseResult | None, list]:
    """A case in a forked process: its result, and the fake outputs its captures learnt, which the
    cases forked after it inherit (``capture/opcache.py``; same model, same shapes: another data-
    parallel size of one layout captures mostly from these)."""
    opcache = sys.modules.get("capture.opcache")  # imported before the fork when a case captures
    if opcache is None:
        return _run_one(case, kw), []
    opcache.start_exporting()
    return _run_one(case, kw), opcache.exported()


def _learnt(i: int, value: tuple[CaseResult | None, list]) -> CaseResult | None:
    if value[1]:
        from capture import opcache

        opcache.absorb(value[1])
    return value[0]


def _run_one(case: Case, kw: dict) -> CaseResult | None:
    kw = dict(kw)
    timeout = kw.pop("timeout", None)
    try:
        with _time_limit(timeout, case.id):
            return run_case(case, **kw)
    except HeteroSimError as e:
        return CaseResult(id=case.id, category=case.category, status="error", message=f"{type(e).__name__}: {e}")


@contextlib.contextmanager
def _time_limit(seconds: float | None, case_id: str) -> Iterator[None]:
    """Raise :class:`TimeLimitError` in this thread once the process has spent ``seconds`` of CPU
    time after entering (a profiling interval timer: user and system time of all its threads, not
    the time it waits; a no-op without a limit or off the main thread, where signals cannot land).
    What the case had started (forked capture workers) is stopped as the exception unwinds it."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise TimeLimitError(f"case {case_id} ran past its {seconds:g} s CPU-time limit and was stopped; run "
                             f"it alone with a larger --case-timeout (0: no limit), or replay its cached "
                             f"trace with python -m replay simulate")

    previous = signal.signal(signal.SIGPROF, expired)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _size_hint(case: Case) -> int:
    """World size of an end-to-end case (what its capture and replay cost grows with); 0 otherwise."""
    if case.category != "end_to_end":
        return 0
    try:
        return case_inputs(case).world_size
    except HeteroSimError:
        return 0
