"""DeepSeek-V2/V3 and Kimi K2 in a case: multi-head latent attention, shared experts, leading dense
layers and multi-token prediction, from the case's fields, else the released configuration (noted)."""

from __future__ import annotations

import re
from typing import Any, Protocol

from heterosim.errors import ConfigError


class Fields(Protocol):
    """What this module reads of :class:`heterosim.validation.flags.Fields`."""

    case: Any
    notes: list[str]
    mtp: int | None

    def count(self, section: str, key: str, *, required: bool = True) -> int | None: ...

__all__ = ["DEEPSEEK", "deepseek_moe_flags", "mla_flags", "mtp_layers"]


def deepseek_moe_flags(f: Fields, moe_ffn: int | None) -> list[str]:
    """Shared experts and leading dense layers (``model.shared_experts``, ``model.dense_layers`` /
    ``first_k_dense``), else DeepSeek's released counts for a DeepSeek model (noted)."""
    ds = _deepseek(f)
    shared = _model_field(f, ("shared_experts", "n_shared_experts"))
    dense = _model_field(f, ("dense_layers", "first_k_dense", "first_k_dense_replace"))
    if ds is not None:
        defaults, src = ds
        for what, got in (("shared_experts", shared), ("dense_layers", dense)):
            if got is None:
                f.notes.append(f"{what.replace('_', ' ')} not stated: {defaults[what]} ({src})")
        shared = defaults["shared_experts"] if shared is None else shared
        dense = defaults["dense_layers"] if dense is None else dense
    flags: list[str] = []
    if shared:
        if moe_ffn is None:
            raise ConfigError(f"case {f.case.id}: shared experts need the expert width; give model.moe_ffn")
        flags += ["--moe-shared-expert-intermediate-size", str(shared * moe_ffn)]
    if dense:
        layers = f.count("model", "layers", required=f.released is None) or f.released[0]["layers"]
        if dense >= layers:
            raise ConfigError(f"case {f.case.id}: {dense} dense layers leave no MoE layer of {layers}")
        flags += ["--moe-layer-freq", f"[0]*{dense}+[1]*{layers - dense}"]
    return flags


# DeepSeek's released configurations (deepseek-ai/DeepSeek-V3 and DeepSeek-V2 config.json; arXiv
# 2412.19437 / 2405.04434): multi-head latent attention ranks and head dims, shared experts, the
# dense layers before the first MoE layer. V3: q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim
# 128, qk_rope_head_dim 64, v_head_dim 128, n_shared_experts 1, first_k_dense_replace 3; V2 the same
# MLA with n_shared_experts 2 and first_k_dense_replace 1.
DEEPSEEK: dict[str, dict[str, int]] = {
    "v3": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
           "v_head_dim": 128, "shared_experts": 1, "dense_layers": 3},
    "v2": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
           "v_head_dim": 128, "shared_experts": 2, "dense_layers": 1},
    # Moonshot's Kimi K2 (moonshotai/Kimi-K2-Base config.json, DeepSeek-V3's architecture): the same
    # MLA, n_shared_experts 1, first_k_dense_replace 1.
    "k2": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
           "v_head_dim": 128, "shared_experts": 1, "dense_layers": 1},
}
_MLA_KEYS = {"q_lora_rank": ("q_lora_rank",), "kv_lora_rank": ("kv_lora_rank",),
             "qk_head_dim": ("qk_head_dim", "qk_nope_head_dim"),
             "qk_pos_emb_head_dim": ("qk_pos_emb_head_dim", "qk_rope_head_dim"), "v_head_dim": ("v_head_dim",)}


def _deepseek(f: Fields) -> tuple[dict[str, int], str] | None:
    """DeepSeek's released settings when ``model.name`` / ``model.arch`` names DeepSeek (V2 where it
    says so, else V3) or Kimi K2 (DeepSeek-V3's architecture), with where they come from."""
    text = f"{f.case.model.get('name', '')} {f.case.model.get('arch', '')}".lower()
    if re.search(r"kimi[\s_-]*k2", text):
        return DEEPSEEK["k2"], "Kimi K2's released configuration (config.json)"
    if "deepseek" not in text:
        return None
    v = "v2" if re.search(r"deepseek[\s_-]*v2", text) else "v3"
    return DEEPSEEK[v], f"DeepSeek-{v.upper()}'s released configuration (config.json)"


def _model_field(f: Fields, names: tuple[str, ...]) -> int | None:
    key = next((k for k in names if k in f.case.model), None)
    return f.count("model", key, required=False) if key else None


def mla_flags(f: Fields, feats: dict[str, str]) -> list[str]:
    """``--multi-latent-attention`` and its ranks where ``model.arch`` names MLA or the model is
    DeepSeek's: the model's fields, else DeepSeek's released values (noted)."""
    ds = _deepseek(f)
    if feats.get("attn") != "mla" and ds is None:
        return []
    defaults, src = ds or (DEEPSEEK["v3"], "DeepSeek-V3's released configuration (config.json)")
    flags = ["--multi-latent-attention"]
    stated = []
    for key, names in _MLA_KEYS.items():
        value = _model_field(f, names)
        if value is None:
            value = defaults[key]
            stated.append(f"{key} {value}")
        flags += [f"--{key.replace('_', '-')}", str(value)]
    if stated:
        f.notes.append(f"multi-head latent attention, not stated: {', '.join(stated)} ({src})")
    return flags




MTP_DEFAULT = 1
"""MTP depths of DeepSeek-V3 (config.json ``num_nextn_predict_layers``: 1; Megatron Bridge's DeepSeek-V3
provider takes it as ``mtp_num_layers``), and of a model whose arch names MTP without a count."""


def mtp_layers(f: Fields, feats: dict[str, str]) -> int:
    """Multi-token prediction depths: ``model.mtp_layers`` (or ``mtp_num_layers`` /
    ``num_nextn_predict_layers``), else 1 where ``arch`` names MTP or the model is DeepSeek-V3 (noted),
    else 0. Kept in ``f.mtp`` (the pipeline split asks again)."""
    if f.mtp is not None:
        return f.mtp
    n = _model_field(f, ("mtp_layers", "mtp_num_layers", "num_nextn_predict_layers"))
    ds = _deepseek(f)
    if n is None and (feats.get("mtp") or (ds is not None and ds[0] is DEEPSEEK["v3"])):
        n = MTP_DEFAULT
        src = "model.arch names MTP" if feats.get("mtp") else ds[1]
        f.notes.append(f"multi-token prediction depths not stated: {n} ({src})")
    f.mtp = n or 0
    return f.mtp
