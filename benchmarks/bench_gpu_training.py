"""Real training of models/pretrain_gpt.py on one CUDA GPU, timed per iteration. Needs a CUDA GPU.

Why: ``replay validate`` has no Hopper training run among the public cases. This script measures
one on the GPU at hand, with the same Megatron-style code that capture records, so that
``python -m replay validate validation/heterosim_gpu_runs.yaml`` can compare a prediction with it.

Parameters and activations live on the GPU (torch's default device); the synthetic batches are
drawn on the CPU exactly as pretrain_gpt draws them, then copied over. Each iteration is timed
between CUDA synchronizations at the end of its optimizer step; the median is taken over the
last two thirds of the iterations (the first pays cuBLAS/cuDNN set-up and leaves boost clocks
behind). NVML's SM clock and board power are sampled every 20 ms when pynvml is present.

    python benchmarks/bench_gpu_training.py                 # the two shipped configurations
    python benchmarks/bench_gpu_training.py -- --num-layers 4 --hidden-size 1024 ...  # any flags
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS = {
    # The two runs of validation/heterosim_gpu_runs.yaml (measured on an H100 SXM5, 2026-11-26;
    # the ffn size, 4 x hidden, was left to its default then).
    "gpt-1.3b": "--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --ffn-hidden-size 8192 --seq-length 2048 "
                "--max-position-embeddings 2048 --vocab-size 51200 --micro-batch-size 4 --global-batch-size 32 "
                "--bf16 --train-iters 12",
    "gpt-8x4096": "--num-layers 8 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 16384 --seq-length 2048 "
                  "--max-position-embeddings 2048 --vocab-size 51200 --micro-batch-size 2 --global-batch-size 16 "
                  "--bf16 --train-iters 12",
}


def _nvml_sampler(stop: threading.Event, out: list) -> None:
    try:
        import pynvml  # noqa: PLC0415 -- optional telemetry
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # noqa: BLE001
        return
    while not stop.is_set():
        try:
            out.append((time.perf_counter(), pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                        pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0))
        except Exception:  # noqa: BLE001
            return
        time.sleep(0.02)


def run(flags: list[str]) -> dict:
    """Train with ``flags`` on cuda:0; per-iteration seconds, the steady median, NVML samples."""
    import torch

    import models.pretrain_gpt as pg
    from models.optimizer import MixedPrecisionAdam

    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("RANK", "0")
    draw = pg.synthetic_batch

    def batch_on_gpu(*a, **k):
        with torch.device("cpu"):
            ids, labels = draw(*a, **k)
        return ids.to("cuda", non_blocking=True), labels.to("cuda", non_blocking=True)

    stamps: list[float] = []
    step = MixedPrecisionAdam.step

    def timed_step(self):
        r = step(self)
        torch.cuda.synchronize()
        stamps.append(time.perf_counter())
        return r

    samples: list = []
    stop = threading.Event()
    sampler = threading.Thread(target=_nvml_sampler, args=(stop, samples), daemon=True)
    pg.synthetic_batch, MixedPrecisionAdam.step = batch_on_gpu, timed_step
    try:
        cfg = pg.parse_args(flags, 1)
        pg._init_distributed(1, 0)
        sampler.start()
        t0 = time.perf_counter()
        with torch.device("cuda"):
            losses = pg.train(cfg, 0)
    finally:
        stop.set()
        pg.synthetic_batch, MixedPrecisionAdam.step = draw, step
    its = [b - a for a, b in zip([t0] + stamps[:-1], stamps)]
    first_steady = len(its) // 3
    steady = sorted(its[first_steady:])
    t_steady = stamps[first_steady - 1] if first_steady else t0
    late = [(c, p) for t, c, p in samples if t >= t_steady]
    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
            "flags": flags, "iteration_s": its, "median_steady_s": steady[len(steady) // 2],
            "loss_first_last": [losses[0], losses[-1]] if losses else [],
            "max_mem_GiB": torch.cuda.max_memory_allocated() / 2**30,
            "sm_mhz_mean": sum(c for c, _ in late) / len(late) if late else None,
            "power_w_mean": sum(p for _, p in late) / len(late) if late else None}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write every result (per-iteration times too) to this file")
    a = ap.parse_args(argv[:cut])
    import torch

    if not torch.cuda.is_available():
        print("bench_gpu_training: needs a CUDA GPU", file=sys.stderr)
        return 2
    runs = {"custom": argv[cut + 1:]} if cut < len(argv) else {k: v.split() for k, v in CONFIGS.items()}
    results = {}
    print(f"{'config':<12} {'median s/it':>11} {'SM MHz':>7} {'power W':>8} {'mem GiB':>8}  device")
    for name, flags in runs.items():
        r = results[name] = run(flags)
        clk = f"{r['sm_mhz_mean']:.0f}" if r["sm_mhz_mean"] else "-"
        pw = f"{r['power_w_mean']:.0f}" if r["power_w_mean"] else "-"
        print(f"{name:<12} {r['median_steady_s']:>11.4f} {clk:>7} {pw:>8} {r['max_mem_GiB']:>8.1f}  "
              f"{r['device']} (torch {r['torch']}, CUDA {r['cuda']})")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
