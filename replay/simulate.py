"""``simulate(trace, cluster)``: price, plan, run the engine and summarise into a :class:`Result`.

Wiring: ranks go to GPUs by the cluster's placement; every distinct (block, GPU type) is priced
once with ``kernel_db.Pricer.price_block``; every distinct collective instance (collective, size,
GPUs) is planned once with ``ncclshim.plan`` and its flows become a
:class:`~replay.flows.TransferSpec` on the cluster's links; :func:`replay.engine.run_fast` (or the
reference engine) runs the iteration.
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
import os
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from heterosim.cluster import Cluster, load_cluster
from heterosim.errors import ConfigError, ReplayError
from heterosim.gcpause import paused_gc
from heterosim.trace.ir import Trace, flop_totals
from heterosim.trace.store import load_trace
from heterosim.trace.vocab import DTYPE_BYTES, as_planned
from ncclshim.view import topology_view

from .backend import get_backend
from .engine import FastRun, run_fast
from .expand import CommInstance, RankTimes, Workload
from .memory import memory_report
from .flows import FlowSpec, PhaseSpec, TransferSpec
from .result import Breakdown, ClassSummary, PathStep, Result, rank_breakdown

__all__ = ["simulate", "build_workload", "summarize", "plan_to_transfer", "trace_dtype", "OVERLAP_SLOWDOWN"]


def plan_to_transfer(plan: Any, never_binding: frozenset[int] = frozenset()) -> TransferSpec:
    """Turn an ``ncclshim`` plan into phases of flows: one phase per distinct ``flow.phase``.

    The plan's ``latency_s`` (NCCL's, hardware latencies included) comes once, before the first
    phase; each flow moves ``bytes / plan.efficiency`` wire bytes (protocol overhead and NCCL's
    achieved fraction of the wire), so that alone on an idle network the transfer takes
    ``plan.time_s`` (``ncclshim.planner`` documents this contract). Links in ``never_binding``
    (:attr:`heterosim.cluster.network.Network.never_binding`: they cannot limit any flow, so
    max-min rates do not depend on them) are left out of the flows' paths.
    """
    eff = float(getattr(plan, "efficiency", 1.0)) or 1.0
    by_phase: dict[int, list[FlowSpec]] = {}
    made: dict[tuple, FlowSpec] = {}  # flows of equal path and size share one (immutable) spec
    for f in plan.flows:
        key = (f.path, f.bytes)
        spec = made.get(key)
        if spec is None:
            links = tuple(int(l) for l in f.path)
            if never_binding:
                links = tuple(l for l in links if l not in never_binding)
            spec = made[key] = FlowSpec(links=links, nbytes=float(f.bytes) / eff)
        by_phase.setdefault(int(f.phase), []).append(spec)
    phases = sorted(by_phase)
    lat = float(getattr(plan, "latency_s", 0.0))
    if not phases:
        return TransferSpec(phases=(PhaseSpec(latency_s=lat),) if lat > 0 else ())
    return TransferSpec(phases=tuple(PhaseSpec(latency_s=lat if i == 0 else 0.0, flows=tuple(by_phase[p]))
                                     for i, p in enumerate(phases)))


def trace_dtype(trace: Trace) -> str:
    """The dtype carrying most GEMM FLOPs (the MFU denominator uses its peak); bf16 if none."""
    flops: Counter = Counter()
    for role in trace.roles:
        uses = Counter(s.block for s in role.program)
        for b, n in uses.items():
            cols = role.blocks[b].columns
            for kc, dt, f in zip(cols["kernel_class"], cols["dtype"], cols["flops"]):
                if kc == "gemm" and dt:
                    flops[dt] += f * n * len(role.ranks)
    return max(sorted(flops), key=lambda d: flops[d]) if flops else "bf16"


def _pricer(kernel_db: Any, catalogue: Any = None):
    """A Pricer over ``kernel_db`` and ``catalogue`` (the job's GPU registry, the cluster's own
    accelerators included); a given Pricer lends its DB, efficiency curves and fusion setting."""
    from kernel_db import KernelDB, Pricer

    if isinstance(kernel_db, Pricer):  # its prices cached so far stand where the registry is its own
        if kernel_db.catalogue is catalogue:
            return kernel_db
        return Pricer(kernel_db.db, catalogue, kernel_db.efficiency, fuse=kernel_db.fuse)
    if kernel_db is None or isinstance(kernel_db, KernelDB):
        return Pricer(kernel_db, catalogue)
    return Pricer(KernelDB.load(kernel_db, must_exist=True), catalogue)


def boards(cluster: Any) -> dict[str, int]:
    """Ranks the placement puts on each GPU type of ``cluster`` (types it uses only)."""
    counts = np.bincount(cluster.gpu_type_ids[cluster.rank_gpu], minlength=len(cluster.gpu_types))
    return {t: int(n) for t, n in zip(cluster.gpu_types, counts) if n}


def job_catalogue(cluster: Any, slowest_board: bool = True) -> Any:
    """The GPU registry the job is priced with: ``cluster.catalogue``, each GPU type the placement
    uses at the pace of the slowest of its boards (:meth:`GpuSpec.slowest_of` over :func:`boards`),
    where ``slowest_board``; the registry as it is otherwise."""
    from heterosim.cluster.gpus import with_specs

    cat = cluster.catalogue
    if not slowest_board:
        return cat
    slow = {t: cat.get(t).slowest_of(n) for t, n in boards(cluster).items()}
    return with_specs(cat, {g.name: g for t, g in slow.items() if g is not cat.get(t)})  # unchanged: cat itself


def build_workload(trace: Trace, cluster: Any, pricer: Any, *, link_sharing: bool = True,
                   nccl_env: Mapping[str, str] | None = None,
                   sources_out: dict | None = None, overlap_slowdown: float = 0.0,
                   host: bool = True) -> Workload:
    """The :class:`Workload` of ``trace`` placed on ``cluster``, priced by ``pricer``; with ``host``,
    op durations are host-bound by the node types' ``cpu.dispatch_us`` (:mod:`replay.host`)."""
    world = trace.world_size
    if cluster.num_ranks != world:
        raise ConfigError(
            f"the trace has world size {world} but the cluster places {cluster.num_ranks} ranks "
            f"({cluster.num_gpus} GPUs); build the cluster for {world} GPUs (load_cluster(..., "
            f"num_gpus={world})) or re-capture with --world-size {cluster.num_gpus}")
    gpus = [cluster.rank_to_gpu(r) for r in range(world)]
    gpu_type = [cluster.gpu_type(g) for g in gpus]
    for t in sorted(set(gpu_type)):
        pricer.gpu(t)  # UnknownGPUError lists the catalogue
    node = [cluster.node_of(g) for g in gpus]
    view = topology_view(cluster)
    capacity = [float(l.bw) for l in view.links]
    slack = getattr(getattr(cluster, "network", None), "never_binding", frozenset())

    def durations(role_id: int, block: str, gpu: str) -> np.ndarray:
        secs, srcs, _ = pricer.price_block(trace.roles[role_id].blocks[block], gpu)
        if sources_out is not None:
            sources_out[(role_id, block, gpu)] = (np.asarray(secs, dtype=np.float64), list(srcs))
        return secs

    stall: dict = {}
    if host:
        from .host import dispatch_by_gpu_type, with_host

        durations = with_host(durations, trace, dispatch_by_gpu_type(cluster, gpu_type), stall)

    def transfer(inst: CommInstance) -> TransferSpec:
        import ncclshim

        ranks_gpu = [gpus[r] for r in inst.ranks]
        coll, nbytes, dtype = as_planned(inst.collective, inst.nbytes, inst.dtype)
        if dtype not in DTYPE_BYTES or nbytes % (DTYPE_BYTES[dtype] * len(ranks_gpu)):
            dtype = "uint8"  # only sizes matter here; a byte type always divides
        p = ncclshim.plan(coll, nbytes, ranks_gpu, view, env=nccl_env, dtype=dtype)
        _labels[inst] = f"{inst.collective} {getattr(p, 'algo', '?')}/{getattr(p, 'proto', '?')} {_size(inst.nbytes)}"
        return plan_to_transfer(p, slack)

    _labels: dict[CommInstance, str] = {}
    w = Workload(trace=trace, gpu_type=gpu_type, node=node, durations=durations, transfer=transfer,
                 capacity_Bps=capacity, link_sharing=link_sharing, overlap_slowdown=overlap_slowdown)
    w._cache["labels"] = _labels
    w._cache["host_stall"] = stall
    if link_sharing:
        from .fold import build_fold

        w._cache["fold"] = build_fold(trace, cluster, gpus, slack)
    return w


