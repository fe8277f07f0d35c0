"""Megatron-style GPT/LLaMA pretraining script: the workload HeteroSim captures.

Takes Megatron-LM's flag names (see :mod:`models.args`) and torchrun's environment (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Under ``python -m capture`` it runs as one rank of the
full job in a fake world; on its own it trains for real (gloo, CPU), e.g. as a sanity check::

    RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 python models/pretrain_gpt.py --preset tiny

One iteration: zero the gradient buffers, run the schedule (no pipelining, 1F1B or interleaved)
over ``global_batch / (micro_batch x dp)`` micro-batches with DP gradient sync, then the
fp32-master Adam step (and the parameter all-gather of the distributed optimizer).

Data are synthetic: each sample is an arithmetic run of token ids ``(start + t) % V`` with a
random start, labels the next token, so the loss of a real run visibly falls. The starts of a
whole global batch come from a generator seeded by (seed, iteration), and data-parallel rank r
takes samples [r * gbs/dp, (r+1) * gbs/dp) in micro-batch order (Megatron's data layout), so
every pipeline stage sees the same samples and any dp/mbs split trains on the same batch.
Loss lines (averaged over data-parallel ranks, as Megatron logs them) are printed only when
nothing is capturing (no data-dependent ops under capture).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

import torch
import torch.distributed as dist

from heterosim.errors import ConfigError
from models import parallel_state
from heterosim.annotate import get_annotator
from models.args import RunConfig, parse_args
from models.chunks import chunk_classes
from models.distributed import DataParallel, ModelGradSync
from models.ep_overlap import ChunkPlan
from models.fsdp import FullyShardedDataParallel
from models.gpt import GPTModel
from models.layers import fp8 as te_fp8
from models.optimizer import MixedPrecisionAdam, model_parallel_group
from models.p2p import PipelineComm
from models.schedules import forward_backward
from models.transformer import TransformerLayer, torch_dtype

__all__ = ["main", "synthetic_batch", "train"]


def synthetic_batch(cfg: RunConfig, iteration: int, mb: int, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token labels, both [b, s] int64: micro-batch ``mb`` of data-parallel
    rank ``dp_rank`` in ``iteration`` (the same on every pipeline stage and for any layout)."""
    gen = torch.Generator().manual_seed((cfg.seed * 1_000_003 + iteration) % (2**63 - 1))
    b, s, v = cfg.train.micro_batch_size, cfg.model.seq_length, cfg.model.vocab_size
    gbs = cfg.train.global_batch_size
    first = dp_rank * (gbs // cfg.parallel.dp) + mb * b
    start = torch.randint(0, v, (gbs, 1), generator=gen)[first:first + b]
    ids = (start + torch.arange(s)) % v
    return ids, (ids + 1) % v


def _init_distributed(world_size: int, rank: int) -> bool:
    """Initialize torch.distributed (gloo); returns True if this call did it."""
    if dist.is_initialized():
        return False
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    elif world_size == 1:
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    else:
        raise ConfigError(f"WORLD_SIZE={world_size} needs MASTER_ADDR and MASTER_PORT (run under "
                          f"torchrun or python -m capture)")
    return True


def _data_parallel(cfg: RunConfig, ps: "parallel_state.ParallelState", chunks: list[GPTModel],
                   shared: list[torch.nn.Parameter]) -> list[DataParallel]:
    """One gradient-sync object per model chunk: Megatron-FSDP's units, or Megatron DDP's buckets."""
    pcfg = cfg.parallel
    grad_dtype = torch.float32 if cfg.optim.grad_reduce_in_fp32 else None
    if pcfg.use_megatron_fsdp:
        return [FullyShardedDataParallel(m, dp_group=ps.dp_cp_group, unit_types=(TransformerLayer,),
                                         grad_dtype=grad_dtype, fp8_param_gather=pcfg.fp8_param_gather)
                for m in chunks]
    return [DataParallel(m, dp_group=ps.dp_cp_group, expert_dp_group=ps.expert_dp_group,
                         overlap_grad_reduce=pcfg.overlap_grad_reduce,
                         use_distributed_optimizer=pcfg.use_distributed_optimizer,
                         overlap_param_gather=pcfg.overlap_param_gather,
                         fp8_param_gather=pcfg.fp8_param_gather,
                         bucket_size=cfg.optim.bucket_size,
                         # Megatron buckets only chunk 0 of the first stage (DistributedDataParallel:
                         # "DP communication on these stages is not on the critical path").
                         disable_bucketing=c > 0 or ps.pp_rank > 0,
                         separate_params=shared if pcfg.use_distributed_optimizer else (),
                         grad_dtype=grad_dtype)
            for c, m in enumerate(chunks)]


def train(cfg: RunConfig, rank: int) -> list[float]:
    """Build this rank's model chunks and run ``cfg.train.train_iters`` iterations.

    Returns the mean loss of each iteration on the rank that holds the last pipeline stage and
    is not capturing (empty elsewhere).
    """
    ann = get_annotator()
    pcfg, mcfg, tcfg = cfg.parallel, cfg.model, cfg.train
    ann.declare(layout=cfg.layout(), model=cfg.model_info())
    torch.manual_seed(cfg.seed)
    ps = parallel_state.initialize(pcfg, rank)
    stats_group = dist.group.WORLD if pcfg.use_distributed_optimizer or pcfg.use_megatron_fsdp \
        else model_parallel_group(pcfg, rank)
    vpp = pcfg.vpp or 1
    layers = ps.stage_layers(mcfg.num_layers, explicit=cfg.stage_layers, vpp=vpp, embed_slot=pcfg.embed_slot,
                             loss_slot=pcfg.loss_slot, virtual=pcfg.virtual_stage_layers)[ps.pp_rank]
    # Megatron seeds each TP rank differently for the split weights (model_parallel_cuda_manual_seed).
    torch.manual_seed(cfg.seed + 2718 + ps.tp_rank + 100 * ps.pp_rank)
    chunks = [GPTModel(mcfg, pcfg, tcfg, ps, layers=layers[c], chunk=c,
                       pre_process=ps.is_first_stage and c == 0,
                       post_process=ps.is_last_stage and c == vpp - 1,
                       replicated_seed=cfg.seed + 100 * ps.pp_rank) for c in range(vpp)]
    # From here the default generator is the same on every TP rank (Megatron's _set_random_seed:
    # seed + 100 * pp_rank), so dropout outside the TP-split regions masks the replicated
    # activations identically and TP ranks stay in step.
    torch.manual_seed(cfg.seed + 100 * ps.pp_rank)
    if tcfg.fp8 and tcfg.fp8_recipe == "delayed":  # each chunk is one fp8_autocast region
        scaling = te_fp8.DelayedScaling.for_stage(chunks, ps.amax_group)
        for m in chunks:
            m.decoder.fp8_scaling = scaling
    shared = [p for m in chunks for p in m.shared_embedding_params()]
    sharded = pcfg.use_distributed_optimizer or pcfg.use_megatron_fsdp
    dps = _data_parallel(cfg, ps, chunks, shared)
    # Megatron-core all-reduces over TP the grads of sequence-parallel norms and of QK norms
    # (finalize_model_grads: "config.sequence_parallel or config.qk_layernorm").
    gs = ModelGradSync(dps, tp_group=ps.tp_group, sequence_parallel=ps.sequence_parallel or cfg.model.qk_layernorm,
                       embedding_group=ps.embedding_group, embedding_params=shared,
                       align_grad_reduce=cfg.optim.align_grad_reduce,
                       align_param_gather=cfg.optim.align_param_gather)
    o = cfg.optim
    opt = MixedPrecisionAdam(
        gs, lr=o.lr, weight_decay=o.weight_decay, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_eps,
        clip_grad=o.clip_grad, grad_stats_group=stats_group,
        use_distributed_optimizer=sharded, tp_rank=ps.tp_rank,
        # The last stage's tied output weight duplicates the first stage's embedding gradient.
        exclude_from_norm=[p for m in chunks if not m.pre_process for p in m.shared_embedding_params()],
        loss_scale=o.loss_scale)
    comm = None
    if ps.pp_size > 1:
        comm = PipelineComm(group=ps.pp_group, rank=ps.pp_rank, size=ps.pp_size,
                            shape=chunks[0].hidden_shape(tcfg.micro_batch_size),
                            dtype=torch_dtype(tcfg.params_dtype),
                            scatter_gather_group=ps.tp_group if pcfg.scatter_gather_p2p else None,
                            overlap=pcfg.overlap_p2p_comm)
    classes = chunk_classes(chunks)
    history: list[float] = []
    for it in range(tcfg.train_iters):
        ann.iteration(it)

        def step(chunk: int, mb: int, x: torch.Tensor | None) -> torch.Tensor:
            model = chunks[chunk]
            ids, labels = synthetic_batch(cfg, it, mb, ps.dp_rank)
            out = model(ids if model.pre_process else x, labels if model.post_process else None)
            if model.post_process and o.loss_scale is not None:
                out = out * o.loss_scale  # static fp16 loss scaling; the optimizer unscales
            return out

        def plan(chunk: int, mb: int, x: torch.Tensor | None, *, finish: Any, stream: Any) -> ChunkPlan:
            model = chunks[chunk]
            ids, labels = synthetic_batch(cfg, it, mb, ps.dp_rank)
            scaled = finish if not (model.post_process and o.loss_scale) else (lambda y: finish(y * o.loss_scale))
            return ChunkPlan(model, ids if model.pre_process else x, labels if model.post_process else None,
                             finish=scaled, stream=stream)

        with ann.scope(phase="grad_sync"):
            gs.zero_grad()
            opt.zero_grad()
        with te_fp8.recipe(tcfg.fp8_recipe):  # TE's fp8_autocast(fp8_recipe=...) around the step
            losses = forward_backward(step, num_microbatches=cfg.num_microbatches, num_chunks=vpp,
                                      comm=comm, grad_sync=gs, chunk_classes=classes,
                                      plan_step=plan if tcfg.overlap_moe_expert_parallel_comm else None)
        opt.step()
        if losses and not ann.active:
            total = torch.stack([l.detach().float() for l in losses]).sum() / (o.loss_scale or 1.0)
            if ps.dp_size * ps.cp_size > 1:
                dist.all_reduce(total, group=ps.dp_cp_group)
                total /= ps.dp_size * ps.cp_size
            history.append(float(total))
    return history


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: parse flags, train, print one loss line per iteration (rank with the last stage)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    try:
        cfg = parse_args(argv, world_size)
        owned = _init_distributed(world_size, rank)
        history = train(cfg, rank)
    except ConfigError as e:
        print(f"pretrain_gpt.py: error: {e}", file=sys.stderr)
        return 2
    if not get_annotator().active:
        for i, loss in enumerate(history):
            print(f"iteration {i + 1:>4}/{cfg.train.train_iters} | rank {rank} | lm loss {loss:.4f}")
        if owned:
            # Every rank reaches this point before any tears its gloo pairs down: a rank that
            # closes its sockets while a peer is still finishing a collective can make the peer's
            # transport thread call std::terminate ("terminate called without an active exception").
            dist.barrier()
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
