"""Roles: which ranks run the same program, which rank to capture for each, and merging captures.

``--ranks auto`` captures rank 0 first. Its fake world knows every process group of the job and
which parallel dimension each serves; ranks at the same position of their pipeline group and of
their context-parallel group run the same program (up to which TP/DP/CP/EP group they talk to), so
one rank per such position is captured, and the communication of that grouping is then checked
(:mod:`capture.rolecheck`, ``capture.api.prove_roles``). ``--ranks all`` captures every rank and groups ranks whose programs are identical once
group ids are replaced by group families (:func:`canonical_program`) -- the check that ``auto`` is
right.
"""

from __future__ import annotations

import hashlib
import json
from typing import Iterable, Sequence

from capture.fakeworld import GroupRecord
from heterosim.trace.ir import COLUMNS, GroupInfo, Role, Trace
from capture.runner import RankCapture
from heterosim.errors import CaptureError

__all__ = ["roles_from_groups", "parse_rank_list", "canonical_program", "merge_captures", "group_by_program"]


SPLIT_DIMS = {"pp": "pipeline", "cp": "context-parallel"}
"""Parallel dimensions whose group position sets a rank's program: a pipeline stage runs its own
layers; a context-parallel rank its own ring order (even positions send first) and causal blocks."""


def roles_from_groups(groups: Sequence[GroupRecord], world_size: int) -> list[tuple[int, ...]]:
    """Partition ``range(world_size)`` into roles: ranks at the same position of their pipeline
    group and of their context-parallel group (:data:`SPLIT_DIMS`).

    Without groups labelled ``pp`` or ``cp`` every rank is in one role.
    """
    key: dict[int, tuple[int, ...]] = {r: () for r in range(world_size)}
    for dim, name in SPLIT_DIMS.items():
        labelled = [g for g in groups if g.dim == dim]
        if not labelled:
            continue
        # The family with the largest groups (Megatron also labels the first/last-stage embedding
        # groups as pipeline traffic).
        fam = max(labelled, key=lambda g: (len(g.ranks), -int(g.gid) if g.gid.isdigit() else 0)).family
        members = [g for g in labelled if g.family == fam]
        size = len(members[0].ranks)
        pos: dict[int, int] = {}
        for g in members:
            if len(g.ranks) != size:
                raise CaptureError(f"{name} groups differ in size ({size} vs {len(g.ranks)}): cannot form roles")
            pos.update((r, i) for i, r in enumerate(g.ranks))
        if len(pos) != world_size:
            missing = sorted(set(range(world_size)) - set(pos))
            raise CaptureError(f"ranks {missing[:8]} are in no {name} group; cannot form roles")
        for r in key:
            key[r] += (pos[r],)
    roles: dict[tuple[int, ...], list[int]] = {}
    for r in range(world_size):
        roles.setdefault(key[r], []).append(r)
    return sorted((tuple(v) for v in roles.values()), key=lambda rs: rs[0])


def parse_rank_list(text: str, world_size: int) -> list[int]:
    """Parse ``"0,5,8-11"`` into ranks, checking each is inside the world."""
    ranks: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
            else:
                lo = hi = int(part)
        except ValueError:
            raise CaptureError(f"--ranks {text!r}: {part!r} is not a rank or a range like 8-11") from None
        bad = sorted({r for r in (lo, hi) if not 0 <= r < world_size})
        if bad:  # checked before the range is built: 0-99999999999 must not fill memory
            raise CaptureError(f"--ranks {text!r}: ranks {bad} are outside the world (0..{world_size - 1})")
        ranks.extend(range(lo, hi + 1))
    return sorted(set(ranks))


def canonical_program(cap: RankCapture) -> str:
    """A digest of the rank's program with group ids replaced by their family (group membership)."""
    fam = {g.gid: g.family for g in cap.groups}
    blocks = {}
    for b, blk in cap.blocks.items():
        cols = {c: blk.columns[c] for c in COLUMNS}
        cols["group"] = [fam.get(g, g) if g else "" for g in cols["group"]]
        cols["stream"] = [_canon_stream(s, fam) for s in cols["stream"]]
        blocks[b] = cols
    body = {"blocks": blocks, "program": [[s.block, s.mb, s.chunk] for s in cap.program]}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _canon_stream(stream: str, fam: dict[str, str]) -> str:
    parts = stream.split(":")
    if len(parts) >= 2 and parts[1] in fam:
        parts[1] = fam[parts[1]]
    return ":".join(parts)


def group_by_program(caps: Iterable[RankCapture]) -> list[tuple[int, ...]]:
    """Ranks grouped by identical :func:`canonical_program` (roles found the slow, sure way)."""
    classes: dict[str, list[int]] = {}
    for c in caps:
        classes.setdefault(canonical_program(c), []).append(c.rank)
    return sorted((tuple(sorted(v)) for v in classes.values()), key=lambda r: r[0])


def _merged_groups(caps: Sequence[RankCapture]) -> dict[str, GroupInfo]:
    ref = caps[0]
    dims = {g.family: g.dim for g in ref.groups}
    for c in caps[1:]:
        if [(g.gid, g.ranks) for g in c.groups] != [(g.gid, g.ranks) for g in ref.groups]:
            raise CaptureError(
                f"rank {c.rank} created different process groups than rank {ref.rank}; every rank must "
                "create the same groups in the same order (torch.distributed requires it too)"
            )
        for g in c.groups:
            if g.dim not in ("other", "world"):
                dims[g.family] = g.dim
    return {g.gid: GroupInfo(g.ranks, dims.get(g.family, g.dim), g.family) for g in ref.groups}


def merge_captures(
    caps: Sequence[RankCapture],
    roles: Sequence[tuple[int, ...]],
    command: list[str],
    representatives: Sequence[int] | None = None,
) -> Trace:
    """Build the trace: one role per entry of ``roles``, represented by a captured rank.

    The representative of a role is its first rank listed in ``representatives`` (default: its
    first captured rank).
    """
    by_rank = {c.rank: c for c in caps}
    allowed = set(representatives) if representatives is not None else set(by_rank)
    groups = _merged_groups(caps)
    out_roles = []
    for i, ranks in enumerate(roles):
        rep = next((r for r in ranks if r in by_rank and r in allowed), None)
        if rep is None:
            raise CaptureError(
                f"role {i} (ranks {list(ranks[:8])}...) has no captured rank; add one of them to --ranks"
            )
        c = by_rank[rep]
        out_roles.append(Role(i, rep, tuple(ranks), dict(c.blocks), list(c.program), c.memory))
    ref = caps[0]
    layout = dict(ref.layout)
    return Trace(
        world_size=ref.world_size,
        groups=groups,
        roles=out_roles,
        layout=layout,
        model=dict(ref.model),
        command=command,
        torch_version=ref.torch_version,
        meta={"iterations_run": ref.iterations, "captured_ranks": sorted(r.captured_rank for r in out_roles),
              **({"iterations": ref.iteration_info} if ref.iteration_info is not None else {})},
    )
