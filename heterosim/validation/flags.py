"""``models/pretrain_gpt.py`` flags of an end-to-end case, field by field.

Each field is, in order: what the case states (annotated numbers and words read by
:mod:`heterosim.validation.phrases`); else what the run's published recipe or launch script set
(:mod:`heterosim.validation.published_runs`, cited by file and commit); else the framework's
documented default (Megatron-LM's ``arguments.py``, by the source's year where it changed). Every
fill and every reading of an annotated value is appended to the case's notes, and a stated value
that disagrees with the recipe is printed beside it. A recipe setting the models cannot run (fp8
parameters) is printed as not modelled.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Protocol

from heterosim.errors import ConfigError
from heterosim.layout import parse_pipeline_layout

from .frameworks import family_settings
from .deepseek import deepseek_moe_flags, mla_flags, mtp_layers
from .hybrid import hybrid_flags
from .released import attention_flags, released, released_moe_flags
from .phrases import arch_features, count, flag_word, is_unstated, recompute_word


class Case(Protocol):
    """What the flag builders read of a case (:class:`heterosim.validation.cases.Case` has it)."""

    id: str
    source: Mapping[str, Any]
    model: Mapping[str, Any]
    parallelism: Mapping[str, Any]
    batch: Mapping[str, Any]

__all__ = ["Fields", "model_flags", "parallel_sizes", "parallel_flags", "fsdp_setting", "zero_stage", "era_flags",
           "fp8_buf_flags", "ASYNC_TP_ALLREDUCE_YEAR", "CORE_P2P_YEAR"]

PUBLISHED_RUNS_NAME = "heterosim/validation/data/published_runs.yaml"

ASYNC_TP_ALLREDUCE_YEAR = 2022
"""First year whose Megatron-LM runs overlap the column-parallel input-gradient all-reduce with the
weight-gradient GEMM (``LinearWithGradAccumulationAndAsyncAllreduce``, added in late 2021, after the
SC'21 paper's April 2021 runs; ``--no-async-tensor-model-parallel-allreduce`` turns it off)."""

CORE_P2P_YEAR = 2023
"""First year of Megatron-core's pipeline p2p, which sends whole tensors. Earlier releases split each
p2p tensor over the TP ranks and all-gathered it after (``--scatter-gather-tensors-in-pipeline``,
default on; Narayanan et al., SC'21, section 4.1)."""

ACCOUNT_SPLIT_FLAGS = ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
ACCOUNT_SPLIT_SOURCE = ("Megatron-Core's account_for_embedding/loss_in_pipeline_split do for layer counts that "
                        "do not divide (NeMo's llama31_405b recipe sets both: 126 layers on pp 8 x vpp 8, "
                        "NVIDIA/NeMo@8cfedd7 nemo/collections/llm/recipes/llama31_405b.py)")


class Fields:
    """A case, the settings of its published run (``pub``, from ``script``) and the notes being written."""

    def __init__(self, case: Case, pub: Mapping[str, Any], script: str | None, notes: list[str]):
        self.case, self.pub, self.script, self.notes = case, pub, script, notes
        self.released = released(case.model)
        """(configuration, source) of the released model the case names, else None (:mod:`.released`)."""
        self.mtp: int | None = None
        """Multi-token prediction depths once the model is read (:func:`heterosim.validation.deepseek.mtp_layers`)."""

    def recipe(self, key: str, where: str, shown: Any = None) -> Any:
        """The published value of ``key`` for an unstated field, noted; None if there is none."""
        if key not in self.pub:
            return None
        self.notes.append(f"{where} not stated: {self.pub[key] if shown is None else shown} ({self.script})")
        return self.pub[key]

    def switch(self, key: str, where: str) -> bool | None:
        """:meth:`recipe` for a yes/no setting, noted as on / off."""
        return self.recipe(key, where, shown={True: "on", False: "off"}.get(self.pub.get(key)))

    def count(self, section: str, key: str, *, required: bool = True) -> int | None:
        """An integer field (remarks allowed), else the recipe's, else an error (or None)."""
        v = getattr(self.case, section).get(key)
        where = f"{section}.{key}"
        if is_unstated(v):
            got = self.recipe(key, where)
            if got is None and required:
                raise ConfigError(f"case {self.case.id}: {where} is {v!r}; give an integer")
            return got
        try:
            n, note = count(v, where, binary=key == "seq_len")
        except ConfigError as e:
            raise ConfigError(f"case {self.case.id}: {e}") from None
        if note:
            self.notes.append(note)
        if key in self.pub and self.pub[key] != n and section == "model":
            self.notes.append(f"{where} {n} differs from the {self.pub[key]} of {self.script}; the case's value is used")
        return n


# ----------------------------------------------------------------------------------------- model
def _shape_stated(f: Fields) -> None:
    """A case whose model is not a released one the reader knows must state its shape: one error
    naming the first missing field and the models known by name."""
    from .released import RELEASED

    for key in ("layers", "hidden", "heads"):
        if is_unstated(f.case.model.get(key)) and key not in f.pub:
            name = f.case.model.get("name")
            raise ConfigError(
                f"case {f.case.id}: model.{key} not stated, and model.name {name!r} is not a released model "
                f"the reader knows ({', '.join(sorted(RELEASED))}); state model.{key} (and the shape around it)")


def model_flags(f: Fields) -> list[str]:
    """Model shape and architecture: layers, hidden, heads, seq, vocab, ffn, attention groups,
    activation, normalization, position embedding, bias, tied embeddings, dropout; the fused loss."""
    flags: list[str] = []
    rel = f.released
    if rel is None:
        _shape_stated(f)
    for key, flag in (("layers", "--num-layers"), ("hidden", "--hidden-size"), ("heads", "--num-attention-heads"),
                      ("seq_len", "--seq-length"), ("vocab", "--vocab-size")):
        n = f.count("model", key, required=rel is None or key not in rel[0])
        if n is None:  # unstated, no recipe value: the released model's own
            n = rel[0][key]
            f.notes.append(f"model.{key} not stated: {n} ({rel[1]})")
        flags += [flag, str(n)]
    value = dict(zip(flags[::2], flags[1::2]))
    flags += ["--max-position-embeddings", value["--seq-length"]]
    ffn = f.count("model", "ffn", required=False)
    if ffn is None and rel is not None and "ffn" in rel[0]:
        ffn = rel[0]["ffn"]
        f.notes.append(f"model.ffn not stated: {ffn} ({rel[1]})")
    if ffn is not None:
        flags += ["--ffn-hidden-size", str(ffn)]
    return flags + _arch_flags(f, int(value["--num-attention-heads"])) + _loss_flags(f)


def _arch_flags(f: Fields, heads: int) -> list[str]:
    """Flags for the words of ``model.arch``, ``model.kv_heads`` and the recipe's architecture keys."""
    m = f.case.model
    feats, remarks = arch_features(str(m.get("arch", "")))
    f.notes.extend(remarks)
    flags: list[str] = []
    kv_key = "kv_heads" if "kv_heads" in m else "query_groups"
    kv = f.count("model", kv_key, required=False) if kv_key in m else None
    if kv is None and feats.get("attn") == "mqa":
        kv = 1
    if kv is None and feats.get("attn") != "mha":
        kv = f.recipe("kv_heads", "model.kv_heads")
    if kv is None and feats.get("attn") != "mha" and (rel := f.released) is not None and "kv_heads" in rel[0]:
        kv = rel[0]["kv_heads"]
        f.notes.append(f"model.kv_heads not stated: {kv} ({rel[1]})")
    if feats.get("attn") == "gqa" and kv is None:
        raise ConfigError(f"case {f.case.id}: GQA named but model.kv_heads not given")
    if kv is not None and kv != heads:
        flags += ["--group-query-attention", "--num-query-groups", str(kv)]
    fam, fam_src = family_settings(m)

    def layer(key: str, where: str) -> Any:  # the recipe's, else the family's configuration, noted
        got = f.recipe(key, where)
        if got is None and key in fam:
            got = fam[key]
            f.notes.append(f"{where} not stated: {got} ({fam_src})")
        return got

    act = feats.get("act") or layer("activation", "activation") or "gelu"
    flags += {"swiglu": ["--swiglu"], "squared_relu": ["--squared-relu"]}.get(act, [])
    norm = feats.get("norm") or layer("normalization", "normalization")
    if norm is None:
        norm = "LayerNorm"
        f.notes.append("normalization not stated: LayerNorm (Megatron-LM default)")
    pos = feats.get("pos") or layer("position_embedding", "position embedding")
    if pos is None:
        pos = "learned_absolute"
        f.notes.append("position embedding not stated: learned absolute (Megatron-LM 2020-21 default; "
                       "RoPE costs within 1% of a layer)")
    flags += ["--normalization", norm, "--position-embedding-type", pos]
    flags += mla_flags(f, feats) + _moe_flags(f)
    if (mtp := mtp_layers(f, feats)):
        flags += ["--mtp-num-layers", str(mtp)]
    flags += hybrid_flags(f.case.id, m, feats.get("mixer") == "mamba", f.notes, f.released)
    flags += attention_flags(f.case.id, m, feats, f.notes, f.released)
    if "--hybrid-override-pattern" in flags and f.released and "fp8" in str(f.case.precision).lower():
        flags.append("--first-last-layers-bf16")
        f.notes.append("fp8: first and last layer in bf16 (Megatron Bridge's hybrid recipes, first_last_layers_bf16)")

    def pick(key: str) -> tuple[Any, str | None]:  # the recipe's value, else the model family's
        return (f.pub[key], f.script) if key in f.pub else (fam.get(key), fam_src)

    bias, src = (feats["bias"] == "yes", "model.arch") if "bias" in feats else pick("bias")
    qwen3 = re.search(r"qwen[\s_-]*3", f"{m.get('name', '')} {m.get('arch', '')}".lower())
    if feats.get("qk_norm") or qwen3:
        flags.append("--qk-layernorm")
        f.notes.append("QK-norm: each head's query and key normalized before RoPE ("
                       + ("model.arch" if feats.get("qk_norm") else "Qwen3's released configuration, q_norm / k_norm")
                       + ")")
    if bias is False:
        flags.append("--disable-bias-linear")
        f.notes.append(f"linear layers without bias ({src})")
    untie, src = pick("untie_embeddings")
    if untie:
        flags.append("--untie-embeddings-and-output-weights")
        f.notes.append(f"output layer untied from the input embedding ({src})")
    dropout, src = pick("hidden_dropout")
    if dropout is not None:
        flags += ["--hidden-dropout", str(dropout)]
        f.notes.append(f"hidden dropout {dropout} ({src})")
    return flags


def _loss_flags(f: Fields) -> list[str]:
    """``--cross-entropy-loss-fusion`` where the recipe sets ``cross_entropy_loss_fusion`` (off
    otherwise, Megatron-LM's and TransformerConfig's default)."""
    if not f.pub.get("cross_entropy_loss_fusion"):
        return []
    f.notes.append(f"loss: Megatron-core's fused vocab-parallel cross-entropy, one all-reduce fewer "
                   f"(cross_entropy_loss_fusion, {f.script})")
    return ["--cross-entropy-loss-fusion"]


_MOE_KEYS = {"experts": ("experts", "num_experts"), "topk": ("topk", "top_k", "router_topk"),
             "ffn": ("moe_ffn", "expert_ffn", "moe_ffn_hidden")}
MOE_TOPK_DEFAULT = 2
"""Megatron-LM's ``--moe-router-topk`` default."""


def _moe_flags(f: Fields) -> list[str]:
    """``--num-experts`` / ``--moe-router-topk`` / ``--moe-ffn-hidden-size`` of a mixture-of-experts
    model: the fields ``model.experts``, ``model.topk``, ``model.moe_ffn`` (or their other names),
    else the counts of the arch phrase ("MoE, 8 experts, top-2 routing")."""
    m, arch = f.case.model, str(f.case.model.get("arch", ""))

    def field(name: str) -> int | None:
        key = next((k for k in _MOE_KEYS[name] if k in m), None)
        return f.count("model", key, required=False) if key else None

    experts = field("experts")
    if experts is None and (hit := re.search(r"(\d+)\s*(?:routed\s+)?experts?\b", arch, re.I)):
        experts = int(hit.group(1))
    rel = f.released
    if experts is None and rel is not None and "experts" in rel[0]:
        return released_moe_flags(*rel, f.notes) + deepseek_moe_flags(f, rel[0]["moe_ffn"])
    named = bool(re.search(r"\bmoe\b|mixture[\s-]+of[\s-]+experts", arch, re.I))
    if experts is None:
        if named:
            raise ConfigError(f"case {f.case.id}: model.arch names a mixture of experts but no expert count; "
                              "give model.experts (and model.topk)")
        return []
    topk = field("topk")
    if topk is None and (hit := re.search(r"\btop[\s-]*(\d+)", arch, re.I)):
        topk = int(hit.group(1))
    if topk is None:
        topk = MOE_TOPK_DEFAULT
        f.notes.append(f"router top-k not stated: {topk} (Megatron-LM's --moe-router-topk default)")
    flags = ["--num-experts", str(experts), "--moe-router-topk", str(topk)]
    ffn = field("ffn")
    if ffn is None and rel is not None and "moe_ffn" in rel[0]:
        ffn = rel[0]["moe_ffn"]
        f.notes.append(f"expert width not stated: {ffn} ({rel[1]})")
    flags += ["--moe-ffn-hidden-size", str(ffn)] if ffn is not None else []
    return flags + deepseek_moe_flags(f, ffn)


# ----------------------------------------------------------------------------------- parallelism
def parallel_sizes(case: Case) -> dict[str, int]:
    """The case's tp, pp, dp, cp and ep sizes (1 where the case has no such key)."""
    size = {}
    for dim in ("tp", "pp", "dp", "cp", "ep"):
        v = case.parallelism.get(dim, 1)
        if dim in ("cp", "ep") and is_unstated(v):  # "NA" in a table without that dimension
            v = 1
        try:
            size[dim] = count(v, f"parallelism.{dim}")[0]
        except ConfigError:
            raise ConfigError(f"case {case.id}: parallelism.{dim} is {v!r}; give an integer >= 1") from None
    return size


_ZERO_KEYS = ("zero", "zero_stage", "deepspeed_zero", "zero_optimization")


def zero_stage(case: Case) -> tuple[str, int] | None:
    """(key, stage) of a stated ZeRO stage ("ZeRO-3", "stage 1", 2), else None."""
    key = next((k for k in case.parallelism if str(k).lower() in _ZERO_KEYS
                and not is_unstated(case.parallelism[k])), None)
    if key is None:
        return None
    m = re.search(r"([0-3])", str(case.parallelism[key]))
    if m is None:
        raise ConfigError(f"case {case.id}: parallelism.{key} is {case.parallelism[key]!r}; give the ZeRO stage, 0-3")
    return key, int(m.group(1))


def fsdp_setting(case: Case) -> tuple[str, int | None] | None:
    """(key, sharding group) when the case turns fully sharded data parallelism on, else None:
    "FSDP: True" (no group), or a count as Megatron Bridge's tables give it (0: DDP; above 0:
    FSDP over that many GPUs)."""
    par = case.parallelism
    zero = zero_stage(case)
    if zero is not None and zero[1] == 3:
        return zero[0], None
    key = next((k for k in par if str(k).lower() in ("fsdp", "megatron_fsdp", "zero3")), None)
    if key is None:
        return None
    count_ = re.match(r"\s*(\d+)\b", str(par[key]))
    if count_:
        return (key, int(count_.group(1))) if int(count_.group(1)) > 0 else None
    return (key, None) if flag_word(par[key], f"parallelism.{key}") else None


def parallel_flags(f: Fields, size: Mapping[str, int], layers: int) -> list[str]:
    """Sizes, interleaved pipeline, sequence parallelism and recomputation."""
    par = f.case.parallelism
    fsdp = fsdp_setting(f.case)
    flags = ["--tensor-model-parallel-size", str(size["tp"]), "--pipeline-model-parallel-size", str(size["pp"])]
    if fsdp is not None:
        fsdp, group = fsdp
        # Megatron-core's FSDP (Megatron Bridge's use_megatron_fsdp; its recipes shard parameters,
        # gradients and optimizer state): each layer gathered for its forward and backward.
        if size["pp"] > 1 or size["ep"] > 1:
            raise ConfigError(f"case {f.case.id}: parallelism.{fsdp} is {par[fsdp]!r} with pp {size['pp']}, "
                              f"ep {size['ep']}: fully sharded data parallelism with pipeline or expert parallelism "
                              "is not supported (models/fsdp.py models it without them)")
        if group not in (None, 1, size["dp"] * size["cp"]):
            raise ConfigError(f"case {f.case.id}: parallelism.{fsdp} is {par[fsdp]!r}: a sharding group of "
                              f"{group} GPUs, not the {size['dp'] * size['cp']} data-parallel ranks "
                              "(hybrid sharding), is not supported")
        flags += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]
        f.notes.append(f"parallelism.{fsdp}: Megatron-FSDP sharding parameters, gradients and optimizer "
                       "state (optim_grads_params, Megatron Bridge's default with use_megatron_fsdp)")
    if size["cp"] > 1:
        flags += ["--context-parallel-size", str(size["cp"])]
    if size["ep"] > 1:
        flags += ["--expert-model-parallel-size", str(size["ep"])]
    etp = _expert_tp(f, par, size)
    if etp is not None and etp != size["tp"]:
        flags += ["--expert-tensor-parallel-size", str(etp)]
    if size["ep"] > 1 and f.pub.get("moe_dispatcher") in ("deepep", "hybridep"):
        backend = f.recipe("moe_dispatcher", "MoE dispatcher")
        flags += ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", backend]
        f.notes.append("flex dispatcher: a token crosses to each other node holding one of its experts once, "
                       "then fans out over NVLink (models/layers/moe_flex.py)")
        if backend == "hybridep" and f.recipe("hybridep_permute_fusion", "HybridEP permute fusion"):
            flags += ["--moe-permute-fusion-into-hybridep"]
    flags += _interleave_flags(f, size["pp"], layers)
    try:
        # An absent key is as unstated as "not stated": the recipe or the framework's default decides.
        sp = flag_word(par.get("sequence_parallel"), "parallelism.sequence_parallel")
        rc = recompute_word(par.get("recompute"))
    except ConfigError as e:
        raise ConfigError(f"case {f.case.id}: {e}") from None
    if sp is None and size["tp"] > 1:
        sp = f.switch("sequence_parallel", "sequence parallelism")
        if sp is None:
            sp = False
            f.notes.append("sequence parallelism not stated: off (Megatron-LM default without --sequence-parallel)")
    if sp and size["tp"] > 1:
        flags.append("--sequence-parallel")
    if rc is None:
        rc = f.recipe("recompute", "recompute")
        if rc is None:
            rc = "none"
            f.notes.append("recompute not stated: none (Megatron-LM default without --recompute-granularity)")
    if rc == "full":
        flags += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif rc == "selective":
        flags += ["--recompute-granularity", "selective"]
        modules = f.recipe("recompute_modules", "recomputed modules", shown=", ".join(f.pub.get("recompute_modules", ())))
        if modules:
            flags += ["--recompute-modules", *modules]
    flag = "--pipeline-model-parallel-layout"
    layout = flags[flags.index(flag) + 1] if flag in flags else ""
    interleaved = ("--num-layers-per-virtual-pipeline-stage" in flags
                   or bool(layout) and parse_pipeline_layout(layout, size["pp"])[1] > 1)
    return flags + _overlap_flags(f, size, bool(sp) and size["tp"] > 1, interleaved) + _ep_overlap_flags(
        f, par, size, interleaved)


