"""Pricing: how long one captured op takes on one GPU, and where that number came from.

Tiers, first hit wins (each price carries its ``source`` and a 1-sigma relative error):

1. ``measured``: the DB holds this kernel (GPU, class, signature, dtype, dims) on this GPU.
2. ``interpolated``: the DB holds kernels of the same class and dtype on this GPU whose shapes
   bracket this one (every dim of a lower neighbour <= ours <= every dim of an upper one; GEMMs by
   m, n, k, batch; attention by b, h, sq, sk, d with equal dir and causal). Time is interpolated
   log-log in FLOPs between them: ``t = tL * (F / FL) ** a``, ``a = log(tU / tL) / log(FU / FL)``
   clamped to ``a >= 0`` -- monotone in every dim.
3. ``scaled:<gpu>``: the nearest GPU (same vendor, closest compute capability, closest peaks)
   that measured (or can interpolate) the kernel. The time above the launch overhead scales by
   the ratio of the two roofline times, ``max(F / P_new, B / BW_new) / max(F / P_old, B / BW_old)``:
   for an op above both GPUs' ridge points this is the FLOPS ratio ``P_old / P_new``, below both
   the bandwidth ratio ``BW_old / BW_new`` (SimAI-CP-Model, NSDI'25 section 3.3, generalised to
   ops that change side); see :func:`scale_time`.
4. ``roofline``: :mod:`kernel_db.roofline` with the efficiency curves.

:meth:`Pricer.price_block` prices a whole columnar block at once with a cache keyed by
(gpu, kernel class, signature, dtype, dims) and, by default, fuses chains of elementwise ops the way
Megatron's fused kernels run them (see :func:`fusion_groups`). Comm and wait ops price 0 s with
source ``comm``: their time comes from ``ncclshim``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from heterosim.cluster.gpus import Catalogue, GpuSpec, load_catalogue
from heterosim.errors import UnknownKernelError
from heterosim.trace.vocab import DTYPE_BYTES

from .db import KernelDB, KernelRow, dims_key
from .opmap import base_name, canonical_signature, kernel_class_of, writes_only
from .roofline import EfficiencyModel, load_efficiency, roofline_time

__all__ = ["Price", "Pricer", "price", "SOURCES", "fusion_groups", "scale_factor", "scale_time", "sustained"]

SOURCES = ("measured", "interpolated", "scaled", "roofline")
"""Source kinds; a scaled price's source reads ``scaled:<gpu name>``."""

_TENSOR_CLASSES = ("gemm", "attention", "ssm")
_BRACKET_DIMS = {"gemm": ("m", "n", "k", "batch"), "attention": ("b", "h", "sq", "sk", "d")}
_MATCH_DIMS = {"gemm": (), "attention": ("dir", "causal", "impl", "window")}  # a windowed kernel needs windowed rows


@dataclass(frozen=True, slots=True, kw_only=True)
class Price:
    """Time of one op on one GPU."""

    seconds: float
    """Predicted kernel time, seconds."""
    source: str
    """``measured``, ``interpolated``, ``scaled:<gpu>``, ``roofline`` (``comm`` for comm/wait ops)."""
    rel_err: float
    """Estimated 1-sigma relative error of ``seconds``."""


def _get(op: Any, name: str, default: Any) -> Any:
    if isinstance(op, Mapping):
        return op.get(name, default)
    return getattr(op, name, default)


def _gemm_flops_bytes(dims: Mapping[str, Any], dtype: str) -> tuple[float, float]:
    m, n, k, b = (int(dims.get(x, 1)) for x in ("m", "n", "k", "batch"))
    return 2.0 * m * n * k * b, float((m * k + k * n + m * n) * b * DTYPE_BYTES.get(dtype, 2))


