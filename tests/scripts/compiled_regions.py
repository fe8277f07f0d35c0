"""torch.compile'd regions (tests/test_capture_compile.py): a compiled module with GEMMs inside,
a compiled bias-GeLU function and a compiled bias-scale function, forward and backward, fp32."""

import torch
from torch import nn

T, H, F = 256, 512, 1024  # tokens, hidden, MLP width


@torch.compile
def bias_gelu(x, b):
    # Megatron's fused_bias_gelu.bias_gelu: tanh GeLU of x + b, 10 eager pointwise ops.
    y = x + b
    return y * 0.5 * (1.0 + torch.tanh(0.79788456 * y * (1 + 0.044715 * y * y)))


@torch.compile
def bias_scale(x, b):
    return (x + b) * 2.0


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(H, F) * 0.02)
        self.b1 = nn.Parameter(torch.zeros(F))
        self.w2 = nn.Parameter(torch.randn(F, H) * 0.02)

    def forward(self, x):
        h = x @ self.w1  # mm: stays a cuBLAS call
        h = torch.nn.functional.gelu(h + self.b1, approximate="tanh")  # add + gelu: one kernel
        return h @ self.w2  # mm


class Act(nn.Module):
    def __init__(self):
        super().__init__()
        self.b = nn.Parameter(torch.zeros(H))

    def forward(self, x):
        return bias_gelu(x, self.b)


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.b = nn.Parameter(torch.zeros(H))

    def forward(self, x):
        return bias_scale(x, self.b)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = torch.compile(Mlp())
        self.act = Act()
        self.scale = Scale()

    def forward(self, x):
        return self.scale(self.act(self.mlp(x)))


net = Net().cuda()
x = torch.randn(T, H, device="cuda")
g = torch.randn(T, H, device="cuda")
out = net(x)
out.backward(g)
