"""NCCL's tuning model: bandwidth and latency per (algorithm, protocol), call time, and the choice.

Follows ``ncclTopoTuneModel`` / ``ncclTopoGetAlgoTime`` / ``topoGetAlgoInfo`` of NCCL v2.30.7
(``research/nccl.md`` §2) over a :class:`~ncclshim.graph.GroupGraph`. NCCL's units are kept inside
(GB/s, microseconds); :func:`select` returns seconds.

One extension that is not NCCL's: ``COHERENT_RING`` (seed 003, HCSim), an all-reduce for fabrics
whose members share cache-coherent memory: the reduce-scatter half of a ring suffices because the
reduced chunks are readable in place, so it takes n-1 steps instead of 2(n-1). It is priced as
NCCL's ring with ``nsteps = n-1`` and offered only when every member declares ``coherent``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from heterosim.errors import UnsupportedCollectiveError
from ncclshim.constants import (
    ALGOS,
    BASE_LAT_US,
    COST_COLLECTIVES,
    HW_LAT_US,
    LL_MAX_BW,
    NET_OVERHEAD_US,
    NVLS_EFFICIENCY,
    PER_CH_MAX_NVLS_TREE_BW,
    PER_CH_MAX_RING_LL128_BW,
    PER_CH_MAX_TREE_BW,
    PER_CH_MAX_TREE_LL128_BW,
    PROTOS,
    SUPPORT,
    THREAD_THRESHOLD,
    TREE_CORRECTION,
)
from ncclshim.graph import GroupGraph

__all__ = ["EXTRA_ALGOS", "ALGO_NAMES", "Choice", "Settings", "parse_env", "cost", "select", "nsteps"]

EXTRA_ALGOS: tuple[str, ...] = ("COHERENT_RING",)
ALGO_NAMES: dict[str, str] = {
    "tree": "TREE", "ring": "RING", "collnetdirect": "COLLNET_DIRECT", "collnetchain": "COLLNET_CHAIN",
    "nvls": "NVLS", "nvlstree": "NVLS_TREE", "pat": "PAT", "coherentring": "COHERENT_RING",
}
"""NCCL_ALGO spellings (case-insensitive; ``CollNet`` means both CollNet algorithms)."""
_PROTO_NAMES = {"ll": "LL", "ll128": "LL128", "simple": "SIMPLE"}
_PATH_RANK = {"NVL": 1, "NVB": 2, "C2C": 3, "PIX": 4, "PXB": 5, "P2C": 6, "PXN": 7, "PHB": 8, "SYS": 9}
_RING_LIKE = ("RING", "NVLS", "NVLS_TREE", "COHERENT_RING")


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """NCCL environment variables that the model honours, parsed."""

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
class Choice:
    """The selected (algorithm, protocol) and NCCL's estimate for it."""

    algo: str
    proto: str
    time_s: float
    latency_s: float
    """Fixed part of ``time_s`` (NCCL's latency term)."""
    alg_bw: float
    """Effective algorithm bandwidth used for this size, B/s (``nBytes / (time - latency)``)."""
    nchannels: int


def _parse_list(value: str, names: Mapping[str, str], var: str) -> frozenset[str]:
    value = value.strip()
    exclude = value.startswith("^")
    chosen: set[str] = set()
    for token in value.lstrip("^").split(","):
        key = token.strip().lower()
        if key == "collnet" and var == "NCCL_ALGO":
            chosen |= {"COLLNET_DIRECT", "COLLNET_CHAIN"}
        elif key in names:
            chosen.add(names[key])
        elif key:
            valid = ", ".join(sorted({v for v in names.values()}))
            raise UnsupportedCollectiveError(f"{var}={value!r}: unknown name {token.strip()!r}; valid names: {valid}")
    full = set(names.values())
    return frozenset(full - chosen if exclude else chosen)


