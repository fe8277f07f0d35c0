"""Pre-norm transformer layers and the per-chunk stack of them (Megatron-core
``transformer/transformer_layer.py`` and ``transformer_block.py``).

A layer is::

    x = x + dropout(attn(norm1(x)) + b_proj)     # bias-dropout-add
    x = x + dropout(mlp(norm2(x)) + b_fc2)

In a hybrid model (``ModelConfig.hybrid_layer_pattern``, Megatron-core's ``MambaBlock``) each layer
is one of the two halves (``*`` attention, ``-`` MLP, ``E`` MoE) or a Mamba-2 mixer (``M``,
:mod:`models.layers.mamba`), each with its own norm and residual.

Activation recomputation follows Megatron's ``--recompute-granularity``:

- ``full`` + ``uniform``: the chunk's layers are grouped ``recompute_num_layers`` at a time and
  each group is checkpointed as a whole (only its input is kept);
- ``full`` + ``block``: the first ``recompute_num_layers`` layers of the chunk are checkpointed
  one by one, the rest keep their activations;
- ``selective``: only core attention is checkpointed (inside :class:`SelfAttention`).

Approximation: Megatron's bias-dropout-add is one jit-fused kernel; here it is separate add,
dropout and add ops (same bytes moved, more launches).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from heterosim.errors import ConfigError
from models.config import ModelConfig, TrainConfig
from models.layers.attention import SelfAttention
from models.layers.mla import MultiLatentAttention
from models.layers.linear import scaled_init_std
from models.layers.mamba import MambaMixer
from models.layers.mlp import MLP
from models.layers.moe import MoELayer
from models.layers.norms import build_norm
from models.layers.recompute import recompute

__all__ = ["TransformerLayer", "TransformerBlock", "bias_dropout_add", "dropout", "torch_dtype"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a ``params_dtype`` name (bf16, fp16, fp32)."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ConfigError(f"unknown params dtype {name!r}; valid: {sorted(_DTYPES)}") from None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout as one ``aten.native_dropout`` kernel each way (the fused kernel a GPU runs; on CPU
    ``F.dropout`` would issue bernoulli, div and mul separately)."""
    if p <= 0.0 or not training:
        return x
    return torch.native_dropout(x, p, True)[0]


def bias_dropout_add(out: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor,
                     p: float, training: bool) -> torch.Tensor:
    """``residual + dropout(out + bias)`` (Megatron's ``bias_dropout_add``)."""
    if bias is not None:
        out = out + bias
    return residual + dropout(out, p, training)


