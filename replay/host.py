"""The host as a resource: a CPU dispatch stream that issues every op before the GPU can run it.

Eager PyTorch issues one op at a time from the rank's CPU thread. Issuing op ``i`` costs the CPU
``c_i`` (Python call, dispatcher, autograd recording, kernel launch); the GPU cannot start op ``i``
before it is issued; an op marked ``host_sync`` in the trace (the script read a value back just
before it: ``.item()``, a copy to the host, ``torch.cuda.synchronize()``; ``capture/hostsync.py``)
is issued only after the CPU has waited for the GPU to finish everything before it. With ``d_i``
the GPU time of op ``i``::

    issue_i = max(issue_{i-1}, end_{i-1} if sync_i else -inf) + c_i
    start_i = max(end_{i-1}, issue_i)
    end_i   = start_i + d_i

:func:`host_bound_durations` runs this recurrence over one block and returns the *effective*
duration of every op, ``end_i - end_{i-1}`` (the GPU time plus the idle gap before it), which is
what the engines consume through :attr:`replay.expand.Workload.durations`. Comm and wait ops keep
their zero: their dispatch delays the next compute op, and the gap lands on that op.

The CPU's lead. The CPU runs ahead of the GPU wherever the GPU is the slower of the two; the
*lead* is how far (GPU end of the ops issued so far minus the CPU's time). A block entered with
lead ``L`` is scanned from ``issue = -L``: its first ops are already issued, and the lead absorbs
up to ``L`` of host stall. :func:`role_leads` carries the lead across the blocks of a role's
program (one walk per role and GPU type, O(segments), before the engines run), bounded by what
bounds it on a GPU:

- a host sync drops it to 0 (the CPU waited for the GPU);
- the launch queue: a CUDA stream holds about 1024 pending kernels, and a launch into a full
  queue blocks the CPU until one completes (NVIDIA developer forums, "CUDA stream are blocked when
  launching lots of kernels (>1000)", 2018, and Stack Overflow 53970187: launches return in 4-5 us
  for the first ~1000 kernels of a stream, then at the pace kernels complete), so the lead is at
  most the GPU time of the last :data:`LAUNCH_QUEUE_DEPTH` ops issued.

A block met with different leads in the program (the forward of the first micro-batch and of the
others) is priced at the smallest (the durations are per block: see the known limitations).

Dispatch cost of an op (:func:`dispatch_costs`) is the figure of its class in the node type's
``cpu.dispatch_us`` (:class:`heterosim.cluster.spec.HostDispatch`): ``fwd`` for forward and
recomputed ops (Python + autograd), ``bwd`` for backward ops (the C++ autograd engine), ``nograd``
for optimizer and other ops, ``collective`` for collective and p2p launches, ``wait`` for waits.
A fused optimizer is one recorded op, so it costs one dispatch; per-parameter loops cost one per
recorded op. A CUDA-graph replay (``launch`` column ``graph``: ``capture/graphs.py``) costs one
``nograd`` dispatch (the Python ``graph.replay()`` call and one ``cudaGraphLaunch``) for all its
kernels; the kernels after the first (``in_graph``) cost the CPU nothing. The default figures are
measured by ``benchmarks/bench_dispatch.py`` (docs/host.md).

Known limitations:

- NB: a wait does not stop the CPU (NCCL's ``Work.wait`` makes the compute stream wait, not the
  host), and the time the GPU stalls at a wait (exposed communication, a pipeline bubble) is known
  only to the engines, so the lead is not credited with it: a rank that is both host-bound and
  comm-bound is over-predicted by up to the exposed time that precedes its host-bound ops (the
  lead this module carries is a lower bound of the real one).
- NB: a block's durations are computed once (per role, block and GPU type, so the engines stay
  fast) at the smallest lead it is entered with; an occurrence entered with more lead is priced
  as if it had less (the error is at most the difference, on that occurrence's first host-bound
  ops).
- NB: the launch-queue bound is applied where blocks end, with the plain GPU time of the last
  1024 ops (stalls between them not counted); inside a block the scan lets the CPU run ahead
  without bound, which matters only when a block has more than 1024 GPU-heavy ops followed by
  host-heavy ones.
- NB: a lead that is negative at a block's end (comm ops issued after the last kernel whose
  dispatch has not yet shown as a gap) is taken as 0: their dispatch is not charged.
- NB: views (``view``, ``t``, ``reshape``) are not recorded ops (they launch nothing), so their
  Python cost is not charged; nor are data loading and logging in Python.
- NB: the collective's own start is not delayed by its launch cost (only the ops after it are).
- NB: the idle gap is part of the op's duration, so the engines' compute slowdown under
  communication (``overlap_slowdown``) stretches it too while a comm op is in flight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from heterosim.cluster.spec import CUDA_LAUNCH_US
from heterosim.errors import ConfigError, ReplayError

__all__ = ["CUDA_LAUNCH_US", "LAUNCH_QUEUE_DEPTH", "host_bound_durations", "dispatch_costs", "sync_flags",
           "BlockHost", "block_host", "role_leads", "dispatch_by_gpu_type", "with_host", "stall_per_rank"]

LAUNCH_QUEUE_DEPTH = 1024
"""Kernels a CUDA stream holds pending before a launch blocks the CPU (module docstring)."""


def _check(d: np.ndarray, c: np.ndarray, s: np.ndarray, m: np.ndarray) -> None:
    if not (d.shape == c.shape == s.shape == m.shape) or d.ndim != 1:
        raise ReplayError(f"host model: {d.shape}, {c.shape}, {s.shape}, {m.shape}: give one GPU time, "
                          "dispatch cost, sync flag and compute flag per op")
    if d.size and (d.min() < 0 or c.min() < 0):
        raise ReplayError("host model: GPU times and dispatch costs must be >= 0 seconds")


def _arrays(gpu_s: Any, dispatch_s: Any, sync: Any, compute: Any) -> tuple[np.ndarray, ...]:
    d = np.asarray(gpu_s, dtype=np.float64)
    c = np.asarray(dispatch_s, dtype=np.float64)
    s = np.asarray(sync, dtype=bool)
    m = np.ones(d.shape, dtype=bool) if compute is None else np.asarray(compute, dtype=bool)
    _check(d, c, s, m)
    return np.where(m, d, 0.0), c, s, m


def _scan(d: np.ndarray, c: np.ndarray, s: np.ndarray, m: np.ndarray, lead_s: float) -> tuple[np.ndarray, float]:
    """The recurrence over one block entered with the CPU ``lead_s`` ahead: (effective durations,
    lead at the block's end: GPU end of its last kernel minus the CPU's time after its last op)."""
    end = np.empty_like(d)
    issued = np.empty_like(d)
    t_end = 0.0  # GPU end of the ops so far
    t_issue = -lead_s  # CPU time after issuing the ops so far
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
        end[a:b] = t_end + dsum + np.maximum(0.0, lead - t_end)
        issued[a:b] = issue
        t_issue, t_end = float(issue[-1]), float(end[b - 1])
    prev = np.concatenate([[0.0], end[:-1]])
    # GPU time plus the idle gap before the op (exactly d where the GPU never waits).
    eff = np.where(m, d + np.maximum(issued - prev, 0.0), 0.0)
    return eff, t_end - t_issue


def host_bound_durations(gpu_s: np.ndarray, dispatch_s: np.ndarray, sync: np.ndarray,
                         compute: np.ndarray | None = None, lead_s: float = 0.0) -> np.ndarray:
    """Effective per-op durations of one block when the CPU issues every op (module docstring).

    Args:
        gpu_s: GPU seconds of every op (0 for comm and wait ops).
        dispatch_s: CPU seconds to issue every op.
        sync: True where the CPU waits for the GPU to finish all earlier ops before issuing.
        compute: True for ops whose duration the engine uses (compute ops); the idle gap before
            any other op moves to the next compute op. None: every op.
        lead_s: how far the CPU is ahead of the GPU when the block starts (0: aligned).

    Returns:
        ``eff`` with ``eff.sum() >= gpu_s.sum()``; ``eff == gpu_s`` when every dispatch is 0. The
        block ends ``eff.sum()`` after it starts.

    Raises:
        ReplayError: arrays of different lengths or negative times.

    Example: two 10 us kernels dispatched at 4 us each run at 4..14 and 14..24 (GPU-bound,
    ``[14, 10]``); at 30 us each at 30..40 and 60..70 (host-bound, ``[40, 30]``); entered with the
    CPU 25 us ahead, at 5..15 and 35..45 (``[15, 30]``).
    """
    d, c, s, m = _arrays(gpu_s, dispatch_s, sync, compute)
    return _scan(d, c, s, m, float(lead_s))[0]


@dataclass(frozen=True, slots=True)
class BlockHost:
    """One block as the host sees it: per-op arrays and what the block does to the CPU's lead."""

    gpu_s: np.ndarray
    """GPU seconds per op (0 for comm and wait ops)."""
    dispatch_s: np.ndarray
    """CPU seconds to issue each op."""
    sync: np.ndarray
    """True where the op is issued only after the CPU waited for the GPU."""
    compute: np.ndarray
    """True for compute ops."""
    synced_exit_s: float | None
    """Lead at the block's end when it holds a sync (it does not depend on the lead it starts
    with); None for a block without one."""
    drift_s: float
    """GPU seconds minus CPU seconds of the block (``D - C``)."""
    deficit_s: float
    """``M = max_k (C_k - D_{k-1})`` over compute ops (-inf if none): the lead the block needs not
    to stall the GPU. A block without sync entered with lead ``L`` ends with ``D - C + max(L, M)``."""
    tail_s: np.ndarray
    """``tail_s[k]``: GPU seconds of the block's last ``k`` ops (``k`` up to the launch-queue depth)."""

    def exit_lead(self, lead_s: float) -> float:
        """The lead at the block's end when it starts with ``lead_s`` (never below 0: module docstring)."""
        if self.synced_exit_s is not None:
            return max(self.synced_exit_s, 0.0)
        return max(self.drift_s + max(lead_s, self.deficit_s), 0.0)


