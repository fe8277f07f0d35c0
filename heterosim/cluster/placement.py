"""Placement: which GPU of the cluster runs which rank of the job.

Default: rank ``r`` on GPU ``r`` (GPUs are numbered node by node, node groups in the order the
cluster spec lists them). A user mapping places heterogeneous work explicitly, in one of three
forms (YAML, alone in a file with ``schema_version``, or as the ``placement:`` section of a
cluster spec)::

    placement: {by_stage: {0: a100, 1: a100, 2: h100, 3: h100}}   # pipeline stage -> node group
    placement: {by_stage: {"0-1": a100, "2-3": h100}}              # same, with ranges
    placement: {by_group: {h100: "0-15", a100: "16-31"}}           # node group -> ranks
    placement: {ranks: [8, 9, 10, 11, 0, 1, 2, 3]}                 # rank -> GPU, every rank

The pipeline stage of a rank follows Megatron's rank order tp-cp-ep-dp-pp (pp slowest):
``stage = rank // (world // pp)``, with ``pp`` from the trace layout (``Trace.layout["pp"]``) or,
without a layout, the number of stages ``by_stage`` lists. Inside a node group, the ranks given
to it take its GPUs in GPU order, so consecutive ranks (a TP group) stay on one node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from heterosim.errors import ConfigError

__all__ = ["PLACEMENT_SCHEMA_VERSION", "Placement", "placement_for", "parse_ranges", "stage_of"]

PLACEMENT_SCHEMA_VERSION = 1
_FORMS = ("by_stage", "by_group", "ranks")


def stage_of(rank: int, world: int, pp: int) -> int:
    """Pipeline stage of ``rank`` in Megatron's tp-cp-ep-dp-pp order."""
    return rank // (world // pp)


MAX_RANGE = 1 << 20
"""The most GPUs or ranks one range may name (the largest world HeteroSim simulates)."""


def parse_ranges(v: Any, where: str) -> tuple[int, ...]:
    """``3``, ``"0-3"``, ``"0-3,8"`` or a list of those -> sorted tuple of ints (inclusive)."""
    items = v if isinstance(v, (list, tuple)) else [v]
    out: list[int] = []
    for it in items:
        if isinstance(it, bool):
            raise ConfigError(f"{where}: expected ints or 'a-b' ranges, got {it!r}")
        if isinstance(it, int):
            out.append(it)
            continue
        for part in str(it).split(","):
            lo, sep, hi = part.strip().partition("-")
            try:
                a = int(lo)
                b = int(hi) if sep else a
            except ValueError:
                raise ConfigError(f"{where}: cannot read {part!r}; write ints or 'a-b' ranges") from None
            if b < a:
                raise ConfigError(f"{where}: range {part!r} runs backwards")
            if a < 0 or b - a >= MAX_RANGE:  # checked before the range is built
                raise ConfigError(f"{where}: range {part!r} must lie in 0..{MAX_RANGE - 1}")
            out.extend(range(a, b + 1))
    return tuple(sorted(out))


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """A rank -> GPU mapping, explicit or symbolic (rank -> node group, resolved by the cluster).

    Exactly one of ``gpus`` and ``groups`` is set, or neither (identity: rank r on GPU r).
    """

    gpus: tuple[int, ...] | None = None
    """GPU of every rank."""
    groups: tuple[str, ...] | None = None
    """Node group of every rank; each group's ranks take its GPUs in order."""
    source: Mapping[str, Any] | None = None
    """The spec it was built from (for describe and round trips)."""

    @property
    def world(self) -> int | None:
        """Number of ranks it places (None for the identity placement)."""
        seq = self.gpus if self.gpus is not None else self.groups
        return None if seq is None else len(seq)

    def resolve(self, num_gpus: int, group_gpus: Mapping[str, Sequence[int]]) -> tuple[int, ...]:
        """The GPU of every rank on a cluster with ``num_gpus`` GPUs and these node groups.

        Raises:
            ConfigError: a GPU out of range or used twice, an unknown group, or a group given
                more ranks than it has GPUs.
        """
        if self.gpus is None and self.groups is None:
            return tuple(range(num_gpus))
        if self.gpus is not None:
            bad = [g for g in self.gpus if not 0 <= g < num_gpus]
            if bad:
                raise ConfigError(
                    f"placement: GPU {bad[0]} does not exist; the cluster has GPUs 0..{num_gpus - 1}"
                )
            seen: dict[int, int] = {}
            for r, g in enumerate(self.gpus):
                if g in seen:
                    raise ConfigError(f"placement: ranks {seen[g]} and {r} are both on GPU {g}; "
                                      "each GPU runs one rank")
                seen[g] = r
            return self.gpus
        assert self.groups is not None
        unknown = sorted(set(self.groups) - set(group_gpus))
        if unknown:
            raise ConfigError(f"placement: node group {unknown[0]!r} is not in the cluster; "
                              f"groups: {list(group_gpus)}")
        out = [0] * len(self.groups)
        for name, gpus in group_gpus.items():
            ranks = [r for r, g in enumerate(self.groups) if g == name]
            if len(ranks) > len(gpus):
                raise ConfigError(
                    f"placement: {len(ranks)} ranks ({_span(ranks)}) are placed on node group "
                    f"{name!r}, which has {len(gpus)} GPUs; move ranks to another group or add nodes"
                )
            for r, g in zip(ranks, gpus):
                out[r] = g
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        """The placement section it came from (``{}`` for the identity)."""
        if self.source is not None:
            return dict(self.source)
        if self.gpus is not None:
            return {"ranks": list(self.gpus)}
        return {}


