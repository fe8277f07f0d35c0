"""Launch settings that a case's source published apart from its results table.

Papers and benchmark READMEs leave the micro-batch size, the interleaved-pipeline split, sequence
parallelism, recomputation, the data-parallel implementation and its overlap out of their tables;
the authors' launch scripts and recipe files state them (SC'21 Table 1: ``examples/sc21/run_table_1.sh``
in NVIDIA/Megatron-LM; the DGX Cloud benchmarks: the NeMo recipe YAML and ``configure.sh`` beside
each README in NVIDIA/dgxc-benchmarking). ``heterosim/validation/data/published_runs.yaml`` lists
such runs with the file and commit they come from; :func:`published_settings` returns the
settings of the first run whose ``match`` fits a case. The case reader uses them only for fields
the case leaves unstated, and says so in its assumptions. A run may lay its settings over the
defaults of the framework its source names (``inherits_framework``, :mod:`.frameworks`), and may
match on that framework, the GPU and the precision besides the case's model, parallelism and batch
fields (:data:`MATCH_KEYS`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Protocol

from heterosim.cluster.gpus import get_gpu
from heterosim.errors import ConfigError, UnknownGPUError
from heterosim.layout import parse_pipeline_layout
from heterosim.yamlfile import read_yaml
from ncclshim.tuning import ENV_NAME

from .frameworks import framework_settings, names_megatron_bridge
from .hardware import gpu_from_text
from .released import released

__all__ = ["PublishedRun", "load_published_runs", "published_settings", "DEFAULT_PATH", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1
DEFAULT_PATH = Path(__file__).with_name("data") / "published_runs.yaml"

# Setting -> what its value must be: a type, a tuple of the words allowed, a frozenset of the
# words a list may hold, a dict of the keys a mapping may hold and each key's type, or "env" (NCCL
# environment variables the launch script exports, NCCL_* names to values).
SETTINGS: dict[str, Any] = {
    "micro_batch": int, "layers_per_virtual_stage": int, "virtual_stages": int,
    "ddp": ("torch", "local", "distributed"), "bucket_mb": int, "overlap_grad_reduce": bool,
    "overlap_param_gather": bool, "sequence_parallel": bool, "recompute": ("none", "selective", "full"),
    "tp_comm_overlap": bool, "cross_entropy_loss_fusion": bool,
    "tp_comm_aggregate": frozenset({"qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad"}),
    "tp_comm_sm_margin": {"proj_fprop": int, "fc2_fprop": int},
    "tp_comm_fp8_buf": frozenset({"proj_fprop", "fc2_fprop"}),
    "overlap_p2p_comm": bool, "fp8_recipe": ("hybrid", "e4m3"), "fp8_scaling": ("delayed", "tensorwise"),
    "fp8_params": bool,
    "grad_sync_dtype": ("bf16", "fp32"), "hidden_dropout": float, "attention_dropout": float, "bias": bool,
    "untie_embeddings": bool, "normalization": ("LayerNorm", "RMSNorm"),
    "activation": ("gelu", "swiglu", "squared_relu"), "position_embedding": ("learned_absolute", "rope"),
    "attention": ("flash", "fused", "unfused"), "heads": int, "kv_heads": int, "hidden": int, "ffn": int,
    "seq_len": int, "vocab": int, "nccl_env": "env", "expert_tp": int, "pipeline_layout": "layout",
    "moe_dispatcher": ("alltoall", "deepep", "hybridep"), "hybridep_permute_fusion": bool, "ep_overlap": bool,
    # Megatron-core's recompute_modules (models/layers/recompute.py RECOMPUTE_MODULES; this package
    # does not import the model, a test keeps the two equal)
    "recompute_modules": frozenset({"core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts", "mla_up_proj"}),
}
MATCH_KEYS = {
    "framework": "the framework the source names: megatron-bridge (frameworks.names_megatron_bridge)",
    "gpu": "the canonical name of hardware.gpu (H100-SXM5-80GB, ...)",
    "precision": "the case's precision kind: bf16, fp8 (delayed or current scaling), mxfp8 or nvfp4",
}
"""Match keys beyond the case's ``model`` / ``parallelism`` / ``batch`` fields."""
_RELEASED_SHAPE = ("layers", "hidden", "heads")
"""Model fields a case may leave to the released configuration it names (:func:`.released.released`)."""
DDP_KINDS = SETTINGS["ddp"]
_SECTIONS = ("model", "parallelism", "batch")


