"""Test helper shared by the capture tests: run ``python -m capture`` on a script of
``tests/scripts`` (the command a user types) and load the trace it writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from heterosim.trace.store import load_trace

ROOT = Path(__file__).resolve().parents[1]


def capture_script(out: Path, script: str, world: int = 1) -> tuple[subprocess.CompletedProcess, object]:
    """Capture ``tests/scripts/<script>`` at ``world`` ranks into ``out``; (the finished process,
    its trace). Fails the test, with capture's stderr, if the capture fails."""
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", str(world), "-o", str(out),
                        str(ROOT / "tests" / "scripts" / script)], capture_output=True, text=True,
                       cwd=ROOT, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    return p, load_trace(out)
