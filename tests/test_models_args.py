"""Megatron flag parsing, presets, vocab padding, stage splits and the config errors."""

from __future__ import annotations

import pytest

from heterosim.errors import ConfigError
from models.args import pad_vocab_size, parse_args
from models.presets import PRESETS, get_preset


def test_vocab_padding_as_megatron():
    """Vocab rounds up to a multiple of make_vocab_size_divisible_by x tp."""
    assert pad_vocab_size(50257, 128, 1) == 50304
    assert pad_vocab_size(50257, 128, 8) == 51200
    assert pad_vocab_size(128256, 128, 8) == 129024
    assert pad_vocab_size(51200, 128, 8) == 51200


def test_gpt3_175b_preset():
    """GPT-3 175B: 96 layers, h 12288, 96 heads, seq 2048, vocab 51200, GeLU, LayerNorm, tied."""
    cfg = parse_args(["--preset", "gpt3-175b", "--tensor-model-parallel-size", "8",
                      "--pipeline-model-parallel-size", "8", "--global-batch-size", "1536"], 1024)
    m = cfg.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length, m.vocab_size) == \
        (96, 12288, 96, 2048, 51200)
    assert (m.activation, m.normalization, m.ffn_size, m.untie_embeddings_and_output_weights) == \
        ("gelu", "LayerNorm", 49152, False)
    assert (cfg.parallel.dp, cfg.num_microbatches, cfg.stage_layers) == (16, 96, (12,) * 8)


def test_llama_405b_preset():
    """LLaMA-3.1 405B: 126 layers, h 16384, 128 heads, 8 KV heads, ffn 53248, vocab 128256
    (padded to 129024 at tp 8), seq 8192, RoPE, RMSNorm, SwiGLU, untied, no linear biases."""
    cfg = parse_args(["--preset", "llama-405b", "--tensor-model-parallel-size", "8",
                      "--pipeline-model-parallel-size", "9", "--bf16"], 72)
    m = cfg.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.ffn_size) == \
        (126, 16384, 128, 8, 53248)
    assert (m.vocab_size, m.seq_length, m.position_embedding_type, m.normalization, m.activation) == \
        (129024, 8192, "rope", "RMSNorm", "swiglu")
    assert m.untie_embeddings_and_output_weights and not m.add_bias_linear
    assert m.rotary_base == 500000.0 and cfg.train.params_dtype == "bf16"


def test_every_preset_parses():
    """Every preset builds a valid config at world size 1."""
    for name in PRESETS:
        assert parse_args(["--preset", name], 1).preset == name


def test_explicit_flags_override_preset():
    """An explicit flag beats the preset, which beats Megatron's default."""
    cfg = parse_args(["--preset", "gpt3-175b", "--num-layers", "48", "--seq-length", "4096"], 1)
    assert (cfg.model.num_layers, cfg.model.seq_length, cfg.model.hidden_size) == (48, 4096, 12288)
    assert cfg.optim.lr == 1e-4 and cfg.model.hidden_dropout == 0.1


def test_swiglu_default_ffn_and_gqa():
    """--swiglu without --ffn-hidden-size gives int(8h/3 / 64) * 64; GQA takes its group count."""
    cfg = parse_args(["--num-layers", "2", "--hidden-size", "4096", "--num-attention-heads", "32",
                      "--seq-length", "128", "--vocab-size", "1000", "--swiglu",
                      "--group-query-attention", "--num-query-groups", "8"], 1)
    assert cfg.model.ffn_size == 10880 and cfg.model.num_kv_heads == 8


def test_global_batch_defaults_to_micro_times_dp():
    """Without --global-batch-size one micro-batch per DP replica."""
    cfg = parse_args(["--preset", "tiny", "--global-batch-size", "4", "--micro-batch-size", "1"], 2)
    assert cfg.num_microbatches == 2
    cfg = parse_args(["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2",
                      "--seq-length", "8", "--vocab-size", "10", "--micro-batch-size", "3"], 4)
    assert (cfg.train.global_batch_size, cfg.num_microbatches) == (12, 1)


