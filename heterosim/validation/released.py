"""Configurations of released models the case reader falls back on, and the attention variants they use.

Where a case leaves out what a released model's own configuration fixes (its layer pattern, head dim,
sliding window, experts), the reader takes it from :data:`RELEASED` (each entry cites its source) and
says so. :func:`attention_flags` turns a case's head dim, sliding window and attention sinks into
``--kv-channels``, ``--window-size`` / ``--window-attn-skip-freq`` and ``--softmax-type learnable``.
"""

from __future__ import annotations

import re
from typing import Any

from heterosim.errors import ConfigError

from .phrases import count, is_unstated

__all__ = ["RELEASED", "QWEN3_HEAD_DIM", "released", "released_moe_flags", "stated_count", "attention_flags"]

_NH_4B_8B = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
RELEASED: dict[str, dict[str, Any]] = {
    # Megatron Bridge (NVIDIA-NeMo/Megatron-Bridge@067f987) recipes/nemotronh/h100/nemotronh.py,
    # nemotron_nano_v2.py and nemotron_3_nano.py: HybridModelProvider arguments; vocab: the
    # tokenizer's 131,072 entries (the models' Hugging Face config.json vocab_size).
    "nemotron-h 4b": dict(layers=52, hidden=3072, ffn=12288, heads=32, kv_heads=8, mamba_heads=112, mamba_head_dim=64,
                          mamba_state_dim=128, mamba_groups=8, vocab=131072, pattern=_NH_4B_8B),
    "nemotron-h 8b": dict(layers=52, hidden=4096, ffn=21504, heads=32, kv_heads=8, mamba_heads=128, mamba_head_dim=64,
                          mamba_state_dim=128, mamba_groups=8, vocab=131072, pattern=_NH_4B_8B),
    "nemotron-h 47b": dict(layers=98, hidden=8192, ffn=30720, heads=64, kv_heads=8, mamba_heads=256, mamba_head_dim=64,
                           mamba_state_dim=256, mamba_groups=8, vocab=131072,
                           pattern="M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---"
                                   "M-M*-M-M-M-M-M-"),
    "nemotron-h 56b": dict(layers=118, hidden=8192, ffn=32768, heads=64, kv_heads=8, mamba_heads=256, mamba_head_dim=64,
                           mamba_state_dim=256, mamba_groups=8, vocab=131072,
                           pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-"
                                   "M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"),
    "nemotron nano 9b v2": dict(layers=56, hidden=4480, ffn=15680, heads=40, kv_heads=8, mamba_heads=128,
                                mamba_head_dim=80, mamba_state_dim=128, mamba_groups=8, vocab=131072,
                                pattern="M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"),
    "nemotron nano 12b v2": dict(layers=62, hidden=5120, ffn=20480, heads=40, kv_heads=8, mamba_heads=128,
                                 mamba_head_dim=80, mamba_state_dim=128, mamba_groups=8, vocab=131072,
                                 pattern="M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-"),
    # openai/gpt-oss-120b and gpt-oss-20b config.json: head_dim 64 (not hidden / heads), sliding_window 128
    # on every other layer (layer_types alternate, sliding first), attention sinks, biases, untied output,
    # vocab_size 201,088; Megatron Bridge's gpt_oss_bridge.py: window_size (sliding_window - 1, 0),
    # window_attn_skip_freq 2, softmax_type "learnable", a gated activation (GPT-OSS's clamped GLU) of the expert width.
    "gpt-oss 120b": dict(layers=36, hidden=2880, heads=64, kv_heads=8, head_dim=64, experts=128, topk=4, moe_ffn=2880,
                         vocab=201088, window=127, window_skip=2, sinks=True),
    "gpt-oss 20b": dict(layers=24, hidden=2880, heads=64, kv_heads=8, head_dim=64, experts=32, topk=4, moe_ffn=2880,
                        vocab=201088, window=127, window_skip=2, sinks=True),
    "nemotron 3 nano": dict(layers=52, hidden=2688, ffn=1856, heads=32, kv_heads=2, mamba_heads=64, mamba_head_dim=64,
                            mamba_state_dim=128, mamba_groups=8, experts=128, topk=6, moe_ffn=1856, shared_ffn=3712,
                            vocab=131072, pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"),
    # Hugging Face config.json of Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B: every layer MoE
    # (decoder_sparse_step 1, mlp_only_layers []), no shared expert, untied output; head_dim 128 is
    # QWEN3_HEAD_DIM's; their dense intermediate_size no layer uses.
    "qwen3 30b-a3b": dict(layers=48, hidden=2048, heads=32, kv_heads=4, experts=128, topk=8, moe_ffn=768, vocab=151936),
    "qwen3 235b-a22b": dict(layers=94, hidden=4096, heads=64, kv_heads=4, experts=128, topk=8, moe_ffn=1536,
                            vocab=151936),
    # deepseek-ai/DeepSeek-V3 and moonshotai/Kimi-K2-Base config.json (MLA: heterosim/validation/
    # deepseek.py; shared experts and leading dense layers come from there too); ffn is the dense
    # layers' intermediate_size; MLA has no key-value head count.
    "deepseek-v3": dict(layers=61, hidden=7168, ffn=18432, heads=128, experts=256, topk=8, moe_ffn=2048, vocab=129280),
    "kimi k2": dict(layers=61, hidden=7168, ffn=18432, heads=64, experts=384, topk=8, moe_ffn=2048, vocab=163840),
    # meta-llama Llama-3.1-{8B,70B,405B} config.json (Llama 3 8B / 70B and Llama 3.3 70B have the same shapes).
    "llama 3.1 8b": dict(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256),
    "llama 3.1 70b": dict(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=128256),
    "llama 3.1 405b": dict(layers=126, hidden=16384, ffn=53248, heads=128, kv_heads=8, vocab=128256),
    # meta-llama/Llama-2-{7b,13b,70b}-hf config.json (70B: grouped-query attention, 8 KV heads).
    "llama 2 7b": dict(layers=32, hidden=4096, ffn=11008, heads=32, kv_heads=32, vocab=32000),
    "llama 2 13b": dict(layers=40, hidden=5120, ffn=13824, heads=40, kv_heads=40, vocab=32000),
    "llama 2 70b": dict(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=32000),
    # Qwen/Qwen3-{8B,14B,32B} config.json (dense; head_dim 128 is QWEN3_HEAD_DIM's; untied output).
    "qwen3 8b": dict(layers=36, hidden=4096, ffn=12288, heads=32, kv_heads=8, vocab=151936),
    "qwen3 14b": dict(layers=40, hidden=5120, ffn=17408, heads=40, kv_heads=8, vocab=151936),
    "qwen3 32b": dict(layers=64, hidden=5120, ffn=25600, heads=64, kv_heads=8, vocab=151936),
    # mistralai/Mixtral-8x7B-v0.1 and Mixtral-8x22B-v0.1 config.json.
    "mixtral 8x7b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, experts=8, topk=2, moe_ffn=14336, vocab=32000),
    "mixtral 8x22b": dict(layers=56, hidden=6144, heads=48, kv_heads=8, experts=8, topk=2, moe_ffn=16384, vocab=32768),
}
_SOURCES = {"gpt-oss": "config.json; Megatron Bridge gpt_oss_bridge.py", "qwen3": "config.json",
            "deepseek": "config.json", "kimi": "config.json", "llama": "config.json", "mixtral": "config.json"}
"""Where an entry of :data:`RELEASED` comes from, by its key's first word (else a Megatron Bridge recipe)."""
_NAMES = [  # (pattern over the lower-cased model name, RELEASED key)
    (re.compile(rf"gpt[\s_-]*oss[\s_-]*{size}\b"), f"gpt-oss {size}") for size in ("120b", "20b")
] + [
    (re.compile(rf"nemotron[\s_-]*h\b.*?\b{size}\b"), f"nemotron-h {size}") for size in ("4b", "8b", "47b", "56b")
] + [
    (re.compile(rf"nemotron[\s_-]*nano[\s_-]*(?:v2\b.*?\b{size}\b|{size}[\s_-]*v2)"), f"nemotron nano {size} v2")
    for size in ("9b", "12b")
] + [(re.compile(r"nemotron[\s_-]*3[\s_-]*nano|nemotron[\s_-]*v3[\s_-]*nano"), "nemotron 3 nano")] + [
    (re.compile(rf"qwen[\s_-]*3[\s_-]*(?:moe[\s_-]*)?{size}[\s_-]*{active}\b"), f"qwen3 {size}-{active}")
    for size, active in (("30b", "a3b"), ("235b", "a22b"))
] + [
    (re.compile(r"deepseek[\s_-]*v3(?!\.[2-9])"), "deepseek-v3"), (re.compile(r"kimi[\s_-]*k2(?!\.\d)"), "kimi k2"),
] + [
    (re.compile(rf"llama[\s_-]*3(?:\.\d)?[\s_-]*{size}\b"), f"llama 3.1 {size}") for size in ("8b", "70b", "405b")
] + [
    (re.compile(rf"llama[\s_-]*2[\s_-]*{size}\b"), f"llama 2 {size}") for size in ("7b", "13b", "70b")
] + [
    (re.compile(rf"qwen[\s_-]*3[\s_-]*{size}\b(?![\s_-]*a\d)"), f"qwen3 {size}") for size in ("8b", "14b", "32b")
] + [(re.compile(rf"mixtral[\s_-]*{size}\b"), f"mixtral {size}") for size in ("8x7b", "8x22b")]


def released(model: dict) -> tuple[dict[str, Any], str] | None:
    """(configuration, source) of the released model ``model.name`` names (:data:`RELEASED`), else None."""
    name = str(model.get("name", "")).lower()
    for pat, key in _NAMES:
        if pat.search(name):
            how = next((v for k, v in _SOURCES.items() if key.startswith(k)), "Megatron Bridge recipe")
            return RELEASED[key], f"{key}'s released configuration ({how})"
    return None


def released_moe_flags(config: dict[str, Any], src: str, notes: list[str]) -> list[str]:
    """The experts of a released MoE model (its width, top-k and shared experts), noted."""
    shared = config.get("shared_ffn")
    notes.append(f"experts not stated: {config['experts']} of width {config['moe_ffn']}, top-{config['topk']}"
                 + (f", shared experts of width {shared}" if shared else "") + f" ({src})")
    flags = ["--num-experts", str(config["experts"]), "--moe-router-topk", str(config["topk"]),
             "--moe-ffn-hidden-size", str(config["moe_ffn"])]
    return flags + (["--moe-shared-expert-intermediate-size", str(shared)] if shared else [])


QWEN3_HEAD_DIM = 128
"""Every Qwen3 model's head dim (Qwen/Qwen3-* config.json ``head_dim``), not hidden / heads for most."""


def stated_count(model: dict, names: tuple[str, ...], where: str) -> int | None:
    """The first of the fields ``names`` that ``model`` states, as an integer (remarks allowed), else None."""
    key = next((k for k in names if k in model and not is_unstated(model[k])), None)
    return None if key is None else count(model[key], f"{where}.{key}")[0]


def attention_flags(case_id: str, model: dict, feats: dict[str, str], notes: list[str],
                    rel: tuple[dict[str, Any], str] | None) -> list[str]:
    """``--kv-channels`` (``model.head_dim`` / ``kv_channels``, else the released model's, else Qwen3's
    128), the sliding window (``model.sliding_window`` / ``window``: keys a query sees, itself included;
    ``model.window_every``: every n-th layer full) and attention sinks ("sinks" in ``arch``), else the
    released model's (``rel``, :func:`released`); each default noted."""
    config, src = rel or ({}, "")
    name = f"{model.get('name', '')} {model.get('arch', '')}".lower()
    flags: list[str] = []
    head_dim = stated_count(model, ("head_dim", "kv_channels"), "model")
    if head_dim is None and "head_dim" in config:
        head_dim = config["head_dim"]
        notes.append(f"model.head_dim not stated: {head_dim} ({src})")
    elif head_dim is None and re.search(r"qwen[\s_-]*3", name):
        head_dim = QWEN3_HEAD_DIM
        notes.append(f"model.head_dim not stated: {head_dim} (Qwen3's released configuration, head_dim)")
    if head_dim is not None:
        flags += ["--kv-channels", str(head_dim)]
    keys = stated_count(model, ("sliding_window", "window"), "model")
    window = None if keys is None else keys - 1
    if window is None and (feats.get("window") or "window" in config):
        if "window" not in config:
            raise ConfigError(f"case {case_id}: model.arch names a sliding window but not its size; give "
                              "model.sliding_window (the keys a query sees, itself included)")
        window = config["window"]
        notes.append(f"sliding window not stated: {window + 1} keys (window_size ({window}, 0); {src})")
    if window is not None:
        flags += ["--window-size", f"{window},0"]
        every = stated_count(model, ("window_every", "full_attention_every"), "model") or config.get("window_skip")
        if every:
            flags += ["--window-attn-skip-freq", str(every)]
            notes.append(f"one layer in {every} attends to all keys, the others within the window"
                         + ("" if "window_every" in model or "full_attention_every" in model else f" ({src})"))
    if feats.get("sinks") or config.get("sinks"):
        flags += ["--softmax-type", "learnable"]
        notes.append("attention sinks: a learned logit per head in each softmax row ("
                     + ("model.arch" if feats.get("sinks") else src) + ")")
    return flags
