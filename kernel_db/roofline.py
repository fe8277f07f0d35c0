"""The roofline tier of pricing: datasheet peaks times efficiency curves, plus a launch overhead.

A kernel takes ``launch + max(compute, memory)`` (Williams, Waterman & Patterson, "Roofline",
CACM 2009, with the launch term added for small kernels)::

    compute = flops / (peak_flops[dtype] * eff(kernel class, shape))
    memory  = bytes / (hbm_bw * mem_eff_max * mem_factor[kernel class])

The efficiency curves are named parameters in ``kernel_db/data/efficiency.yaml`` (sources there):

- GEMM: ``eff_max * tile_eff * wave_eff * k / (k + k_half)``. The output is cut into tiles; a
  GPU runs ``sm_count`` tiles per wave, so a last partial wave idles SMs (wave quantization). The
  tile is the largest one that fills a wave (``tile_policy``, see :func:`gemm_efficiency`), with a
  split-K factor when even the smallest tile leaves SMs idle. ``k_half`` is the prologue/epilogue cost in K steps.
- Attention (flash kernels): ``eff_max[dir] * wave_eff(b*h*ceil(sq/block_m)) * sk/(sk+sk_half) *
  (min(d, 128)/128) ** head_dim_exp``; ``flops`` are the executed ones (causal halves them).
- SSM scan (Mamba-2's fused conv + SSD): ``eff_fwd`` / ``eff_bwd`` of the dtype's peak, against its
  memory traffic (states and chunk scores go through HBM).
- Every other class is priced by its memory traffic; its math (on CUDA cores) rarely binds.

Known limitations: no L2 residency (a kernel whose inputs sit in L2 runs faster than this says),
no tensor-core shape alignment penalty; the power-capped clock (``GpuSpec.power_clock_ratio``) is one
steady-state ratio per GPU, not a function of each kernel's power draw.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from heterosim.cluster.gpus import GpuSpec
from heterosim.errors import ConfigError
from heterosim.yamlfile import read_yaml

__all__ = ["EfficiencyModel", "load_efficiency", "RooflineTime", "roofline_time", "gemm_efficiency", "attention_efficiency",
           "attention_params"]

SCHEMA_VERSION = 1
_DEFAULT_PATH = Path(__file__).with_name("data") / "efficiency.yaml"
MEMORY_CLASSES = ("elementwise", "copy", "reduction", "norm", "softmax", "cross_entropy", "embedding", "optimizer")


@dataclass(frozen=True, slots=True, kw_only=True)
class RooflineTime:
    """A roofline price: total seconds and how it splits."""

    seconds: float
    """launch + max(compute, memory), seconds."""
    compute_s: float
    """Math time at the modelled efficiency."""
    memory_s: float
    """Memory-traffic time at the modelled bandwidth efficiency."""
    efficiency: float
    """Fraction of the dtype's peak the math runs at (0 for memory-bound-only classes)."""

    @property
    def bound(self) -> str:
        """``compute`` or ``memory``: which roof the kernel sits under."""
        return "compute" if self.compute_s >= self.memory_s else "memory"


def _merge(base: dict, over: Mapping) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict) and out[k]:
            out[k] = _merge(out[k], v)
        else:
            # An empty mapping in the defaults (gemm.dtype) is open: overrides may add any key to it.
            if k not in out and base:
                raise ConfigError(f"efficiency override names unknown parameter {k!r}; known: {sorted(out)}")
            out[k] = copy.deepcopy(dict(v) if isinstance(v, Mapping) else v)
    return out


@dataclass(frozen=True, slots=True)
class EfficiencyModel:
    """Efficiency parameters: defaults plus per-arch and per-GPU overrides (see the YAML)."""

    default: Mapping[str, Any]
    arch: Mapping[str, Any]
    gpu: Mapping[str, Any]
    path: str = ""

    def params(self, gpu: GpuSpec) -> dict:
        """Parameters for ``gpu``: default, then its arch's overrides, then its own."""
        return _params_cached(self, gpu.name, gpu.arch)

    def to_doc(self) -> dict:
        """The YAML document of this model (what :func:`load_efficiency` reads)."""
        return {"schema_version": SCHEMA_VERSION, "format": "heterosim-efficiency", "default": dict(self.default),
                "arch": dict(self.arch), "gpu": dict(self.gpu)}

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other


@lru_cache(maxsize=256)
def _params_cached(model: EfficiencyModel, name: str, arch: str) -> dict:
    p = _merge(dict(model.default), model.arch.get(arch, {}) or {})
    return _merge(p, model.gpu.get(name, {}) or {})


def load_efficiency(path: str | os.PathLike | None = None) -> EfficiencyModel:
    """Load efficiency curves (default: ``kernel_db/data/efficiency.yaml``)."""
    if path is None:
        return _default_model()
    return _load(Path(path))