def _expert_tp(f: Fields, par: Mapping[str, Any], size: Mapping[str, int]) -> int | None:
    """The expert tensor-parallel size of an MoE job with TP: the case's ``etp`` (or ``expert_tp``),
    else the recipe's; None without TP (experts follow TP, Megatron-core's default) or when neither says."""
    if size["tp"] <= 1:
        return None
    etp = par.get("etp", par.get("expert_tp"))
    if not is_unstated(etp):
        try:
            return count(etp, "parallelism.etp")[0]
        except ConfigError as e:
            raise ConfigError(f"case {f.case.id}: {e}") from None
    return f.recipe("expert_tp", "parallelism.etp") if size["ep"] > 1 else None


def _ep_overlap_flags(f: Fields, par: Mapping[str, Any], size: Mapping[str, int], interleaved: bool) -> list[str]:
    """``--overlap-moe-expert-parallel-comm`` for the case's ``ep_overlap`` (else the recipe's): one
    micro-batch's token exchanges under another's compute (models/ep_overlap.py). Megatron-core runs it
    with pipelining in the interleaved schedule only: a pipelined job without virtual stages runs
    without it, noted."""
    if size["ep"] <= 1:
        return []
    try:
        on = flag_word(par.get("ep_overlap"), "parallelism.ep_overlap")
    except ConfigError as e:
        raise ConfigError(f"case {f.case.id}: {e}") from None
    if on is None:
        on = f.switch("ep_overlap", "expert-parallel overlap")
    if not on:
        return []
    if size["pp"] > 1 and not interleaved:
        f.notes.append("expert-parallel overlap needs virtual pipeline stages with pipelining (Megatron-core): "
                       "this job runs without it")
        return []
    f.notes.append("expert-parallel overlap: Megatron-core's combined 1F1B (overlap_moe_expert_parallel_comm, "
                   "models/ep_overlap.py)")
    return ["--overlap-moe-expert-parallel-comm"]


