"""One capture worker process: ``python -m capture.worker --rank R --world-size W --nproc-per-node G --out F -- script.py args``.

Runs :func:`capture.runner.run_rank` and writes the rank's recording as JSON to ``F``. Exit status
0 on success, 3 when the script failed (its traceback goes to stderr).
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m capture.worker --rank R --world-size W --nproc-per-node G --out F -- script.py [args]",
              file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="capture.worker")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--nproc-per-node", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv[:cut])
    script, *script_args = argv[cut + 1:]

    from capture.runner import run_rank
    from heterosim.atomic import atomic_write_text
    from heterosim.errors import ScriptError

    try:
        cap = run_rank(script, script_args, a.rank, a.world_size, a.nproc_per_node)
    except ScriptError as e:
        print(str(e), file=sys.stderr)
        return 3
    atomic_write_text(a.out, json.dumps(cap.to_json(), sort_keys=True, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