def scale_factor(kernel_class: str, dtype: str, flops: float, nbytes: float, old: GpuSpec, new: GpuSpec) -> float:
    """Ratio t_new / t_old of the two GPUs' rooflines for an op (see the module docstring)."""

    def peak(g: GpuSpec) -> float:  # tensor math at each GPU's sustained (power-capped) clock
        return g.peak(dtype) * g.power_clock_ratio if kernel_class in _TENSOR_CLASSES else g.peak_flops["fp32"]

    if flops <= 0 and nbytes <= 0:  # NB: nothing to classify by: tensor classes by FLOPS, others by bandwidth
        return peak(old) / peak(new) if kernel_class in _TENSOR_CLASSES else old.hbm_bw / new.hbm_bw
    return max(flops / peak(new), nbytes / new.hbm_bw) / max(flops / peak(old), nbytes / old.hbm_bw)


def sustained(seconds: float, kernel_class: str, dtype: str, flops: float, nbytes: float, gpu: GpuSpec) -> float:
    """A time measured by ``kernel_db profile`` (boost clock: the profiler idles the GPU before each
    timed call) moved to the GPU's sustained clock under its power cap, the regime of a training run:
    :func:`scale_time` from :meth:`GpuSpec.at_boost` to ``gpu``. Only tensor-class time above the
    ridge point grows (by ``1 / power_clock_ratio``); memory-bound kernels and GPUs without a
    derate keep the measured time."""
    if kernel_class not in _TENSOR_CLASSES or gpu.power_clock_ratio >= 1.0:
        return seconds
    return scale_time(seconds, kernel_class, dtype, flops, nbytes, gpu.at_boost(), gpu)


def scale_time(seconds: float, kernel_class: str, dtype: str, flops: float, nbytes: float, old: GpuSpec,
               new: GpuSpec) -> float:
    """A time measured on ``old`` moved to ``new``: ``L_new + (t_old - L_old) * scale_factor``.

    The launch overhead ``L`` does not scale with FLOPS or bandwidth, so it is taken out before the
    ratio is applied and the new GPU's is added back (equal ``L`` on both: the plain ratio applied
    to the kernel's body). Measured H100 <-> H200 on 16 elementwise kernels: mean error 19-24%
    with the plain ratio on the whole time, because small kernels are launch-bound.
    """
    body = max(seconds - old.launch_overhead_s, 0.0)
    return new.launch_overhead_s + body * scale_factor(kernel_class, dtype, flops, nbytes, old, new)


def _row_flops(row: KernelRow, dims: Mapping[str, Any]) -> float:
    if row.flops > 0:
        return row.flops
    if row.kernel_class == "gemm":
        return _gemm_flops_bytes(dims, row.dtype)[0]
    return 0.0


