"""One capture worker, standalone (for debugging a single rank):

    python -m capture.worker --rank R --world-size W --nproc-per-node G --out-dir D -- script.py [args]

Writes ``D/rank_R.json`` (:func:`capture.api.rank_json`, what each forked worker of a capture sends back);
on failure ``D/rank_R.err`` is written and printed. Exit status 0, 3 (the script failed) or 4.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m capture.worker")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--nproc-per-node", type=int, required=True)
    ap.add_argument("--out-dir", required=True)
    a = ap.parse_args(argv[:cut])
    script, *script_args = argv[cut + 1:]

    from capture.api import rank_json
    from heterosim.atomic import atomic_write_text
    from heterosim.errors import ScriptError

    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        text = rank_json(script, script_args, a.rank, a.world_size, a.nproc_per_node)
    except ScriptError as e:
        msg, code = str(e), 3
    except Exception:  # a bug of ours: keep the traceback
        msg, code = traceback.format_exc(), 4
    else:
        atomic_write_text(out / f"rank_{a.rank}.json", text)
        return 0
    (out / f"rank_{a.rank}.err").write_text(msg)
    print(msg, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