class CaseFields(Protocol):
    """What a run's ``match`` reads of a case (:class:`heterosim.validation.cases.Case` has it)."""

    source: Mapping[str, Any]
    model: Mapping[str, Any]
    parallelism: Mapping[str, Any]
    batch: Mapping[str, Any]
    hardware: Mapping[str, Any]
    precision: str


def _norm(text: str) -> str:
    """Lower case, runs of spaces / '_' / '-' as one '-' ("Megatron Bridge" = "megatron-bridge")."""
    return re.sub(r"[\s_-]+", "-", text.lower())


def precision_kind(text: str) -> str:
    """bf16, fp8, mxfp8 or nvfp4 for a case's precision ("FP8-CS", "fp8 (hybrid)", "MXFP8", "FP8 (MX)")."""
    low = _norm(text)
    if "fp4" in low:
        return "nvfp4"
    if "fp8" in low:
        return "mxfp8" if re.search(r"mx", low) else "fp8"
    return "bf16"


@dataclass(frozen=True, slots=True)
class PublishedRun:
    """One run: where its settings come from, what it matches, and the settings."""

    source: str
    script: str
    match: Mapping[str, Any]
    settings: Mapping[str, Any]
    inherits_framework: bool = False

    def fits(self, case: CaseFields) -> bool:
        """Whether ``case`` names this run's source and has every matched value."""
        text = " ".join(str(case.source.get(k, "")) for k in ("title", "url", "software"))
        if _norm(self.source) not in _norm(text):
            return False
        rel: tuple[dict[str, Any], str] | None | bool = False  # the released model, looked up once if needed
        for key, want in self.match.items():
            if key in MATCH_KEYS:
                if not _matches(key, str(want), case, text):
                    return False
                continue
            got = [sect[key] for sect in (case.model, case.parallelism, case.batch) if key in sect]
            if not got and key in _RELEASED_SHAPE:  # a released model the case names by name alone
                rel = released(dict(case.model)) if rel is False else rel
                got = [rel[0][key]] if rel and key in rel[0] else []
            if not got or str(got[0]).strip() != str(want):
                return False
        return True


def _matches(key: str, want: str, case: CaseFields, text: str) -> bool:
    if key == "framework":
        return want == "megatron-bridge" and names_megatron_bridge(text)
    if key == "precision":
        return precision_kind(str(case.precision)) == want
    try:
        return gpu_from_text(str(case.hardware.get("gpu", ""))) == want
    except (ConfigError, UnknownGPUError):
        return False


def _parse(doc: Any, path: Path) -> tuple[PublishedRun, ...]:
    runs = doc.get("runs") if isinstance(doc, Mapping) else None
    if not isinstance(runs, list):
        raise ConfigError(f"published runs file {path}: needs a 'runs:' list")
    out = []
    for i, r in enumerate(runs):
        where = f"published runs file {path}: run #{i}"
        if not isinstance(r, Mapping) or not {"source", "script", "match", "settings"} <= set(r):
            raise ConfigError(f"{where} needs source, script, match and settings")
        _check_match(where, r["match"])
        settings = dict(r["settings"])
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)}; valid: {', '.join(SETTINGS)}")
        for key, value in settings.items():
            _check(where, key, value)
        out.append(PublishedRun(source=str(r["source"]), script=str(r["script"]), match=dict(r["match"]),
                                settings=settings, inherits_framework=bool(r.get("inherits_framework", False))))
    return tuple(out)


PRECISION_KINDS = ("bf16", "fp8", "mxfp8", "nvfp4")


