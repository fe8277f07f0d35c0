"""From captured op names to the GPU kernels that price them.

Capture runs on a CPU host, so some ops are recorded under their CPU kernel names
(``aten._scaled_dot_product_flash_attention_for_cpu``). On a CUDA GPU the same call dispatches to the
CUDA kernel (``aten._scaled_dot_product_flash_attention``); :func:`canonical_name` and
:func:`canonical_signature` rewrite the first into the second so that a DB row profiled on a GPU
keys the op captured on a CPU. :func:`kernel_class_of` gives the kernel class of an op whose trace
left it empty, from the table capture classifies with (:mod:`heterosim.trace.vocab`, where a
custom op is registered); an op that it does not know raises :class:`UnknownKernelError` naming
the op -- never a silent 0 s.

Signatures are ``"<aten name>:<dtype>:<shape>,<shape>..."`` with shapes ``AxBxC`` (``scalar`` for a
0-d tensor); :func:`parse_signature` splits one.
"""

from __future__ import annotations

import re
from functools import lru_cache

from heterosim.errors import UnknownKernelError
from heterosim.trace import vocab

__all__ = [
    "CPU_TO_CUDA",
    "base_name",
    "canonical_name",
    "canonical_signature",
    "kernel_class_of",
    "parse_signature",
    "WRITE_ONLY",
    "writes_only",
]

CPU_TO_CUDA: dict[str, str] = {
    "_scaled_dot_product_flash_attention_for_cpu": "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu_backward": "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_attention_math": "_scaled_dot_product_flash_attention",
}
"""Base aten names seen under a CPU capture -> the base name of the CUDA kernel that runs instead."""

_CPU_RE = re.compile(r"(?<![0-9A-Za-z_])(" + "|".join(sorted(map(re.escape, CPU_TO_CUDA), key=len, reverse=True)) + r")(?=[.:]|$)")

WRITE_ONLY: frozenset[str] = frozenset({
    "zero_", "fill_", "zeros", "ones", "full", "empty", "empty_like", "new_zeros", "new_empty", "zeros_like",
    "ones_like", "full_like", "arange", "randn", "rand", "randint", "rand_like", "randn_like", "normal_",
    "uniform_", "bernoulli_", "random_",
})
"""Ops that only write their output. Capture counts an in-place op's tensor as read and written;
these kernels never read it, so pricing charges only ``bytes_written`` (a zero_ of a 5.6 GB grad
buffer measured 1.7 ms on H100, i.e. write-only at 3.3 TB/s)."""


def writes_only(name: str) -> bool:
    """True if the op (any overload) only writes memory (see :data:`WRITE_ONLY`)."""
    return base_name(name) in WRITE_ONLY


def base_name(name: str) -> str:
    """The op's base name: ``"aten.mm.default"`` -> ``"mm"``, ``"mylib.x.default"`` -> ``"x"`` (any
    namespace, as capture records a custom op), ``"aten::mm"`` and ``"mm"`` -> ``"mm"``."""
    return _base(canonical_name(name))


def _base(name: str) -> str:
    # "aten.mm.default" -> "mm"; "aten::mm" -> "mm"; "mm" -> "mm"; "mylib.op.default" -> "op"
    qualified = "::" in name
    n = name.replace("::", ".")
    parts = n.split(".")
    if qualified or len(parts) > 2 or parts[0] in ("aten", "c10d", "_c10d_functional", "prims", "torch", "heterosim"):
        parts = parts[1:]  # "<namespace>.<op>.<overload>", as str() of a torch op writes it
    return parts[0] if parts else n


@lru_cache(maxsize=65536)
def canonical_name(name: str) -> str:
    """The CUDA-kernel name for a captured op name (CPU variants rewritten, others unchanged)."""
    return _CPU_RE.sub(lambda m: CPU_TO_CUDA[m.group(1)], name)


@lru_cache(maxsize=65536)
def canonical_signature(signature: str) -> str:
    """``signature`` with its aten name made canonical (see :func:`canonical_name`)."""
    name, sep, rest = signature.partition(":")
    return canonical_name(name) + sep + rest


def kernel_class_of(name: str, kernel_class: str = "", phase: str = "") -> str:
    """``kernel_class`` if given, else the class of the op's base name run in ``phase``, from the
    table capture records with (:func:`heterosim.trace.vocab.kernel_class_of`).

    Raises :class:`UnknownKernelError` naming the op when neither is known.
    """
    if kernel_class:
        return kernel_class
    base = base_name(name)
    kc = vocab.kernel_class_of(base, phase)
    if kc is None:
        raise UnknownKernelError(
            f"op {name!r} has no kernel class and kernel_db does not know its aten name {base!r}; "
            f"set kernel_class in the trace or register it with "
            f"heterosim.trace.vocab.register_kernel_class(<class>, {base!r})"
        )
    return kc


@lru_cache(maxsize=65536)
def parse_signature(signature: str) -> tuple[str, str, tuple[tuple[int, ...], ...]]:
    """Split ``"aten.mm.default:bf16:2048x12288,12288x4608"`` into (name, dtype, shapes)."""
    parts = signature.split(":")
    if len(parts) < 3:
        raise UnknownKernelError(f"signature {signature!r} is not '<aten name>:<dtype>:<shapes>'")
    name, dtype, shapes_s = ":".join(parts[:-2]), parts[-2], parts[-1]
    shapes: list[tuple[int, ...]] = []
    for s in shapes_s.split(",") if shapes_s else []:
        s = s.strip()
        try:
            shapes.append(tuple(int(x) for x in s.split("x")) if s and s not in ("-", "scalar") else ())
        except ValueError:
            raise UnknownKernelError(f"signature {signature!r}: shape {s!r} is not like 2048x12288") from None
    return name, dtype, tuple(shapes)
