"""Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434; DeepSeek-V3, arXiv:2412.19437) as
Megatron-core's ``MLASelfAttention`` runs it (``transformer/multi_latent_attention.py``, with the
Transformer Engine layer spec of ``models/gpt/gpt_layer_specs.py``).

Per layer, with ``np = heads / tp`` heads per TP rank and the input ``x [s/tp, b, h]`` (sequence
parallel) or ``[s, b, h]``:

1. down projections, with weights replicated on every TP rank (TE ``Linear`` in ``duplicated``
   mode) applied to the rank's own tokens: ``q_c = x W_dq`` (``[.., q_lora_rank]``) and
   ``[c_kv, k_pe] = x W_dkv`` (``[.., kv_lora_rank + rope dim]``); with sequence parallelism their
   gradients are summed over TP like a norm's (``param.sequence_parallel``);
2. RMSNorm of ``q_c`` and of ``c_kv``; the rotary key part ``k_pe`` is all-gathered over TP;
3. up projections, column-parallel over heads (they gather the sequence like any column-parallel
   layer): ``q = q_c W_uq`` -> ``[s, b, np, qk_head_dim + rope dim]`` and ``kv = c_kv W_ukv`` ->
   ``[s, b, np, qk_head_dim + v_head_dim]`` (without ``q_lora_rank`` the query is one
   column-parallel projection of ``x``);
4. RoPE on the rotary parts; the key is ``[k_nope, k_pe]`` with the one ``k_pe`` of a token
   expanded to every head; causal attention of ``qk_head_dim + rope dim`` query/key heads over
   ``v_head_dim`` value heads (one fused kernel each way);
5. output projection, row-parallel: ``[s, b, np * v_head_dim] -> [s(/tp), b, h]``.

NB: the attention kernel is recorded with the value heads zero-padded to the query/key head dim
(PyTorch's fused CPU kernel takes one head dim; cuDNN's and FlashAttention-3's take two), so its
FLOPs count ``2 (dqk + dqk)`` instead of ``2 (dqk + dv)`` per score: +20% of the attention
kernel's for DeepSeek-V3's 192 / 128 (~1-2% of a layer's time), plus the pad and slice copies.
NB: the down projections run inside Megatron-core's ``fp8_autocast`` like the other linear layers
and are marked fp8 here, without the casts TE runs around them (their inputs are the rank's own
tokens, 1/tp of a column-parallel layer's); the q/kv norms are kernels of their own before the up
projections, as in TE's ``LayerNormColumnParallelLinear`` (a norm kernel, then the GEMM); the
TP userbuffer overlap (``--tp-comm-overlap``) is not applied to MLA's projections. Context
parallelism and the unfused attention backend are not modelled with MLA.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from heterosim.errors import ConfigError
from models.config import ModelConfig
from models.layers.attention import core_attention
from models.layers.linear import ColumnParallelLinear, RowParallelLinear, gemm_scope, init_replicated, scaled_init_std
from models.layers.mappings import all_gather_dim0
from models.layers.norms import RMSNorm
from models.layers.recompute import recompute
from models.layers.rope import apply_rotary

__all__ = ["MultiLatentAttention"]


class _Replicated(nn.Module):
    """``x @ W^T`` with ``W`` whole on every TP rank (TE ``Linear``, ``parallel_mode="duplicated"``)."""

    def __init__(self, n_in: int, n_out: int, *, dtype: torch.dtype, init_std: float, fp8: bool,
                 sequence_parallel: bool, seed: int | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in, dtype=dtype))
        init_replicated(init_std, seed)(self.weight)  # the same on every TP rank
        self.weight.sequence_parallel = sequence_parallel  # tokens split over TP: grads summed over TP
        self.weight.fp8_weight = fp8
        self.fp8 = fp8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with gemm_scope(self.fp8):
            return torch.matmul(x, self.weight.t())


class MultiLatentAttention(nn.Module):
    """``x [s(/tp), b, h] -> (out [s(/tp), b, h], bias)``: one layer's MLA (module docstring)."""

    def __init__(self, mcfg: ModelConfig, pstate: Any, *, dtype: torch.dtype, init_std: float,
                 fp8: bool, selective_recompute: bool, up_proj_recompute: bool = False,
                 replicated_seed: int | None = None) -> None:
        super().__init__()
        tp, heads = pstate.tp_size, mcfg.num_attention_heads
        if heads % tp:
            raise ConfigError(f"attention heads {heads} must be divisible by tensor-parallel size {tp}")
        if pstate.cp_size > 1 or mcfg.attention_backend == "unfused":
            raise ConfigError("--multi-latent-attention runs with one fused attention kernel and no "
                              "context parallelism (models/layers/mla.py); give --context-parallel-size 1 "
                              "and --attention-backend auto, flash or fused")
        self.np, self.tp_group, self.sp = heads // tp, pstate.tp_group, pstate.sequence_parallel
        self.dn, self.dr, self.dv = mcfg.qk_head_dim, mcfg.qk_pos_emb_head_dim, mcfg.v_head_dim
        self.kv_lora = mcfg.kv_lora_rank
        self.rope_fusion, self.selective_recompute = mcfg.rope_fusion, selective_recompute
        self.up_proj_recompute = up_proj_recompute  # --recompute-modules mla_up_proj
        h, sp = mcfg.hidden_size, self.sp
        col = dict(tp_group=pstate.tp_group, sequence_parallel=sp, bias=False, dtype=dtype, init_std=init_std,
                   fp8=fp8, async_allreduce=pstate.async_tp_allreduce)
        rep = dict(dtype=dtype, init_std=init_std, fp8=fp8, sequence_parallel=sp)
        seed = (lambda i: None if replicated_seed is None else replicated_seed + i)  # noqa: E731
        norm = dict(eps=mcfg.norm_epsilon, dtype=dtype, sequence_parallel=sp)
        q_out = heads * (self.dn + self.dr)
        if mcfg.q_lora_rank:
            self.linear_q_down_proj = _Replicated(h, mcfg.q_lora_rank, **rep, seed=seed(0))
            self.q_layernorm = RMSNorm(mcfg.q_lora_rank, **norm)
            self.linear_q_up_proj = ColumnParallelLinear(mcfg.q_lora_rank, q_out, **col)
        else:
            self.linear_q_proj = ColumnParallelLinear(h, q_out, **col)
        self.linear_kv_down_proj = _Replicated(h, self.kv_lora + self.dr, **rep, seed=seed(1))
        self.kv_layernorm = RMSNorm(self.kv_lora, **norm)
        self.linear_kv_up_proj = ColumnParallelLinear(self.kv_lora, heads * (self.dn + self.dv), **col)
        self.linear_proj = RowParallelLinear(
            heads * self.dv, h, tp_group=pstate.tp_group, sequence_parallel=sp, bias=False, dtype=dtype,
            init_std=scaled_init_std(init_std, mcfg.num_layers), fp8=fp8)

    def forward(self, x: torch.Tensor, rotary: torch.Tensor | None = None):
        # Down projections (replicated over TP); the rest up to the core attention is what
        # Megatron-core's mla_up_proj recomputation re-runs (qkv_up_proj_and_rope_apply).
        q_c = self.linear_q_down_proj(x) if hasattr(self, "linear_q_up_proj") else x
        kv_c, k_pe = torch.split(self.linear_kv_down_proj(x), [self.kv_lora, self.dr], dim=-1)
        if self.sp:
            k_pe = all_gather_dim0(k_pe.contiguous(), self.tp_group)  # [s, b, dr]
        args = (q_c, kv_c.contiguous(), k_pe, rotary)
        q, k, v = recompute(self._up, *args) if self.up_proj_recompute else self._up(*args)
        s, b = q.shape[:2]
        ctx = recompute(core_attention, q, k, v) if self.selective_recompute else core_attention(q, k, v)
        ctx = ctx.view(s, b, self.np, self.dn + self.dr)[..., :self.dv].reshape(s, b, self.np * self.dv)
        return self.linear_proj(ctx)

    def _up(self, q_c: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor,
            rotary: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Up projections, RoPE and the concatenations: queries, keys and values ``[s, b, np, dn + dr]``.
        NB: with SP the up projections all-gather their latents themselves (ColumnParallelLinear), so
        a recomputation re-runs those all-gathers, where Megatron-core gathers the latents once
        before its checkpoint: with --recompute-modules mla_up_proj this adds two small all-gathers
        (q_lora_rank and kv_lora_rank values a token) to each layer's backward."""
        if hasattr(self, "linear_q_up_proj"):
            q = self.linear_q_up_proj(self.q_layernorm(q_c))  # [s, b, np * (dn + dr)]
        else:
            q = self.linear_q_proj(q_c)
        kv = self.linear_kv_up_proj(self.kv_layernorm(kv_c))  # [s, b, np * (dn + dv)]
        s, b = q.shape[:2]
        q_nope, q_pe = torch.split(q.view(s, b, self.np, self.dn + self.dr), [self.dn, self.dr], dim=-1)
        k_nope, v = torch.split(kv.view(s, b, self.np, self.dn + self.dv), [self.dn, self.dv], dim=-1)
        k_pe = k_pe.unsqueeze(2)  # [s, b, 1, dr]
        if rotary is not None:
            q_pe = apply_rotary(q_pe, rotary, fused=self.rope_fusion)
            k_pe = apply_rotary(k_pe, rotary, fused=self.rope_fusion)
        q = torch.cat([q_nope, q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(s, b, self.np, self.dr)], dim=-1)
        return q, k, F.pad(v, (0, self.dn + self.dr - self.dv))  # NB in the module docstring
