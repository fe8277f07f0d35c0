"""Tests for heterosim.validation.phrases: annotated numbers and words of a case -> values."""

from __future__ import annotations

import re

import pytest

from heterosim.errors import ConfigError
from heterosim.validation.phrases import (arch_features, count, flag_word, is_unstated, positive_int,
                                          precision_flags, recompute_word)


@pytest.mark.parametrize("text,value", [
    (4096, 4096),
    (4096.0, 4096),
    ("4096", 4096),
    ("128,256", 128256),
    ("48 (from memory, unverified)", 48),
    ("8 (from memory, unverified)", 8),
    ("128K (128,256 in released config)", 128256),   # the exact count in parentheses
    ("32K (32,000)", 32000),
    ("128K (see 4 notes)", 128000),                  # 4 is not within 5% of 128,000: SI K
    ("256K", 256000),
    ("1.5M", 1500000),
    ("96, as in the paper", 96),
    ("TP=8", 8),                                     # a label before the count
    ("dp: 16", 16),
])
def test_count_keeps_the_number(text, value):
    """An annotated number keeps its number; a rounded one takes the exact count beside it."""
    assert count(text, "model.x")[0] == value


def test_count_notes_say_what_was_read():
    """A plain integer needs no note; an annotated one says what it became and why."""
    assert count(4096, "model.hidden") == (4096, None)
    assert count("48 (from memory, unverified)", "model.heads")[1] == (
        "model.heads '48 (from memory, unverified)': 48 (the remark is kept out)")
    assert count("128K (128,256 in released config)", "model.vocab")[1] == (
        "model.vocab '128K (128,256 in released config)': 128256 (the exact count in parentheses)")
    assert count("256K", "model.vocab")[1] == "model.vocab '256K': 256000 (K read as 1,000)"


def test_a_global_batch_in_tokens_is_sequences_of_the_length():
    """'4M tokens' of 8,192-token sequences: 4 x 1,048,576 / 8,192 = 512 (binary M divides; SI does
    not); 4M tokens of 4,000-token sequences: 1,000 (only SI divides); a count is a count; a token
    count no reading divides is one error."""
    from heterosim.validation.phrases import batch_count

    assert batch_count("4M tokens", 8192) == (
        512, "batch.global '4M tokens': 4,194,304 tokens = 512 sequences of 8,192 (M read as 1,048,576)")
    assert batch_count("4,194,304 tokens", 8192)[0] == 512
    assert batch_count("4M tokens", 4000)[0] == 1000
    assert batch_count("512 (4M tokens)", 8192)[0] == 512
    assert batch_count(256, 8192) == (256, None)
    with pytest.raises(ConfigError, match=re.escape("batch.global is '1000 tokens': a token count that is not a "
                                                    "whole number of 8,192-token sequences; give the global batch "
                                                    "in sequences")):
        batch_count("1000 tokens", 8192)


def test_a_sequence_lengths_k_is_1024():
    """'8K' of a sequence length is 8,192 (every recipe's 8K context); an exact count beside it
    still wins, and a vocabulary's K stays 1,000."""
    assert count("8K", "model.seq_len", binary=True) == (8192, "model.seq_len '8K': 8192 (K read as 1,024)")
    assert count("4k context", "model.seq_len", binary=True)[0] == 4096
    assert count("128K", "model.seq_len", binary=True)[0] == 131072
    assert count("1M", "model.seq_len", binary=True)[0] == 1048576
    assert count("32K (32,768)", "model.seq_len", binary=True)[0] == 32768
    assert count("8K", "model.vocab")[0] == 8000