def parse_env(env: Mapping[str, str] | None) -> Settings:
    """Read NCCL_ALGO, NCCL_PROTO, NCCL_MIN/MAX_NCHANNELS, NCCL_NVLS_ENABLE, NCCL_PXN_DISABLE,
    NCCL_COLLNET_ENABLE."""
    env = env or {}
    algos = _parse_list(env["NCCL_ALGO"], ALGO_NAMES, "NCCL_ALGO") if "NCCL_ALGO" in env else frozenset(ALGO_NAMES.values())
    protos = _parse_list(env["NCCL_PROTO"], _PROTO_NAMES, "NCCL_PROTO") if "NCCL_PROTO" in env else frozenset(PROTOS)

    def integer(var: str, default: int) -> int:
        try:
            return int(env.get(var, default))
        except ValueError:
            raise UnsupportedCollectiveError(f"{var}={env[var]!r} is not an integer; set it to e.g. 16") from None

    lo, hi = integer("NCCL_MIN_NCHANNELS", 0), integer("NCCL_MAX_NCHANNELS", 64)
    if hi < 1 or lo > hi:
        raise UnsupportedCollectiveError(f"NCCL_MIN_NCHANNELS={lo} / NCCL_MAX_NCHANNELS={hi}: need 1 <= max and min <= max")
    return Settings(algos=algos, protos=protos, min_channels=lo, max_channels=min(hi, 64),
                    nvls=integer("NCCL_NVLS_ENABLE", 1) != 0 if "NCCL_NVLS_ENABLE" in env else True,
                    pxn=integer("NCCL_PXN_DISABLE", 0) == 0, collnet=integer("NCCL_COLLNET_ENABLE", 1) != 0)


def nsteps(collective: str, algo: str, n: int) -> int:
    """NCCL's ``nsteps`` for the bus->alg conversion and the ring latency."""
    if algo == "COHERENT_RING":
        return n - 1
    return {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1}.get(collective, n)


def _available(coll: str, algo: str, g: GroupGraph, s: Settings, collnet: bool, nvswitch: bool) -> bool:
    if algo not in s.algos:
        return False
    collnet = collnet and s.collnet
    if algo == "COHERENT_RING":
        return coll == "all_reduce" and g.coherent
    if (coll, algo) not in SUPPORT:
        return False
    n = len(g.ranks)
    if algo in ("NVLS", "NVLS_TREE"):
        if not s.nvls or g.nvls_channels < 2:
            return False
        if algo == "NVLS_TREE":
            return g.n_nodes > 1
        return g.n_nodes == 1 or (collnet and coll == "all_reduce")
    if algo.startswith("COLLNET"):
        return collnet and g.n_nodes > 1 and (algo == "COLLNET_CHAIN" or (nvswitch and g.ppn <= 8))
    if algo == "PAT":
        return g.n_nodes == n and g.n_nodes > 1
    return True


def _ll128_ok(g: GroupGraph) -> bool:
    inter_limit = "PXN" if g.arch >= 2 else "PXB"
    return (_PATH_RANK.get(g.type_intra, 9) <= _PATH_RANK["NVB"] and (g.n_nodes == 1 or
            _PATH_RANK.get(g.type_inter, 9) <= _PATH_RANK[inter_limit]) and g.same_sm)


