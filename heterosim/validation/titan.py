"""A case whose source names torchtitan runs torchtitan's own trainer, not Megatron's.

torchtitan (PyTorch's reference trainer: FSDP2 over a DeviceMesh, TP, PP, CP, selective activation
checkpointing of its own policy, eager PyTorch or ``torch.compile``) is a different program from
Megatron-LM: its RMSNorm, SwiGLU and RoPE run as separate PyTorch ops unless compiled, its
"selective" checkpointing re-runs every other matmul (``op`` policy), FSDP gathers each layer's
parameters forward and backward. So :func:`titan_inputs` does not translate the case into
``models/pretrain_gpt.py`` flags: it gives the command line of ``python -m torchtitan.train``
(torchtitan 0.2.2, the version the ``titan`` extra installs) with the bundled config
``data/torchtitan_llama3.toml`` and the case's model flavor, sequence length, batch, parallel
degrees, checkpointing and compile, which ``replay validate`` captures unchanged
(``capture -m torchtitan.train``, ``docs/capture.md``, "torchtitan").

What it reads, each said with the case:

- ``model.name``: a Llama 3 / 3.1 / 3.x of 8B, 70B or 405B -> torchtitan's ``llama3`` flavor of that
  size (``torchtitan/models/llama3/__init__.py``); a stated shape must be that flavor's;
- ``model.seq_len``, ``batch.micro`` (torchtitan's local batch), ``batch.global`` (gradient
  accumulation where it exceeds local x data-parallel);
- ``parallelism``: ``tp``, ``pp``, ``cp``; ``dp`` the data-parallel degree and ``fsdp`` its sharding
  group (the rest replicated, HSDP); ``fsdp`` not stated: torchtitan's default, every data-parallel
  rank sharded; ``pipeline_schedule`` (1F1B, Interleaved 1F1B, GPipe, ...; default 1F1B);
  ``recompute`` full / selective / none (not stated: the config's selective, option ``op``);
- ``torch.compile`` named anywhere but negated ("no torch.compile") -> ``--compile.enable``;
  "AsyncTP" -> ``--parallelism.enable_async_tensor_parallel``;
- precision: bf16 (torchtitan's mixed precision: bf16 parameters, fp32 reductions); fp8 named
  ("Float8") adds torchao's ``Float8Linear`` (``--model.converters quantize.linear.float8``, dynamic
  tensorwise scaling, rowwise where the text says so; torchao is in the ``titan`` extra); other
  precisions (fp16, MXFP8, NVFP4) are refused as not supported.

:func:`write_assets` writes the tokenizer and dataset a capture reads (no download): a word-level
tokenizer and a small c4-layout corpus; token values do not matter to a capture, shapes do.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from heterosim.errors import ConfigError

from .cases import Case, CaseInputs, cluster_for, source_year
from .flags import fsdp_setting, parallel_sizes
from .released import RELEASED
from .phrases import DELAYED_SCALING, batch_count, count, is_unstated, positive_int, precision_flags, recompute_word

__all__ = ["MODULE", "CONFIG", "names_torchtitan", "titan_inputs", "write_assets", "asset_args"]

MODULE = "torchtitan.train"
CONFIG = Path(__file__).with_name("data") / "torchtitan_llama3.toml"
FLAVORS = {"8B": "llama 3.1 8b", "70B": "llama 3.1 70b", "405B": "llama 3.1 405b"}
"""torchtitan 0.2.2's Llama 3 flavors of a released size (``torchtitan/models/llama3/__init__.py``,
``llama3_args``) -> the released configuration they equal (:data:`heterosim.validation.released.RELEASED`:
layers, hidden, heads, KV heads, vocabulary 128,256). Not imported from torchtitan: importing it in
the process the capture forks from would bind its command-line default
(``ConfigManager.parse_args(args=sys.argv[1:])``) to ``replay validate``'s own arguments."""
SCHEDULES = {"interleaved zero bubble": "InterleavedZeroBubble", "zero bubble": "ZBVZeroBubble",
             "zbv": "ZBVZeroBubble", "interleaved": "Interleaved1F1B", "looped bfs": "LoopedBFS",
             "gpipe": "GPipe", "1f1b": "1F1B", "dualpipe": "DualPipeV"}
"""Pipeline-schedule words -> torchtitan's schedule names (``pipeline_parallel_schedule``); the
first that the text holds wins, so a phrase comes before the words it contains."""

VOCAB, SPECIAL, DOCUMENTS, WORDS_PER_DOCUMENT = 2048, ["<|begin_of_text|>", "<|end_of_text|>", "[UNK]"], 64, 600


def names_torchtitan(case: Case) -> bool:
    """Whether the case's source (title, url, software) or ``framework`` names torchtitan."""
    text = " ".join(str(v) for v in (*case.source.values(), case.parallelism.get("framework", "")))
    return "torchtitan" in text.lower()


def _named(text: str, pattern: str) -> bool:
    """Whether ``pattern`` occurs in ``text`` (lower case) other than right after no / without / not."""
    return any(not re.search(r"\b(?:no|without|not|w/o)\s*[(\"']?\s*$", text[:m.start()])
               for m in re.finditer(pattern, text))


