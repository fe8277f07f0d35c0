"""Eager PyTorch dispatch cost per op class, on the CPU this runs on (no GPU needed).

Usage::

    .venv/bin/python benchmarks/bench_dispatch.py [--repeats 7] [--ops 2000] [--json]

Each op class is timed as CPU time of the calling thread (``time.thread_time_ns``, one intra-op
thread), per op, ``--repeats`` times over ``--ops`` ops; the table gives the minimum and the
median over the repeats (the minimum is the figure to record: on a loaded machine other processes
only ever add time). Tensors are on the ``meta`` device: every layer of an eager op runs (Python
call, argument parsing, the dispatcher, autograd recording, shape and dtype inference) but no
kernel and no memory, which is the CPU-side work a CUDA op does before its launch. The launch
itself (``cudaLaunchKernel``) cannot be timed without a GPU: :data:`heterosim.cluster.spec.CUDA_LAUNCH_US`
adds its published cost.

Classes (the keys of a cluster file's ``cpu.dispatch_us``, docs/clusters.md):

- ``fwd``: a forward op on tensors that require grad (Python call + autograd node), the mean of
  linear, add, gelu, layer_norm, softmax.
- ``bwd``: one node of ``loss.backward()`` (C++ autograd engine, no Python), measured on a chain
  of ``--ops`` elementwise nodes.
- ``nograd``: a Python op outside autograd (optimizer and gradient-sync arithmetic).
- ``collective``: ``dist.all_reduce`` on torch's ``fake`` process group (Python + c10d; the NCCL
  enqueue is priced as a launch).
- ``wait``: ``Work.wait()`` of an async collective.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

_DEV = "cpu"
"""Tiny CPU tensors (8 x 64): their kernels take well under a microsecond. ``meta`` tensors would
skip the kernel, but many meta functions are Python decompositions (layer_norm, softmax, gelu)
slower than the C++ kernels they stand for."""


def _per_op_us(fn, n: int, repeats: int) -> list[float]:
    """CPU time per op (us) of ``fn(n)`` over ``repeats`` runs, after one warm-up run."""
    fn(min(n, 50))
    out = []
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        fn(n)
        out.append((time.thread_time_ns() - t0) / 1e3 / n)
    return out


def _fwd(n: int) -> None:
    x = torch.empty(8, 64, device=_DEV, requires_grad=True)
    w = torch.empty(64, 64, device=_DEV, requires_grad=True)
    for _ in range(n // 5):
        y = F.linear(x, w)
        y = y + x
        y = F.gelu(y)
        y = F.layer_norm(y, (64,))
        y = torch.softmax(y, -1)


def _bwd_chain(n: int):
    x = torch.empty(8, 64, device=_DEV, requires_grad=True)
    y = x
    for _ in range(n):
        y = y * 1.5
    return y.sum()


def _nograd(n: int) -> None:
    p = torch.empty(8, 64, device=_DEV)
    g = torch.empty(8, 64, device=_DEV)
    with torch.no_grad():
        for _ in range(n):
            p.add_(g, alpha=-1e-3)


def _collective(n: int, async_op: bool = False, wait: bool = False) -> None:
    import torch.distributed as dist

    t = torch.zeros(4)
    for _ in range(n):
        w = dist.all_reduce(t, async_op=async_op)
        if wait:
            w.wait()


def measure(ops: int, repeats: int) -> dict[str, list[float]]:
    """Per-op CPU microseconds of every class, one list entry per repeat."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    out = {"fwd": _per_op_us(_fwd, ops, repeats), "nograd": _per_op_us(_nograd, ops, repeats)}
    bwd = []
    for _ in range(repeats + 1):
        loss = _bwd_chain(ops)
        t0 = time.thread_time_ns()
        loss.backward()
        bwd.append((time.thread_time_ns() - t0) / 1e3 / (ops + 1))
    out["bwd"] = bwd[1:]
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        out["collective"] = _per_op_us(_collective, ops, repeats)
        both = _per_op_us(lambda n: _collective(n, async_op=True, wait=True), ops, repeats)
        asyn = _per_op_us(lambda n: _collective(n, async_op=True), ops, repeats)
        out["wait"] = [max(b - a, 0.0) for b, a in zip(both, asyn)]
    finally:
        dist.destroy_process_group()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    a = ap.parse_args()
    res = measure(a.ops, a.repeats)
    from replay.host import CUDA_LAUNCH_US

    rows = {k: (min(v), statistics.median(v)) for k, v in res.items()}
    if a.json:
        print(json.dumps({"torch": torch.__version__, "cuda_launch_us": CUDA_LAUNCH_US,
                          "min_us": {k: round(v[0], 2) for k, v in rows.items()},
                          "median_us": {k: round(v[1], 2) for k, v in rows.items()}}))
        return
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), "unknown CPU") if Path("/proc/cpuinfo").exists() else "?"
    print(f"eager dispatch per op, CPU time of one thread, torch {torch.__version__}, {cpu}")
    print(f"{'class':<12}{'min us':>9}{'median us':>11}{'+ launch us':>13}")
    for k, (lo, med) in rows.items():
        launch = CUDA_LAUNCH_US if k in ("fwd", "bwd", "nograd", "collective") else 0.0
        print(f"{k:<12}{lo:9.2f}{med:11.2f}{lo + launch:13.2f}")


if __name__ == "__main__":
    main()
