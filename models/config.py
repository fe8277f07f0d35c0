"""Model and parallelism configuration shared by the layers, the schedules and ``pretrain_gpt.py``.

Field names follow Megatron-LM's arguments (``--num-layers`` -> ``num_layers``). Validation that
needs the world size lives in :meth:`ParallelConfig.check`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from heterosim.errors import ConfigError

__all__ = ["ModelConfig", "ParallelConfig", "TrainConfig", "ATTENTION_BACKENDS", "HYBRID_SYMBOLS"]

ATTENTION_BACKENDS = ("auto", "flash", "fused", "unfused")
"""Core-attention backends (Megatron-core ``--attention-backend`` names; ``local`` is ``unfused``)."""
HYBRID_SYMBOLS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
"""Layer symbols of a hybrid pattern (Megatron-core ``ssm/mamba_hybrid_layer_allocation.Symbols``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """Architecture of a GPT / LLaMA-style decoder."""

    num_layers: int
    """Transformer layers (Megatron ``--num-layers``)."""
    hidden_size: int
    """Model width h."""
    num_attention_heads: int
    """Query heads."""
    num_query_groups: int | None = None
    """Key/value heads for GQA; None means multi-head attention (= num_attention_heads)."""
    ffn_hidden_size: int | None = None
    """MLP width; None means 4h."""
    kv_channels: int | None = None
    """Head dim; None means hidden_size // num_attention_heads."""
    seq_length: int = 2048
    """Tokens per sample s."""
    max_position_embeddings: int | None = None
    """Learned position table size (None: seq_length)."""
    vocab_size: int = 51200
    """Vocabulary V after padding (see pretrain_gpt's --make-vocab-size-divisible-by)."""
    activation: Literal["gelu", "swiglu", "squared_relu"] = "gelu"
    """MLP nonlinearity; swiglu uses two input projections (gate and up)."""
    normalization: Literal["LayerNorm", "RMSNorm"] = "LayerNorm"
    position_embedding_type: Literal["learned_absolute", "rope", "none"] = "learned_absolute"
    untie_embeddings_and_output_weights: bool = False
    add_bias_linear: bool = True
    num_experts: int | None = None
    """MoE experts per MoE layer (None: dense)."""
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_layer_pattern: tuple[int, ...] | None = None
    """Per layer, 1 for an MoE layer and 0 for a dense one (``--moe-layer-freq``; DeepSeek-V3's
    first three layers are dense); None: every layer is MoE when ``num_experts`` is set."""
    moe_shared_expert_intermediate_size: int | None = None
    """Width of the shared experts' MLP every MoE layer runs beside its routed experts on all
    tokens (``--moe-shared-expert-intermediate-size``; DeepSeek-V3: one expert, 2048)."""
    moe_permute_fusion_into_hybridep: bool = False
    """The flex dispatcher's HybridEP kernels also sort the tokens it receives into expert order and
    back (Megatron-core's ``moe_permute_fusion_into_hybridep``, ``--moe-permute-fusion-into-hybridep``);
    otherwise Megatron-core permutes and un-permutes them in kernels of their own."""
    hidden_dropout: float = 0.1
    """Dropout after attention / MLP (bias-dropout-add) and on embeddings (``--hidden-dropout``)."""
    norm_epsilon: float = 1e-5
    """Epsilon of LayerNorm / RMSNorm (``--norm-epsilon``)."""
    init_method_std: float = 0.02
    """Std of the normal weight init; output projections use std / sqrt(2 * num_layers)."""
    rotary_base: float = 10000.0
    """RoPE base (``--rotary-base``)."""
    bias_swiglu_fusion: bool = True
    """SwiGLU as Megatron's fused ``bias_swiglu_impl`` (``--no-bias-swiglu-fusion``: unfused ops)."""
    rope_fusion: bool = True
    """RoPE as Transformer Engine's fused kernel (``--no-rope-fusion``: Megatron's unfused path)."""
    cross_entropy_loss_fusion: bool = False
    """The loss as Megatron-core's fused vocab-parallel cross-entropy (``--cross-entropy-loss-fusion``;
    off by default, as in Megatron-LM): four compiled kernels and one all-reduce fewer
    (:mod:`models.layers.cross_entropy`)."""
    attention_backend: Literal["auto", "flash", "fused", "unfused"] = "auto"
    """Core attention (Megatron-core ``--attention-backend``): ``auto``, ``flash`` and ``fused`` are
    one fused kernel each way, ``flash`` naming FlashAttention-2 and ``fused`` cuDNN's fused
    attention (Transformer Engine's two backends; the capture tags the kernels so that pricing
    uses that implementation's curve), ``auto`` leaving the choice open (priced by the GPU's
    default curve); ``unfused`` is Megatron-LM 2020-21's baddbmm, fused scale-mask-softmax,
    dropout, bmm over all s^2 scores (:mod:`models.layers.unfused_attention`)."""
    multi_latent_attention: bool = False
    """DeepSeek-V2/V3's multi-head latent attention instead of (G)QA (``--multi-latent-attention``;
    :mod:`models.layers.mla`), with the ranks and head dims below."""
    q_lora_rank: int | None = None
    """Width of the compressed query (``--q-lora-rank``); None: queries projected directly."""
    kv_lora_rank: int = 512
    """Width of the compressed key/value latent (``--kv-lora-rank``)."""
    qk_head_dim: int = 128
    """Query/key head dim without the rotary part (``--qk-head-dim``)."""
    qk_pos_emb_head_dim: int = 64
    """Rotary part of the query/key head dim, the key's shared by all heads (``--qk-pos-emb-head-dim``)."""
    v_head_dim: int = 128
    """Value head dim (``--v-head-dim``)."""
    attention_dropout: float = 0.0
    """Dropout on the attention probabilities, unfused backend only (``--attention-dropout``).
    Megatron-LM's argument default is 0.1 (its 2020-21 GPT runs used it); its modern LLM recipes
    set 0, which is the default here."""
    window_size: int | None = None
    """Sliding-window attention: a query sees itself and this many earlier keys (Megatron-core's
    ``window_size = (w, 0)``; GPT-OSS 127); None: all earlier keys."""
    window_attn_skip_freq: int | None = None
    """With ``window_size``: every this-many-th layer (1-based) attends to all keys (GPT-OSS 2:
    windowed and full layers alternate); None: every layer is windowed."""
    softmax_type: Literal["vanilla", "learnable"] = "vanilla"
    """``learnable``: a learned logit per head joins each row's softmax (attention sinks, GPT-OSS;
    Megatron-core's ``softmax_offset``)."""
    mtp_num_layers: int = 0
    """Multi-token prediction depths on the last pipeline stage (``--mtp-num-layers``; DeepSeek-V3: 1;
    :mod:`models.layers.mtp`)."""
    mtp_loss_scaling_factor: float = 0.1
    """Weight of the MTP losses' mean in the total loss (Megatron-core's default)."""
    qk_layernorm: bool = False
    """A norm (the model's kind) of each head's query and key over the head dim before RoPE, one
    weight shared by the heads (``--qk-layernorm``; Qwen3, OLMo 2)."""
    hybrid_layer_pattern: str | None = None
    """One symbol per layer, Megatron-core's hybrid models (``--hybrid-override-pattern``; Nemotron-H):
    ``M`` a Mamba-2 mixer (:mod:`models.layers.mamba`), ``*`` self-attention, ``-`` an MLP, ``E`` an
    MoE MLP, each with its own norm and residual; None: every layer is attention + MLP."""
    mamba_state_dim: int = 128
    """SSM state size N (``--mamba-state-dim``)."""
    mamba_head_dim: int = 64
    """SSM head dim P (``--mamba-head-dim``)."""
    mamba_num_groups: int = 8
    """Groups sharing B and C (``--mamba-num-groups``)."""
    mamba_num_heads: int | None = None
    """SSM heads (``--mamba-num-heads``); None: 2 h / P (Megatron-core's ``expand = 2``)."""
    mamba_chunk_size: int = 128
    """Tokens per chunk of the SSD scan (Megatron-core's ``MambaMixer`` default)."""

    @property
    def num_kv_heads(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    def is_moe_layer(self, layer_number: int) -> bool:
        """Whether layer ``layer_number`` (0-based, global) routes its MLP through experts."""
        if not self.num_experts:
            return False
        if self.hybrid_layer_pattern is not None:
            return self.hybrid_layer_pattern[layer_number] == "E"
        return self.moe_layer_pattern is None or bool(self.moe_layer_pattern[layer_number])

    def layer_kind(self, layer_number: int) -> str:
        """``transformer`` (attention + MLP), or in a hybrid model ``mamba``, ``attention``, ``mlp``
        or ``moe`` (:data:`HYBRID_SYMBOLS`)."""
        if self.hybrid_layer_pattern is None:
            return "transformer"
        return HYBRID_SYMBOLS[self.hybrid_layer_pattern[layer_number]]

    def attention_window(self, layer_number: int) -> int | None:
        """The sliding window of layer ``layer_number`` (0-based), None for full causal attention
        (Megatron-core's ``is_layer_window_attention``, whose layer numbers are 1-based)."""
        freq = self.window_attn_skip_freq
        if self.window_size is None or (freq and (layer_number + 1) % freq == 0):
            return None
        return self.window_size

    @property
    def mamba_heads(self) -> int:
        return self.mamba_num_heads or 2 * self.hidden_size // self.mamba_head_dim

    def check_hybrid(self) -> None:
        """Raise :class:`ConfigError` when the hybrid pattern does not describe ``num_layers`` layers."""
        pat = self.hybrid_layer_pattern
        if pat is None:
            return
        bad = sorted(set(pat) - set(HYBRID_SYMBOLS))
        if bad:
            raise ConfigError(f"--hybrid-override-pattern {pat!r}: unknown symbol {bad[0]!r}; valid: "
                              + ", ".join(f"{k} ({v})" for k, v in HYBRID_SYMBOLS.items()))
        if len(pat) != self.num_layers:
            raise ConfigError(f"--hybrid-override-pattern has {len(pat)} symbols but --num-layers is "
                              f"{self.num_layers}; give one symbol per layer")
        if "E" in pat and not self.num_experts:
            raise ConfigError("--hybrid-override-pattern has MoE layers (E) but --num-experts is not set")
        if self.moe_layer_pattern is not None:
            raise ConfigError("--moe-layer-freq does not apply to a hybrid model: its pattern's E layers "
                              "are the MoE ones")

    @property
    def rotary_dim(self) -> int:
        """Head dims RoPE rotates: the whole head, or MLA's rotary part."""
        return self.qk_pos_emb_head_dim if self.multi_latent_attention else self.head_dim

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    def check_attention(self, cp: int) -> None:
        """Raise :class:`ConfigError` when the attention backend cannot run this configuration."""
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"unknown attention backend {self.attention_backend!r}; "
                              f"valid: {', '.join(ATTENTION_BACKENDS)}")
        p = self.attention_dropout
        if not 0.0 <= p < 1.0:
            raise ConfigError(f"--attention-dropout {p} must be in [0, 1)")
        if self.attention_backend != "unfused" and p > 0.0:
            # SDPA with dropout_p > 0 leaves the fused CPU flash kernel for the unfused math path.
            raise ConfigError(f"--attention-dropout {p} needs --attention-backend unfused: the fused "
                              f"path ({self.attention_backend}) runs without attention dropout; give "
                              f"--attention-backend unfused or --attention-dropout 0")
        if self.attention_backend == "unfused" and cp > 1:
            raise ConfigError(f"--attention-backend unfused does not run with --context-parallel-size "
                              f"{cp}: context parallelism needs a fused kernel (auto, flash or fused); "
                              f"give --attention-backend auto or --context-parallel-size 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelConfig:
    """How the job is split. Rank order is Megatron's default ``tp-cp-ep-dp-pp`` (tp fastest)."""

    world_size: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    """Expert tensor parallelism (``--expert-tensor-parallel-size``): None or ``tp``, experts split
    over the TP ranks; 1, experts whole on each rank, the EP group drawn from the TP x DP ranks of a
    stage (Megatron-core's expert rank generator with etp 1; Megatron Bridge's MoE recipes)."""
    vpp: int | None = None
    """Model chunks per pipeline rank for the interleaved schedule (None: plain 1F1B)."""
    sequence_parallel: bool = False
    cp_comm_type: Literal["p2p", "all_gather", "a2a"] = "p2p"
    stage_layers: tuple[int, ...] | None = None
    """Explicit layers per pipeline stage (len pp); None: even split (or first/last overrides)."""
    virtual_stage_layers: tuple[int, ...] | None = None
    """Layers of every virtual stage in layer order (``--pipeline-model-parallel-layout``); None: an
    even split (:func:`models.parallel_state.split_stage_layers`)."""
    embed_slot: bool = False
    """The input embedding counts as one layer of the pipeline split (Megatron-Core's
    ``--account-for-embedding-in-pipeline-split``; :func:`models.parallel_state.split_stage_layers`)."""
    loss_slot: bool = False
    """The output layer and loss count as one layer of the split (``--account-for-loss-in-pipeline-split``)."""
    use_distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    use_megatron_fsdp: bool = False
    """Parameters, gradients and optimizer state sharded over data parallelism, each layer gathered
    for its forward and backward (``--use-megatron-fsdp``, :mod:`models.fsdp`)."""
    fp8_param_gather: bool = False
    """Transformer-layer weights are kept in fp8 (TE's ``fp8_model_init``, NeMo's ``fp8_params``)
    and the distributed optimizer all-gathers them in fp8 (``--fp8-param-gather``)."""
    scatter_gather_p2p: bool = False
    """Pipeline p2p sends 1/tp of each tensor per TP rank, all-gathered after (Megatron-LM before
    Megatron-core, ``--scatter-gather-tensors-in-pipeline``; see ``models.p2p.PipelineComm``).
    Meaningless with sequence parallelism, whose tensors are already split."""
    overlap_p2p_comm: bool = False
    """Interleaved pipeline p2p left in flight under the next step (``--overlap-p2p-communication``;
    :class:`models.schedules._InterleavedOverlap`)."""
    tp_comm_overlap: bool = False
    """TP all-gathers / reduce-scatters of the transformer layers' linears overlapped with their
    GEMMs as Transformer Engine's userbuffers do it (``--tp-comm-overlap``; needs sequence
    parallelism; :mod:`models.layers.tp_overlap`)."""
    tp_comm_sm_margin: tuple[tuple[str, int], ...] = ()
    """Pipelined reduce-scatter overlaps (``proj_fprop``, ``fc2_fprop``) whose GEMM leaves SMs to the
    communication kernel, TE's ``num_sm`` with ``set_sm_margin: 1`` (``--tp-comm-overlap-sm-margin``)."""
    tp_comm_aggregate: tuple[str, ...] = ()
    """Ring-exchange overlaps (TE ``ub_tp_comm_overlap_cfg`` names: ``qkv_fprop``, ``fc1_fprop``,
    ``proj_dgrad``, ``fc2_dgrad``) whose ``aggregate`` is set: two ring steps per GEMM
    (``--tp-comm-overlap-aggregate``)."""
    tp_comm_fp8_buf: tuple[str, ...] = ()
    """Pipelined reduce-scatter overlaps (``proj_fprop``, ``fc2_fprop``) whose userbuffer is fp8 in
    fp8 runs, TE's ``fp8_buf: true`` (``--tp-comm-overlap-fp8-buf``): they move one byte per element."""
    amax_reduction_group: bool = False
    """Create Megatron-core's amax reduction group (the TP x DP x CP ranks of a pipeline stage,
    ``parallel_state.get_amax_reduction_group(with_context_parallel=True)``), over which fp8 delayed
    scaling all-reduces its amaxes (:class:`models.layers.fp8.DelayedScaling`). Set for fp8 runs with
    the delayed recipe; created after every other group, so the others keep their numbers."""
    async_tp_allreduce: bool = True
    """Column-parallel backward all-reduces the input gradient while the weight-gradient GEMM runs
    (Megatron-LM from late 2021; ``--no-async-tensor-model-parallel-allreduce`` turns it off, as
    in earlier releases, which all-reduced after both GEMMs)."""

    ep_nvl_domain: int | None = None
    """Megatron-core's flex MoE dispatcher (``--moe-token-dispatcher-type flex``, DeepEP / HybridEP):
    consecutive EP ranks per NVLink domain (DeepEP's ``NUM_MAX_NVL_PEERS`` = 8; HybridEP's
    ``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN``). A token crosses to another domain once, to the rank
    of its own index there, and fans out over NVLink (:mod:`models.layers.moe_flex`). None: the
    all-to-all dispatcher, one copy per (token, expert)."""

    @property
    def expert_tp(self) -> int:
        """Ranks an expert is split over: ``etp``, else ``tp``."""
        return self.tp if self.etp is None else self.etp

    @property
    def dp(self) -> int:
        """Data-parallel size: world / (tp * pp * cp)."""
        return self.world_size // (self.tp * self.pp * self.cp)

    def check(self) -> None:
        """Raise :class:`ConfigError` naming the values when the layout does not fit the world."""
        for name in ("tp", "pp", "cp", "ep"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        prod = self.tp * self.pp * self.cp
        if self.world_size % prod:
            raise ConfigError(
                f"world size {self.world_size} is not divisible by tp*pp*cp = "
                f"{self.tp}*{self.pp}*{self.cp} = {prod}; choose sizes whose product divides it"
            )
        if self.etp not in (None, 1, self.tp):
            raise ConfigError(f"--expert-tensor-parallel-size {self.etp}: give 1 or the tensor-parallel size "
                              f"{self.tp} (other sizes are not modelled)")
        if self.ep_nvl_domain is not None and (self.ep_nvl_domain < 1 or self.ep % min(self.ep_nvl_domain, self.ep)):
            raise ConfigError(f"flex dispatcher: {self.ep_nvl_domain} EP ranks per NVLink domain do not divide "
                              f"--expert-model-parallel-size {self.ep}; give a domain size that divides it")
        if self.expert_tp == 1 and self.ep > 1 and (self.tp * self.cp * self.dp) % self.ep:
            raise ConfigError(f"expert-model-parallel-size {self.ep} must divide tp * cp * dp = "
                              f"{self.tp * self.cp * self.dp} with --expert-tensor-parallel-size 1")
        elif self.expert_tp != 1 and self.dp % self.ep and self.ep > 1:
            raise ConfigError(
                f"expert-model-parallel-size {self.ep} must divide the data-parallel size {self.dp}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
    """Batch, precision, recomputation and iteration count."""

    micro_batch_size: int = 1
    global_batch_size: int = 1
    train_iters: int = 1
    params_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    fp8: str | None = None
    """``e4m3`` / ``hybrid`` (fp8) or ``e2m1`` (fp4): the transformer layers' GEMMs are marked low
    precision in the trace."""
    fp8_recipe: str = "delayed"
    """How the low-precision tensors are scaled: ``delayed`` or ``tensorwise`` (fp8; current
    scaling), ``nvfp4`` (fp4; :mod:`models.layers.fp8`)."""
    bf16_layers: tuple[int, int] = (0, 0)
    """Transformer layers kept out of fp8 / fp4 at the start and at the end of the model
    (Megatron-core's ``--first-last-layers-bf16`` with ``--num-layers-at-{start,end}-in-bf16``)."""
    recompute_granularity: Literal["full", "selective"] | None = None
    recompute_method: Literal["uniform", "block"] | None = None
    recompute_num_layers: int | None = None
    recompute_modules: tuple[str, ...] = ("core_attn",)
    """With ``recompute_granularity`` selective: the parts recomputed (``--recompute-modules``,
    :func:`models.layers.recompute.selective_modules`)."""
    overlap_moe_expert_parallel_comm: bool = False
    """Megatron-core's expert-parallel overlap: the combined 1F1B schedule (:mod:`models.ep_overlap`)."""
    extra: dict = field(default_factory=dict)

    def recomputes(self, module: str) -> bool:
        """``module`` is recomputed (selective granularity with it among ``recompute_modules``)."""
        return self.recompute_granularity == "selective" and module in self.recompute_modules

    def num_microbatches(self, dp: int) -> int:
        """Micro-batches per iteration per data-parallel replica."""
        per = self.micro_batch_size * dp
        if self.global_batch_size % per:
            raise ConfigError(
                f"global batch size {self.global_batch_size} is not divisible by micro-batch size "
                f"{self.micro_batch_size} x data-parallel size {dp} = {per}"
            )
        return self.global_batch_size // per
