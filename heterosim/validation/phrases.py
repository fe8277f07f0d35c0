"""Read the words and annotated numbers of a validation case (schema of ``validation/*_cases.yaml``).

Case files copy what a source published, remarks included: ``heads: 48 (from memory, unverified)``,
``vocab: 128K (128,256 in released config)``, ``precision: mixed precision (A100)``, ``arch: GPT-style,
squared-ReLU MLP (ffn=4h per README FLOP formula)``. Each reader here returns the value and, when it
had to interpret the text, a note the case prints in its assumptions; text it cannot read raises one
:class:`~heterosim.errors.ConfigError` naming the field, the text and what to write instead.

    >>> count("48 (from memory, unverified)", "model.heads")
    (48, "model.heads '48 (from memory, unverified)': 48 (the remark is kept out)")
    >>> count("128K (128,256 in released config)", "model.vocab")[0]
    128256
"""

from __future__ import annotations

import re
from typing import Any

from heterosim.errors import ConfigError

__all__ = ["count", "batch_count", "leading_number", "positive_int", "is_unstated", "flag_word", "recompute_word", "arch_features", "precision_flags",
           "ARCH_WORDS", "ARCH_FILLERS", "BF16_MIXED_YEAR", "DELAYED_SCALING"]

_UNSTATED = re.compile(r"^\s*(not\s+(stated|specified|given|reported|published)|unknown|unstated|n/?a|\?+"
                       r"|[-\u2013\u2014]+\s*$)(?![a-z0-9])", re.I)  # a table's empty cell: "-", en / em dash
_SUFFIX = {"k": 10**3, "m": 10**6, "b": 10**9}
# A leading count: "128,256", "4096", "128K", "1.5M"; then anything (a remark).
_LEADING = re.compile(r"^\s*(?:[A-Za-z]{1,4}\s*[=:]\s*)?(~)?\s*(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)\s*"
                      r"([kKmMbB](?![a-zA-Z]))?")
"""A leading count, after an optional label ("TP=8", "dp: 16")."""
# A plain integer (thousands commas allowed) not followed by a K/M/B suffix or a fraction.
_EXACT = re.compile(r"(?<![\d.,])(\d{1,3}(?:,\d{3})+|\d+)(?![\d]|[.,]\d)(?!\s*[kKmMbB]\b)")


def leading_number(text: str) -> tuple[float, bool] | None:
    """(value, approximate) of the number a text starts with: "3.53", "3,890", "3.9K tokens/s"
    (K / M / B as 10^3 / 10^6 / 10^9), "~200 (still rising)"; None when it starts with none."""
    m = _LEADING.match(text)
    if m is None:
        return None
    return float(m.group(2).replace(",", "")) * _SUFFIX.get((m.group(3) or "").lower(), 1), bool(m.group(1))


def positive_int(v: Any, where: str) -> int:
    """``v`` as an integer >= 1 (an int or a string of digits), else one ConfigError naming ``where``."""
    if isinstance(v, str) and re.fullmatch(r"\s*\d+\s*", v):
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{where} is {v!r:.60}; give an integer >= 1")
    return v


def is_unstated(v: Any) -> bool:
    """Whether a field says it is not known: missing (None), empty, "-" (an empty table cell), or
    "not stated ...", "unknown", "n/a"."""
    return v is None or (isinstance(v, str) and (not v.strip() or bool(_UNSTATED.match(v))))


