"""NCCL v2.30.7 tuning constants (``src/graph/tuning.cc``, ``search.cc``, ``comm.h``).

Values and indices as transcribed in ``docs/nccl.md`` §0-§2. Latencies are in microseconds
and bandwidths in GB/s here because that is how NCCL writes them; the planner converts to SI.
"""

from __future__ import annotations

from heterosim.trace.vocab import NCCL_COLLECTIVES

__all__ = [
    "ALGOS",
    "PROTOS",
    "COST_COLLECTIVES",
    "BASE_LAT_US",
    "HW_LAT_US",
    "LL_MAX_BW",
    "PER_CH_MAX_RING_LL128_BW",
    "PER_CH_MAX_TREE_LL128_BW",
    "PER_CH_MAX_TREE_BW",
    "PER_CH_MAX_NVLS_TREE_BW",
    "NVLS_EFFICIENCY",
    "TREE_CORRECTION",
    "INTRA_SPEEDS",
    "INTER_SPEEDS",
    "PROTO_EFFICIENCY",
    "SUPPORT",
    "NET_OVERHEAD_US",
    "MAX_CHANNELS",
    "THREAD_THRESHOLD",
    "FP8_DTYPES",
    "FP8_RING_PENALTY",
    "FP8_RING_MAX_RANKS",
    "REDUCING_COLLECTIVES",
    "NVLS_CHUNK_SIZE",
    "NVLS_CHUNK_STEPS",
    "NVLS_PIPELINE_STAGES",
    "NVLS_RUN_EFFICIENCY",
    "NVLS_STEP_US",
    "NVLS_RUN_LATENCY_US",
]

ALGOS: tuple[str, ...] = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
"""NCCL's algorithm order (``nccl_tuner.h``); selection scans in this order, ties keep the first."""
PROTOS: tuple[str, ...] = ("LL", "LL128", "SIMPLE")
COST_COLLECTIVES: tuple[str, ...] = NCCL_COLLECTIVES
"""Collectives with a cost model (``nccl_common.h``); the others are grouped send/recv."""

MAX_CHANNELS = 64
NET_OVERHEAD_US = {"intel": 1.0, "other": 1.0, "arm": 1.0, "amd": 2.0}
"""``NCCL_NET_OVERHEAD``: per-step network overhead, x3 for Simple (``tuning.cc``)."""

BASE_LAT_US: dict[str, tuple[float, float, float]] = {
    "TREE": (6.8, 14.0, 8.4),
    "RING": (6.6, 14.0, 8.4),
    "COLLNET_DIRECT": (0.0, 0.0, 0.0),
    "COLLNET_CHAIN": (0.0, 0.0, 0.0),
    "NVLS": (0.0, 0.0, 0.0),
    "NVLS_TREE": (0.0, 0.0, 0.0),
    "PAT": (8.0, 8.0, 8.0),
}

# hwLatencies[hw][algo] = (LL, LL128, Simple), hw in NVLINK / PCI / NET.
HW_LAT_US: dict[str, dict[str, tuple[float, float, float]]] = {
    "NVLINK": {
        "TREE": (0.6, 1.25, 4.0), "RING": (0.6, 1.9, 3.4), "COLLNET_DIRECT": (0.0, 0.0, 3.7),
        "COLLNET_CHAIN": (0.0, 0.0, 2.8), "NVLS": (0.0, 0.0, 25.0), "NVLS_TREE": (0.0, 0.0, 25.0),
        "PAT": (0.0, 0.0, 4.0),
    },
    "PCI": {
        "TREE": (1.0, 1.9, 4.0), "RING": (1.0, 2.5, 5.7), "COLLNET_DIRECT": (0.0, 0.0, 3.7),
        "COLLNET_CHAIN": (0.0, 0.0, 2.8), "NVLS": (0.0, 0.0, 0.0), "NVLS_TREE": (0.0, 0.0, 0.0),
        "PAT": (0.0, 0.0, 4.0),
    },
    "NET": {
        "TREE": (5.0, 8.5, 14.0), "RING": (2.7, 4.0, 14.0), "COLLNET_DIRECT": (0.0, 0.0, 31.0),
        "COLLNET_CHAIN": (0.0, 0.0, 30.0), "NVLS": (0.0, 0.0, 18.0), "NVLS_TREE": (0.0, 0.0, 20.9),
        "PAT": (0.0, 0.0, 14.0),
    },
}