def _check_match(where: str, match: Any) -> None:
    """One ConfigError if a framework, GPU or precision ``match`` names nothing known."""
    if not isinstance(match, Mapping):
        raise ConfigError(f"{where}: match must be a mapping, not {match!r}")
    if match.get("framework", "megatron-bridge") != "megatron-bridge":
        raise ConfigError(f"{where}: match.framework {match['framework']!r} is unknown; valid: megatron-bridge")
    if match.get("precision", "bf16") not in PRECISION_KINDS:
        raise ConfigError(f"{where}: match.precision {match['precision']!r} is unknown; valid: "
                          f"{', '.join(PRECISION_KINDS)}")
    if "gpu" not in match:
        return
    try:
        name = get_gpu(str(match["gpu"])).name
    except UnknownGPUError as e:
        raise ConfigError(f"{where}: match.gpu: {e}") from None
    if name != match["gpu"]:
        raise ConfigError(f"{where}: match.gpu {match['gpu']!r} is not a canonical GPU name; give {name!r}")


def _check(where: str, key: str, value: Any) -> None:
    """One ConfigError if ``value`` is not what setting ``key`` takes."""
    want = SETTINGS[key]
    if want == "layout":
        what = f"{where}: {key} must be a Megatron-core layout string (e.g. 'Et|(tt|)*30mL')"
        if not isinstance(value, str):
            raise ConfigError(f"{what}, not {value!r}")
        try:  # the symbols and the places of E and L; the stage count is checked against each case
            parse_pipeline_layout(value, 1)
        except ConfigError as e:
            raise ConfigError(f"{what}: {e}") from None
    elif want == "env":
        if not isinstance(value, Mapping) or not value:
            raise ConfigError(f"{where}: {key} must be a mapping of NCCL_* variables to values, not {value!r}")
        for name, v in value.items():
            if not ENV_NAME.fullmatch(str(name)) or isinstance(v, bool) or not isinstance(v, (str, int)):
                raise ConfigError(f"{where}: {key} entry {name!r}: {v!r} is not an NCCL_* variable with a "
                                  "string or integer value, e.g. NCCL_NVLS_ENABLE: '0'")
    elif isinstance(want, dict):
        if not isinstance(value, Mapping) or not value:
            raise ConfigError(f"{where}: {key} must be a mapping of {', '.join(want)} to a value, not {value!r}")
        for name, v in value.items():
            if name not in want:
                raise ConfigError(f"{where}: {key} names unknown {name!r}; valid: {', '.join(want)}")
            if isinstance(v, bool) or not isinstance(v, want[name]) or v < 1:
                raise ConfigError(f"{where}: {key}.{name} must be a positive integer, not {v!r}")
    elif isinstance(want, frozenset):
        bad = [v for v in value if v not in want] if isinstance(value, list) else [value]
        if bad:
            raise ConfigError(f"{where}: {key} must be a list of {', '.join(sorted(want))}; "
                              f"{bad[0]!r} is not one")
    elif isinstance(want, tuple):
        if value not in want:
            raise ConfigError(f"{where}: {key} {value!r} is unknown; valid: {', '.join(want)}")
    elif want is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key} must be true or false, not {value!r}")
    elif want is int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: {key} must be a positive integer, not {value!r}")
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"{where}: {key} must be a probability in [0, 1), not {value!r}")


@lru_cache(maxsize=8)
def _load(path: str) -> tuple[PublishedRun, ...]:
    p = Path(path)
    return _parse(read_yaml(p, "published runs file", schema_version=SCHEMA_VERSION), p)


def load_published_runs(path: str | os.PathLike | None = None) -> tuple[PublishedRun, ...]:
    """The runs of ``path`` (default: the bundled ``heterosim/validation/data/published_runs.yaml``)."""
    return _load(str(Path(path) if path is not None else DEFAULT_PATH))


def published_settings(case: CaseFields, path: str | os.PathLike | None = None) -> tuple[dict[str, Any], str | None]:
    """(settings, script) of the first published run that fits ``case``; ({}, None) if none does."""
    for run in load_published_runs(path):
        if run.fits(case):
            if not run.inherits_framework:
                return dict(run.settings), run.script
            base, _ = framework_settings(case)  # what the recipe leaves to its framework
            return {**base, **run.settings}, run.script
    return {}, None
