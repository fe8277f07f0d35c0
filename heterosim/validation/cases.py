"""Validation cases: read a cases YAML and turn each case's free text into runnable inputs.

A case (schema of ``validation/public_cases.yaml``) states hardware, model, parallelism,
batch and precision in words and numbers as the source published them. This module maps them to

- a GPU of the ``kernel_db`` catalogue (:func:`gpu_from_text`: "NVIDIA H100 80GB HBM3 (SXM5)"),
- a cluster spec for :func:`heterosim.cluster.load_cluster` (:func:`cluster_for`: a preset whose
  system name the text names, with the case's GPU and NICs, or a node built from the words:
  NVLink generation / NVSwitch / lanes, "8 x 400 Gb/s NDR"),
- ``models/pretrain_gpt.py`` flags (:func:`megatron_flags`: layers, hidden, heads, kv heads, ffn,
  seq, vocab, architecture words such as SwiGLU, GQA, RMSNorm, RoPE, squared ReLU; precision
  words; parallelism and recomputation),
- the FLOP convention its TFLOP/s use (:func:`flop_convention`).

Anything a case leaves "not stated" takes, first, what its authors' published launch script passed
(:mod:`heterosim.validation.published_runs`: micro-batch, interleaved split, DDP implementation), else
Megatron-LM's documented default for the era, and is listed in the returned ``assumptions``; a
word the reader does not know raises one :class:`~heterosim.errors.ConfigError` naming it and the
words it knows -- never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from heterosim.errors import ConfigError, UnknownGPUError
from heterosim.yamlfile import read_yaml

from .published_runs import published_settings

__all__ = ["Case", "CaseInputs", "load_cases", "positive_int", "gpu_from_text", "cluster_for", "megatron_flags",
           "flop_convention", "source_year", "ARCH_WORDS", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1

PUBLISHED_RUNS_NAME = "heterosim/validation/data/published_runs.yaml"

TORCH_DDP_BUCKET_BYTES = 25 * 2**20
"""torch.nn.parallel.DistributedDataParallel's ``bucket_cap_mb=25`` (its default)."""

# NVLink per-lane rate per direction, GB/s, by generation (NVLink 2.0-4.0: 25 GB/s, 5.0: 50 GB/s;
# NVIDIA V100/A100/H100/B200 whitepapers).
_NVLINK_LANE_GBPS = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
# InfiniBand generations -> per-port line rate, Gb/s (4x links; IBTA roadmap).
_IB_GBPS = {"edr": 100.0, "hdr": 200.0, "ndr": 400.0, "xdr": 800.0}