# Tables indexed [arch][scale]: arch Volta/Ampere/Hopper/Blackwell, scale N1 / N2 / N4 (>=3 nodes).
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
"""NB: for N2/N4 the first index is the CPU vendor (0 Intel/other, 1 AMD), not the arch."""
PER_CH_MAX_RING_LL128_BW = ((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (40.0,) * 3)
PER_CH_MAX_TREE_LL128_BW = ((20.0,) * 3, (20.0,) * 3, (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
PER_CH_MAX_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
PER_CH_MAX_NVLS_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 80.0))
NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)

TREE_CORRECTION: dict[str, tuple[float, ...]] = {
    "LL": (1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1, 1),
    "LL128": (1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1, 1, 1),
    "SIMPLE": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}
"""``treeCorrectionFactor[proto][log2(nBytes/64)]``."""

# Channel-search speeds, GB/s per channel (``search.cc``), by arch index.
INTRA_SPEEDS = {
    0: (40, 30, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3),
    1: (40, 30, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3),
    2: (60, 50, 40, 30, 24, 20, 15, 12, 11, 6, 3),
    3: (90, 80, 70, 60, 50, 45, 40, 30, 24, 20, 19, 18),
}
INTER_SPEEDS = {
    0: (48, 30, 28, 24, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3, 2.4, 1.2, 0.24, 0.12),
    1: (48, 30, 28, 24, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3, 2.4, 1.2, 0.24, 0.12),
    2: (48, 45, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12),
    3: (96, 86, 80, 48, 45.1, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12),
}

PROTO_EFFICIENCY = {"LL": 0.5, "LL128": 120 / 128, "SIMPLE": 1.0}
"""Payload fraction of what a protocol puts on the wire: LL 8 B data per 16 B line, LL128 120 of
128 B, Simple all (``docs/nccl.md`` §1.2). Flows carry wire bytes = payload / efficiency."""

THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "SIMPLE": 64}
"""Bytes per thread below which NCCL drops a channel (``comm.h``); RING+LL multiplies by nRanks."""

# (collective, algorithm) -> protocols NCCL implements (docs/nccl.md §1.1).
_ALL3 = ("LL", "LL128", "SIMPLE")
SUPPORT: dict[tuple[str, str], tuple[str, ...]] = {
    ("all_reduce", "RING"): _ALL3,
    ("all_reduce", "TREE"): _ALL3,
    ("all_reduce", "NVLS"): ("SIMPLE",),
    ("all_reduce", "NVLS_TREE"): ("SIMPLE",),
    ("all_reduce", "COLLNET_DIRECT"): ("SIMPLE",),
    ("all_reduce", "COLLNET_CHAIN"): ("SIMPLE",),
    ("all_gather", "RING"): _ALL3,
    ("all_gather", "NVLS"): ("SIMPLE",),
    ("all_gather", "COLLNET_DIRECT"): ("SIMPLE",),
    ("all_gather", "PAT"): ("SIMPLE",),
    ("reduce_scatter", "RING"): _ALL3,
    ("reduce_scatter", "NVLS"): ("SIMPLE",),
    ("reduce_scatter", "COLLNET_DIRECT"): ("SIMPLE",),
    ("reduce_scatter", "PAT"): ("SIMPLE",),
    ("broadcast", "RING"): _ALL3,
    ("reduce", "RING"): _ALL3,
}