class TransformerLayer(nn.Module):
    """One decoder layer; ``layer_number`` is its global index (0-based)."""

    def __init__(self, mcfg: ModelConfig, tcfg: TrainConfig, pstate: Any, layer_number: int,
                 replicated_seed: int | None = None) -> None:
        super().__init__()
        dtype = torch_dtype(tcfg.params_dtype)
        sp = pstate.sequence_parallel
        start, end = tcfg.bf16_layers  # fp8 / fp4 context per layer (Megatron-core's get_fp8_context)
        fp8 = tcfg.fp8 is not None and start <= layer_number < mcfg.num_layers - end
        self.layer_number = layer_number
        self.hidden_dropout = mcfg.hidden_dropout
        std = mcfg.init_method_std
        norm = dict(eps=mcfg.norm_epsilon, dtype=dtype, sequence_parallel=sp)
        kind = mcfg.layer_kind(layer_number)
        self.self_attention = self.mixer = self.mlp = None
        if kind in ("transformer", "attention", "mamba"):
            self.input_layernorm = build_norm(mcfg.normalization, mcfg.hidden_size, **norm)
        attention = dict(dtype=dtype, init_std=std, fp8=fp8, selective_recompute=tcfg.recomputes("core_attn"))
        if kind == "mamba":
            self.mixer = MambaMixer(mcfg, pstate, dtype=dtype, fp8=fp8,
                                    seed=None if replicated_seed is None else replicated_seed + 104729 + layer_number)
        elif kind in ("transformer", "attention") and mcfg.multi_latent_attention:
            self.self_attention = MultiLatentAttention(
                mcfg, pstate, **attention, up_proj_recompute=tcfg.recomputes("mla_up_proj"),
                replicated_seed=None if replicated_seed is None else replicated_seed + 7919 + 2 * layer_number)
        elif kind in ("transformer", "attention"):
            self.self_attention = SelfAttention(mcfg, pstate, **attention, layer_number=layer_number)
        # Selective recomputation (models/layers/recompute.py): the MLA input norm is a norm of its
        # own in Megatron-core's spec, every other attention's is fused into its QKV GEMM.
        self.recompute_input_norm = tcfg.recomputes("layernorm") and mcfg.multi_latent_attention
        self.recompute_pre_mlp_norm = self.recompute_mlp = self.recompute_moe = False
        if kind in ("attention", "mamba"):
            return
        self.pre_mlp_layernorm = build_norm(mcfg.normalization, mcfg.hidden_size, **norm)
        if mcfg.is_moe_layer(layer_number):
            self.recompute_pre_mlp_norm, self.recompute_moe = tcfg.recomputes("layernorm"), tcfg.recomputes("moe")
            self.mlp = MoELayer(mcfg, pstate, dtype=dtype, fp8=fp8, recompute_act=tcfg.recomputes("moe_act"),
                                recompute_shared=tcfg.recomputes("shared_experts"),
                                replicated_seed=None if replicated_seed is None else replicated_seed + 1 + layer_number)
        else:
            self.recompute_mlp = tcfg.recomputes("mlp")
            self.mlp = MLP(
                mcfg.hidden_size, mcfg.ffn_size, activation=mcfg.activation, tp_group=pstate.tp_group,
                sequence_parallel=sp, bias=mcfg.add_bias_linear, dtype=dtype, init_std=std,
                out_init_std=scaled_init_std(std, mcfg.num_layers), fp8=fp8,
                async_allreduce=pstate.async_tp_allreduce, tp_comm_overlap=pstate.tp_comm_overlap,
                fused_activation=mcfg.bias_swiglu_fusion, tp_comm_aggregate=pstate.tp_comm_aggregate,
                tp_comm_sm_margin=pstate.tp_comm_sm_margin, tp_comm_fp8_buf=pstate.tp_comm_fp8_buf)

    def forward(self, x: torch.Tensor, rotary: torch.Tensor | None = None) -> torch.Tensor:
        return self.mlp_half(self.mix(x, rotary))

    def mix(self, x: torch.Tensor, rotary: torch.Tensor | None) -> torch.Tensor:
        """The attention (or Mamba) half with its norm and residual; ``x`` itself when the layer has none."""
        mixer = self.self_attention or self.mixer
        if mixer is None:
            return x
        normed = recompute(self.input_layernorm, x) if self.recompute_input_norm else self.input_layernorm(x)
        out, bias = mixer(normed, rotary)
        return bias_dropout_add(out, bias, x, self.hidden_dropout, self.training)

    def mlp_half(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP (or MoE) half with its norm and residual; ``x`` itself when the layer has none."""
        if self.mlp is None:
            return x
        if self.recompute_mlp:  # the dense MLP with its norm, fused into linear_fc1 by Transformer Engine
            out, bias = recompute(self._norm_mlp, x)
        else:
            out, bias = recompute(self.mlp, self.pre_mlp_norm(x)) if self.recompute_moe else self.mlp(self.pre_mlp_norm(x))
        return self.mlp_residual(out, bias, x)

    def pre_mlp_norm(self, x: torch.Tensor) -> torch.Tensor:
        return recompute(self.pre_mlp_layernorm, x) if self.recompute_pre_mlp_norm else self.pre_mlp_layernorm(x)

    def mlp_residual(self, out: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor) -> torch.Tensor:
        return bias_dropout_add(out, bias, residual, self.hidden_dropout, self.training)

    def _norm_mlp(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.mlp(self.pre_mlp_layernorm(x))


class TransformerBlock(nn.Module):
    """The layers ``layers`` (global indices) of one pipeline chunk, plus the final norm when
    ``post_process``. Input and output ``[s/cp (/tp with SP), b, h]``."""

    def __init__(self, mcfg: ModelConfig, tcfg: TrainConfig, pstate: Any, *, layers: range,
                 post_process: bool, replicated_seed: int | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(mcfg, tcfg, pstate, i, replicated_seed) for i in layers)
        self.recompute_method = None
        self.recompute_num_layers = 0
        if tcfg.recompute_granularity == "full":
            if tcfg.recompute_method not in ("uniform", "block"):
                raise ConfigError("--recompute-granularity full needs --recompute-method uniform "
                                  f"or block, got {tcfg.recompute_method!r}")
            n = tcfg.recompute_num_layers
            if n is None or n < 1:
                raise ConfigError("--recompute-granularity full needs --recompute-num-layers >= 1")
            self.recompute_method, self.recompute_num_layers = tcfg.recompute_method, n
        self.keep_prenorm = False
        """Keep the output before the final norm in ``prenorm_output`` (set for MTP; the caller clears it)."""
        self.prenorm_output: torch.Tensor | None = None
        self.fp8_scaling: Any = None
        """The stage's :class:`models.layers.fp8.DelayedScaling` (set by the training script once
        every chunk is built): this block is one ``fp8_autocast`` region, as in Megatron-core."""
        self.final_layernorm = None
        if post_process:
            self.final_layernorm = build_norm(
                mcfg.normalization, mcfg.hidden_size, eps=mcfg.norm_epsilon,
                dtype=torch_dtype(tcfg.params_dtype), sequence_parallel=pstate.sequence_parallel)

    def _run(self, start: int, end: int):
        def fn(x: torch.Tensor, rotary: torch.Tensor | None) -> torch.Tensor:
            for layer in self.layers[start:end]:
                x = layer(x, rotary)
            return x
        return fn

    def forward(self, x: torch.Tensor, rotary: torch.Tensor | None = None) -> torch.Tensor:
        n = len(self.layers)
        x = self.enter(x)
        if self.recompute_method == "uniform":
            k = self.recompute_num_layers
            for start in range(0, n, k):
                x = recompute(self._run(start, min(start + k, n)), x, rotary)
        elif self.recompute_method == "block":
            for i in range(n):
                if i < self.recompute_num_layers:
                    x = recompute(self._run(i, i + 1), x, rotary)
                else:
                    x = self.layers[i](x, rotary)
        else:
            for layer in self.layers:
                x = layer(x, rotary)
        return self.exit(x)

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        """What the block does before its first layer (the fp8 region's backward reduction hook)."""
        return x if self.fp8_scaling is None else self.fp8_scaling.on_backward_end(x)

    def exit(self, x: torch.Tensor) -> torch.Tensor:
        """What the block does after its last layer: the fp8 region's end, the final norm."""
        if self.fp8_scaling is not None:  # fp8_autocast exits before the final norm (Megatron-core)
            self.fp8_scaling.forward_exit()
        if self.keep_prenorm:  # what multi-token prediction continues from (models.layers.mtp)
            self.prenorm_output = x
        if self.final_layernorm is not None:
            x = self.final_layernorm(x)
        return x