def block_host(gpu_s: Any, dispatch_s: Any, sync: Any, compute: Any = None) -> BlockHost:
    """Summarise one block for :func:`role_leads` (arrays as :func:`host_bound_durations` takes them)."""
    d, c, s, m = _arrays(gpu_s, dispatch_s, sync, compute)
    synced = bool(s.any())
    first = int(np.argmax(s)) if synced else d.size  # ops before the first sync
    dsum = np.cumsum(d[:first])
    need = np.where(m[:first], np.cumsum(c[:first]) - (dsum - d[:first]), -np.inf)
    tail = np.concatenate([[0.0], np.cumsum(d[::-1][:LAUNCH_QUEUE_DEPTH])])
    return BlockHost(gpu_s=d, dispatch_s=c, sync=s, compute=m,
                     synced_exit_s=_scan(d, c, s, m, 0.0)[1] if synced else None,
                     drift_s=float(d.sum() - c.sum()), deficit_s=float(need.max(initial=-np.inf)),
                     tail_s=tail)


_MAX_PASSES = 64
"""Iterations :func:`role_leads` walks at most to reach the steady state."""


def role_leads(program: Sequence[str], blocks: Mapping[str, BlockHost]) -> dict[str, float]:
    """The lead every block of a role's program is entered with (the smallest over its occurrences).

    Walks the program one iteration after another until the lead at its start repeats (the steady
    state of a training loop: the CPU may be ahead of the GPU when an iteration starts), at most
    :data:`_MAX_PASSES` times, then once more to read each block's lead. After each block the lead
    is capped by the GPU seconds of the last :data:`LAUNCH_QUEUE_DEPTH` ops issued (earlier
    iterations fill the window when one holds fewer ops).

    NB: a loop whose lead grows by less than 1/64 of the queue's GPU time per iteration is read
    before it reaches its cap (a lower lead: the error is toward host-bound).
    """
    caps = _queue_caps(program, blocks)
    exits = [blocks[b].exit_lead for b in program]
    lead = 0.0
    for _ in range(_MAX_PASSES):
        start = lead
        for exit_lead, cap in zip(exits, caps):
            lead = min(exit_lead(lead), cap)
        if abs(lead - start) <= 1e-12:
            break
    leads: dict[str, float] = {}
    for b, cap in zip(program, caps):
        leads[b] = min(leads.get(b, math.inf), lead)
        lead = min(blocks[b].exit_lead(lead), cap)
    return leads


