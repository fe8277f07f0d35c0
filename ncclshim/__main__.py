"""``python -m ncclshim bench --cluster PRESET|FILE [--nodes N] --op OP --min-bytes 8 --max-bytes 8G [--json]``
and ``python -m ncclshim sweeps [FILE]`` (published nccl-tests sweeps beside ncclshim's times).

Thin over :mod:`ncclshim.bench`. ``--cluster`` is a preset of the cluster model
(:mod:`heterosim.cluster`, ``python -m replay clusters`` lists them) or a cluster YAML file; the
view comes from :func:`ncclshim.view.preset_view`. NCCL_* variables of the environment apply, as
they would to nccl-tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from heterosim.errors import HeteroSimError

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from ncclshim.bench import format_table, parse_size, rows_to_json, sweep
    from ncclshim.view import preset_view

    ap = argparse.ArgumentParser(prog="python -m ncclshim", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="nccl-tests-like table of NCCL's predicted times")
    b.add_argument("--cluster", required=True, help="preset name or cluster YAML file")
    b.add_argument("--nodes", type=int, default=1, help="nodes (of each node group of a mixed cluster)")
    b.add_argument("--op", default="all_reduce")
    b.add_argument("--min-bytes", default="8")
    b.add_argument("--max-bytes", default="8G")
    b.add_argument("--step-factor", type=int, default=2)
    b.add_argument("--dtype", default="bf16")
    b.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    w = sub.add_parser("sweeps", help="compare with published nccl-tests sweeps (markdown tables)")
    w.add_argument("file", nargs="?", help="sweeps YAML (default: ncclshim's own, data/nccl_tests_h100.yaml)")
    args = ap.parse_args(argv)
    if args.cmd == "sweeps":
        return _sweeps(args.file)
    try:
        if args.nodes < 1:
            raise HeteroSimError(f"--nodes must be >= 1, got {args.nodes}")
        view = preset_view(args.cluster, args.nodes)
        env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
        rows = sweep(view, args.op, parse_size(args.min_bytes), parse_size(args.max_bytes),
                     step_factor=args.step_factor, dtype=args.dtype, env=env)
    except HeteroSimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"schema_version": 1, "cluster": view.name, "gpus": len(view.gpus), "op": args.op,
                          "env": env, "rows": rows_to_json(rows)}, indent=1))
    else:
        print(format_table(rows, title=f"{args.op} on {view.name}: {len(view.gpus)} GPUs"))
    return 0


def _sweeps(path: str | None) -> int:
    from ncclshim.sweeps import compare, format_points, format_rows, load

    try:
        cat = load(path)
        tables = [format_rows(s, compare(s)) for s in cat.sweeps]
        if cat.points:
            tables.append(format_points(cat.points))
    except HeteroSimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"# tolerance {cat.tolerance_pct:g}%\n\n" + "\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
