"""Hybrid Mamba / transformer models in a case: which layers are Mamba-2 mixers, and their sizes.

A case names a hybrid model by its architecture words ("hybrid Mamba-2 / Transformer", "SSM") or by a
released model whose configuration is known (:data:`heterosim.validation.released.RELEASED`: NVIDIA's
Nemotron-H, Nemotron Nano v2, Nemotron 3 Nano). Its layer pattern (Megatron-core's ``hybrid_override_pattern``: ``M`` Mamba, ``*``
attention, ``-`` MLP, ``E`` MoE) comes from ``model.hybrid_pattern`` (or ``layer_pattern``), else from
the released configuration; the Mamba sizes likewise, else Megatron-core's defaults. Each value taken
from elsewhere than the case is noted with its source; a hybrid model with no pattern fails with one
error naming what to give.
"""

from __future__ import annotations

import re
from typing import Any

from heterosim.errors import ConfigError

from .phrases import is_unstated
from .released import stated_count

__all__ = ["MAMBA_DEFAULTS", "hybrid_flags"]

MAMBA_DEFAULTS = {"mamba_state_dim": 128, "mamba_head_dim": 64, "mamba_groups": 8}
"""Megatron-core's ``TransformerConfig`` defaults (mamba_state_dim, mamba_head_dim, mamba_num_groups);
the head count defaults to 2 h / head dim (``expand = 2``)."""

_FIELDS = {  # flag -> (RELEASED key, the case's model fields that may state it)
    "--mamba-state-dim": ("mamba_state_dim", ("mamba_state_dim", "ssm_state_dim", "state_dim", "d_state")),
    "--mamba-head-dim": ("mamba_head_dim", ("mamba_head_dim", "ssm_head_dim")),
    "--mamba-num-groups": ("mamba_groups", ("mamba_groups", "mamba_num_groups", "ssm_groups")),
    "--mamba-num-heads": ("mamba_heads", ("mamba_heads", "mamba_num_heads", "ssm_heads")),
}


def hybrid_flags(case_id: str, model: dict, named: bool, notes: list[str],
                 rel: tuple[dict[str, Any], str] | None) -> list[str]:
    """``--hybrid-override-pattern`` and the ``--mamba-*`` sizes of a hybrid model, or [] for a model
    that is not one (``named``: the architecture words name Mamba / an SSM; ``rel``: the released
    model the case names, :func:`heterosim.validation.released.released`)."""
    if rel is not None and "pattern" not in rel[0]:
        rel = None  # a released transformer (GPT-OSS)
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
        value = stated_count(model, names, "model")
        if value is None and key in config:
            value = config[key]
            notes.append(f"{flag[2:].replace('-', ' ')} not stated: {value} ({src})")
        elif value is None and key in MAMBA_DEFAULTS:
            value = MAMBA_DEFAULTS[key]
            notes.append(f"{flag[2:].replace('-', ' ')} not stated: {value} (Megatron-core's default)")
        if value is not None:
            flags += [flag, str(value)]
    return flags
