"""Replay speed: one iteration of GPT-3-175B-, GPT-1T- and LLaMA-405B-shaped jobs at 64-16k GPUs.

    .venv/bin/python benchmarks/bench_replay.py            # all cases (the 16k one takes a while)
    .venv/bin/python benchmarks/bench_replay.py --quick    # 64 .. 1024 GPUs only
    .venv/bin/python benchmarks/bench_replay.py --case gpt3-175b-1024
    .venv/bin/python benchmarks/bench_replay.py --case gpt-1t-3072-deep   # PP64 x 512 micro-batches
    .venv/bin/python benchmarks/bench_replay.py --trace TRACE --cluster dgx-a100   # a captured trace
    .venv/bin/python benchmarks/bench_replay.py --quick --overlap-slowdown 0.16     # with compute slowdown
    .venv/bin/python benchmarks/bench_replay.py --case megascale-175b-12288 --case mtnlg-530b-11200 --timeout 120

Each case runs in its own process (its own peak RSS), killed after --timeout seconds (default 300);
--in-process runs them here, without a limit.

Targets (2 CPU cores, numpy backend, link sharing on): GPT-3 175B TP8 PP8 DP16 on 1024 GPUs, global
batch 1536, <= 10 s wall and <= 4 GB; LLaMA-405B-shaped TP8 PP16 DP128 on 16,384 GPUs <= 60 s;
wall time growing no faster than linearly in GPU count (the table prints s per 1k GPUs); the deep
pipeline (GPT 1T shape of the SC'21 table, TP8 PP64 DP6 on 3,072 GPUs, global batch 3072: 512
micro-batches per pipeline, 1F1B) is the case that scales with stages x micro-batches. Issue 14
(today's clusters): GPT-3 175B TP8 PP8 DP192 on 12,288 GPUs (MegaScale's shape, interleaved
VPP6), MT-NLG 530B TP8 PP35 DP40 on 11,200 GPUs (280 micro-batches) and GPT-3 175B TP4 PP8 DP64 on
2,048 DGX H100 GPUs (NVIDIA's recipe, VPP12) <= 30 s and <= 2 GB each; ``-1f1b`` cases run the
two interleaved jobs in 1F1B for comparison. On a
shared machine compare the CPU-seconds column: wall time includes other processes' load.

The traces are synthesized here with the op mix a Megatron capture records (per layer and
micro-batch: norm, QKV / proj / FC1 / FC2 GEMMs, flash attention, elementwise, TP all-reduces or
SP all-gather / reduce-scatter, forward and backward; p2p between stages; embedding, output
layer and loss on the end stages; bucketed DP gradient all-reduce; optimizer), stored as one
forward and one backward block per stage referenced by every micro-batch, as capture stores them.
With ``vpp`` > 1 the program is Megatron's interleaved schedule (``models.schedules._Interleaved``,
non-overlapped p2p): forward/backward blocks per kind of chunk and, between them, one block per
kind of ``_communicate`` exchange (its sends and recvs in one coalesced launch, then waited; the
last stage's chunk c feeds the first stage's chunk c+1). The 1F1B traces keep p2p inside the
compute blocks, sends unwaited.
Switch to captured traces (python -m capture ... models/pretrain_gpt.py) for accuracy work;
benchmarks/bench_captured.py times the same cluster-scale jobs captured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

from heterosim.trace.ir import Block, GroupInfo, Role, Segment, Trace


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    tp: int
    pp: int
    dp: int
    global_batch: int
    cluster: str
    swiglu: bool = False
    sp: bool = False
    vpp: int = 1
    """Model chunks per stage: Megatron's interleaved schedule when > 1 (micro-batches per pipeline
    must be a multiple of pp, layers of pp x vpp)."""

    def __post_init__(self) -> None:
        m = self.global_batch // self.dp
        if self.vpp > 1 and (self.pp == 1 or m % self.pp or self.layers % (self.pp * self.vpp)):
            raise ValueError(f"{self.name}: vpp={self.vpp} needs pp > 1, micro-batches per pipeline ({m}) a "
                             f"multiple of pp ({self.pp}) and layers ({self.layers}) a multiple of pp x vpp")

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp


CASES = {
    "gpt3-175b-64": Shape("gpt3-175b-64", 96, 12288, 96, 96, 49152, 51200, 2048, 8, 8, 1, 96, "dgx-a100"),
    "gpt3-175b-256": Shape("gpt3-175b-256", 96, 12288, 96, 96, 49152, 51200, 2048, 8, 8, 4, 384, "dgx-a100"),
    "gpt3-175b-1024": Shape("gpt3-175b-1024", 96, 12288, 96, 96, 49152, 51200, 2048, 8, 8, 16, 1536, "dgx-a100"),
    "gpt-1t-3072-deep": Shape("gpt-1t-3072-deep", 128, 25600, 160, 160, 102400, 51200, 2048, 8, 64, 6, 3072,
                              "dgx-a100"),
    "llama-405b-4096": Shape("llama-405b-4096", 128, 16384, 128, 8, 53248, 128256, 8192, 8, 16, 32, 512,
                             "dgx-h100", swiglu=True, sp=True),
    "llama-405b-16384": Shape("llama-405b-16384", 128, 16384, 128, 8, 53248, 128256, 8192, 8, 16, 128, 2048,
                              "dgx-h100", swiglu=True, sp=True),
    # Today's cluster scale (issue 14). MegaScale's GPT-3 175B on 12,288 GPUs: interleaved VPP6
    # (2 layers per chunk), 32 micro-batches per pipeline; "-1f1b": the same job in 1F1B.
    "megascale-175b-12288": Shape("megascale-175b-12288", 96, 12288, 96, 96, 49152, 51200, 2048, 8, 8, 192, 6144,
                                  "dgx-a100", vpp=6),
    "megascale-175b-12288-1f1b": Shape("megascale-175b-12288-1f1b", 96, 12288, 96, 96, 49152, 51200, 2048, 8, 8, 192,
                                       6144, "dgx-a100"),
    # MT-NLG 530B on 11,200 GPUs (TP8 PP35 DP40, 280 micro-batches per pipeline, 3 layers per stage).
    "mtnlg-530b-11200": Shape("mtnlg-530b-11200", 105, 20480, 128, 128, 81920, 51200, 2048, 8, 35, 40, 11200,
                              "dgx-a100"),
    # NVIDIA's DGX H100 GPT-3 175B recipe on 2,048 GPUs: TP4 PP8 DP64, 64 micro-batches, interleaved
    # VPP12 (1 layer per chunk); "-1f1b": the same job in 1F1B.
    "hopper-175b-2048": Shape("hopper-175b-2048", 96, 12288, 96, 96, 49152, 51200, 2048, 4, 8, 64, 4096,
                              "dgx-h100", vpp=12),
    "hopper-175b-2048-1f1b": Shape("hopper-175b-2048-1f1b", 96, 12288, 96, 96, 49152, 51200, 2048, 4, 8, 64, 4096,
                                   "dgx-h100"),
}
QUICK = ("gpt3-175b-64", "gpt3-175b-256", "gpt3-175b-1024")


def _gemm(m, n, k, phase, name="aten.mm.default"):
    return dict(kind="compute", name=name, kernel_class="gemm", phase=phase, flops=2.0 * m * n * k,
                flops_full=2.0 * m * n * k, bytes_read=2 * (m * k + k * n), bytes_written=2 * m * n, dtype="bf16",
                dims={"m": m, "n": n, "k": k, "batch": 1}, signature=f"{name}:bf16:{m}x{k},{k}x{n}")


def _pointwise(kc, numel, phase, name="aten.add.Tensor"):
    return dict(kind="compute", name=name, kernel_class=kc, phase=phase, bytes_read=4 * numel,
                bytes_written=2 * numel, dtype="bf16", dims={"numel": numel}, signature=f"{name}:bf16:{numel}")


def _attn(c: Shape, direction, phase):
    h, hkv, d, s = c.heads // c.tp, max(c.kv_heads // c.tp, 1), c.hidden // c.heads, c.seq
    full = 4.0 * h * s * s * d * (2.5 if direction == "bwd" else 1.0)
    return dict(kind="compute", name=f"aten._flash_attention_{'backward' if direction == 'bwd' else 'forward'}.default",
                kernel_class="attention", phase=phase, flops=full / 2, flops_full=full,
                bytes_read=2 * s * d * (h + 2 * hkv), bytes_written=2 * s * d * h, dtype="bf16",
                dims={"b": 1, "h": h, "hkv": hkv, "sq": s, "sk": s, "d": d, "causal": True, "dir": direction})


def _tp(c: Shape, kind_fwd: bool, phase, numel_full):
    """TP communication after a row-parallel GEMM (fwd) or column-parallel dgrad (bwd)."""
    nbytes = 2 * numel_full
    if c.tp == 1:
        return []
    if c.sp:
        coll = "reduce_scatter" if kind_fwd else "all_gather"
    else:
        coll = "all_reduce"
    return [dict(kind="collective", name=f"c10d.{coll}", kernel_class="comm", phase=phase, collective=coll,
                 group="tp", comm_bytes=nbytes, stream="comm:tp", dtype="bf16"),
            dict(kind="wait", name="c10d.wait", kernel_class="comm", phase=phase, target=1)]


def _layer(c: Shape, phase: str) -> list[dict]:
    s, h, t = c.seq, c.hidden, c.tp
    qkv = (h + 2 * c.kv_heads * (h // c.heads)) // t
    f1 = (2 if c.swiglu else 1) * c.ffn // t
    rows: list[dict] = []
    if phase == "fwd":
        rows += [_pointwise("norm", s * h, "fwd", "aten.native_layer_norm.default"), _gemm(s, qkv, h, "fwd"),
                 _attn(c, "fwd", "fwd"), _gemm(s, h, h // t, "fwd")]
        rows += _tp(c, True, "fwd", s * h)
        rows += [_pointwise("elementwise", s * h, "fwd"), _pointwise("norm", s * h, "fwd", "aten.native_layer_norm.default"),
                 _gemm(s, f1, h, "fwd"), _pointwise("elementwise", s * c.ffn // t, "fwd", "aten.gelu.default"),
                 _gemm(s, h, c.ffn // t, "fwd")]
        rows += _tp(c, True, "fwd", s * h)
        rows.append(_pointwise("elementwise", s * h, "fwd"))
        return rows
    rows += [_pointwise("elementwise", s * h, "bwd"), _gemm(s, c.ffn // t, h, "bwd"), _gemm(c.ffn // t, h, s, "bwd"),
             _pointwise("elementwise", s * c.ffn // t, "bwd", "aten.gelu_backward.default"),
             _gemm(s, h, f1, "bwd"), _gemm(h, f1, s, "bwd")]
    rows += _tp(c, False, "bwd", s * h)
    rows += [_pointwise("norm", s * h, "bwd", "aten.native_layer_norm_backward.default"), _gemm(s, h // t, h, "bwd"),
             _gemm(h // t, h, s, "bwd"), _attn(c, "bwd", "bwd"), _gemm(s, h, qkv, "bwd"), _gemm(h, qkv, s, "bwd")]
    rows += _tp(c, False, "bwd", s * h)
    rows.append(_pointwise("norm", s * h, "bwd", "aten.native_layer_norm_backward.default"))
    return rows


def _p2p(direction, peer, nbytes, stream):
    return dict(kind="p2p", name=f"c10d.{direction}", kernel_class="comm", phase="fwd", collective=direction,
                group="pp", peer=peer, comm_bytes=nbytes, stream=stream, dtype="bf16")


def _groups(c: Shape) -> dict[str, GroupInfo]:
    """TP, DP and PP groups; rank = t + tp (d + dp s). The captured rank of stage s is (0, 0, s)."""
    tp, pp, dp = c.tp, c.pp, c.dp
    groups: dict[str, GroupInfo] = {}
    for d in range(dp):
        for s in range(pp):
            groups["tp" if (d, s) == (0, 0) else f"tp{d}_{s}"] = GroupInfo(tuple(_rank(c, t, d, s) for t in range(tp)), "tp", "tp")
    for t in range(tp):
        for s in range(pp):
            groups["dp" if (t, s) == (0, 0) else f"dp{t}_{s}"] = GroupInfo(tuple(_rank(c, t, d, s) for d in range(dp)), "dp", "dp")
    for t in range(tp):
        for d in range(dp):
            groups["pp" if (t, d) == (0, 0) else f"pp{t}_{d}"] = GroupInfo(tuple(_rank(c, t, d, s) for s in range(pp)), "pp", "pp")
    return groups


def _rank(c: Shape, t: int, d: int, s: int) -> int:
    return t + c.tp * (d + c.dp * s)


def _compute_rows(c: Shape, layers: int, first: bool, last: bool) -> tuple[list[dict], list[dict]]:
    """Forward and backward rows of ``layers`` layers, no p2p; the embedding on the first virtual
    stage, the output layer and loss on the last."""
    fwd = [_pointwise("embedding", c.seq * c.hidden, "fwd", "aten.embedding.default")] if first else []
    bwd = []
    for _ in range(layers):
        fwd += _layer(c, "fwd")
    if last:
        fwd += [_gemm(c.seq, c.vocab // c.tp, c.hidden, "fwd"), _pointwise("cross_entropy", c.seq * c.vocab // c.tp, "fwd")]
        bwd += [_pointwise("cross_entropy", c.seq * c.vocab // c.tp, "bwd"), _gemm(c.seq, c.hidden, c.vocab // c.tp, "bwd"),
                _gemm(c.hidden, c.vocab // c.tp, c.seq, "bwd")]
    for _ in range(layers):
        bwd += _layer(c, "bwd")
    if first:
        bwd.append(_pointwise("embedding", c.seq * c.hidden, "bwd", "aten.embedding_dense_backward.default"))
    return fwd, bwd


def _opt_rows(c: Shape, dpg: str) -> list[dict]:
    """Bucketed DP gradient all-reduce (4 buckets, waited together), then the fused optimizer."""
    params_per_stage = 12 * c.hidden * c.hidden * (c.layers // c.pp)
    buckets = 4
    grad_bytes = 4 * params_per_stage // c.tp
    opt = []
    if c.dp > 1:
        opt += [dict(kind="collective", name="c10d.all_reduce", kernel_class="comm", phase="grad_sync",
                     collective="all_reduce", group=dpg, comm_bytes=grad_bytes // buckets // 4 * 4,
                     stream=f"comm:{dpg}", dtype="fp32") for _ in range(buckets)]
        opt += [dict(kind="wait", name="c10d.wait", kernel_class="comm", phase="grad_sync", target=buckets)
                for _ in range(buckets)]
    opt.append(dict(_pointwise("optimizer", params_per_stage // c.tp, "optimizer", "aten._fused_adam.default"), dtype="fp32"))
    return opt


def _wait(target: int, phase: str = "other") -> dict:
    return dict(kind="wait", name="c10d.wait", kernel_class="comm", phase=phase, target=target)


def _one_f_one_b_role(c: Shape, s: int) -> tuple[dict[str, list[dict]], list[Segment]]:
    """Blocks and program of stage ``s`` in 1F1B: p2p inside the forward and backward blocks."""
    pp, mbs = c.pp, c.global_batch // c.dp
    act = 2 * c.seq * c.hidden // (c.tp if c.sp else 1)
    fwd_c, bwd_c = _compute_rows(c, c.layers // pp, s == 0, s == pp - 1)
    fwd = [_p2p("recv", s - 1, act, "p2p:pp:prev:recv"), _wait(1)] if s > 0 else []
    fwd += fwd_c + ([_p2p("send", s + 1, act, "p2p:pp:next:send")] if s < pp - 1 else [])
    bwd = [_p2p("recv", s + 1, act, "p2p:pp:next:recv"), _wait(1)] if s < pp - 1 else []
    bwd += bwd_c + ([_p2p("send", s - 1, act, "p2p:pp:prev:send")] if s > 0 else [])
    warm = min(pp - s - 1, mbs)
    prog = [Segment("fwd", i) for i in range(warm)]
    for i in range(mbs - warm):
        prog += [Segment("fwd", warm + i), Segment("bwd", i)]
    prog += [Segment("bwd", i) for i in range(mbs - warm, mbs)]
    return {"fwd": fwd, "bwd": bwd}, prog


def _exchange_rows(c: Shape, s: int, phase: str, send_prev: bool, recv_prev: bool, send_next: bool,
                   recv_next: bool) -> list[dict]:
    """One Megatron ``_communicate`` on stage ``s``: the p2p ops batched in ``_batched_p2p_ops``
    order (send prev, recv prev, send next, recv next; one coalesced launch), each then waited.
    Neighbours wrap around: the last stage's next is the first stage."""
    act = 2 * c.seq * c.hidden // (c.tp if c.sp else 1)
    prev, nxt = (s - 1) % c.pp, (s + 1) % c.pp
    ops = [(d, peer) for d, peer, on in (("send", prev, send_prev), ("recv", prev, recv_prev),
                                         ("send", nxt, send_next), ("recv", nxt, recv_next)) if on]
    rows = [dict(_p2p(d, peer, act, f"p2p:pp:{peer}"), phase=phase, coalesced=i) for i, (d, peer) in enumerate(ops)]
    return rows + [_wait(len(ops), phase) for _ in ops]


