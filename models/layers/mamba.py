"""Mamba-2 mixer layers (Dao & Gu, "Transformers are SSMs", ICML 2024, arXiv:2405.21060) as
Megatron-core's ``MambaMixer`` trains them (``ssm/mamba_mixer.py``, the hybrid models' ``M`` layers:
Nemotron-H, Nemotron 3).

Per layer, with ``H`` SSM heads of dim ``P`` (``d_inner = H * P``, twice the model width by default),
``G`` groups of ``B``/``C`` with state size ``N`` and, per TP rank, ``H / tp`` heads and ``G / tp``
groups:

1. ``in_proj``: column-parallel ``[s(/tp), b, h] -> [s, b, 2 d_inner/tp + 2 G N/tp + H/tp]``, the
   rank's ``z``, ``x``, ``B``, ``C`` and ``dt`` (Transformer Engine's ``LayerNormColumnParallelLinear``:
   the layer's RMSNorm, then the GEMM);
2. the layout ``[s, b, .] -> [b, s, .]`` (a copy, ``rearrange(...).contiguous()``);
3. ONE fused op, mamba_ssm's ``mamba_split_conv1d_scan_combined`` that Megatron-core's training path
   calls: causal depthwise conv1d (width 4) + SiLU on ``[x, B, C]``, ``dt = softplus(dt + dt_bias)``,
   the chunked SSD scan ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = C_t h_t + D x_t``, then
   ``y * silu(z)``; its backward is one op too (it recomputes the conv and the chunk states, as
   mamba_ssm's memory-efficient path does);
4. back to ``[s, b, d_inner/tp]`` (a copy), a grouped RMSNorm (``G/tp`` groups, mamba_ssm's
   ``RMSNormGated`` without a gate), ``out_proj`` row-parallel to ``[s(/tp), b, h]``.

The fused op is a real PyTorch custom op, ``heterosim::mamba_split_conv1d_scan(Tensor zxbcdt,
Tensor conv_weight, Tensor conv_bias, Tensor dt_bias, Tensor A, Tensor D, int chunk_size, int
headdim, int ngroups) -> Tensor`` with its backward ``heterosim::mamba_split_conv1d_scan_backward``;
its eager kernel computes the chunked SSD for real (float32, the chunk decomposition of the paper's
section 6), so a model runs on CPU outside a capture; :mod:`capture.ssd_cost` gives a capture its
FLOPs and memory traffic. Parameters: ``conv1d`` weight and bias, ``dt_bias``, ``A_log`` and ``D``
(fp32, one per head) live on each TP rank for its own heads (``tensor_model_parallel``), as does
the norm's weight.

NB: the grouped norm's weight is applied as a multiply after a weightless fused RMSNorm over each
group (two kernels where mamba_ssm's Triton kernel is one; the multiply is an elementwise pass
the replay's fusion may merge); the two layout copies are Megatron-core's; context parallelism with
Mamba layers (``MambaContextParallel``'s all-to-alls) and packed sequences are not modelled.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from heterosim.errors import ConfigError
from models.config import ModelConfig
from models.layers.linear import ColumnParallelLinear, RowParallelLinear, scaled_init_std
from models.layers.megatron_ops import eager_vjp, register_pair
from models.layers.norms import fused_rms_norm

__all__ = ["SCAN", "SCAN_BACKWARD", "MambaMixer", "mamba_split_conv1d_scan", "ssd_reference"]

SCAN = "heterosim::mamba_split_conv1d_scan"
SCAN_BACKWARD = "heterosim::mamba_split_conv1d_scan_backward"
_SCHEMA = "Tensor zxbcdt, Tensor conv_weight, Tensor conv_bias, Tensor dt_bias, Tensor A, Tensor D, " \
          "int chunk_size, int headdim, int ngroups"


def _split_sizes(zxbcdt: torch.Tensor, conv_weight: torch.Tensor, dt_bias: torch.Tensor, headdim: int,
                 ngroups: int) -> tuple[int, int, int, int]:
    """``(d_inner, conv_dim, nheads, d_state)`` of the op's arguments; one error if they disagree."""
    nheads, conv_dim = dt_bias.shape[0], conv_weight.shape[0]
    d_inner = nheads * headdim
    gn2 = conv_dim - d_inner
    if zxbcdt.dim() != 3 or gn2 <= 0 or gn2 % (2 * ngroups) or zxbcdt.shape[-1] != d_inner + conv_dim + nheads \
            or nheads % ngroups:
        raise ConfigError(f"{SCAN}: zxbcdt {tuple(zxbcdt.shape)} must be [b, l, 2 d_inner + 2 G N + H] with "
                          f"H = {nheads} heads of dim {headdim}, G = {ngroups} groups dividing H and a conv "
                          f"of {conv_dim} = d_inner + 2 G N channels")
    return d_inner, conv_dim, nheads, gn2 // (2 * ngroups)


