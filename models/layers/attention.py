"""Self-attention with TP-split heads, GQA, RoPE and context parallelism (Megatron-core
``transformer/attention.py`` + ``dot_product_attention``).

Per TP rank: ``np = heads/tp`` query heads and ``ng = query_groups/tp`` K/V heads. The fused QKV
projection is laid out per query group as ``[q * (np/ng), k, v] * d`` (Megatron's
``linear_qkv``), then split. Core attention follows ``ModelConfig.attention_backend``:

- ``flash``: ``F.scaled_dot_product_attention`` with ``enable_gqa`` (no K/V expansion copy),
  which on CPU runs the fused ``aten._scaled_dot_product_flash_attention_for_cpu`` kernel and
  its backward, the counterpart of the flash kernel a GPU run uses. Attention dropout is 0
  (flash kernels in Megatron LLM recipes run without it). With context parallelism the core
  attention is one of :mod:`models.layers.context_parallel`'s three schemes.
- ``unfused``: :class:`models.layers.unfused_attention.CoreAttention` (Megatron-LM 2020-21:
  baddbmm, fused scale-mask-softmax, attention dropout, bmm); no context parallelism.

A layer with a sliding window or attention sinks (GPT-OSS) runs its core attention as
:mod:`models.layers.window_attention`'s fused op. Selective recompute checkpoints the core
attention of either backend. With ``qk_layernorm`` each
head's query and key are normalized over the head dim (one norm kernel each, weights shared by the
heads and summed over TP like a sequence-parallel norm's, as Megatron-core all-reduces
``q_layernorm`` / ``k_layernorm`` gradients) before RoPE.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from heterosim.errors import ConfigError
from models.config import ModelConfig
from models.layers.context_parallel import cp_attention
from models.layers.linear import ColumnParallelLinear, RowParallelLinear, scaled_init_std
from models.layers.norms import build_norm
from models.layers.recompute import recompute
from models.layers.rope import apply_rotary
from models.layers.unfused_attention import CoreAttention
from models.layers.window_attention import window_attention

__all__ = ["SelfAttention", "core_attention"]


def core_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of ``q [s, b, np, d]`` over ``k [s, b, ng, d]``, ``v [s, b, ng, dv]`` ->
    ``[s, b, np*dv]`` (``dv`` = ``d`` but for MLA)."""
    s, b, np_ = q.shape[:3]
    qh, kh, vh = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [b, heads, s, d]
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=kh.shape[1] != np_)
    return out.permute(2, 0, 1, 3).reshape(s, b, np_ * v.shape[-1])


class SelfAttention(nn.Module):
    """``x [s(/tp), b, h] -> (out [s(/tp), b, h], bias)`` for one transformer layer."""

    def __init__(self, mcfg: ModelConfig, pstate: Any, *, dtype: torch.dtype, init_std: float,
                 fp8: bool, selective_recompute: bool, layer_number: int = 0) -> None:
        super().__init__()
        tp = pstate.tp_size
        heads, groups, d = mcfg.num_attention_heads, mcfg.num_kv_heads, mcfg.head_dim
        if heads % groups:
            raise ConfigError(f"num_attention_heads {heads} must be a multiple of "
                              f"num_query_groups {groups}")
        if heads % tp or groups % tp:
            raise ConfigError(f"attention heads {heads} and query groups {groups} must both be "
                              f"divisible by tensor-parallel size {tp}")
        self.np, self.ng, self.d = heads // tp, groups // tp, d
        self.pstate = pstate
        mcfg.check_attention(pstate.cp_size)
        if mcfg.attention_backend == "unfused":
            self.core_attention = CoreAttention(seq_length=mcfg.seq_length, dropout=mcfg.attention_dropout)
        else:
            self.core_attention = None
        self.selective_recompute = selective_recompute
        self.rope_fusion = mcfg.rope_fusion
        sp = pstate.sequence_parallel
        self.linear_qkv = ColumnParallelLinear(
            mcfg.hidden_size, (heads + 2 * groups) * d, tp_group=pstate.tp_group,
            sequence_parallel=sp, bias=mcfg.add_bias_linear, dtype=dtype, init_std=init_std, fp8=fp8,
            async_allreduce=pstate.async_tp_allreduce, tp_comm_overlap=pstate.tp_comm_overlap,
            tp_comm_aggregate="qkv_fprop" in pstate.tp_comm_aggregate)
        self.linear_proj = RowParallelLinear(
            heads * d, mcfg.hidden_size, tp_group=pstate.tp_group, sequence_parallel=sp,
            bias=mcfg.add_bias_linear, dtype=dtype,
            init_std=scaled_init_std(init_std, mcfg.num_layers), fp8=fp8,
            tp_comm_overlap=pstate.tp_comm_overlap, tp_comm_aggregate="proj_dgrad" in pstate.tp_comm_aggregate,
            tp_comm_sm_margin=dict(pstate.tp_comm_sm_margin).get("proj_fprop", 0),
            tp_comm_fp8_buf="proj_fprop" in pstate.tp_comm_fp8_buf)
        self.window = mcfg.attention_window(layer_number)
        self.softmax_offset = None  # attention sinks: one logit per head of this rank (fp32)
        if mcfg.softmax_type == "learnable":
            self.softmax_offset = nn.Parameter(torch.zeros(self.np))
            self.softmax_offset.tensor_model_parallel = tp > 1
        if (self.window is not None or self.softmax_offset is not None) and (
                pstate.cp_size > 1 or mcfg.attention_backend == "unfused"):
            raise ConfigError("sliding-window attention and attention sinks run as one fused kernel without "
                              "context parallelism (models/layers/window_attention.py); give "
                              "--context-parallel-size 1 and a fused --attention-backend")
        self.q_layernorm = self.k_layernorm = None
        if mcfg.qk_layernorm:
            norm = dict(eps=mcfg.norm_epsilon, dtype=dtype, sequence_parallel=tp > 1)
            self.q_layernorm = build_norm(mcfg.normalization, d, **norm)
            self.k_layernorm = build_norm(mcfg.normalization, d, **norm)

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.window is not None or self.softmax_offset is not None:
            return window_attention(q, k, v, window=self.window, sinks=self.softmax_offset)
        if self.core_attention is not None:
            return self.core_attention(q, k, v)
        if self.pstate.cp_size > 1:
            return cp_attention(q, k, v, self.pstate)
        return core_attention(q, k, v)

    def forward(self, x: torch.Tensor, rotary: torch.Tensor | None = None):
        mixed = self.linear_qkv(x)  # [s, b, ng * (np/ng + 2) * d]
        s, b = mixed.shape[:2]
        per = self.np // self.ng
        mixed = mixed.view(s, b, self.ng, (per + 2) * self.d)
        q, k, v = torch.split(mixed, [per * self.d, self.d, self.d], dim=-1)
        q = q.reshape(s, b, self.np, self.d)  # [s, b, np, d]
        if self.q_layernorm is not None:
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        if rotary is not None:
            q = apply_rotary(q, rotary, fused=self.rope_fusion)
            k = apply_rotary(k, rotary, fused=self.rope_fusion)
        if self.selective_recompute:
            ctx = recompute(self._core, q, k, v)
        else:
            ctx = self._core(q, k, v)
        return self.linear_proj(ctx)