def _span(ranks: Sequence[int]) -> str:
    return f"ranks {ranks[0]}..{ranks[-1]}" if len(ranks) > 1 else f"rank {ranks[0]}"


def _load_file(path: Path) -> Mapping[str, Any]:
    from heterosim.yamlfile import read_yaml

    raw = read_yaml(path, "placement file")
    if not isinstance(raw, Mapping) or "placement" not in raw:
        raise ConfigError(f"placement file {path}: expected 'schema_version: 1' and 'placement: {{...}}'")
    if raw.get("schema_version") != PLACEMENT_SCHEMA_VERSION:
        raise ConfigError(f"placement file {path}: schema_version {raw.get('schema_version')!r} is "
                          f"not supported; write schema_version: {PLACEMENT_SCHEMA_VERSION}")
    extra = sorted(set(raw) - {"schema_version", "placement"})
    if extra:
        raise ConfigError(f"placement file {path}: unknown key {extra[0]!r}; "
                          "valid: placement, schema_version")
    return raw["placement"]


def placement_for(layout: Mapping[str, Any] | None, world: int,
                  spec: "Placement | Mapping[str, Any] | str | os.PathLike | None") -> Placement:
    """Build the :class:`Placement` of a ``world``-rank job from a user ``spec``.

    Args:
        layout: the trace layout (``Trace.layout``); its ``pp`` fixes the stage of each rank for
            ``by_stage``. None or without ``pp``: pp is the number of stages ``by_stage`` lists.
        world: number of ranks.
        spec: None (identity), a :class:`Placement`, a dict (with or without the ``placement``
            key) or the path of a placement YAML file.

    Raises:
        ConfigError: naming the bad key, stage, group or rank and how to fix it.

    Example:
        >>> placement_for({"pp": 2}, 4, {"by_stage": {0: "h100", 1: "a100"}}).groups
        ('h100', 'h100', 'a100', 'a100')
    """
    if spec is None:
        return Placement()
    if isinstance(spec, Placement):
        if spec.world not in (None, world):
            raise ConfigError(f"placement covers {spec.world} ranks but the job has {world}")
        return spec
    if isinstance(spec, (str, os.PathLike)):
        spec = _load_file(Path(spec))
    if not isinstance(spec, Mapping):
        raise ConfigError(f"placement: expected a mapping with one of {list(_FORMS)}, got {spec!r}")
    if set(spec) == {"placement"} or set(spec) == {"placement", "schema_version"}:
        spec = spec["placement"]
    keys = sorted(spec)
    if len(keys) != 1 or keys[0] not in _FORMS:
        raise ConfigError(f"placement: give exactly one of {list(_FORMS)}, got keys {keys}")
    form, body = keys[0], spec[keys[0]]
    if form == "ranks":
        gpus = parse_ranges(body, "placement.ranks") if not isinstance(body, list) else tuple(
            int(g) for g in body)
        if len(gpus) != world:
            raise ConfigError(f"placement.ranks lists {len(gpus)} GPUs but the job has {world} ranks; "
                              "give one GPU per rank")
        return Placement(gpus=gpus, source=dict(spec))
    if not isinstance(body, Mapping) or not body:
        raise ConfigError(f"placement.{form}: expected a non-empty mapping, got {body!r}")
    groups: list[str | None] = [None] * world
    if form == "by_group":
        for name, ranks in body.items():
            for r in parse_ranges(ranks, f"placement.by_group.{name}"):
                if not 0 <= r < world:
                    raise ConfigError(f"placement.by_group.{name}: rank {r} is outside 0..{world - 1}")
                if groups[r] is not None:
                    raise ConfigError(f"placement.by_group: rank {r} is placed on both "
                                      f"{groups[r]!r} and {name!r}")
                groups[r] = str(name)
        missing = [r for r, g in enumerate(groups) if g is None]
        if missing:
            raise ConfigError(f"placement.by_group: rank {missing[0]} is placed on no node group "
                              f"({len(missing)} ranks unplaced); every rank needs one")
        return Placement(groups=tuple(groups), source=dict(spec))  # type: ignore[arg-type]
    stage_group: dict[int, str] = {}
    for key, name in body.items():
        for s in parse_ranges(key, "placement.by_stage"):
            if s in stage_group:
                raise ConfigError(f"placement.by_stage: stage {s} is listed twice")
            stage_group[s] = str(name)
    pp = int((layout or {}).get("pp") or 0) or len(stage_group)
    if sorted(stage_group) != list(range(pp)):
        missing = sorted(set(range(pp)) - set(stage_group))
        extra = sorted(set(stage_group) - set(range(pp)))
        what = f"stage {missing[0]} has no node group" if missing else f"stage {extra[0]} does not exist"
        raise ConfigError(f"placement.by_stage: {what}; the job has pp={pp} stages 0..{pp - 1}, "
                          "list each exactly once")
    if world % pp:
        raise ConfigError(f"placement.by_stage: world size {world} is not a multiple of pp={pp}")
    return Placement(groups=tuple(stage_group[stage_of(r, world, pp)] for r in range(world)),
                     source=dict(spec))