def _queue_caps(program: Sequence[str], blocks: Mapping[str, BlockHost]) -> list[float]:
    """GPU seconds of the last LAUNCH_QUEUE_DEPTH ops up to the end of each segment of ``program``
    (earlier segments, and earlier iterations of the program, fill what a segment lacks)."""
    n = len(program)
    as_list = {b: (blocks[b].tail_s.tolist(), blocks[b].tail_s.size - 1) for b in dict.fromkeys(program)}
    tails = [as_list[b] for b in program]
    if sum(size for _, size in tails) == 0:
        return [0.0] * n
    caps: list[float] = []
    # A segment whose last k segments are the same blocks as those of an earlier segment of the
    # same block (whose window spanned k segments, without wrapping) adds the same tails in the
    # same order: its cap is that one's, bit for bit. A training loop repeats a few block sequences
    # thousands of times, so most caps are copies.
    last: dict[str, tuple[int, int]] = {}
    for i in range(n):
        b = program[i]
        seen = last.get(b)
        if seen is not None:
            j, k = seen
            if i >= k - 1 and j >= k - 1 and program[i - k + 1:i + 1] == program[j - k + 1:j + 1]:
                caps.append(caps[j])
                last[b] = (i, k)
                continue
        left, total, k = LAUNCH_QUEUE_DEPTH, 0.0, 0
        while left > 0:
            tail, size = tails[(i - k) % n]
            take = left if left < size else size
            total += tail[take]
            left -= take
            k += 1
        caps.append(total)
        last[b] = (i, k)
    return caps