# Architecture words -> (feature, value). Features: norm, act, pos, attn. Filler words carry None.
ARCH_WORDS: dict[str, tuple[str, Any] | None] = {
    "gpt": None, "llama": None, "mlp": None, "pos": None, "position": None, "embedding": None,
    "embeddings": None, "decoder": None, "only": None, "transformer": None, "and": None,
    "with": None, "mha": ("attn", "mha"), "gqa": ("attn", "gqa"), "mqa": ("attn", "mqa"),
    "gelu": ("act", "gelu"), "swiglu": ("act", "swiglu"), "squared relu": ("act", "squared_relu"),
    "relu2": ("act", "squared_relu"), "layernorm": ("norm", "LayerNorm"),
    "rmsnorm": ("norm", "RMSNorm"), "rope": ("pos", "rope"), "rotary": ("pos", "rope"),
    "learned": ("pos", "learned_absolute"), "absolute": ("pos", "learned_absolute"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One case as written in the file (sections kept as plain dicts)."""

    id: str
    category: str
    source: Mapping[str, Any] = field(default_factory=dict)
    hardware: Mapping[str, Any] = field(default_factory=dict)
    model: Mapping[str, Any] = field(default_factory=dict)
    parallelism: Mapping[str, Any] = field(default_factory=dict)
    batch: Mapping[str, Any] = field(default_factory=dict)
    precision: str = ""
    collective: Mapping[str, Any] = field(default_factory=dict)
    measured: Mapping[str, Any] = field(default_factory=dict)
    notes: str = ""
    problem: str = ""
    """Why the case as written cannot be read (empty when it can): it then fails alone."""


_SECTIONS = ("source", "hardware", "model", "parallelism", "batch", "collective", "measured")


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseInputs:
    """What an end-to-end case runs: script flags, world size, cluster spec, and what was assumed."""

    flags: tuple[str, ...]
    world_size: int
    cluster: Mapping[str, Any]
    gpu: str
    assumptions: tuple[str, ...]


def load_cases(path: str | Path) -> list[Case]:
    """Read a cases YAML (``schema_version: 1``, a ``cases:`` list)."""
    p = Path(path)
    raw = read_yaml(p, "cases file", schema_version=SCHEMA_VERSION, hint=" and a 'cases:' list")
    out, seen = [], set()
    for i, c in enumerate(raw.get("cases") or []):
        if not isinstance(c, Mapping) or "id" not in c or "category" not in c:
            raise ConfigError(f"cases file {p}: case #{i} needs at least 'id' and 'category'")
        if not isinstance(c["id"], (str, int)) or isinstance(c["id"], bool):
            raise ConfigError(f"cases file {p}: case #{i} has id {c['id']!r:.60}; an id is a word like e2e-gpt3-175b")
        if c["id"] in seen:
            raise ConfigError(f"cases file {p}: case id {c['id']!r} appears twice; ids must be unique")
        seen.add(c["id"])
        bad = [k for k in _SECTIONS if not isinstance(c.get(k) or {}, Mapping)]
        sections = {k: (c.get(k) or {}) if k not in bad else {} for k in _SECTIONS}
        problem = (f"case {c['id']!r}: section(s) {', '.join(bad)} must be a mapping of 'key: value' lines, "
                   f"found {type(c[bad[0]]).__name__}" if bad else "")
        out.append(Case(id=str(c["id"]), category=str(c["category"]), precision=str(c.get("precision") or ""),
                        notes=str(c.get("notes") or ""), problem=problem, **sections))
    return out


# ---------------------------------------------------------------------------------------- GPUs
def _model_word(name: str) -> str:
    """The word of a catalogue name that names the model: its first part with a digit ("A100" of
    "A100-SXM4-80GB", "3090" of "RTX-3090"), else its first part ("TITAN" of "TITAN-RTX")."""
    parts = name.split("-")
    return next((p for p in parts if any(ch.isdigit() for ch in p)), parts[0])


def gpu_from_text(text: str) -> str:
    """The catalogue name of the GPU free text describes, e.g. "NVIDIA A100 (SXM4; 40GB ...)".

    An exact name or alias wins; otherwise catalogue GPUs whose model number ("A100", "H20") is a
    word of the text, narrowed by form factor (SXM / PCIe) and memory size ("80GB") when stated.

    Raises:
        UnknownGPUError: no catalogue GPU, or several, fit the words (the message lists them).
    """
    from heterosim.cluster.gpus import load_catalogue

    cat = load_catalogue()
    for t in (text, re.sub(r"\(.*?\)", "", text).strip()):  # as written, then without remarks
        try:
            return cat.get(t).name
        except UnknownGPUError:
            pass
    cands = [g for g in cat.gpus if re.search(
        r"(?<![A-Za-z0-9])" + re.escape(_model_word(g.name)) + r"(?![0-9])", text, re.I)]
    low = re.sub(r"\bnot\s+\w+", " ", text.lower())  # "NOT SXM" names no form factor
    for word in ("sxm", "pcie"):
        if word in low:
            cands = [g for g in cands if word in g.name.lower()] or cands
    sizes = {float(m) for m in re.findall(r"(\d+)\s*GB(?!/)", text, re.I)}
    if sizes:
        cands = [g for g in cands if round(g.hbm_bytes / 2**30) in sizes] or cands
    if len(cands) == 1:
        return cands[0].name
    names = ", ".join(g.name for g in cands) if cands else ", ".join(cat.names())
    raise UnknownGPUError(f"GPU {text!r}: {'several catalogue GPUs fit' if cands else 'no catalogue GPU fits'} "
                          f"({names}); name the model, form factor and memory, e.g. 'A100-SXM4-80GB'")


# ------------------------------------------------------------------------------------ clusters
def _norm(s: str) -> str:
    return re.sub(r"[^0-9a-z]", "", s.lower())


def _nics(text: str) -> tuple[int | None, float | None]:
    """(count, Gb/s per NIC) stated by inter-node text; None where it is not stated."""
    t = text.replace("×", "x")
    m = re.search(r"(\d+)\s*x\s*(\d+(?:\.\d+)?)\s*Gb", t, re.I)
    if m:
        return int(m.group(1)), float(m.group(2))
    m = re.search(r"(\d+(?:\.\d+)?)\s*Gb\S*\s*x\s*(\d+)", t, re.I)
    if m:
        return int(m.group(2)), float(m.group(1))
    m = re.search(r"(\d+(?:\.\d+)?)\s*Gb", t, re.I)
    if m:
        return None, float(m.group(1))
    for word, rate in _IB_GBPS.items():
        if re.search(rf"\b{word}\b", t, re.I):
            return None, rate
    return None, None


def _nic_summary(nics: Any) -> tuple[int, float]:
    """(count, Gb/s) of a spec's ``nics`` entry, shorthand or list."""
    if isinstance(nics, Mapping):
        return int(nics["count"]), float(nics["bw_Gbps"])
    return len(nics), max(float(n["bw_Gbps"]) for n in nics)


def _nvlink(text: str, gpu_nvlink_GBps: float) -> dict[str, Any] | None:
    """The ``nvlink:`` section intra-node text describes; None for PCIe-only nodes."""
    low = text.lower()
    if "nvlink" not in low and "nvswitch" not in low:
        if "pcie" in low:
            return None
        raise ConfigError(f"intra_node {text!r}: say NVLink/NVSwitch or PCIe")
    gen = re.search(r"nvlink\s*(\d)", low)
    lane = _NVLINK_LANE_GBPS[int(gen.group(1))] if gen else 25.0
    lanes = re.search(r"(\d+)\s*(?:nvlink\s*)?(?:links|lanes)", low)
    bidir = re.search(r"(\d+(?:\.\d+)?)\s*gb/s\s*bidirectional", low)
    if lanes:
        n = int(lanes.group(1))
    elif bidir:
        n = round(float(bidir.group(1)) / 2 / lane)
    else:  # the GPU's datasheet NVLink bandwidth per direction
        n = round(gpu_nvlink_GBps / lane)
    if "nvswitch" not in low:
        raise ConfigError(f"intra_node {text!r}: NVLink without NVSwitch needs a mesh; write a cluster "
                          "YAML (docs/clusters.md) for it")
    return {"kind": "nvswitch", "lanes": n, "lane_GBps": lane, "nvls": "nvls" in low or "sharp" in low}


def cluster_for(hardware: Mapping[str, Any], num_gpus: int) -> tuple[dict[str, Any], str, list[str]]:
    """(cluster spec dict, catalogue GPU, assumptions) for a case's ``hardware`` section.

    If the ``system`` text names a preset's system ("DGX A100 (Selene)" -> ``dgx-a100``) and the
    GPUs per node agree, that preset's node (PCIe switches, CPUs, fabric) is used with the case's
    GPU, NVLink and NICs; otherwise a node is built from the words alone (PCIe switches one per
    GPU pair, two sockets, rail-optimized fabric with 32 nodes per leaf).
    """
    from heterosim.cluster import get_gpu, preset_names, preset_path, read_spec

    notes: list[str] = []
    if "gpu" not in hardware:
        raise ConfigError("hardware: no 'gpu' given; name the GPU, e.g. 'NVIDIA A100-SXM4-80GB'")
    gpu = gpu_from_text(str(hardware["gpu"]))
    spec = get_gpu(gpu)
    gpn = positive_int(hardware.get("gpus_per_node") or min(num_gpus, 8), "hardware.gpus_per_node")
    if "gpus_per_node" not in hardware:
        notes.append(f"gpus_per_node not stated: {gpn}")
    system = _norm(str(hardware.get("system", "")))
    base = None
    for name in sorted(preset_names(), key=len, reverse=True):
        if system and _norm(name) in system:
            cand = read_spec(preset_path(name)).to_dict()
            ntype = next(iter(cand["node_types"].values()))
            if ntype["gpus_per_node"] == gpn:
                base = (name, cand)
                break
    intra = str(hardware.get("intra_node", ""))
    inter = str(hardware.get("inter_node", ""))
    count, rate = _nics(inter) if inter and not inter.lower().startswith("n/a") else (None, None)
    if base is not None:
        name, d = base
        tname = next(iter(d["node_types"]))
        node = d["node_types"][tname]
        notes.append(f"node layout (PCIe switches, CPUs, fabric) of preset {name}")
    else:
        d = {"schema_version": 1, "node_types": {}, "fabric": {"kind": "rail_optimized", "nodes_per_leaf": 32}}
        tname = "node"
        gen = {16: 3, 32: 4, 64: 5, 128: 6}.get(round(spec.pcie_bw / 1e9), 4)
        node = {"gpus_per_node": gpn, "pcie": {"gen": gen}, "cpu": {"sockets": 2, "vendor": "other"}}
        notes.append(f"node built from the text: PCIe Gen{gen} (the GPU's), a switch per GPU pair, 2 sockets, "
                     "rail-optimized fabric, 32 nodes per leaf")
    if intra:
        nv = _nvlink(intra, spec.nvlink_bw / 1e9)
        if nv is None:
            node.pop("nvlink", None)
        else:
            node["nvlink"] = {**node.get("nvlink", {}), **nv}
    if count is None and rate is not None:
        count = _nic_summary(node["nics"])[0] if node.get("nics") else gpn
        notes.append(f"NICs per node not stated: {count}")
    if rate is not None:
        node["nics"] = {"count": count, "bw_Gbps": rate}
        if base is not None and isinstance(node.get("pcie"), Mapping) and "switches" in node["pcie"]:
            sw = node["pcie"]["switches"]
            per = count // len(sw) if count % len(sw) == 0 else None
            if per is None:
                node["pcie"] = {k: v for k, v in node["pcie"].items() if k != "switches"}
            else:
                node["pcie"]["switches"] = [{**s, "nics": list(range(i * per, (i + 1) * per))} for i, s in enumerate(sw)]
    elif "nics" not in node:
        node["nics"] = {"count": gpn, "bw_Gbps": 200.0}
        notes.append("no inter-node network stated: one 200 Gb/s NIC per GPU (unused on one node)")
    if num_gpus < gpn:  # a job on part of one node: model just the GPUs it uses
        node["gpus_per_node"] = num_gpus
        if isinstance(node.get("pcie"), Mapping):
            node["pcie"] = {k: v for k, v in node["pcie"].items() if k != "switches"}
        n, bw = _nic_summary(node["nics"])
        node["nics"] = {"count": max(1, n * num_gpus // gpn), "bw_Gbps": bw}
        notes.append(f"job uses {num_gpus} of the node's {gpn} GPUs: node modelled with those GPUs only")
    d["node_types"] = {tname: node}
    d["name"] = "case"
    d["description"] = f"{hardware.get('gpu')}; {intra}; {inter}"
    d["node_groups"] = [{"name": "g", "gpu": gpu, "node_type": tname}]
    d.pop("placement", None)
    return d, gpu, notes


# ------------------------------------------------------------------------------------- models
def positive_int(v: Any, where: str) -> int:
    """``v`` as an integer >= 1 (an int or a string of digits), else one ConfigError naming ``where``."""
    n = _int_or_none(v)
    if n is None or n < 1:
        raise ConfigError(f"{where} is {v!r:.60}; give an integer >= 1")
    return n


def _int_or_none(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and re.fullmatch(r"\s*\d+\s*", v):
        return int(v)
    return None


def _arch(text: str) -> dict[str, Any]:
    """Architecture features named by ``text``; phrases ending in "not specified" are skipped."""
    t = text.lower().replace("squared-relu", "squared relu").replace("squared_relu", "squared relu")
    t = re.sub(r"[^,;()]*not (?:specified|stated)", " ", t)
    feats: dict[str, Any] = {}
    words = re.findall(r"squared relu|[a-z][a-z0-9]*", t)
    for w in words:
        if w not in ARCH_WORDS:
            raise ConfigError(f"model arch {text!r}: unknown word {w!r}; known words: "
                              f"{', '.join(sorted(ARCH_WORDS))} (or say '... not specified')")
        f = ARCH_WORDS[w]
        if f is not None:
            if f[0] in feats and feats[f[0]] != f[1]:
                raise ConfigError(f"model arch {text!r}: both {feats[f[0]]!r} and {f[1]!r} for {f[0]}")
            feats[f[0]] = f[1]
    return feats


def _recompute(text: Any) -> str:
    t = str(text).lower()
    if t in ("false", "none", "no", "off", "") or t.startswith("none"):
        return "none"
    if "selective" in t:
        return "selective"
    if "full" in t:
        return "full"
    raise ConfigError(f"parallelism.recompute {text!r}: say full, selective or none")


def _precision(text: str) -> tuple[list[str], str]:
    low = text.lower()
    found = [(low.find(w), w) for w in ("fp16", "bf16", "fp8") if w in low]
    if not found:
        raise ConfigError(f"precision {text!r}: name fp16, bf16 or fp8")
    if any(w == "fp8" for _, w in found):
        return ["--bf16", "--fp8-format", "hybrid"], "fp8 GEMMs (hybrid e4m3/e5m2), bf16 elsewhere"
    first = min(found)[1]
    note = f"precision {first}" + (" (first of several named)" if len(found) > 1 else "")
    return [f"--{first}"], note


def _model_flags(case: Case, notes: list[str]) -> list[str]:
    """Model-shape and architecture flags: layers, hidden, heads, seq, vocab, ffn, attention groups,
    activation, normalization and position embedding (unstated ones noted in ``notes``)."""
    m = case.model
    need = {"layers": "--num-layers", "hidden": "--hidden-size", "heads": "--num-attention-heads",
            "seq_len": "--seq-length", "vocab": "--vocab-size"}
    flags: list[str] = []
    for key, flag in need.items():
        v = _int_or_none(m.get(key))
        if v is None:
            raise ConfigError(f"case {case.id}: model.{key} is {m.get(key)!r}; give an integer")
        flags += [flag, str(v)]
    flags += ["--max-position-embeddings", str(int(m["seq_len"]))]
    if _int_or_none(m.get("ffn")) is not None:
        flags += ["--ffn-hidden-size", str(int(m["ffn"]))]
    return flags + _arch_flags(case, notes)


def _arch_flags(case: Case, notes: list[str]) -> list[str]:
    """Flags for the architecture words of ``model.arch`` (and ``model.kv_heads``)."""
    m = case.model
    feats = _arch(str(m.get("arch", "")))
    flags: list[str] = []
    kv = _int_or_none(m.get("kv_heads", m.get("query_groups")))
    if kv is None and feats.get("attn") == "mqa":
        kv = 1
    if feats.get("attn") == "gqa" and kv is None:
        raise ConfigError(f"case {case.id}: GQA named but model.kv_heads not given")
    if kv is not None and kv != int(m["heads"]):
        flags += ["--group-query-attention", "--num-query-groups", str(kv)]
    if feats.get("act") == "swiglu":
        flags.append("--swiglu")
    elif feats.get("act") == "squared_relu":
        flags.append("--squared-relu")
    flags += ["--normalization", feats.get("norm", "LayerNorm")]
    if "norm" not in feats:
        notes.append("normalization not stated: LayerNorm (Megatron-LM default)")
    flags += ["--position-embedding-type", feats.get("pos", "learned_absolute")]
    if "pos" not in feats:
        notes.append("position embedding not stated: learned absolute (Megatron-LM 2020-21 default; "
                     "RoPE costs within 1% of a layer)")
    return flags


def _parallel_sizes(case: Case) -> dict[str, int]:
    """The case's tp, pp, dp, cp and ep sizes (1 where not given)."""
    size = {}
    for dim in ("tp", "pp", "dp", "cp", "ep"):
        v = case.parallelism.get(dim, 1)
        size[dim] = _int_or_none(v)
        if size[dim] is None or size[dim] < 1:
            raise ConfigError(f"case {case.id}: parallelism.{dim} is {v!r}; give an integer >= 1")
    return size


def _parallel_flags(case: Case, size: Mapping[str, int], pub: Mapping[str, Any], script: str | None,
                    notes: list[str]) -> list[str]:
    """Parallelism flags: sizes, interleaved pipeline, sequence parallelism and recomputation."""
    par = case.parallelism
    flags = ["--tensor-model-parallel-size", str(size["tp"]), "--pipeline-model-parallel-size", str(size["pp"])]
    if size["cp"] > 1:
        flags += ["--context-parallel-size", str(size["cp"])]
    if size["ep"] > 1:
        flags += ["--expert-model-parallel-size", str(size["ep"])]
    flags += _interleave_flags(case, size["pp"], pub, script, notes)
    if par.get("sequence_parallel") is True:
        flags.append("--sequence-parallel")
    rc = _recompute(par.get("recompute", "none"))
    if rc == "full":
        flags += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif rc == "selective":
        flags += ["--recompute-granularity", "selective"]
    return flags


def _interleave_flags(case: Case, pp: int, pub: Mapping[str, Any], script: str | None,
                      notes: list[str]) -> list[str]:
    """``--num-layers-per-virtual-pipeline-stage`` for the case's ``vpp``, else for its published
    launch script's layers per virtual stage; none for a non-interleaved pipeline."""
    layers, stated = case.model["layers"], case.parallelism.get("vpp")
    vpp = _int_or_none(stated)
    flag = "--num-layers-per-virtual-pipeline-stage"
    if vpp is None and "layers_per_virtual_stage" in pub and pp > 1:
        per = pub["layers_per_virtual_stage"]
        if int(layers) % (pp * per):
            raise ConfigError(f"case {case.id}: {layers} layers do not split into pp {pp} stages "
                              f"of {per}-layer virtual stages ({script}); fix {PUBLISHED_RUNS_NAME}")
        vpp = int(layers) // (pp * per)
        notes.append(f"vpp not stated: {vpp} ({per} layers per virtual stage, {script})")
        return [flag, str(per)] if vpp > 1 else []
    if stated is not None and vpp is None and pp > 1:
        notes.append("vpp not stated: non-interleaved 1F1B (Megatron-LM default without "
                     "--num-layers-per-virtual-pipeline-stage)")
    if vpp is None or vpp <= 1:
        return []
    if int(layers) % (pp * vpp):
        raise ConfigError(f"case {case.id}: {layers} layers do not split into pp {pp} x vpp {vpp}")
    return [flag, str(int(layers) // (pp * vpp))]


def _batch_flags(case: Case, pub: Mapping[str, Any], script: str | None, micro_batch_default: int,
                 notes: list[str]) -> list[str]:
    """Data-parallel gradient reduction and batch flags (micro-batch: stated, else published, else
    ``micro_batch_default``)."""
    b = case.batch
    flags: list[str] = []
    mb = _int_or_none(b.get("micro"))
    if mb is None and "micro_batch" in pub:
        mb = int(pub["micro_batch"])
        notes.append(f"micro-batch not stated: {mb} ({script})")
    elif mb is None:
        mb = micro_batch_default
        notes.append(f"micro-batch not stated: {mb} (Megatron-LM's --micro-batch-size has no default; 1 "
                     "gives the most micro-batches per pipeline)")
    if "ddp" in pub:
        if pub["ddp"] == "torch":
            # Bucket size in elements of 2-byte gradients: the models' grads are in the fp16/bf16
            # parameter dtype (every case names fp16, bf16 or fp8-with-bf16).
            flags += ["--overlap-grad-reduce", "--ddp-bucket-size", str(TORCH_DDP_BUCKET_BYTES // 2)]
            notes.append(f"data parallelism: PyTorch DDP ({script}): gradient all-reduce in 25 MB buckets "
                         "overlapped with the backward")
        else:
            notes.append(f"data parallelism: Megatron LocalDDP ({script}): one gradient all-reduce after "
                         "the backward")
    gb = _int_or_none(b.get("global"))
    if gb is None:
        raise ConfigError(f"case {case.id}: batch.global is {b.get('global')!r}; give an integer")
    return flags + ["--micro-batch-size", str(mb), "--global-batch-size", str(gb)]


def _era_flags(case: Case, size: Mapping[str, int], year: int | None, notes: list[str]) -> list[str]:
    """Flags for what the Megatron-LM of the source's year did by default and later releases do not:
    a synchronous tensor-parallel backward all-reduce, scatter/gather pipeline p2p."""
    flags: list[str] = []
    if size["tp"] > 1 and year is not None and year < ASYNC_TP_ALLREDUCE_YEAR:
        flags.append("--no-async-tensor-model-parallel-allreduce")
        notes.append(f"tensor-parallel backward all-reduce synchronous (Megatron-LM in {year}; the "
                     f"async all-reduce overlapping the weight-gradient GEMM arrived in late 2021)")
    if (size["pp"] > 1 and size["tp"] > 1 and case.parallelism.get("sequence_parallel") is not True
            and year is not None and year < CORE_P2P_YEAR):
        flags.append("--scatter-gather-tensors-in-pipeline")
        notes.append(f"pipeline p2p with the scatter/gather optimization (Megatron-LM in {year}, on by default "
                     "before Megatron-core): each TP rank sends 1/tp of the activation, all-gathered over NVLink")
    return flags


def megatron_flags(case: Case, *, micro_batch_default: int = 1) -> CaseInputs:
    """``models/pretrain_gpt.py`` flags, world size and cluster of an end-to-end case.

    Unstated settings come from the case's published launch script (:func:`published_settings`),
    else Megatron-LM's default, and are listed in ``assumptions`` (the cluster's last).
    """
    notes: list[str] = []
    flags = _model_flags(case, notes)
    size = _parallel_sizes(case)
    world = size["tp"] * size["pp"] * size["dp"] * size["cp"]
    pub, script = published_settings(case)
    flags += _parallel_flags(case, size, pub, script, notes)
    flags += _batch_flags(case, pub, script, micro_batch_default, notes)
    p_flags, p_note = _precision(case.precision)
    flags += p_flags
    notes.append(p_note)
    cluster, gpu, hw_notes = cluster_for(case.hardware, world)
    year = source_year(case)
    flags += _era_flags(case, size, year, notes)
    a_flags, a_notes = _attention(case, gpu, year)
    return CaseInputs(flags=tuple(flags + a_flags), world_size=world, cluster=cluster, gpu=gpu,
                      assumptions=tuple(notes + a_notes + hw_notes))


FLASH_IN_MEGATRON_YEAR = 2023
"""First Megatron-LM year with flash attention (``--use-flash-attn``, 2023); earlier releases ran
core attention unfused (baddbmm, fused scale-mask-softmax, dropout, bmm)."""

ASYNC_TP_ALLREDUCE_YEAR = 2022
"""First year whose Megatron-LM runs overlap the column-parallel input-gradient all-reduce with the
weight-gradient GEMM (``LinearWithGradAccumulationAndAsyncAllreduce``, added in late 2021, after the
SC'21 paper's April 2021 runs; ``--no-async-tensor-model-parallel-allreduce`` turns it off)."""

CORE_P2P_YEAR = 2023
"""First year of Megatron-core's pipeline p2p, which sends whole tensors. Earlier releases split each
p2p tensor over the TP ranks and all-gathered it after (``--scatter-gather-tensors-in-pipeline``,
default on; Narayanan et al., SC'21, section 4.1)."""

ATTENTION_DROPOUT_DEFAULT = 0.1
"""Megatron-LM's ``--attention-dropout`` default (arguments.py, every release)."""


def source_year(case: Case) -> int | None:
    """The year of the run's software, from its source (``SC'21``, ``Sept 2020``, ``2104.04473``...)."""
    text = " ".join(str(case.source.get(k, "")) for k in ("title", "url")) + " " + case.id
    years = [int(y) for y in re.findall(r"(?<![0-9])(20[12][0-9])(?![0-9])", text)]
    years += [2000 + int(y) for y in re.findall(r"\b(?:SC|ISC|NeurIPS|ICML|MLSys)'?(\d\d)\b", text)]
    return min(years) if years else None


def _attention(case: Case, gpu: str, year: int | None) -> tuple[list[str], list[str]]:
    """Flags and notes for the core-attention kernel the measured run used."""
    from heterosim.cluster.gpus import get_gpu

    word = str(case.model.get("attention", "")).lower()
    cc = get_gpu(gpu).compute_capability
    unfused = ["--attention-backend", "unfused", "--attention-dropout", str(ATTENTION_DROPOUT_DEFAULT)]
    if word:
        if "flash" in word:
            if 0 < cc < 80:
                raise ConfigError(f"case {case.id}: model.attention says flash, but {gpu} (sm_{cc}) has no "
                                  "flash-attention kernel (FlashAttention needs sm_80+); fix the case")
            return [], [f"attention: flash (model.attention {word!r})"]
        if any(w in word for w in ("unfused", "local", "baddbmm", "softmax")):
            return unfused, [f"attention: unfused (model.attention {word!r}), dropout {ATTENTION_DROPOUT_DEFAULT}"]
        raise ConfigError(f"case {case.id}: model.attention {word!r} is not understood; "
                          "write 'flash' or 'unfused'")
    if 0 < cc < 80:
        return unfused, [f"attention not stated: unfused (baddbmm, fused softmax, dropout "
                         f"{ATTENTION_DROPOUT_DEFAULT}, bmm): {gpu} (sm_{cc}) has no flash-attention kernel"]
    if year is not None and year < FLASH_IN_MEGATRON_YEAR:
        return unfused, [f"attention not stated: unfused (baddbmm, fused softmax, dropout "
                         f"{ATTENTION_DROPOUT_DEFAULT}, bmm), Megatron-LM's core attention in {year} "
                         f"(flash attention arrived in {FLASH_IN_MEGATRON_YEAR})"]
    return [], ["attention not stated: flash attention (today's Megatron-LM default"
                + (f"; source year {year})" if year else "; source year unknown)")]


def flop_convention(case: Case) -> str | None:
    """``hardware`` (recompute forward counted: Megatron's 96·B·s·l·h² formula), ``model``
    (72·B·s·l·h², no recompute) or None when the case does not say."""
    text = f"{case.notes} {case.measured.get('flop_convention', '')}".lower()
    if "96*b" in text.replace(" ", "") or "includes the recompute" in text or "hfu" in text.split("(")[0]:
        return "hardware"
    if "72*b" in text.replace(" ", "") or "mfu" in text or "excludes the recompute" in text:
        return "model"
    return None