def count(v: Any, where: str, *, binary: bool = False) -> tuple[int, str | None]:
    """(integer, note) of a count written with remarks; note is None when ``v`` is a plain integer.

    - an integer, or digits with thousands commas: itself ("128,256" -> 128256), also after a
      label ("TP=8" -> 8);
    - a number then a remark: the number ("48 (from memory, unverified)" -> 48);
    - a rounded number (K/M/B suffix) with an exact count in parentheses: the exact count
      ("128K (128,256 in released config)" -> 128256) when it rounds to the same value within 5%;
      without one: the suffix in SI units ("256K" -> 256,000), said so; with ``binary`` (a
      sequence length: "8K context" is 8,192 in every recipe) K and M are 1,024 and 1,024^2.

    Raises:
        ConfigError: no count, an approximate one ("~4096"), a fraction, or zero.
    """
    if isinstance(v, bool) or v is None:
        raise ConfigError(f"{where} is {v!r}; give an integer")
    if isinstance(v, int):
        if v < 1:
            raise ConfigError(f"{where} is {v}; give an integer >= 1")
        return v, None
    if isinstance(v, float):
        if v.is_integer() and v >= 1:
            return int(v), None
        raise ConfigError(f"{where} is {v!r}; give an integer >= 1")
    text = str(v)
    m = _LEADING.match(text)
    if m is None or is_unstated(text):
        raise ConfigError(f"{where} is {text!r:.80}; give an integer (a remark may follow it: "
                          "'48 (from memory)')")
    if m.group(1):
        raise ConfigError(f"{where} is {text!r:.80}: an approximate count; give the exact integer")
    num = float(m.group(2).replace(",", ""))
    suffix = (m.group(3) or "").lower()
    rest = text[m.end():].strip()
    if suffix:
        unit = {"k": 1024, "m": 1024**2}[suffix] if binary and suffix in "km" else _SUFFIX[suffix]
        approx = num * unit
        # "128K" may be 128,000 or 131,072 (binary K): an integer in parentheses within 5% of it
        # states the same count exactly.
        for inner in re.findall(r"\(([^()]*)\)", rest):
            for e in _EXACT.finditer(inner):
                n = int(e.group(1).replace(",", ""))
                if n >= 1 and abs(n / approx - 1) <= 0.05:
                    return n, f"{where} {text!r:.80}: {n} (the exact count in parentheses)"
        if not approx.is_integer() or approx < 1:
            raise ConfigError(f"{where} is {text!r:.80}; give an integer")
        return int(approx), f"{where} {text!r:.80}: {int(approx)} ({m.group(3)} read as {unit:,})"
    if not num.is_integer() or num < 1:
        raise ConfigError(f"{where} is {text!r:.80}; give an integer >= 1")
    if not rest:
        return int(num), None
    return int(num), f"{where} {text!r:.80}: {int(num)} (the remark is kept out)"


_TOKENS = re.compile(r"^\s*(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)\s*([kKmMbB])?\s*tokens?\b", re.I)


def batch_count(v: Any, seq_len: int, where: str = "batch.global") -> tuple[int, str | None]:
    """(sequences, note) of a batch size: a count (:func:`count`), or a number of tokens ("4M
    tokens", "4,194,304 tokens") divided by the sequence length, its K / M read as 1,024 / 1,024^2
    where that divides (4M tokens of 8,192 = 512 sequences), else as 1,000 / 10^6.

    Raises:
        ConfigError: a token count that no reading divides by the sequence length, or no count.
    """
    m = _TOKENS.match(str(v)) if isinstance(v, str) else None
    if m is None:
        return count(v, where)
    num, suffix = float(m.group(1).replace(",", "")), (m.group(2) or "").lower()
    units = ([{"k": 1024, "m": 1024**2}[suffix], _SUFFIX[suffix]] if suffix in ("k", "m")
             else [_SUFFIX[suffix]] if suffix else [1])
    for unit in units:
        tokens = num * unit
        if tokens.is_integer() and tokens >= seq_len and tokens % seq_len == 0:
            n = int(tokens) // seq_len
            return n, (f"{where} {v!r:.80}: {int(tokens):,} tokens = {n} sequences of {seq_len:,}"
                       + (f" ({m.group(2)} read as {unit:,})" if suffix else ""))
    raise ConfigError(f"{where} is {v!r:.80}: a token count that is not a whole number of {seq_len:,}-token "
                      "sequences; give the global batch in sequences")