def test_explicit_and_first_last_stage_layers():
    """--pipeline-stage-layers gives each stage's count; first/last pin the ends."""
    cfg = parse_args(["--preset", "tiny", "--num-layers", "48", "--pipeline-model-parallel-size", "4",
                      "--pipeline-stage-layers", "10,14,14,10"], 4)
    assert cfg.stage_layers == (10, 14, 14, 10) and cfg.parallel.stage_layers == (10, 14, 14, 10)
    cfg = parse_args(["--preset", "tiny", "--num-layers", "30", "--pipeline-model-parallel-size", "4",
                      "--decoder-first-pipeline-num-layers", "6", "--decoder-last-pipeline-num-layers", "6"], 4)
    assert cfg.stage_layers == (6, 9, 9, 6)


def test_virtual_pipeline_chunks():
    """vpp = layers per stage / --num-layers-per-virtual-pipeline-stage; 1 means no interleaving."""
    base = ["--preset", "tiny", "--pipeline-model-parallel-size", "2", "--global-batch-size", "8"]
    assert parse_args(base + ["--num-layers-per-virtual-pipeline-stage", "2"], 2).parallel.vpp == 2
    assert parse_args(base + ["--num-layers-per-virtual-pipeline-stage", "4"], 2).parallel.vpp is None
    assert parse_args(base, 2).layout()["vpp"] is None


def test_layout_and_model_keys_for_declare():
    """layout() and model_info() carry the keys the annotator documents."""
    cfg = parse_args(["--preset", "tiny", "--tensor-model-parallel-size", "2", "--sequence-parallel"], 4)
    assert set(cfg.layout()) == {"tp", "pp", "dp", "cp", "ep", "vpp", "sequence_parallel",
                                 "micro_batch_size", "global_batch_size", "num_microbatches",
                                 "seq_length", "recompute", "distributed_optimizer", "stage_layers"}
    assert cfg.layout()["sequence_parallel"] is True and cfg.layout()["dp"] == 2
    assert set(cfg.model_info()) == {"num_layers", "hidden_size", "num_attention_heads",
                                     "num_query_groups", "ffn_hidden_size", "vocab_size", "seq_length",
                                     "activation", "normalization", "num_experts", "params_dtype", "fp8"}


