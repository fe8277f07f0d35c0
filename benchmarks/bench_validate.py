"""Speed of ``python -m replay validate`` over a cases file: cold (empty trace cache) and warm.

    .venv/bin/python benchmarks/bench_validate.py                       # the public file
    .venv/bin/python benchmarks/bench_validate.py --cases FILE --only ID ...
    .venv/bin/python benchmarks/bench_validate.py --cache-dir D         # reuse a cache (warm only)

Target (2 CPU cores): the whole public file (24 end-to-end + 3 collective cases) in <= 10 minutes
cold. Prints one row per case (wall and CPU seconds: capture + replay, or planning) and the
totals; on a shared machine compare the CPU column, wall time includes other processes' load.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_CASES = Path(__file__).resolve().parents[1] / "validation" / "public_cases.yaml"


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _run(cases: Path, only: list[str] | None, cache: Path) -> tuple[list[tuple[str, float, float]], object]:
    from heterosim.validation.cases import load_cases
    from heterosim.validation.validate import Report, run_case

    rows, results = [], []
    for c in load_cases(cases):
        if (only and c.id not in only) or c.category not in ("end_to_end", "collective"):
            continue
        w0, c0 = time.perf_counter(), _cpu()
        r = run_case(c, cache_dir=cache)
        rows.append((c.id, time.perf_counter() - w0, _cpu() - c0))
        results.append(r)
    return rows, Report(cases=tuple(results))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    ap.add_argument("--only", nargs="+")
    ap.add_argument("--cache-dir", type=Path, help="existing cache (skips the cold run)")
    ap.add_argument("--jobs", type=int, default=2,
                    help="cases at a time, as `python -m replay validate --jobs` (default 2, as there); "
                         "with more than 1 only totals are printed")
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        cache = a.cache_dir or Path(tmp)
        runs = [("warm", cache)] if a.cache_dir else [("cold", cache), ("warm", cache)]
        for label, d in runs:
            t0, c0 = time.perf_counter(), _cpu()
            if a.jobs > 1:
                from heterosim.validation.validate import validate

                rows, rep = [], validate(a.cases, only=a.only, cache_dir=d, jobs=a.jobs)
            else:
                rows, rep = _run(a.cases, a.only, d)
            wall, cpu = time.perf_counter() - t0, _cpu() - c0
            print(f"\n{label} run ({os.cpu_count()} CPUs, {a.jobs} case(s) at a time)")
            print(f"{'case':<44} {'wall s':>8} {'CPU s':>8}")
            for cid, w, c in rows:
                print(f"{cid:<44} {w:8.1f} {c:8.1f}")
            print(f"{'total':<44} {wall:8.1f} {cpu:8.1f}   target <= 600 s cold: "
                  f"{'met' if label != 'cold' or wall <= 600 else 'MISSED'}")
        print()
        print(rep.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