def ssd_reference(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                  D: torch.Tensor, chunk: int) -> torch.Tensor:
    """The SSD scan by chunks (arXiv:2405.21060 section 6): ``x [b, l, H, P]``, ``dt [b, l, H]`` (after
    softplus), ``A [H]``, ``B``/``C [b, l, H, N]`` (already one per head), ``D [H]`` -> ``y [b, l, H, P]``.

    Within a chunk, ``y_i = sum_{j <= i} exp(cum_i - cum_j) (C_i . B_j) dt_j x_j`` with ``cum`` the
    running sum of ``dt A``; each chunk's state ``sum_j exp(cum_last - cum_j) dt_j x_j B_j^T`` is
    carried to the next chunks by their decays, and ``y_i += exp(cum_i) C_i . state_in``; then
    ``+ D x``. Equal to the recurrence ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = C_t h_t
    + D x_t`` (tested).
    """
    b, n, H, P = x.shape
    pad = (-n) % chunk  # padded steps have dt = 0: no input, no decay
    if pad:
        x, dt, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, B, C))
    c, N = (n + pad) // chunk, B.shape[-1]
    x, B, C = (t.reshape(b, c, chunk, H, -1) for t in (x, B, C))
    dt = dt.reshape(b, c, chunk, H)
    cum = torch.cumsum(dt * A, dim=2)  # [b, c, Q, H]
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril().view(1, 1, chunk, chunk, 1)
    decay = torch.exp((cum.unsqueeze(3) - cum.unsqueeze(2)).masked_fill(~causal, float("-inf")))
    scores = torch.einsum("bcihn,bcjhn->bcijh", C, B) * decay * dt.unsqueeze(2)
    y = torch.einsum("bcijh,bcjhp->bcihp", scores, x)
    weight = torch.exp(cum[:, :, -1:] - cum) * dt  # [b, c, Q, H]
    states = torch.einsum("bcjh,bcjhp,bcjhn->bchpn", weight, x, B)
    h = x.new_zeros(b, H, P, N)
    entering = []
    for k in range(c):
        entering.append(h)
        h = torch.exp(cum[:, k, -1]).view(b, H, 1, 1) * h + states[:, k]
    y = y + torch.einsum("bcihn,bchpn,bcih->bcihp", C, torch.stack(entering, 1), torch.exp(cum))
    y = y + D.view(1, 1, 1, H, 1) * x
    return y.reshape(b, c * chunk, H, P)[:, :n]


