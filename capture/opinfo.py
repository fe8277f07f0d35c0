"""What one aten op costs: kernel class, FLOPs, bytes, dims and signature. Pure over shapes.

The recorder calls :func:`describe` for every compute op it sees. GEMM and attention FLOPs come
from ``torch.utils.flop_counter`` (the registry PyTorch's FlopCounterMode uses); the CPU flash
attention kernel that fake CPU tensors dispatch to is registered here with the same formula as the
CUDA one. Other classes get an estimate (see :data:`_FLOPS_PER_ELEMENT`): those ops are
memory-bound, and kernel_db prices them from bytes.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch.utils.flop_counter import (
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from capture import ssd_cost
from heterosim.trace import vocab
from heterosim.trace.vocab import DTYPE_OF_TORCH

__all__ = [
    "OpCost",
    "describe",
    "dtype_name",
    "kernel_class_of",
    "causal_fraction",
    "unmasked_elements",
    "FLASH_TILE",
    "read_tensors",
    "unique_nbytes",
    "tensors_in",
]

aten = torch.ops.aten


def tensors_in(x: Any) -> list[torch.Tensor]:
    """The tensors of ``x`` in ``tree_flatten(x)`` order: an op's arguments and outputs are tensors,
    scalars and lists, tuples (named ones too) and dicts of them, which this walks at C-loop speed
    (``torch.utils._pytree`` is the op's slowest part of the recorder's own work)."""
    out: list[torch.Tensor] = []
    stack = [x]
    while stack:
        y = stack.pop()
        if isinstance(y, torch.Tensor):
            out.append(y)
        elif isinstance(y, (list, tuple)):
            stack.extend(reversed(y))
        elif isinstance(y, dict):
            stack.extend(reversed(list(y.values())))
    return out

# CPU flash attention (what SDPA runs on fake CPU tensors) has no formula in torch's registry.
if aten._scaled_dot_product_flash_attention_for_cpu not in flop_registry:

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu)
    def _sdpa_cpu_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        """Same count as the CUDA flash kernel: QK^T and PV, 2 FLOPs per multiply-add."""
        return sdpa_flop_count(query_shape, key_shape, value_shape)

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)
    def _sdpa_cpu_bwd_flop(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


_DTYPE_NAMES = {getattr(torch, n): name for n, name in DTYPE_OF_TORCH.items() if hasattr(torch, n)}


def dtype_name(dt: torch.dtype) -> str:
    """Short dtype name used in traces (bf16, fp32, fp8, ...): :data:`heterosim.trace.vocab.DTYPE_OF_TORCH`."""
    return _DTYPE_NAMES.get(dt, str(dt).replace("torch.", ""))


# Megatron's fused causal softmax (models/layers/megatron_ops.py) -> how many [.., sq, sk] tensors
# the kernel reads, each only on its unmasked elements: x forward; grad and out backward.
_UPPER_TRIANG_READS = {"scaled_upper_triang_masked_softmax": 1, "scaled_upper_triang_masked_softmax_backward": 2}

# Sliding-window / sink attention (models/layers/window_attention.py): costed by _window_attention_cost.
_WINDOW_ATTENTION = {"window_attention", "window_attention_backward"}

# In-place ops that overwrite their destination without reading it.
_WRITE_ONLY = {"fill_", "zero_", "copy_", "normal_", "uniform_", "random_", "exponential_", "bernoulli_"}

# GEMMs computing beta * self + alpha * (a @ b): with beta = 0, BLAS does not read self (the
# reference BLAS GEMM: "when beta is zero, C need not be set on input"); Megatron's unfused
# attention calls baddbmm(empty, q, k^T, beta=0) for exactly that.
_BETA_GEMM = {"addmm", "baddbmm", "addbmm"}

# Estimated FLOPs per output element for memory-bound classes (what the kernel's arithmetic is,
# roughly): a layer norm does mean, variance, normalise and affine (~8/elt fwd); softmax max,
# sub, exp, sum, div (~5); an elementwise op ~1 (gelu's tanh polynomial is ~10, ignored). These
# only feed executed FLOPs; kernel_db prices these classes from bytes.
_FLOPS_PER_ELEMENT = {
    "norm": 8.0,
    "softmax": 5.0,
    "cross_entropy": 5.0,
    "elementwise": 1.0,
    "reduction": 1.0,
    "optimizer": 4.0,
    "embedding": 0.0,
    "copy": 0.0,
}

FLASH_TILE = 128
"""Query/key tile edge of FlashAttention-2's forward kernel (Dao, 2023, §3.1; block 128 on A100/H100)."""