def _flavor(case: Case, notes: list[str]) -> str:
    """torchtitan's Llama 3 flavor (8B, 70B, 405B) ``model.name`` names; a stated shape must be its."""
    name = str(case.model.get("name", ""))
    m = re.search(r"llama[\s_-]*3(?:\.\d+)?[\s_-]+(?:[a-z]+[\s_-]+)?(\d+)\s*b\b", name.lower())
    flavor = f"{m.group(1)}B" if m else ""
    if flavor not in FLAVORS:
        raise ConfigError(f"case {case.id}: torchtitan runs of {name or 'an unnamed model'!r} are not supported; "
                          f"torchtitan's Llama 3 flavors {', '.join(FLAVORS)} are (name one in model.name)")
    shape = RELEASED[FLAVORS[flavor]]
    for key in ("layers", "hidden", "heads"):
        want = shape[key]
        v = case.model.get(key)
        if v is not None and not is_unstated(v) and positive_int(v, f"model.{key}") != want:
            raise ConfigError(f"case {case.id}: model.{key} {v} is not torchtitan's Llama 3 {flavor} ({want}); "
                              "fix the field or the model name")
    notes.append(f"model: torchtitan's Llama 3 {flavor} (torchtitan 0.2.2 models/llama3: {shape['layers']} layers, "
                 f"hidden {shape['hidden']}, {shape['heads']} heads, {shape['kv_heads']} KV heads, "
                 f"vocabulary {shape['vocab']:,})")
    return flavor


