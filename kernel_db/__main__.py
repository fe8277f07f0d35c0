"""``python -m kernel_db gpus | show | price | profile | calibrate`` -- a thin CLI over the library."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import yaml

from heterosim.atomic import atomic_write_text
from heterosim.errors import HeteroSimError, KernelDBError

__all__ = ["main"]

DEFAULT_DB = os.environ.get("HETEROSIM_KERNEL_DB", "kernels.csv")


def _db(args: argparse.Namespace) -> Any:
    """The kernel DB to read from ``--db``: one named explicitly (or by HETEROSIM_KERNEL_DB) must
    exist; the unnamed default may be absent (an empty DB: roofline pricing)."""
    from .db import KernelDB

    named = args.db is not None or "HETEROSIM_KERNEL_DB" in os.environ
    return KernelDB.load(args.db or DEFAULT_DB, must_exist=named)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m kernel_db", description="HeteroSim kernel database and pricing")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gpus", help="list the GPU catalogue")
    g.add_argument("--json", action="store_true")
    s = sub.add_parser("show", help="what the kernel DB holds, by GPU and source")
    s.add_argument("--db", help=f"kernel DB file (default {DEFAULT_DB}; env HETEROSIM_KERNEL_DB)")
    s.add_argument("--json", action="store_true")
    p = sub.add_parser("price", help="price every op of a trace on a GPU")
    p.add_argument("trace")
    p.add_argument("--gpu", required=True, help="GPU name or alias (see: python -m kernel_db gpus)")
    p.add_argument("--db", help=f"kernel DB file (default {DEFAULT_DB} if present; env HETEROSIM_KERNEL_DB)")
    p.add_argument("--efficiency", help="efficiency YAML (default: the shipped one; calibrate --out writes one)")
    p.add_argument("--top", type=int, default=20, help="how many of the most expensive kernels to list")
    p.add_argument("--no-fuse", action="store_true", help="price Megatron-fusible elementwise chains op by op")
    p.add_argument("--json", action="store_true", help="total compute seconds per role and seconds by source")
    f = sub.add_parser("profile", help="time each distinct kernel of a trace (or a sweep) into the DB")
    f.add_argument("trace", nargs="?")
    f.add_argument("--sweep", choices=["gemm", "attention", "elementwise", "all"])
    f.add_argument("--dtype", default="bf16", help="dtype of --sweep kernels")
    f.add_argument("--sizes", help="comma-separated sizes for --sweep (e.g. 256,512)")
    f.add_argument("--db", help=f"kernel DB file to add to (created if absent; default {DEFAULT_DB})")
    f.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (exercises the same code on the CPU)")
    f.add_argument("--warmup", type=int, default=10)
    f.add_argument("--repeats", type=int, default=30)
    c = sub.add_parser("calibrate", help="fit efficiency curves to the DB; k-fold error per class and GPU pair")
    c.add_argument("--db", help=f"kernel DB file (default {DEFAULT_DB}; env HETEROSIM_KERNEL_DB)")
    c.add_argument("--k", type=int, default=5, help="folds")
    c.add_argument("--out", help="write the calibrated efficiency YAML here (use with price --efficiency)")
    c.add_argument("--json", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.cmd](args)
    except HeteroSimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0


def _gpus(args: argparse.Namespace) -> int:
    from heterosim.cluster.gpus import load_catalogue

    from .report import format_gpus

    cat = load_catalogue()
    if args.json:
        print(json.dumps([{"name": g.name, "vendor": g.vendor, "compute_capability": g.compute_capability,
                           "peak_TFLOPs": {k: v / 1e12 for k, v in g.peak_flops.items()}, "hbm_bw_GBps": g.hbm_bw / 1e9,
                           "memory_GiB": g.hbm_bytes / 2**30, "sm_count": g.sm_count, "l2_MiB": g.l2_bytes / 2**20,
                           "nvlink_bw_GBps": g.nvlink_bw / 1e9, "tensor_clock_ratio": g.power_clock_ratio,
                           "board_spread": g.board_spread, "aliases": list(g.aliases), "sources": g.sources}
                          for g in cat.gpus], indent=1))
    else:
        print(format_gpus(cat))
    return 0


def _show(args: argparse.Namespace) -> int:
    from .db import KernelDB
    from .report import db_summary, format_db

    db = _db(args)
    print(json.dumps(db_summary(db), indent=1) if args.json else format_db(db))
    return 0


def _price(args: argparse.Namespace) -> int:
    from heterosim.trace.store import load_trace

    from .db import KernelDB
    from .pricing import Pricer
    from .report import format_trace_price, price_trace
    from .roofline import load_efficiency

    if args.top < 0:
        raise KernelDBError(f"--top must be >= 0 kernels, got {args.top}")
    pricer = Pricer(_db(args), efficiency=load_efficiency(args.efficiency), fuse=not args.no_fuse)
    tp = price_trace(load_trace(args.trace), args.gpu, pricer)
    print(json.dumps(tp.to_json(), indent=1, sort_keys=True) if args.json else format_trace_price(tp, args.top))
    return 0


def _sizes(text: str) -> list[int]:
    """``--sizes 256,512``: positive integers, else one KernelDBError naming the bad item."""
    out = []
    for part in text.split(","):
        try:
            n = int(part)
        except ValueError:
            n = 0
        if n < 1:
            raise KernelDBError(f"--sizes {text!r}: {part.strip()!r} is not a positive integer; write e.g. 256,512")
        out.append(n)
    return out


def _profile(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .profile import kernels_from_trace, profile, sweep

    if bool(args.trace) == bool(args.sweep):
        raise KernelDBError("profile needs exactly one of TRACE or --sweep KIND (e.g. --sweep gemm)")
    if args.trace:
        from heterosim.trace.store import load_trace

        kernels = kernels_from_trace(load_trace(args.trace))
        note = f"trace={os.path.basename(os.path.normpath(args.trace))}"
    else:
        sizes = _sizes(args.sizes) if args.sizes else None
        kernels = sweep(args.sweep, args.dtype, sizes)
        note = f"sweep={args.sweep}"
    if args.warmup < 0 or args.repeats < 1:
        raise KernelDBError(f"need --warmup >= 0 and --repeats >= 1, got {args.warmup} and {args.repeats}")
    args.db = args.db or DEFAULT_DB
    res = profile(kernels, args.db, device=args.device, warmup=args.warmup, repeats=args.repeats, provenance=note,
                  progress=lambda it: tqdm(it, desc=f"profile {args.device}", unit="kernel", file=sys.stderr))
    print(f"{res.gpu}: measured {res.measured}, already in DB {res.skipped}, failed {len(res.failed)} -> {args.db}")
    for sig, why in res.failed[:20]:
        print(f"  failed {sig}: {why}", file=sys.stderr)
    return 1 if res.failed and not res.measured and not res.skipped else 0


def _calibrate(args: argparse.Namespace) -> int:
    from .calibrate import calibrate
    from .report import format_calibration

    if args.k < 2:
        raise KernelDBError(f"--k must be >= 2 folds (k-fold cross-validation), got {args.k}")
    rep = calibrate(_db(args), k=args.k)
    if args.out:
        atomic_write_text(args.out, yaml.safe_dump(rep.efficiency_doc, sort_keys=True))
    if args.json:
        print(json.dumps({"fits": [{"gpu": f.gpu, "kernel_class": f.kernel_class, "rows": f.n, "params": f.params,
                                    "prior_err": f.prior_err, "cv_err": f.cv_err} for f in rep.fits],
                          "pairs": [{"from": p.src, "to": p.dst, "kernel_class": p.kernel_class, "kernels": p.n,
                                     "mean_err": p.mean_err, "max_err": p.max_err} for p in rep.pairs]}, indent=1))
    else:
        print(format_calibration(rep))
    return 0


_COMMANDS = {"gpus": _gpus, "show": _show, "price": _price, "profile": _profile, "calibrate": _calibrate}

if __name__ == "__main__":
    sys.exit(main())
