"""What Transformer Engine runs around an fp8 or fp4 GEMM besides the GEMM itself (``--fp8-format``,
``--fp4-format``).

The GEMMs of a transformer layer are marked fp8 for pricing (:func:`models.layers.linear.gemm_scope`)
while their tensors stay in the activation dtype here. Transformer Engine 1.x (NeMo 24.09 ships TE
1.11; ``transformer_engine/pytorch/module/{base,linear,layernorm_linear,layernorm_mlp}.py``) also:

- *casts* each GEMM operand it does not receive in fp8: ``cast_to_fp8`` reads the bf16 tensor and
  writes one byte per element (its amax is taken in the same kernel);
- *transposes* fp8 operands for the weight-gradient GEMM (Hopper's fp8 tensor-core GEMMs take
  only the "TN" layout): ``fp8_transpose`` reads and writes one byte per element, or
  ``fp8_cast_transpose_fused`` does cast and transpose in one pass;
- *moves fp8 on the wire* where it overlaps TP communication with userbuffers: ``initialize_ub``
  allocates the buffers of ``layers_all_gather_overlap`` (``qkv_fprop``, ``qkv_dgrad``,
  ``proj_dgrad``, ``fc1_fprop``, ``fc1_dgrad``, ``fc2_dgrad``) as ``torch.uint8`` in fp8 runs, so
  those all-gathers move 1 byte per element (reduce-scatters stay in bf16 unless a recipe sets
  ``fp8_buf`` on a pipelined one).

Which operand arrives in fp8: the layer norm before QKV and FC1 writes fp8 (TE's
``LayerNormLinear`` / ``LayerNormMLP`` fuse the cast into the norm), so does the activation before
FC2 (fused ``fp8_gelu`` / ``srelu`` / ``swiglu``); the attention output before the projection
does not (TE ``Linear`` casts it). Gradients: a column-parallel layer's output gradient is cast and
transposed (``fp8_cast_transpose_fused``; before FC1 with GeLU it is fused into the activation's
backward, ``fp8_cast_transpose_bgrad_dgelu_fused``, other activations run theirs in bf16 first); a
row-parallel layer's, sequence-split, is cast on the rank's shard, all-gathered in fp8 and
transposed after (``grad_output_preprocess``).

Scaling recipes (``--fp8-recipe``, Megatron-core's flag; :func:`recipe` sets it around a training
step as TE's ``fp8_autocast(fp8_recipe=...)`` does):

- ``delayed`` (TE's ``DelayedScaling``, the default): a tensor's scale comes from the amax history
  of earlier iterations, so a cast is one kernel that also records the new amax (above);
- ``tensorwise`` (``Float8CurrentScaling``, "fp8-cs"): the scale comes from the tensor's own amax,
  so it must be known before the cast (TE 2.x ``csrc/quantizer.cpp``,
  ``Float8CurrentScalingQuantizer::quantize``): an amax kernel reads the tensor, a tiny kernel
  turns the amax into the scale, then the cast reads the tensor again. A norm or activation whose
  output feeds an fp8 GEMM writes it in bf16 and takes its amax in the same kernel
  (``FUSED_NORM_AMAX_FP8`` / ``FUSED_ACTIVATION_AMAX_FP8`` in ``csrc/extensions/normalization.cpp``
  and ``activation.cpp``), then the scale and the cast follow: the fusion that saved the cast under
  delayed scaling is gone. Where the quantized tensor is a sequence-parallel shard about to be
  all-gathered (the input of a column-parallel layer; the output gradient of a row-parallel one),
  the ranks must agree on one scale: the amax is all-reduced (MAX) over the TP group first
  (``Linear._customize_quantizers_float8_current_scaling``, ``module/linear.py``).

- ``mxfp8`` / ``blockwise`` (``MXFP8BlockScaling``, ``Float8BlockScaling``) and ``nvfp4``
  (``NVFP4BlockScaling``, ``--fp4-format e2m1 --fp4-recipe nvfp4``, fp4 GEMMs): block scales, so
  every cast is one quantize writing both copies (:mod:`models.layers.block_scaling`): no separate
  transposes and no fused-norm shortcut; ``nvfp4`` takes an amax pass first (with current
  scaling's TP agreement), the fp8 ones none; all-gathers of quantized tensors move the copies and
  their scales.

Delayed scaling's bookkeeping (:class:`DelayedScaling`): TE registers every fp8 module's amaxes in
one global buffer per ``fp8_autocast`` (recipe and group), and at each exit of the outermost
``fp8_autocast`` (``FP8GlobalStateManager.reduce_and_update_fp8_tensors``, TE 1.x ``pytorch/fp8.py``)
concatenates the current amaxes of *all* registered modules (``torch.cat``), all-reduces them (MAX,
synchronously) over the autocast's ``fp8_group`` and runs the fused amax-history and scale update
(``tex.fused_amax_and_scale_update_after_reduction``); the same runs for the gradients' amaxes when
the region's backward ends (``hook_for_bwd_amax_reduction``, a multi-grad hook). Megatron-core
wraps each ``TransformerBlock.forward`` (each model chunk, each micro-batch) in ``fp8_autocast``
with ``fp8_group`` its amax reduction group, the TP x DP x CP ranks of the stage
(``ParallelConfig.amax_reduction_group``). A GEMM has three forward amaxes (input, weight, output:
TE's ``scaling_fwd``) and two backward ones (``scaling_bwd``).

Approximations: a fused cast-transpose is run here as a cast then a transpose of the fp8 result
(5 instead of 4 bytes per element, one launch more); the per-iteration transpose of fp8 weights
(``fp8_params``: once per weight per iteration, ~1% of the casts' bytes) and the weights' casts
(once per weight per iteration in either recipe) are left out. The fused amax update is run as one
reduction over the amax history (it also rolls the history: ~1 MB more written per update at
these sizes).
"""