def _parallel(case: Case, notes: list[str]) -> tuple[list[str], int, int]:
    """torchtitan's parallel-degree arguments, the world size and the data-parallel degree."""
    size = parallel_sizes(case)
    fsdp = fsdp_setting(case)
    dp = size["dp"] if "dp" in case.parallelism else (fsdp[1] or 1) if fsdp else 1
    shard = (fsdp[1] or dp) if fsdp else dp
    if dp % shard:
        raise ConfigError(f"case {case.id}: parallelism.dp {dp} is not a multiple of the FSDP group {shard}")
    if fsdp is None:
        notes.append(f"FSDP not stated: torchtitan's default, parameters sharded over all {dp} data-parallel ranks")
    elif dp > shard:
        notes.append(f"data parallelism {dp}: FSDP over {shard}, replicated {dp // shard} times (HSDP)")
    args = ["--parallelism.data_parallel_shard_degree", str(shard),
            "--parallelism.data_parallel_replicate_degree", str(dp // shard),
            "--parallelism.tensor_parallel_degree", str(size["tp"]),
            "--parallelism.pipeline_parallel_degree", str(size["pp"]),
            "--parallelism.context_parallel_degree", str(size["cp"])]
    if size["pp"] > 1:
        text = " ".join(str(case.parallelism.get(k, "")) for k in ("pipeline_schedule", "schedule", "pp_schedule"))
        low = re.sub(r"[\s_-]+", " ", text.lower())
        sched = next((v for k, v in SCHEDULES.items() if k in low), None)
        if sched is None:
            sched = "1F1B"
            notes.append("pipeline schedule not stated: 1F1B (torchtitan's default)")
        args += ["--parallelism.pipeline_parallel_schedule", sched]
    if size.get("ep", 1) > 1:
        raise ConfigError(f"case {case.id}: expert parallelism in a torchtitan Llama 3 run is not supported "
                          "(Llama 3 has no experts)")
    return args, dp * size["tp"] * size["pp"] * size["cp"], dp


def _precision(case: Case, cc: int, notes: list[str]) -> list[str]:
    """torchtitan's precision arguments: bf16 mixed precision, with Float8 linear layers where the
    case names fp8 (torchao's ``Float8Linear`` through the ``quantize.linear.float8`` converter:
    dynamic tensorwise scaling, or rowwise where the text says so)."""
    p_flags, _ = precision_flags(case.precision or "bf16", cc, source_year(case))
    base = "precision bf16 (torchtitan's mixed precision: bf16 parameters, fp32 gradient reduction)"
    if p_flags == ["--bf16"]:
        notes.append(base)
        return []
    recipe = p_flags[p_flags.index("--fp8-recipe") + 1] if "--fp8-recipe" in p_flags else "tensorwise"
    if "--fp8-format" not in p_flags or recipe != "tensorwise" or DELAYED_SCALING.search(case.precision.lower()):
        raise ConfigError(f"case {case.id}: precision {case.precision!r}: torchtitan runs of it are not supported; "
                          "bf16 and Float8 (dynamic tensorwise or rowwise scaling; torchao has no delayed scaling) are")
    if "rowwise" in case.precision.lower():
        recipe = "rowwise"
    notes.append(f"{base}; Float8 linear layers (torchao's Float8Linear, {recipe} dynamic scaling: "
                 "--model.converters quantize.linear.float8)")
    return ["--model.converters", "quantize.linear.float8", "--quantize.linear.float8.recipe_name", recipe]


def titan_inputs(case: Case) -> CaseInputs:
    """What a torchtitan case runs: ``python -m torchtitan.train`` arguments (:data:`MODULE`, without
    the asset paths, :func:`asset_args`), world size, cluster and what was assumed.

    Raises:
        ConfigError: the model is not a Llama 3 flavor, a field cannot be read, or the case asks for
            what this cannot run (fp16, MXFP8, expert parallelism): the message says "not supported".
    """
    notes: list[str] = [f"torchtitan named by the source: torchtitan's own trainer captured (torchtitan 0.2.2, "
                        f"{CONFIG.name})"]
    flavor = _flavor(case, notes)
    par_args, world, dp = _parallel(case, notes)
    seq = case.model.get("seq_len")
    if seq is None or is_unstated(seq):
        raise ConfigError(f"case {case.id}: model.seq_len not stated; torchtitan's configs differ by model, give it")
    seq, seq_note = count(seq, "model.seq_len", binary=True)
    if seq_note:
        notes.append(seq_note)
    micro = positive_int(case.batch.get("micro", 1), "batch.micro")
    gbs = case.batch.get("global")
    if gbs is None or is_unstated(gbs):
        gbs = micro * dp
    else:
        gbs, gbs_note = batch_count(gbs, seq)
        if gbs_note:
            notes.append(gbs_note)
    if "global" not in case.batch:
        notes.append(f"global batch not stated: local {micro} x {dp} data-parallel ranks = {gbs}")
    if gbs % (micro * dp):
        raise ConfigError(f"case {case.id}: batch.global {gbs} is not a multiple of local batch {micro} x "
                          f"data-parallel {dp}")
    cluster, gpu, hw_notes = cluster_for(case.hardware, world)
    from heterosim.cluster import get_gpu

    args = ["--job.config_file", str(CONFIG), "--model.flavor", flavor, "--training.seq_len", str(seq),
            "--training.local_batch_size", str(micro), "--training.global_batch_size", str(gbs), *par_args]
    args += _precision(case, get_gpu(gpu).compute_capability, notes)
    mode = recompute_word(case.parallelism.get("recompute"))
    if mode is None:
        notes.append("activation checkpointing not stated: selective, option op (torchtitan's Llama 3 configs)")
    else:
        args += ["--activation_checkpoint.mode", mode]
    text = " ".join([case.precision, case.notes, *(str(v) for v in case.parallelism.values())]).lower()
    if _named(text, r"\b(?:torch\.)?compiled?\b"):
        args.append("--compile.enable")
        notes.append("torch.compile named: --compile.enable (model and loss compiled; docs/capture.md)")
    if _named(text, r"async[\s_-]*tp|async[\s_-]*tensor[\s_-]*parallel"):
        args.append("--parallelism.enable_async_tensor_parallel")
        notes.append("AsyncTP named: --parallelism.enable_async_tensor_parallel")
    return CaseInputs(flags=tuple(args), world_size=world, cluster=cluster, gpu=gpu,
                      assumptions=tuple(notes + hw_notes), module=MODULE, global_batch=gbs, seq_len=seq)


def asset_args(root: str | os.PathLike) -> list[str]:
    """The asset and output arguments of a capture whose assets :func:`write_assets` wrote under ``root``."""
    root = Path(root)
    return ["--model.hf_assets_path", str(root / "tokenizer"), "--training.dataset_path", str(root / "c4_test"),
            "--job.dump_folder", str(root / "out")]


def write_assets(root: str | os.PathLike) -> Path:
    """Write, once, the tokenizer (``root/tokenizer``: word level, exactly 2,048 tokens, the specials
    ``<|begin_of_text|>``, ``<|end_of_text|>``, ``[UNK]`` and the words ``w0`` ... ``w2044``) and the
    ``c4_test`` layout corpus (``root/c4_test/train.json``: 64 JSON-lines documents of 600 such words)
    torchtitan reads; built in a temporary folder and renamed into place. Returns ``root``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    root = Path(root)
    parts = ("tokenizer", "c4_test")
    if all((root / p).is_dir() for p in parts):
        return root
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".assets.", dir=root))
    words = [f"w{i}" for i in range(VOCAB - len(SPECIAL))]
    tok = Tokenizer(WordLevel(vocab={t: i for i, t in enumerate([*SPECIAL, *words])}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    (tmp / "tokenizer").mkdir()
    tok.save(str(tmp / "tokenizer" / "tokenizer.json"))
    (tmp / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": SPECIAL[0], "eos_token": SPECIAL[1], "unk_token": SPECIAL[2]}))
    rng = random.Random(0)
    (tmp / "c4_test").mkdir()
    with open(tmp / "c4_test" / "train.json", "w") as f:
        for _ in range(DOCUMENTS):
            f.write(json.dumps({"text": " ".join(rng.choices(words, k=WORDS_PER_DOCUMENT))}) + "\n")
    for p in parts:
        if not (root / p).is_dir():
            try:
                os.rename(tmp / p, root / p)
            except OSError:  # another process put it there first
                pass
    shutil.rmtree(tmp, ignore_errors=True)
    return root