def cost(coll: str, algo: str, proto: str, g: GroupGraph, s: Settings, *, collnet: bool = False,
         nvswitch: bool = True, net_latency_us: float = 0.0) -> tuple[float, float]:
    """NCCL's (busBw-derived algBw in GB/s, latency in us) for one (collective, algo, proto).

    Bandwidth 0 means unavailable. ``research/nccl.md`` §2.2 (bandwidth) and §2.3 (latency).
    """
    if not _available(coll, algo, g, s, collnet, nvswitch) or proto not in s.protos:
        return 0.0, 0.0
    base = "RING" if algo == "COHERENT_RING" else algo
    if algo == "COHERENT_RING":
        if proto != "SIMPLE":  # coherent loads/stores: no flag-per-line protocols
            return 0.0, 0.0
    elif proto not in SUPPORT[(coll, algo)]:
        return 0.0, 0.0
    if proto == "LL128" and not _ll128_ok(g):
        return 0.0, 0.0
    n, nodes, ppn, arch = len(g.ranks), g.n_nodes, g.ppn, g.arch
    scale = 0 if nodes == 1 else 1 if nodes == 2 else 2
    ll_row = arch if nodes == 1 else (1 if g.cpu_vendor == "amd" else 0)
    p = PROTOS.index(proto)
    n_ch = min(g.n_channels, s.max_channels)
    if algo in ("NVLS", "NVLS_TREE"):
        n_ch = min(g.nvls_channels, s.max_channels)
        intra = g.nvls_bw_intra * NVLS_EFFICIENCY[arch] * (n_ch - 1) / n_ch
        intra *= 2 if coll == "all_reduce" else (ppn - 1) / ppn
        inter = g.nvls_bw_inter * (2 if algo == "NVLS_TREE" and nodes <= 2 else 1)
        bw = min(intra, inter, PER_CH_MAX_NVLS_TREE_BW[arch][scale] if algo == "NVLS_TREE" else math.inf)
    else:
        bw = g.bw_intra if (nodes <= 2 or algo.startswith("COLLNET")) else g.bw_inter
    bus = n_ch * bw
    if base == "RING" and proto == "LL":
        bus = min(LL_MAX_BW[ll_row][scale], bus * 0.5)
    elif base == "RING" and proto == "LL128":
        bus = min(bus * 0.92, n_ch * PER_CH_MAX_RING_LL128_BW[arch][scale])
    elif algo == "TREE":
        bus = min(bus * 0.92, n_ch * PER_CH_MAX_TREE_BW[arch][scale])
        if proto == "LL":
            bus = min(bus / 3.8, LL_MAX_BW[ll_row][scale])
        elif proto == "LL128":
            bus = min(bus * (7 / 9 if nodes == 1 else 120 / 128), n_ch * PER_CH_MAX_TREE_LL128_BW[arch][scale])
    elif algo == "PAT":
        bus *= 0.75
    elif algo == "COLLNET_DIRECT":
        if coll in ("all_gather", "reduce_scatter"):
            bus = ppn * min(g.bw_intra, 0.9 * g.bw_inter)
        else:
            f = ppn / n_ch
            bus /= f - (f - 1) / 2
            bus *= 0.85 if arch >= 2 else 1.0
    if algo in _RING_LIKE and not (algo in ("NVLS", "NVLS_TREE") and coll in ("all_gather", "reduce_scatter")):
        alg = bus * n / nsteps(coll, algo, n)
    elif algo == "TREE" or (algo.startswith("COLLNET") and coll == "all_reduce"):
        alg = bus * 0.5
    else:
        alg = bus

    # Latency, us (§2.3).
    lat = BASE_LAT_US[base][p]
    hw_intra = "NVLINK" if g.type_intra == "NVL" else "PCI"
    intra_lat = HW_LAT_US[hw_intra][base][p]
    inter_lat = HW_LAT_US["NET"]["TREE" if ppn == 1 else base][p] + net_latency_us
    if proto == "SIMPLE":
        inter_lat += net_latency_us
    if base == "RING" and coll in ("all_reduce", "all_gather", "reduce_scatter"):
        overhead = NET_OVERHEAD_US[g.cpu_vendor] * (3 if proto == "SIMPLE" else 1) if nodes > 1 else 0.0
        intra_lat = max(intra_lat, overhead)
        n_inter = (2 * (nodes - 1) if coll == "all_reduce" and algo == "RING" else nodes - 1) if nodes > 1 else 0
        lat += (nsteps(coll, algo, n) - n_inter) * intra_lat + n_inter * inter_lat
    elif base == "RING":  # broadcast / reduce
        if len(g.rings) == 1:  # graph->sameChannels: every channel follows one ring
            lat += intra_lat
        else:  # one hop latency per rank; Simple takes Tree's ("waiting for proper chunk modeling")
            lat += n * (HW_LAT_US[hw_intra]["TREE"][p] if proto == "SIMPLE" else intra_lat)
    elif algo == "TREE":
        lat += 2 * ((ppn - 1) * intra_lat + _log2i(nodes) * inter_lat)
    elif algo == "COLLNET_DIRECT":
        lat += 2 * (min(1, ppn - 1) * intra_lat + (ppn - 1) * 0.4) + inter_lat
    elif algo == "COLLNET_CHAIN":
        lat += 2 * (ppn - 1) * intra_lat + inter_lat
    elif algo == "NVLS":
        lat = intra_lat + (inter_lat if nodes > 1 else 0.0)
    elif algo == "NVLS_TREE":
        lat += intra_lat + 2 * _log2i(nodes) * inter_lat
    elif algo == "PAT":
        lat += _log2i(nodes) * inter_lat / 3.5 + n * 2.8
    return alg, lat