from __future__ import annotations

import contextlib
from contextlib import nullcontext
from typing import Any, Iterator

import torch
import torch.distributed as dist

from heterosim.annotate import get_annotator
from models.layers import block_scaling

__all__ = ["FP8", "RECIPES", "FP8_RECIPES", "FP4_RECIPES", "AMAX_HISTORY_LEN", "recipe", "delayed", "current_scaling",
           "block_scaled", "split_quantize_fused", "gemm_dtype", "cast", "transpose", "fp8_like", "wire", "DelayedScaling"]

FP8 = torch.float8_e4m3fn
"""The storage type of the casts (e4m3 and e5m2 both take one byte; pricing needs no more)."""


def wire(fp8: bool, usage: str = "both"):
    """Context in which collectives move quantized tensors (TE's fp8 userbuffers, its quantized
    all-gathers); a no-op without ``fp8``. ``delayed`` / ``tensorwise``: one byte per element.
    Block-scaled recipes: the copies and their scales (:mod:`models.layers.block_scaling`) per
    ``usage``: ``both`` (row- and column-wise: a GEMM input and its weight-gradient operand),
    ``columnwise`` (the weight-gradient copy alone), ``output`` (a GEMM output written narrow for
    a reduction, TE's ``fp8_buf``: the block-scaled recipes have none, so no narrowing) or ``param``
    (the distributed optimizer's gather of fp8 weights: Megatron-core gathers MXFP8 weights through
    the bf16 gradient buffer and quantizes them after, ``reuse_grad_buf_for_mxfp8_param_ag``, so the
    block-scaled recipes move the buffer's own width)."""
    if usage not in WIRE_USAGES:
        raise ValueError(f"unknown wire usage {usage!r}; valid: {', '.join(WIRE_USAGES)}")
    if not fp8:
        return nullcontext()
    packed = _WIRE[_RECIPE[0]]
    if packed is None:
        return get_annotator().scope(comm_dtype="fp8")
    if usage in ("output", "param"):
        return nullcontext()
    return get_annotator().scope(comm_dtype=packed + "x2" if usage == "both" else packed)