def causal_fraction(sq: int, sk: int, tile: int = FLASH_TILE) -> float:
    """Fraction of (query tile, key tile) pairs a causal flash kernel computes.

    With bottom-right alignment (query i sees keys up to i + sk - sq), tiles entirely above the
    diagonal are skipped; diagonal tiles are computed whole (FlashAttention-2, Dao 2023, §3.1.1).
    """
    nq = max(1, math.ceil(sq / tile))
    nk = max(1, math.ceil(sk / tile))
    offset = sk - sq
    done = 0
    for i in range(nq):
        last_key = min(sk - 1, (i + 1) * tile - 1 + offset)
        if last_key >= 0:
            done += min(nk, last_key // tile + 1)
    return done / (nq * nk)


@functools.lru_cache(maxsize=64)  # called per captured op; a run has a few (s, window) pairs
def window_tiles(s: int, window: int, tile: int = FLASH_TILE) -> tuple[int, int]:
    """(key tiles a flash kernel computes, all query x key tile pairs) of causal self-attention over
    ``s`` tokens where query ``i`` sees keys ``i - window .. i`` (``window < 0``: all earlier keys):
    a query tile visits the key tiles from the one holding its first row's earliest key to its
    diagonal tile, each computed whole."""
    n = max(1, math.ceil(s / tile))
    done = 0
    for i in range(n):
        first = 0 if window < 0 else max(0, i * tile - window) // tile
        done += i - first + 1
    return done, n * n


def window_pairs(s: int, window: int) -> int:
    """(query, key) pairs of causal attention over ``s`` tokens within ``window`` earlier keys:
    ``sum_i min(i, window) + 1``; ``s (s + 1) / 2`` without a window."""
    if window < 0 or window >= s - 1:
        return s * (s + 1) // 2
    return (window + 1) * (window + 2) // 2 + (s - window - 1) * (window + 1)


def _window_attention_cost(packet: str, args: Sequence[Any]) -> tuple[dict, float, float]:
    """(dims, executed FLOPs, model FLOPs) of ``heterosim::window_attention`` (models/layers/
    window_attention.py): executed counts the whole tiles the kernel visits, model FLOPs the
    (query, key) pairs, 4 d each way of QK^T and PV; the backward executes 2.5x and counts 2x the
    forward, as torch's and Megatron's conventions for flash attention do (describe, below)."""
    backward = packet.endswith("_backward")
    q, k, _v, _sinks, window = (args[1:6] if backward else args[:5])
    b, h, s, d = (int(x) for x in q.shape)
    done, total = window_tiles(s, int(window))
    fwd_full = 4.0 * b * h * d * window_pairs(s, int(window))
    fwd_executed = 4.0 * b * h * d * s * s * done / total
    dims = {"b": b, "h": h, "hkv": int(k.shape[1]), "sq": s, "sk": s, "d": d, "causal": True,
            "dir": "bwd" if backward else "fwd"}
    if int(window) >= 0:
        dims["window"] = int(window)
    return dims, fwd_executed * (2.5 if backward else 1.0), fwd_full * (2.0 if backward else 1.0)


def unmasked_elements(sq: int, sk: int) -> int:
    """Elements of a causal ``[sq, sk]`` matrix that query ``i`` sees (keys ``0..i``, top-left
    aligned): ``sum_i min(i + 1, sk)``; ``sk (sk + 1) / 2`` when ``sq == sk``."""
    inside = min(sq, sk)
    return inside * (inside + 1) // 2 + max(0, sq - sk) * sk


def _upper_triang_softmax_cost(packet: str, x: torch.Tensor) -> tuple[int, int, float]:
    """``(bytes_read, bytes_written, flops)`` of Megatron's ``scaled_upper_triang_masked_softmax``
    (megatron/fused_kernels/scaled_upper_triang_masked_softmax.h, one warp per row): row ``i``
    loads only its ``i + 1`` unmasked elements (``local_seq = blockIdx.x + 1``; masked ones are set
    to -inf without a load) and stores the whole row, zeros where masked; the backward loads grad
    and output on the same elements and stores the whole row. So with ``N`` elements of itemsize
    ``e`` and unmasked share ``f`` (``(sk + 1) / (2 sk)`` when ``sq == sk``): read ``N e f`` forward,
    ``2 N e f`` backward; written ``N e``. FLOPs: the softmax estimate of
    :data:`_FLOPS_PER_ELEMENT` over the unmasked elements only. Ignores that a row's loads round
    up to the kernel's vectors (``ELEMENTS_PER_LDG_STG`` elements) and 32-byte DRAM sectors: at
    most one sector per row more."""
    *lead, sq, sk = x.shape
    rows = math.prod(lead)
    seen = rows * unmasked_elements(int(sq), int(sk))
    e = x.element_size()
    return _UPPER_TRIANG_READS[packet] * seen * e, x.numel() * e, _FLOPS_PER_ELEMENT["softmax"] * seen


def kernel_class_of(packet: str, func: Any, phase: str) -> str:
    """Kernel class of an aten op (overload packet name), given the phase it runs in.

    The name's class in :mod:`heterosim.trace.vocab` (the one table, shared with kernel_db); for a
    name it does not hold, torch's op tags: ``reduction``, else ``pointwise`` -> elementwise, else
    copy (memory-bound, priced from bytes).
    """
    kc = vocab.kernel_class_of(packet, phase)
    if kc is not None:
        return kc
    tags = getattr(func, "tags", ())
    if torch.Tag.reduction in tags:
        return "reduction"
    return "elementwise" if torch.Tag.pointwise in tags else "copy"


def unique_nbytes(t: torch.Tensor) -> int:
    """Bytes of ``t`` a kernel moves: broadcast (stride-0) dims are read once, not numel times."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


def read_tensors(func: Any, args: Sequence[Any], kwargs: dict, mutated: Sequence[torch.Tensor],
                 ins: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors among ``ins`` an op reads, each once: not the destination of an op that
    overwrites it (``fill_``, ``copy_``...), nor the ``self`` of a GEMM with ``beta=0``."""
    packet = func._overloadpacket.__name__
    seen: set[int] = set()
    if packet in _WRITE_ONLY:  # the destination is overwritten, not read
        seen.update(id(t) for t in mutated)
    if packet in _BETA_GEMM and kwargs.get("beta", 1) == 0:
        seen.add(id(args[0]))
    out = []
    for t in ins:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


@dataclass(frozen=True, slots=True)
class OpCost:
    """The recorded cost fields of one compute op."""

    kernel_class: str
    flops: float
    flops_full: float
    bytes_read: int
    bytes_written: int
    dtype: str
    dims: dict
    signature: str


def _shape_str(ts: Sequence[torch.Tensor]) -> str:
    return ",".join("x".join(str(int(d)) for d in t.shape) or "scalar" for t in ts)


def _gemm_dims(packet: str, ins: Sequence[torch.Tensor]) -> dict:
    if packet in ("mm", "matmul", "_scaled_mm"):
        a, b = ins[0], ins[1]
        return {"m": int(a.shape[-2]), "k": int(a.shape[-1]), "n": int(b.shape[-1]), "batch": 1}
    if packet == "addmm":  # (bias, a, b)
        a, b = ins[1], ins[2]
        return {"m": int(a.shape[0]), "k": int(a.shape[1]), "n": int(b.shape[1]), "batch": 1}
    if packet == "bmm":
        a, b = ins[0], ins[1]
        return {"m": int(a.shape[1]), "k": int(a.shape[2]), "n": int(b.shape[2]), "batch": int(a.shape[0])}
    a, b = ins[-2], ins[-1]  # baddbmm / addbmm: (self, batch1, batch2)
    return {"m": int(a.shape[1]), "k": int(a.shape[2]), "n": int(b.shape[2]), "batch": int(a.shape[0])}


def _attention_dims(packet: str, args: Sequence[Any], kwargs: dict) -> tuple[dict, bool]:
    backward = packet.endswith("_backward")
    flex = packet.startswith("flex_attention")  # (q, k, v, ...) both ways
    q, k = (args[1], args[2]) if backward and not flex else (args[0], args[1])
    if packet.startswith("_flash_attention"):  # (b, s, h, d) layout
        b, sq, h, d = q.shape
        sk, hkv = k.shape[1], k.shape[2]
    else:  # SDPA layout (b, h, s, d)
        b, h, sq, d = q.shape
        hkv, sk = k.shape[1], k.shape[2]
    causal = bool(kwargs.get("is_causal", False))
    if flex:
        # NB: a FlexAttention mask lives in tensors with no data here: counted causal, which a
        # block-causal (document) mask is at most (capture/flexattn.py).
        causal = True
    else:
        names = [a.name for a in _schema_args(packet)]
        if "is_causal" in names:
            i = names.index("is_causal")
            if i < len(args):
                causal = bool(args[i])
    dims = {
        "b": int(b),
        "h": int(h),
        "hkv": int(hkv),
        "sq": int(sq),
        "sk": int(sk),
        "d": int(d),
        "causal": causal,
        "dir": "bwd" if backward else "fwd",
    }
    return dims, causal


_SCHEMA_CACHE: dict[str, list] = {}


def _schema_args(packet: str) -> list:
    if packet not in _SCHEMA_CACHE:
        op = getattr(aten, packet)
        _SCHEMA_CACHE[packet] = list(op.default._schema.arguments)
    return _SCHEMA_CACHE[packet]


def describe(
    func: Any,
    args: Sequence[Any],
    kwargs: dict,
    out: Any,
    mutated: Sequence[torch.Tensor],
    phase: str,
    gemm_dtype: str | None = None,
    ins: Sequence[torch.Tensor] | None = None,
    outs: Sequence[torch.Tensor] | None = None,
) -> OpCost:
    """Cost fields of one compute op: ``func(*args, **kwargs) -> out`` that wrote ``mutated``.

    ``ins`` / ``outs`` (the tensors of args and out) may be passed when the caller has them.
    """
    packet = func._overloadpacket.__name__
    if ins is None:
        ins = tensors_in((args, kwargs))
    if outs is None:
        outs = tensors_in(out)
    ins, outs = list(ins), list(outs)
    kc = kernel_class_of(packet, func, phase)
    floats = [t.dtype for t in ins + outs if t.dtype.is_floating_point]
    dtype = dtype_name(floats[0]) if floats else (dtype_name(ins[0].dtype) if ins else "")
    bytes_read = sum(unique_nbytes(t) for t in read_tensors(func, args, kwargs, mutated, ins))
    out_ids = {id(t) for t in outs}
    written = outs + [t for t in mutated if id(t) not in out_ids]
    bytes_written = sum(unique_nbytes(t) for t in written)
    numel = max([t.numel() for t in ins + outs] or [0])
    window_flops: list[float] = []
    if kc == "gemm":
        dims = _gemm_dims(packet, ins)
        # The multiplicands' dtype, not the accumulator's: addmm(fp32 main_grad, bf16, bf16,
        # out_dtype=fp32) is a bf16 GEMM (Megatron's fused weight-gradient accumulation).
        dtype = gemm_dtype or dtype_name((ins[1] if packet in _BETA_GEMM else ins[0]).dtype)
    elif kc == "attention" and packet in _WINDOW_ATTENTION and func.namespace == "heterosim":
        dims, *window_flops = _window_attention_cost(packet, args)
    elif kc == "attention":
        dims, _ = _attention_dims(packet, args, kwargs)
    elif kc == "ssm":
        dims = {}  # its dims, traffic and FLOPs come from capture.ssd_cost (below)
    else:
        dims = {"numel": int(numel)}
    full = 0.0
    if packet in _UPPER_TRIANG_READS and func.namespace == "heterosim":
        bytes_read, bytes_written, full = _upper_triang_softmax_cost(packet, ins[0])
    elif packet in ssd_cost.PACKETS and func.namespace == "heterosim":
        bytes_read, bytes_written, full, dims = ssd_cost.ssd_cost(packet, args)
    elif kc == "gemm":
        # 2mnk per batch, torch's formula for mm / addmm / bmm / baddbmm, taken from the dims so
        # that overloads its registry does not parse (addmm.dtype_out's out_dtype) count too.
        full = 2.0 * dims["m"] * dims["n"] * dims["k"] * dims["batch"]
    elif func._overloadpacket in flop_registry:
        full = float(flop_registry[func._overloadpacket](*args, **kwargs, out_val=out))
    elif kc not in ("gemm", "attention"):
        full = _FLOPS_PER_ELEMENT.get(kc, 1.0) * numel
    executed = full
    if window_flops:
        executed, full = window_flops
    elif kc == "attention":
        if dims["dir"] == "bwd":
            # torch's formula counts the QK^T recomputation a flash backward does (5 GEMMs, 2.5x
            # the forward): that is executed work. Megatron's convention (Narayanan et al., SC'21,
            # eq. 3) counts backward as exactly 2x forward: flops_full follows it.
            b, h, sq, sk, d = dims["b"], dims["h"], dims["sq"], dims["sk"], dims["d"]
            full = 2.0 * (2 * b * h * sq * sk * d) * 2
        if dims["causal"]:
            executed = executed * causal_fraction(dims["sq"], dims["sk"])
    signature = f"{func}:{dtype}:{_shape_str(ins)}"
    return OpCost(kc, executed, full, bytes_read, bytes_written, dtype, dims, signature)
