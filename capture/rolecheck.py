"""Does a grouping of ranks into roles hold up? A check of the communication it implies. No torch.

A trace replays every rank of a role with its representative's program, each collective on the
member of its group family that holds the rank, each p2p peer given as a position in that group
(``heterosim/trace/ir.py``). That expansion is consistent when:

- every group's members issue the same collectives in the same order (same collective, same
  bytes, same dtype): replay pairs collectives by (group, sequence number);
- for every pair of ranks, the messages one sends to the other on a group are the messages the
  other receives from it on that group, in order (same bytes): replay pairs p2p by (src, dst,
  sequence).

:func:`check_roles` evaluates both for the whole world from one capture per role, per role and
group family rather than per op (ranks of a role share their sequences), so it costs
O(world x families x peers) after one pass over each representative's program. A grouping that
fails would deadlock in replay; ``--ranks auto`` then captures every rank of the roles involved
and splits them by identical programs (``capture/api.py``).

What it does not prove: ranks of a role whose communication agrees but whose compute differs
(``--ranks all`` compares whole programs).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

from capture.fakeworld import GroupRecord
from capture.runner import RankCapture

__all__ = ["CommSignature", "comm_signature", "check_roles"]


@dataclass(slots=True)
class CommSignature:
    """One rank's communication, by group family: collectives in order, p2p by peer position."""

    collectives: dict[str, tuple] = field(default_factory=dict)
    """family -> ((collective, bytes, dtype), ...) in program order."""
    sends: dict[str, dict[int, tuple]] = field(default_factory=dict)
    """family -> peer position in the group -> message sizes sent to it, in order."""
    recvs: dict[str, dict[int, tuple]] = field(default_factory=dict)
    """family -> peer position in the group -> message sizes received from it, in order."""


def comm_signature(cap: RankCapture) -> CommSignature:
    """The :class:`CommSignature` of a captured rank's program (each block read once)."""
    fam = {g.gid: g.family for g in cap.groups}
    per_block: dict[str, list[tuple]] = {}
    for bid, blk in cap.blocks.items():
        c = blk.columns
        per_block[bid] = [
            (k, coll, fam.get(g, g), nb, dt, peer)
            for k, coll, g, nb, dt, peer in zip(c["kind"], c["collective"], c["group"], c["comm_bytes"], c["dtype"],
                                                c["peer"])
            if k in ("collective", "p2p")
        ]
    colls: dict[str, list] = defaultdict(list)
    sends: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    recvs: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for seg in cap.program:
        for kind, coll, f, nb, dt, peer in per_block[seg.block]:
            if kind == "collective":
                colls[f].append((coll, nb, dt))
            elif coll == "send":
                sends[f][peer].append(nb)
            else:
                recvs[f][peer].append(nb)
    return CommSignature(
        {f: tuple(v) for f, v in colls.items()},
        {f: {p: tuple(v) for p, v in d.items()} for f, d in sends.items()},
        {f: {p: tuple(v) for p, v in d.items()} for f, d in recvs.items()},
    )


def _ranks(rs: Sequence[int]) -> str:
    return ",".join(map(str, rs[:8])) + (",..." if len(rs) > 8 else "")


def check_roles(groups: Sequence[GroupRecord], roles: Sequence[tuple[int, ...]],
                sigs: Sequence[CommSignature]) -> tuple[set[int], list[str]]:
    """Check the expansion of ``roles`` (role i runs the program whose signature is ``sigs[i]``).

    Returns the indices of the roles involved in a mismatch and one line per mismatch (at most
    a few of each kind); both empty when the grouping is consistent.
    """
    role_of = {r: i for i, ranks in enumerate(roles) for r in ranks}
    bad: set[int] = set()
    problems: list[str] = []
    for g in groups:
        if len(g.ranks) < 2:
            continue
        members = sorted({role_of[r] for r in g.ranks})
        seqs = {i: sigs[i].collectives.get(g.family, ()) for i in members}
        if len(set(seqs.values())) > 1:
            bad.update(members)
            counts = ", ".join(f"role {i}: {len(s)}" for i, s in seqs.items())
            problems.append(f"collectives on group {g.gid} (ranks {_ranks(g.ranks)}) differ between roles ({counts})")
        for pos, r in enumerate(g.ranks):
            mine = role_of[r]
            for peer, sizes in sigs[mine].sends.get(g.family, {}).items():
                _pair(g, pos, r, peer, sizes, sigs, role_of, mine, bad, problems, "sends")
            for peer, sizes in sigs[mine].recvs.get(g.family, {}).items():
                _pair(g, pos, r, peer, sizes, sigs, role_of, mine, bad, problems, "receives")
    return bad, problems[:6]


def _pair(g: GroupRecord, pos: int, r: int, peer: int, sizes: tuple, sigs: Sequence[CommSignature],
          role_of: dict[int, int], mine: int, bad: set[int], problems: list[str], verb: str) -> None:
    if not 0 <= peer < len(g.ranks) or peer == pos:
        bad.add(mine)
        problems.append(f"rank {r} {verb} {len(sizes)} messages on group {g.gid} (ranks {_ranks(g.ranks)}) "
                        f"with position {peer}, which is {'itself' if peer == pos else 'outside the group'}")
        return
    q = g.ranks[peer]
    theirs = sigs[role_of[q]]
    other = (theirs.recvs if verb == "sends" else theirs.sends).get(g.family, {}).get(pos, ())
    if other != sizes:
        bad.update((mine, role_of[q]))
        back = "receives" if verb == "sends" else "sends"
        problems.append(f"rank {r} {verb} {len(sizes)} messages to/from rank {q} on group {g.gid}, "
                        f"which {back} {len(other)} (sizes {list(sizes[:3])} vs {list(other[:3])})")