@pytest.mark.parametrize("value,message", [
    ("~4096", "model.x is '~4096': an approximate count; give the exact integer"),
    ("not stated", "model.x is 'not stated'; give an integer (a remark may follow it: '48 (from memory)')"),
    ("abc", "model.x is 'abc'; give an integer (a remark may follow it: '48 (from memory)')"),
    ("4.5", "model.x is '4.5'; give an integer >= 1"),
    ("0 (none)", "model.x is '0 (none)'; give an integer >= 1"),
    (0, "model.x is 0; give an integer >= 1"),
    (True, "model.x is True; give an integer"),
    (None, "model.x is None; give an integer"),
    (2.5, "model.x is 2.5; give an integer >= 1"),
])
def test_count_refuses_what_is_not_a_count(value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        count(value, "model.x")


def test_positive_int():
    assert positive_int(" 8 ", "hardware.gpus_per_node") == 8
    with pytest.raises(ConfigError, match=re.escape("hardware.gpus_per_node is 'eight'; give an integer >= 1")):
        positive_int("eight", "hardware.gpus_per_node")


@pytest.mark.parametrize("value,unstated", [
    (None, True), ("", True), ("not stated", True), ("Not specified in the paper", True), ("unknown", True),
    ("n/a", True), ("N/A (one node)", True), ("?", True), ("4", False), (4, False), (False, False),
    ("none", False), ("nothing to add", False), ("-", True), ("\u2014", True), (" \u2013 ", True), ("-1", False),
    ("- see notes", False),
])
def test_is_unstated(value, unstated):
    assert is_unstated(value) is unstated


@pytest.mark.parametrize("value,want", [
    (True, True), (False, False), ("yes", True), ("on (with TP)", True), ("enabled", True), ("No", False),
    ("off", False), ("disabled", False), ("not stated", None), (None, None),
])
def test_flag_word(value, want):
    assert flag_word(value, "parallelism.sequence_parallel") is want


def test_flag_word_refuses_other_words():
    with pytest.raises(ConfigError, match=re.escape("parallelism.sequence_parallel is 'sometimes'; say true or "
                                                    "false (or 'not stated')")):
        flag_word("sometimes", "parallelism.sequence_parallel")


@pytest.mark.parametrize("value,want", [
    ("full", "full"), ("full (assumed)", "full"), ("full activation recomputation (paper Sec 3.5)", "full"),
    ("Megatron v1 checkpoint-activations", "full"), ("selective", "selective"), ("none", "none"),
    ("no", "none"), (False, "none"), ("not stated", None), (None, None),
])
def test_recompute_word(value, want):
    assert recompute_word(value) == want


def test_recompute_word_refuses_other_words():
    with pytest.raises(ConfigError, match=re.escape("parallelism.recompute 'partial': say full, selective or none "
                                                    "(or 'not stated')")):
        recompute_word("partial")


@pytest.mark.parametrize("text,feats", [
    ("Llama (GQA, SwiGLU, RMSNorm, RoPE)", {"attn": "gqa", "act": "swiglu", "norm": "RMSNorm", "pos": "rope"}),
    ("GPT-style, squared-ReLU MLP (ffn=4h per README FLOP formula)", {"act": "squared_relu"}),
    ("GPT (MHA, GeLU MLP, LayerNorm, learned/rotary pos. not specified)",
     {"attn": "mha", "act": "gelu", "norm": "LayerNorm"}),
    ("Nemotron-4: squared-ReLU, GQA, LayerNorm1p, RoPE",
     {"act": "squared_relu", "attn": "gqa", "norm": "LayerNorm", "pos": "rope"}),
    ("decoder-only, grouped-query attention, RMS norm, rotary position embeddings (RoPE)",
     {"attn": "gqa", "norm": "RMSNorm", "pos": "rope"}),
    ("GPT, MQA, squared ReLU", {"attn": "mqa", "act": "squared_relu"}),
    ("GPT (MHA, GeLU MLP, LayerNorm, learned absolute position embeddings)",
     {"attn": "mha", "act": "gelu", "norm": "LayerNorm", "pos": "learned_absolute"}),
    ("", {}),
    ("Llama 3 (GQA 8 groups, SwiGLU, RMSNorm, RoPE)", {"attn": "gqa", "act": "swiglu", "norm": "RMSNorm", "pos": "rope"}),
    ("dense, pre-norm, RMSNorm, SiLU-gated MLP, RoPE", {"norm": "RMSNorm", "act": "swiglu", "pos": "rope"}),
    ("Nemotron-4 (squared ReLU, no bias, RoPE, GQA)",
     {"act": "squared_relu", "bias": "no", "pos": "rope", "attn": "gqa"}),
    ("GPT-3 175B (bias in linear layers, GeLU, learned positions)",
     {"bias": "yes", "act": "gelu", "pos": "learned_absolute"}),
    ("Qwen3 (GQA, QK-norm, SwiGLU, RMSNorm, RoPE)",
     {"attn": "gqa", "qk_norm": "yes", "act": "swiglu", "norm": "RMSNorm", "pos": "rope"}),
    ("Mixtral MoE 8x7B (top-2, SwiGLU experts)", {"act": "swiglu"}),
])
def test_arch_features(text, feats):
    """Architecture words are read wherever they stand, whatever the punctuation."""
    assert arch_features(text)[0] == feats


def test_arch_remark_is_left_out_and_said():
    feats, notes = arch_features("GPT-style, squared-ReLU MLP (ffn=4h per README FLOP formula)")
    assert notes == ["model arch remark '(ffn=4h per README FLOP formula)' names no architecture word: left out"]


@pytest.mark.parametrize("text,message", [
    ("GPT (MHA, RWKV, LayerNorm)", r"unknown word 'rwkv'; known words: absolute, attention sinks, bias, .*swiglu"),
    ("Transformer decoder with ALiBi", r"unknown word 'alibi'"),
    ("Jamba (hybrid Mamba2-Transformer, RetNet)", r"unknown word 'jamba'"),
    ("GPT (GeLU MLP, SwiGLU)", r"both 'gelu' and 'swiglu' for act"),
    ("GPT (MHA with dilated attention)", r"unknown word 'dilated'"),  # a remark with a known word is read
])
def test_arch_unknown_words_are_errors(text, message):
    with pytest.raises(ConfigError, match=message):
        arch_features(text)


@pytest.mark.parametrize("text,cc,year,flags,note", [
    ("bf16", 90, 2024, ["--bf16"], "precision bf16"),
    ("fp8 (hybrid) with bf16", 90, 2024, ["--bf16", "--fp8-format", "hybrid"],
     "fp8 GEMMs (hybrid e4m3/e5m2), bf16 elsewhere"),
    *[(t, 90, 2025, ["--bf16", "--fp8-recipe", "tensorwise", "--fp8-format", "hybrid"],
       "fp8 GEMMs (hybrid e4m3/e5m2, current scaling), bf16 elsewhere")
      for t in ("FP8-CS", "fp8_cs", "fp8 (current scaling)", "FP8 current-scaling", "fp8, tensorwise recipe",
                "FP8 (CS)")],
    ("fp8 (see docs)", 90, 2025, ["--bf16", "--fp8-format", "hybrid"], "fp8 GEMMs (hybrid e4m3/e5m2), bf16 elsewhere"),
    *[(t, 100, 2025, ["--bf16", "--fp8-recipe", "mxfp8", "--fp8-format", "e4m3"],
       "fp8 GEMMs (MXFP8: e4m3, an e8m0 scale per 32 values), bf16 elsewhere")
      for t in ("MXFP8", "FP8-MX", "fp8 (MXFP8 recipe)", "fp8 mx", "fp8_mx", "FP8 (MX)")],
    *[(t, 90, 2025, ["--bf16", "--fp8-recipe", "blockwise", "--fp8-format", "hybrid"],
       "fp8 GEMMs (hybrid e4m3/e5m2, blockwise: an fp32 scale per 128-value block), bf16 elsewhere")
      for t in ("fp8_sc", "FP8 sub-channel", "fp8 blockwise", "FP8 (SC)")],
    ("mixed precision (fp16/bf16 autocast)", 80, 2021, ["--fp16"], "precision fp16 (first of several named)"),
    ("mixed precision (A100)", 80, 2020, ["--fp16"],
     "precision 'mixed precision (A100)': fp16 (Megatron mixed precision in 2020; bf16 recipes from 2022)"),
    ("mixed precision (A100)", 80, 2023, ["--bf16"],
     "precision 'mixed precision (A100)': bf16 (mixed precision on sm_80 in 2023; bf16 recipes from 2022)"),
    ("mixed precision", 70, 2024, ["--fp16"], "precision 'mixed precision': fp16 (sm_70 has no bf16 tensor cores)"),
    ("AMP", 90, None, ["--bf16"],
     "precision 'AMP': bf16 (mixed precision on sm_90 of unknown year; bf16 recipes from 2022)"),
    # other spellings of the types: read as their short names, never passed over
    *[(t, 90, 2024, ["--bf16"], "precision bf16") for t in ("bfloat16", "BFloat16 mixed", "BF-16", "bf 16")],
    *[(t, 70, 2024, ["--fp16"], "precision fp16") for t in ("float16", "FP-16 with loss scaling")],
    *[(t, 90, 2025, ["--bf16", "--fp8-format", "hybrid"], "fp8 GEMMs (hybrid e4m3/e5m2), bf16 elsewhere")
      for t in ("Float8 (torchao, nn.Linear) + bf16, torch.compile", "Float8 + torch.compile + AsyncTP", "FP 8",
                "8-bit floating point", "bfloat16 with float8 GEMMs")],
])
def test_precision_by_name_and_era(text, cc, year, flags, note):
    """A named type wins; 'mixed precision' is fp16 without bf16 tensor cores or before 2022, else bf16."""
    assert precision_flags(text, cc, year) == (flags, note)


def test_precision_without_a_type_is_an_error():
    with pytest.raises(ConfigError, match=re.escape("precision 'tf32': name fp16, bf16 or fp8 (or 'mixed precision')")):
        precision_flags("tf32", 80, 2024)


@pytest.mark.parametrize("text", ["NVFP4", "FP4", "nvfp4 with bf16", "BF16 + NV-FP4", "fp4 (nvfp4 recipe)"])
def test_fp4_reads_as_nvfp4_on_blackwell(text):
    """NVFP4 is the one fp4 training recipe of Transformer Engine and Megatron-core; a bare fp4 reads as it."""
    assert precision_flags(text, 100, 2025) == (
        ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"],
        "fp4 GEMMs (NVFP4: e2m1, e4m3 scales per 16 elements, current per-tensor scaling), bf16 elsewhere")


def test_mxfp8_needs_blackwell():
    with pytest.raises(ConfigError, match=re.escape("precision 'MXFP8': MXFP8 needs Blackwell (sm_100 or later); "
                                                    "this GPU is sm_90")):
        precision_flags("MXFP8", 90, 2025)


def test_mxfp4_is_a_missing_feature_and_fp4_needs_blackwell():
    """MXFP4 is refused with words validate reports as a missing feature ("not supported"); fp4 on
    a GPU before Blackwell is an error naming the GPU's generation."""
    with pytest.raises(ConfigError, match=re.escape("precision 'mxfp4 (MoE experts)': MXFP4 training is not "
                                                    "supported (Transformer Engine and Megatron-core train fp4 "
                                                    "as NVFP4 only); NVFP4, fp8 and bf16 are")):
        precision_flags("mxfp4 (MoE experts)", 100, 2025)
    with pytest.raises(ConfigError, match=re.escape("precision 'NVFP4': fp4 GEMMs need Blackwell (sm_100 or "
                                                    "later); this GPU is sm_90")):
        precision_flags("NVFP4", 90, 2025)