@lru_cache(maxsize=1)
def _default_model() -> EfficiencyModel:
    return _load(_DEFAULT_PATH)


def _load(path: Path) -> EfficiencyModel:
    doc = read_yaml(path, "efficiency file", schema_version=SCHEMA_VERSION)
    unknown = set(doc) - {"schema_version", "format", "default", "arch", "gpu"}
    if unknown:
        raise ConfigError(f"efficiency file {path}: unknown sections {sorted(unknown)}")
    model = EfficiencyModel(doc["default"], doc.get("arch", {}) or {}, doc.get("gpu", {}) or {}, str(path))
    for sect in ("arch", "gpu"):  # validate overrides now, not at first use
        for key, over in getattr(model, sect).items():
            try:
                _merge(dict(model.default), over or {})
            except ConfigError as e:
                raise ConfigError(f"efficiency file {path}: {sect}.{key}: {e}") from None
    return model


def _wave_eff(tiles: int, sms: int) -> float:
    # Fraction of SM-slots busy over all waves (wave quantization).
    if tiles <= 0:
        return 1.0
    waves = -(-tiles // sms)
    return tiles / (waves * sms)


def gemm_efficiency(m: int, n: int, k: int, batch: int, sms: int, p: Mapping[str, Any]) -> float:
    """Fraction of peak of a (batch x) m x n x k GEMM: tile/split-K choice, waves, K ramp, eff_max.

    ``tile_policy`` (efficiency.yaml) says which tile the library picks:
    ``largest_full_wave`` -- the largest tile whose grid fills at least one wave of SMs, else the
    best (tile x split-K) option. cuBLAS heuristics keep large tiles for their operand reuse and
    accept a partial last wave: NVIDIA's "Matrix Multiplication Background User's Guide" shows the
    resulting wave-quantization sawtooth in measured cuBLAS throughput, which a best-of-tiles pick
    would flatten. ``best`` -- the option with the highest modelled efficiency. ``stream_k`` --
    ``best``, but a grid of at least one full wave has no wave quantization: the library balances
    the last partial wave across all SMs (stream-K, Osama et al., PPoPP 2023; cuBLAS's persistent
    Hopper kernels); NB: the partial tiles' fixup reduction is taken as free (measured H100 rows
    fit best that way, ``efficiency.yaml``).
    """
    m, n, k, batch = max(int(m), 1), max(int(n), 1), max(int(k), 1), max(int(batch), 1)
    options: list[tuple[int, float]] = []  # (tiles of the grid, efficiency), in the file's tile order
    policy = str(p.get("tile_policy", "best"))
    for tm, tn, teff in p["tiles"]:
        tiles = -(-m // tm) * -(-n // tn) * batch
        # NB: a partial tile still costs a whole tile's time; count the padded area as waste.
        fill = (m * n) / (-(-m // tm) * tm * -(-n // tn) * tn)
        split = 1
        if tiles < sms:
            split = max(1, min(sms // tiles, k // int(p["split_k_min_k"])))
        kk = -(-k // split)
        waves = 1.0 if policy == "stream_k" and tiles >= sms else _wave_eff(tiles * split, sms)
        eff = teff * fill * waves * kk / (kk + float(p["k_half"]))
        if split > 1:  # NB: the partial-tile reduction is a flat factor, not a traffic model
            eff *= float(p["split_k_eff"])
        options.append((tiles, eff))
    if policy == "largest_full_wave":
        full = [eff for tiles, eff in options if tiles >= sms]
        best = full[0] if full else max(eff for _, eff in options)
    elif policy in ("best", "stream_k"):
        best = max(eff for _, eff in options)
    else:
        raise ConfigError(f"gemm tile_policy {policy!r} is unknown; valid: best, largest_full_wave, stream_k")
    return float(p["eff_max"]) * best


def attention_params(dims: Mapping[str, Any], p: Mapping[str, Any]) -> Mapping[str, Any]:
    """The attention curve for a kernel: the class's, overridden by the implementation's
    (``impl``: ``flash`` FlashAttention-2, ``fused`` cuDNN; ``dims["impl"]``, what the trace's
    ``--attention-backend`` named) and then by its ``noncausal`` entry for a kernel without a causal
    mask. An implementation the section does not list keeps the class's curve."""
    impl = p.get("impl", {}).get(dims.get("impl"))
    if impl:
        p = {**p, **impl}
    if dims.get("causal") is False and p.get("noncausal"):
        p = {**p, **p["noncausal"]}
    return p


def attention_efficiency(dims: Mapping[str, Any], sms: int, p: Mapping[str, Any]) -> float:
    """Fraction of peak of a flash-attention kernel with dims b, h, sq, sk, d, dir (curve:
    :func:`attention_params`); with a sliding ``window`` the ramp sees the keys a query tile visits,
    ``window + block_m``, instead of ``sk``."""
    p = attention_params(dims, p)
    b, h = int(dims.get("b", 1)), int(dims.get("h", 1))
    sq = int(dims.get("sq", 1))
    sk = int(dims.get("sk", sq))
    d = int(dims.get("d", 128))
    bwd = dims.get("dir", "fwd") == "bwd"
    eff_max = float(p["eff_max_bwd"] if bwd else p["eff_max_fwd"])
    blocks = b * h * -(-sq // int(p["block_m"]))
    if "window" in dims:  # a query tile visits only the key tiles its sliding window reaches
        sk = min(sk, int(dims["window"]) + int(p["block_m"]))
    ramp = sk / (sk + float(p.get("sk_half_bwd") or p["sk_half"] if bwd else p["sk_half"]))
    dfac = (min(d, int(p["head_dim_ref"])) / int(p["head_dim_ref"])) ** float(p["head_dim_exp"])
    return eff_max * _wave_eff(blocks, sms) * ramp * dfac


def roofline_time(
    kernel_class: str,
    dtype: str,
    dims: Mapping[str, Any],
    flops: float,
    nbytes: float,
    gpu: GpuSpec,
    params: Mapping[str, Any],
    *,
    clock_ratio: float | None = None,
    mem_factor: float | None = None,
) -> RooflineTime:
    """Roofline time of one kernel on ``gpu`` with efficiency ``params`` (:meth:`EfficiencyModel.params`).

    Tensor-core math (GEMM, attention) runs at ``clock_ratio`` of the boost clock the datasheet
    peaks assume: by default the GPU's sustained ratio under its power cap
    (:attr:`GpuSpec.power_clock_ratio`, what a training run sees); 1.0 prices a short burst at boost.
    ``mem_factor`` replaces the kernel class's ``memory.mem_factor`` (a kernel of its own,
    ``memory.op_factor``).
    """
    ratio = gpu.power_clock_ratio if clock_ratio is None else float(clock_ratio)
    mem = params["memory"]
    factor = float(mem["mem_factor"].get(kernel_class, 1.0)) if mem_factor is None else float(mem_factor)
    memory_s = nbytes / (gpu.hbm_bw * float(mem["mem_eff_max"]) * factor)
    if kernel_class == "gemm":
        gp = params["gemm"]
        if dtype in gp.get("dtype", {}):  # per-dtype overrides (fp8 / tf32 kernels differ from bf16)
            gp = {**gp, **gp["dtype"][dtype]}
        if dims:
            # A GEMM that leaves sm_margin SMs to a communication kernel (TE's set_sm_margin) runs on
            # the rest: its waves on fewer SMs, at that share of the peak.
            sms = max(1, gpu.sm_count - int(dims.get("sm_margin", 0)))
            eff = gemm_efficiency(dims.get("m", 1), dims.get("n", 1), dims.get("k", 1), dims.get("batch", 1),
                                  sms, gp) * sms / gpu.sm_count
        else:  # NB: no shape: assume a large GEMM (eff_max only)
            eff = float(gp["eff_max"])
        compute_s = flops / (gpu.peak(dtype) * eff * ratio) if flops else 0.0
    elif kernel_class == "attention":
        if dims.get("sq"):
            eff = attention_efficiency(dims, gpu.sm_count, params["attention"])
        else:  # NB: no shape: assume a long-sequence kernel (eff_max of its direction only)
            a = attention_params(dims, params["attention"])
            eff = float(a["eff_max_bwd"] if dims.get("dir") == "bwd" else a["eff_max_fwd"])
        compute_s = flops / (gpu.peak(dtype) * eff * ratio) if flops else 0.0
    elif kernel_class == "ssm":
        # Mamba-2's conv + chunked SSD (capture/ssd_cost.py): its bmm pieces on tensor cores at one
        # fraction of the dtype's peak per direction, its states and C B^T through HBM.
        eff = float(params["ssm"]["eff_bwd" if dims.get("dir") == "bwd" else "eff_fwd"])
        compute_s = flops / (gpu.peak(dtype) * eff * ratio) if flops else 0.0
    else:
        # NB: non-GEMM math runs on CUDA cores, not tensor cores: fp32 vector rate x vector_eff.
        eff = 0.0
        compute_s = flops / (gpu.peak_flops["fp32"] * float(mem["vector_eff"])) if flops else 0.0
    if math.isnan(compute_s) or math.isnan(memory_s):
        raise ConfigError(f"roofline produced NaN for {kernel_class} {dtype} {dict(dims)} on {gpu.name}")
    return RooflineTime(seconds=gpu.launch_overhead_s + max(compute_s, memory_s), compute_s=compute_s,
                        memory_s=memory_s, efficiency=eff)
