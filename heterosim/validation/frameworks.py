"""What a training framework runs when a case names it and leaves a setting unstated.

A published run with its own recipe file wins (:mod:`heterosim.validation.published_runs`). Without
one, a case whose source names NeMo 2 (NeMo containers from 24.12, the ``nemo.collections.llm``
recipes, or NVIDIA's DGX Cloud benchmarking collection from v25.04, whose launch scripts call those
recipes with ``performance_mode=True``) takes the settings NeMo 2's pre-training recipes and their
performance mode set for every model:

- sequence parallelism whenever TP > 1 (``scripts/performance/helpers.py``
  ``set_primary_perf_configs``: ``sequence_parallel = bool(tp_size > 1)``);
- the distributed optimizer (``recipes/optim/adam.py``: ``use_distributed_optimizer=True``), with
  gradient reduce-scatter and parameter all-gather overlapped (the recipes' DDP config and
  ``MegatronCommOverlapCallback._get_optimizer_overlap_cfgs``: ``overlap_grad_reduce``,
  ``overlap_param_gather``, buckets of 128 Mi elements when DP > 1) and gradients reduced in bf16
  (performance mode: ``grad_reduce_in_fp32 = False``);
- Transformer Engine's TP communication overlap (performance mode's ``tp_comm_overlap=True``; the
  callback turns it off below TP 2 or without sequence parallelism) and, with virtual pipeline
  stages, overlapped pipeline p2p (``overlap_p2p_comm = True`` when vp > 1);
- no recompute, Transformer Engine's fused attention (cuDNN; TE's preference on Hopper), fp8 as ``bf16_with_fp8_mixed`` (hybrid);
- the fused cross-entropy loss (``GPTConfig``, which the Llama, Mixtral and GPT-3 configurations
  inherit, and ``NemotronConfig`` set ``cross_entropy_loss_fusion: bool = True``,
  ``nemo/collections/llm/gpt/model/base.py`` and ``nemotron.py``; only fine-tuning recipes turn it
  off). NB: NeMo's own ``scripts/performance/helpers.py`` picks Transformer Engine's kernel
  (``cross_entropy_fusion_impl = "te"``); it is priced as Megatron-core's native fused one.

Sources that name Megatron Bridge (NeMo 2's successor, which the DGX Cloud collection launches from
v25.10) take the same settings and current-scaling fp8: its performance launcher has no delayed
scaling (``scripts/performance`` README, ``-c/--compute_dtype``: bf16, fp8_cs, fp8_mx, fp8_sc,
nvfp4; the collection's ``llama3.1/launch.sh`` from v25.10: ``FP8_RECIPE=${FP8_RECIPE:-cs}``), and
its Llama configurations keep NeMo 2's TP userbuffer overlap and bf16 gradient reduction
(``scripts/performance/configs/llama/llama3_llm_pretrain.py``) (:data:`BRIDGE_SCRIPT`); its MoE
recipes keep whole experts on each rank (expert tensor parallelism 1, :data:`BRIDGE_SETTINGS`).

Sources that name the NeMo launcher's YAML recipes (NeMo containers before 24.12, the collection
before v25.04) take the same settings without the bucket size and the fused loss, which those
YAMLs do not all set (:data:`NEMO1_SCRIPT`).

:func:`family_settings` gives, apart from any framework, what a model family's released
configuration sets unlike Megatron-LM's GPT defaults (bias, tied output layer, dropout).

Sources: NVIDIA/NeMo at 8cfedd7 (2025-09), ``nemo/collections/llm/recipes/{llama3_70b,llama31_405b,
gpt3_175b,nemotron4_340b}.py`` (``trainer``, ``pretrain_performance_optimizations``),
``nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py``, ``nemo/collections/llm/gpt/model/
{base,nemotron}.py``; NVIDIA/dgxc-benchmarking v25.04 ``llama3.1/pretrain_llama31.py``. Nothing here
is a measured value.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Protocol

__all__ = ["framework_settings", "family_settings", "nemo_generation", "names_megatron_bridge", "NEMO2_SETTINGS",
           "NEMO2_SCRIPT", "NEMO1_SCRIPT", "BRIDGE_SETTINGS", "BRIDGE_SCRIPT"]

NEMO2_SCRIPT = ("NeMo 2 pre-training recipes, performance mode (NVIDIA/NeMo@8cfedd7 nemo/collections/llm/recipes, "
                "gpt/model/base.py, megatron_comm_overlap.py, scripts/performance/helpers.py)")

# NeMo's bucket_size is 128 * 1024 * 1024 elements; bucket_mb is MiB of bf16 gradients.
NEMO2_SETTINGS: dict[str, Any] = {
    "sequence_parallel": True, "recompute": "none", "ddp": "distributed", "bucket_mb": 256,
    "overlap_grad_reduce": True, "overlap_param_gather": True, "grad_sync_dtype": "bf16",
    "tp_comm_overlap": True, "overlap_p2p_comm": True, "fp8_recipe": "hybrid",
    # Transformer Engine's own choice, Megatron-core's attention_backend auto: TE turns
    # FlashAttention off "to give FusedAttention preference on Hopper+" (get_attention_backend in
    # transformer_engine/pytorch/attention/dot_product_attention/utils.py); GPUs before Hopper
    # have no curve of their own for it (kernel_db), so the choice costs nothing there.
    "attention": "fused",
    # GPTConfig / NemotronConfig: cross_entropy_loss_fusion = True (module docstring).
    "cross_entropy_loss_fusion": True,
}

BRIDGE_SCRIPT = ("Megatron Bridge performance recipes (NVIDIA-NeMo/Megatron-Bridge scripts/performance: README "
                 "--compute_dtype bf16 / fp8_cs / fp8_mx / fp8_sc / nvfp4, configs/llama/llama3_llm_pretrain.py; "
                 "NeMo 2's settings otherwise)")
BRIDGE_SETTINGS: dict[str, Any] = {**NEMO2_SETTINGS, "fp8_scaling": "tensorwise", "expert_tp": 1,
                                   "nccl_env": {"NCCL_NVLS_ENABLE": "0"}}
"""NeMo 2's settings with current-scaling fp8 (the launcher's fp8_cs; no delayed scaling exists there)
and whole experts per rank: every MoE recipe of Megatron Bridge sets ``expert_tensor_parallel_size = 1``
and none another value (``recipes/{deepseek,qwen,gpt_oss,glm,kimi,nemotronh,minimax,...}/h100/*.py`` and
``perf_recipes/*`` at 067f987), where Megatron-core's own default is the TP size; and NVLink SHARP off,
``NCCL_NVLS_ENABLE: 0`` in the environment of 415 of the 432 performance recipes there (the others,
GPT-OSS on Blackwell, set 1)."""

DGXC_BRIDGE_FIRST = (25, 10)
"""First DGX Cloud benchmarking release (vYY.MM) that launches Megatron Bridge
(``llama3.1/launch.sh``: ``Megatron-Bridge/scripts/performance/setup_experiment``)."""

NEMO2_FIRST = (24, 12)
"""First NeMo container (YY.MM) whose LLM pre-training runs the NeMo 2 recipes by default."""

DGXC_NEMO2_FIRST = (25, 4)
"""First DGX Cloud benchmarking release (vYY.MM) whose NeMo workloads launch NeMo 2 recipes
(``llama3.1/pretrain_llama31.py``); v24.11.1-v25.03 ran the NeMo launcher's YAML recipes."""

NEMO1_SCRIPT = ("NeMo launcher performance recipes (NVIDIA/dgxc-benchmarking@35a9aec gpt3_175b_hydra.yaml, "
                "llama3.1_{8b,70b,405b}.yaml, nemotron4-{15b,340b}-synth.yaml: the settings all of them share)")
"""The YAML recipes before NeMo 2 agree on everything in :data:`NEMO2_SETTINGS` but the bucket size
(75-220 MiB by model), which is left at Megatron's default, and ``cross_entropy_loss_fusion`` (the
Llama 3.1 and Nemotron-4 YAMLs set it, gpt3_175b_hydra.yaml does not), left off."""

_NEMO1_UNSHARED = ("bucket_mb", "cross_entropy_loss_fusion")


class CaseSource(Protocol):
    source: Mapping[str, Any]


def _text(case: CaseSource) -> str:
    return " ".join(str(case.source.get(k, "")) for k in ("title", "url", "software"))


def nemo_generation(text: str) -> int | None:
    """2 for NeMo 2 recipes, 1 for the NeMo launcher's YAML recipes, None when ``text`` names no
    NeMo (a source naming NeMo without a version is taken as today's NeMo 2)."""
    low = text.lower()
    dgxc = "dgxc-benchmarking" in low or "dgx cloud benchmarking" in low
    if "nemo" not in low and not dgxc:
        return None
    if re.search(r"nemo[\s_-]*2(?:\.\d|\b)|nemo\.collections\.llm|nemo[\s-]*run", low):
        return 2
    gens = [2 if (int(yy), int(mm)) >= NEMO2_FIRST else 1
            for yy, mm in re.findall(r"nemo\D{0,20}?\b(2[0-9])\.(\d\d)\b", low)]
    gens += [2 if v >= DGXC_NEMO2_FIRST else 1 for v in _dgxc_releases(low)]
    return min(gens) if gens else 2


def _dgxc_releases(low: str) -> list[tuple[int, int]]:
    """(YY, MM) of the DGX Cloud benchmarking releases lower-case ``low`` names ("v25.04"); none
    when it does not name the collection."""
    if "dgxc-benchmarking" not in low and "dgx cloud benchmarking" not in low:
        return []
    return [(int(yy), int(mm)) for yy, mm in re.findall(r"\bv(2[0-9])\.(\d\d)", low)]


def names_megatron_bridge(text: str) -> bool:
    """Whether ``text`` names Megatron Bridge, or a DGX Cloud collection release that launches it."""
    low = text.lower()
    if re.search(r"megatron[\s_-]*bridge|(?<![a-z])mbridge(?![a-z])", low):
        return True
    return any(v >= DGXC_BRIDGE_FIRST for v in _dgxc_releases(low))


def framework_settings(case: CaseSource) -> tuple[dict[str, Any], str | None]:
    """(settings, where they come from) of the framework the case's source names; ({}, None) if it
    names none this module knows."""
    if names_megatron_bridge(_text(case)):
        return dict(BRIDGE_SETTINGS), BRIDGE_SCRIPT
    gen = nemo_generation(_text(case))
    if gen == 2:
        return dict(NEMO2_SETTINGS), NEMO2_SCRIPT
    if gen == 1:
        return {k: v for k, v in NEMO2_SETTINGS.items() if k not in _NEMO1_UNSHARED}, NEMO1_SCRIPT
    return {}, None


# Model families whose released configurations differ from Megatron-LM's GPT defaults (bias in
# every linear layer, output layer tied to the input embedding, dropout 0.1): Llama 2/3/3.1
# (Meta's config.json: attention_bias false, tie_word_embeddings false for 7B and up; NeMo's
# LlamaConfig: add_bias_linear False, share_embeddings_and_output_weights False, dropout 0.0),
# Mistral / Mixtral (config.json: no bias, untied; NeMo MixtralConfig dropout 0.0), Nemotron-4
# (arXiv 2402.16819 / 2406.11704: no bias, untied; NeMo Nemotron4Config dropout 0.0), Qwen2/3
# (untied above 7B; attention bias only on q/k/v, priced here as none) and DeepSeek-V2/V3.
FAMILY_SETTINGS: dict[str, Any] = {"bias": False, "untie_embeddings": True, "hidden_dropout": 0.0,
                                   "attention_dropout": 0.0}
FAMILY_WORDS = ("llama", "mistral", "mixtral", "nemotron", "qwen", "deepseek", "kimi")
# Their layers where ``model.arch`` does not say (the same configurations): Llama, Mistral /
# Mixtral and Qwen are SwiGLU, RMSNorm, RoPE (config.json: hidden_act "silu" in a gated MLP,
# rms_norm_eps, rope_theta); Nemotron-4 is squared ReLU, LayerNorm (layernorm1p), RoPE (arXiv
# 2402.16819 section 2).
FAMILY_LAYERS: dict[str, dict[str, str]] = {
    **{w: {"activation": "swiglu", "normalization": "RMSNorm", "position_embedding": "rope"}
       for w in ("llama", "mistral", "mixtral", "qwen")},
    "nemotron": {"activation": "squared_relu", "normalization": "LayerNorm", "position_embedding": "rope"},
    # DeepSeek-V2/V3 (config.json: hidden_act "silu" in gated MLPs, rms_norm_eps, rope_theta); their
    # MLA and MoE settings: heterosim.validation.flags (DEEPSEEK).
    "deepseek": {"activation": "swiglu", "normalization": "RMSNorm", "position_embedding": "rope"},
    "kimi": {"activation": "swiglu", "normalization": "RMSNorm", "position_embedding": "rope"},  # Kimi K2 = DeepSeek-V3's
}


# NVIDIA's hybrid Mamba models (Nemotron-H, Nemotron Nano v2, Nemotron 3; Megatron Bridge's
# HybridModelProvider and their recipes): squared ReLU, RMSNorm, no position embedding (the Mamba
# layers carry position), no bias, untied output layer, no dropout.
HYBRID_FAMILY = re.compile(r"nemotron[\s_-]*(?:h\b|nano[\s_-]*(?:v2|\d+b[\s_-]*v2)|(?:3|v3)[\s_-]*(?:nano|super|ultra))")
"""Names of the family (Nemotron-3 8B of 2023 is a transformer: only Nemotron 3 Nano / Super / Ultra match)."""
HYBRID_LAYERS: dict[str, str] = {"activation": "squared_relu", "normalization": "RMSNorm", "position_embedding": "none"}


# OpenAI's GPT-OSS (openai/gpt-oss-* config.json): biases in attention and experts, untied output
# layer, no dropout, RMSNorm, RoPE (YaRN), a gated expert activation (priced as SwiGLU: the same GEMMs).
GPT_OSS_FAMILY = re.compile(r"gpt[\s_-]*oss")
GPT_OSS_SETTINGS: dict[str, Any] = {"bias": True, "untie_embeddings": True, "hidden_dropout": 0.0,
                                    "attention_dropout": 0.0, "activation": "swiglu", "normalization": "RMSNorm",
                                    "position_embedding": "rope"}


def family_settings(model: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(settings, where from) of the model family that ``model.name`` or ``model.arch`` names: bias,
    output layer, dropout and (:data:`FAMILY_LAYERS`) activation, normalization, position embedding."""
    text = f"{model.get('name', '')} {model.get('arch', '')}".lower()
    if GPT_OSS_FAMILY.search(text):
        return dict(GPT_OSS_SETTINGS), "GPT-OSS's released configuration"
    if HYBRID_FAMILY.search(text):
        return {**FAMILY_SETTINGS, **HYBRID_LAYERS}, "Nemotron-H's released configuration"
    for word in FAMILY_WORDS:
        if re.search(rf"\b{word}", text):
            return {**FAMILY_SETTINGS, **FAMILY_LAYERS.get(word, {})}, f"{word.capitalize()}'s released configuration"
    return {}, None