_TRUE = ("true", "yes", "on", "enabled", "used", "y")
_FALSE = ("false", "no", "off", "disabled", "none", "not used", "n")


def flag_word(v: Any, where: str) -> bool | None:
    """True / False for a yes-or-no field ("on (with TP)", "no"), None when it is not stated."""
    if isinstance(v, bool):
        return v
    if is_unstated(v):
        return None
    t = str(v).strip().lower()
    head = re.split(r"[\s(,;:]", t, maxsplit=1)[0]
    if head in _TRUE or t.startswith(("enabled", "used")):
        return True
    if head in _FALSE or t.startswith(("disabled", "not used")):
        return False
    raise ConfigError(f"{where} is {v!r:.80}; say true or false (or 'not stated')")


def recompute_word(v: Any, where: str = "parallelism.recompute") -> str | None:
    """full / selective / none of an activation-recomputation field; None when it is not stated."""
    if v is False:
        return "none"
    if is_unstated(v):
        return None
    t = str(v).lower()
    if t.strip() in ("false", "none", "no", "off") or t.strip().startswith(("none", "no ")):
        return "none"
    if "selective" in t:
        return "selective"
    if "full" in t or "checkpoint" in t:
        return "full"
    raise ConfigError(f"{where} {v!r:.80}: say full, selective or none (or 'not stated')")


# ------------------------------------------------------------------------------- architecture
# Words (after lower-casing; hyphens, slashes and "=" read as spaces) -> (feature, value).
# Features: attn, act, norm, pos. LayerNorm1p (NeMo's zero-centred gamma) costs what LayerNorm does.
ARCH_WORDS: dict[str, tuple[str, str]] = {
    "mha": ("attn", "mha"), "multi head": ("attn", "mha"), "multihead": ("attn", "mha"),
    "gqa": ("attn", "gqa"), "grouped query": ("attn", "gqa"), "mqa": ("attn", "mqa"), "multi query": ("attn", "mqa"),
    "gelu": ("act", "gelu"), "swiglu": ("act", "swiglu"), "squared relu": ("act", "squared_relu"),
    "relu squared": ("act", "squared_relu"), "relu2": ("act", "squared_relu"),
    "layernorm": ("norm", "LayerNorm"), "layer norm": ("norm", "LayerNorm"), "layernorm1p": ("norm", "LayerNorm"),
    "rmsnorm": ("norm", "RMSNorm"), "rms norm": ("norm", "RMSNorm"),
    "rope": ("pos", "rope"), "rotary": ("pos", "rope"), "learned": ("pos", "learned_absolute"),
    "absolute": ("pos", "learned_absolute"),
    # SwiGLU is the SiLU(Swish)-gated linear unit (Shazeer 2020, arXiv 2002.05202).
    "silu gated": ("act", "swiglu"), "gated silu": ("act", "swiglu"), "swish gated": ("act", "swiglu"),
    "no bias": ("bias", "no"), "without bias": ("bias", "no"), "bias free": ("bias", "no"), "nobias": ("bias", "no"),
    "bias": ("bias", "yes"), "biases": ("bias", "yes"),
    # Qwen3's norm of each head's query and key (--qk-layernorm).
    "qk norm": ("qk_norm", "yes"), "qk layernorm": ("qk_norm", "yes"), "qknorm": ("qk_norm", "yes"),
    # DeepSeek-V2/V3's multi-head latent attention (flags._mla_flags), and their multi-token
    # prediction head (named, not modelled).
    "mla": ("attn", "mla"), "latent": ("attn", "mla"), "multi head latent": ("attn", "mla"),
    "mtp": ("mtp", "yes"), "multi token prediction": ("mtp", "yes"),
    # Mamba-2 mixer layers of a hybrid model (heterosim.validation.hybrid): Nemotron-H, Nemotron 3
    "mamba": ("mixer", "mamba"), "mamba2": ("mixer", "mamba"), "ssm": ("mixer", "mamba"),
    "state space": ("mixer", "mamba"), "ssd": ("mixer", "mamba"),
    # GPT-OSS / Mistral / Gemma local attention and attention sinks (heterosim.validation.released)
    "sliding window": ("window", "yes"), "swa": ("window", "yes"), "local attention": ("window", "yes"),
    "sinks": ("sinks", "yes"), "attention sinks": ("sinks", "yes"), "sink": ("sinks", "yes"),
    "yarn": ("pos", "rope"),
}
# Words that name no feature (families, parts, connectives).
ARCH_FILLERS = frozenset((
    "gpt", "llama", "nemotron", "mistral", "qwen", "gemma", "falcon", "olmo", "style", "like", "based", "standard",
    "dense", "decoder", "only", "causal", "transformer", "architecture", "model", "mlp", "ffn", "pos", "position",
    "positional", "positions", "embedding", "embeddings", "attention", "pre", "post", "norm", "ln", "and", "with",
    "a", "the", "of", "in", "groups", "group", "heads", "head", "kv", "layers", "layer", "linear",
    # mixture-of-experts words: the counts beside them are read by the flag builder (flags._moe_flags)
    "moe", "mixture", "experts", "expert", "top", "routing", "router", "routed", "sparse", "mixtral", "shared",
    "deepseek", "kimi", "k2",
    # hybrid models: the words beside "Mamba" ("hybrid Mamba-Transformer", "selective state space model")
    "hybrid", "selective", "models", "interleaved",
    # GPT-OSS ("gpt-oss-120b"), and the words around local / full attention layers
    "oss", "alternating", "full", "global", "window"))