def interleaved_steps(pp: int, s: int, m: int, vpp: int) -> list[tuple]:
    """Stage ``s``'s program in Megatron's interleaved schedule (``models.schedules._Interleaved``,
    non-overlapped p2p path): ``("F"|"B", chunk, mb)`` compute steps and ``("X", phase, chunk, mb,
    send_prev, recv_prev, send_next, recv_next)`` exchanges. Virtual step k runs micro-batch
    ``k % pp + (k // (pp vpp)) pp`` of chunk ``(k % (pp vpp)) // pp`` (backward: vpp - 1 - that)."""
    total = m * vpp
    all_warmup = m == pp
    warmup = total if all_warmup else min((pp - s - 1) * 2 + (vpp - 1) * pp, total)
    first, last = s == 0, s == pp - 1

    def chunk(k: int, fwd: bool) -> int:
        ch = (k % (pp * vpp)) // pp
        return ch if fwd else vpp - 1 - ch

    def mb(k: int) -> int:
        return k % pp + (k // (pp * vpp)) * pp

    def comp(k: int, fwd: bool) -> tuple:
        return ("F" if fwd else "B", chunk(k, fwd), mb(k))

    def x(phase, k, fwd, sp=False, rp=False, sn=False, rn=False) -> list[tuple]:
        return [("X", phase, chunk(k, fwd), mb(k), sp, rp, sn, rn)] if sp or rp or sn or rn else []

    def sends_next(k: int) -> bool:  # the last virtual stage sends no activation
        return not (last and chunk(k, True) == vpp - 1)

    def sends_prev(k: int) -> bool:  # the first virtual stage sends no gradient
        return not (first and chunk(k, False) == 0)

    steps = x("fwd", 0, True, rp=not first)
    for k in range(warmup):
        rp = not (first and chunk(k + 1, True) == 0) and k != total - 1
        rn = k == warmup - 1 and not all_warmup and not last
        steps += [comp(k, True)] + x("fwd", k, True, rp=rp, sn=sends_next(k), rn=rn)
    for k in range(total - warmup):
        fk = k + warmup
        rp = chunk(fk - (pp - 1), True) != vpp - 1 if first else True
        rn = chunk(k - (pp - 1), False) != 0 if last else True
        steps += [comp(fk, True), comp(k, False)]
        steps += x("bwd", k, False, sp=sends_prev(k), rp=rp and k != total - warmup - 1, sn=sends_next(fk), rn=rn)
    if all_warmup:
        steps += x("bwd", 0, False, rn=not last)
    for k in range(total - warmup, total):
        rn = not (last and chunk(k + 1, False) == vpp - 1) and k != total - 1
        steps += [comp(k, False)] + x("bwd", k, False, sp=sends_prev(k), rn=rn)
    return steps


def _interleaved_role(c: Shape, s: int) -> tuple[dict[str, list[dict]], list[Segment]]:
    """Blocks and program of stage ``s`` in the interleaved schedule: one forward and one backward
    block per kind of chunk (plain, first virtual stage, last virtual stage) and one block per
    kind of p2p exchange, named by its ops (``x.sp.rp`` = send prev + recv prev)."""
    pp, vpp, m = c.pp, c.vpp, c.global_batch // c.dp
    rows: dict[str, list[dict]] = {}
    prog: list[Segment] = []
    for st in interleaved_steps(pp, s, m, vpp):
        if st[0] == "X":
            _, phase, ch, mb, *flags = st
            name = ".".join(["x"] + [n for n, on in zip(("sp", "rp", "sn", "rn"), flags) if on])
            if name not in rows:
                rows[name] = _exchange_rows(c, s, phase, *flags)
        else:
            d, ch, mb = st
            first, last = s == 0 and ch == 0, s == pp - 1 and ch == vpp - 1
            kind = "first" if first else "last" if last else "mid"
            name = f"{'fwd' if d == 'F' else 'bwd'}.{kind}"
            if name not in rows:
                fwd, bwd = _compute_rows(c, c.layers // (pp * vpp), first, last)
                rows[name] = fwd if d == "F" else bwd
        prog.append(Segment(name, mb, ch))
    return rows, prog


def synth_trace(c: Shape) -> Trace:
    """A Megatron-shaped trace of ``c`` (see the module docstring): 1F1B, or interleaved if vpp > 1."""
    roles = []
    for s in range(c.pp):
        tpg = "tp" if s == 0 else f"tp0_{s}"

        def fix(rows):
            return [dict(r, group=tpg) if r.get("group") == "tp" else r for r in rows]

        rows, prog = (_interleaved_role if c.vpp > 1 else _one_f_one_b_role)(c, s)
        blocks = {name: Block.from_rows(fix(r)) for name, r in rows.items()}
        blocks["opt"] = Block.from_rows(_opt_rows(c, "dp" if s == 0 else f"dp0_{s}"))
        ranks = tuple(_rank(c, t, d, s) for d in range(c.dp) for t in range(c.tp))
        roles.append(Role(s, _rank(c, 0, 0, s), ranks, blocks, prog + [Segment("opt", -1)]))
    # Every stage's captured rank rank(0, 0, s) is in group "pp", so p2p ops name "pp" and the
    # stage as peer.
    layout = {"tp": c.tp, "pp": c.pp, "dp": c.dp, "global_batch_size": c.global_batch, "seq_length": c.seq}
    if c.vpp > 1:
        layout["vpp"] = c.vpp
    return Trace(world_size=c.world, groups=_groups(c), roles=roles, layout=layout,
                 model={"num_layers": c.layers, "hidden_size": c.hidden})


def peak_rss_gb() -> float:
    """This process's peak resident set, GB: ``VmHWM`` of ``/proc/self/status`` where there is one.

    ``getrusage``'s ``ru_maxrss`` survives ``exec`` on Linux: a replay started by a large parent
    (``bench_captured`` after its captures) would report the parent's peak, not its own; VmHWM
    belongs to the process's own address space. Elsewhere ``ru_maxrss`` (taken as kB).
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def run_case(c: Shape, link_sharing: bool = True, overlap_slowdown: float = 0.0) -> dict:
    from heterosim.cluster import load_cluster
    from replay.simulate import simulate

    t0 = time.perf_counter()
    trace = synth_trace(c)
    t1 = time.perf_counter()
    cluster = load_cluster(c.cluster, num_gpus=c.world)
    t2 = time.perf_counter()
    c2 = time.process_time()
    res = simulate(trace, cluster, link_sharing=link_sharing, overlap_slowdown=overlap_slowdown)
    t3 = time.perf_counter()
    return {"case": c.name, "gpus": c.world, "synth_s": t1 - t0, "cluster_s": t2 - t1, "simulate_s": t3 - t2,
            "cpu_s": time.process_time() - c2, "symmetry": res.stats["symmetry"],
            "iteration_s": res.iteration_time_s, "mfu": res.mfu, "classes": res.stats["classes"],
            "solves": res.stats["network_solves"], "maxrss_GB": peak_rss_gb()}


def _bench_trace(path: str, cluster: str, link_sharing: bool, overlap_slowdown: float = 0.0) -> int:
    from heterosim.trace.store import load_trace
    from replay.simulate import simulate

    t0 = time.perf_counter()
    trace = load_trace(path)
    t1, c1 = time.perf_counter(), time.process_time()
    res = simulate(trace, cluster, link_sharing=link_sharing, overlap_slowdown=overlap_slowdown)
    t2, c2 = time.perf_counter(), time.process_time()
    rss = peak_rss_gb()
    print(f"{'trace':<28} {'GPUs':>6} {'load s':>7} {'replay s':>9} {'CPU s':>7} {'iter s':>8} {'MFU':>6} "
          f"{'classes':>7} {'symmetry':>8} {'maxRSS GB':>9}")
    print(f"{path[-28:]:<28} {trace.world_size:>6} {t1 - t0:>7.2f} {t2 - t1:>9.2f} {c2 - c1:>7.2f} "
          f"{res.iteration_time_s:>8.3f} {res.mfu * 100:>5.1f}% {res.stats['classes']:>7} "
          f"{res.stats['symmetry']:>8} {rss:>9.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="only the cases up to 1024 GPUs")
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="run only these cases")
    ap.add_argument("--no-link-sharing", action="store_true")
    ap.add_argument("--trace", help="time a captured trace directory instead (with --cluster)")
    ap.add_argument("--cluster", default="dgx-a100", help="preset for --trace (default dgx-a100)")
    ap.add_argument("--overlap-slowdown", type=float, default=0.0, metavar="F",
                    help="simulate with compute slowdown F under concurrent communication (default 0: off)")
    ap.add_argument("--timeout", type=float, default=300.0, metavar="S",
                    help="per-case wall-clock limit in seconds (each case runs in its own process; default 300)")
    ap.add_argument("--in-process", action="store_true", help="run the cases in this process, no timeout")
    ap.add_argument("--json-one", help=argparse.SUPPRESS)  # child mode: run one case, print its JSON
    a = ap.parse_args(argv)
    if a.trace:
        return _bench_trace(a.trace, a.cluster, not a.no_link_sharing, a.overlap_slowdown)
    if a.json_one:
        r = run_case(CASES[a.json_one], link_sharing=not a.no_link_sharing, overlap_slowdown=a.overlap_slowdown)
        print(json.dumps(r), flush=True)
        return 0
    names = a.case or (QUICK if a.quick else list(CASES))
    print(f"{'case':<20} {'GPUs':>6} {'synth s':>8} {'cluster s':>9} {'replay s':>9} {'CPU s':>7} {'s/1k GPU':>9} "
          f"{'iter s':>8} {'MFU':>6} {'classes':>7} {'symmetry':>8} {'solves':>7} {'maxRSS GB':>9}")
    for n in names:
        if a.in_process:
            r = run_case(CASES[n], link_sharing=not a.no_link_sharing, overlap_slowdown=a.overlap_slowdown)
        else:
            r = _run_child(n, a)
        if r is None:
            print(f"{n:<20} {CASES[n].world:>6} {'timed out after':>28} {a.timeout:.0f} s", flush=True)
            continue
        print(f"{r['case']:<20} {r['gpus']:>6} {r['synth_s']:>8.2f} {r['cluster_s']:>9.2f} {r['simulate_s']:>9.2f} "
              f"{r['cpu_s']:>7.2f} {r['simulate_s'] / r['gpus'] * 1000:>9.3f} {r['iteration_s']:>8.3f} "
              f"{r['mfu'] * 100:>5.1f}% {r['classes']:>7} {r['symmetry']:>8} {r['solves']:>7} {r['maxrss_GB']:>9.2f}",
              flush=True)
    return 0


def _run_child(name: str, a: argparse.Namespace) -> dict | None:
    """Run one case in a fresh process (its own peak RSS), killed after ``a.timeout`` s; None then."""
    cmd = [sys.executable, os.path.abspath(__file__), "--json-one", name, "--overlap-slowdown", str(a.overlap_slowdown)]
    if a.no_link_sharing:
        cmd.append("--no-link-sharing")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env, check=True).stdout
    except subprocess.TimeoutExpired:
        return None
    return json.loads(out.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
