"""Megatron's vocab-parallel cross-entropy, unfused and fused (models/layers/cross_entropy.py), under
capture at TP = world size (tests/test_models_cross_entropy.py): bf16 logits [S, B, V/tp], each loss
in its own module (``unfused``, ``fused``), forward and backward with a ones output gradient."""

import torch
import torch.distributed as dist
from torch import nn

from models.layers.cross_entropy import fused_vocab_parallel_cross_entropy, vocab_parallel_cross_entropy

S, B, V = 64, 2, 512  # sequence, micro-batch, vocabulary (split over TP)


class Unfused(nn.Module):
    def forward(self, logits, target, group):
        return vocab_parallel_cross_entropy(logits.float(), target, group)  # as models/gpt.py


class Fused(nn.Module):
    def forward(self, logits, target, group):
        return fused_vocab_parallel_cross_entropy(logits, target, group)


class Loss(nn.Module):
    def __init__(self):
        super().__init__()
        self.unfused, self.fused = Unfused(), Fused()

    def forward(self, fused, logits, target, group):
        return (self.fused if fused else self.unfused)(logits, target, group)


dist.init_process_group("nccl")
tp = dist.new_group(list(range(dist.get_world_size())))
target = torch.randint(0, V, (S, B))
model = Loss()
for fused in (False, True):
    logits = torch.randn(S, B, V // dist.get_world_size(), dtype=torch.bfloat16, requires_grad=True)
    loss = model(fused, logits, target, tp)
    loss.backward(torch.ones_like(loss))
