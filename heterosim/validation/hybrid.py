"""Hybrid Mamba / transformer models in a case: which layers are Mamba-2 mixers, and their sizes.

A case names a hybrid model by its architecture words ("hybrid Mamba-2 / Transformer", "SSM") or by a
released model whose configuration is known (:data:`RELEASED`: NVIDIA's Nemotron-H, Nemotron Nano v2,
Nemotron 3 Nano). Its layer pattern (Megatron-core's ``hybrid_override_pattern``: ``M`` Mamba, ``*``
attention, ``-`` MLP, ``E`` MoE) comes from ``model.hybrid_pattern`` (or ``layer_pattern``), else from
the released configuration; the Mamba sizes likewise, else Megatron-core's defaults. Each value taken
from elsewhere than the case is noted with its source; a hybrid model with no pattern fails with one
error naming what to give.
"""

from __future__ import annotations

import re
from typing import Any

from heterosim.errors import ConfigError

from .phrases import count, is_unstated

__all__ = ["RELEASED", "MAMBA_DEFAULTS", "released", "hybrid_flags"]

_NH_4B_8B = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
RELEASED: dict[str, dict[str, Any]] = {
    # Megatron Bridge (NVIDIA-NeMo/Megatron-Bridge@067f987) recipes/nemotronh/h100/nemotronh.py,
    # nemotron_nano_v2.py and nemotron_3_nano.py: HybridModelProvider arguments.
    "nemotron-h 4b": dict(layers=52, hidden=3072, ffn=12288, heads=32, kv_heads=8, mamba_heads=112, mamba_head_dim=64,
                          mamba_state_dim=128, mamba_groups=8, pattern=_NH_4B_8B),
    "nemotron-h 8b": dict(layers=52, hidden=4096, ffn=21504, heads=32, kv_heads=8, mamba_heads=128, mamba_head_dim=64,
                          mamba_state_dim=128, mamba_groups=8, pattern=_NH_4B_8B),
    "nemotron-h 47b": dict(layers=98, hidden=8192, ffn=30720, heads=64, kv_heads=8, mamba_heads=256, mamba_head_dim=64,
                           mamba_state_dim=256, mamba_groups=8,
                           pattern="M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---"
                                   "M-M*-M-M-M-M-M-"),
    "nemotron-h 56b": dict(layers=118, hidden=8192, ffn=32768, heads=64, kv_heads=8, mamba_heads=256, mamba_head_dim=64,
                           mamba_state_dim=256, mamba_groups=8,
                           pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-"
                                   "M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"),
    "nemotron nano 9b v2": dict(layers=56, hidden=4480, ffn=15680, heads=40, kv_heads=8, mamba_heads=128,
                                mamba_head_dim=80, mamba_state_dim=128, mamba_groups=8,
                                pattern="M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"),
    "nemotron nano 12b v2": dict(layers=62, hidden=5120, ffn=20480, heads=40, kv_heads=8, mamba_heads=128,
                                 mamba_head_dim=80, mamba_state_dim=128, mamba_groups=8,
                                 pattern="M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-"),
    "nemotron 3 nano": dict(layers=52, hidden=2688, ffn=1856, heads=32, kv_heads=2, mamba_heads=64, mamba_head_dim=64,
                            mamba_state_dim=128, mamba_groups=8, experts=128, topk=6, moe_ffn=1856, shared_ffn=3712,
                            pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"),
}
_NAMES = [  # (pattern over the lower-cased model name, RELEASED key)
    (re.compile(rf"nemotron[\s_-]*h\b.*?\b{size}\b"), f"nemotron-h {size}") for size in ("4b", "8b", "47b", "56b")
] + [
    (re.compile(rf"nemotron[\s_-]*nano[\s_-]*(?:v2\b.*?\b{size}\b|{size}[\s_-]*v2)"), f"nemotron nano {size} v2")
    for size in ("9b", "12b")
] + [(re.compile(r"nemotron[\s_-]*3[\s_-]*nano|nemotron[\s_-]*v3[\s_-]*nano"), "nemotron 3 nano")]

MAMBA_DEFAULTS = {"mamba_state_dim": 128, "mamba_head_dim": 64, "mamba_groups": 8}
"""Megatron-core's ``TransformerConfig`` defaults (mamba_state_dim, mamba_head_dim, mamba_num_groups);
the head count defaults to 2 h / head dim (``expand = 2``)."""

_FIELDS = {  # flag -> (RELEASED key, the case's model fields that may state it)
    "--mamba-state-dim": ("mamba_state_dim", ("mamba_state_dim", "ssm_state_dim", "state_dim", "d_state")),
    "--mamba-head-dim": ("mamba_head_dim", ("mamba_head_dim", "ssm_head_dim")),
    "--mamba-num-groups": ("mamba_groups", ("mamba_groups", "mamba_num_groups", "ssm_groups")),
    "--mamba-num-heads": ("mamba_heads", ("mamba_heads", "mamba_num_heads", "ssm_heads")),
}


def released(model: dict) -> tuple[dict[str, Any], str] | None:
    """(configuration, source) of the released hybrid model ``model.name`` names, else None."""
    name = str(model.get("name", "")).lower()
    for pat, key in _NAMES:
        if pat.search(name):
            return RELEASED[key], f"{key}'s released configuration (Megatron Bridge recipe)"
    return None


def _stated(model: dict, names: tuple[str, ...], where: str) -> int | None:
    key = next((k for k in names if k in model and not is_unstated(model[k])), None)
    return None if key is None else count(model[key], f"{where}.{key}")[0]


def hybrid_flags(case_id: str, model: dict, named: bool, notes: list[str]) -> list[str]:
    """``--hybrid-override-pattern`` and the ``--mamba-*`` sizes of a hybrid model, or [] for a model
    that is not one (``named``: the architecture words name Mamba / an SSM)."""
    rel = released(model)
    pattern = next((model[k] for k in ("hybrid_pattern", "layer_pattern") if k in model), None)
    if not named and rel is None and pattern is None:
        return []
    config, src = rel or ({}, "")
    if is_unstated(pattern):
        if "pattern" not in config:
            raise ConfigError(f"case {case_id}: a hybrid Mamba model needs its layer pattern; give "
                              "model.hybrid_pattern (one symbol per layer: M Mamba, * attention, - MLP, E MoE)")
        pattern = config["pattern"]
        notes.append(f"hybrid layer pattern not stated: {pattern} ({src})")
    pattern = re.sub(r"\s+", "", str(pattern))
    flags = ["--hybrid-override-pattern", pattern]
    for flag, (key, names) in _FIELDS.items():
        value = _stated(model, names, "model")
        if value is None and key in config:
            value = config[key]
            notes.append(f"{flag[2:].replace('-', ' ')} not stated: {value} ({src})")
        elif value is None and key in MAMBA_DEFAULTS:
            value = MAMBA_DEFAULTS[key]
            notes.append(f"{flag[2:].replace('-', ' ')} not stated: {value} (Megatron-core's default)")
        if value is not None:
            flags += [flag, str(value)]
    return flags
