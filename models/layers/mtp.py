"""Multi-token prediction (DeepSeek-V3, arXiv:2412.19437 section 2.2) as Megatron-core's
``MultiTokenPredictionBlock`` runs it (``transformer/multi_token_prediction.py``), on the last
pipeline stage after the decoder.

MTP depth ``k`` (1-based) predicts the token ``k + 1`` places ahead. With ``h`` the previous depth's
hidden states (the decoder's for ``k = 1``, before its final norm) and the input tokens rolled left by
``k`` (the labels rolled by ``k - 1``):

1. ``e = enorm(embed(tokens))``, ``h = hnorm(h)`` (RMSNorm / LayerNorm, each its own kernel);
2. ``eh_proj``: column-parallel ``[e, h] (2h) -> h / tp``, the output gathered over TP along its last
   dim and, with sequence parallelism, scattered back to the rank's tokens
   (``gather_from_tensor_model_parallel_region``, ``scatter_to_sequence_parallel_region``);
3. one transformer layer of the decoder's kind (DeepSeek-V3: MLA + MoE), then a final norm;
4. the shared output layer and the loss against the labels rolled by ``k``, scaled by
   ``--mtp-loss-scaling-factor`` / depths and added to the main loss.

The last stage holds its own copy of the word embedding; with pipeline parallelism its gradient is
all-reduced with the first stage's over the embedding group, as Megatron-core does for MTP.
NB: rolling the labels is a copy per depth (Megatron-core's ``roll_tensor``); the rolled-in last
position is masked there, here it stays (the same kernels and traffic).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from models.config import ModelConfig, TrainConfig
from models.layers.linear import ColumnParallelLinear
from models.layers.mappings import group_rank, group_size, scatter_to_sp
from models.layers.norms import build_norm

__all__ = ["MTPLayer", "gather_last_dim"]


class _GatherLastDim(torch.autograd.Function):
    """All-gather over TP along the last dim; backward keeps the rank's slice (Megatron's
    ``gather_from_tensor_model_parallel_region``)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        tp = group_size(group)
        out = x.new_empty((tp * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return torch.cat(torch.chunk(out, tp, dim=0), dim=-1)

    @staticmethod
    def backward(ctx, grad):
        tp, rank = group_size(ctx.group), group_rank(ctx.group)
        return torch.chunk(grad, tp, dim=-1)[rank].contiguous(), None


def gather_last_dim(x: torch.Tensor, group: Any) -> torch.Tensor:
    """``[.., n / tp]`` per rank -> ``[.., n]`` on every rank (identity without TP)."""
    return _GatherLastDim.apply(x, group) if group_size(group) > 1 else x


class MTPLayer(nn.Module):
    """One MTP depth: ``(hidden [s(/tp), b, h], token embeddings [s(/tp), b, h]) -> hidden``; the
    caller applies the output layer and the loss (module docstring)."""

    def __init__(self, mcfg: ModelConfig, tcfg: TrainConfig, pstate: Any, *, dtype: torch.dtype,
                 replicated_seed: int | None = None) -> None:
        super().__init__()
        from models.transformer import TransformerLayer  # the decoder's layer kind (imports this package)

        sp, h = pstate.sequence_parallel, mcfg.hidden_size
        norm = dict(eps=mcfg.norm_epsilon, dtype=dtype, sequence_parallel=sp)
        self.tp_group, self.sp = pstate.tp_group, sp and pstate.tp_size > 1
        self.enorm = build_norm(mcfg.normalization, h, **norm)
        self.hnorm = build_norm(mcfg.normalization, h, **norm)
        self.eh_proj = ColumnParallelLinear(2 * h, h, tp_group=pstate.tp_group, sequence_parallel=sp, bias=False,
                                            dtype=dtype, init_std=mcfg.init_method_std,
                                            async_allreduce=pstate.async_tp_allreduce)
        # Megatron-core builds the MTP layer from the decoder's layer spec: here the decoder's last
        # layer's kind (DeepSeek-V3: MLA + MoE) and precision.
        self.transformer_layer = TransformerLayer(mcfg, tcfg, pstate, mcfg.num_layers - 1, replicated_seed)
        self.final_layernorm = build_norm(mcfg.normalization, h, **norm)

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor, rotary: torch.Tensor | None) -> torch.Tensor:
        x = torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1)
        x = gather_last_dim(self.eh_proj(x), self.tp_group)  # [s, b, h]
        if self.sp:
            x = scatter_to_sp(x, self.tp_group)
        return self.final_layernorm(self.transformer_layer(x, rotary))