_PHRASES = sorted((w for w in ARCH_WORDS if " " in w), key=len, reverse=True)


def _arch_tokens(part: str) -> list[str]:
    # Sizes and versions name no feature: "8x7B", "70B", "Qwen3", "GPT-3", "Llama 3.1" ("llama3" ->
    # "llama"; digits alone are not words).
    t = re.sub(r"\b\d+x\d+(?:\.\d+)?[bm]\b|\b\d+(?:\.\d+)?[bm]\b", " ", part.lower())
    t = re.sub(r"\b(gpt|llama|qwen|gemma|falcon|olmo|mistral|mixtral|nemotron)\d+(?:\.\d+)?\b", r"\1", t)
    t = re.sub(r"\bv\d+(?:\.\d+)?\b", " ", t)  # "DeepSeek-V3"
    t = re.sub(r"\bnemotron[\s_-]*h\b", "nemotron mamba", t)  # "Nemotron-H": the hybrid Mamba family
    t = re.sub(r"[-_/=.+]", " ", t)
    for p in _PHRASES:
        t = re.sub(rf"\b{p}\b", p.replace(" ", "\0"), t)
    return [w.replace("\0", " ") for w in re.findall(r"[a-z][a-z0-9\0]*", t)]


def arch_features(text: str) -> tuple[dict[str, str], list[str]]:
    """(features, notes) of an architecture phrase such as "Llama (GQA, SwiGLU, RMSNorm, RoPE)".

    Words are read wherever they stand, punctuation and parentheses aside; a clause ending in
    "not specified" / "not stated" is skipped (its feature takes the default). A parenthesis with no
    architecture word in it is a remark ("(ffn=4h per README FLOP formula)") and is left out, said so.

    Raises:
        ConfigError: a word outside such a remark that the reader does not know, or two values for
            one feature ("GeLU ... SwiGLU").
    """
    t = re.sub(r"[^,;()]*not (?:specified|stated)", " ", text)
    feats: dict[str, str] = {}
    notes: list[str] = []
    parts = re.split(r"(\([^()]*\))", t)
    for part in parts:
        words = [w for w in _arch_tokens(part) if w not in ARCH_FILLERS]
        unknown = [w for w in words if w not in ARCH_WORDS]
        if part.startswith("(") and unknown and len(unknown) == len(words):
            notes.append(f"model arch remark {part!r:.80} names no architecture word: left out")
            continue
        if unknown:
            raise ConfigError(f"model arch {text!r}: unknown word {unknown[0]!r}; known words: "
                              f"{', '.join(sorted(ARCH_WORDS))} (or say '... not specified')")
        for w in words:
            f, value = ARCH_WORDS[w]
            if f in feats and feats[f] != value:
                raise ConfigError(f"model arch {text!r}: both {feats[f]!r} and {value!r} for {f}")
            feats[f] = value
    return feats, notes


