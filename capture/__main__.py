"""``python -m capture``: run a training script as ranks of a fake cluster-sized job; write a trace.

    python -m capture [--world-size N | --nnodes N --nproc-per-node G] [--ranks auto|all|LIST] -o TRACE script.py [args]
    python -m capture [...] -o TRACE -m module [args]
    python -m capture --inspect TRACE [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m capture",
        description="Run a PyTorch training script as ranks of a large job on one CPU host and record a trace.",
    )
    ap.add_argument("--world-size", type=int, help="total ranks of the job (or --nnodes x --nproc-per-node)")
    ap.add_argument("--nnodes", type=int, help="nodes of the job")
    ap.add_argument("--nproc-per-node", type=int, help="ranks (GPUs) per node; default min(world size, 8)")
    ap.add_argument("--ranks", default="auto", help="auto (one per role, default), all, or a list like 0,8-11")
    ap.add_argument("-j", "--jobs", type=int, help="worker processes in parallel (default: CPU cores)")
    ap.add_argument("--timeout", type=float, default=None, metavar="S",
                    help="seconds one rank may run before the capture stops with an error (default 1800)")
    ap.add_argument("--gpu", default="H100",
                    help="GPU the fake CUDA device reports to the script (torch.cuda.get_device_properties); default H100")
    ap.add_argument("--iterations", type=int, metavar="K",
                    help="stop the script once K training iterations are complete (optimizer steps or the "
                         "annotate API); the trace holds the last complete one (default: run to the end)")
    ap.add_argument("-o", "--output", help="trace directory to write (new, empty, or a previous trace)")
    ap.add_argument("--force", action="store_true",
                    help="let -o replace a regular file (never a device or a directory that is not a trace)")
    ap.add_argument("-m", "--module", action="store_true",
                    help="the script is a module name, run as python -m runs it (as torchrun -m)")
    ap.add_argument("--inspect", metavar="TRACE", help="print a trace's totals instead of capturing")
    ap.add_argument("--json", action="store_true", help="with --inspect: one JSON object")
    ap.add_argument("script", nargs="?", help="the training script (with -m: the module)")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    a = ap.parse_args(argv)
    from heterosim.errors import HeteroSimError, ScriptError

    try:
        if a.inspect:
            from heterosim.trace.store import load_trace
            from capture.summary import format_summary, summarize

            s = summarize(load_trace(a.inspect))
            print(json.dumps(s, sort_keys=True) if a.json else format_summary(s))
            return 0
        if not a.script or not a.output:
            ap.error("a script and -o TRACE are required (or --inspect TRACE)")
        if a.world_size is None and a.nnodes is None:
            ap.error("give --world-size N, or --nnodes N --nproc-per-node G")
        if a.nnodes is not None:
            if a.nproc_per_node is None:
                ap.error("--nnodes needs --nproc-per-node")
            world = a.nnodes * a.nproc_per_node
            if a.world_size is not None and a.world_size != world:
                ap.error(f"--world-size {a.world_size} != --nnodes {a.nnodes} x --nproc-per-node {a.nproc_per_node}")
        else:
            world = a.world_size
        from tqdm import tqdm

        from capture.api import capture

        bar = tqdm(total=None, unit="rank", desc="capturing", file=sys.stderr, disable=None)

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.refresh()

        try:
            path = capture(a.script, a.args, a.output, world_size=world, nproc_per_node=a.nproc_per_node,
                           ranks=a.ranks, jobs=a.jobs, on_rank_done=progress, force=a.force, gpu=a.gpu,
                           iterations=a.iterations, module=a.module,
                           **({} if a.timeout is None else {"timeout": a.timeout}))
        finally:
            bar.close()
        print(f"wrote {path}: {_what_was_recorded(path)}", file=sys.stderr)
        return 0
    except ScriptError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except HeteroSimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; nothing was written", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of our output went away (``--inspect | head``)
        _quiet_stdout()
        return 0


def _what_was_recorded(path: object) -> str:
    from heterosim.trace.store import load_trace
    from capture.summary import describe_iterations, describe_roles

    t = load_trace(path)
    return f"{describe_iterations(t.meta)}; {describe_roles(t.meta, len(t.roles))}"


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail on a closed pipe."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
