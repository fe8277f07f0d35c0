"""Validation cases: read a cases YAML and turn each case's free text into runnable inputs.

A case (schema of ``validation/public_cases.yaml``) states hardware, model, parallelism,
batch and precision in words and numbers as the source published them, remarks included. This
module maps them to

- a GPU of the ``kernel_db`` catalogue and a cluster spec (:mod:`heterosim.validation.hardware`:
  "NVIDIA H100 80GB HBM3 (SXM5)", "DGX H100", "8 x 400 Gb/s NDR"),
- ``models/pretrain_gpt.py`` flags (:func:`megatron_flags`, field by field in
  :mod:`heterosim.validation.flags`; numbers and words read by :mod:`heterosim.validation.phrases`:
  "48 (from memory, unverified)", "128K (128,256 in released config)", "mixed precision (A100)",
  "GPT-style, squared-ReLU MLP (ffn=4h ...)"),
- the FLOP convention its TFLOP/s use (:func:`flop_convention`).

Anything a case leaves "not stated" takes, first, what the run's published recipe or launch script
set (:mod:`heterosim.validation.published_runs`: NVIDIA's dgxc-benchmarking NeMo recipes,
Megatron-LM's SC'21 scripts), else the framework's documented default for the source's year, and
is listed in the returned ``assumptions``; a word the reader does not know raises one
:class:`~heterosim.errors.ConfigError` naming the case, the field and the words it knows -- never a
guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from heterosim.cluster.gpus import get_gpu
from heterosim.errors import ConfigError
from heterosim.yamlfile import read_yaml

from .databatch import TORCH_DDP_BUCKET_BYTES, batch_flags
from .flags import (ASYNC_TP_ALLREDUCE_YEAR, CORE_P2P_YEAR, Fields, era_flags, fp8_buf_flags, model_flags,
                    parallel_flags, parallel_sizes)
from .hardware import cluster_for, gpu_from_text
from .phrases import ARCH_WORDS, DELAYED_SCALING, positive_int, precision_flags
from .frameworks import family_settings, framework_settings
from .published_runs import published_settings

__all__ = ["Case", "CaseInputs", "load_cases", "positive_int", "gpu_from_text", "cluster_for", "megatron_flags",
           "flop_convention", "source_year", "ARCH_WORDS", "SCHEMA_VERSION", "ASYNC_TP_ALLREDUCE_YEAR",
           "CORE_P2P_YEAR", "TORCH_DDP_BUCKET_BYTES"]

SCHEMA_VERSION = 1

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
    nccl_env: Mapping[str, str] = field(default_factory=dict)
    """NCCL environment the run's launch script exports (its recipe's ``nccl_env``)."""
    module: str = ""
    """The Python module captured with ``flags`` as its command line (``torchtitan.train``,
    :mod:`heterosim.validation.titan`); empty: ``models/pretrain_gpt.py`` with Megatron flags."""
    global_batch: int = 0
    """Sequences per iteration where ``flags`` are not Megatron's (0: read ``--global-batch-size``)."""
    seq_len: int = 0
    """Tokens per sequence where ``flags`` are not Megatron's (0: read ``--seq-length``)."""


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


def megatron_flags(case: Case, *, micro_batch_default: int = 1) -> CaseInputs:
    """``models/pretrain_gpt.py`` flags, world size and cluster of an end-to-end case.

    Unstated settings come from the case's published recipe or launch script
    (:func:`published_settings`), else the framework's default, and are listed in ``assumptions``
    (the cluster's last).
    """
    notes: list[str] = []
    pub, script = published_settings(case)
    if not pub:
        pub, script = framework_settings(case)
    f = Fields(case, pub, script, notes)
    flags = model_flags(f)
    size = parallel_sizes(case)
    world = size["tp"] * size["pp"] * size["dp"] * size["cp"]
    flags += parallel_flags(f, size, int(flags[1]))
    cluster, gpu, hw_notes = cluster_for(case.hardware, world)
    year = source_year(case)
    p_flags, p_note = precision_flags(case.precision, get_gpu(gpu).compute_capability, year)
    if "--fp8-format" in p_flags and pub.get("fp8_recipe", "hybrid") != "hybrid":
        p_flags[-1] = pub["fp8_recipe"]
        p_note = f"fp8 GEMMs ({pub['fp8_recipe']}, {script}), bf16 elsewhere"
    if "--fp8-format" in p_flags and "--fp8-recipe" not in p_flags and pub.get("fp8_scaling") == "tensorwise" \
            and not DELAYED_SCALING.search(case.precision.lower()):
        p_flags[1:1] = ["--fp8-recipe", "tensorwise"]
        p_note = f"fp8 scaling not stated: current scaling ({script}); {p_note}"
    flags += batch_flags(f, micro_batch_default, fp8="--fp8-format" in p_flags, bf16="--bf16" in p_flags,
                         dp=size["dp"], seq_len=int(flags[flags.index("--seq-length") + 1]))
    flags += fp8_buf_flags(f, "--tp-comm-overlap" in flags, "--fp8-format" in p_flags)
    flags += p_flags
    notes.append(p_note)
    flags += era_flags(case, size, year, "--sequence-parallel" in flags, notes)
    a_flags, a_notes = _attention(case, gpu, year, pub, script)
    env = {str(k): str(v) for k, v in (pub.get("nccl_env") or {}).items()}
    if env:
        a_notes.append(f"NCCL environment {', '.join(f'{k}={v}' for k, v in env.items())} ({script})")
    if env.get("NCCL_NVLS_ENABLE") == "0":  # the switch has NVLink SHARP; the launch script turns it off
        hw_notes = [NVLS_OFF_NOTE if n.startswith("NVLink SHARP not stated") else n for n in hw_notes]
    return CaseInputs(flags=tuple(flags + a_flags), world_size=world, cluster=cluster, gpu=gpu,
                      assumptions=tuple(notes + a_notes + hw_notes), nccl_env=env)


