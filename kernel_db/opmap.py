"""From captured op names to the GPU kernels that price them.

Capture runs on a CPU host, so some ops are recorded under their CPU kernel names
(``aten._scaled_dot_product_flash_attention_for_cpu``). On a CUDA GPU the same call dispatches to the
CUDA kernel (``aten._scaled_dot_product_flash_attention``); :func:`canonical_name` and
:func:`canonical_signature` rewrite the first into the second so that a DB row profiled on a GPU
keys the op captured on a CPU. :func:`kernel_class_of` gives the kernel class of an op whose trace
left it empty, from a registry of aten names; an op that it does not know raises
:class:`UnknownKernelError` naming the op -- never a silent 0 s.

Signatures are ``"<aten name>:<dtype>:<shape>,<shape>..."`` with shapes ``AxBxC`` (``scalar`` for a
0-d tensor); :func:`parse_signature` splits one.
"""

from __future__ import annotations

import re
from functools import lru_cache

from heterosim.errors import UnknownKernelError

__all__ = [
    "CPU_TO_CUDA",
    "base_name",
    "canonical_name",
    "canonical_signature",
    "kernel_class_of",
    "parse_signature",
    "register_kernel_class",
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

# aten base name -> kernel class, for ops whose trace row carries no kernel class.
_CLASS_OF: dict[str, str] = {}


def register_kernel_class(kernel_class: str, *names: str) -> None:
    """Declare that aten base ``names`` price as ``kernel_class``; a name registered twice raises."""
    for n in names:
        if n in _CLASS_OF and _CLASS_OF[n] != kernel_class:
            raise RuntimeError(f"duplicate kernel-class registration for {n}: {_CLASS_OF[n]} and {kernel_class}")
        _CLASS_OF[n] = kernel_class


register_kernel_class("gemm", "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "addbmm")
register_kernel_class(
    "attention",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
    "_flash_attention_forward", "_flash_attention_backward", "_efficient_attention_forward",
    "_efficient_attention_backward", "scaled_dot_product_attention",
)
register_kernel_class(
    "norm", "native_layer_norm", "native_layer_norm_backward", "layer_norm", "rms_norm",
    "_fused_rms_norm", "_fused_rms_norm_backward", "native_group_norm", "native_batch_norm",
)
register_kernel_class("softmax", "_softmax", "_softmax_backward_data", "softmax", "_log_softmax", "_log_softmax_backward_data",
                      "_masked_softmax", "_masked_softmax_backward",
                      # models/: Megatron's fused causal softmax (heterosim:: custom ops)
                      "scaled_upper_triang_masked_softmax", "scaled_upper_triang_masked_softmax_backward")
register_kernel_class("cross_entropy", "nll_loss_forward", "nll_loss_backward", "cross_entropy_loss", "nll_loss", "nll_loss2d_forward")
register_kernel_class("embedding", "embedding", "embedding_dense_backward", "embedding_backward", "index_select")
register_kernel_class(
    "reduction", "sum", "mean", "amax", "amin", "max", "min", "norm", "linalg_vector_norm", "var_mean",
    "var", "std", "prod", "argmax", "all", "any",
)
register_kernel_class(
    "copy", "copy_", "_to_copy", "clone", "cat", "stack", "index", "index_put", "index_put_", "gather",
    "scatter", "scatter_add", "scatter_add_", "_unsafe_view", "contiguous", "split_with_sizes_copy",
    "new_zeros", "zeros_like", "zeros", "empty", "fill_", "zero_", "slice_scatter", "select_backward",
    "slice_backward", "index_add_", "masked_scatter",
)
register_kernel_class(
    "optimizer", "_fused_adam_", "_fused_adamw_", "_foreach_add_", "_foreach_mul_", "_foreach_addcmul_",
    "_foreach_addcdiv_", "_foreach_sqrt", "_foreach_div_", "_foreach_lerp_", "_foreach_norm",
)
register_kernel_class(
    "elementwise", "add", "add_", "sub", "mul", "mul_", "div", "div_", "gelu", "gelu_backward", "silu",
    "silu_backward", "relu", "threshold_backward", "tanh", "tanh_backward", "sigmoid", "exp", "log", "pow",
    "rsqrt", "sqrt", "neg", "where", "masked_fill", "masked_fill_", "native_dropout",
    "native_dropout_backward", "bernoulli_", "rand_like", "sin", "cos", "addcmul", "addcdiv", "lerp",
    "clamp", "clamp_min", "maximum", "minimum", "eq", "ne", "lt", "gt", "ge", "le", "logical_and",
    "logical_not", "square", "abs", "sign", "erf", "triu", "tril", "_fused_dropout", "fused_bias_gelu",
)
register_kernel_class(
    "comm", "all_reduce", "all_reduce_", "allreduce_", "all_gather_into_tensor", "_allgather_base_",
    "reduce_scatter_tensor", "_reduce_scatter_base_", "broadcast_", "send", "recv_", "wait_tensor",
    "all_to_all_single", "barrier",
)


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
    """The op's base name: ``"aten.mm.default"`` -> ``"mm"``, ``"heterosim.x.default"`` -> ``"x"``."""
    return _base(canonical_name(name))


def _base(name: str) -> str:
    # "aten.mm.default" -> "mm"; "aten::mm" -> "mm"; "mm" -> "mm"
    n = name.replace("::", ".")
    parts = n.split(".")
    if parts[0] in ("aten", "c10d", "_c10d_functional", "prims", "torch", "heterosim"):
        parts = parts[1:]
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


def kernel_class_of(name: str, kernel_class: str = "") -> str:
    """``kernel_class`` if given, else the registered class of the op's aten base name.

    Raises :class:`UnknownKernelError` naming the op when neither is known.
    """
    if kernel_class:
        return kernel_class
    base = base_name(name)
    kc = _CLASS_OF.get(base) or _CLASS_OF.get(base.rstrip("_"))
    if kc is None:
        raise UnknownKernelError(
            f"op {name!r} has no kernel class and kernel_db does not know its aten name {base!r}; "
            f"set kernel_class in the trace or register it with "
            f"kernel_db.opmap.register_kernel_class(<class>, {base!r})"
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
