"""Megatron-LM command-line flags -> validated :class:`RunConfig` for ``pretrain_gpt.py``.

Flag names are Megatron-LM's (``--num-layers``, ``--tensor-model-parallel-size`` ...), plus
``--preset NAME`` (see :mod:`models.presets`; explicit flags override it) and
``--pipeline-stage-layers 10,14,14,10`` (layers per pipeline stage, the non-uniform split a
heterogeneous cluster needs). Defaults are Megatron's where Megatron has one.

Every mistake raises ONE :class:`~heterosim.errors.ConfigError` naming the values: unknown flags
(argparse's message), tp*pp*cp not dividing the world, a global batch not divisible by
micro-batch x dp, layers that do not split over the stages, heads not divisible by tp, ...

Example::

    cfg = parse_args(["--preset", "gpt3-175b", "--tensor-model-parallel-size", "8",
                      "--pipeline-model-parallel-size", "8", "--global-batch-size", "1536"],
                     world_size=1024)
    cfg.parallel.dp, cfg.num_microbatches, cfg.model.vocab_size    # (16, 96, 51200)
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

from heterosim.errors import ConfigError
from models.config import ATTENTION_BACKENDS, ModelConfig, ParallelConfig, TrainConfig
from models.layers.fp8 import FP4_RECIPES, FP8_RECIPES
from models.ep_overlap import ep_overlap_flag
from models.layers.moe_flex import flex_domain
from models.layers.recompute import RECOMPUTE_MODULES, selective_modules
from models.layers.tp_overlap import PIPELINE_OPS, RING_EXCHANGE_OPS
from models.parallel_state import parse_pipeline_layout, split_stage_layers
from models.presets import get_preset

__all__ = ["OptimConfig", "RunConfig", "build_parser", "pad_vocab_size", "parse_args"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimConfig:
    """Optimizer and gradient-sync knobs (Megatron ``--lr``, ``--clip-grad`` ...)."""

    lr: float
    weight_decay: float
    clip_grad: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    loss_scale: float | None
    """Static fp16 loss scale (None for bf16/fp32)."""
    bucket_size: int | None
    """``--ddp-bucket-size`` in elements (None: Megatron's default)."""
    align_grad_reduce: bool
    """False with ``--no-align-grad-reduce``: every stage reduces from grad hooks."""
    align_param_gather: bool = True
    """False with ``--no-align-param-gather``: overlapped parameter all-gathers are dispatched by
    forward pre-hooks only, not ahead of each interleaved chunk by the schedule."""
    grad_reduce_in_fp32: bool = False
    """Gradients accumulated and reduced in fp32 (``--accumulate-allreduce-grads-in-fp32``; Megatron
    forces it with ``--bf16`` unless ``--grad-reduce-in-bf16``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """Everything ``pretrain_gpt.py`` needs, validated against the world size."""

    model: ModelConfig
    parallel: ParallelConfig
    train: TrainConfig
    optim: OptimConfig
    num_microbatches: int
    """Micro-batches per iteration per data-parallel replica."""
    stage_layers: tuple[int, ...]
    """Layers per pipeline stage (all chunks of the stage together)."""
    seed: int
    preset: str | None

    def layout(self) -> dict[str, Any]:
        """The parallel layout for :meth:`heterosim.annotate.Annotator.declare`."""
        p, t = self.parallel, self.train
        return {"tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "ep": p.ep, "vpp": p.vpp,
                "sequence_parallel": p.sequence_parallel and p.tp > 1,
                "micro_batch_size": t.micro_batch_size, "global_batch_size": t.global_batch_size,
                "num_microbatches": self.num_microbatches, "seq_length": self.model.seq_length,
                "recompute": t.recompute_granularity, "distributed_optimizer": p.use_distributed_optimizer,
                **({"recompute_modules": list(t.recompute_modules)}
                   if t.recompute_granularity == "selective" and t.recompute_modules != ("core_attn",) else {}),
                "stage_layers": list(self.stage_layers),
                **({"virtual_stage_layers": list(p.virtual_stage_layers)} if p.virtual_stage_layers else {}),
                **({"expert_tensor_parallel": p.etp} if p.etp is not None and p.etp != p.tp else {}),
                # Only when set, so that other traces stay byte-identical.
                **({"megatron_fsdp": True} if p.use_megatron_fsdp else {})}

    def model_info(self) -> dict[str, Any]:
        """The model description for :meth:`heterosim.annotate.Annotator.declare`."""
        m = self.model
        return {"num_layers": m.num_layers, "hidden_size": m.hidden_size,
                "num_attention_heads": m.num_attention_heads, "num_query_groups": m.num_kv_heads,
                "ffn_hidden_size": m.ffn_size, "vocab_size": m.vocab_size, "seq_length": m.seq_length,
                "activation": m.activation, "normalization": m.normalization,
                "num_experts": m.num_experts, "params_dtype": self.train.params_dtype,
                "fp8": self.train.fp8,
                # Only when not the default, so that auto traces stay byte-identical.
                **({"attention_backend": m.attention_backend, "attention_dropout": m.attention_dropout}
                   if m.attention_backend != "auto" else {})}


# dest -> default for every flag whose value a preset may set (argparse defaults are None so
# that an explicit flag can be told apart from an absent one).
_DEFAULTS: dict[str, Any] = {
    "num_layers": None, "hidden_size": None, "num_attention_heads": None, "num_query_groups": 1,
    "group_query_attention": False, "ffn_hidden_size": None, "kv_channels": None,
    "seq_length": None, "max_position_embeddings": None, "vocab_size": None,
    "make_vocab_size_divisible_by": 128, "micro_batch_size": 1, "global_batch_size": None,
    "train_iters": 1, "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
    "num_layers_per_virtual_pipeline_stage": None, "decoder_first_pipeline_num_layers": None,
    "decoder_last_pipeline_num_layers": None, "pipeline_stage_layers": None,
    "context_parallel_size": 1, "cp_comm_type": "p2p", "expert_model_parallel_size": 1,
    "num_experts": None, "moe_router_topk": 2, "moe_ffn_hidden_size": None,
    "sequence_parallel": False, "recompute_granularity": None, "recompute_method": None,
    "recompute_num_layers": None, "use_distributed_optimizer": False, "overlap_grad_reduce": False,
    "no_async_tensor_model_parallel_allreduce": False, "scatter_gather_tensors_in_pipeline": False,
    "overlap_param_gather": False, "fp8_param_gather": False, "no_align_grad_reduce": False,
    "no_align_param_gather": False, "use_megatron_fsdp": False, "data_parallel_sharding_strategy": "no_shard",
    "no_bias_swiglu_fusion": False, "no_rope_fusion": False, "cross_entropy_loss_fusion": False,
    "account_for_embedding_in_pipeline_split": False, "account_for_loss_in_pipeline_split": False, "ddp_bucket_size": None, "bf16": False, "fp16": False,
    "accumulate_allreduce_grads_in_fp32": False, "grad_reduce_in_bf16": False, "tp_comm_overlap": False,
    "tp_comm_overlap_aggregate": None, "tp_comm_overlap_sm_margin": None, "tp_comm_overlap_fp8_buf": None,
    "overlap_p2p_communication": False,
    "fp8_format": None, "fp8_recipe": "delayed", "fp4_format": None, "fp4_recipe": "nvfp4",
    "first_last_layers_bf16": False, "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 1,
    "multi_latent_attention": False, "q_lora_rank": None, "kv_lora_rank": 512, "qk_head_dim": 128,
    "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "moe_layer_freq": None, "moe_shared_expert_intermediate_size": None, "swiglu": False, "squared_relu": False, "normalization": "LayerNorm",
    "position_embedding_type": "learned_absolute", "untie_embeddings_and_output_weights": False,
    "disable_bias_linear": False, "hidden_dropout": 0.1, "norm_epsilon": 1e-5,
    "init_method_std": 0.02, "rotary_base": 10000.0, "attention_backend": "auto",
    "attention_dropout": 0.0, "lr": 1e-4, "weight_decay": 0.01,
    "clip_grad": 1.0, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": 1e-8,
    "loss_scale": None, "seed": 1234, "hybrid_override_pattern": None, "mamba_state_dim": 128,
    "mamba_head_dim": 64, "mamba_num_groups": 8, "mamba_num_heads": None, "qk_layernorm": False,
    "window_size": None, "window_attn_skip_freq": None, "softmax_type": "vanilla",
    "pipeline_model_parallel_layout": None, "expert_tensor_parallel_size": None, "mtp_num_layers": 0,
    "mtp_loss_scaling_factor": 0.1, "moe_token_dispatcher_type": "alltoall", "moe_flex_dispatcher_backend": None,
    "moe_permute_fusion_into_hybridep": False, "recompute_modules": None, "overlap_moe_expert_parallel_comm": False,
}


class _Parser(argparse.ArgumentParser):
    """argparse that raises :class:`ConfigError` instead of printing and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    """The flag set of ``pretrain_gpt.py`` (Megatron names)."""
    p = _Parser(prog="pretrain_gpt.py", allow_abbrev=False,
                description="Megatron-style GPT/LLaMA pretraining (runs for real or under capture).")

    def add(flag: str, typ: Any = None, choices: Sequence[str] | None = None, help: str = "") -> None:
        dest = flag[2:].replace("-", "_")
        default = _DEFAULTS[dest]
        text = f"{help} (default: {default})" if help else f"(default: {default})"
        if typ is None:
            p.add_argument(flag, action="store_true", default=None, help=text)
        else:
            p.add_argument(flag, type=typ, choices=choices, default=None, help=text)

    p.add_argument("--preset", default=None, help="named architecture (models/presets.py)")
    for f in ("--num-layers", "--hidden-size", "--num-attention-heads", "--num-query-groups",
              "--ffn-hidden-size", "--kv-channels", "--seq-length", "--max-position-embeddings",
              "--vocab-size", "--make-vocab-size-divisible-by", "--micro-batch-size",
              "--global-batch-size", "--train-iters", "--tensor-model-parallel-size",
              "--pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
              "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
              "--context-parallel-size", "--expert-model-parallel-size", "--num-experts",
              "--moe-router-topk", "--moe-ffn-hidden-size", "--recompute-num-layers",
              "--ddp-bucket-size", "--seed", "--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16",
              "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim",
              "--moe-shared-expert-intermediate-size", "--mamba-state-dim", "--mamba-head-dim",
              "--mamba-num-groups", "--mamba-num-heads", "--window-attn-skip-freq", "--mtp-num-layers",
              "--expert-tensor-parallel-size"):
        add(f, int)
    for f in ("--hidden-dropout", "--norm-epsilon", "--init-method-std", "--rotary-base", "--lr",
              "--weight-decay", "--clip-grad", "--adam-beta1", "--adam-beta2", "--adam-eps",
              "--loss-scale", "--mtp-loss-scaling-factor"):
        add(f, float)
    for f in ("--group-query-attention", "--sequence-parallel", "--use-distributed-optimizer",
              "--overlap-grad-reduce", "--overlap-param-gather", "--fp8-param-gather",
              "--no-align-grad-reduce", "--no-align-param-gather", "--overlap-moe-expert-parallel-comm",
              "--no-bias-swiglu-fusion", "--no-rope-fusion", "--cross-entropy-loss-fusion", "--bf16",
              "--fp16", "--swiglu", "--squared-relu", "--untie-embeddings-and-output-weights",
              "--disable-bias-linear", "--no-async-tensor-model-parallel-allreduce",
              "--scatter-gather-tensors-in-pipeline", "--accumulate-allreduce-grads-in-fp32",
              "--grad-reduce-in-bf16", "--tp-comm-overlap", "--overlap-p2p-communication",
              "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split", "--qk-layernorm",
              "--first-last-layers-bf16", "--multi-latent-attention", "--moe-permute-fusion-into-hybridep"):
        add(f)
    add("--use-megatron-fsdp", help="fully sharded data parallelism as Megatron-core's Megatron-FSDP runs "
        "it (models/fsdp.py); needs --data-parallel-sharding-strategy optim_grads_params")
    add("--data-parallel-sharding-strategy", str, ("no_shard", "optim", "optim_grads", "optim_grads_params"),
        help="with --use-megatron-fsdp: what is sharded; optim_grads_params (parameters, gradients and "
             "optimizer state, ZeRO-3) is the one modelled")
    add("--tp-comm-overlap-aggregate", str,
        help="with --tp-comm-overlap: the ring-exchange overlaps whose GEMM takes two ring steps at "
             "a time (Transformer Engine's ub_tp_comm_overlap_cfg 'aggregate: 1'), comma-separated "
             f"from {','.join(RING_EXCHANGE_OPS)}")
    add("--tp-comm-overlap-sm-margin", str,
        help="with --tp-comm-overlap: SMs the pipelined reduce-scatter's GEMM leaves to its "
             "communication kernel, as NAME=N pairs (Transformer Engine's ub_tp_comm_overlap_cfg "
             f"num_sm with set_sm_margin: 1), NAME from {','.join(PIPELINE_OPS)}")
    add("--tp-comm-overlap-fp8-buf", str,
        help="with --tp-comm-overlap in fp8 runs: the pipelined reduce-scatters that move fp8 (the "
             "GEMM writes fp8 into the userbuffer; Transformer Engine's ub_tp_comm_overlap_cfg "
             f"'fp8_buf: true'), comma-separated from {','.join(PIPELINE_OPS)}")
    for f, choices in (("--cp-comm-type", "p2p all_gather a2a"), ("--recompute-granularity", "full selective"),
                       ("--recompute-method", "uniform block"), ("--moe-token-dispatcher-type", "alltoall flex"),
                       ("--moe-flex-dispatcher-backend", "deepep hybridep"), ("--fp8-format", "e4m3 hybrid"),
                       ("--normalization", "LayerNorm RMSNorm"),
                       ("--position-embedding-type", "learned_absolute rope none")):
        add(f, str, tuple(choices.split()))
    add("--fp8-recipe", str, FP8_RECIPES,
        help="how fp8 scales are chosen (Megatron-core's --fp8-recipe): delayed (from an amax history, "
             "Transformer Engine's DelayedScaling), tensorwise (current scaling: each tensor's own amax, "
             "Float8CurrentScaling, 'fp8-cs'), mxfp8 (an e8m0 scale per 32 values, MXFP8BlockScaling, "
             "Blackwell) or blockwise (an fp32 scale per 128-value block, Float8BlockScaling)")
    add("--moe-layer-freq", str,
        help="which layers are MoE (Megatron-core's --moe-layer-freq): N (every N-th, from the first) or "
             "a 0/1 list expression such as '[0]*3+[1]*58'")
    add("--fp4-format", str, ("e2m1",),
        help="fp4 GEMMs (Megatron-core's --fp4-format; exclusive with --fp8-format; Blackwell GPUs)")
    add("--fp4-recipe", str, FP4_RECIPES,
        help="how fp4 tensors are scaled: nvfp4 (Transformer Engine's NVFP4BlockScaling: e4m3 scales per "
             "16 elements, current per-tensor scaling, both copies quantized at once)")
    add("--hybrid-override-pattern", str,
        help="a hybrid Mamba / transformer model (Megatron-core's MambaModel; Nemotron-H): one symbol per "
             "layer, M a Mamba-2 mixer, * self-attention, - an MLP, E an MoE MLP (--num-layers defaults "
             "to its length)")
    add("--window-size", str, help="sliding-window attention as Megatron-core's window_size 'L,0': each query "
        "sees itself and L earlier keys (GPT-OSS: 127,0)")
    add("--softmax-type", str, ("vanilla", "learnable"), help="learnable: attention sinks, a learned logit per "
        "head in each softmax row (GPT-OSS)")
    add("--pipeline-stage-layers", str, help="layers per pipeline stage, e.g. 10,14,14,10")
    add("--pipeline-model-parallel-layout", str,
        help="Megatron-core's layout of every virtual pipeline stage in layer order, e.g. 'Et|(tt|)*30mL' "
             "(E embedding, t transformer layer, m MTP layer, L loss, | next stage; the stage count / pp gives vpp)")
    add("--attention-backend", str, ATTENTION_BACKENDS,
        help="core attention: auto (one fused kernel, priced by the GPU's default curve), flash "
             "(FlashAttention-2) or fused (cuDNN fused attention), Transformer Engine's two backends, "
             "or unfused (Megatron-LM 2020-21: baddbmm, fused scale-mask-softmax, dropout, bmm)")
    add("--attention-dropout", float, help="dropout on the attention probabilities, unfused backend only "
        "(Megatron-LM's argument default is 0.1, its modern LLM recipes set 0)")
    _add_list_flags(p)
    return p


def _add_list_flags(p: argparse.ArgumentParser) -> None:
    """Flags that take several words (Megatron's ``nargs``)."""
    p.add_argument("--recompute-modules", nargs="+", default=None, metavar="MODULE", help="with --recompute-granularity "
                   f"selective: what is recomputed, from {', '.join(RECOMPUTE_MODULES)} (default: core_attn)")


def pad_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Megatron ``_vocab_size_with_padding``: round up to a multiple of divisible_by x tp."""
    multiple = divisible_by * tp
    return math.ceil(vocab_size / multiple) * multiple


def _merged(ns: argparse.Namespace) -> dict[str, Any]:
    """Explicit flags over the preset over Megatron's defaults."""
    preset = get_preset(ns.preset) if ns.preset else {}
    unknown = set(preset) - set(_DEFAULTS)
    assert not unknown, f"preset {ns.preset} sets unknown keys {sorted(unknown)}"
    out = {}
    for dest, default in _DEFAULTS.items():
        explicit = getattr(ns, dest)
        out[dest] = explicit if explicit is not None else preset.get(dest, default)
    return out


def _layout_layers(a: dict[str, Any], pp: int) -> tuple[tuple[int, ...], int | None, tuple[int, ...]]:
    """Layers per stage, virtual chunks and layers per virtual stage of ``--pipeline-model-parallel-layout``."""
    others = [f for f in ("pipeline_stage_layers", "num_layers_per_virtual_pipeline_stage",
                          "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                          "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split") if a[f]]
    if others:
        raise ConfigError(f"--pipeline-model-parallel-layout cannot be combined with --{others[0].replace('_', '-')}; "
                          "the layout places every layer")
    virtual, vpp, _mtp = parse_pipeline_layout(a["pipeline_model_parallel_layout"], pp)
    split = split_stage_layers(a["num_layers"], pp, vpp=vpp, virtual=virtual)
    return tuple(sum(len(r) for r in chunks) for chunks in split), (vpp if vpp > 1 else None), virtual


def _stage_layers(a: dict[str, Any], pp: int) -> tuple[tuple[int, ...], int | None]:
    """Layers per stage and the number of virtual chunks (None without interleaving)."""
    explicit = None
    if a["pipeline_stage_layers"] is not None:
        try:
            explicit = [int(x) for x in a["pipeline_stage_layers"].split(",")]
        except ValueError:
            raise ConfigError(f"--pipeline-stage-layers {a['pipeline_stage_layers']!r} must be "
                              f"comma-separated integers, e.g. 10,14,14,10") from None
        if a["decoder_first_pipeline_num_layers"] is not None or a["decoder_last_pipeline_num_layers"] is not None:
            raise ConfigError("--pipeline-stage-layers cannot be combined with "
                              "--decoder-first/last-pipeline-num-layers; give one of them")
    embed, loss = a["account_for_embedding_in_pipeline_split"], a["account_for_loss_in_pipeline_split"]
    split = split_stage_layers(a["num_layers"], pp, first=a["decoder_first_pipeline_num_layers"],
                               last=a["decoder_last_pipeline_num_layers"], explicit=explicit,
                               embed_slot=embed, loss_slot=loss)
    counts = tuple(len(chunks[0]) for chunks in split)
    slots = tuple(int(embed and s == 0) + int(loss and s == pp - 1) for s in range(pp))
    per_chunk = a["num_layers_per_virtual_pipeline_stage"]
    if per_chunk is None:
        return counts, None
    if pp == 1:
        raise ConfigError("--num-layers-per-virtual-pipeline-stage needs "
                          "--pipeline-model-parallel-size > 1")
    vpps = {(c + e) // per_chunk if per_chunk > 0 and (c + e) % per_chunk == 0 else None
            for c, e in zip(counts, slots)}
    if None in vpps or len(vpps) != 1:
        raise ConfigError(
            f"layers per stage {counts} are not all the same multiple of "
            f"--num-layers-per-virtual-pipeline-stage {per_chunk}; every stage needs the same "
            f"number of virtual chunks")
    vpp = vpps.pop()
    return counts, (vpp if vpp > 1 else None)


def _overlap_ops(a: dict[str, Any], dest: str, valid: tuple[str, ...], kind: str) -> tuple[str, ...]:
    """A TP-overlap flag listing ``ub_tp_comm_overlap_cfg`` op names (``dest``), each checked
    against ``valid`` (the ``kind`` of overlap they must be)."""
    text = a[dest]
    if not text:
        return ()
    flag = "--" + dest.replace("_", "-")
    if not a["tp_comm_overlap"]:
        raise ConfigError(f"{flag} needs --tp-comm-overlap")
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in valid]
    if bad:
        raise ConfigError(f"{flag} names {bad[0]!r}, not a {kind} overlap; valid: {', '.join(valid)}")
    return names


def _aggregate(a: dict[str, Any]) -> tuple[str, ...]:
    """``--tp-comm-overlap-aggregate`` as op names, each checked."""
    return _overlap_ops(a, "tp_comm_overlap_aggregate", RING_EXCHANGE_OPS, "ring-exchange")


def _fp8_buf(a: dict[str, Any]) -> tuple[str, ...]:
    """``--tp-comm-overlap-fp8-buf`` as op names, each checked."""
    return _overlap_ops(a, "tp_comm_overlap_fp8_buf", PIPELINE_OPS, "pipelined reduce-scatter")


def _sm_margin(a: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    """``--tp-comm-overlap-sm-margin proj_fprop=24,fc2_fprop=20`` as (op, SMs) pairs, each checked."""
    text = a["tp_comm_overlap_sm_margin"]
    if not text:
        return ()
    if not a["tp_comm_overlap"]:
        raise ConfigError("--tp-comm-overlap-sm-margin needs --tp-comm-overlap")
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, _, num = item.partition("=")
        if name not in PIPELINE_OPS or not num.isdigit() or int(num) < 1:
            raise ConfigError(f"--tp-comm-overlap-sm-margin item {item!r} is not NAME=N with NAME one of "
                              f"{', '.join(PIPELINE_OPS)} and N a positive number of SMs")
        out.append((name, int(num)))
    return tuple(out)


def _check_exclusive(a: dict[str, Any]) -> None:
    """Flags that exclude or need one another (Megatron's arguments.py asserts the same)."""
    if a["bf16"] and a["fp16"]:
        raise ConfigError("--bf16 and --fp16 are exclusive; pick one")
    if a["overlap_p2p_communication"] and a["scatter_gather_tensors_in_pipeline"]:
        raise ConfigError("--overlap-p2p-communication and --scatter-gather-tensors-in-pipeline are "
                          "exclusive (Megatron-core, which overlaps p2p, has no scatter/gather); pick one")
    if a["tp_comm_overlap"] and not a["sequence_parallel"]:
        raise ConfigError("--tp-comm-overlap needs --sequence-parallel (Megatron asserts it: the "
                          "overlapped collectives are sequence parallelism's all-gathers and reduce-scatters)")
    if a["grad_reduce_in_bf16"] and not a["bf16"]:
        raise ConfigError("--grad-reduce-in-bf16 needs --bf16")
    if a["grad_reduce_in_bf16"] and a["accumulate_allreduce_grads_in_fp32"]:
        raise ConfigError("--grad-reduce-in-bf16 and --accumulate-allreduce-grads-in-fp32 are "
                          "exclusive; pick one")
    if a["overlap_param_gather"] and not (a["use_distributed_optimizer"] and a["overlap_grad_reduce"]):
        # Megatron's arguments.py asserts both.
        raise ConfigError("--overlap-param-gather needs --use-distributed-optimizer and "
                          "--overlap-grad-reduce")
    if a["fp4_format"] and a["fp8_format"]:  # Megatron-core's TransformerConfig asserts it
        raise ConfigError("--fp4-format and --fp8-format are exclusive; pick one")
    if a["fp4_format"] and a["fp8_param_gather"]:
        raise ConfigError("--fp8-param-gather with --fp4-format is not supported: NVFP4 runs keep bf16 "
                          "parameters (Megatron Bridge's bf16_with_nvfp4_mixed sets fp8_param_gather False)")
    if a["fp8_param_gather"] and not (a["fp8_format"] and (a["use_distributed_optimizer"] or a["use_megatron_fsdp"])):
        raise ConfigError("--fp8-param-gather needs --fp8-format and --use-distributed-optimizer or "
                          "--use-megatron-fsdp (it is their all-gather of fp8 weights)")
    if a["use_megatron_fsdp"] and a["data_parallel_sharding_strategy"] != "optim_grads_params":
        raise ConfigError(f"--use-megatron-fsdp with --data-parallel-sharding-strategy "
                          f"{a['data_parallel_sharding_strategy']} is not supported; give "
                          "--data-parallel-sharding-strategy optim_grads_params (parameters, gradients and "
                          "optimizer state sharded), or drop --use-megatron-fsdp for the distributed optimizer")
    if a["use_megatron_fsdp"] and (a["pipeline_model_parallel_size"] > 1 or a["num_experts"]):
        raise ConfigError("--use-megatron-fsdp with pipeline parallelism or MoE experts is not supported "
                          "(models/fsdp.py); give --pipeline-model-parallel-size 1 and no --num-experts")
    if a["first_last_layers_bf16"] and not (a["fp8_format"] or a["fp4_format"]):
        raise ConfigError("--first-last-layers-bf16 needs --fp8-format or --fp4-format (layers to keep out of it)")
    for k in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
        if a[k] < 0:
            raise ConfigError(f"--{k.replace('_', '-')} must be >= 0, got {a[k]}")
    if a["fp8_recipe"] != "delayed" and not a["fp8_format"]:
        raise ConfigError(f"--fp8-recipe {a['fp8_recipe']} needs --fp8-format (fp8 GEMMs to scale)")
    if a["swiglu"] and a["squared_relu"]:
        raise ConfigError("--swiglu and --squared-relu are exclusive; pick one")


def _list_expression(text: str, limit: int) -> tuple[int, ...] | None:
    """The integers of a Python-style list expression ``[0]*3+[1, 1]*2`` (lists of integers, each
    optionally repeated ``*N``, joined by ``+``), parsed without ``eval``; None if the text is not one
    or would exceed ``limit`` values (so a huge repeat is refused before it is built)."""
    out: list[int] = []
    for term in re.sub(r"\s+", "", text).split("+"):
        m = re.fullmatch(r"\[(\d+(?:,\d+)*),?\](?:\*(\d+))?", term)
        if m is None:
            return None
        values, times = [int(v) for v in m.group(1).split(",")], int(m.group(2) or 1)
        if len(out) + len(values) * times > limit:
            return None
        out += values * times
    return tuple(out)


def _moe_pattern(a: dict[str, Any]) -> tuple[int, ...] | None:
    """Per-layer 0/1 (dense / MoE) from ``--moe-layer-freq``: an int N makes layer i MoE when
    i % N == 0 (Megatron-core), a list expression of 0s and 1s gives each layer (its length must be
    --num-layers)."""
    text, n = a["moe_layer_freq"], a["num_layers"]
    if text is None:
        return None
    if text.strip().isdigit():
        k = int(text)
        if k < 1:
            raise ConfigError(f"--moe-layer-freq {text} must be >= 1")
        return tuple(int(i % k == 0) for i in range(n))
    pattern = _list_expression(text, n)
    if pattern is None:
        raise ConfigError(f"--moe-layer-freq {text!r}: give an integer or a list expression of 0s and 1s "
                          "such as '[0]*3+[1]*58'")
    if len(pattern) != n or set(pattern) - {0, 1}:
        raise ConfigError(f"--moe-layer-freq {text!r} gives {len(pattern)} layers of "
                          f"{sorted(set(pattern))}; need {n} (--num-layers) values of 0 or 1")
    return pattern


def _window(a: dict[str, Any]) -> int | None:
    """The left window of ``--window-size L,R`` (R must be 0: causal attention)."""
    text = a["window_size"]
    if text is None:
        return None
    parts = [p.strip() for p in str(text).strip("()[] ").split(",")]
    if len(parts) != 2 or not all(p.lstrip("-").isdigit() for p in parts) or int(parts[1]) != 0 or int(parts[0]) < 0:
        raise ConfigError(f"--window-size {text!r}: give 'L,0' (L earlier keys, none after; e.g. 127,0)")
    return int(parts[0])


def _model_config(a: dict[str, Any], groups: int | None, tp: int) -> ModelConfig:
    """The :class:`ModelConfig` of the merged flags ``a``."""
    h, heads = a["hidden_size"], a["num_attention_heads"]
    ffn = a["ffn_hidden_size"]
    if ffn is None and a["swiglu"]:
        # Megatron keeps swiglu's 3 matrices near 4h x h params, rounded down to a multiple of 64.
        ffn = int((4 * h * 2 / 3) / 64) * 64
    activation = "swiglu" if a["swiglu"] else "squared_relu" if a["squared_relu"] else "gelu"
    return ModelConfig(
        num_layers=a["num_layers"], hidden_size=h, num_attention_heads=heads,
        num_query_groups=groups, ffn_hidden_size=ffn, kv_channels=a["kv_channels"],
        seq_length=a["seq_length"], max_position_embeddings=a["max_position_embeddings"],
        vocab_size=pad_vocab_size(a["vocab_size"], a["make_vocab_size_divisible_by"], tp),
        activation=activation, normalization=a["normalization"],
        position_embedding_type=a["position_embedding_type"],
        untie_embeddings_and_output_weights=a["untie_embeddings_and_output_weights"],
        add_bias_linear=not a["disable_bias_linear"], num_experts=a["num_experts"],
        moe_router_topk=a["moe_router_topk"], moe_ffn_hidden_size=a["moe_ffn_hidden_size"],
        hidden_dropout=a["hidden_dropout"], norm_epsilon=a["norm_epsilon"],
        init_method_std=a["init_method_std"], rotary_base=a["rotary_base"],
        bias_swiglu_fusion=not a["no_bias_swiglu_fusion"], rope_fusion=not a["no_rope_fusion"],
        cross_entropy_loss_fusion=a["cross_entropy_loss_fusion"],
        attention_backend=a["attention_backend"], attention_dropout=a["attention_dropout"],
        multi_latent_attention=a["multi_latent_attention"], q_lora_rank=a["q_lora_rank"],
        kv_lora_rank=a["kv_lora_rank"], qk_head_dim=a["qk_head_dim"], qk_pos_emb_head_dim=a["qk_pos_emb_head_dim"],
        v_head_dim=a["v_head_dim"], moe_layer_pattern=_moe_pattern(a),
        moe_shared_expert_intermediate_size=a["moe_shared_expert_intermediate_size"],
        moe_permute_fusion_into_hybridep=bool(a["moe_permute_fusion_into_hybridep"]),
        hybrid_layer_pattern=a["hybrid_override_pattern"], mamba_state_dim=a["mamba_state_dim"],
        mamba_head_dim=a["mamba_head_dim"], mamba_num_groups=a["mamba_num_groups"],
        mamba_num_heads=a["mamba_num_heads"], qk_layernorm=a["qk_layernorm"], window_size=_window(a),
        window_attn_skip_freq=a["window_attn_skip_freq"], softmax_type=a["softmax_type"],
        mtp_num_layers=a["mtp_num_layers"], mtp_loss_scaling_factor=a["mtp_loss_scaling_factor"])


def parse_args(argv: Sequence[str] | None, world_size: int) -> RunConfig:
    """Parse Megatron flags and validate them for ``world_size`` ranks.

    Raises:
        ConfigError: unknown flag, missing model size, or a layout that does not fit.
    """
    ns = build_parser().parse_args(argv)
    a = _merged(ns)
    if a["num_layers"] is None and a["hybrid_override_pattern"]:
        a["num_layers"] = len(a["hybrid_override_pattern"])
    missing = [f"--{k.replace('_', '-')}" for k in ("num_layers", "hidden_size", "num_attention_heads",
                                                    "seq_length", "vocab_size") if a[k] is None]
    if missing:
        raise ConfigError(f"missing {', '.join(missing)}; give them or a --preset NAME")
    _check_exclusive(a)
    tp, pp = a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"]
    # World-size divisibility first: it is the mistake the other messages would hide.
    ParallelConfig(world_size=world_size, tp=tp, pp=pp, cp=a["context_parallel_size"],
                   ep=a["expert_model_parallel_size"], etp=a["expert_tensor_parallel_size"]).check()
    heads, h = a["num_attention_heads"], a["hidden_size"]
    groups = a["num_query_groups"] if a["group_query_attention"] else None
    if heads % tp:
        raise ConfigError(f"--num-attention-heads {heads} is not divisible by "
                          f"--tensor-model-parallel-size {tp}")
    if groups is not None and (heads % groups or groups % tp):
        raise ConfigError(f"--num-query-groups {groups} must divide --num-attention-heads {heads} "
                          f"and be divisible by --tensor-model-parallel-size {tp}")
    if a["kv_channels"] is None and h % heads:
        raise ConfigError(f"--hidden-size {h} is not divisible by --num-attention-heads {heads}; "
                          f"give --kv-channels")
    virtual = None
    if a["pipeline_model_parallel_layout"]:
        counts, vpp, virtual = _layout_layers(a, pp)
    else:
        counts, vpp = _stage_layers(a, pp)
    pcfg = ParallelConfig(
        world_size=world_size, tp=tp, pp=pp, cp=a["context_parallel_size"],
        ep=a["expert_model_parallel_size"], etp=a["expert_tensor_parallel_size"], vpp=vpp,
        sequence_parallel=a["sequence_parallel"],
        cp_comm_type=a["cp_comm_type"], stage_layers=counts, virtual_stage_layers=virtual,
        embed_slot=a["account_for_embedding_in_pipeline_split"],
        loss_slot=a["account_for_loss_in_pipeline_split"],
        use_distributed_optimizer=a["use_distributed_optimizer"],
        overlap_grad_reduce=a["overlap_grad_reduce"], overlap_param_gather=a["overlap_param_gather"],
        fp8_param_gather=a["fp8_param_gather"], use_megatron_fsdp=a["use_megatron_fsdp"],
        amax_reduction_group=bool(a["fp8_format"]) and a["fp8_recipe"] == "delayed",
        async_tp_allreduce=not a["no_async_tensor_model_parallel_allreduce"],
        scatter_gather_p2p=a["scatter_gather_tensors_in_pipeline"] and not a["sequence_parallel"],
        tp_comm_overlap=a["tp_comm_overlap"], tp_comm_aggregate=_aggregate(a), tp_comm_sm_margin=_sm_margin(a),
        tp_comm_fp8_buf=_fp8_buf(a),
        # Megatron uses it in the interleaved schedule only; without virtual stages it does nothing.
        overlap_p2p_comm=a["overlap_p2p_communication"],
        ep_nvl_domain=flex_domain(a["moe_token_dispatcher_type"], a["moe_flex_dispatcher_backend"],
                                  a["moe_permute_fusion_into_hybridep"]))
    pcfg.check()
    mcfg = _model_config(a, groups, tp)
    mcfg.check_attention(pcfg.cp)
    mcfg.check_hybrid()
    mbs = a["micro_batch_size"]
    gbs = a["global_batch_size"] if a["global_batch_size"] is not None else mbs * pcfg.dp
    tcfg = TrainConfig(
        micro_batch_size=mbs, global_batch_size=gbs, train_iters=a["train_iters"],
        params_dtype="bf16" if a["bf16"] else "fp16" if a["fp16"] else "fp32",
        fp8=a["fp8_format"] or a["fp4_format"], fp8_recipe=a["fp4_recipe"] if a["fp4_format"] else a["fp8_recipe"],
        bf16_layers=((a["num_layers_at_start_in_bf16"], a["num_layers_at_end_in_bf16"])
                     if a["first_last_layers_bf16"] else (0, 0)),
        recompute_granularity=a["recompute_granularity"],
        recompute_method=a["recompute_method"], recompute_num_layers=a["recompute_num_layers"],
        recompute_modules=selective_modules(a["recompute_granularity"], a["recompute_modules"],
                                            moe=bool(a["num_experts"]), mla=a["multi_latent_attention"]),
        overlap_moe_expert_parallel_comm=ep_overlap_flag(a, pp, vpp))
    m = tcfg.num_microbatches(pcfg.dp)
    if vpp is not None and m % pp:
        raise ConfigError(f"the interleaved schedule needs the number of micro-batches ({m} = "
                          f"{gbs} / ({mbs} x dp {pcfg.dp})) to be a multiple of "
                          f"--pipeline-model-parallel-size {pp}")
    if a["train_iters"] < 1:
        raise ConfigError(f"--train-iters must be >= 1, got {a['train_iters']}")
    optim = OptimConfig(
        lr=a["lr"], weight_decay=a["weight_decay"], clip_grad=a["clip_grad"],
        adam_beta1=a["adam_beta1"], adam_beta2=a["adam_beta2"], adam_eps=a["adam_eps"],
        loss_scale=(a["loss_scale"] or 65536.0) if a["fp16"] else None,
        bucket_size=a["ddp_bucket_size"], align_grad_reduce=not a["no_align_grad_reduce"],
        align_param_gather=not a["no_align_param_gather"],
        # megatron/training/arguments.py: "bfloat16 requires gradient accumulation and all-reduce
        # to be done in fp32" (unless --grad-reduce-in-bf16); fp16 keeps fp16 grads by default.
        grad_reduce_in_fp32=a["accumulate_allreduce_grads_in_fp32"]
        or (a["bf16"] and not a["grad_reduce_in_bf16"]))
    return RunConfig(model=mcfg, parallel=pcfg, train=tcfg, optim=optim, num_microbatches=m,
                     stage_layers=counts, seed=a["seed"], preset=ns.preset)
