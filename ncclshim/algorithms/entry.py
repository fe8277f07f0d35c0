"""What one collective algorithm is to ncclshim: an :class:`Algorithm` entry, and the pieces entries share.

An entry holds everything that differs between algorithms (``docs/nccl.md`` §1-§2, §7):

- *availability*: the collectives and protocols it implements (NCCL's ``SUPPORT`` rows), the
  ``NCCL_ALGO`` tokens that name it, and a topology / environment rule;
- *cost*: NCCL's algorithm bandwidth and latency for a protocol (``tuning.cc:ncclTopoTuneModel``),
  the time of one call (``ncclTopoGetAlgoTime``) and the runtime channels (``enqueue.cc``);
- *flows*: the point-to-point flow template of a call (``ncclshim/flows.py``'s contract).

Cost functions are pure: they read a :class:`Query` (the group, the environment, the fabric) and
NCCL's tables in :mod:`ncclshim.constants`. The shared helpers here are the parts of NCCL's model
that every algorithm reads the same way (scale index, hardware latencies, ring step count, the
small-message channel reduction).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ncclshim.constants import BASE_LAT_US, HW_LAT_US, PROTOS, THREAD_THRESHOLD, TREE_CORRECTION
from ncclshim.graph import GroupGraph
from ncclshim.topology import TopologyView


__all__ = [
    "Algorithm", "Query", "FlowSpec", "FlowBuilder", "support_rows", "scale", "ll_row", "hw_class",
    "hw_latencies", "log2i", "nccl_steps", "call_time", "tree_corrected", "small_message_channels",
    "default_channels",
]

FlowSpec = tuple[int, int, float, int, tuple[int, ...], int]
"""(src GPU, dst GPU, fraction of nbytes, channel, path link ids, phase)."""
FlowBuilder = Callable[..., list[FlowSpec]]
"""``(collective, group, view, pxn, root GPU) -> flow specs`` (size-independent fractions). The
builders of RING and TREE, whose channel ``k`` is NCCL's run-time channel ``k``, take a sixth
argument, the channels a call runs on, and then build only those channels' flows, each with the
fraction it has in the full set (``ncclshim.planner``'s small-call templates)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """NCCL environment variables that the model honours, parsed (:func:`ncclshim.tuning.parse_env`)."""

    algos: frozenset[str]
    protos: frozenset[str]
    min_channels: int = 0
    max_channels: int = 64
    nvls: bool = True
    pxn: bool = True
    collnet: bool = True
    """NCCL_COLLNET_ENABLE (default on here: a view only declares ``collnet`` when the plugin is
    set up); CollNet still needs ``TopologyView.collnet``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Query:
    """One collective on one group, as the cost functions see it (built once per ``select``)."""

    coll: str
    g: GroupGraph
    s: Settings
    collnet: bool
    """The view declares a SHARP network with the CollNet plugin and NCCL_COLLNET_ENABLE is on."""
    nvswitch: bool
    """Every node of the view is an NVSwitch fabric (CollNet Direct needs one)."""
    net_latency_us: float
    """Extra network latency of the view, added to NCCL's NET latency (twice for Simple)."""


def _always(q: Query) -> bool:
    return True


def call_time(q: Query, proto: str, nbytes: int, dtype: str, bw: float, lat: float) -> tuple[float, float]:
    """NCCL's call time in us, ``lat + nBytes / (1000 * bw)``, and the latency (``ncclTopoGetAlgoTime``)."""
    return lat + nbytes / (1000 * bw), lat


def default_channels(q: Query, proto: str, nbytes: int) -> int:
    """Runtime channels after NCCL's small-message reduction with its default thread counts (§1.5)."""
    return small_message_channels(q, nbytes, 640 if proto == "LL128" else 512, THREAD_THRESHOLD[proto])


@dataclass(frozen=True, slots=True, kw_only=True)
class Algorithm:
    """One collective algorithm: availability, cost and flows. Registered in :mod:`ncclshim.algorithms`."""

    name: str
    """NCCL's name (``"RING"``): what ``Plan.algo`` reports and ``Settings.algos`` holds."""
    spellings: tuple[str, ...]
    """Lower-case ``NCCL_ALGO`` tokens that select it; a token several entries share selects them
    all (``collnet`` names both CollNet algorithms)."""
    protocols: Mapping[str, tuple[str, ...]]
    """Collective -> protocols it implements (NCCL's ``SUPPORT`` rows); other collectives never use it."""
    tables: str
    """Key of its rows in the per-algorithm tables of :mod:`ncclshim.constants` (``BASE_LAT_US``,
    ``HW_LAT_US``); an extension NCCL lacks names the NCCL algorithm it is priced like."""
    bandwidth: Callable[[Query, str], float]
    """``(query, proto) -> algBw`` in GB/s: NCCL's busBw for the protocol, converted to algBw."""
    latency: Callable[[Query, str], float]
    """``(query, proto) -> latency`` in us (``docs/nccl.md`` §2.3)."""
    flows: FlowBuilder
    available: Callable[[Query], bool] = _always
    """Topology / environment rule, checked after ``protocols`` and ``NCCL_ALGO``."""
    time: Callable[[Query, str, int, str, float, float], tuple[float, float]] = call_time
    """``(query, proto, nbytes, dtype, algBw, latency) -> (time, latency)`` in us of one call."""
    channels: Callable[[Query, str, int], int] = default_channels
    """``(query, proto, nbytes) -> runtime channels`` NCCL launches for the call."""
    run_time: Callable[[Query, str, int, float], tuple[float, float] | None] | None = None
    """``(query, proto, nbytes, latency) -> (time, latency)`` in us of the call as the hardware runs
    it, where measurements show NCCL's estimate (``time``, which still makes the choice) to be off;
    None (or a None result) keeps NCCL's estimate."""


def support_rows(support: Mapping[tuple[str, str], tuple[str, ...]], name: str) -> dict[str, tuple[str, ...]]:
    """The ``protocols`` of NCCL algorithm ``name``: its rows of the ``SUPPORT`` table."""
    return {coll: protos for (coll, algo), protos in support.items() if algo == name}


def scale(g: GroupGraph) -> int:
    """Column of NCCL's [arch][scale] tables: 0 for one node, 1 for two, 2 for three or more."""
    return 0 if g.n_nodes == 1 else 1 if g.n_nodes == 2 else 2


def ll_row(g: GroupGraph) -> int:
    """Row of ``LL_MAX_BW``: the arch on one node, else the CPU vendor (1 AMD, 0 the others)."""
    return g.arch if g.n_nodes == 1 else (1 if g.cpu_vendor == "amd" else 0)


def hw_class(g: GroupGraph) -> str:
    """NCCL's intra-node hardware class for the latency tables: NVLINK for NVLink paths, else PCI."""
    return "NVLINK" if g.type_intra == "NVL" else "PCI"


# With one rank per node the network latency is fully exposed and NCCL prices it with Tree's row
# whatever the algorithm (tuning.cc: ``ppn == 1 ? hwLat[NET][TREE] : hwLat[NET][a]``).
_EXPOSED_NET_ROW = "TREE"


def hw_latencies(q: Query, row: str, proto: str) -> tuple[float, float, float]:
    """(base, intra-node step, inter-node step) latencies in us of ``row``'s tables for ``proto``.

    The cluster's own link latencies enter here: each step pays what its cables take beyond their
    default (``GroupGraph.lat_intra_us`` / ``lat_inter_us``, :func:`ncclshim.graph.extra_latency_us`),
    never below zero. The view's NIC latency (NCCL's ``latencyInter``) is added to the network step
    (twice for Simple, whose handshake crosses the network twice). Algorithms combine the three (§2.3).
    """
    p = PROTOS.index(proto)
    intra = max(0.0, HW_LAT_US[hw_class(q.g)][row][p] + q.g.lat_intra_us)
    inter = HW_LAT_US["NET"][_EXPOSED_NET_ROW if q.g.ppn == 1 else row][p] + q.net_latency_us
    if proto == "SIMPLE":
        inter += q.net_latency_us
    return BASE_LAT_US[row][p], intra, max(0.0, inter + q.g.lat_inter_us)


def log2i(x: int) -> int:
    """floor(log2(x)) for x >= 1, 0 below (NCCL's ``log2i``)."""
    return max(0, x.bit_length() - 1)


def nccl_steps(coll: str, n: int) -> int:
    """NCCL's ``nsteps`` of a ring over ``n`` ranks: the bus->alg ratio and the ring latency count."""
    return {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1}.get(coll, n)


def tree_corrected(proto: str, nbytes: int, bw: float, sizes: int) -> float:
    """``bw`` times ``treeCorrectionFactor[proto][log2(nBytes/64)]`` for the first ``sizes`` sizes."""
    log_size = log2i(nbytes >> 6) if nbytes >= 64 else -1
    if 0 <= log_size < sizes:
        bw *= TREE_CORRECTION[proto][log_size]
    return bw


def small_message_channels(q: Query, nbytes: int, threads: int, threshold: int) -> int:
    """NCCL's channel reduction: drop channels while ``nBytes < nc * threads * threshold`` (§1.5).

    Starts from the runtime channels capped by NCCL_MAX_NCHANNELS and raised to NCCL_MIN_NCHANNELS.
    """
    nc = max(min(q.g.runtime_channels, q.s.max_channels), q.s.min_channels)
    while nbytes < nc * threads * threshold and nc >= 2:
        nc -= 1
    return nc
