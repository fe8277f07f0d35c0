"""Capture benchmark: wall time, peak RSS and trace size for cluster-scale captures.

    python benchmarks/bench_capture.py [--only gpt3-175b|llama-405b]

Targets (issue 2, 2-core machine): GPT-3 175B TP8 PP8 DP16 (1024 GPUs), global batch 1536,
micro-batch 1, all roles in <= 60 s and <= 2 GB peak RSS, trace <= 20 MB; LLaMA-405B-shaped TP8
PP16 on 16,384 GPUs in <= 120 s. ``llama3.1-70b-h100`` is the smallest Llama 3.1 70B row of
``validation/hopper_cases.yaml`` as ``replay validate`` reads it (NVIDIA's DGX H100 recipe: TP4 PP4
CP2 VPP5, TE's TP overlap, distributed optimizer with overlapped reduce and gather, 64 micro-batches):
an interleaved pipeline, where chunks built alike share their blocks (``docs/capture.md``).
The CPU column is every process's user + system time (wall includes other load on the machine).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "models" / "pretrain_gpt.py")

CASES = {
    "gpt3-175b": dict(
        world=1024,
        args=["--preset", "gpt3-175b", "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "8",
              "--micro-batch-size", "1", "--global-batch-size", "1536", "--sequence-parallel", "--bf16",
              "--use-distributed-optimizer", "--train-iters", "1"],
        limits=(60.0, 2.0, 20.0),
    ),
    "llama-405b": dict(
        world=16384,
        args=["--preset", "llama-405b", "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "16",
              "--decoder-first-pipeline-num-layers", "7", "--decoder-last-pipeline-num-layers", "7",
              "--micro-batch-size", "1", "--global-batch-size", "2048", "--sequence-parallel", "--bf16",
              "--use-distributed-optimizer", "--train-iters", "1"],
        limits=(120.0, 2.0, 20.0),
    ),
    "llama3.1-70b-h100": dict(
        world=64,
        args=["--num-layers", "80", "--hidden-size", "8192", "--num-attention-heads", "64", "--seq-length", "8192",
              "--vocab-size", "128256", "--max-position-embeddings", "8192", "--ffn-hidden-size", "28672",
              "--group-query-attention", "--num-query-groups", "8", "--swiglu", "--normalization", "RMSNorm",
              "--position-embedding-type", "rope", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
              "--hidden-dropout", "0.0", "--cross-entropy-loss-fusion", "--tensor-model-parallel-size", "4",
              "--pipeline-model-parallel-size", "4", "--context-parallel-size", "2",
              "--num-layers-per-virtual-pipeline-stage", "4", "--sequence-parallel", "--tp-comm-overlap",
              "--tp-comm-overlap-sm-margin", "proj_fprop=24,fc2_fprop=16", "--overlap-p2p-communication",
              "--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "39321600",
              "--overlap-param-gather", "--grad-reduce-in-bf16", "--micro-batch-size", "1",
              "--global-batch-size", "128", "--bf16", "--attention-backend", "fused"],
        limits=(60.0, 2.0, 20.0),
    ),
}


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _dir_mb(p: Path) -> float:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=sorted(CASES))
    a = ap.parse_args()
    rows = []
    for name, case in CASES.items():
        if a.only and name != a.only:
            continue
        with tempfile.TemporaryDirectory() as td:
            out = Path(td) / "trace"
            t0, c0 = time.perf_counter(), _cpu_children()
            p = subprocess.run([sys.executable, "-m", "capture", "--world-size", str(case["world"]), "-o", str(out),
                                SCRIPT, *case["args"]], cwd=ROOT, capture_output=True, text=True)
            wall, cpu = time.perf_counter() - t0, _cpu_children() - c0
            if p.returncode != 0:
                print(p.stderr, file=sys.stderr)
                return 1
            # Largest RSS of any finished child process (the capture parent or one of its workers).
            rss_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / 1e9
            insp = subprocess.run([sys.executable, "-m", "capture", "--inspect", str(out), "--json"], cwd=ROOT,
                                  capture_output=True, text=True).stdout
            nroles = len(json.loads(insp)["roles"])
            rows.append((name, case["world"], nroles, wall, cpu, rss_gb, _dir_mb(out), case["limits"]))
    print(f"{'case':<18} {'GPUs':>6} {'roles':>5} {'wall s':>8} {'CPU s':>7} {'peak RSS GB':>12} {'trace MB':>9}"
          "  limits (s, GB, MB)")
    for name, world, nroles, wall, cpu, rss, mb, lim in rows:
        ok = wall <= lim[0] and rss <= lim[1] and mb <= lim[2]
        print(f"{name:<18} {world:>6} {nroles:>5} {wall:>8.1f} {cpu:>7.1f} {rss:>12.2f} {mb:>9.2f}  {lim}  "
              f"{'ok' if ok else 'OVER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
