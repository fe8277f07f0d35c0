"""Planning speed: 100,000 collectives of mixed sizes on a 1024-GPU topology (target <= 2 s).

Run: ``.venv/bin/python benchmarks/bench_ncclshim.py [--calls 100000] [--nodes 128]``.

The call mix is a Megatron-like job on DGX H100 nodes (TP=8 inside nodes, PP=8, DP=16 across
nodes, rank = tp + 8 * (dp + 16 * pp)): TP all_reduce / all_gather / reduce_scatter and MoE-style
all_to_all on every TP group, DP reduce_scatter / all_gather buckets on every DP group, pipeline
send/recv between stages, and a few world-size all_reduces, each with sizes drawn from a small
set per kind (as a trace repeats layer shapes). Prints a table: calls, distinct plans, wall and
CPU seconds, CPU microseconds per call, for a cold planner and for the same calls again (all
cached). The 2 s target is judged on CPU time of the cold pass.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from ncclshim import Planner
from ncclshim.view import preset_view


def call_mix(calls: int, nodes: int, seed: int = 0) -> list[tuple[str, int, tuple[int, ...]]]:
    tp, world = 8, nodes * 8
    pp = 8 if nodes % 8 == 0 else 1
    dp = world // (tp * pp)
    rank = lambda t, d, p: t + tp * (d + dp * p)  # noqa: E731
    tp_groups = [tuple(rank(t, d, p) for t in range(tp)) for p in range(pp) for d in range(dp)]
    dp_groups = [tuple(rank(t, d, p) for d in range(dp)) for p in range(pp) for t in range(tp)]
    pp_pairs = [(rank(t, d, p), rank(t, d, p + 1)) for p in range(pp - 1) for d in range(dp) for t in range(tp)]
    mib = 1 << 20
    kinds = [
        (0.40, "all_reduce", tp_groups, [2 * mib, 16 * mib, 32 * mib, 64 * mib]),
        (0.15, "all_gather", tp_groups, [16 * mib, 32 * mib, 64 * mib]),
        (0.15, "reduce_scatter", tp_groups, [16 * mib, 32 * mib, 64 * mib]),
        (0.10, "all_to_all", tp_groups, [4 * mib, 8 * mib]),
        (0.08, "reduce_scatter", dp_groups, [40 * mib, 80 * mib, 160 * mib]),
        (0.08, "all_gather", dp_groups, [40 * mib, 80 * mib, 160 * mib]),
        (0.039, "send", pp_pairs or [(0, 8)], [8 * mib, 32 * mib]),
        (0.001, "all_reduce", [tuple(range(world))], [8, 4096]),
    ]
    rng = random.Random(seed)
    weights = [k[0] for k in kinds]
    out = []
    for kind in rng.choices(kinds, weights, k=calls):
        _, coll, groups, sizes = kind
        out.append((coll, rng.choice(sizes), rng.choice(groups)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--preset", default="dgx-h100")
    args = ap.parse_args()
    t0 = time.perf_counter()
    view = preset_view(args.preset, nodes=args.nodes)
    build = time.perf_counter() - t0
    mix = call_mix(args.calls, args.nodes)
    planner = Planner(view)
    rows = []
    for label in ("cold planner", "warm (all cached)"):
        t, c = time.perf_counter(), time.process_time()
        for coll, size, ranks in mix:
            planner.plan(coll, size, ranks)
        rows.append((label, len(mix), len(planner._plans), time.perf_counter() - t, time.process_time() - c))
    print(f"# {args.preset} x {args.nodes} nodes = {len(view.gpus)} GPUs, {len(view.links)} links "
          f"(view built in {build:.3f} s)")
    print(f"{'pass':<20} {'calls':>8} {'plans':>7} {'wall_s':>8} {'cpu_s':>8} {'us/call':>8}")
    for label, n, distinct, sec, cpu in rows:
        print(f"{label:<20} {n:>8} {distinct:>7} {sec:>8.3f} {cpu:>8.3f} {cpu / n * 1e6:>8.2f}")
    # CPU time is judged: wall time also counts other processes sharing the machine.
    target = rows[0][4] <= 2.0
    print(f"# target: {args.calls} calls <= 2 s CPU including cache misses: {'met' if target else 'MISSED'}")
    return 0 if target else 1


if __name__ == "__main__":
    sys.exit(main())
