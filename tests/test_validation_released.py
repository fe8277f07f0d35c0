"""Released models' configurations and attention variants in a case (heterosim/validation/released.py):
GPT-OSS's head dim, alternating sliding window, sinks and experts; Qwen3's head dim; the errors."""

from __future__ import annotations

import pytest

from heterosim.errors import ConfigError
from heterosim.validation.cases import megatron_flags
from heterosim.validation.released import attention_flags, released
from test_validation_cases import _case

OSS = {"name": "GPT-OSS 120B", "layers": 36, "hidden": 2880, "heads": 64, "seq_len": 4096, "vocab": 201088,
       "arch": "MoE (128 experts, top-4), GQA"}


def _flag(f: list[str], name: str) -> str:
    return f[f.index(name) + 1]


def test_gpt_oss_reads_head_dim_window_sinks_and_expert_width():
    """gpt-oss-120b with its shape and experts stated: head dim 64 (not 2880 / 64 = 45), 8 KV heads,
    a 128-key window (127, 0) on every other layer, sinks, experts of width 2880, biases kept,
    SwiGLU-shaped experts, RMSNorm, RoPE; each default said so."""
    ci = megatron_flags(_case(model=OSS, parallelism={"tp": 1, "pp": 4, "dp": 16, "ep": 8}, precision="bf16"))
    f = list(ci.flags)
    assert (_flag(f, "--kv-channels"), _flag(f, "--num-query-groups"), _flag(f, "--window-size"),
            _flag(f, "--window-attn-skip-freq"), _flag(f, "--softmax-type"), _flag(f, "--moe-ffn-hidden-size")) \
        == ("64", "8", "127,0", "2", "learnable", "2880")
    assert "--disable-bias-linear" not in f and "--swiglu" in f and _flag(f, "--normalization") == "RMSNorm"
    src = "gpt-oss 120b's released configuration (config.json; Megatron Bridge gpt_oss_bridge.py)"
    assert f"sliding window not stated: 128 keys (window_size (127, 0); {src})" in ci.assumptions
    assert f"attention sinks: a learned logit per head in each softmax row ({src})" in ci.assumptions


def test_stated_window_and_head_dim_win():
    """A Mistral-style row: sliding_window 4096 keys -> (4095, 0) on every layer; head_dim stated."""
    notes: list[str] = []
    got = attention_flags("t", {"name": "Mistral 7B", "sliding_window": 4096, "head_dim": 128},
                          {"window": "yes"}, notes, None)
    assert got == ["--kv-channels", "128", "--window-size", "4095,0"] and notes == []


def test_qwen3_head_dim_is_128():
    model = {"name": "Qwen3 30B-A3B", "layers": 48, "hidden": 2048, "heads": 32, "kv_heads": 4, "seq_len": 4096,
             "vocab": 151936, "experts": 128, "topk": 8, "moe_ffn": 768, "arch": "not stated"}
    ci = megatron_flags(_case(model=model, parallelism={"tp": 1, "pp": 1, "dp": 8, "ep": 8}, precision="bf16"))
    assert _flag(list(ci.flags), "--kv-channels") == "128" and "--qk-layernorm" in ci.flags
    assert "model.head_dim not stated: 128 (Qwen3's released configuration, head_dim)" in ci.assumptions


def test_a_window_without_its_size_fails_naming_the_field():
    with pytest.raises(ConfigError, match=r"case t: model.arch names a sliding window but not its size; give "
                                          r"model.sliding_window"):
        attention_flags("t", {"name": "some model"}, {"window": "yes"}, [], None)


def test_names_of_released_models():
    assert released({"name": "openai/gpt-oss-20b"})[0]["experts"] == 32
    assert released({"name": "GPT-3 175B"}) is None and released({"name": "GPT OSS 120B"})[0]["layers"] == 36


def test_expert_tensor_parallelism_reaches_the_flags():
    """parallelism.etp 1 with tp 2 -> --expert-tensor-parallel-size 1; etp equal to tp (or tp 1) adds nothing."""
    ci = megatron_flags(_case(model=OSS, parallelism={"tp": 2, "pp": 4, "dp": 8, "ep": 8, "etp": 1}, precision="bf16"))
    assert _flag(list(ci.flags), "--expert-tensor-parallel-size") == "1"
    same = megatron_flags(_case(model=OSS, parallelism={"tp": 1, "pp": 4, "dp": 16, "ep": 8, "etp": 1}, precision="bf16"))
    assert "--expert-tensor-parallel-size" not in same.flags


BRIDGE = {"title": "NVIDIA Megatron Bridge performance summary", "url": "https://example.org/performance-summary"}
QWEN3_235B = {"name": "Qwen3 235B-A22B", "layers": 94, "hidden": 4096, "heads": 64, "kv_heads": 4, "seq_len": 4096,
              "vocab": 151936, "experts": 128, "topk": 8, "moe_ffn": 1536, "arch": "MoE"}


