"""Replay speed of captured jobs: the cluster-scale runs of issue 14 from real captures.

    .venv/bin/python benchmarks/bench_captured.py                      # every job (captures ~4 min cold)
    .venv/bin/python benchmarks/bench_captured.py --job megascale-175b-12288 --job mtnlg-530b-11200
    .venv/bin/python benchmarks/bench_captured.py --cache-dir ~/.cache/heterosim/traces --overlap-slowdown 0.16

Each job is captured once (``python -m capture --ranks auto`` of ``models/pretrain_gpt.py``, cached
under ``--cache-dir`` by flags, world size and capture code, the cache ``replay validate`` uses),
then replayed in a fresh process (``bench_replay.py --trace``: its own peak RSS), killed after
``--timeout`` s. The table gives the capture's wall seconds (``cached`` when it was there), the
trace's load time and the replay's wall and CPU seconds, the iteration time and peak RSS.

The jobs (2-CPU targets of issue 14: <= 30 s and <= 2 GB each; GPT-3 175B on 1,024 GPUs <= 2 s;
the GPT-1T pipeline <= 10 s):

- ``gpt3-175b-1024``: the README's GPT-3 175B, TP8 PP8 DP16, global batch 1536, SP, distributed
  optimizer, on ``dgx-a100``.
- ``megascale-175b-12288``: GPT-3 175B as MegaScale ran it (Jiang et al., NSDI'24, Table 2:
  12,288 GPUs, TP8 PP8 DP192, interleaved VPP6, global batch 6144 = 32 micro-batches per pipeline),
  SP, distributed optimizer with overlapped gradient reduce and parameter gather, on ``dgx-a100``.
- ``mtnlg-530b-11200``: the SC'21 530B (105 layers, h 20480) at TP8 PP35 DP40, VPP3, 280
  micro-batches per pipeline (global batch 11,200), full recompute, fp16, scatter/gather p2p, as
  ``validation/public_cases.yaml`` runs it at 2,520 GPUs, on ``dgx-a100``.
- ``gpt-1t-3072``: the SC'21 1T case of ``validation/public_cases.yaml`` (TP8 PP64 DP6, 512
  micro-batches per pipeline, 1F1B), on ``dgx-a100``.
- ``hopper-gpt3-175b-fp8-2048``, ``hopper-llama405b-fp8-2304``: rows of
  ``validation/hopper_cases.yaml`` read as ``replay validate`` reads them (NVIDIA's DGX H100
  recipes: TE's TP overlap, fp8, context parallelism for 405B), on ``dgx-h100``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_GPT3 = ["--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads", "96", "--seq-length", "2048",
         "--max-position-embeddings", "2048", "--vocab-size", "51200", "--ffn-hidden-size", "49152",
         "--normalization", "LayerNorm", "--position-embedding-type", "learned_absolute"]
_SC21 = ["--seq-length", "2048", "--vocab-size", "51200", "--max-position-embeddings", "2048",
         "--normalization", "LayerNorm", "--position-embedding-type", "learned_absolute", "--tensor-model-parallel-size", "8",
         "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
         "--micro-batch-size", "1", "--fp16", "--no-async-tensor-model-parallel-allreduce",
         "--scatter-gather-tensors-in-pipeline", "--attention-backend", "unfused", "--attention-dropout", "0.1"]

JOBS: dict[str, tuple[int, str, list[str]] | str] = {
    "gpt3-175b-1024": (1024, "dgx-a100", [
        "--preset", "gpt3-175b", "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "8",
        "--micro-batch-size", "1", "--global-batch-size", "1536", "--bf16", "--train-iters", "1",
        "--sequence-parallel", "--use-distributed-optimizer"]),
    "megascale-175b-12288": (12288, "dgx-a100", [
        *_GPT3, "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "8",
        "--num-layers-per-virtual-pipeline-stage", "2", "--sequence-parallel", "--use-distributed-optimizer",
        "--overlap-grad-reduce", "--overlap-param-gather", "--micro-batch-size", "1", "--global-batch-size", "6144",
        "--bf16", "--attention-backend", "flash"]),
    "mtnlg-530b-11200": (11200, "dgx-a100", [
        "--num-layers", "105", "--hidden-size", "20480", "--num-attention-heads", "128", "--ffn-hidden-size", "81920",
        "--pipeline-model-parallel-size", "35", "--num-layers-per-virtual-pipeline-stage", "1",
        "--global-batch-size", "11200", *_SC21]),
    "gpt-1t-3072": (3072, "dgx-a100", [
        "--num-layers", "128", "--hidden-size", "25600", "--num-attention-heads", "160", "--ffn-hidden-size", "102400",
        "--pipeline-model-parallel-size", "64", "--global-batch-size", "3072", *_SC21]),
    "hopper-gpt3-175b-fp8-2048": "e2e-dgxc-v24.11.1-gpt3-175b-fp8-2048gpu",
    "hopper-llama405b-fp8-2304": "e2e-dgxc-v24.11.1-llama3.1-405b-fp8-2304gpu",
}


def job_inputs(name: str) -> tuple[int, str | dict, list[str]]:
    """(world size, cluster preset or spec, script flags) of a job; case-file jobs as ``replay validate``
    reads them (the cluster built from the row's hardware)."""
    spec = JOBS[name]
    if not isinstance(spec, str):
        return spec
    from heterosim.validation.cases import load_cases, megatron_flags

    case = next(c for c in load_cases(ROOT / "validation" / "hopper_cases.yaml") if c.id == spec)
    inputs = megatron_flags(case)
    return inputs.world_size, inputs.cluster, list(inputs.flags)


def _captured(name: str, cache_dir: str | None) -> tuple[Path, float | None]:
    """The job's trace directory and its capture's wall seconds (None: it was cached)."""
    from heterosim.validation.validate import DEFAULT_CACHE_DIR, capture_cached, cached_key

    world, _, flags = job_inputs(name)
    cache = Path(cache_dir) if cache_dir else DEFAULT_CACHE_DIR
    hit = (cache / cached_key(flags, world) / "trace.json").is_file()
    t0 = time.perf_counter()
    path = capture_cached(flags, world, cache)
    return path, None if hit else time.perf_counter() - t0


def _replay(path: Path, cluster: str | dict, slowdown: float, timeout: float) -> list[str] | None:
    """``bench_replay.py --trace``'s result row, split; None when it ran out of time. A cluster
    given as a spec (what the case reader builds from a row's hardware) goes as a YAML file."""
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(cluster, dict):
            spec = Path(tmp) / "cluster.yaml"
            spec.write_text(yaml.safe_dump(cluster, sort_keys=True))
            cluster = str(spec)
        cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_replay.py"), "--trace", str(path), "--cluster",
               cluster, "--overlap-slowdown", str(slowdown)]
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=True).stdout
        except subprocess.TimeoutExpired:
            return None
    return out.strip().splitlines()[-1].split()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", action="append", choices=sorted(JOBS), help="run only these jobs")
    ap.add_argument("--cache-dir", help="trace cache (default: replay validate's)")
    ap.add_argument("--overlap-slowdown", type=float, default=0.16, metavar="F",
                    help="compute slowdown under concurrent communication (default 0.16, simulate's default)")
    ap.add_argument("--timeout", type=float, default=300.0, metavar="S", help="per-replay limit, s (default 300)")
    a = ap.parse_args(argv)
    print(f"{'job':<26} {'GPUs':>6} {'capture s':>9} {'load s':>7} {'replay s':>9} {'CPU s':>7} {'iter s':>8} "
          f"{'maxRSS GB':>9}", flush=True)
    for name in a.job or list(JOBS):
        world, cluster, _ = job_inputs(name)
        path, cap_s = _captured(name, a.cache_dir)
        row = _replay(path, cluster, a.overlap_slowdown, a.timeout)
        cap = "cached" if cap_s is None else f"{cap_s:.1f}"
        if row is None:
            print(f"{name:<26} {world:>6} {cap:>9} {'replay timed out after':>26} {a.timeout:.0f} s", flush=True)
            continue
        # bench_replay --trace's row: trace, GPUs, load s, replay s, CPU s, iter s, MFU, classes, symmetry, RSS
        load_s, replay_s, cpu_s, iter_s, rss = row[2], row[3], row[4], row[5], row[9]
        print(f"{name:<26} {world:>6} {cap:>9} {load_s:>7} {replay_s:>9} {cpu_s:>7} {iter_s:>8} {rss:>9}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
