"""NCCL's tuning model: bandwidth and latency per (algorithm, protocol), call time, and the choice.

Follows ``ncclTopoTuneModel`` / ``ncclTopoGetAlgoTime`` / ``topoGetAlgoInfo`` of NCCL v2.30.7
(``docs/nccl.md`` §2) over a :class:`~ncclshim.graph.GroupGraph`. NCCL's units are kept inside
(GB/s, microseconds); :func:`select` returns seconds.

What is common to every algorithm lives here: the environment (``NCCL_ALGO`` tokens come from the
registry's entries), the protocol rules (NCCL_PROTO, LL128's path conditions) and the scan. What
differs between algorithms (availability, bandwidth, latency, call time, channels) is the entry's
in :mod:`ncclshim.algorithms`, dispatched through the registry in its (NCCL's) order.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping

from heterosim.errors import UnsupportedCollectiveError
from ncclshim import algorithms
from ncclshim.algorithms import Algorithm, Query
from ncclshim.algorithms.entry import Settings
from ncclshim.constants import (
    COST_COLLECTIVES,
    FP8_DTYPES,
    FP8_RING_MAX_RANKS,
    FP8_RING_PENALTY,
    PROTOS,
    REDUCING_COLLECTIVES,
)
from ncclshim.graph import GroupGraph

__all__ = ["Choice", "Settings", "parse_env", "cost", "select"]

_PROTO_NAMES = {"ll": frozenset({"LL"}), "ll128": frozenset({"LL128"}), "simple": frozenset({"SIMPLE"})}
_ARCH_NAMES = ("Volta", "Ampere", "Hopper", "Blackwell")
_PATH_RANK = {"NVL": 1, "NVB": 2, "C2C": 3, "PIX": 4, "PXB": 5, "P2C": 6, "PXN": 7, "PHB": 8, "SYS": 9}


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """The selected (algorithm, protocol) and NCCL's estimate for it."""

    algo: str
    proto: str
    time_s: float
    latency_s: float
    """Fixed part of ``time_s`` (NCCL's latency term)."""
    nccl_time_s: float
    """NCCL's own estimate (``ncclTopoGetAlgoTime``), which made the choice; equals ``time_s``
    unless the algorithm models how the call runs (``Algorithm.run_time``)."""
    alg_bw: float
    """Effective algorithm bandwidth used for this size, B/s (``nBytes / (time - latency)``)."""
    nchannels: int


def _parse_list(value: str, tokens: Mapping[str, frozenset[str]], var: str) -> frozenset[str]:
    """A comma list of case-insensitive tokens, each naming one or more values; ``^`` excludes them."""
    value = value.strip()
    exclude = value.startswith("^")
    full = frozenset().union(*tokens.values())
    chosen: set[str] = set()
    for token in value.lstrip("^").split(","):
        key = token.strip().lower()
        if key in tokens:
            chosen |= tokens[key]
        elif key:
            valid = ", ".join(sorted(full))
            raise UnsupportedCollectiveError(f"{var}={value!r}: unknown name {token.strip()!r}; valid names: {valid}")
    return frozenset(full - chosen if exclude else chosen)


ENV_NAME = re.compile(r"NCCL_[A-Z0-9_]+")
"""What an NCCL environment variable's name looks like (what :func:`parse_env` and the launch-script
environments of the validation recipes accept as one)."""


def parse_env(env: Mapping[str, str] | None) -> Settings:
    """Read NCCL_ALGO, NCCL_PROTO, NCCL_MIN/MAX_NCHANNELS, NCCL_NVLS_ENABLE, NCCL_PXN_DISABLE,
    NCCL_COLLNET_ENABLE."""
    env = env or {}
    algos = (_parse_list(env["NCCL_ALGO"], algorithms.spellings(), "NCCL_ALGO") if "NCCL_ALGO" in env
             else frozenset(algorithms.names()))
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


def _ll128_ok(g: GroupGraph) -> bool:
    """LL128 needs NVLink inside nodes, at most PXN (SM80+) / PXB between them, and equal SMs (tuning.cc)."""
    inter_limit = "PXN" if g.arch >= 2 else "PXB"
    return (_PATH_RANK.get(g.type_intra, 9) <= _PATH_RANK["NVB"] and (g.n_nodes == 1 or
            _PATH_RANK.get(g.type_inter, 9) <= _PATH_RANK[inter_limit]) and g.same_sm)