@pytest.mark.parametrize("argv,world,message", [
    (["--preset", "tiny", "--bogus-flag", "3"], 1, "unrecognized arguments: --bogus-flag 3"),
    (["--preset", "tiny", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "3"], 8,
     "world size 8 is not divisible by tp*pp*cp = 2*3*1 = 6; choose sizes whose product divides it"),
    (["--preset", "tiny", "--global-batch-size", "6"], 4,
     "global batch size 6 is not divisible by micro-batch size 2 x data-parallel size 4 = 8"),
    (["--preset", "tiny", "--num-layers", "6", "--pipeline-model-parallel-size", "4"], 4,
     "6 layers do not split over 4 pipeline stages with first=None, last=None: the remaining 6 "
     "layers must divide evenly over 4 stages"),
    (["--preset", "tiny", "--num-layers", "48", "--pipeline-model-parallel-size", "4",
      "--pipeline-stage-layers", "10,14,14,11"], 4,
     "explicit stage layers (10, 14, 14, 11) sum to 49, but --num-layers is 48; make them add up"),
    (["--preset", "tiny", "--pipeline-model-parallel-size", "2", "--pipeline-stage-layers", "4,4",
      "--decoder-first-pipeline-num-layers", "4"], 2,
     "--pipeline-stage-layers cannot be combined with --decoder-first/last-pipeline-num-layers; give one of them"),
    (["--preset", "tiny", "--tensor-model-parallel-size", "8"], 8,
     "--num-attention-heads 4 is not divisible by --tensor-model-parallel-size 8"),
    (["--preset", "tiny", "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "2",
      "--global-batch-size", "6"], 2,
     "the interleaved schedule needs the number of micro-batches (3 = 6 / (2 x dp 1)) to be a multiple "
     "of --pipeline-model-parallel-size 2"),
    (["--preset", "tiny", "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "3"], 2,
     "layers per stage (4, 4) are not all the same multiple of --num-layers-per-virtual-pipeline-stage 3"),
    (["--preset", "tiny", "--bf16", "--fp16"], 1, "--bf16 and --fp16 are exclusive; pick one"),
    (["--preset", "tiny", "--fp16", "--grad-reduce-in-bf16"], 1, "--grad-reduce-in-bf16 needs --bf16"),
    (["--preset", "tiny", "--tp-comm-overlap"], 1, "--tp-comm-overlap needs --sequence-parallel"),
    (["--preset", "tiny", "--sequence-parallel", "--tp-comm-overlap", "--tp-comm-overlap-sm-margin", "proj_fprop"], 1,
     "--tp-comm-overlap-sm-margin item 'proj_fprop' is not NAME=N with NAME one of proj_fprop, fc2_fprop "
     "and N a positive number of SMs"),
    (["--preset", "tiny", "--tp-comm-overlap-sm-margin", "fc2_fprop=16"], 1,
     "--tp-comm-overlap-sm-margin needs --tp-comm-overlap"),
    (["--preset", "tiny", "--tp-comm-overlap-aggregate", "qkv_fprop"], 1,
     "--tp-comm-overlap-aggregate needs --tp-comm-overlap"),
    (["--preset", "tiny", "--tp-comm-overlap-fp8-buf", "proj_fprop"], 1,
     "--tp-comm-overlap-fp8-buf needs --tp-comm-overlap"),
    (["--preset", "tiny", "--sequence-parallel", "--tp-comm-overlap", "--tp-comm-overlap-fp8-buf", "qkv_fprop"], 1,
     "--tp-comm-overlap-fp8-buf names 'qkv_fprop', not a pipelined reduce-scatter overlap; valid: proj_fprop, "
     "fc2_fprop"),
    (["--preset", "tiny", "--sequence-parallel", "--tp-comm-overlap", "--tp-comm-overlap-aggregate", "qkv_dgrad"], 1,
     "--tp-comm-overlap-aggregate names 'qkv_dgrad', not a ring-exchange overlap; valid: qkv_fprop, "
     "fc1_fprop, proj_dgrad, fc2_dgrad"),
    (["--preset", "tiny", "--bf16", "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"], 1,
     "--grad-reduce-in-bf16 and --accumulate-allreduce-grads-in-fp32 are exclusive; pick one"),
    (["--preset", "tiny", "--overlap-param-gather", "--use-distributed-optimizer"], 1,
     "--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce"),
    (["--hidden-size", "8"], 1,
     "missing --num-layers, --num-attention-heads, --seq-length, --vocab-size; give them or a --preset NAME"),
    (["--preset", "gpt4"], 1, "unknown preset 'gpt4'; valid presets: gpt3-13b, gpt3-175b, gpt3-6.7b, "
     "llama-405b, llama-65b, llama-70b, llama-7b, tiny"),
    (["--preset", "tiny", "--group-query-attention", "--num-query-groups", "3"], 1,
     "--num-query-groups 3 must divide --num-attention-heads 4"),
    (["--preset", "tiny", "--fp8-recipe", "tensorwise"], 1, "--fp8-recipe tensorwise needs --fp8-format"),
    (["--preset", "tiny", "--fp8-recipe", "nvfp4"], 1, "argument --fp8-recipe: invalid choice: 'nvfp4'"),
    (["--preset", "tiny", "--bf16", "--fp8-format", "hybrid", "--fp4-format", "e2m1"], 1,
     "--fp4-format and --fp8-format are exclusive; pick one"),
    (["--preset", "tiny", "--bf16", "--fp4-format", "e2m1", "--fp8-param-gather", "--use-distributed-optimizer"], 1,
     "--fp8-param-gather with --fp4-format is not supported: NVFP4 runs keep bf16 parameters"),
    (["--preset", "tiny", "--bf16", "--first-last-layers-bf16"], 1,
     "--first-last-layers-bf16 needs --fp8-format or --fp4-format"),
    (["--preset", "tiny", "--bf16", "--fp4-format", "mxfp4"], 1, "argument --fp4-format: invalid choice: 'mxfp4'"),
    (["--preset", "tiny", "--num-experts", "4", "--moe-layer-freq", "[0]*3"], 1,
     "--moe-layer-freq '[0]*3' gives 3 layers of [0]; need 8 (--num-layers) values of 0 or 1"),
    (["--preset", "tiny", "--num-experts", "4", "--moe-layer-freq", "[0]*9**9"], 1,
     "--moe-layer-freq '[0]*9**9': give an integer or a list expression of 0s and 1s such as '[0]*3+[1]*58'"),
    (["--preset", "tiny", "--num-experts", "4", "--moe-layer-freq", "[0]*999999999"], 1,
     "--moe-layer-freq '[0]*999999999': give an integer or a list expression of 0s and 1s such as '[0]*3+[1]*58'"),
    (["--preset", "tiny", "--num-experts", "4", "--moe-layer-freq", "__import__('os')"], 1,
     "--moe-layer-freq \"__import__('os')\": give an integer or a list expression of 0s and 1s such as "
     "'[0]*3+[1]*58'"),
])
def test_config_errors_name_the_values(argv, world, message):
    """Each mistake raises one ConfigError whose message names the offending values."""
    with pytest.raises(ConfigError) as err:
        parse_args(argv, world)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("flags, fp32", [
    (["--bf16"], True),  # Megatron forces fp32 accumulation and all-reduce with bf16
    (["--bf16", "--grad-reduce-in-bf16"], False),
    (["--fp16"], False),
    (["--fp16", "--accumulate-allreduce-grads-in-fp32"], True),
    ([], False),  # fp32 parameters: the buffer is fp32 anyway
])
def test_gradient_reduction_precision(flags, fp32):
    assert parse_args(["--preset", "tiny", *flags], 1).optim.grad_reduce_in_fp32 is fp32


def test_get_preset_returns_a_copy():
    """Presets are not mutated through get_preset."""
    get_preset("tiny")["num_layers"] = 99
    assert PRESETS["tiny"]["num_layers"] == 8


def test_async_tp_allreduce_flag():
    """The column-parallel input-gradient all-reduce is async unless
    --no-async-tensor-model-parallel-allreduce says otherwise (Megatron-LM's flag)."""
    base = ["--preset", "tiny", "--tensor-model-parallel-size", "2"]
    assert parse_args(base, 2).parallel.async_tp_allreduce is True
    assert parse_args(base + ["--no-async-tensor-model-parallel-allreduce"], 2).parallel.async_tp_allreduce is False


def test_tp_comm_overlap_aggregate_names_ring_exchanges():
    """--tp-comm-overlap-aggregate keeps the named ring-exchange overlaps (TE's aggregate: 1)."""
    cfg = parse_args(["--preset", "tiny", "--sequence-parallel", "--tp-comm-overlap",
                      "--tp-comm-overlap-aggregate", "qkv_fprop, fc2_dgrad"], 2)
    assert cfg.parallel.tp_comm_aggregate == ("qkv_fprop", "fc2_dgrad")
    assert parse_args(["--preset", "tiny"], 1).parallel.tp_comm_aggregate == ()


def test_tp_comm_overlap_fp8_buf_names():
    """--tp-comm-overlap-fp8-buf proj_fprop,fc2_fprop (the Llama 3.1 405B recipe's fp8 runs)."""
    cfg = parse_args(["--preset", "tiny", "--sequence-parallel", "--tp-comm-overlap",
                      "--tp-comm-overlap-fp8-buf", "proj_fprop, fc2_fprop"], 2)
    assert cfg.parallel.tp_comm_fp8_buf == ("proj_fprop", "fc2_fprop")
    assert parse_args(["--preset", "tiny"], 1).parallel.tp_comm_fp8_buf == ()


def test_tp_comm_overlap_sm_margin_pairs():
    """--tp-comm-overlap-sm-margin proj_fprop=24,fc2_fprop=20 (the GPT-3 175B recipe's num_sm)."""
    cfg = parse_args(["--preset", "tiny", "--sequence-parallel", "--tp-comm-overlap",
                      "--tp-comm-overlap-sm-margin", "proj_fprop=24,fc2_fprop=20"], 2)
    assert cfg.parallel.tp_comm_sm_margin == (("proj_fprop", 24), ("fc2_fprop", 20))


def test_fp8_recipe_reaches_the_train_config():
    """--fp8-recipe (Megatron-core's flag): delayed unless named; tensorwise is current scaling."""
    assert parse_args(["--preset", "tiny", "--bf16", "--fp8-format", "hybrid"], 1).train.fp8_recipe == "delayed"
    cfg = parse_args(["--preset", "tiny", "--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"], 1)
    assert (cfg.train.fp8, cfg.train.fp8_recipe) == ("hybrid", "tensorwise")


def test_fp4_format_runs_the_nvfp4_recipe_and_bf16_layers_reach_the_config():
    """--fp4-format e2m1 turns the low-precision GEMMs on with the nvfp4 recipe (Megatron-core's
    --fp4-recipe default); --first-last-layers-bf16 keeps 1 + 1 layers out unless counts are given."""
    cfg = parse_args(["--preset", "tiny", "--bf16", "--fp4-format", "e2m1"], 1)
    assert (cfg.train.fp8, cfg.train.fp8_recipe, cfg.train.bf16_layers) == ("e2m1", "nvfp4", (0, 0))
    assert cfg.parallel.amax_reduction_group is False  # current scaling: no amax history to reduce
    cfg = parse_args(["--preset", "tiny", "--bf16", "--fp4-format", "e2m1", "--first-last-layers-bf16"], 1)
    assert cfg.train.bf16_layers == (1, 1)
    cfg = parse_args(["--preset", "tiny", "--bf16", "--fp8-format", "hybrid", "--first-last-layers-bf16",
                      "--num-layers-at-start-in-bf16", "0", "--num-layers-at-end-in-bf16", "2"], 1)
    assert cfg.train.bf16_layers == (0, 2)


def test_deepseek_flags_reach_the_model_config():
    """MLA ranks and head dims, shared experts and --moe-layer-freq (an int: every N-th layer from the
    first; a list expression: layer by layer) as Megatron-core names them."""
    cfg = parse_args(["--preset", "tiny", "--multi-latent-attention", "--q-lora-rank", "64", "--kv-lora-rank", "32",
                      "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16", "--num-experts", "4",
                      "--moe-shared-expert-intermediate-size", "96", "--moe-layer-freq", "[0]*2+[1]*6"], 1)
    m = cfg.model
    assert (m.multi_latent_attention, m.q_lora_rank, m.kv_lora_rank, m.qk_head_dim, m.qk_pos_emb_head_dim,
            m.v_head_dim, m.rotary_dim) == (True, 64, 32, 16, 8, 16, 8)
    assert m.moe_shared_expert_intermediate_size == 96 and m.moe_layer_pattern == (0, 0, 1, 1, 1, 1, 1, 1)
    assert [m.is_moe_layer(i) for i in (0, 2)] == [False, True]
    every2 = parse_args(["--preset", "tiny", "--num-experts", "4", "--moe-layer-freq", "2"], 1).model
    assert every2.moe_layer_pattern == (1, 0, 1, 0, 1, 0, 1, 0)


def test_amax_reduction_group_for_delayed_fp8_only():
    """Delayed scaling all-reduces amaxes over Megatron-core's amax group; current scaling and bf16 don't."""
    def flag(*extra):
        return parse_args(["--preset", "tiny", "--bf16", *extra], 1).parallel.amax_reduction_group
    assert flag("--fp8-format", "hybrid") is True
    assert flag("--fp8-format", "hybrid", "--fp8-recipe", "tensorwise") is False
    assert flag() is False


def test_hybrid_pattern_and_mamba_sizes_reach_the_model_config():
    """--hybrid-override-pattern gives each layer's kind (and --num-layers when it is not given); the
    --mamba-* sizes as Megatron-core names them, the head count defaulting to 2 h / head dim."""
    base = ["--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32", "--vocab-size", "128"]
    m = parse_args(base + ["--hybrid-override-pattern", "M-M*-", "--mamba-state-dim", "16", "--mamba-head-dim", "8",
                           "--mamba-num-groups", "4"], 1).model
    assert (m.num_layers, m.hybrid_layer_pattern, m.mamba_state_dim, m.mamba_head_dim, m.mamba_num_groups,
            m.mamba_heads) == (5, "M-M*-", 16, 8, 4, 16)
    assert [m.layer_kind(i) for i in range(5)] == ["mamba", "mlp", "mamba", "attention", "mlp"]
    assert parse_args(base + ["--hybrid-override-pattern", "M*", "--mamba-num-heads", "6", "--mamba-num-groups", "2"],
                      1).model.mamba_heads == 6
    assert parse_args(base + ["--num-layers", "2", "--qk-layernorm"], 1).model.qk_layernorm
    assert not parse_args(base + ["--num-layers", "2"], 1).model.qk_layernorm
    gptoss = parse_args(base + ["--num-layers", "2", "--window-size", "127,0", "--window-attn-skip-freq", "2",
                                "--softmax-type", "learnable"], 1).model
    assert (gptoss.window_size, gptoss.window_attn_skip_freq, gptoss.softmax_type) == (127, 2, "learnable")
    with pytest.raises(ConfigError, match=r"--window-size '127,5': give 'L,0' \(L earlier keys, none after"):
        parse_args(base + ["--num-layers", "2", "--window-size", "127,5"], 1)
    with pytest.raises(ConfigError, match=r"--hybrid-override-pattern has 2 symbols but --num-layers is 3"):
        parse_args(base + ["--num-layers", "3", "--hybrid-override-pattern", "M*"], 1)


def test_pipeline_layout_and_mtp_reach_the_configs():
    """--pipeline-model-parallel-layout gives vpp and the layers of each virtual stage (traced as
    virtual_stage_layers); it cannot be combined with another split; --mtp-num-layers reaches the model."""
    base = ["--preset", "tiny", "--num-layers", "5", "--pipeline-model-parallel-size", "2", "--global-batch-size", "8"]
    cfg = parse_args(base + ["--pipeline-model-parallel-layout", "Et|tt|t|tmL", "--mtp-num-layers", "1",
                             "--untie-embeddings-and-output-weights"], 2)
    assert (cfg.parallel.vpp, cfg.parallel.virtual_stage_layers, cfg.stage_layers) == (2, (1, 2, 1, 1), (2, 3))
    assert cfg.layout()["virtual_stage_layers"] == [1, 2, 1, 1] and cfg.model.mtp_num_layers == 1
    assert "virtual_stage_layers" not in parse_args(base[:-2] + ["--global-batch-size", "8", "--num-layers", "4"],
                                                    2).layout()
    with pytest.raises(ConfigError, match=r"--pipeline-model-parallel-layout cannot be combined with "
                                          r"--num-layers-per-virtual-pipeline-stage"):
        parse_args(base + ["--pipeline-model-parallel-layout", "Et|tt|t|tL",
                           "--num-layers-per-virtual-pipeline-stage", "1"], 2)


def test_flex_dispatcher_domain_from_the_backend(monkeypatch):
    """--moe-token-dispatcher-type flex: DeepEP's NVLink domain is 8 ranks; HybridEP's comes from
    NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN (8 when unset); the all-to-all dispatcher has none."""
    base = ["--preset", "tiny", "--num-experts", "8", "--expert-model-parallel-size", "8", "--global-batch-size", "16"]
    flex = base + ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend"]
    assert parse_args(base, 8).parallel.ep_nvl_domain is None
    assert parse_args(flex + ["deepep"], 8).parallel.ep_nvl_domain == 8
    monkeypatch.setenv("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", "4")
    assert parse_args(flex + ["hybridep"], 8).parallel.ep_nvl_domain == 4
    monkeypatch.setenv("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", "3")
    with pytest.raises(ConfigError, match=r"flex dispatcher: 3 EP ranks per NVLink domain do not divide "
                                          r"--expert-model-parallel-size 8; give a domain size that divides it"):
        parse_args(flex + ["hybridep"], 8)
    with pytest.raises(ConfigError, match=r"--moe-token-dispatcher-type flex needs --moe-flex-dispatcher-backend "
                                          r"deepep or hybridep"):
        parse_args(base + ["--moe-token-dispatcher-type", "flex"], 8)


def test_permute_fusion_belongs_to_hybridep():
    """--moe-permute-fusion-into-hybridep (Megatron-core's moe_permute_fusion_into_hybridep) sets the
    model's flag with HybridEP and is refused with DeepEP or the all-to-all dispatcher."""
    base = ["--preset", "tiny", "--num-experts", "8", "--expert-model-parallel-size", "8", "--global-batch-size", "16",
            "--moe-permute-fusion-into-hybridep"]
    flex = base + ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend"]
    assert parse_args(flex + ["hybridep"], 8).model.moe_permute_fusion_into_hybridep is True
    assert parse_args(base[:-1], 8).model.moe_permute_fusion_into_hybridep is False
    with pytest.raises(ConfigError, match=r"^--moe-permute-fusion-into-hybridep needs --moe-flex-dispatcher-backend "
                                          r"hybridep$"):
        parse_args(flex + ["deepep"], 8)
    with pytest.raises(ConfigError, match=r"^--moe-permute-fusion-into-hybridep needs --moe-token-dispatcher-type "
                                          r"flex --moe-flex-dispatcher-backend hybridep$"):
        parse_args(base, 8)
