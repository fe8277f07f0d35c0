"""The dense MLP block (Megatron-core ``transformer/mlp.py``): column-parallel ``linear_fc1``,
activation, row-parallel ``linear_fc2``.

Activations: ``gelu`` (tanh approximation, GPT-3), ``squared_relu`` (Nemotron, So et al. 2021
arXiv:2109.08668) and ``swiglu`` (Shazeer 2020 arXiv:2002.05202; LLaMA). For SwiGLU ``linear_fc1``
produces gate and up halves in one GEMM (``[2 * ffn/tp, h]`` per rank) and the activation is
``silu(gate) * up``, as Megatron's ``gated_linear_unit``, by default in Megatron's fused kernels
(:func:`models.layers.fusions.swiglu`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from heterosim.errors import ConfigError
from models.layers.fusions import swiglu as fused_swiglu
from models.layers.linear import ColumnParallelLinear, RowParallelLinear

__all__ = ["MLP", "activation_fn", "ACTIVATIONS"]


def _swiglu(x: torch.Tensor) -> torch.Tensor:
    gate, up = torch.chunk(x, 2, dim=-1)
    return F.silu(gate) * up


def _squared_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.pow(F.relu(x), 2)


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {"gelu": _gelu, "squared_relu": _squared_relu, "swiglu": _swiglu}


def activation_fn(name: str, *, fused: bool = False):
    """The activation called ``name`` (``fused``: SwiGLU as Megatron's fused ``bias_swiglu_impl``);
    fails listing the valid names."""
    if fused and name == "swiglu":
        return fused_swiglu
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ConfigError(f"unknown activation {name!r}; valid: {sorted(ACTIVATIONS)}") from None


class MLP(nn.Module):
    """``x [s(/tp), b, h] -> (out [s(/tp), b, h], bias)``; ``ffn`` is the full (unsplit) width."""

    def __init__(self, hidden: int, ffn: int, *, activation: str, tp_group: Any, sequence_parallel: bool,
                 bias: bool, dtype: torch.dtype, init_std: float, out_init_std: float, fp8: bool,
                 async_allreduce: bool = True, tp_comm_overlap: bool = False,
                 fused_activation: bool = True, tp_comm_aggregate: tuple[str, ...] = (),
                 tp_comm_sm_margin: tuple[tuple[str, int], ...] = (), tp_comm_fp8_buf: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.act = activation_fn(activation, fused=fused_activation)
        gated = activation == "swiglu"
        self.linear_fc1 = ColumnParallelLinear(
            hidden, ffn * (2 if gated else 1), tp_group=tp_group, sequence_parallel=sequence_parallel,
            bias=bias, dtype=dtype, init_std=init_std, fp8=fp8, async_allreduce=async_allreduce,
            tp_comm_overlap=tp_comm_overlap, tp_comm_aggregate="fc1_fprop" in tp_comm_aggregate,
            # TE fuses GeLU's backward with the fp8 cast-transpose (fp8_cast_transpose_bgrad_dgelu_fused);
            # other activations run theirs in bf16, then a cast-transpose (layernorm_mlp.py).
            fp8_grad_cast=activation != "gelu")
        self.linear_fc2 = RowParallelLinear(
            ffn, hidden, tp_group=tp_group, sequence_parallel=sequence_parallel, bias=bias,
            dtype=dtype, init_std=out_init_std, fp8=fp8, tp_comm_overlap=tp_comm_overlap,
            # TE's LayerNormMLP writes the activation in fp8
            fp8_input_cast=False, tp_comm_aggregate="fc2_dgrad" in tp_comm_aggregate,
            tp_comm_sm_margin=dict(tp_comm_sm_margin).get("fc2_fprop", 0),
            tp_comm_fp8_buf="fc2_fprop" in tp_comm_fp8_buf)

    def forward(self, x: torch.Tensor):
        return self.linear_fc2(self.act(self.linear_fc1(x)))
