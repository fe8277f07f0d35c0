"""A user's own top-level ``models`` package (its name is also one of HeteroSim's packages)."""

import torch


def build(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
