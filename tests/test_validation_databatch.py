"""Data parallelism and the batch of a case (heterosim/validation/databatch.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from heterosim.errors import ConfigError
from heterosim.validation.cases import Case, load_cases, megatron_flags

HOPPER = Path(__file__).resolve().parents[1] / "validation" / "hopper_cases.yaml"


def _case(**par) -> Case:
    return Case(id="t", category="end_to_end", source={"title": "a blog, 2025"},
                hardware={"gpu": "NVIDIA H100 80GB HBM3", "gpus_per_node": 8},
                model={"name": "Llama 3.1 70B", "seq_len": 8192}, parallelism={"tp": 4, "pp": 1, "dp": 16, **par},
                batch={"micro": 1, "global": 64}, precision="bf16")


def _dp(ci) -> tuple[list[str], list[str]]:
    words = ("fsdp", "distributed-opt", "sharding")
    return ([x for x in ci.flags if any(w in x for w in words)],
            [a for a in ci.assumptions if a.startswith(("data parallelism", "parallelism.zero"))])


def test_a_stated_distributed_optimizer_or_zero_stage():
    """With no recipe the run is plain DDP; 'distributed_optimizer: yes' or ZeRO stage 1-2 turns on
    Megatron's distributed optimizer, ZeRO-3 is fully sharded (Megatron-FSDP), stage 0 plain DDP;
    each said so."""
    assert _dp(megatron_flags(_case())) == ([], [])
    flags, notes = _dp(megatron_flags(_case(distributed_optimizer="yes")))
    assert flags == ["--use-distributed-optimizer"]
    assert notes == ["data parallelism: distributed optimizer (parallelism.distributed_optimizer): gradients "
                     "reduce-scattered"]
    assert _dp(megatron_flags(_case(zero_stage=2)))[0] == ["--use-distributed-optimizer"]
    flags, notes = _dp(megatron_flags(_case(zero="ZeRO-3")))
    assert flags == ["--use-megatron-fsdp", "--data-parallel-sharding-strategy"]
    assert notes[0].startswith("parallelism.zero: Megatron-FSDP sharding parameters, gradients and optimizer state")
    assert _dp(megatron_flags(_case(zero="stage 0"))) == ([], [])
    with pytest.raises(ConfigError, match=r"case t: parallelism.zero is 'on'; give the ZeRO stage, 0-3"):
        megatron_flags(_case(zero="on"))


def test_a_stated_off_overrides_the_recipes_distributed_optimizer():
    """A DGX Cloud row whose recipe runs the distributed optimizer, stated off: plain DDP, said so."""
    row = next(c for c in load_cases(HOPPER) if c.id == "e2e-dgxc-v24.11.1-nemotron4-15b-bf16-16gpu")
    assert "--use-distributed-optimizer" in megatron_flags(row).flags
    off = Case(**{**{k: getattr(row, k) for k in row.__dataclass_fields__},
                  "parallelism": {**row.parallelism, "distributed_optimizer": "no"}})
    ci = megatron_flags(off)
    assert "--use-distributed-optimizer" not in ci.flags
    assert "data parallelism: no distributed optimizer (parallelism.distributed_optimizer)" in ci.assumptions


def test_a_batch_given_in_tokens_only():
    """batch.tokens_per_batch 1,048,576 of 8,192-token sequences, no global batch: 128 sequences."""
    c = _case()
    c = Case(**{**{k: getattr(c, k) for k in c.__dataclass_fields__},
                "batch": {"micro": 1, "tokens_per_batch": 1048576}})
    ci = megatron_flags(c)
    f = list(ci.flags)
    assert f[f.index("--global-batch-size") + 1] == "128"
    assert "batch.global '1048576 tokens': 1,048,576 tokens = 128 sequences of 8,192" in ci.assumptions