def _cost(entry: Algorithm, proto: str, q: Query) -> tuple[float, float]:
    """(algBw GB/s, latency us) of ``entry`` for ``proto``; (0, 0) when unavailable."""
    if entry.name not in q.s.algos or proto not in q.s.protos or proto not in entry.protocols.get(q.coll, ()) \
            or not entry.available(q):
        return 0.0, 0.0
    if proto == "LL128" and not _ll128_ok(q.g):
        return 0.0, 0.0
    return entry.bandwidth(q, proto), entry.latency(q, proto)


def cost(coll: str, algo: str, proto: str, g: GroupGraph, s: Settings, *, collnet: bool = False,
         nvswitch: bool = True, net_latency_us: float = 0.0) -> tuple[float, float]:
    """NCCL's (busBw-derived algBw in GB/s, latency in us) for one (collective, algo, proto).

    Bandwidth 0 means unavailable. ``docs/nccl.md`` §2.2 (bandwidth) and §2.3 (latency); the
    per-algorithm parts are the registry entry's (:mod:`ncclshim.algorithms`).

    Raises:
        UnsupportedCollectiveError: ``algo`` is not a registered algorithm.
    """
    q = Query(coll=coll, g=g, s=s, collnet=collnet and s.collnet, nvswitch=nvswitch, net_latency_us=net_latency_us)
    return _cost(algorithms.get(algo), proto, q)


def select(coll: str, nbytes: int, g: GroupGraph, s: Settings, *, dtype: str = "bf16", collnet: bool = False,
           nvswitch: bool = True, net_latency_us: float = 0.0) -> Choice:
    """NCCL's choice: the (algo, proto) with the smallest time, algorithm-major scan, ties keep first.

    fp8 data (``FP8_DTYPES``): rings on more than 8 ranks compete at 1024x their time, whatever the
    collective (NCCL ranks deep lossy rings last); the returned time is the unscaled one.

    Raises:
        UnsupportedCollectiveError: no pair is available, or an fp8 reduction below SM90.
    """
    if coll not in COST_COLLECTIVES:
        raise UnsupportedCollectiveError(f"{coll!r} has no NCCL cost model; valid: {', '.join(COST_COLLECTIVES)}")
    fp8 = dtype in FP8_DTYPES
    if fp8 and coll in REDUCING_COLLECTIVES and g.arch < 2:
        raise UnsupportedCollectiveError(
            f"{coll} of {dtype} data on {_ARCH_NAMES[g.arch]} GPUs: NCCL reduces fp8 only on SM90 (Hopper) or newer "
            "('FP8 reduction support begins with sm90 capable devices'); reduce in bf16 or use Hopper GPUs")
    q = Query(coll=coll, g=g, s=s, collnet=collnet and s.collnet, nvswitch=nvswitch, net_latency_us=net_latency_us)
    # NCCL's fp8 partition (updateCollCostTable): rings on > 8 ranks rank x1024 in the choice only.
    penalised = fp8 and len(g.ranks) > FP8_RING_MAX_RANKS
    best: Choice | None = None
    best_key = math.inf
    for entry in algorithms.entries():
        for proto in PROTOS:
            bw, lat = _cost(entry, proto, q)
            if bw <= 0:
                continue
            t, lat_eff = entry.time(q, proto, nbytes, dtype, bw, lat)
            key = t * (FP8_RING_PENALTY if penalised and entry.tables == "RING" else 1.0)
            if best is None or key < best_key:
                best_key = key
                run = entry.run_time(q, proto, nbytes, lat_eff) if entry.run_time is not None else None
                ran, ran_lat = (t, lat_eff) if run is None else run
                best = Choice(algo=entry.name, proto=proto, time_s=ran * 1e-6, latency_s=ran_lat * 1e-6,
                              nccl_time_s=t * 1e-6, alg_bw=nbytes / max((ran - ran_lat) * 1e-6, 1e-30),
                              nchannels=entry.channels(q, proto, nbytes))
    if best is None:
        raise UnsupportedCollectiveError(
            f"no NCCL algorithm/protocol is available for {coll} on {len(g.ranks)} ranks over {g.n_nodes} node(s) "
            f"with NCCL_ALGO={sorted(s.algos)} NCCL_PROTO={sorted(s.protos)}; widen NCCL_ALGO/NCCL_PROTO")
    return best