def _scan_eager(zxbcdt: torch.Tensor, conv_weight: torch.Tensor, conv_bias: torch.Tensor, dt_bias: torch.Tensor,
                A: torch.Tensor, D: torch.Tensor, chunk_size: int, headdim: int, ngroups: int) -> torch.Tensor:
    d_inner, conv_dim, nheads, n = _split_sizes(zxbcdt, conv_weight, dt_bias, headdim, ngroups)
    b, l, _ = zxbcdt.shape
    acc = torch.promote_types(zxbcdt.dtype, torch.float32)  # 16-bit inputs computed in fp32, as the kernels do
    z, xbc, dt = torch.split(zxbcdt.to(acc), [d_inner, conv_dim, nheads], dim=-1)
    width = conv_weight.shape[1]
    xbc = F.conv1d(xbc.transpose(1, 2), conv_weight.to(acc).unsqueeze(1), conv_bias.to(acc), padding=width - 1,
                   groups=conv_dim)[..., :l].transpose(1, 2)
    x, B, C = torch.split(F.silu(xbc), [d_inner, ngroups * n, ngroups * n], dim=-1)
    B, C = (t.reshape(b, l, ngroups, n).repeat_interleave(nheads // ngroups, dim=2) for t in (B, C))
    y = ssd_reference(x.reshape(b, l, nheads, headdim), F.softplus(dt + dt_bias.to(acc)), A.to(acc), B, C,
                      D.to(acc), chunk_size)
    return (y.reshape(b, l, d_inner) * F.silu(z)).to(zxbcdt.dtype)


def _scan_backward_eager(dy: torch.Tensor, zxbcdt: torch.Tensor, conv_weight: torch.Tensor, conv_bias: torch.Tensor,
                         dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor, chunk_size: int, headdim: int,
                         ngroups: int) -> tuple[torch.Tensor, ...]:
    return eager_vjp(lambda *t: _scan_eager(*t, chunk_size, headdim, ngroups),
                     (zxbcdt, conv_weight, conv_bias, dt_bias, A, D), dy)


def _scan_fake(zxbcdt: torch.Tensor, conv_weight: torch.Tensor, conv_bias: torch.Tensor, dt_bias: torch.Tensor,
               A: torch.Tensor, D: torch.Tensor, chunk_size: int, headdim: int, ngroups: int) -> torch.Tensor:
    d_inner = _split_sizes(zxbcdt, conv_weight, dt_bias, headdim, ngroups)[0]
    return zxbcdt.new_empty(zxbcdt.shape[0], zxbcdt.shape[1], d_inner)


def _scan_backward_fake(dy: torch.Tensor, *ins: Any) -> tuple[torch.Tensor, ...]:
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in ins[:6])


def _setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs[:6])
    ctx.sizes = inputs[6:]


def _autograd_backward(ctx: Any, dy: torch.Tensor) -> tuple:
    grads = _backward_op(dy.contiguous(), *ctx.saved_tensors, *ctx.sizes)
    return (*grads, None, None, None)


register_pair(SCAN, SCAN_BACKWARD,
              schemas=(f"({_SCHEMA}) -> Tensor",
                       f"(Tensor dy, {_SCHEMA}) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"),
              kernels=(_scan_eager, _scan_backward_eager), fakes=(_scan_fake, _scan_backward_fake),
              autograd=(_autograd_backward, _setup_context))
_forward_op = torch.ops.heterosim.mamba_split_conv1d_scan.default
_backward_op = torch.ops.heterosim.mamba_split_conv1d_scan_backward.default


def mamba_split_conv1d_scan(zxbcdt: torch.Tensor, conv_weight: torch.Tensor, conv_bias: torch.Tensor,
                            dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor, *, chunk_size: int,
                            headdim: int, ngroups: int) -> torch.Tensor:
    """``zxbcdt [b, l, 2 d_inner + 2 G N + H] -> y [b, l, d_inner]``: conv, SSD scan and gate in one op."""
    return _forward_op(zxbcdt, conv_weight, conv_bias, dt_bias, A, D, int(chunk_size), int(headdim), int(ngroups))