NVLS_OFF_NOTE = "NVLink SHARP: on the NVSwitch, turned off by the launch script (NCCL_NVLS_ENABLE=0)"
"""What a case's hardware note on NVLS says where its recipe's NCCL environment turns it off."""

FLASH_IN_MEGATRON_YEAR = 2023
"""First Megatron-LM year with flash attention (``--use-flash-attn``, 2023); earlier releases ran
core attention unfused (baddbmm, fused scale-mask-softmax, dropout, bmm)."""

ATTENTION_DROPOUT_DEFAULT = 0.1
"""Megatron-LM's ``--attention-dropout`` default (arguments.py, every release)."""


def source_year(case: Case) -> int | None:
    """The year of the run's software, from its source (``SC'21``, ``Sept 2020``, ``2104.04473``...)."""
    text = " ".join(str(case.source.get(k, "")) for k in ("title", "url")) + " " + case.id
    years = [int(y) for y in re.findall(r"(?<![0-9])(20[12][0-9])(?![0-9])", text)]
    years += [2000 + int(y) for y in re.findall(r"\b(?:SC|ISC|NeurIPS|ICML|MLSys)'?(\d\d)\b", text)]
    return min(years) if years else None


def _attention(case: Case, gpu: str, year: int | None, pub: Mapping[str, Any],
               script: str | None) -> tuple[list[str], list[str]]:
    """Flags and notes for the core-attention kernel the measured run used: the case's word, else
    its recipe's, else the GPU's and the era's."""
    word = str(case.model.get("attention", "")).lower()
    cc = get_gpu(gpu).compute_capability
    dropout = pub.get("attention_dropout", family_settings(case.model)[0].get("attention_dropout",
                                                                          ATTENTION_DROPOUT_DEFAULT))
    unfused = ["--attention-backend", "unfused", "--attention-dropout", str(dropout)]
    if not word and pub.get("attention") == "unfused":
        return unfused, [f"attention not stated: unfused, dropout {dropout} ({script})"]
    if not word and pub.get("attention") in ("flash", "fused") and cc >= 80:
        impl = pub["attention"]
        what = "FlashAttention-2" if impl == "flash" else "cuDNN's fused attention"
        return ["--attention-backend", impl], [f"attention not stated: one fused kernel, {what} ({script})"]
    if word:
        if "flash" in word:
            if 0 < cc < 80:
                raise ConfigError(f"case {case.id}: model.attention says flash, but {gpu} (sm_{cc}) has no "
                                  "flash-attention kernel (FlashAttention needs sm_80+); fix the case")
            return [], [f"attention: flash (model.attention {word!r})"]
        if any(w in word for w in ("unfused", "local", "baddbmm", "softmax")):
            return unfused, [f"attention: unfused (model.attention {word!r}), dropout {dropout}"]
        raise ConfigError(f"case {case.id}: model.attention {word!r} is not understood; "
                          "write 'flash' or 'unfused'")
    if 0 < cc < 80:
        return unfused, [f"attention not stated: unfused (baddbmm, fused softmax, dropout "
                         f"{dropout}, bmm): {gpu} (sm_{cc}) has no flash-attention kernel"]
    if year is not None and year < FLASH_IN_MEGATRON_YEAR:
        return unfused, [f"attention not stated: unfused (baddbmm, fused softmax, dropout "
                         f"{dropout}, bmm), Megatron-LM's core attention in {year} "
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
