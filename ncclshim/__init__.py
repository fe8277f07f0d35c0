"""ncclshim: NCCL-faithful collective planning (algorithm, protocol, channels) and flow decomposition.

Public names:

- :func:`plan` -> :class:`Plan` (algo, proto, nchannels, time_s, latency_s, efficiency, flows,
  algbw, busbw, bottleneck) made of :class:`Flow` (src, dst, bytes, channel, path, phase);
  :class:`Planner` holds the caches for one view; :func:`is_trivial` tells one-rank groups;
  :func:`busbw_factor` gives nccl-tests' factors; :data:`COLLECTIVES` lists what is planned.
- :class:`TopologyView` and its records (:class:`GPU`, :class:`NIC`, :class:`Node`,
  :class:`NodeFabric`, :class:`Link`): the cluster as ncclshim sees it. ``ncclshim.view`` builds
  it from the cluster model (:mod:`heterosim.cluster`): ``topology_view(cluster)``, or
  ``preset_view(preset, nodes=N)`` for a preset or cluster file.
- ``ncclshim.bench.sweep``: an nccl-tests-like sweep (``python -m ncclshim bench``);
  ``ncclshim.sweeps``: published nccl-tests sweeps beside ncclshim's times (``python -m ncclshim sweeps``).
"""

from ncclshim.planner import COLLECTIVES, Flow, Plan, Planner, busbw_factor, is_trivial, plan
from ncclshim.topology import GPU, NIC, Link, Node, NodeFabric, Router, TopologyView

__all__ = [
    "plan", "Plan", "Flow", "Planner", "is_trivial", "busbw_factor", "COLLECTIVES",
    "GPU", "NIC", "Link", "Node", "NodeFabric", "Router", "TopologyView",
]