def _interleave_flags(f: Fields, pp: int, layers: int) -> list[str]:
    """``--num-layers-per-virtual-pipeline-stage`` for the case's ``vpp``, else for its published
    run's virtual stages (count or layers per stage); none for a non-interleaved pipeline."""
    case, pub, script = f.case, f.pub, f.script
    stated = case.parallelism.get("vpp")
    vpp = None
    if not is_unstated(stated) and pp > 1:
        try:
            vpp = count(stated, "parallelism.vpp")[0]
        except ConfigError as e:
            raise ConfigError(f"case {case.id}: {e}") from None
    flag = "--num-layers-per-virtual-pipeline-stage"
    if "pipeline_layout" in pub and pp > 1:
        layout = pub["pipeline_layout"]
        counts, lvpp, mtp = parse_pipeline_layout(layout, pp)
        if sum(counts) == layers and (vpp is None or vpp == lvpp) and mtp == (f.mtp or 0):
            f.notes.append(f"pipeline layout not stated: {layout} ({len(counts)} parts of "
                           f"{min(counts)}-{max(counts)} layers, {script})")
            return ["--pipeline-model-parallel-layout", layout]
    if vpp is None and "layers_per_virtual_stage" in pub and pp > 1:
        per = pub["layers_per_virtual_stage"]
        if layers % (pp * per):
            raise ConfigError(f"case {case.id}: {layers} layers do not split into pp {pp} stages "
                              f"of {per}-layer virtual stages ({script}); fix {PUBLISHED_RUNS_NAME}")
        vpp = layers // (pp * per)
        f.notes.append(f"vpp not stated: {vpp} ({per} layers per virtual stage, {script})")
        return [flag, str(per)] if vpp > 1 else []
    if vpp is None and "virtual_stages" in pub and pp > 1:
        vpp = pub["virtual_stages"]
        f.notes.append(f"vpp not stated: {vpp} ({script})")
    elif stated is not None and vpp is None and pp > 1:
        f.notes.append("vpp not stated: non-interleaved 1F1B (Megatron-LM default without "
                       "--num-layers-per-virtual-pipeline-stage)")
    parts = pp * (vpp if vpp is not None and vpp > 1 else 1)
    mtp = f.mtp or 0
    if (parts > 1 and layers % parts and (layers + 2) % parts and mtp and not (layers + 2 + mtp) % parts
            and (layers + 2 + mtp) // parts > mtp):  # the last part keeps a layer's place beside MTP and loss
        return _layout_flags(f, parts, layers, mtp)
    slots: list[str] = []
    if layers % parts and not (layers + 2) % parts:
        slots = list(ACCOUNT_SPLIT_FLAGS)
        f.notes.append(f"{layers} layers do not split over {parts} pipeline parts: the input embedding and the "
                       f"loss each take a layer's place ({(layers + 2) // parts} per part), as {ACCOUNT_SPLIT_SOURCE}")
    if vpp is None or vpp <= 1:
        return slots
    if layers % parts and not slots:
        raise ConfigError(f"case {case.id}: {layers} layers do not split into pp {pp} x vpp {vpp}")
    return slots + [flag, str((layers + (2 if slots else 0)) // parts)]


def _layout_flags(f: Fields, parts: int, layers: int, mtp: int) -> list[str]:
    """``--pipeline-model-parallel-layout`` where the embedding, each MTP layer and the loss take a
    layer's place and the layers then split evenly (DeepSeek-V3 on pp 8 x vpp 4: ``Et|(tt|)*30mL``)."""
    per = (layers + 2 + mtp) // parts
    stages = ["E" + "t" * (per - 1)] + ["t" * per] * (parts - 2) + ["t" * (per - 1 - mtp) + "m" * mtp + "L"]
    layout = "|".join(stages)
    f.notes.append(f"{layers} layers do not split over {parts} pipeline parts: the input embedding, the {mtp} "
                   f"MTP layer(s) and the loss each take a layer's place, {per} per part "
                   f"(--pipeline-model-parallel-layout {layout}, as Megatron Bridge's DeepSeek-V3 H100 recipe "
                   "'Et|(tt|)*30mL')")
    return ["--pipeline-model-parallel-layout", layout]


def _overlap_flags(f: Fields, size: Mapping[str, int], sp: bool, interleaved: bool) -> list[str]:
    """The recipe's communication overlap: Transformer Engine's TP overlap (needs sequence
    parallelism) and the interleaved schedule's overlapped p2p."""
    flags: list[str] = []
    if f.pub.get("tp_comm_overlap") and size["tp"] > 1 and sp:
        flags.append("--tp-comm-overlap")
        f.notes.append(f"tensor-parallel communication overlapped with the GEMMs (ub_tp_comm_overlap, {f.script})")
        if f.pub.get("tp_comm_aggregate"):
            flags += ["--tp-comm-overlap-aggregate", ",".join(f.pub["tp_comm_aggregate"])]
            f.notes.append(f"ring-exchange overlaps with two steps per GEMM ({', '.join(f.pub['tp_comm_aggregate'])}: "
                           f"ub_tp_comm_overlap_cfg aggregate 1, {f.script})")
        if f.pub.get("tp_comm_sm_margin"):
            margin = ",".join(f"{k}={v}" for k, v in f.pub["tp_comm_sm_margin"].items())
            flags += ["--tp-comm-overlap-sm-margin", margin]
            f.notes.append(f"pipelined reduce-scatter GEMMs leave SMs to their communication kernel ({margin}: "
                           f"ub_tp_comm_overlap_cfg num_sm with set_sm_margin 1, {f.script})")
    if f.pub.get("overlap_p2p_comm") and interleaved:
        flags.append("--overlap-p2p-communication")
        f.notes.append(f"pipeline p2p overlapped with compute (overlap_p2p_comm, {f.script})")
    return flags


def fp8_buf_flags(f: Fields, overlap: bool, fp8: bool) -> list[str]:
    """The pipelined reduce-scatters a recipe runs on fp8 userbuffers in its fp8 runs (TE's
    ``fp8_buf``); nothing without the TP overlap or fp8 (TE keeps the activation dtype then)."""
    names = f.pub.get("tp_comm_fp8_buf") or ()
    if not (overlap and fp8 and names):
        return []
    f.notes.append(f"pipelined reduce-scatters move fp8 ({', '.join(names)}: ub_tp_comm_overlap_cfg fp8_buf, "
                   f"{f.script})")
    return ["--tp-comm-overlap-fp8-buf", ",".join(names)]


def era_flags(case: Case, size: Mapping[str, int], year: int | None, sp: bool, notes: list[str]) -> list[str]:
    """Flags for what the Megatron-LM of the source's year did by default and later releases do not:
    a synchronous tensor-parallel backward all-reduce, scatter/gather pipeline p2p."""
    flags: list[str] = []
    if size["tp"] > 1 and year is not None and year < ASYNC_TP_ALLREDUCE_YEAR:
        flags.append("--no-async-tensor-model-parallel-allreduce")
        notes.append(f"tensor-parallel backward all-reduce synchronous (Megatron-LM in {year}; the "
                     f"async all-reduce overlapping the weight-gradient GEMM arrived in late 2021)")
    if size["pp"] > 1 and size["tp"] > 1 and not sp and year is not None and year < CORE_P2P_YEAR:
        flags.append("--scatter-gather-tensors-in-pipeline")
        notes.append(f"pipeline p2p with the scatter/gather optimization (Megatron-LM in {year}, on by default "
                     "before Megatron-core): each TP rank sends 1/tp of the activation, all-gathered over NVLink")
    return flags