def test_megatron_bridge_moe_keeps_whole_experts_when_etp_is_unstated():
    """A Megatron Bridge row (TP 2, DP 16, EP 32) leaves ETP out: its recipes set 1, so the EP group is
    drawn from TP x DP (32 ranks), which Megatron-core's default (ETP = TP = 2) could not hold."""
    par = {"tp": 2, "pp": 8, "dp": 16, "ep": 32, "vpp": 4}
    ci = megatron_flags(_case(model=QWEN3_235B, parallelism=par, precision="fp8", source=BRIDGE))
    assert _flag(list(ci.flags), "--expert-tensor-parallel-size") == "1"
    # the row's own recipe where the repository has it (Qwen3 235B on H100), else Bridge's MoE recipes in general
    assert any(a.startswith("parallelism.etp not stated: 1 (Megatron Bridge@067f987 perf_recipes/qwen/h100/qwen3_moe.py")
               for a in ci.assumptions)
    generic = megatron_flags(_case(model=QWEN3_235B, parallelism={**par, "vpp": 2}, precision="fp8", source=BRIDGE))
    assert any(a.startswith("parallelism.etp not stated: 1 (Megatron Bridge performance recipes")
               for a in generic.assumptions)
    other = megatron_flags(_case(model=QWEN3_235B, parallelism={"tp": 2, "pp": 8, "dp": 16, "ep": 16, "vpp": 4},
                                 precision="fp8", source={"title": "a Megatron-LM run"}))
    assert "--expert-tensor-parallel-size" not in other.flags


def test_a_released_model_fills_its_unstated_shape():
    """Nemotron 3 Nano named with only its sequence length: 52 layers, hidden 2688, 32 heads and the
    131,072-entry vocabulary come from its released configuration, each said so."""
    model = {"name": "Nemotron 3 Nano 30B-A3B", "seq_len": 8192, "arch": "hybrid Mamba-2 / Transformer MoE"}
    ci = megatron_flags(_case(model=model, parallelism={"tp": 1, "pp": 1, "dp": 8, "ep": 8}, precision="bf16"))
    f = list(ci.flags)
    assert [_flag(f, k) for k in ("--num-layers", "--hidden-size", "--num-attention-heads", "--vocab-size")] \
        == ["52", "2688", "32", "131072"]
    src = "nemotron 3 nano's released configuration (Megatron Bridge recipe)"
    assert f"model.vocab not stated: 131072 ({src})" in ci.assumptions
    with pytest.raises(ConfigError, match=r"case t: model.layers not stated, and model.name 'Some 7B' is not a "
                                          r"released model the reader knows \(deepseek-v3, .*\); state model.layers"):
        megatron_flags(_case(model={"name": "Some 7B", "seq_len": 4096}, precision="bf16"))


def test_names_of_more_released_models():
    """Qwen3 MoE and dense 8B / 14B / 32B, DeepSeek-V3, Kimi K2, Llama 2, Llama 3 / 3.1 / 3.3 and
    Mixtral by name; not DeepSeek-V3.2 (its sparse attention differs), Kimi K2.5 (a vision model), a
    Llama 3.2 or a Qwen3 size not listed."""
    assert released({"name": "Qwen3 30B-A3B"})[0]["moe_ffn"] == 768
    assert released({"name": "Qwen3-235B-A22B"})[0]["layers"] == 94
    assert released({"name": "DeepSeek V3 671B"})[0]["experts"] == 256 and released({"name": "Kimi-K2"})[0]["experts"] == 384
    assert released({"name": "Llama 3.1 405B"})[0]["ffn"] == 53248 and released({"name": "Llama3-70B"})[0]["layers"] == 80
    assert released({"name": "Mixtral 8x22B"})[0]["hidden"] == 6144
    assert released({"name": "Qwen3 32B"})[0]["layers"] == 64 and released({"name": "Llama 3.3 70B"})[0]["ffn"] == 28672
    assert released({"name": "Llama-2-7b-hf"})[0]["ffn"] == 11008
    assert released({"name": "Qwen3 30B-A3B"})[0].get("experts") == 128  # the MoE model, not a dense "30b"
    assert all(released({"name": n}) is None for n in ("DeepSeek-V3.2", "Kimi K2.5", "Llama 3.2 3B", "Qwen3 4B"))


def test_a_row_naming_a_released_moe_model_alone_reads_its_shape():
    """A DGX Cloud table row gives a model name, layers and sequence length only: Qwen3 30B-A3B reads
    hidden 2,048, 32 heads, 4 KV heads, 128 experts of width 768, top-8, vocab 151,936 from the
    released config.json; DeepSeek-V3 also its MLA, one shared expert and 3 leading dense layers
    (58 MoE layers of 61, no key-value head count)."""
    qwen = {"name": "Qwen3 30B-A3B", "layers": 48, "seq_len": 4096}
    ci = megatron_flags(_case(model=qwen, parallelism={"tp": 1, "pp": 1, "dp": 8, "ep": 8}, precision="bf16"))
    f = list(ci.flags)
    assert [_flag(f, x) for x in ("--hidden-size", "--num-attention-heads", "--num-query-groups", "--num-experts",
                                  "--moe-ffn-hidden-size", "--moe-router-topk", "--vocab-size", "--kv-channels")] \
        == ["2048", "32", "4", "128", "768", "8", "151936", "128"]
    assert "model.hidden not stated: 2048 (qwen3 30b-a3b's released configuration (config.json))" in ci.assumptions
    ds = {"name": "DeepSeek-V3", "seq_len": 4096}
    ci = megatron_flags(_case(model=ds, parallelism={"tp": 1, "pp": 1, "dp": 64, "ep": 64}, precision="bf16"))
    f = list(ci.flags)
    assert [_flag(f, x) for x in ("--num-layers", "--hidden-size", "--num-experts", "--ffn-hidden-size",
                                  "--moe-shared-expert-intermediate-size", "--moe-layer-freq")] \
        == ["61", "7168", "256", "18432", "2048", "[0]*3+[1]*58"]
    assert "--multi-latent-attention" in f and "--group-query-attention" not in f