def _log2i(x: int) -> int:
    return max(0, x.bit_length() - 1)


def _time_us(coll: str, algo: str, proto: str, nbytes: int, bw: float, lat: float, g: GroupGraph,
             dtype: str) -> tuple[float, float]:
    """(time, latency) in us for one call (``ncclTopoGetAlgoTime``, §2.4)."""
    log_size = _log2i(nbytes >> 6) if nbytes >= 64 else -1
    if algo == "TREE" and coll == "all_reduce" and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[proto][log_size]
    if algo == "NVLS_TREE" and coll == "all_reduce" and g.arch >= 3 and 0 <= log_size < 24:
        bw *= TREE_CORRECTION[proto][log_size]
    n = len(g.ranks)
    if algo == "RING" and proto == "SIMPLE" and coll == "all_reduce" and g.n_nodes > 1 \
            and nbytes / (g.runtime_channels * n) >= 64:
        lat *= 1.9 if g.arch == 0 else 1.4
    t = lat + nbytes / (1000 * bw)
    if algo == "RING" and coll == "all_reduce" and dtype.startswith("fp8") and n > 8:
        t *= 1024  # NCCL excludes FP8 ring all-reduce beyond 8 ranks this way
    return t, lat


def _channels(coll: str, algo: str, proto: str, nbytes: int, g: GroupGraph, s: Settings) -> int:
    """Runtime channels for this call after NCCL's small-message reduction (§1.5)."""
    if algo in ("NVLS", "NVLS_TREE"):
        nc = 16 if g.arch == 2 else (24 if g.n_nodes == 1 else 32)
        return max(1, min(nc, s.max_channels))
    nc = max(min(g.runtime_channels, s.max_channels), s.min_channels)
    nt = 640 if algo in ("TREE", "PAT") or proto == "LL128" else 512
    thr = 512 if algo.startswith("COLLNET") else THREAD_THRESHOLD[proto] * (len(g.ranks) if algo == "RING" and proto == "LL" else 1)
    while nbytes < nc * nt * thr and nc >= 2:
        nc -= 1
    return nc


def select(coll: str, nbytes: int, g: GroupGraph, s: Settings, *, dtype: str = "bf16", collnet: bool = False,
           nvswitch: bool = True, net_latency_us: float = 0.0) -> Choice:
    """NCCL's choice: the (algo, proto) with the smallest time, algorithm-major scan, ties keep first."""
    if coll not in COST_COLLECTIVES:
        raise UnsupportedCollectiveError(f"{coll!r} has no NCCL cost model; valid: {', '.join(COST_COLLECTIVES)}")
    best: Choice | None = None
    for algo in ALGOS + EXTRA_ALGOS:
        for proto in PROTOS:
            bw, lat = cost(coll, algo, proto, g, s, collnet=collnet, nvswitch=nvswitch, net_latency_us=net_latency_us)
            if bw <= 0:
                continue
            t, lat_eff = _time_us(coll, algo, proto, nbytes, bw, lat, g, dtype)
            if best is None or t * 1e-6 < best.time_s:
                best = Choice(algo=algo, proto=proto, time_s=t * 1e-6, latency_s=lat_eff * 1e-6,
                              alg_bw=nbytes / max((t - lat_eff) * 1e-6, 1e-30),
                              nchannels=_channels(coll, algo, proto, nbytes, g, s))
    if best is None:
        raise UnsupportedCollectiveError(
            f"no NCCL algorithm/protocol is available for {coll} on {len(g.ranks)} ranks over {g.n_nodes} node(s) "
            f"with NCCL_ALGO={sorted(s.algos)} NCCL_PROTO={sorted(s.protos)}; widen NCCL_ALGO/NCCL_PROTO")
    return best