class Pricer:
    """Prices ops on GPUs from a catalogue, a kernel DB and efficiency curves, with a cache.

    The DB must not change while a Pricer uses it (its caches would go stale): make a new Pricer
    after adding rows.

    Example::

        pricer = Pricer(KernelDB.load("kernels.csv"))
        secs, sources, errs = pricer.price_block(block, "H100")
    """

    def __init__(
        self,
        db: KernelDB | None = None,
        catalogue: Catalogue | None = None,
        efficiency: EfficiencyModel | None = None,
        *,
        fuse: bool = True,
    ) -> None:
        self.db = db if db is not None else KernelDB()
        self.catalogue = catalogue if catalogue is not None else load_catalogue()
        self.efficiency = efficiency if efficiency is not None else load_efficiency()
        self.fuse = fuse
        self._cache: dict[tuple, Price] = {}
        self._interp_cache: dict[tuple, list] = {}

    # ---------------------------------------------------------------- single op
    def gpu(self, gpu: "str | GpuSpec") -> GpuSpec:
        """Resolve a GPU name (or pass a spec through)."""
        return self.catalogue.get(gpu)

    def price(self, op: Any, gpu: "str | GpuSpec") -> Price:
        """Price one op (a :class:`heterosim.trace.ir.Op`, or anything with its fields) on ``gpu``."""
        spec = self.gpu(gpu)
        kind = _get(op, "kind", "compute")
        if kind != "compute":
            return Price(seconds=0.0, source="comm", rel_err=0.0)
        name = _get(op, "name", "")
        kc = kernel_class_of(name, _get(op, "kernel_class", ""), _get(op, "phase", ""))
        if kc == "comm":
            return Price(seconds=0.0, source="comm", rel_err=0.0)
        dims = _get(op, "dims", None) or {}
        sig = _get(op, "signature", "")
        dtype = _get(op, "dtype", "")
        flops = float(_get(op, "flops", 0.0))
        written = float(_get(op, "bytes_written", 0))
        nbytes = written if writes_only(name) else float(_get(op, "bytes_read", 0)) + written
        key = (spec.name, kc, sig or name, dtype, tuple(sorted(dims.items())), flops, nbytes)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._price(spec, kc, name, canonical_signature(sig) if sig else "", dtype, dims, flops, nbytes)
            self._cache[key] = hit
        return hit

    def _price(self, gpu: GpuSpec, kc: str, name: str, sig: str, dtype: str, dims: Mapping[str, Any],
               flops: float, nbytes: float) -> Price:
        if kc == "gemm" and dims and (flops <= 0 or nbytes <= 0):
            f, b = _gemm_flops_bytes(dims, dtype)
            flops, nbytes = flops or f, nbytes or b
        if flops <= 0 and nbytes <= 0 and not sig:
            raise UnknownKernelError(
                f"op {name!r} ({kc}) has no signature, FLOPs or bytes: nothing to price it by; "
                f"re-capture the trace or fill flops/bytes_read/bytes_written"
            )
        p = self.efficiency.params(gpu)
        rel = p["rel_err"]
        dk = dims_key(dims)
        t = self._measured_or_interpolated(gpu, kc, sig, dtype, dims, dk, flops, nbytes, rel)
        if t is not None:
            return t
        t = self._scaled(gpu, kc, sig, dtype, dims, dk, flops, nbytes, rel)
        if t is not None:
            return t
        op_factor = p["memory"].get("op_factor", {}).get(base_name(name)) if name else None
        r = roofline_time(kc, dtype, dims, flops, nbytes, gpu, p, mem_factor=op_factor)
        err = rel["roofline"].get(kc, rel["roofline"]["default"])
        return Price(seconds=r.seconds, source="roofline", rel_err=float(err))

    def _measured_or_interpolated(self, gpu: GpuSpec, kc: str, sig: str, dtype: str, dims: Mapping[str, Any],
                                  dk: str, flops: float, nbytes: float, rel: Mapping[str, Any]) -> Price | None:
        row = self.db.lookup(gpu.name, kc, sig, dtype, dk) if sig else None
        if row is not None:
            err = max(float(rel["measured_floor"]), row.spread_rel / 1.349)  # IQR -> sigma of a normal
            return Price(seconds=sustained(row.estimate_s, kc, dtype, flops, nbytes, gpu), source="measured", rel_err=err)
        got = self._interpolate(gpu.name, kc, dtype, dims, flops)
        if got is not None:
            t, gap = got
            err = float(rel["interpolated"]) * (1.0 + math.log2(max(gap, 1.0)) / 3.0)
            return Price(seconds=sustained(t, kc, dtype, flops, nbytes, gpu), source="interpolated", rel_err=err)
        return None

    def _interpolate(self, gpu: str, kc: str, dtype: str, dims: Mapping[str, Any], flops: float) -> tuple[float, float] | None:
        axes = _BRACKET_DIMS.get(kc)
        if axes is None or not dims or flops <= 0:
            return None
        ck = (gpu, kc, dtype)
        pts = self._interp_cache.get(ck)
        if pts is None:
            pts = []
            for r in self.db.candidates(gpu, kc, dtype):
                d = r.dims_dict()
                f = _row_flops(r, d)
                if f > 0:
                    pts.append((tuple(float(d.get(a, 1)) for a in axes), tuple(d.get(a) for a in _MATCH_DIMS[kc]), f, r.estimate_s))
            self._interp_cache[ck] = pts
        x = tuple(float(dims.get(a, 1)) for a in axes)
        match = tuple(dims.get(a) for a in _MATCH_DIMS[kc])
        lo = hi = None
        for px, pm, f, t in pts:
            if pm != match:
                continue
            if all(a <= b for a, b in zip(px, x)) and (lo is None or f > lo[0]):
                lo = (f, t)
            if all(a >= b for a, b in zip(px, x)) and (hi is None or f < hi[0]):
                hi = (f, t)
        if lo is None or hi is None:
            return None
        (fl, tl), (fu, tu) = lo, hi
        if fu <= fl:
            return max(tl, tu) if fu == fl else tl, 1.0
        a = max(0.0, math.log(tu / tl) / math.log(fu / fl))
        return tl * (flops / fl) ** a, fu / fl

    def _scaled(self, gpu: GpuSpec, kc: str, sig: str, dtype: str, dims: Mapping[str, Any], dk: str,
                flops: float, nbytes: float, rel: Mapping[str, Any]) -> Price | None:
        measured_on = {r.gpu for r in self.db.other_gpus(kc, sig, dtype, dk)} if sig else set()
        others = []
        for name in self.db.gpus():
            if name == gpu.name:
                continue
            try:
                other = self.catalogue.get(name)
            except KeyError:  # UnknownGPUError: a DB row for a GPU this catalogue lacks; cannot scale from it
                continue
            if not other.is_gpu or not gpu.is_gpu:
                continue
            # Scaling keeps the fraction of peak a kernel reaches. Within one vendor's libraries
            # that holds to ~10% (torch.matmul maxima: A100 SXM 87%, H100 80%, B200 78%, GB200 73%
            # of peak), across vendors it does not (MI300X 51%; kernel_db/data/efficiency.yaml,
            # arch.gfx942): another vendor's GPU is priced by its own curve instead.
            if other.vendor != gpu.vendor:
                continue
            if name in measured_on or self.db.candidates(name, kc, dtype):
                others.append(other)
        others.sort(key=lambda o: _distance(gpu, o))
        for other in others:
            base = self._measured_or_interpolated(other, kc, sig, dtype, dims, dk, flops, nbytes, rel)
            if base is None:
                continue
            err = math.hypot(float(rel["scaled"]), base.rel_err)
            return Price(seconds=scale_time(base.seconds, kc, dtype, flops, nbytes, other, gpu),
                         source=f"scaled:{other.name}", rel_err=err)
        return None

    # ---------------------------------------------------------------- blocks
    def price_block(self, block: Any, gpu: "str | GpuSpec") -> tuple[np.ndarray, list[str], np.ndarray]:
        """Price every op of a :class:`heterosim.trace.ir.Block` on ``gpu``.

        Returns (seconds, sources, rel_err) aligned with the block's ops. With ``fuse`` on, a chain
        of elementwise ops that Megatron runs as one fused kernel (see :func:`fusion_groups`) that
        would be priced by the roofline is priced as one kernel: its time sits on the chain's first
        op and the others get 0 s (same source).
        """
        spec = self.gpu(gpu)
        cols = block.columns
        n = len(cols["kind"])
        secs = np.zeros(n)
        errs = np.zeros(n)
        srcs = ["comm"] * n
        kinds, names, kcs, sigs = cols["kind"], cols["name"], cols["kernel_class"], cols["signature"]
        dtypes, dimss, flopss = cols["dtype"], cols["dims"], cols["flops"]
        brs, bws = cols["bytes_read"], cols["bytes_written"]
        cache = self._cache
        for i in range(n):
            if kinds[i] != "compute":
                continue
            dims = dimss[i] or {}
            kc = kcs[i]
            key = (spec.name, kc, sigs[i] or names[i], dtypes[i], tuple(sorted(dims.items())), float(flopss[i]),
                   float(brs[i]) + float(bws[i]))
            p = cache.get(key)
            if p is None:
                p = self.price(
                    {"kind": "compute", "name": names[i], "kernel_class": kc, "signature": sigs[i], "dtype": dtypes[i],
                     "dims": dims, "flops": flopss[i], "bytes_read": brs[i], "bytes_written": bws[i]}, spec)
                cache[key] = p
            secs[i], srcs[i], errs[i] = p.seconds, p.source, p.rel_err
        if self.fuse:
            self._apply_fusion(block, spec, secs, srcs, errs)
        return secs, srcs, errs

    def _apply_fusion(self, block: Any, gpu: GpuSpec, secs: np.ndarray, srcs: list[str], errs: np.ndarray) -> None:
        cols = block.columns
        p = self.efficiency.params(gpu)
        for group in fusion_groups(block):
            if any(srcs[i] != "roofline" for i in group):
                continue  # NB: measured members were timed as separate kernels; keep them
            inner = set(group)
            flops = sum(float(cols["flops"][i]) for i in group)
            # Bytes a fused kernel moves: inputs that do not come from inside the chain, and the last output.
            nbytes = float(cols["bytes_written"][group[-1]])
            for j, i in enumerate(group):
                read = float(cols["bytes_read"][i])
                if j and (i - 1) in inner and 1 in cols["deps"][i]:
                    read = max(0.0, read - float(cols["bytes_written"][i - 1]))
                nbytes += read
            kc = "softmax" if any(cols["kernel_class"][i] == "softmax" for i in group) else "elementwise"
            r = roofline_time(kc, cols["dtype"][group[0]], {}, flops, nbytes, gpu, p)
            secs[group[0]] = r.seconds
            for i in group[1:]:
                secs[i] = 0.0


