"""Hybrid Mamba models in a case (heterosim/validation/hybrid.py): a released model's pattern and
sizes, the case's own fields, and the errors."""

from __future__ import annotations

import pytest

from heterosim.errors import ConfigError
from heterosim.validation.cases import megatron_flags
from heterosim.validation.hybrid import hybrid_flags
from heterosim.validation.released import RELEASED, released
from heterosim.validation.phrases import arch_features
from test_validation_cases import _case

NH56 = {"name": "Nemotron-H 56B", "layers": 118, "hidden": 8192, "heads": 64, "seq_len": 8192, "vocab": 131072,
        "arch": "hybrid Mamba-2 / Transformer"}


def test_released_patterns_have_one_symbol_per_layer():
    for key, c in RELEASED.items():
        if "pattern" not in c:
            continue  # a released transformer
        assert len(c["pattern"]) == c["layers"], key
        assert set(c["pattern"]) <= set("M*-E"), key


def test_a_released_model_reads_its_pattern_sizes_and_family_layers():
    """Nemotron-H 56B with only its shape stated: the released pattern (118 layers, 10 attention), state
    256, head dim 64, 8 groups, 256 heads, 8 KV heads, ffn 32768, squared ReLU, RMSNorm, no position
    embedding, no bias, untied; fp8 keeps the first and last layer in bf16. Each default is said so."""
    ci = megatron_flags(_case(model=NH56, parallelism={"tp": 8, "pp": 1, "dp": 8}, precision="fp8"))
    f = list(ci.flags)
    pattern = f[f.index("--hybrid-override-pattern") + 1]
    assert pattern == RELEASED["nemotron-h 56b"]["pattern"] and pattern.count("*") == 10
    i = f.index("--mamba-state-dim")
    assert f[i:i + 8] == ["--mamba-state-dim", "256", "--mamba-head-dim", "64", "--mamba-num-groups", "8",
                          "--mamba-num-heads", "256"]
    assert f[f.index("--num-query-groups") + 1] == "8" and f[f.index("--ffn-hidden-size") + 1] == "32768"
    assert "--squared-relu" in f and "--first-last-layers-bf16" in f and "--disable-bias-linear" in f
    assert f[f.index("--position-embedding-type") + 1] == "none" and f[f.index("--normalization") + 1] == "RMSNorm"
    src = "nemotron-h 56b's released configuration (Megatron Bridge recipe)"
    assert f"mamba state dim not stated: 256 ({src})" in ci.assumptions
    assert f"model.kv_heads not stated: 8 ({src})" in ci.assumptions


def test_the_cases_own_pattern_and_sizes_win():
    model = {**NH56, "name": "my hybrid", "layers": 4, "hybrid_pattern": "M M * -", "mamba_state_dim": 64,
             "ssm_heads": 32, "kv_heads": 8, "ffn": 16384}
    notes: list[str] = []
    flags = hybrid_flags("t", model, True, notes, None)
    assert flags == ["--hybrid-override-pattern", "MM*-", "--mamba-state-dim", "64", "--mamba-head-dim", "64",
                     "--mamba-num-groups", "8", "--mamba-num-heads", "32"]
    assert notes == ["mamba head dim not stated: 64 (Megatron-core's default)",
                     "mamba num groups not stated: 8 (Megatron-core's default)"]


def test_a_hybrid_model_without_a_pattern_fails_naming_the_field():
    with pytest.raises(ConfigError, match=r"case t: a hybrid Mamba model needs its layer pattern; give "
                                          r"model.hybrid_pattern \(one symbol per layer"):
        hybrid_flags("t", {"name": "Jamba-like", "arch": "hybrid Mamba"}, True, [], None)


def test_transformers_are_not_hybrid():
    assert released({"name": "Nemotron-3 8B"}) is None and released({"name": "Nemotron-4 340B"}) is None
    assert hybrid_flags("t", {"name": "Llama 3.1 70B"}, False, [], None) == []
    feats, _ = arch_features("hybrid Mamba-2 / Transformer (SSM)")
    assert feats == {"mixer": "mamba"}
    assert arch_features("Nemotron-H")[0] == {"mixer": "mamba"}


def test_nemotron_3_nano_reads_its_experts():
    """Nemotron 3 Nano (30B-A3B): MoE layers E of 128 experts of width 1856, top-6, shared experts of 3712."""
    model = {"name": "Nemotron 3 Nano 30B-A3B", "layers": 52, "hidden": 2688, "heads": 32, "seq_len": 8192,
             "vocab": 131072, "arch": "hybrid Mamba-Transformer MoE"}
    f = list(megatron_flags(_case(model=model, parallelism={"tp": 1, "pp": 1, "dp": 8, "ep": 8},
                                  precision="bf16")).flags)
    i = f.index("--num-experts")
    assert f[i:i + 8] == ["--num-experts", "128", "--moe-router-topk", "6", "--moe-ffn-hidden-size", "1856",
                          "--moe-shared-expert-intermediate-size", "3712"]
    assert f[f.index("--hybrid-override-pattern") + 1].count("E") == 23