class MambaMixer(nn.Module):
    """``x [s(/tp), b, h] -> (out [s(/tp), b, h], None)``: one Mamba-2 mixer (module docstring)."""

    D_CONV = 4
    """Width of the causal depthwise convolution (Megatron-core's ``d_conv``)."""

    def __init__(self, mcfg: ModelConfig, pstate: Any, *, dtype: torch.dtype, fp8: bool,
                 seed: int | None = None) -> None:
        super().__init__()
        tp = pstate.tp_size
        H, P, G, N = mcfg.mamba_heads, mcfg.mamba_head_dim, mcfg.mamba_num_groups, mcfg.mamba_state_dim
        if H % tp or G % tp or H % G:
            raise ConfigError(f"Mamba heads {H} and groups {G} must be divisible by tensor-parallel size {tp}, "
                              f"and the heads by the groups; give --mamba-num-heads / --mamba-num-groups that do")
        if pstate.cp_size > 1:
            raise ConfigError("Mamba layers do not run with context parallelism here (models/layers/mamba.py); "
                              "give --context-parallel-size 1")
        self.h_local, self.g_local, self.p, self.n = H // tp, G // tp, P, N
        self.chunk = mcfg.mamba_chunk_size
        d_inner, sp, h = H * P, pstate.sequence_parallel, mcfg.hidden_size
        std = mcfg.init_method_std
        self.in_proj = ColumnParallelLinear(
            h, 2 * d_inner + 2 * G * N + H, tp_group=pstate.tp_group, sequence_parallel=sp, bias=False,
            dtype=dtype, init_std=std, fp8=fp8, async_allreduce=pstate.async_tp_allreduce,
            tp_comm_overlap=pstate.tp_comm_overlap, tp_comm_aggregate="fc1_fprop" in pstate.tp_comm_aggregate)
        conv_dim = d_inner // tp + 2 * self.g_local * N
        gen = None if seed is None else torch.Generator().manual_seed(seed)
        bound = 1.0 / math.sqrt(self.D_CONV)  # nn.Conv1d's default (kaiming_uniform, a = sqrt(5)), fan_in = d_conv
        self.conv_weight = nn.Parameter((torch.rand(conv_dim, self.D_CONV, generator=gen) * 2 - 1).mul_(bound).to(dtype))
        self.conv_bias = nn.Parameter((torch.rand(conv_dim, generator=gen) * 2 - 1).mul_(bound).to(dtype))
        # dt_bias: inverse softplus of dt ~ log-uniform in [1e-3, 0.1] (Megatron-core's dt_min / dt_max)
        dt = torch.exp(torch.rand(self.h_local, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.rand(self.h_local, generator=gen) * 15 + 1))  # A in [1, 16]
        self.D = nn.Parameter(torch.ones(self.h_local))
        self.norm_weight = nn.Parameter(torch.ones(d_inner // tp, dtype=dtype))
        for p in (self.conv_weight, self.conv_bias, self.dt_bias, self.A_log, self.D, self.norm_weight):
            p.tensor_model_parallel = tp > 1  # each rank's own heads
        self.out_proj = RowParallelLinear(
            d_inner, h, tp_group=pstate.tp_group, sequence_parallel=sp, bias=False, dtype=dtype,
            init_std=scaled_init_std(std, mcfg.num_layers), fp8=fp8, tp_comm_overlap=pstate.tp_comm_overlap,
            tp_comm_aggregate="fc2_dgrad" in pstate.tp_comm_aggregate,
            tp_comm_sm_margin=dict(pstate.tp_comm_sm_margin).get("fc2_fprop", 0),
            tp_comm_fp8_buf="fc2_fprop" in pstate.tp_comm_fp8_buf)
        self.eps = mcfg.norm_epsilon

    def forward(self, x: torch.Tensor, rotary: torch.Tensor | None = None):
        zxbcdt = self.in_proj(x).transpose(0, 1).contiguous()  # [b, s, .]
        A = -torch.exp(self.A_log.float())
        y = mamba_split_conv1d_scan(zxbcdt, self.conv_weight, self.conv_bias, self.dt_bias, A, self.D,
                                    chunk_size=self.chunk, headdim=self.p, ngroups=self.g_local)
        y = y.transpose(0, 1).contiguous()  # [s, b, d_inner/tp]
        s, b, d = y.shape
        grouped = y.view(s, b, self.g_local, d // self.g_local)
        y = fused_rms_norm(grouped, None, self.eps).view(s, b, d) * self.norm_weight  # NB above
        return self.out_proj(y)