def fusion_groups(block: Any) -> list[list[int]]:
    """Chains of ops in ``block`` that Megatron runs as one fused kernel.

    A chain is a run of consecutive compute ops, each elementwise (at most one softmax), of one
    module or a module and its ancestor (the bias add of ``mlp.linear_fc1`` and the GeLU of
    ``mlp``), where each op after the first reads the op just before it (dependency distance 1)
    and touches as many elements (same ``dims.numel``). That covers bias-GeLU (add -> gelu),
    bias-dropout-add (add -> dropout -> add), scale-mask-softmax (mul -> masked_fill -> softmax)
    and their backward chains. NB: sibling modules never fuse.
    """
    cols = block.columns
    kinds, kcs, mods, deps, dims = cols["kind"], cols["kernel_class"], cols["module"], cols["deps"], cols["dims"]
    groups: list[list[int]] = []
    cur: list[int] = []
    n_softmax = 0

    def flush() -> None:
        if len(cur) > 1:
            groups.append(list(cur))

    for i in range(len(kinds)):
        ok = kinds[i] == "compute" and kcs[i] in ("elementwise", "softmax")
        if ok and cur:
            prev = cur[-1]
            same = (prev == i - 1 and _related(mods[i], mods[prev]) and 1 in deps[i]
                    and (dims[i] or {}).get("numel") == (dims[prev] or {}).get("numel")
                    and not (kcs[i] == "softmax" and n_softmax))
            if same:
                cur.append(i)
                n_softmax += kcs[i] == "softmax"
                continue
        flush()
        cur, n_softmax = ([i], int(kcs[i] == "softmax")) if ok else ([], 0)
    flush()
    return groups


def _related(a: str, b: str) -> bool:
    # Same module, or one an ancestor of the other in the module path.
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _distance(target: GpuSpec, other: GpuSpec) -> tuple:
    # Nearest measured GPU: same vendor first, then same arch, closest compute capability, then
    # closest peaks (bf16 FLOPS and bandwidth, in log ratio). Name breaks ties deterministically.
    peaks = abs(math.log(other.peak("bf16") / target.peak("bf16"))) + abs(math.log(other.hbm_bw / target.hbm_bw))
    return (other.vendor != target.vendor, other.arch != target.arch,
            abs(other.compute_capability - target.compute_capability), round(peaks, 9), other.name)


_DEFAULT_PRICER: Pricer | None = None


def price(op: Any, gpu: "str | GpuSpec", db: KernelDB | None = None) -> Price:
    """Price one op on ``gpu`` (a name or :class:`GpuSpec`) with ``db`` (default: an empty DB)."""
    global _DEFAULT_PRICER
    if db is not None:
        return Pricer(db).price(op, gpu)
    if _DEFAULT_PRICER is None:
        _DEFAULT_PRICER = Pricer()
    return _DEFAULT_PRICER.price(op, gpu)
