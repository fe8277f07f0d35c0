"""The topology view ncclshim plans on: GPUs, their nodes' fabrics, NICs, directed links and routes.

:mod:`ncclshim.view` builds this view from a :class:`heterosim.cluster.Cluster` (a preset or a
cluster file); the view is plain data plus one routing callable, so a test may also build one by
hand. ncclshim reads the cluster model and imports nothing from ``replay/``.

Vocabulary:

- *GPU index*: the position of a GPU in ``TopologyView.gpus`` (global, 0..n-1). ``plan(ranks=...)``
  takes GPU indices: the caller maps its ranks to GPUs.
- *link*: one direction of a physical connection between two *vertices* (named strings such as
  ``"n0.gpu3"``, ``"n0.nvs"``, ``"n0.sw1"``, ``"n0.cpu0"``, ``"n0.nic3"``, ``"leaf3.0"``). ``bw`` is what
  the hardware moves in B/s (per direction, after link-level encoding); ``nccl_bw`` is what NCCL's
  topology detection believes the link carries (e.g. 20 GB/s per A100 NVLink lane, ``speed/8000``
  GB/s per NIC, ``width * laneSpeed / 80`` per PCIe link; ``docs/nccl.md`` §3.1). Flows are
  timed with ``bw``; NCCL's channel search and cost model use ``nccl_bw``.
- *path*: a tuple of link ids from one GPU to another, given by ``TopologyView.route``.
- *rail*: NICs with the same rail index across nodes share a leaf switch (rail-optimized fabric).

NCCL's own bandwidth numbers for builders (``nccl_nvlink_bw``, ``nccl_pcie_bw``, ``nccl_nic_bw``)
live with the cluster model, in :mod:`heterosim.cluster.bandwidth`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol

from heterosim.errors import TopologyError

__all__ = [
    "GPU",
    "NIC",
    "NodeFabric",
    "Node",
    "Link",
    "Router",
    "TopologyView",
    "PATH_TYPES",
    "per_view",
]

FabricKind = Literal["nvswitch", "nvlink_mesh", "pcie"]
LinkKind = Literal["nvlink", "pcie", "cpu", "net", "c2c"]
CpuVendor = Literal["intel", "amd", "arm", "other"]

PATH_TYPES: tuple[str, ...] = (
    "LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS",
)
"""NCCL's path types, best first (``include/graph.h``; ``docs/nccl.md`` §3.2)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GPU:
    """One GPU of the cluster."""

    index: int
    """Global GPU index: position in ``TopologyView.gpus``."""
    node: int
    """Index of the node (server) holding it."""
    local_index: int
    """Index inside its node (CUDA device ordinal), 0..gpus_per_node-1."""
    gpu_type: str
    """Catalogue name, e.g. ``"A100-SXM4-80GB"``; heterogeneous groups mix names."""
    sm: int
    """Compute capability times ten (80 = A100, 89 = L40S, 90 = H100/H20, 100 = B200)."""
    pcie_switch: int
    """Local index of the PCIe switch the GPU hangs off."""
    cpu_socket: int
    """Local index of the CPU socket above that switch."""
    nics: tuple[int, ...] = ()
    """Global indices of the NICs local to this GPU (NCCL's best-path NICs), best first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NIC:
    """One network interface (one port)."""

    index: int
    """Global NIC index: position in ``TopologyView.nics``."""
    node: int
    rail: int
    """Rail (leaf-switch plane); NICs of equal rail on different nodes meet at one switch."""
    bw: float
    """Line rate per direction, B/s (400 Gb/s NDR = 50e9)."""
    nccl_bw: float
    """NCCL's view of it, B/s (``speed/8000`` GB/s; equal to ``bw`` for a plain NIC)."""
    pcie_switch: int
    """Local index of the PCIe switch it hangs off."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeFabric:
    """How the GPUs inside one node are connected."""

    kind: FabricKind
    """``nvswitch`` (all GPUs on NVSwitches), ``nvlink_mesh`` (direct GPU-GPU NVLinks, e.g. a
    bridge pair) or ``pcie`` (no NVLink: PCIe switches under CPU sockets)."""
    nvls: bool = False
    """NVSwitch with NVLink SHARP (multicast + in-switch reduction): needed for NVLS/NVLS_TREE."""
    nvlink_lanes: int = 0
    """NVLink lanes per GPU (12 on A100, 18 on H100) -- NCCL prices NVLink per lane."""
    pcie_gen: int = 4
    pcie_width: int = 16
    cpu_vendor: CpuVendor = "intel"
    """Decides NCCL's network overhead (1 us Intel, 2 us AMD) and multi-node LL caps."""
    coherent: bool = False
    """GPUs share cache-coherent memory (CXL-style, seed 003): enables the coherent ring."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """A server: its fabric and GPUs."""

    index: int
    fabric: NodeFabric
    gpus: tuple[int, ...]
    """Global GPU indices, in local-index order."""
    nics: tuple[int, ...] = ()
    """Global NIC indices, in rail order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """One direction of a connection between two vertices."""

    id: int
    """Position in ``TopologyView.links``."""
    src: str
    dst: str
    kind: LinkKind
    bw: float
    """What the hardware moves, B/s per direction."""
    latency: float
    """Propagation + switching latency, s."""
    nccl_bw: float = 0.0
    """What NCCL's topology detection believes, B/s; 0 means "same as ``bw``"."""

    @property
    def model_bw(self) -> float:
        """``nccl_bw`` if set, else ``bw``."""
        return self.nccl_bw or self.bw