# --------------------------------------------------------------------------------- precision
BF16_MIXED_YEAR = 2022
"""First year whose Megatron/NeMo "mixed precision" on an sm_80+ GPU means bf16: Megatron-LM's
``--bf16`` arrived in 2021 (its 2020-21 papers ran fp16 with loss scaling, SC'21 section 5), and
NeMo's and Megatron-LM's published GPT/Llama recipes from 2022 on set bf16."""


CURRENT_SCALING = re.compile(r"(?<![a-z])cs(?![a-z])|current[\s_-]*scal|tensor[\s_-]*wise")
"""An fp8 precision run with current (per-tensor, just-in-time) scaling: NVIDIA's "FP8-CS",
Megatron-core's ``--fp8-recipe tensorwise``, Transformer Engine's ``Float8CurrentScaling``."""

DELAYED_SCALING = re.compile(r"delayed|(?<![a-z])ds(?![a-z])")
"""An fp8 precision that names delayed scaling (TE's ``DelayedScaling``, NeMo's "fp8 ds")."""

MX_SCALING = re.compile(r"mxfp8|fp8[\s_(-]*mx(?![a-z])|mx[\s_-]*fp8")
"""fp8 with MX block scales (Blackwell's MXFP8: an e8m0 scale per 32 values, Megatron-core's
``--fp8-recipe mxfp8``, Megatron Bridge's fp8_mx)."""

BLOCKWISE_SCALING = re.compile(r"fp8[\s_(-]*sc(?![a-z])|sub[\s_-]*channel|block[\s_-]*wise")
"""fp8 with sub-channel block scales (an fp32 scale per 1 x 128 / 128 x 128 block, the DeepSeek-V3
scheme: Megatron-core's ``--fp8-recipe blockwise``, Megatron Bridge's fp8_sc)."""

FP4 = re.compile(r"(?<![a-z0-9])(?:nv|mx)?[\s_-]*fp4(?![0-9])")
"""A 4-bit floating-point run: NVFP4 (Transformer Engine's ``NVFP4BlockScaling``, Megatron-core's
``--fp4-format e2m1 --fp4-recipe nvfp4``, the one fp4 training recipe of TE and Megatron-core; a
bare "fp4" reads as it) or MXFP4 (not a training recipe there: refused)."""


_TYPE_SPELLINGS = (
    (re.compile(r"(?<![a-z0-9])b(?:float|f)[\s_-]*16(?![0-9])"), "bf16"),
    (re.compile(r"(?<![a-z0-9])(?:float|fp)[\s_-]*16(?![0-9])"), "fp16"),
    (re.compile(r"(?<![a-z0-9])(?:float|fp)[\s_-]*8(?![0-9])|8[\s_-]*bit[\s_-]*float"), "fp8"),
    (re.compile(r"(?<![a-z0-9])(?:float|fp)[\s_-]*4(?![0-9])|4[\s_-]*bit[\s_-]*float"), "fp4"),
)
"""Other spellings of the float types a precision text names, each read as the short name:
"bfloat16" / "BF-16" as bf16, "float16" as fp16, "Float8" (torchao's ``Float8Linear``, PyTorch's
``float8_e4m3fn``) / "FP 8" / "8-bit floating point" as fp8, "float4" as fp4."""


