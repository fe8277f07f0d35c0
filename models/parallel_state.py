"""Process groups of a Megatron-style job and this rank's place in them.

Rank order is Megatron's default ``tp-cp-ep-dp-pp`` (tp fastest)::

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

Expert parallelism folds into data parallelism as in Megatron-core's expert rank generator
(``tp-ep-dp-pp`` with expert tensor parallel ``etp`` = tp or 1, and no cp)::

    rank = etp_rank + etp * (ep_rank + ep * (expert_dp_rank + expert_dp * pp_rank))

so with etp = tp the ep group of a rank is ``ep`` consecutive tp-strided ranks inside its dp x cp
slab; with etp = 1 it is ``ep`` consecutive ranks of the stage (TP peers included).
:func:`initialize` creates every group with ``dist.new_group`` in the same order on every rank
(as ``megatron.core.parallel_state.initialize_model_parallel`` does), labels the ones this rank
belongs to for the capture, and returns a frozen :class:`ParallelState`.

Example::

    pstate = initialize(ParallelConfig(world_size=16, tp=2, pp=4), rank=5)
    pstate.tp_rank, pstate.pp_rank, pstate.pp_ranks   # (1, 1, (1, 5, 9, 13))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch.distributed as dist

from heterosim.errors import ConfigError
from heterosim.annotate import get_annotator
from heterosim.layout import parse_pipeline_layout
from models.config import ParallelConfig

__all__ = ["parse_pipeline_layout", "ParallelState", "initialize", "rank_coords", "split_stage_layers"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelState:
    """This rank's process groups, coordinates and pipeline neighbours."""

    rank: int
    world_size: int
    tp_size: int
    cp_size: int
    dp_size: int
    pp_size: int
    ep_size: int
    etp_size: int
    """Ranks each expert is split over: ``tp_size`` (their TP group) or 1 (whole experts)."""
    vpp_size: int | None
    tp_rank: int
    cp_rank: int
    dp_rank: int
    pp_rank: int
    ep_rank: int
    expert_dp_rank: int
    tp_group: Any
    cp_group: Any
    dp_group: Any
    dp_cp_group: Any
    pp_group: Any
    ep_group: Any
    expert_dp_group: Any
    """Ranks holding the same experts: expert params (``param.allreduce`` False) sync here."""
    embedding_group: Any
    """First and last stage of this pipeline (None when pp == 1 or this rank is in neither)."""
    amax_group: Any
    """The TP x DP x CP ranks of this stage (fp8 delayed scaling's amax all-reduce); None unless
    ``ParallelConfig.amax_reduction_group``."""
    tp_ranks: tuple[int, ...]
    cp_ranks: tuple[int, ...]
    dp_ranks: tuple[int, ...]
    ep_ranks: tuple[int, ...]
    pp_ranks: tuple[int, ...]
    """Global ranks of this rank's pipeline, stage 0 first."""
    sequence_parallel: bool
    cp_comm_type: str
    async_tp_allreduce: bool = True
    """See :attr:`models.config.ParallelConfig.async_tp_allreduce`."""
    tp_comm_overlap: bool = False
    """See :attr:`models.config.ParallelConfig.tp_comm_overlap`."""
    tp_comm_sm_margin: tuple[tuple[str, int], ...] = ()
    """See :attr:`models.config.ParallelConfig.tp_comm_sm_margin` (empty without the overlap)."""
    tp_comm_aggregate: tuple[str, ...] = ()
    """See :attr:`models.config.ParallelConfig.tp_comm_aggregate` (empty without the overlap)."""
    tp_comm_fp8_buf: tuple[str, ...] = ()
    """See :attr:`models.config.ParallelConfig.tp_comm_fp8_buf` (empty without the overlap)."""
    ep_domain: int = 0
    """EP ranks per NVLink domain of the flex dispatcher (0: the all-to-all dispatcher)."""
    ep_domain_group: Any = None
    """This rank's NVLink domain of its EP group (consecutive EP ranks; flex dispatcher only)."""
    ep_rail_group: Any = None
    """The EP ranks of this rank's index in every domain of its EP group (flex dispatcher only)."""

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def next_rank(self) -> int:
        """Global rank of the next pipeline stage (wraps around, as Megatron's does)."""
        return self.pp_ranks[(self.pp_rank + 1) % self.pp_size]

    @property
    def prev_rank(self) -> int:
        """Global rank of the previous pipeline stage (wraps around)."""
        return self.pp_ranks[(self.pp_rank - 1) % self.pp_size]

    def stage_layers(
        self,
        num_layers: int,
        first: int | None = None,
        last: int | None = None,
        explicit: Sequence[int] | None = None,
        vpp: int | None = None,
        embed_slot: bool = False,
        loss_slot: bool = False,
        virtual: Sequence[int] | None = None,
    ) -> list[list[range]]:
        """Global layer indices per pipeline stage per model chunk; see :func:`split_stage_layers`."""
        return split_stage_layers(
            num_layers, self.pp_size, first=first, last=last, explicit=explicit,
            vpp=vpp if vpp is not None else self.vpp_size, embed_slot=embed_slot, loss_slot=loss_slot,
            virtual=virtual,
        )