def _size(n: int) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= k:
            return f"{n / k:.3g} {unit}"
    return f"{n} B"


def _in_pipeline(trace: Trace) -> list[bool]:
    out = []
    for role in trace.roles:
        pp = any(
            k == "p2p" and trace.groups[g].dim == "pp"
            for b in role.blocks.values() for k, g in zip(b.columns["kind"], b.columns["group"])
        )
        out.append(pp)
    return out


def summarize(run: FastRun, w: Workload, *, cluster_name: str, peak_flops: Sequence[float], dtype: str,
              sources: Mapping | None = None, options: Mapping[str, Any] | None = None,
              stats: Mapping[str, Any] | None = None) -> Result:
    """Turn a :class:`FastRun` into a :class:`Result` (breakdowns, MFU, critical path)."""
    trace = w.trace
    world = trace.world_size
    iteration = max(t.finish_s for t in run.times)
    if not iteration > 0:
        raise ReplayError("the iteration takes no time: the trace has no priced compute and no communication")
    pipe = _in_pipeline(trace)
    role_of = {r: role.id for role in trace.roles for r in role.ranks}
    classes = []
    for ci, ranks in enumerate(run.classes):
        rep = ranks[0]
        rid = role_of[rep]
        rt = run.times[ci]
        sk = run.skeletons[rid]
        classes.append(ClassSummary(
            ranks=tuple(ranks), gpu_type=w.gpu_type[rep], role=rid, finish_s=rt.finish_s,
            breakdown=rank_breakdown(rt, iteration, pipe[rid]),
            phase_compute_s=dict(sorted(sk.phase_compute[w.gpu_type[rep]].items()))))
    mean = Breakdown.mean([(c.breakdown, len(c.ranks)) for c in classes])
    by_gpu: dict[str, list] = {}
    for c in classes:
        by_gpu.setdefault(c.gpu_type, []).append((c.breakdown, len(c.ranks)))
    flops = trace.meta.get("flops", {}).get("model") if isinstance(trace.meta.get("flops"), dict) else None
    model_flops = float(flops) if flops else flop_totals(trace)["model"]
    peak_total = float(sum(peak_flops))
    lay = {**trace.model, **trace.layout}
    gbs = lay.get("global_batch_size")
    seq = lay.get("seq_length")
    tokens = float(gbs) * float(seq) if gbs and seq else None
    src_s: dict[str, float] = {}
    if sources:
        for ci, ranks in enumerate(run.classes):
            rep = ranks[0]
            role = trace.roles[role_of[rep]]
            uses = Counter(s.block for s in role.program)
            for b, n in uses.items():
                got = sources.get((role.id, b, w.gpu_type[rep]))
                if got is None:
                    continue
                secs, srcs = got
                for s, v in zip(srcs, secs.tolist()):
                    if s != "comm":
                        src_s[s] = src_s.get(s, 0.0) + v * n * len(ranks)
    return Result(
        iteration_time_s=iteration,
        world_size=world,
        cluster=cluster_name,
        gpu_counts=dict(Counter(w.gpu_type)),
        model_flops=model_flops,
        tokens_per_iteration=tokens,
        tokens_per_s=tokens / iteration if tokens else None,
        tflops_per_gpu=model_flops / iteration / world / 1e12,
        mfu=model_flops / (iteration * peak_total) if peak_total > 0 else 0.0,
        dtype=dtype,
        breakdown=mean,
        breakdown_by_gpu={g: Breakdown.mean(v) for g, v in sorted(by_gpu.items())},
        classes=tuple(classes),
        critical_path=tuple(critical_path(run, w)),
        price_sources_s=dict(sorted(src_s.items())),
        options=dict(options or {}),
        stats={"classes": len(run.classes), "restarts": run.restarts,
               "network_solves": run.network_recomputes, "symmetry": run.symmetry,
               "asymmetric_transfers": run.asymmetric, "max_replica_spread": run.max_spread,
               "periods_skipped": run.periods_skipped, "fold": run.fold, "folded_transfers": run.folded_transfers,
               **(stats or {})},
        _run=run,
        _workload=w,
    )