WIRE_USAGES: tuple[str, ...] = ("both", "columnwise", "output", "param")
"""What a collective in :func:`wire` moves of a quantized tensor."""
FP8_RECIPES: tuple[str, ...] = ("delayed", "tensorwise", "mxfp8", "blockwise")
"""Megatron-core's ``--fp8-recipe`` names modelled."""
FP4_RECIPES: tuple[str, ...] = ("nvfp4",)
"""Megatron-core's ``--fp4-recipe`` names modelled."""
RECIPES: tuple[str, ...] = FP8_RECIPES + FP4_RECIPES
"""Every scaling recipe modelled."""
_WIRE: dict[str, str | None] = {"delayed": None, "tensorwise": None, "mxfp8": "mxfp8", "blockwise": "mxfp8",
                                "nvfp4": "nvfp4"}
"""Recipe -> the packed wire format of its quantized all-gathers (``PACKED_WIRE_BYTES``; the
blockwise recipe's fp32 scale per 128 values is MX's 1/32 byte per value too); None: plain fp8."""

_RECIPE = ["delayed"]

AMAX_HISTORY_LEN = 1024
"""Amaxes kept per fp8 tensor under delayed scaling: NeMo's ``fp8_amax_history_len`` default (1024,
``megatron_gpt_model.py``), which the DGX H100 recipes keep."""


@contextlib.contextmanager
def recipe(name: str) -> Iterator[None]:
    """Casts inside follow scaling recipe ``name`` (one of :data:`RECIPES`)."""
    if name not in RECIPES:
        raise ValueError(f"unknown fp8 recipe {name!r}; valid recipes: {', '.join(RECIPES)}")
    old, _RECIPE[0] = _RECIPE[0], name
    try:
        yield
    finally:
        _RECIPE[0] = old


def delayed() -> bool:
    """Whether scales come from an amax history (``delayed``): the norms and activations before the
    GEMMs write fp8 themselves, and :class:`DelayedScaling` reduces the amaxes."""
    return _RECIPE[0] == "delayed"


def current_scaling() -> bool:
    """Whether casts take each tensor's own amax first (``tensorwise``, ``nvfp4``)."""
    return _RECIPE[0] in ("tensorwise", "nvfp4")


def block_scaled() -> bool:
    """Whether one quantize writes both copies (``mxfp8``, ``blockwise``, ``nvfp4``): no transposes."""
    return _WIRE[_RECIPE[0]] is not None


def split_quantize_fused() -> bool:
    """Whether Transformer Engine quantizes the splits of a grouped GEMM's operand (``GroupedLinear``'s
    ``tex.split_quantize``, one split per expert) in one kernel: delayed scaling
    (``nvte_multi_cast_transpose``) and NVFP4 (``split_quantize_nvfp4_impl``) do; current scaling,
    MXFP8 and blockwise quantize each split on its own (``multi_tensor_quantize_impl``: "only have
    fused kernel for FP8 delayed scaling"; TE ``pytorch/csrc/extensions/cast.cpp``)."""
    return _RECIPE[0] in ("delayed", "nvfp4")


def gemm_dtype() -> str:
    """The dtype a low-precision GEMM is recorded in under the current recipe: ``fp4`` or ``fp8``."""
    return "fp4" if _RECIPE[0] == "nvfp4" else "fp8"


def cast(x: torch.Tensor, *, amax_taken: bool = False, amax_group: Any = None) -> torch.Tensor:
    """``cast_to_fp8``: ``x`` read in its dtype, written in fp8 (same shape). Under current scaling
    the scale is computed first: the amax of ``x`` (one reduction over it, unless ``amax_taken``:
    the kernel that wrote ``x`` took it), all-reduced (MAX) over ``amax_group`` if one is given,
    then turned into the scale (module docstring). Block-scaled recipes write both copies in one
    quantize (:mod:`models.layers.block_scaling`; the row-wise data is returned): ``nvfp4`` after an
    amax pass of its own (TE fuses no NVFP4 amax into a norm or an activation), ``mxfp8`` and
    ``blockwise`` with no amax at all (each block's scale comes from the block)."""
    if _RECIPE[0] == "nvfp4":
        amax = torch.linalg.vector_norm(x, float("inf"), dtype=torch.float32).reshape(1)
        if amax_group is not None:
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=amax_group)
        return block_scaling.nvfp4_quantize(x)[0]
    if block_scaled():
        return block_scaling.mxfp8_quantize(x)[0]
    if current_scaling():
        amax = (x.new_empty((1,), dtype=torch.float32) if amax_taken
                else torch.linalg.vector_norm(x, float("inf"), dtype=torch.float32).reshape(1))
        if amax_group is not None:
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=amax_group)
        torch.reciprocal(amax)  # nvte_compute_scale_from_amax: scale and its inverse, one tiny kernel
    return x.to(FP8)


