"""The host as a resource: a CPU dispatch stream that issues every op before the GPU can run it.

Eager PyTorch issues one op at a time from the rank's CPU thread. Issuing op ``i`` costs the CPU
``c_i`` (Python call, dispatcher, autograd recording, kernel launch); the GPU cannot start op ``i``
before it is issued; a synchronising op (``.item()``, a copy to the host) makes the CPU wait for
the GPU to finish everything before it. With ``d_i`` the GPU time of op ``i``::

    issue_i = max(issue_{i-1}, end_{i-1} if sync_i else -inf) + c_i
    start_i = max(end_{i-1}, issue_i)
    end_i   = start_i + d_i

:func:`host_bound_durations` runs this recurrence over one block and returns the *effective*
duration of every op, ``end_i - end_{i-1}`` (the GPU time plus the idle gap before it), which is
what the engines consume through :attr:`replay.expand.Workload.durations`. Comm and wait ops keep
their zero: their dispatch delays the next compute op, and the gap lands on that op.

Dispatch cost of an op (:func:`dispatch_costs`) is the figure of its class in the node type's
``cpu.dispatch_us`` (:class:`heterosim.cluster.spec.HostDispatch`): ``fwd`` for forward and
recomputed ops (Python + autograd), ``bwd`` for backward ops (the C++ autograd engine), ``nograd``
for optimizer and other ops, ``collective`` for collective and p2p launches, ``wait`` for waits.
A fused optimizer is one recorded op, so it costs one dispatch; per-parameter loops cost one per
recorded op. The default figures are measured by ``benchmarks/bench_dispatch.py`` (docs/host.md).

Known limitations:

- NB: CPU and GPU are taken as aligned at the start of every block (the CPU's lead is not
  carried from one block to the next), so a GPU-bound block pays its first op's dispatch cost
  once (a few microseconds per block; blocks are a micro-batch's forward or backward of a stage).
- NB: a wait does not stop the CPU (NCCL's ``Work.wait`` makes the compute stream wait, not the
  host), and the time the GPU stalls at a wait is unknown inside a block, so the CPU is not
  credited with catching up during exposed communication: a rank that is both host-bound and
  comm-bound is over-predicted by up to the exposed time.
- NB: views (``view``, ``t``, ``reshape``) are not recorded ops (they launch nothing), so their
  Python cost is not charged; nor are data loading, logging, or a CUDA-graph replay (one launch
  for many kernels, Megatron's ``--enable-cuda-graph``), which is not captured.
- NB: the collective's own start is not delayed by its launch cost (only the ops after it are).
- NB: the idle gap is part of the op's duration, so the engines' compute slowdown under
  communication (``overlap_slowdown``) stretches it too while a comm op is in flight.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from heterosim.cluster.spec import CUDA_LAUNCH_US
from heterosim.errors import ConfigError, ReplayError

__all__ = ["CUDA_LAUNCH_US", "SYNC_OPS", "host_bound_durations", "dispatch_costs", "sync_flags",
           "dispatch_by_gpu_type", "with_host", "stall_per_rank"]

SYNC_OPS: frozenset[str] = frozenset({"_local_scalar_dense", "item", "nonzero", "masked_select",
                                      "unique", "_unique2", "repeat_interleave", "equal", "is_nonzero"})
"""Op base names whose output size or value the host must read from the GPU (a device-to-host
copy that blocks the CPU): ``.item()`` (``_local_scalar_dense``), data-dependent output shapes."""


def host_bound_durations(gpu_s: np.ndarray, dispatch_s: np.ndarray, sync: np.ndarray,
                         compute: np.ndarray | None = None) -> np.ndarray:
    """Effective per-op durations of one block when the CPU issues every op (module docstring).

    Args:
        gpu_s: GPU seconds of every op (0 for comm and wait ops).
        dispatch_s: CPU seconds to issue every op.
        sync: True where the CPU waits for the GPU to finish all earlier ops before issuing.
        compute: True for ops whose duration the engine uses (compute ops); the idle gap before
            any other op moves to the next compute op. None: every op.

    Returns:
        ``eff`` with ``eff.sum() >= gpu_s.sum()``; ``eff == gpu_s`` when every dispatch is 0. The
        block ends ``eff.sum()`` after it starts (CPU and GPU aligned at its start).

    Raises:
        ReplayError: arrays of different lengths or negative times.

    Example: two 10 us kernels dispatched at 4 us each run at 4..14 and 14..24 (GPU-bound,
    ``[14, 10]``); at 30 us each at 30..40 and 60..70 (host-bound, ``[40, 30]``).
    """
    d = np.asarray(gpu_s, dtype=np.float64)
    c = np.asarray(dispatch_s, dtype=np.float64)
    s = np.asarray(sync, dtype=bool)
    m = np.ones(d.shape, dtype=bool) if compute is None else np.asarray(compute, dtype=bool)
    if not (d.shape == c.shape == s.shape == m.shape) or d.ndim != 1:
        raise ReplayError(f"host model: {d.shape}, {c.shape}, {s.shape}, {m.shape}: give one GPU time, "
                          "dispatch cost, sync flag and compute flag per op")
    if d.size and (d.min() < 0 or c.min() < 0):
        raise ReplayError("host model: GPU times and dispatch costs must be >= 0 seconds")
    d = np.where(m, d, 0.0)
    end = np.empty_like(d)
    issued = np.empty_like(d)
    t_end = 0.0  # GPU end of the ops so far
    t_issue = 0.0  # CPU time after issuing the ops so far
    cuts = np.flatnonzero(s).tolist()
    for a, b in zip([0] + cuts, cuts + [d.size]):
        if a == b:
            continue
        if s[a]:
            t_issue = max(t_issue, t_end)
        # Within a run without syncs the scan is a max-plus prefix: with I = issue times and
        # D = prefix sums of GPU time, end_i = D_i + max(t_end, max_{k<=i}(I_k - D_{k-1})).
        issue = t_issue + np.cumsum(c[a:b])
        dsum = np.cumsum(d[a:b])
        lead = np.maximum.accumulate(np.where(m[a:b], issue - (dsum - d[a:b]), -np.inf))
        end[a:b] = dsum + np.maximum(t_end, lead)
        issued[a:b] = issue
        t_issue, t_end = float(issue[-1]), float(end[b - 1])
    prev = np.concatenate([[0.0], end[:-1]])
    # GPU time plus the idle gap before the op (exactly d where the GPU never waits).
    return np.where(m, d + np.maximum(issued - prev, 0.0), 0.0)


def dispatch_costs(kinds: Sequence[str], phases: Sequence[str], per_class_s: dict[str, float]) -> np.ndarray:
    """CPU seconds to issue every op, by its kind and phase (classes in the module docstring)."""
    out = np.empty(len(kinds))
    for i, (k, ph) in enumerate(zip(kinds, phases)):
        if k == "compute":
            cls = "fwd" if ph in ("fwd", "recompute") else "bwd" if ph == "bwd" else "nograd"
        elif k == "wait":
            cls = "wait"
        else:
            cls = "collective"
        out[i] = per_class_s[cls]
    return out


def sync_flags(names: Sequence[str]) -> np.ndarray:
    """True for ops in :data:`SYNC_OPS` (by base name: ``aten.nonzero.default`` -> ``nonzero``)."""
    return np.array([(n.split(".")[1] if n.startswith("aten.") else n) in SYNC_OPS for n in names],
                    dtype=bool)


def dispatch_by_gpu_type(cluster: Any, gpu_types: Sequence[str]) -> dict[str, dict[str, float]]:
    """Class -> seconds for every GPU type of ``gpu_types``, from the node types that hold it.

    Raises:
        ConfigError: one GPU type sits in node types whose ``cpu.dispatch_us`` differ (prices are
            per GPU type, so its ranks must share one host figure).
    """
    out: dict[str, dict[str, float]] = {}
    for g in cluster.spec.node_groups:
        gpus = cluster.group_gpus.get(g.name, ())
        if not gpus or cluster.gpu_type(gpus[0]) not in gpu_types:
            continue
        gpu = cluster.gpu_type(gpus[0])
        got = cluster.spec.node_type(g.node_type).dispatch.seconds()
        if gpu in out and out[gpu] != got:
            raise ConfigError(
                f"GPU type {gpu} sits in node types with different cpu.dispatch_us; give them the same "
                "figures (prices are per GPU type) or split the GPUs into two GPU types")
        out[gpu] = got
    return out


def with_host(durations: Callable[[int, str, str], np.ndarray], trace: Any,
              dispatch: dict[str, dict[str, float]],
              stall_out: dict | None = None) -> Callable[[int, str, str], np.ndarray]:
    """Wrap a ``Workload.durations`` callable so that it returns host-bound effective durations.

    ``dispatch`` maps GPU type -> class -> seconds (:func:`dispatch_by_gpu_type`); a GPU type
    missing from it, or with every class 0, keeps its GPU durations. ``stall_out`` (optional)
    receives ``(role, block, gpu) -> seconds`` the GPU idles waiting for its host in that block.
    """

    def wrapped(role_id: int, block: str, gpu: str) -> np.ndarray:
        secs = np.asarray(durations(role_id, block, gpu), dtype=np.float64)
        per = dispatch.get(gpu)
        if not per or not any(v > 0 for v in per.values()):
            return secs
        cols = trace.roles[role_id].blocks[block].columns
        eff = host_bound_durations(secs, dispatch_costs(cols["kind"], cols["phase"], per),
                                   sync_flags(cols["name"]),
                                   np.array([k == "compute" for k in cols["kind"]], dtype=bool))
        if stall_out is not None:
            stall_out[(role_id, block, gpu)] = float(eff.sum() - secs.sum())
        return eff

    return wrapped


def stall_per_rank(w: Any) -> float:
    """Mean over ranks of the seconds per iteration the GPU idles waiting for its host (inside
    compute spans; it is counted as compute in the breakdown)."""
    stall = w._cache.get("host_stall", {})
    if not stall:
        return 0.0
    from collections import Counter

    total = 0.0
    for role in w.trace.roles:
        uses = Counter(seg.block for seg in role.program)
        for gpu, nranks in Counter(w.gpu_type[r] for r in role.ranks).items():
            total += nranks * sum(n * stall.get((role.id, b, gpu), 0.0) for b, n in uses.items())
    return total / w.trace.world_size