class Router(Protocol):
    """Gives the path (link ids) from GPU ``src`` to GPU ``dst``.

    ``channel`` selects deterministically among equal paths (NICs of a multi-NIC GPU, ECMP).
    ``pxn``: may a cross-node path relay over NVLink to a peer GPU whose NIC is on the
    destination's rail (NCCL's PXN, off with ``NCCL_PXN_DISABLE=1``).
    """

    def __call__(self, src: int, dst: int, channel: int, *, pxn: bool) -> tuple[int, ...]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologyView:
    """Everything ncclshim needs to know about a cluster.

    Example:
        >>> from ncclshim.view import preset_view
        >>> view = preset_view("dgx-a100", nodes=2)
        >>> len(view.gpus), len(view.nics)
        (16, 16)
        >>> [view.links[i].src for i in view.route(0, 1, 0)]
        ['n0.gpu0', 'n0.nvs']
    """

    name: str
    """Human-readable name (a preset name or the cluster file)."""
    gpus: tuple[GPU, ...]
    nodes: tuple[Node, ...]
    nics: tuple[NIC, ...]
    links: tuple[Link, ...]
    router: Router = field(repr=False, compare=False)
    """Path callable supplied by the builder (see :class:`Router`)."""
    collnet: bool = False
    """A SHARP-capable network with the CollNet plugin (enables CollNet / multi-node NVLS)."""
    net_latency: float = 0.0
    """NCCL's ``latencyInter`` (NIC XML attribute), s; usually 0."""
    memo: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    """What :func:`per_view` computed from this view, by name: it lives and dies with the view."""

    def __post_init__(self) -> None:
        for i, g in enumerate(self.gpus):
            if g.index != i:
                raise TopologyError(f"gpus[{i}] has index {g.index}; indices must equal positions")
            if not 0 <= g.node < len(self.nodes):
                raise TopologyError(f"GPU {i} is on node {g.node}, but there are {len(self.nodes)} nodes")
            for n in g.nics:
                if not 0 <= n < len(self.nics):
                    raise TopologyError(f"GPU {i} lists NIC {n}, but there are {len(self.nics)} NICs")
        for i, link in enumerate(self.links):
            if link.id != i:
                raise TopologyError(f"links[{i}] has id {link.id}; ids must equal positions")
            if link.bw <= 0:
                raise TopologyError(f"link {i} ({link.src}->{link.dst}) has bandwidth {link.bw}; must be > 0")
        for i, n in enumerate(self.nodes):
            if n.index != i:
                raise TopologyError(f"nodes[{i}] has index {n.index}; indices must equal positions")

    def route(self, src: int, dst: int, channel: int = 0, *, pxn: bool = True) -> tuple[int, ...]:
        """Path from GPU ``src`` to GPU ``dst`` as link ids (empty when ``src == dst``)."""
        if src == dst:
            return ()
        return self.router(src, dst, channel, pxn=pxn)

    def fabric(self, gpu: int) -> NodeFabric:
        """The fabric of the node holding ``gpu``."""
        return self.nodes[self.gpus[gpu].node].fabric

    def path_bw(self, path: tuple[int, ...]) -> float:
        """Hardware bandwidth of a path: its slowest link, B/s (inf for an empty path)."""
        return min((self.links[i].bw for i in path), default=float("inf"))

    def path_latency(self, path: tuple[int, ...]) -> float:
        """Sum of the links' latencies along a path, s."""
        return sum(self.links[i].latency for i in path)


def per_view(name: str, view: TopologyView, build: Callable[[TopologyView], Any]) -> Any:
    """``build(view)`` under ``name``, computed once per view object (a view does not change after
    it is built) and kept in the view's :attr:`~TopologyView.memo`, so it is freed with the view
    (a planner keeps every plan it made for the view's cluster)."""
    memo = view.memo
    if name not in memo:
        memo[name] = build(view)
    return memo[name]
