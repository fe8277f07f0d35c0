"""Data parallelism and the batch of an end-to-end case: ``models/pretrain_gpt.py``'s gradient
reduction (PyTorch DDP, Megatron's local DDP or distributed optimizer, with the recipe's buckets and
overlap, or the case's own distributed-optimizer / ZeRO setting) and its micro- and global batch.
Each fill is appended to the case's notes, as in :mod:`heterosim.validation.flags`.
"""

from __future__ import annotations

from heterosim.errors import ConfigError

from .flags import Fields, fsdp_setting, zero_stage
from .phrases import batch_count, flag_word, is_unstated

__all__ = ["batch_flags", "TORCH_DDP_BUCKET_BYTES"]

TORCH_DDP_BUCKET_BYTES = 25 * 2**20
"""torch.nn.parallel.DistributedDataParallel's ``bucket_cap_mb=25`` (its default)."""

_GRAD_BYTES = {"bf16": 2, "fp32": 4}
_TOKEN_KEYS = ("tokens_per_batch", "global_batch_tokens", "batch_tokens")
"""Names a case may give its global batch in tokens by (read where ``batch.global`` is not stated)."""
_DIST_OPT_KEYS = ("distributed_optimizer", "use_distributed_optimizer", "dist_opt")
_GA_KEYS = ("ga", "gradient_accumulation", "gradient_accumulation_steps", "grad_accum", "grad_accum_steps",
            "accumulation_steps")
"""Names a case may give the gradient-accumulation steps by (the DGX Cloud tables' GA column)."""


def batch_flags(f: Fields, micro_batch_default: int, fp8: bool, bf16: bool, dp: int, seq_len: int) -> list[str]:
    """Data-parallel gradient reduction and batch flags (micro-batch: stated, else published, else
    ``micro_batch_default``; global batch: stated, in sequences or in tokens of ``seq_len``, else
    micro-batch x gradient-accumulation steps x ``dp``, the data-parallel size)."""
    mb = f.count("batch", "micro", required=False) if not is_unstated(f.case.batch.get("micro")) else None
    if mb is None:
        mb = f.recipe("micro_batch", "micro-batch")
    if mb is None:
        mb = micro_batch_default
        f.notes.append(f"micro-batch not stated: {mb} (Megatron-LM's --micro-batch-size has no default; 1 "
                       "gives the most micro-batches per pipeline)")
    flags = _ddp_flags(f, fp8, bf16)
    batch = f.case.batch
    ga_key = next((k for k in _GA_KEYS if k in batch and not is_unstated(batch[k])), None)
    ga = f.count("batch", ga_key) if ga_key else None
    gb = batch.get("global")
    tok_key = next((k for k in _TOKEN_KEYS if not is_unstated(batch.get(k))), None)
    if is_unstated(gb) and tok_key is not None:  # the batch given in tokens only
        gb = f"{batch[tok_key]} tokens"
    if is_unstated(gb) and ga is not None:
        gb = mb * ga * dp
        f.notes.append(f"batch.global not stated: {gb} = micro-batch {mb} x {ga} accumulation steps x data-parallel {dp}")
    try:
        gb, note = batch_count(gb, seq_len)
    except ConfigError as e:
        if "token count" in str(e):
            raise ConfigError(f"case {f.case.id}: {e}") from None
        raise ConfigError(f"case {f.case.id}: batch.global is {gb!r}; give an integer, or batch.ga (gradient "
                          "accumulation steps)") from None
    if note:
        f.notes.append(note)
    if ga is not None and gb != mb * ga * dp:
        f.notes.append(f"batch.global {gb} differs from micro-batch {mb} x {ga} accumulation steps x data-parallel "
                       f"{dp} = {mb * ga * dp}; the global batch is used")
    return flags + ["--micro-batch-size", str(mb), "--global-batch-size", str(gb)]