def _type_names(low: str) -> str:
    """``low`` with every spelling of :data:`_TYPE_SPELLINGS` replaced by its short name."""
    for pattern, name in _TYPE_SPELLINGS:
        low = pattern.sub(name, low)
    return low


def precision_flags(text: str, cc: int, year: int | None) -> tuple[list[str], str]:
    """(flags, note) for a precision field: fp16 / bf16 / fp8 named, else "mixed precision" by era.

    fp8 runs as Transformer Engine's hybrid recipe (e4m3 forward, e5m2 gradients) over bf16, with
    delayed scaling unless the text names current scaling (:data:`CURRENT_SCALING`). A text
    naming no 16-bit type reads as fp16 on GPUs without bf16 tensor cores (sm < 80) and for sources
    before :data:`BF16_MIXED_YEAR`, bf16 otherwise.
    """
    low = _type_names(text.lower())
    m = FP4.search(low)
    if m:
        if "mx" in m.group(0):
            raise ConfigError(f"precision {text!r}: MXFP4 training is not supported (Transformer Engine and "
                              "Megatron-core train fp4 as NVFP4 only); NVFP4, fp8 and bf16 are")
        if 0 < cc < 100:
            raise ConfigError(f"precision {text!r}: fp4 GEMMs need Blackwell (sm_100 or later); this GPU is "
                              f"sm_{cc}")
        return (["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"],
                "fp4 GEMMs (NVFP4: e2m1, e4m3 scales per 16 elements, current per-tensor scaling), bf16 elsewhere")
    found = [(low.find(w), w) for w in ("fp16", "bf16", "fp8") if w in low]
    if any(w == "fp8" for _, w in found):
        if MX_SCALING.search(low):
            if 0 < cc < 100:
                raise ConfigError(f"precision {text!r}: MXFP8 needs Blackwell (sm_100 or later); this GPU is sm_{cc}")
            return (["--bf16", "--fp8-recipe", "mxfp8", "--fp8-format", "e4m3"],
                    "fp8 GEMMs (MXFP8: e4m3, an e8m0 scale per 32 values), bf16 elsewhere")
        if BLOCKWISE_SCALING.search(low):
            return (["--bf16", "--fp8-recipe", "blockwise", "--fp8-format", "hybrid"],
                    "fp8 GEMMs (hybrid e4m3/e5m2, blockwise: an fp32 scale per 128-value block), bf16 elsewhere")
        if CURRENT_SCALING.search(low):
            return (["--bf16", "--fp8-recipe", "tensorwise", "--fp8-format", "hybrid"],
                    "fp8 GEMMs (hybrid e4m3/e5m2, current scaling), bf16 elsewhere")
        return ["--bf16", "--fp8-format", "hybrid"], "fp8 GEMMs (hybrid e4m3/e5m2), bf16 elsewhere"
    if found:
        first = min(found)[1]
        return [f"--{first}"], f"precision {first}" + (" (first of several named)" if len(found) > 1 else "")
    if not re.search(r"\bmixed\b|\bhalf\b|\bamp\b", low):
        raise ConfigError(f"precision {text!r}: name fp16, bf16 or fp8 (or 'mixed precision')")
    if 0 < cc < 80:
        return ["--fp16"], f"precision {text!r}: fp16 (sm_{cc} has no bf16 tensor cores)"
    if year is not None and year < BF16_MIXED_YEAR:
        return ["--fp16"], (f"precision {text!r}: fp16 (Megatron mixed precision in {year}; bf16 recipes "
                            f"from {BF16_MIXED_YEAR})")
    return ["--bf16"], (f"precision {text!r}: bf16 (mixed precision on sm_{cc} "
                        + (f"in {year}" if year else "of unknown year") + f"; bf16 recipes from {BF16_MIXED_YEAR})")
