"""ncclshim: NCCL-faithful collective planning (algorithm, protocol, channels) and flow decomposition.

Public names:

- :class:`TopologyView` and its records (:class:`GPU`, :class:`NIC`, :class:`Node`,
  :class:`NodeFabric`, :class:`Link`): the cluster as ncclshim sees it; ``replay/`` builds it.
"""

from ncclshim.topology import GPU, NIC, Link, Node, NodeFabric, Router, TopologyView

__all__ = ["GPU", "NIC", "Link", "Node", "NodeFabric", "Router", "TopologyView"]