def transpose(x8: torch.Tensor) -> torch.Tensor:
    """``fp8_transpose`` of ``x8`` seen as a matrix ``[rows, last dim]``: ``[last dim, rows]``.
    Under a block-scaled recipe nothing runs: the quantize wrote the column-wise copy (``x8`` is
    returned)."""
    if block_scaled():
        return x8
    return x8.reshape(-1, x8.shape[-1]).t().contiguous()


def fp8_like(x: torch.Tensor) -> torch.Tensor:
    """An fp8 tensor shaped like ``x``, standing for an operand TE holds in fp8 (the norm's or the
    activation's fused output, an fp8 all-gather buffer); allocating it runs no kernel."""
    return torch.empty(x.shape, dtype=FP8, device=x.device)


class DelayedScaling:
    """One pipeline stage's delayed-scaling state: the amax histories of its ``num_gemms`` fp8 GEMMs
    (all model chunks) and the group their amaxes are all-reduced over (module docstring).

    :meth:`forward_exit` runs what TE runs when ``fp8_autocast`` exits; :meth:`on_backward_end`
    returns its input unchanged and runs the backward reduction when the gradient reaches it (apply
    it to the region's input). Both do nothing under current scaling."""

    @classmethod
    def for_stage(cls, chunks: Any, group: Any) -> "DelayedScaling":
        """The state of a stage whose model chunks are ``chunks``: one GEMM per fp8 linear layer
        (a module with ``fp8`` set and a 2-D ``weight``), one per local expert for each of an fp8
        MoE layer's two expert weights (TE's ``GroupedLinear``: ``num_gemms`` = experts)."""
        n = 0
        for m in (mod for c in chunks for mod in c.modules()):
            if not getattr(m, "fp8", False):
                continue
            w = getattr(m, "weight", None)
            if isinstance(w, torch.Tensor) and w.dim() == 2:
                n += 1
            elif isinstance(getattr(m, "fc1", None), torch.Tensor):  # MoE experts [local, in, out]
                n += m.fc1.shape[0] + m.fc2.shape[0]
        return cls(n, group)

    def __init__(self, num_gemms: int, group: Any) -> None:
        self.num_gemms, self.group = num_gemms, group
        # On the default device, where the model's parameters are made (models/).
        self.history = {fwd: torch.zeros(AMAX_HISTORY_LEN, (3 if fwd else 2) * num_gemms, dtype=torch.float32)
                        for fwd in (True, False)}

    def reduce_and_update(self, forward: bool) -> None:
        """``reduce_and_update_fp8_tensors``: concatenate the current amaxes, all-reduce them (MAX)
        over the group when it has more than one rank, update histories and scales."""
        if not delayed() or not self.num_gemms:
            return
        hist = self.history[forward]
        amax = hist[0].clone()  # torch.cat of the registered modules' current amaxes
        if self.group is not None and dist.get_world_size(self.group) > 1:
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.group)
        torch.amax(hist, dim=0)  # the fused amax-history and scale update reads the whole history

    def forward_exit(self) -> None:
        self.reduce_and_update(forward=True)

    def on_backward_end(self, x: torch.Tensor) -> torch.Tensor:
        return _BackwardReduction.apply(x, self) if x.requires_grad else x


class _BackwardReduction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, state):
        ctx.state = state
        return x

    @staticmethod
    def backward(ctx, g):
        ctx.state.reduce_and_update(forward=False)
        return g, None
