"""A plain data-parallel script that imports ``build`` from its own ``models`` package."""

import torch
import torch.distributed as dist

from models import build

dist.init_process_group("gloo")
model = build(64)
x = torch.randn(4, 64)
model(x).sum().backward()
for p in model.parameters():
    dist.all_reduce(p.grad)
