"""Megatron-FSDP (models/fsdp.py): units, per-micro-batch gathers and reduce-scatters, the sharded
optimizer, and the flags that select it.

One rank of a 4-rank fake process group runs a model of four units in forward order: a shallow
Linear(64, 64), two ``Block`` layers (the FSDP unit type, each a Linear(64, 64)), a shallow head
Linear(64, 64). Each holds 4,160 parameters, padded to 4,224 = 33 x lcm(4, 128): a bf16 gather
moves 8,448 bytes, an fp32 gradient reduce-scatter 16,896.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from heterosim.errors import ConfigError
from models.args import parse_args
from models.distributed import ModelGradSync
from models.fsdp import FullyShardedDataParallel, fsdp_units
from models.optimizer import MixedPrecisionAdam
from test_models_distributed import H, fake_rank, iteration

AG, RS = "_allgather_base_", "_reduce_scatter_base_"


class Block(nn.Sequential):
    """The FSDP unit type of these tests."""


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(H, H, dtype=torch.bfloat16), Block(nn.Linear(H, H, dtype=torch.bfloat16), nn.ReLU()),
                         Block(nn.Linear(H, H, dtype=torch.bfloat16), nn.ReLU()), nn.Linear(H, H, dtype=torch.bfloat16))


def test_units_are_layers_and_modules_holding_parameters_in_forward_order():
    m = model()
    assert fsdp_units(m, (Block,)) == [m[0], m[1], m[2], m[3]]


def test_each_micro_batch_gathers_and_reduce_scatters_every_unit():
    """Per micro-batch: forward gathers the four units (each prefetching the next: the first
    pre-hook issues two); backward gathers the two layers again (the last layer's hook prefetches
    the other) and reduce-scatters each layer as its backward ends, then the shallow units where
    the backward ends; the optimizer step gathers nothing (the next forward does)."""
    with fake_rank(0, 4) as log:
        m = model()
        fsdp = FullyShardedDataParallel(m, dp_group=dist.group.WORLD, unit_types=(Block,), grad_dtype=torch.float32)
        gs = ModelGradSync([fsdp])
        opt = MixedPrecisionAdam(gs, use_distributed_optimizer=True, clip_grad=0.0)
        assert sum(p.numel() for p in opt.master_params) == 4 * 4224 // 4
        iteration(m, gs, m=2, opt=opt)
    per_mb = [(AG, 8448, "fwd")] * 4 + [(AG, 8448, "bwd")] * 2 + [(RS, 16896, "grad_sync")] * 4
    got = [(o[0], o[2], o[3]) for o in log.ops]
    assert got == per_mb * 2
    assert [o[4] for o in log.ops] == [0] * 10 + [1] * 10
    assert {o[1] for o in log.ops} == {4}


def test_fp8_weights_gather_at_one_byte():
    """With fp8_param_gather the layers' fp8 weights (4,096 each, marked fp8_weight) get their own
    buckets, gathered in the fp8 wire scope; the biases (64, padded to 128) gather in bf16."""
    with fake_rank(0, 4) as log:
        m = model()
        for i in (1, 2):
            m[i][0].weight.fp8_weight = True
        fsdp = FullyShardedDataParallel(m, dp_group=dist.group.WORLD, unit_types=(Block,), fp8_param_gather=True)
        gs = ModelGradSync([fsdp])
        iteration(m, gs, m=1, opt=MixedPrecisionAdam(gs, use_distributed_optimizer=True, clip_grad=0.0))
    fwd = [(o[2], w) for o, w in zip(log.ops, log.wire) if o[0] == AG and o[3] == "fwd"]
    assert sorted(fwd, key=str) == sorted([(8448, None), (8192, "fp8"), (256, None), (8192, "fp8"), (256, None),
                                           (8448, None)], key=str)


def test_pretrain_gpt_flags():
    base = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--vocab-size", "256", "--global-batch-size", "8", "--bf16", "--use-megatron-fsdp"]
    cfg = parse_args(base + ["--data-parallel-sharding-strategy", "optim_grads_params"], 8)
    assert cfg.parallel.use_megatron_fsdp and cfg.layout()["megatron_fsdp"] is True
    assert "megatron_fsdp" not in parse_args(base[:-1], 8).layout()
    with pytest.raises(ConfigError) as e:
        parse_args(base, 8)
    assert str(e.value) == ("--use-megatron-fsdp with --data-parallel-sharding-strategy no_shard is not supported; "
                            "give --data-parallel-sharding-strategy optim_grads_params (parameters, gradients and "
                            "optimizer state sharded), or drop --use-megatron-fsdp for the distributed optimizer")
    with pytest.raises(ConfigError) as e:
        parse_args(base + ["--data-parallel-sharding-strategy", "optim_grads_params",
                           "--pipeline-model-parallel-size", "2"], 8)
    assert str(e.value) == ("--use-megatron-fsdp with pipeline parallelism or MoE experts is not supported "
                            "(models/fsdp.py); give --pipeline-model-parallel-size 1 and no --num-experts")


def test_capture_counts_sharded_buffers_and_transient_gathers(tmp_path):
    """Captured through pretrain_gpt.py (8 ranks, dp 8): under Megatron-FSDP a rank's parameters
    and gradients at the peak are those of the distributed optimizer's run over 8, to the padding
    of each unit's bucket and the allocator's rounding (within 1%), the optimizer state the same;
    the unsharded gathers and gradients are transient (counted as activations), and the peak is
    lower."""
    import subprocess
    import sys
    from pathlib import Path

    from heterosim.trace.memory import memory_peak
    from heterosim.trace.store import load_trace

    root = Path(__file__).resolve().parents[1]
    base = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--seq-length", "256",
            "--max-position-embeddings", "256", "--vocab-size", "4096", "--micro-batch-size", "1",
            "--global-batch-size", "16", "--train-iters", "2", "--bf16", "--untie-embeddings-and-output-weights",
            "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
            "--use-distributed-optimizer"]
    peaks = {}
    for name, extra in (("dist", []), ("fsdp", ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                                               "optim_grads_params"])):
        out = tmp_path / name
        p = subprocess.run([sys.executable, "-m", "capture", "--world-size", "8", "-o", str(out),
                            str(root / "models" / "pretrain_gpt.py"), *base, *extra],
                           capture_output=True, text=True, cwd=root)
        assert p.returncode == 0, p.stderr
        role = load_trace(out).roles[0]
        peaks[name] = memory_peak(role.memory, role.program)
    d, f = peaks["dist"].at_peak, peaks["fsdp"].at_peak
    for cat in ("parameters", "gradients"):
        assert f[cat] * 8 == pytest.approx(d[cat], rel=0.01)
    assert f["optimizer"] == pytest.approx(d["optimizer"], rel=0.01)
    assert f["activations"] > d["activations"] and peaks["fsdp"].allocated < peaks["dist"].allocated