_T_END = operator.attrgetter("t_end")


def critical_path(run: FastRun, w: Workload, max_steps: int = 100_000) -> list[PathStep]:
    """Walk back from the last rank to finish: at each wait that blocked for a peer, jump to the
    member that issued the awaited op last (it decided when the transfer started)."""
    ci = max(range(len(run.times)), key=lambda c: (run.times[c].finish_s, -c))
    t = run.times[ci].finish_s
    labels = w._cache.get("labels", {})
    steps: list[PathStep] = []
    at: dict[int, tuple[int, int]] = {}  # per role: the last point looked up, comm ops (non-waits) before it
    for _ in range(max_steps):
        rt = run.times[ci]
        rep = run.classes[ci][0]
        # A wait ends where the compute stream resumes, which only moves forward: the waits' ends
        # increase in program order, so the last wait ending by t is found by bisection.
        last = bisect.bisect_right(rt.waits, t * (1 + 1e-12), key=_T_END)
        prev = None
        for j in range(last - 1, -1, -1):
            rec = rt.waits[j]
            if rec.t_start > rec.t_block and rec.point >= 0:
                prev = rec
                break
        if prev is None:
            steps.append(PathStep(rank=rep, start_s=0.0, end_s=t, what="compute and exposed communication"))
            break
        cj, _ = run.blocker[ci][prev.point]
        inst = None
        meta = run.comm_meta[ci]
        role = w.trace.role_of(rep).id
        kinds, p = run.skeletons[role].kind, prev.point
        if role not in at:
            k = p - kinds[:p].count("wait")
        else:  # from the role's last point: the walk goes back in time, so this telescopes
            p0, k0 = at[role]
            k = k0 - (p0 - p) + kinds[p:p0].count("wait") if p <= p0 else k0 + (p - p0) - kinds[p0:p].count("wait")
        at[role] = (p, k)
        if k < len(meta):
            inst = meta[k]
        name = labels.get(inst, f"{inst.collective} {_size(inst.nbytes)}" if inst else "comm")
        steps.append(PathStep(rank=rep, start_s=prev.t_start, end_s=t, what=f"{name} ({prev.dim}) then compute"))
        if cj == ci:
            break
        ci, t = cj, prev.t_start
    steps.reverse()
    return steps


