"""The names a trace is written in: dtypes, collectives, kernel classes and which op is in which. No torch.

Capture writes these names, kernel_db, ncclshim and replay read them; every layer imports them
from here, so a name means the same thing everywhere and is defined once:

- :data:`DTYPE_BYTES`: a dtype name -> bytes per element (``bf16`` 2, ``fp8`` 1, ...).
  :data:`DTYPE_OF_TORCH` names torch's dtypes in this vocabulary (what capture records);
  :data:`TORCH_DTYPE_OF` goes back (what kernel_db profiles a dtype name with). Both hold
  torch attribute names as strings, so this module stays torch-free.
- :data:`COLLECTIVES`: what a collective or p2p op's ``collective`` field holds;
  :data:`NCCL_COLLECTIVES` the five that NCCL implements as one call, :data:`P2P` send and recv.
  :func:`as_planned` says which NCCL call stands for a trace collective (``barrier``).
- :data:`KERNEL_CLASSES`: what prices a compute op in kernel_db, and the one table of which op is
  in which class (:func:`kernel_class_of`, :func:`register_kernel_class`).

Capture (``capture/opinfo.py``) records every compute op with the class :func:`kernel_class_of`
gives, and falls back on torch's op tags only for a name the table does not hold; kernel_db
(``kernel_db/opmap.py``) classifies a trace row that carries no kernel class with the same
function, and refuses a name the table does not hold. So an op is in one class everywhere, and a
custom op (a model's ``torch.library`` op) is added in one place::

    from heterosim.trace.vocab import register_kernel_class
    register_kernel_class("elementwise", "my_fused_bias_swiglu", "my_fused_bias_swiglu_backward")

Names in the table are overload-packet names, without namespace or overload: ``mm`` for
``aten.mm.default``, ``scaled_upper_triang_masked_softmax`` for
``heterosim::scaled_upper_triang_masked_softmax``. :func:`kernel_class_of` applies, in order:

1. ``gemm``, ``attention`` and ``ssm`` names keep their class in every phase (tensor-core kernels);
2. in the ``optimizer`` phase every other op is ``optimizer``;
3. the table: the name, else the name without its trailing ``_`` (``clamp_`` is ``clamp``);
4. other ``_foreach_*`` (multi-tensor apply) ops are ``elementwise``;
5. otherwise ``None``: the name is unknown.

Some entries record what capture has always recorded rather than an ideal class (``triu``,
``masked_fill_`` and ``bernoulli_`` are ``copy``: torch does not tag them pointwise); changing one
changes the traces capture writes.
"""

from __future__ import annotations

from heterosim.errors import ConfigError

__all__ = [
    "DTYPE_BYTES",
    "PACKED_WIRE_BYTES",
    "PACKED_BLOCK",
    "DTYPE_OF_TORCH",
    "TORCH_DTYPE_OF",
    "NCCL_COLLECTIVES",
    "P2P",
    "COLLECTIVES",
    "as_planned",
    "KERNEL_CLASSES",
    "kernel_class_of",
    "register_kernel_class",
    "unregister_kernel_class",
    "registered_names",
]

