"""Named model presets for ``pretrain_gpt.py --preset NAME`` (published architectures).

A preset is a mapping from Megatron argument names (argparse ``dest``) to values; flags given
explicitly on the command line override it. Vocabulary sizes are the tokenizer's; Megatron's
padding (``--make-vocab-size-divisible-by`` x tp) is applied afterwards.

Sources: GPT-3 — Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1 (13B uses
h 5120 as in Megatron-LM's examples, the paper's 5140 is not a multiple of its 40 heads x 128);
vocab 51200 as in Megatron's GPT-3 runs (Narayanan et al., SC'21). LLaMA 7B/65B — Touvron et al.
2023a, Table 2 (ffn sizes from the released configs); LLaMA-2 70B — Touvron et al. 2023b and its
config.json; LLaMA-3.1 405B — Llama Team 2024, "The Llama 3 Herd of Models", Table 3.
"""

from __future__ import annotations

from typing import Any

from heterosim.errors import ConfigError

__all__ = ["PRESETS", "get_preset"]

_GPT3 = {"normalization": "LayerNorm", "position_embedding_type": "learned_absolute",
         "seq_length": 2048, "max_position_embeddings": 2048, "vocab_size": 51200}
_LLAMA = {"normalization": "RMSNorm", "position_embedding_type": "rope", "swiglu": True,
          "untie_embeddings_and_output_weights": True, "disable_bias_linear": True,
          "vocab_size": 32000}

PRESETS: dict[str, dict[str, Any]] = {
    "gpt3-6.7b": {**_GPT3, "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32},
    "gpt3-13b": {**_GPT3, "num_layers": 40, "hidden_size": 5120, "num_attention_heads": 40},
    "gpt3-175b": {**_GPT3, "num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96},
    "llama-7b": {**_LLAMA, "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                 "ffn_hidden_size": 11008, "seq_length": 2048, "norm_epsilon": 1e-6},
    "llama-65b": {**_LLAMA, "num_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                  "ffn_hidden_size": 22016, "seq_length": 2048, "norm_epsilon": 1e-5},
    "llama-70b": {**_LLAMA, "num_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                  "group_query_attention": True, "num_query_groups": 8, "ffn_hidden_size": 28672,
                  "seq_length": 4096, "norm_epsilon": 1e-5},
    "llama-405b": {**_LLAMA, "num_layers": 126, "hidden_size": 16384, "num_attention_heads": 128,
                   "group_query_attention": True, "num_query_groups": 8, "ffn_hidden_size": 53248,
                   "seq_length": 8192, "vocab_size": 128256, "norm_epsilon": 1e-5,
                   "rotary_base": 500000.0},
    # A few-MB model for examples and tests: runs for real on a CPU in seconds and still
    # exercises tp/pp/vpp (8 layers, 4 heads) at small world sizes. Two iterations, so a capture
    # keeps a steady-state one; a real run wants --train-iters 8 to see the loss fall.
    "tiny": {"num_layers": 8, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 256,
             "seq_length": 64, "max_position_embeddings": 64, "vocab_size": 1000,
             "micro_batch_size": 2, "global_batch_size": 8, "train_iters": 2, "lr": 3e-3,
             "hidden_dropout": 0.0},
}
"""Preset name -> {argparse dest: value}."""


def get_preset(name: str) -> dict[str, Any]:
    """The argument values of preset ``name``; unknown names raise listing the valid ones."""
    try:
        return dict(PRESETS[name])
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}") from None