OVERLAP_SLOWDOWN = 0.16
"""Default fraction of speed compute loses while its rank's communication is in flight: NCCL's
kernels take SMs (a block per channel) and HBM bandwidth. *Characterizing Compute-Communication
Overlap in GPU-Accelerated Distributed Deep Learning* (arXiv:2507.03114, 2025) measures an average
18.9% longer compute (at most 40%) for GPT/LLaMA kernels overlapping collectives on A100 / H100 /
MI250 / MI210; 1 - 1/1.189 = 0.16. Ignores: which collective, which kernel, how many overlap."""


@paused_gc()  # millions of long-lived small objects: see heterosim/gcpause.py
def simulate(trace: Trace | str | os.PathLike, cluster: Any, kernel_db: Any = None, *,
             backend: str = "numpy", link_sharing: bool = True, nccl_env: Mapping[str, str] | None = None,
             placement: Any = None, engine: str = "fast", symmetry: str = "auto",
             overlap_slowdown: float = OVERLAP_SLOWDOWN, progress: Callable[[int], None] | None = None,
             host: bool = True, slowest_board: bool = True) -> Result:
    """Simulate one training iteration of ``trace`` on ``cluster``.

    Args:
        trace: a :class:`~heterosim.trace.ir.Trace` or a trace directory.
        cluster: a :class:`heterosim.cluster.Cluster`, or what ``load_cluster`` takes (preset name, YAML
            path, dict); then it is built for the trace's world size.
        kernel_db: None (catalogue + roofline only), a DB path, a ``KernelDB`` or a ``Pricer``.
        backend: ``numpy`` or ``cupy`` (array namespace for the span arithmetic).
        link_sharing: share links max-min fairly between concurrent transfers (default) or give
            every transfer its uncontended time.
        nccl_env: NCCL environment variables for the planner (``NCCL_ALGO`` ...).
        placement: a placement for ``load_cluster`` (ignored when ``cluster`` is built).
        engine: ``fast`` (default) or ``reference`` (per rank, small jobs only).
        symmetry: ``auto``, ``exact`` or ``max``: how the fast engine treats replicas of one
            transfer that end at different times (see :func:`replay.engine.run_fast`).
        overlap_slowdown: fraction of speed compute loses while a comm op of the same rank is in
            flight (SM and HBM contention with NCCL kernels); default :data:`OVERLAP_SLOWDOWN`
            (0.16, measured), 0 turns it off. The stretch counts as compute time in the
            breakdown (see docs/replay.md).
        host: the GPU waits for its CPU to issue every op (:mod:`replay.host`, the node types'
            ``cpu.dispatch_us``; docs/host.md); False: the host is never the bottleneck.
        slowest_board: price each GPU type at the expected slowest of the job's boards of that type
            (power-capped boards differ, ``sustained_clock_spread`` in gpus.yaml; a synchronous step
            waits for the slowest; :func:`job_catalogue`); False: every board at the model's mean.
    """
    if not isinstance(trace, Trace):
        trace = load_trace(trace)
    xp = get_backend(backend)
    if not isinstance(cluster, Cluster):
        cluster = load_cluster(cluster, num_gpus=trace.world_size, placement=placement)
    catalogue = job_catalogue(cluster, slowest_board)
    pricer = _pricer(kernel_db, catalogue)
    sources: dict = {}
    w = build_workload(trace, cluster, pricer, link_sharing=link_sharing, nccl_env=nccl_env, sources_out=sources,
                       overlap_slowdown=overlap_slowdown, host=host)
    if engine == "fast":
        run = run_fast(w, xp=xp, progress=progress, symmetry=symmetry)
    elif engine == "reference":
        run = _reference_as_run(w)
    else:
        raise ConfigError(f"unknown engine {engine!r}; valid engines are 'fast' and 'reference'")
    dtype = trace_dtype(trace)
    peaks = [catalogue.get(g).peak(dtype) for g in w.gpu_type]
    res = summarize(run, w, cluster_name=getattr(cluster, "name", str(cluster)), peak_flops=peaks,
                    dtype=dtype, sources=sources,
                    options={"backend": backend, "link_sharing": link_sharing, "engine": engine,
                             "symmetry": symmetry, "overlap_slowdown": overlap_slowdown, "host": host,
                             "slowest_board": slowest_board,
                             "nccl_env": dict(nccl_env or {})})
    from .host import stall_per_rank

    res = dataclasses.replace(res, stats={**res.stats, "host_stall_s": stall_per_rank(w)})
    clocks = {t: {"boards": n, "mean_board": cluster.catalogue.get(t).power_clock_ratio,
                  "priced": catalogue.get(t).power_clock_ratio} for t, n in sorted(res.gpu_counts.items())}
    res = dataclasses.replace(res, stats={**res.stats, "tensor_clock_ratio": clocks})
    return dataclasses.replace(res, memory=memory_report(trace, w.gpu_type, catalogue.get))


def _reference_as_run(w: Workload) -> FastRun:
    """Run the reference engine and present it as a FastRun with singleton classes."""
    from .expand import build_skeleton
    from .reference import run_reference

    out = run_reference(w)
    world = w.trace.world_size
    sks = {}
    for role in w.trace.roles:
        sks[role.id] = build_skeleton(w, role.id, sorted({w.gpu_type[r] for r in role.ranks}))
    times: list[RankTimes] = [out[r] for r in range(world)]
    return FastRun(classes=[(r,) for r in range(world)], class_of=list(range(world)), skeletons=sks,
                   times=times, point_time=[np.zeros(0) for _ in range(world)],
                   comm_meta=[[] for _ in range(world)], blocker=[{} for _ in range(world)])