def _stated_ddp(f: Fields, kind: str | None) -> tuple[str | None, str]:
    """(data-parallel kind, where it comes from): the case's over its recipe's, the distributed
    optimizer on or off (``parallelism.distributed_optimizer``) or a ZeRO stage 1-2 (its sharded
    optimizer state and reduce-scattered gradients are Megatron's distributed optimizer; stage 3
    is fully sharded, :func:`fsdp_setting`; stage 0 plain DDP); turned off: said so."""
    par = f.case.parallelism
    key = next((k for k in par if str(k).lower() in _DIST_OPT_KEYS and not is_unstated(par[k])), None)
    on = flag_word(par[key], f"parallelism.{key}") if key else None
    zero = zero_stage(f.case)
    if on is None and zero is not None and zero[1] < 3:
        key, on = zero[0], zero[1] > 0
    if on is None or on == (kind == "distributed"):
        return kind, str(f.script)
    if not on:
        f.notes.append(f"data parallelism: no distributed optimizer (parallelism.{key})")
    return ("distributed" if on else None), f"parallelism.{key}"


def _ddp_flags(f: Fields, fp8: bool, bf16: bool) -> list[str]:
    pub = f.pub
    kind, script = _stated_ddp(f, pub.get("ddp"))
    if kind == "torch":
        # Bucket size in elements of 2-byte gradients: the runs that name torch DDP (SC'21, the
        # 2020 README) are fp16, whose gradients stay fp16.
        f.notes.append(f"data parallelism: PyTorch DDP ({script}): gradient all-reduce in 25 MB buckets "
                       "overlapped with the backward")
        return ["--overlap-grad-reduce", "--ddp-bucket-size", str(TORCH_DDP_BUCKET_BYTES // 2)]
    if kind == "local":
        f.notes.append(f"data parallelism: Megatron LocalDDP ({script}): one gradient all-reduce after the backward")
        return []
    if kind != "distributed":
        return []
    if fsdp_setting(f.case) is not None:
        # Megatron-FSDP reduces and gathers per layer itself (parallel_flags); the recipe still
        # says in which dtype gradients are reduced and whether fp8 weights are gathered in fp8.
        flags = ["--grad-reduce-in-bf16"] if pub.get("grad_sync_dtype") == "bf16" and bf16 else []
        if flags:
            f.notes.append(f"data parallelism: gradients reduced in bf16 (grad_sync_dtype, {script})")
        return flags + _fp8_param_flags(f, fp8)
    flags = ["--use-distributed-optimizer"]
    text = f"data parallelism: distributed optimizer ({script}): gradients reduce-scattered"
    if pub.get("overlap_grad_reduce"):
        flags.append("--overlap-grad-reduce")
        text += " in buckets overlapped with the backward"
        if "bucket_mb" in pub:
            dtype = pub.get("grad_sync_dtype", "bf16")
            elems = pub["bucket_mb"] * 2**20 // _GRAD_BYTES[dtype]
            flags += ["--ddp-bucket-size", str(elems)]
            text += f" ({pub['bucket_mb']} MiB of {dtype} = {elems:,} elements)"
    if pub.get("overlap_param_gather"):
        flags.append("--overlap-param-gather")
        text += ", parameters all-gathered overlapped with the next forward"
    if pub.get("grad_sync_dtype") == "bf16" and bf16:
        flags.append("--grad-reduce-in-bf16")
        text += "; gradients reduced in bf16 (grad_sync_dtype)"
    f.notes.append(text)
    return flags + _fp8_param_flags(f, fp8)


def _fp8_param_flags(f: Fields, fp8: bool) -> list[str]:
    """``--fp8-param-gather`` where the recipe keeps fp8 weights (``fp8_params``) in an fp8 run."""
    if not (fp8 and f.pub.get("fp8_params")):
        return []
    f.notes.append(f"fp8 parameters (fp8_params, {f.script}): the transformer layers' weights are fp8, "
                   "all-gathered at 1 byte per element (--fp8-param-gather)")
    return ["--fp8-param-gather"]
