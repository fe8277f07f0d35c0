"""replay: simulate a captured workload on a (heterogeneous) GPU cluster.

Public names:

- :func:`simulate` -> :class:`Result` (iteration time, breakdown, MFU, critical path; writers for
  JSON, Perfetto timelines and plots; ``Result.to_dataframe("classes" | "ranks" | "ops")``).
- :func:`run_fast` (class-level engine) and :func:`run_reference` (per-rank reference engine) over
  a :class:`Workload`; :class:`FluidNetwork` shares links max-min fairly.
- :func:`load_cluster`, :func:`list_presets`: the cluster model's (:mod:`heterosim.cluster`),
  re-exported for convenience.

CLI: ``python -m replay simulate TRACE --cluster PRESET|FILE`` and ``python -m replay clusters``.
"""

from replay.engine import run_fast
from replay.expand import CommInstance, Workload
from replay.flows import FluidNetwork
from replay.reference import run_reference
from replay.result import Breakdown, Result
from replay.simulate import simulate

__all__ = ["simulate", "Result", "Breakdown", "run_fast", "run_reference", "Workload", "CommInstance",
           "FluidNetwork", "load_cluster", "list_presets"]


def __getattr__(name: str):
    if name in ("load_cluster", "list_presets"):
        from heterosim import cluster

        return getattr(cluster, name)
    raise AttributeError(f"module 'replay' has no attribute {name!r}")