FP8_DTYPES: tuple[str, ...] = ("fp8", "fp8_e4m3", "fp8_e5m2")
"""The trace's 8-bit floats: NCCL's ``ncclFloat8e4m3`` / ``ncclFloat8e5m2``."""
FP8_RING_PENALTY = 1024.0
FP8_RING_MAX_RANKS = 8
"""``updateCollCostTable`` (``src/enqueue.cc``) multiplies every RING time by 1024 for fp8 data on
more than 8 ranks, whatever the collective, so that deep (lossy) fp8 reduction rings are chosen
last. The factor only orders the choice: the call's time is the unscaled one."""
REDUCING_COLLECTIVES: tuple[str, ...] = ("all_reduce", "reduce", "reduce_scatter")
"""Collectives that reduce: NCCL refuses them on fp8 below SM90 (``taskAppend`` in
``src/enqueue.cc``: "FP8 reduction support begins with sm90 capable devices")."""

NVLS_CHUNK_SIZE = 128 * 1024
"""``NCCL_NVLS_CHUNKSIZE`` default (``src/transport/nvls.cc``): bytes a head handles per channel per loop."""
NVLS_CHUNK_STEPS: tuple[tuple[int, int], ...] = ((64, 65536), (8, 32768), (2, 16384))
"""``calcCollChunking`` (``src/enqueue.cc``), NVLS: with ``ops = channels x heads``, the chunk
drops to 64 KiB below ``64 x ops x chunk`` bytes, then to 32 KiB below ``8 x ops x chunk``, then to
16 KiB below ``2 x ops x chunk``: (factor, new chunk) in order."""
NVLS_PIPELINE_STAGES = 3
"""Warp groups a one-node NVLS all-reduce pipelines a loop through (``RunWorkColl<AllReduce, NVLS>``
in ``src/device/all_reduce.h``, ``oneNode``): scatter into the NVLS buffers, reduce + multicast
(``multimem.ld_reduce`` / ``multimem.st``) by the head, gather out of them."""
NVLS_RUN_EFFICIENCY = (0.0, 0.0, 0.919, NVLS_EFFICIENCY[3])
"""Fraction of the GPU's NCCL NVLink bandwidth a one-node NVLS all-reduce streams at, by
architecture, once its per-step cost (:data:`NVLS_STEP_US`) and latency (:data:`NVLS_RUN_LATENCY_US`)
are counted apart. Not NCCL's: NCCL estimates with ``nvlsEfficiency`` (:data:`NVLS_EFFICIENCY`), no
loop cost and its 25 us latency. Hopper: measured, the least-squares fit (relative errors) of the
Together AI H100 sweep from 2 MiB (``ncclshim/data/nccl_tests_h100.yaml``,
:func:`ncclshim.sweeps.fit_nvls`; ``docs/nccl.md`` §5). Blackwell: no sweep, NCCL's 0.74."""
NVLS_STEP_US = (0.0, 0.0, 0.642, 0.0)
"""Time a one-node NVLS all-reduce channel spends per chunk step beyond streaming its bytes, us, by
architecture: each loop of a channel moves one chunk per head (``heads`` steps: its scatter, reduce
/ multicast and gather warp groups hand each chunk on through FIFO flags, ``all_reduce.h``), so a
loop costs ``heads x`` this. Hopper: measured with :data:`NVLS_RUN_EFFICIENCY` (same fit); it is
what makes the measured rate rise with the chunk (168 / 226 / 258 / 275 GB/s algbw at 16 / 32 / 64
/ 128 KiB). Counting it per step rather than per loop is what the NVLS sweeps on 4-7 GPUs (fewer
heads, not fitted) prefer: 4 GiB on 4 / 5 GPUs within 2.2% / 1.0% (5.1% / 5.6% per loop).
Blackwell: not measured, 0."""
NVLS_RUN_LATENCY_US: tuple[float | None, ...] = (None, None, 18.19, None)
"""Fixed time of a one-node NVLS all-reduce as it runs (launch, the first handshakes through the
switch), us, by architecture, before the cluster's cable latencies (``GroupGraph.lat_intra_us``)
are added. Hopper: measured, the intercept of the same fit (NVIDIA's one-process-per-GPU DGX H100
sweep, not fitted, takes 27 us for a 1 MiB ring/LL all-reduce and 42 us for a 2 MiB NVLS one).
NCCL's tuning latency for NVLS (25 us on Hopper, ``HW_LAT_US``) still decides the algorithm.
None: not measured; the run time uses NCCL's latency."""
