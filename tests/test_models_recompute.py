"""Tests of ``models.layers.recompute`` through ``TransformerBlock``: recomputation changes
memory, never numbers; bad flags fail clearly."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from heterosim.errors import ConfigError
from models.config import ModelConfig, TrainConfig
from models.transformer import TransformerBlock

SOLO = SimpleNamespace(tp_size=1, cp_size=1, sequence_parallel=False, tp_group=None, async_tp_allreduce=True,
               tp_comm_overlap=False, tp_comm_aggregate=(), tp_comm_sm_margin=(), tp_comm_fp8_buf=())
MCFG = ModelConfig(num_layers=3, hidden_size=16, num_attention_heads=2, seq_length=8, hidden_dropout=0.0)


def _grads(**tkw):
    torch.manual_seed(0)
    block = TransformerBlock(MCFG, TrainConfig(params_dtype="fp32", **tkw), SOLO, layers=range(3),
                             post_process=True)
    x = torch.randn(8, 2, 16, requires_grad=True)
    y = block(x)
    (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
    return [y.detach(), x.grad] + [p.grad for p in block.parameters()]


@pytest.mark.parametrize("tkw", [
    dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2),
    dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=2),
    dict(recompute_granularity="selective"),
])
def test_recompute_gives_identical_gradients(tkw):
    """Full (uniform / block) and selective recomputation give bitwise the same outputs and grads."""
    for a, b in zip(_grads(), _grads(**tkw)):
        assert torch.equal(a, b)


def test_full_recompute_needs_method_and_count():
    """--recompute-granularity full without a method or a layer count names the missing flag."""
    with pytest.raises(ConfigError, match="needs --recompute-method uniform or block, got None"):
        TransformerBlock(MCFG, TrainConfig(recompute_granularity="full"), SOLO, layers=range(1), post_process=False)
    with pytest.raises(ConfigError, match="needs --recompute-num-layers >= 1"):
        TransformerBlock(MCFG, TrainConfig(recompute_granularity="full", recompute_method="block"), SOLO,
                         layers=range(1), post_process=False)
