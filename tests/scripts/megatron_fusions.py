"""Megatron's fused SwiGLU (plain and token-weighted) and TE's fused RoPE (models/layers/fusions.py)
under capture (tests/test_models_fusions.py): fp32, forward and backward with a ones output gradient."""

import torch
from torch import nn

from models.layers.fusions import rope, swiglu, weighted_swiglu
from models.layers.rope import rotary_freqs

T, F = 256, 512  # tokens, MLP width (the input holds gate and up: 2F)
S, B, NH, D = 64, 2, 4, 32  # sequence, batch, heads, head dim


class Act(nn.Module):
    def forward(self, y):
        return swiglu(y)


class WeightedAct(nn.Module):
    def forward(self, y, w):
        return weighted_swiglu(y, w)


class Rot(nn.Module):
    def __init__(self):
        super().__init__()
        self.freqs = rotary_freqs(S, D)

    def forward(self, t):
        return rope(t, self.freqs)


y = torch.randn(T, 2 * F, requires_grad=True)
out = Act()(y)
out.backward(torch.ones_like(out))
t = torch.randn(S, B, NH, D, requires_grad=True)
out = Rot()(t)
out.backward(torch.ones_like(out))
y = torch.randn(T, 2 * F, requires_grad=True)
w = torch.rand(T, 1, requires_grad=True)
out = WeightedAct()(y, w)
out.backward(torch.ones_like(out))
