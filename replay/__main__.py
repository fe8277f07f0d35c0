"""``python -m replay``: simulate a captured trace on a cluster, or list cluster presets.

    python -m replay simulate TRACE --cluster PRESET|FILE [--kernel-db DB] [--backend numpy|cupy]
                              [--placement FILE] [--no-link-sharing] [--fail-on-oom] [--json] [--timeline F] [--plot F]
    python -m replay clusters [--json]
    python -m replay validate CASES.yaml [--only ID...] [--cache-dir D] [--jobs N] [--case-timeout S] [--json]
        [--markdown] [--plot F]

Thin over :func:`replay.simulate.simulate` and :func:`heterosim.cluster.list_presets`. Errors print
one line (``error: ...``) and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from replay.simulate import OVERLAP_SLOWDOWN

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m replay",
                                 description="Simulate a training iteration of a captured trace on a GPU cluster.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("simulate", help="simulate one iteration of TRACE on a cluster")
    s.add_argument("trace", help="trace directory written by python -m capture")
    s.add_argument("--cluster", required=True, help="preset name (python -m replay clusters) or cluster YAML file")
    s.add_argument("--kernel-db", help="kernel database CSV (python -m kernel_db profile); default: roofline only")
    s.add_argument("--backend", default="numpy", choices=("numpy", "cupy"), help="array backend (default numpy)")
    s.add_argument("--placement", help="placement YAML (rank -> GPU mapping per node group or stage)")
    s.add_argument("--no-link-sharing", action="store_true",
                   help="give every transfer its uncontended time (faster, ignores contention)")
    s.add_argument("--overlap-slowdown", type=float, default=OVERLAP_SLOWDOWN, metavar="F",
                   help="compute runs at speed 1-F while a comm op of the same rank is in flight "
                   f"(NCCL takes SMs and HBM bandwidth); default {OVERLAP_SLOWDOWN} (measured, "
                   "arXiv:2507.03114); 0: off")
    s.add_argument("--mean-board", action="store_true",
                   help="price every GPU at its model's mean sustained clock (default: the expected "
                   "slowest of the job's boards, which a synchronous step waits for; gpus.yaml "
                   "sustained_clock_spread)")
    s.add_argument("--engine", default="fast", choices=("fast", "reference"), help=argparse.SUPPRESS)
    s.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    s.add_argument("--timeline", metavar="FILE", help="write a Chrome/Perfetto trace JSON")
    s.add_argument("--timeline-ranks", metavar="LIST", help="ranks on the timeline, e.g. 0,8-15 (default: "
                   "all ranks up to 64, else one per class)")
    s.add_argument("--plot", metavar="FILE", help="write a PNG with the breakdown and a timeline picture")
    s.add_argument("--nccl-env", nargs="+", metavar="NCCL_X=V", default=[],
                   help="NCCL environment the planner runs with, e.g. NCCL_ALGO=Ring NCCL_NVLS_ENABLE=0")
    s.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    s.add_argument("--fail-on-oom", action="store_true",
                   help="exit with status 3 when a rank needs more memory than its GPU has (default: warn, exit 0)")
    c = sub.add_parser("clusters", help="list the cluster presets")
    c.add_argument("--json", action="store_true", help="one JSON object")
    v = sub.add_parser("validate", help="predict published runs and collective benchmarks; print the error")
    v.add_argument("cases", help="cases YAML (schema of validation/public_cases.yaml)")
    v.add_argument("--only", nargs="+", metavar="ID", help="run only these case ids")
    v.add_argument("--cache-dir", help="trace cache (default ~/.cache/heterosim/traces)")
    v.add_argument("--kernel-db", help="kernel database CSV; default: roofline only")
    v.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    v.add_argument("--markdown", action="store_true", help="print the table as Markdown (README)")
    v.add_argument("--plot", metavar="FILE", help="write a PNG of predicted vs measured")
    v.add_argument("--nccl-env", nargs="+", metavar="NCCL_X=V", default=[],
                   help="NCCL environment for every case, over what a case's launch script sets "
                        "(e.g. NCCL_NVLS_ENABLE=1)")
    v.add_argument("--jobs", type=int, default=2, metavar="N",
                   help="cases run at a time, each in its own process (default 2: a replay is single-"
                        "threaded, so a second case uses the other CPU; timings in docs/calibration.md, "
                        "'Cost')")
    v.add_argument("--mean-board", action="store_true",
                   help="price every GPU at its model's mean sustained clock, not the expected slowest "
                   "of the job's boards (a sensitivity check; docs/replay.md)")
    v.add_argument("--case-timeout", type=float, default=None, metavar="S",
                   help="seconds of CPU time one case may take, capture and replay (default 900; 0: no "
                        "limit); a case past it fails alone and the run goes on")
    return ap


def _nccl_env(items: list[str]) -> dict[str, str]:
    """``--nccl-env`` words as a mapping; one ConfigError naming a word that is not NCCL_NAME=VALUE."""
    from heterosim.errors import ConfigError
    from ncclshim.tuning import ENV_NAME

    env = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not ENV_NAME.fullmatch(name):
            raise ConfigError(f"--nccl-env {item!r}: give NCCL_NAME=VALUE, e.g. NCCL_ALGO=Ring")
        env[name] = value
    return env


def _validate(a: argparse.Namespace) -> int:
    from heterosim.validation.validate import validate

    def progress(case_id: str) -> None:
        print(f"validate: {case_id}", file=sys.stderr, flush=True)

    def finished(case_id: str, seconds: float) -> None:
        print(f"validate: {case_id} done in {seconds:.1f} s", file=sys.stderr, flush=True)

    from heterosim.errors import ConfigError

    if a.jobs < 1:
        raise ConfigError(f"--jobs {a.jobs}: give 1 or more")
    from heterosim.validation.validate import CASE_TIMEOUT_S

    rep = validate(a.cases, only=a.only, cache_dir=a.cache_dir, kernel_db=a.kernel_db,
                   progress=None if a.json else progress, jobs=a.jobs, finished=finished,
                   nccl_env=_nccl_env(a.nccl_env) or None,
                   case_timeout=CASE_TIMEOUT_S if a.case_timeout is None else a.case_timeout,
                   slowest_board=not a.mean_board)
    if a.plot:
        rep.write_plot(a.plot)
    if a.json:
        print(rep.to_json(), end="")
    else:
        print(rep.table(markdown=a.markdown))
        print("\nassumptions (what 'not stated' became):\n" + rep.assumptions_text())
    return 0


def _ranks(text: str) -> list[int]:
    from heterosim.cluster.placement import parse_ranges

    return list(parse_ranges(text, "--timeline-ranks"))


def _simulate(a: argparse.Namespace) -> int:
    from replay.simulate import simulate

    bar = None
    progress = None
    if not a.no_progress and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(desc="replay", unit=" ops", file=sys.stderr, leave=False)
        progress = bar.update
    try:
        res = simulate(a.trace, a.cluster, a.kernel_db, backend=a.backend, placement=a.placement,
                       link_sharing=not a.no_link_sharing, engine=a.engine,
                       overlap_slowdown=a.overlap_slowdown, progress=progress, nccl_env=_nccl_env(a.nccl_env),
                       slowest_board=not a.mean_board)
    finally:
        if bar is not None:
            bar.close()
    if a.timeline:
        res.write_timeline(a.timeline, ranks=_ranks(a.timeline_ranks) if a.timeline_ranks else None)
    if a.plot:
        res.write_plot(a.plot)
    print(res.to_json() if a.json else res.summary(), end="" if a.json else "\n")
    if res.out_of_memory and a.fail_on_oom:
        print(f"error: {res.oom_message()}", file=sys.stderr)
        return 3
    return 0


def _clusters(a: argparse.Namespace) -> int:
    from heterosim.cluster import list_presets

    presets = list_presets()
    if a.json:
        print(json.dumps({"schema_version": 1, "presets": [
            {"name": p.name, "description": p.description, "gpus": list(p.gpus),
             "gpus_per_node": list(p.gpus_per_node), "intra": list(p.intra), "nic_Gbps": list(p.nic_Gbps),
             "nics_per_node": list(p.nics_per_node), "fabric": p.fabric} for p in presets]}, indent=1))
        return 0
    width = max(len(p.name) for p in presets)
    for p in presets:
        gpus = " + ".join(f"{g} x{n}" for g, n in zip(p.gpus, p.gpus_per_node))
        print(f"{p.name:<{width}}  {gpus}/node  {'/'.join(p.intra)}  "
              f"{'/'.join(f'{n}x{b:g}Gb/s' for n, b in zip(p.nics_per_node, p.nic_Gbps))}  {p.fabric}  "
              f"- {p.description}")
    return 0


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    from heterosim.errors import HeteroSimError

    try:
        if a.cmd == "validate":
            return _validate(a)
        return _simulate(a) if a.cmd == "simulate" else _clusters(a)
    except HeteroSimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of our output went away (``simulate ... | head``)
        # Point stdout at devnull so that the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
