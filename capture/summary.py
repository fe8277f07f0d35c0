"""Totals of a trace (what ``python -m capture --inspect`` prints). Imports no torch.

Every figure is for one training iteration. Sums "over all ranks" multiply each role's totals by
the number of ranks it stands for. Communication bytes use nccl-tests sizes (``heterosim.trace.ir``); p2p
traffic is counted once, at the sender.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from heterosim.trace.ir import Trace, flop_totals
from heterosim.trace.memory import memory_peak

__all__ = ["summarize", "format_summary", "describe_iterations", "describe_roles"]


def describe_roles(meta: dict[str, Any], nroles: int) -> str:
    """One sentence: how the roles were checked (``--ranks auto`` and lists)."""
    check = meta.get("roles_check")
    roles = f"{nroles} role" + ("s" if nroles != 1 else "")
    if not check:
        return roles
    if not check["extra_ranks_captured"]:
        return f"{roles}; their communication matches across every group and peer"
    return (f"{roles}; the ranks' communication did not match one program per role, so "
            f"{check['extra_ranks_captured']} more ranks were captured and split by program")


def describe_iterations(meta: dict[str, Any]) -> str:
    """One sentence: which training iteration the trace holds and how it was found."""
    it = meta.get("iterations")
    if not it:
        return "the trace holds the last iteration the script marked"
    stop = ", then stopped (--iterations)" if it["stopped_early"] else ""
    if it["source"] == "none":
        return ("no iteration boundary found (no optimizer.step, no annotate iteration()): the trace holds "
                "the whole script as one iteration")
    how = "optimizer.step boundaries" if it["source"] == "optimizer.step" else "the script's iteration() marks"
    runs = f"{it['seen']} iteration" + ("s" if it["seen"] != 1 else "")
    return f"ran {runs} ({how}{stop}); the trace holds iteration {it['kept']}, the last complete one"


def _role_totals(trace: Trace, role: Any) -> dict[str, Any]:
    uses = Counter(seg.block for seg in role.program)
    kinds: Counter = Counter()
    comm_kind: Counter = Counter()
    comm_dim: Counter = Counter()
    calls_dim: Counter = Counter()
    for bid, n in uses.items():
        cols = role.blocks[bid].columns
        for k, coll, g, nb in zip(cols["kind"], cols["collective"], cols["group"], cols["comm_bytes"]):
            kinds[k] += n
            if k in ("collective", "p2p"):
                size = len(trace.groups[g].ranks)
                if size < 2 or coll == "recv":
                    continue  # 1-rank groups move nothing; p2p counted at the sender
                comm_kind[coll] += nb * n
                dim = trace.groups[g].dim
                comm_dim[dim] += nb * n
                calls_dim[dim] += n
    return {
        "ops": sum(kinds.values()),
        "ops_by_kind": dict(sorted(kinds.items())),
        "comm_bytes_by_kind": dict(sorted(comm_kind.items())),
        "comm_bytes_by_dim": dict(sorted(comm_dim.items())),
        "comm_calls_by_dim": dict(sorted(calls_dim.items())),
        "blocks": len(role.blocks),
        "segments": len(role.program),
    }


def summarize(trace: Trace) -> dict[str, Any]:
    """A JSON-able dict of the trace's totals (see the module docstring)."""
    roles = []
    by_kind: Counter = Counter()
    by_dim: Counter = Counter()
    for role in trace.roles:
        t = _role_totals(trace, role)
        k = len(role.ranks)
        for key, v in t["comm_bytes_by_kind"].items():
            by_kind[key] += v * k
        for key, v in t["comm_bytes_by_dim"].items():
            by_dim[key] += v * k
        if role.memory is not None:  # optional: older traces have none
            t["memory"] = memory_peak(role.memory, role.program).to_dict()
        roles.append({"id": role.id, "captured_rank": role.captured_rank, "num_ranks": k,
                      "ranks": _ranges(role.ranks), **t})
    flops = flop_totals(trace)
    return {
        "world_size": trace.world_size,
        "layout": trace.layout,
        "model": trace.model,
        "iterations": describe_iterations(trace.meta),
        "roles": roles,
        "model_flops": flops["model"],
        "hardware_flops": flops["hardware"],
        "executed_flops": flops["executed"],
        "comm_bytes_by_kind": dict(sorted(by_kind.items())),
        "comm_bytes_by_dim": dict(sorted(by_dim.items())),
    }


def _ranges(ranks: tuple[int, ...]) -> str:
    """Compact text for a rank list: ``0-7,16-23``, or a stride form ``0:1024:128`` when regular."""
    rs = sorted(ranks)
    if len(rs) > 2:
        step = rs[1] - rs[0]
        if step > 1 and all(b - a == step for a, b in zip(rs, rs[1:])):
            return f"{rs[0]}:{rs[-1] + 1}:{step}"
    parts, start, prev = [], rs[0], rs[0]
    for r in rs[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        if r is not None:
            start = prev = r
    return ",".join(parts)


def _fmt_bytes(n: float) -> str:
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def format_summary(s: dict[str, Any]) -> str:
    """Human-readable text of :func:`summarize`."""
    lines = [f"world size {s['world_size']}  layout {s['layout']}", s["iterations"]]
    lines.append(f"{'role':>4} {'captured':>8} {'ranks':>6}  {'ops':>9}  {'blocks':>6}  ranks")
    for r in s["roles"]:
        lines.append(f"{r['id']:>4} {r['captured_rank']:>8} {r['num_ranks']:>6}  {r['ops']:>9}  {r['blocks']:>6}  {r['ranks']}")
    lines.append(f"model_flops    {s['model_flops']:.4e}  (Megatron convention: full attention, no recompute)")
    lines.append(f"hardware_flops {s['hardware_flops']:.4e}  (recompute included, full attention)")
    lines.append(f"executed_flops {s['executed_flops']:.4e}  (causal attention as a flash kernel computes it)")
    lines.append("communication per iteration, all ranks:")
    for k, v in s["comm_bytes_by_kind"].items():
        lines.append(f"  {k:<15} {_fmt_bytes(v):>12}")
    for k, v in s["comm_bytes_by_dim"].items():
        lines.append(f"  dim {k:<11} {_fmt_bytes(v):>12}")
    mem = [r for r in s["roles"] if "memory" in r]
    if mem:
        lines.append("peak device memory per rank (allocator-rounded; no CUDA context or NCCL buffers):")
        for r in mem:
            m = r["memory"]
            parts = ", ".join(f"{c} {_fmt_bytes(v)}" for c, v in m["at_peak"].items() if v)
            lines.append(f"  role {r['id']:>3}  allocated {_fmt_bytes(m['allocated']):>10}  "
                         f"reserved {_fmt_bytes(m['reserved']):>10}  ({parts})")
    return "\n".join(lines)
