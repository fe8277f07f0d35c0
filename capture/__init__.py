"""capture: run a PyTorch training script as ranks of a cluster-sized job and record a trace.

Public names (loaded on first use, so ``import capture`` stays light):

- :func:`capture` (:mod:`capture.api`): ``capture(script, args, out, world_size=N) -> Path`` of the
  written trace (read it with :func:`heterosim.trace.load_trace`).

CLI: ``python -m capture --world-size N -o TRACE script.py [args]``.
"""

from typing import Any

__all__ = ["capture"]


def __getattr__(name: str) -> Any:
    if name == "capture":
        from capture.api import capture

        return capture
    raise AttributeError(f"module 'capture' has no attribute {name!r}")