def dispatch_costs(kinds: Sequence[str], phases: Sequence[str], per_class_s: dict[str, float],
                   launch: Sequence[str] | None = None) -> np.ndarray:
    """CPU seconds to issue every op, by its kind and phase (classes in the module docstring);
    ``launch`` (the trace column) makes a graph replay's first kernel one ``nograd`` dispatch and
    its other kernels free."""
    out = np.empty(len(kinds))
    for i, (k, ph) in enumerate(zip(kinds, phases)):
        if k == "compute":
            cls = "fwd" if ph in ("fwd", "recompute") else "bwd" if ph == "bwd" else "nograd"
        elif k == "wait":
            cls = "wait"
        else:
            cls = "collective"
        out[i] = per_class_s[cls]
    if launch is not None:
        for i, how in enumerate(launch):
            if how == "graph":
                out[i] = per_class_s["nograd"]
            elif how == "in_graph":
                out[i] = 0.0
    return out


def sync_flags(cols: Mapping[str, Sequence[Any]]) -> np.ndarray:
    """The block's ``host_sync`` column as a bool array (capture decides which ops sync)."""
    return np.asarray(cols["host_sync"], dtype=bool)


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
    missing from it, or with every class 0, keeps its GPU durations. On the first call for a
    (role, GPU type) every block of the role is priced and :func:`role_leads` walks its program;
    ``stall_out`` (optional) receives ``(role, block, gpu) -> seconds`` the GPU idles waiting for
    its host in that block.
    """
    done: dict[tuple[int, str], dict[str, np.ndarray]] = {}

    def role_eff(role_id: int, gpu: str, per: dict[str, float]) -> dict[str, np.ndarray]:
        role = trace.roles[role_id]
        summary: dict[str, BlockHost] = {}
        for b, blk in role.blocks.items():
            cols = blk.columns
            secs = np.asarray(durations(role_id, b, gpu), dtype=np.float64)
            summary[b] = block_host(secs, dispatch_costs(cols["kind"], cols["phase"], per, cols.get("launch")),
                                    sync_flags(cols), np.array([k == "compute" for k in cols["kind"]], dtype=bool))
        leads = role_leads([seg.block for seg in role.program], summary)
        out = {}
        for b, h in summary.items():
            eff = _scan(h.gpu_s, h.dispatch_s, h.sync, h.compute, leads.get(b, 0.0))[0]
            if stall_out is not None:
                stall_out[(role_id, b, gpu)] = float(eff.sum() - h.gpu_s.sum())
            out[b] = eff
        return out

    def wrapped(role_id: int, block: str, gpu: str) -> np.ndarray:
        per = dispatch.get(gpu)
        if not per or not any(v > 0 for v in per.values()):
            return np.asarray(durations(role_id, block, gpu), dtype=np.float64)
        key = (role_id, gpu)
        if key not in done:
            done[key] = role_eff(role_id, gpu, per)
        return done[key][block]

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