# ------------------------------------------------------------------------------------ dtypes
DTYPE_BYTES: dict[str, float] = {
    "fp64": 8,
    "fp32": 4,
    "tf32": 4,  # fp32 storage; tf32 is how a GEMM multiplies it
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,  # any 8-bit float: capture records every torch float8 type as fp8
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp4": 0.5,  # e2m1, two per byte (NVFP4 / MXFP4 GEMMs; their block scales are not counted here)
    "int64": 8,
    "int32": 4,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
"""Bytes per element of each dtype name. A trace op's ``dtype`` is one of these, or torch's own
name (``int16``, ``complex64``) for a dtype this vocabulary does not name."""

PACKED_WIRE_BYTES: dict[str, float] = {"nvfp4": 0.5 + 1 / 16, "nvfp4x2": 2 * (0.5 + 1 / 16),
                                      "mxfp8": 1 + 1 / 32, "mxfp8x2": 2 * (1 + 1 / 32)}
"""Block-scaled formats a collective moves as plain bytes (recorded as ``uint8``), in bytes per
element of the high-precision tensor: ``nvfp4`` is one NVFP4 copy (e2m1 data, half a byte, and an
e4m3 scale per 16 elements), ``mxfp8`` one MXFP8 copy (e4m3 data and an e8m0 scale per 32; fp8
blockwise's fp32 scale per 128 is the same 1/32 byte); ``...x2`` the row-wise and column-wise
copies together (what Transformer Engine's quantized all-gathers move for a GEMM input that its
weight gradient also reads). Names of a capture's ``scope(comm_dtype=...)``, not of any op's dtype."""
PACKED_BLOCK: dict[str, int] = {"nvfp4": 16, "mxfp8": 32}
"""Elements per scaling block of each packed format (its ``x2`` form too): a tensor of partial
blocks is not quantized for the wire (Transformer Engine gathers it in high precision)."""

DTYPE_OF_TORCH: dict[str, str] = {
    "float32": "fp32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float64": "fp64",
    "int64": "int64",
    "int32": "int32",
    "int8": "int8",
    "uint8": "uint8",
    "bool": "bool",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
}
"""torch dtype attribute name (``torch.<name>``) -> the dtype name a trace records."""

TORCH_DTYPE_OF: dict[str, str] = {
    "fp64": "float64",
    "fp32": "float32",
    "tf32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8": "float8_e4m3fn",  # a trace says fp8 for any float8: profiled as e4m3
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "int64": "int64",
    "int32": "int32",
    "int8": "int8",
    "uint8": "uint8",
    "bool": "bool",
}
"""Dtype name -> the torch dtype attribute name a kernel of that dtype runs with."""

# ------------------------------------------------------------------------------------ collectives
NCCL_COLLECTIVES: tuple[str, ...] = ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce")
"""The collectives NCCL implements as one ``ncclFunc`` each, in NCCL's order (``nccl_common.h``);
the ones its tuner has a cost model for."""

P2P: tuple[str, ...] = ("send", "recv")
"""Point-to-point ops (a trace op of kind ``p2p``)."""

COLLECTIVES: tuple[str, ...] = NCCL_COLLECTIVES + ("all_to_all", "barrier") + P2P
"""Every name a collective or p2p op's ``collective`` field may hold. NCCL runs ``all_to_all`` as
grouped send/recv and ``barrier`` as a one-element all_reduce (:func:`as_planned`)."""

_BARRIER = ("all_reduce", 4, "fp32")
"""torch.distributed.barrier on NCCL: an all_reduce of one fp32 element (ProcessGroupNCCL::barrier)."""


def as_planned(collective: str, nbytes: int, dtype: str) -> tuple[str, int, str]:
    """The NCCL call ``(collective, nbytes, dtype)`` that runs a trace collective: itself, except
    ``barrier``, which runs as an all_reduce of one fp32 element."""
    if collective == "barrier":
        return _BARRIER
    return collective, nbytes, dtype


# ------------------------------------------------------------------------------------ kernel classes
KERNEL_CLASSES: tuple[str, ...] = (
    "gemm",  # mm / addmm / bmm / linear, fp8 GEMMs included (dtype says fp8)
    "attention",  # fused (flash / efficient / cuDNN) scaled-dot-product attention, fwd or bwd
    "ssm",  # Mamba-2's fused conv + chunked SSD scan, fwd or bwd (tensor-core bmm pieces and states)
    "norm",  # layer norm / RMS norm, fwd or bwd
    "softmax",  # standalone softmax (and its backward)
    "elementwise",  # pointwise math, activations, dropout, masked fill, RoPE pieces
    "reduction",  # sum / mean / max / norm reductions
    "embedding",  # embedding lookup and its backward (index add)
    "cross_entropy",  # log-softmax + nll style losses
    "copy",  # copies, casts, cat / stack, index / gather / scatter data movement, fills
    "optimizer",  # fused or foreach optimizer math over parameters
    "comm",  # collective / p2p / wait ops (their time comes from ncclshim, not kernel_db)
)
"""Kernel classes: what prices an op in ``kernel_db``."""

_TENSOR_CORE = ("gemm", "attention", "ssm")
_OPTIMIZER_PHASE = "optimizer"  # heterosim.trace.ir.PHASES

_CLASS_OF: dict[str, str] = {}
"""Op base name -> kernel class; filled only through :func:`register_kernel_class`."""


def _check_class(kernel_class: str) -> None:
    if kernel_class not in KERNEL_CLASSES:
        raise ConfigError(f"unknown kernel class {kernel_class!r}; valid: {', '.join(KERNEL_CLASSES)}")


def register_kernel_class(kernel_class: str, *names: str) -> None:
    """Declare that ops ``names`` (overload-packet base names) run as ``kernel_class``.

    Registering a name again under the same class is a no-op; under another class it raises, as
    does a class that is not one of :data:`KERNEL_CLASSES` or a name with a
    namespace or overload in it.
    """
    _check_class(kernel_class)
    for n in names:
        if not n or "." in n or ":" in n:
            raise ConfigError(f"register the op's base name (mm for aten.mm.default), not {n!r}")
        if n in _CLASS_OF and _CLASS_OF[n] != kernel_class:
            raise ConfigError(f"duplicate kernel-class registration for {n}: {_CLASS_OF[n]} and {kernel_class}")
    for n in names:
        _CLASS_OF[n] = kernel_class


def unregister_kernel_class(*names: str) -> None:
    """Forget ``names`` (registered custom ops, e.g. at the end of a test); an unknown name raises."""
    unknown = [n for n in names if n not in _CLASS_OF]
    if unknown:
        raise ConfigError(f"cannot unregister {unknown}: no kernel class is registered for them")
    for n in names:
        del _CLASS_OF[n]


def registered_names(kernel_class: str) -> tuple[str, ...]:
    """The names registered under ``kernel_class``, sorted (what the table holds, before rules 2 and 4)."""
    _check_class(kernel_class)
    return tuple(sorted(n for n, kc in _CLASS_OF.items() if kc == kernel_class))


def kernel_class_of(name: str, phase: str = "") -> str | None:
    """Kernel class of the op with base name ``name`` run in ``phase``; ``None`` if unknown."""
    kc = _CLASS_OF.get(name)
    if kc is None and name.endswith("_"):
        kc = _CLASS_OF.get(name.rstrip("_"))
    if kc in _TENSOR_CORE:
        return kc
    if phase == _OPTIMIZER_PHASE:
        return "optimizer"
    if kc is None and name.startswith("_foreach"):
        return "elementwise"
    return kc


# ------------------------------------------------------------------------------------ the table
register_kernel_class("gemm", "mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "addbmm", "matmul", "linear")
register_kernel_class(
    "attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
    "_flash_attention_forward", "_flash_attention_backward",
    "_efficient_attention_forward", "_efficient_attention_backward", "scaled_dot_product_attention",
    "flex_attention", "flex_attention_backward",  # FlexAttention's higher-order ops (capture/flexattn.py)
    # models/: sliding-window / sink attention (heterosim:: custom ops, models/layers/window_attention.py)
    "window_attention", "window_attention_backward",
)
# models/: Mamba-2's fused conv1d + SSD scan (mamba_ssm's mamba_split_conv1d_scan_combined; heterosim:: custom ops)
register_kernel_class("ssm", "mamba_split_conv1d_scan", "mamba_split_conv1d_scan_backward")
register_kernel_class(
    "norm", "native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward",
    "native_group_norm", "native_batch_norm", "layer_norm", "rms_norm",
)
register_kernel_class(
    "softmax", "_softmax", "_softmax_backward_data", "_safe_softmax", "_masked_softmax", "_masked_softmax_backward",
    "softmax",
    # models/: Megatron's fused causal softmax (heterosim:: custom ops)
    "scaled_upper_triang_masked_softmax", "scaled_upper_triang_masked_softmax_backward",
)
register_kernel_class(
    "cross_entropy", "_log_softmax", "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward",
    "nll_loss2d_forward", "nll_loss2d_backward", "cross_entropy_loss", "nll_loss",
)
register_kernel_class("embedding", "embedding", "embedding_dense_backward", "_embedding_bag", "embedding_backward")
register_kernel_class(
    "reduction", "sum", "mean", "amax", "amin", "max", "min", "var_mean", "var", "std", "linalg_vector_norm",
    "norm", "prod", "argmax", "argmin", "logsumexp", "_foreach_norm", "topk", "cumsum", "all", "any",
)
register_kernel_class(
    "copy", "copy_", "_to_copy", "clone", "cat", "stack", "index", "index_select", "gather", "scatter",
    "scatter_add", "index_put", "index_add", "constant_pad_nd", "repeat", "repeat_interleave", "_unsafe_index",
    "_unsafe_index_put", "flip", "roll", "masked_scatter", "split_with_sizes_copy", "slice_scatter",
    "select_scatter", "narrow_copy", "_foreach_copy_", "lift_fresh_copy", "_unsafe_view", "contiguous",
    "select_backward", "slice_backward",
    # a value read back to the host (.item(), bool(t)): a one-element device-to-host copy
    "_local_scalar_dense",
    # models/: Transformer Engine's block-scaled quantizes, both copies in one pass (heterosim:: custom ops)
    "nvfp4_quantize", "mxfp8_quantize",
    # fills and factories: they write, and read nothing
    "fill_", "zero_", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones",
    "new_full", "arange", "empty", "randint",
    # not tagged pointwise by torch: capture has always recorded them as copies
    "triu", "tril", "masked_fill_", "bernoulli_", "rand_like",
)
register_kernel_class("optimizer", "_fused_adam_", "_fused_adamw_")
register_kernel_class(
    "elementwise",
    # random pointwise ops torch does not tag pointwise: elementwise kernels, so kernel_db's fusion
    # merges them as Megatron's jit-fused bias-dropout-add does
    "native_dropout", "_fused_dropout", "bernoulli",
    "add", "sub", "mul", "div", "gelu", "gelu_backward", "silu", "silu_backward", "relu", "threshold_backward",
    "tanh", "tanh_backward", "sigmoid", "exp", "log", "pow", "rsqrt", "sqrt", "neg", "where", "masked_fill",
    "native_dropout_backward", "sin", "cos", "addcmul", "addcdiv", "lerp", "clamp", "clamp_min", "maximum",
    "minimum", "eq", "ne", "lt", "gt", "ge", "le", "logical_and", "logical_not", "square", "abs", "sign", "erf",
    "reciprocal", "rsub", "remainder", "bitwise_or", "fused_bias_gelu",
)
register_kernel_class(
    "comm", "all_reduce", "allreduce_", "all_gather_into_tensor", "_allgather_base_", "reduce_scatter_tensor",
    "_reduce_scatter_base_", "broadcast_", "send", "recv_", "wait_tensor", "all_to_all_single", "barrier",
)