def rank_coords(pcfg: ParallelConfig, rank: int) -> dict[str, int]:
    """(tp, cp, dp, pp) and expert (ep, expert_dp) coordinates of ``rank``."""
    tp, cp, dp, pp, ep, etp = pcfg.tp, pcfg.cp, pcfg.dp, pcfg.pp, pcfg.ep, pcfg.expert_tp
    tp_rank = rank % tp
    cp_rank = rank // tp % cp
    dp_rank = rank // (tp * cp) % dp
    pp_rank = rank // (tp * cp * dp)
    ep_rank = rank // etp % ep
    expert_dp_rank = rank // (etp * ep) % (tp * dp * cp // (etp * ep))
    return {"tp": tp_rank, "cp": cp_rank, "dp": dp_rank, "pp": pp_rank,
            "ep": ep_rank, "expert_dp": expert_dp_rank}


def split_stage_layers(
    num_layers: int,
    pp: int,
    *,
    first: int | None = None,
    last: int | None = None,
    explicit: Sequence[int] | None = None,
    vpp: int | None = None,
    embed_slot: bool = False,
    loss_slot: bool = False,
    virtual: Sequence[int] | None = None,
) -> list[list[range]]:
    """Split ``num_layers`` over ``pp`` stages and ``vpp`` chunks per stage.

    ``virtual`` gives the layer count of every virtual stage in the order layers flow through them
    (chunk 0 of stages 0..pp-1, then chunk 1, ...), as Megatron-core's
    ``--pipeline-model-parallel-layout`` does (:func:`parse_pipeline_layout`); a virtual stage may
    hold no layer (DeepSeek-V3's last one: the MTP layer and the loss).

    ``explicit`` gives the layer count of every stage; ``first`` / ``last`` are Megatron's
    ``--decoder-first/last-pipeline-num-layers`` (the other stages share the rest evenly).
    ``embed_slot`` / ``loss_slot`` are Megatron-Core's ``--account-for-embedding-in-pipeline-split``
    / ``--account-for-loss-in-pipeline-split``: the input embedding (the loss) takes the place of one
    layer in the first chunk of the first stage (the last chunk of the last stage), so 126 layers
    split over pp 8 x vpp 8 as 128 slots of 2 (``get_num_layers_to_build``).
    Layers are numbered in the order the interleaved schedule visits virtual stages: chunk 0 of
    stages 0..pp-1, then chunk 1 of every stage, ... (Megatron's ``get_transformer_layer_offset``).
    """
    chunks = vpp or 1
    if virtual is not None:
        return _split_virtual(num_layers, pp, chunks, virtual)
    slots = [int(embed_slot and s == 0) + int(loss_slot and s == pp - 1) for s in range(pp)]
    if (embed_slot or loss_slot) and (first is not None or last is not None):
        raise ConfigError("--account-for-embedding/loss-in-pipeline-split cannot be combined with "
                          "--decoder-first/last-pipeline-num-layers; give one of them")
    if explicit is not None:
        counts = [int(c) for c in explicit]
        if len(counts) != pp:
            raise ConfigError(f"explicit stage layers {tuple(counts)} has {len(counts)} entries; "
                              f"give one count per pipeline stage (pp = {pp})")
        if sum(counts) != num_layers:
            raise ConfigError(f"explicit stage layers {tuple(counts)} sum to {sum(counts)}, "
                              f"but --num-layers is {num_layers}; make them add up")
    else:
        fixed = {}
        if first is not None:
            fixed[0] = first
        if last is not None:
            fixed[pp - 1] = last
        if pp == 1 and fixed:
            raise ConfigError("--decoder-first/last-pipeline-num-layers need pipeline parallel size > 1")
        rest = num_layers + sum(slots) - sum(fixed.values())
        middle = pp - len(fixed)
        if rest < 0 or (middle == 0 and rest != 0) or (middle and rest % middle):
            raise ConfigError(
                f"{num_layers} layers do not split over {pp} pipeline stages with first={first}, "
                f"last={last}: the remaining {rest} layers must divide evenly over {middle} stages"
            )
        counts = [fixed.get(s, rest // middle if middle else 0) - slots[s] for s in range(pp)]
    if any(c < 0 for c in counts):
        raise ConfigError(f"stage layer counts {tuple(counts)} must be >= 0")
    for s, c in enumerate(counts):
        if (c + slots[s]) % chunks:
            raise ConfigError(f"stage {s} has {c} layers, not divisible by the {chunks} virtual "
                              f"pipeline chunks; adjust --num-layers-per-virtual-pipeline-stage")
    out: list[list[range]] = [[] for _ in range(pp)]
    start = 0
    for c in range(chunks):
        for s in range(pp):
            n = (counts[s] + slots[s]) // chunks
            n -= int(embed_slot and s == 0 and c == 0) + int(loss_slot and s == pp - 1 and c == chunks - 1)
            out[s].append(range(start, start + n))
            start += n
    return out


def _split_virtual(num_layers: int, pp: int, chunks: int, virtual: Sequence[int]) -> list[list[range]]:
    counts = [int(c) for c in virtual]
    if len(counts) != pp * chunks or any(c < 0 for c in counts) or sum(counts) != num_layers:
        raise ConfigError(f"virtual stage layers {tuple(counts)}: need pp x vpp = {pp * chunks} counts >= 0 "
                          f"adding up to --num-layers {num_layers}")
    out: list[list[range]] = [[] for _ in range(pp)]
    start = 0
    for v, n in enumerate(counts):
        out[v % pp].append(range(start, start + n))
        start += n
    return out


def _new_group(ranks: list[int], me: int, dim: str) -> Any:
    """``dist.new_group`` on every rank; label it when ``me`` is a member."""
    group = dist.new_group(ranks)
    if me in ranks:
        get_annotator().label_group(group, dim)
        return group
    return None


def initialize(pcfg: ParallelConfig, rank: int) -> ParallelState:
    """Create all process groups (the same calls on every rank) and return this rank's view.

    ``torch.distributed`` must be initialized with ``world_size == pcfg.world_size``.
    """
    pcfg.check()
    if not dist.is_initialized():
        raise ConfigError("torch.distributed is not initialized; call "
                          "dist.init_process_group(...) before models.parallel_state.initialize")
    if dist.get_world_size() != pcfg.world_size:
        raise ConfigError(f"torch.distributed world size {dist.get_world_size()} != configured "
                          f"world size {pcfg.world_size}; pass the job's real world size")
    if not 0 <= rank < pcfg.world_size:
        raise ConfigError(f"rank {rank} outside world size {pcfg.world_size}")
    tp, cp, dp, pp, ep, etp = pcfg.tp, pcfg.cp, pcfg.dp, pcfg.pp, pcfg.ep, pcfg.expert_tp
    W = pcfg.world_size
    edp = tp * dp * cp // (etp * ep)
    if (tp * dp * cp) % (etp * ep):
        raise ConfigError(f"expert-model-parallel-size {ep} must divide dp*cp = {dp * cp}")

    def g(t: int, c: int, d: int, p: int) -> int:
        return t + tp * (c + cp * (d + dp * p))

    mine: dict[str, tuple[Any, tuple[int, ...]]] = {}

    def make(name: str, dim: str, groups: list[list[int]]) -> None:
        for ranks in groups:
            group = _new_group(ranks, rank, dim)
            if group is not None:
                mine[name] = (group, tuple(ranks))

    # Megatron creates dp (with and without cp), cp, tp, pp + embedding, then expert groups.
    make("dp", "dp", [[g(t, c, d, p) for d in range(dp)]
                      for p in range(pp) for c in range(cp) for t in range(tp)])
    make("dp_cp", "dp", [[g(t, c, d, p) for d in range(dp) for c in range(cp)]
                         for p in range(pp) for t in range(tp)])
    make("cp", "cp", [[g(t, c, d, p) for c in range(cp)]
                      for p in range(pp) for d in range(dp) for t in range(tp)])
    make("tp", "tp", [[g(t, c, d, p) for t in range(tp)]
                      for p in range(pp) for d in range(dp) for c in range(cp)])
    pipelines = [[g(t, c, d, p) for p in range(pp)]
                 for d in range(dp) for c in range(cp) for t in range(tp)]
    make("pp", "pp", pipelines)
    if pp > 1:
        # Tied word-embedding gradients are all-reduced between the first and last stage.
        make("embedding", "pp", [[pl[0], pl[-1]] for pl in pipelines])

    def eg(t: int, e: int, d: int, p: int) -> int:
        return t + etp * (e + ep * (d + edp * p))

    ep_groups = [[eg(t, e, d, p) for e in range(ep)] for p in range(pp) for d in range(edp) for t in range(etp)]
    make("ep", "ep", ep_groups)
    make("expert_dp", "dp", [[eg(t, e, d, p) for d in range(edp)]
                             for p in range(pp) for e in range(ep) for t in range(etp)])
    if pcfg.amax_reduction_group:
        # Megatron-core's _TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP (the amax reduction group), made
        # last here so that every other group keeps the number it has in runs without it.
        make("amax", "dp", [[g(t, c, d, p) for d in range(dp) for c in range(cp) for t in range(tp)]
                            for p in range(pp)])
    dom = min(pcfg.ep_nvl_domain or 0, ep)
    if dom:  # the flex dispatcher's two stages, made last so that the other groups keep their numbers
        make("ep_domain", "ep", [ranks[n:n + dom] for ranks in ep_groups for n in range(0, ep, dom)])
        make("ep_rail", "ep", [ranks[i::dom] for ranks in ep_groups for i in range(dom)])
    assert all(k in mine for k in ("dp", "dp_cp", "cp", "tp", "pp", "ep", "expert_dp")), W

    co = rank_coords(pcfg, rank)
    ub = pcfg.tp_comm_overlap and pcfg.sequence_parallel and tp > 1  # TE's userbuffer overlap runs
    return ParallelState(
        rank=rank, world_size=W, tp_size=tp, cp_size=cp, dp_size=dp, pp_size=pp, ep_size=ep, etp_size=etp,
        vpp_size=pcfg.vpp, tp_rank=co["tp"], cp_rank=co["cp"], dp_rank=co["dp"],
        pp_rank=co["pp"], ep_rank=co["ep"], expert_dp_rank=co["expert_dp"],
        tp_group=mine["tp"][0], cp_group=mine["cp"][0], dp_group=mine["dp"][0],
        dp_cp_group=mine["dp_cp"][0], pp_group=mine["pp"][0], ep_group=mine["ep"][0],
        expert_dp_group=mine["expert_dp"][0],
        embedding_group=mine["embedding"][0] if "embedding" in mine else None,
        amax_group=mine["amax"][0] if "amax" in mine else None,
        tp_ranks=mine["tp"][1], cp_ranks=mine["cp"][1], dp_ranks=mine["dp"][1],
        ep_ranks=mine["ep"][1], pp_ranks=mine["pp"][1],
        sequence_parallel=pcfg.sequence_parallel and tp > 1, cp_comm_type=pcfg.cp_comm_type,
        async_tp_allreduce=pcfg.async_tp_allreduce,
        tp_comm_overlap=ub, tp_comm_aggregate=pcfg.tp_comm_aggregate if ub else (),
        tp_comm_sm_margin=pcfg.tp_comm_sm_margin if ub else (), tp_comm_fp8_buf=pcfg.tp_comm_fp8_buf if ub else (),
        ep_domain=dom, ep_domain_group=mine["ep_domain"][0] if dom else None,
        ep_rail_group=mine["ep_rail"][0] if dom else None,
    )
