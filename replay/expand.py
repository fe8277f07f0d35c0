"""Expansion of captured roles to every rank: the job both engines simulate.

A :class:`Workload` is a trace placed on a cluster: each rank's GPU type and node, a price per op
(one ``Pricer.price_block`` call per distinct (block, GPU type)), and a function that turns one
collective instance into the :class:`~replay.flows.TransferSpec` it puts on the network.

Pairing rules (the same for both engines):

- a collective is the ``k``-th op a rank issues on global group ``g``: key ``("c", g, k)``; every
  rank of ``g`` takes part;
- a send from ``src`` to ``dst`` in group ``g`` is the ``k``-th send ``src`` issues to ``dst`` in
  ``g`` and pairs with the ``k``-th recv ``dst`` posts from ``src`` in ``g``: key
  ``("p", g, src, dst, k)``. (Pairing is per group because each process group is its own NCCL
  communicator; send/recv on different groups never match.)
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Callable, Hashable, NamedTuple, Sequence

import numpy as np

from heterosim.errors import ReplayError, TraceSchemaError
from heterosim.trace.ir import Trace
from heterosim.trace.vocab import P2P

from .flows import TransferSpec

__all__ = [
    "CommInstance",
    "Workload",
    "RankOp",
    "RankTimes",
    "WaitRecord",
    "expand_rank",
    "comm_instance",
    "check_match",
    "role_comm_families",
    "rank_classes",
    "RoleSkeleton",
    "build_skeleton",
    "span_step",
    "busy_change",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class CommInstance:
    """One collective (or one send/recv pair) as the network sees it."""

    collective: str
    nbytes: int
    dtype: str
    ranks: tuple[int, ...]
    """Global ranks in group order; for a p2p pair ``(src, dst)``."""
    group: str
    """Global process-group id."""
    dim: str
    """Parallel dimension of the group (tp, dp, pp, cp, ep, world, other)."""


@dataclass(slots=True, kw_only=True)
class Workload:
    """A trace placed on hardware: what the engines need and nothing else.

    ``durations(role_id, block, gpu_type)`` returns the seconds of every op of the block on that
    GPU type (0 for comm and wait ops); ``transfer(inst)`` the network work of a comm instance;
    ``capacity_Bps`` the bandwidth of every link index that transfers use.
    """

    trace: Trace
    gpu_type: Sequence[str]
    """GPU type of each rank."""
    node: Sequence[int]
    """Node of each rank (for intra- vs inter-node accounting)."""
    durations: Callable[[int, str, str], np.ndarray]
    transfer: Callable[[CommInstance], TransferSpec]
    capacity_Bps: Sequence[float]
    link_sharing: bool = True
    """False: every transfer takes its uncontended time (no max-min sharing between transfers)."""
    overlap_slowdown: float = 0.0
    """Fraction of speed a rank's compute loses while one of its comm ops is in flight (0: none)."""
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        w = self.trace.world_size
        if len(self.gpu_type) != w or len(self.node) != w:
            raise ReplayError(
                f"workload: {len(self.gpu_type)} GPU types and {len(self.node)} nodes given for a "
                f"trace of world size {w}; give one per rank"
            )
        s = self.overlap_slowdown
        if not (isinstance(s, (int, float)) and 0.0 <= s < 1.0):
            raise ReplayError(
                f"overlap_slowdown must be a fraction in [0, 1) (0.1: compute runs at 90% speed while "
                f"communication of the same rank is in flight), got {s!r}")

    def block_durations(self, role_id: int, block: str, gpu: str) -> np.ndarray:
        """Cached :attr:`durations`."""
        k = ("dur", role_id, block, gpu)
        v = self._cache.get(k)
        if v is None:
            v = np.asarray(self.durations(role_id, block, gpu), dtype=np.float64)
            self._cache[k] = v
        return v

    def transfer_spec(self, inst: CommInstance) -> TransferSpec:
        """Cached :attr:`transfer` (instances with equal fields share one spec)."""
        k = ("tr", inst)
        v = self._cache.get(k)
        if v is None:
            v = self.transfer(inst)
            self._cache[k] = v
        return v

    def crosses_nodes(self, ranks: Sequence[int]) -> bool:
        """True when ``ranks`` live on more than one node."""
        n0 = self.node[ranks[0]]
        return any(self.node[r] != n0 for r in ranks)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankOp:
    """One op of one rank, as the reference engine consumes it."""

    index: int
    """Position in the rank's expanded program (= the op id)."""
    kind: str
    name: str
    phase: str
    mb: int
    duration_s: float = 0.0
    stream: str = "compute"
    key: Hashable = None
    """Comm ops: the pairing key (see the module docstring)."""
    inst: CommInstance | None = None
    send: bool = False
    """p2p ops: True for the sending side."""
    target: int = -1
    """Wait ops: index of the comm op waited for."""
    coalesced: int = -1
    """Index of the first op of the coalesced launch this op belongs to; -1 if none."""


def role_comm_families(trace: Trace, role_id: int) -> tuple[set[str], set[tuple[str, int]]]:
    """Captured group ids the role's collectives use, and the (group, peer) pairs of its p2p ops."""
    role = trace.roles[role_id]
    coll: set[str] = set()
    p2p: set[tuple[str, int]] = set()
    for b in {s.block for s in role.program}:
        cols = role.blocks[b].columns
        for kind, g, peer in zip(cols["kind"], cols["group"], cols["peer"]):
            if kind == "collective":
                coll.add(g)
            elif kind == "p2p":
                p2p.add((g, int(peer)))
    return coll, p2p


def comm_instance(trace: Trace, op_group: str, collective: str, nbytes: int, dtype: str,
                  peer: int, rank: int, counters: dict) -> tuple[Hashable, CommInstance, bool]:
    """Pairing key, instance and send flag of one comm op issued by ``rank``."""
    g = trace.group_for(op_group, rank)
    info = trace.groups[g]
    if collective in P2P:
        if not 0 <= peer < len(info.ranks):
            raise TraceSchemaError(
                f"rank {rank}: {collective} on group {g} names peer {peer}, but the group has "
                f"{len(info.ranks)} ranks"
            )
        other = info.ranks[peer]
        send = collective == "send"
        src, dst = (rank, other) if send else (other, rank)
        ck = ("p", g, src, dst, send)
        k = counters.get(ck, 0)
        counters[ck] = k + 1
        inst = CommInstance(collective="send", nbytes=int(nbytes), dtype=dtype, ranks=(src, dst),
                            group=g, dim=info.dim)
        return ("p", g, src, dst, k), inst, send
    ck = ("c", g)
    k = counters.get(ck, 0)
    counters[ck] = k + 1
    inst = CommInstance(collective=collective, nbytes=int(nbytes), dtype=dtype, ranks=info.ranks,
                        group=g, dim=info.dim)
    return ("c", g, k), inst, False


def expand_rank(w: Workload, rank: int) -> list[RankOp]:
    """The full op list of ``rank`` with its own durations and pairing keys (reference engine)."""
    trace = w.trace
    role = trace.role_of(rank)
    gpu = w.gpu_type[rank]
    out: list[RankOp] = []
    counters: dict = {}
    base = 0
    for seg in role.program:
        cols = role.blocks[seg.block].columns
        dur = w.block_durations(role.id, seg.block, gpu)
        for i, kind in enumerate(cols["kind"]):
            oid = base + i
            common = dict(index=oid, kind=kind, name=cols["name"][i], phase=cols["phase"][i], mb=seg.mb)
            if kind == "compute":
                out.append(RankOp(**common, duration_s=float(dur[i])))
            elif kind == "wait":
                out.append(RankOp(**common, target=oid - cols["target"][i]))
            else:
                key, inst, send = comm_instance(
                    trace, cols["group"][i], cols["collective"][i], cols["comm_bytes"][i],
                    cols["dtype"][i], cols["peer"][i], rank, counters)
                coal = cols["coalesced"][i]
                out.append(RankOp(**common, stream=cols["stream"][i], key=key, inst=inst, send=send,
                                  coalesced=oid - coal if coal else -1))
        base += len(cols["kind"])
    return out


def describe_op(op: RankOp) -> str:
    """``op 12 (aten.mm.default)`` for error messages."""
    return f"op {op.index} ({op.name})"


def check_match(first: RankOp, first_rank: int, op: RankOp, rank: int, key: Hashable) -> None:
    """Raise :class:`TraceMismatchError` unless ``op`` of ``rank`` pairs with ``first``."""
    from heterosim.errors import TraceMismatchError

    a, b = first.inst, op.inst
    assert a is not None and b is not None
    if key[0] == "p":
        if first.send == op.send:
            side = "send" if op.send else "recv"
            raise TraceMismatchError(
                f"p2p mismatch on group {key[1]} pair {key[2]}->{key[3]} #{key[4]}: ranks {first_rank} "
                f"and {rank} both posted a {side} ({describe_op(first)}, {describe_op(op)}); each "
                f"send needs a recv on the peer"
            )
        if a.nbytes != b.nbytes:
            raise TraceMismatchError(
                f"p2p size mismatch on group {key[1]} pair {key[2]}->{key[3]} #{key[4]}: rank "
                f"{first_rank} {describe_op(first)} moves {a.nbytes} B but rank {rank} "
                f"{describe_op(op)} moves {b.nbytes} B"
            )
        return
    if a.collective != b.collective or a.nbytes != b.nbytes:
        raise TraceMismatchError(
            f"collective mismatch on group {key[1]} sequence {key[2]}: rank {first_rank} issued "
            f"{a.collective} of {a.nbytes} B ({describe_op(first)}) but rank {rank} issued "
            f"{b.collective} of {b.nbytes} B ({describe_op(op)}); the ranks of a group must issue "
            f"the same collectives in the same order"
        )


class WaitRecord(NamedTuple):
    """The compute stream of a rank blocked at a wait op from ``t_block`` to ``t_end``.

    NB: a NamedTuple, not a dataclass: the steady-phase skip writes hundreds of thousands of them
    (``replay.periodic``), and a tuple is built at C speed."""

    t_block: float
    t_end: float
    t_start: float
    """When the awaited transfer started (all members had issued it)."""
    dim: str
    inter_node: bool
    point: int = -1
    """Fast engine: the point index of the awaited comm op (for the critical path)."""


@dataclass(slots=True, kw_only=True)
class RankTimes:
    """What one rank did, as both engines report it."""

    finish_s: float
    """When the rank's last op (on any stream) completed."""
    compute_s: float
    """Busy time of the compute stream (kernel time, stretched by any overlap slowdown)."""
    comm_start: np.ndarray
    """Per comm op (program order): when its transfer started."""
    comm_end: np.ndarray
    """Per comm op (program order): when it completed."""
    waits: list[WaitRecord]
    """Waits that blocked (t_end > t_block), in program order."""


# --------------------------------------------------------------------------------------------
# Classes of equivalent ranks


def _family(trace: Trace, g: str) -> str:
    return trace.groups[g].family or g


def rank_classes(trace: Trace, gpu_type: Sequence[str], extra: Sequence[Hashable] | None = None) -> list[int]:
    """Class id of every rank (ids in order of first rank), by colour refinement.

    Start: (role, GPU type, position in each group the role does p2p on, ``extra``). Refine until
    stable: add the sorted classes of the members of each group the role's collectives use, and
    the class of each p2p peer.
    """
    world = trace.world_size
    role_of = [0] * world
    for role in trace.roles:
        for r in role.ranks:
            role_of[r] = role.id
    fams = [role_comm_families(trace, role.id) for role in trace.roles]
    coll = [sorted(c) for c, _ in fams]
    p2p = [sorted(p) for _, p in fams]
    p2p_groups = [sorted({g for g, _ in p}) for p in p2p]
    col: list[Hashable] = []
    for r in range(world):
        rid = role_of[r]
        pos = tuple(trace.groups[trace.group_for(g, r)].ranks.index(r) for g in p2p_groups[rid])
        col.append((rid, gpu_type[r], pos, extra[r] if extra is not None else None))
    ids = _relabel(col)
    coll_of = [[trace.group_for(g, r) for g in coll[role_of[r]]] for r in range(world)]
    peers_of = [[trace.peer_global(g, p, r) for g, p in p2p[role_of[r]]] for r in range(world)]
    while True:
        memo: dict[str, tuple[int, ...]] = {}

        def members(g: str) -> tuple[int, ...]:
            v = memo.get(g)
            if v is None:
                v = tuple(sorted(ids[x] for x in trace.groups[g].ranks))
                memo[g] = v
            return v

        new = [(ids[r], tuple(map(members, coll_of[r])), tuple(ids[x] for x in peers_of[r])) for r in range(world)]
        new_ids = _relabel(new)
        if max(new_ids) == max(ids):
            return new_ids
        ids = new_ids


def _relabel(colors: Sequence[Hashable]) -> list[int]:
    seen: dict[Hashable, int] = {}
    return [seen.setdefault(c, len(seen)) for c in colors]


# --------------------------------------------------------------------------------------------
# Role skeletons: the comm / wait ops of a role's program, with compute spans between them


@dataclass(slots=True, kw_only=True)
class RoleSkeleton:
    """The non-compute ops ("points") of a role's expanded program, in order."""

    role: int
    op_id: list[int]
    kind: list[str]
    name: list[str]
    phase: list[str]
    mb: list[int]
    stream: list[str]
    group: list[str]
    collective: list[str]
    nbytes: list[int]
    dtype: list[str]
    peer: list[int]
    target: list[int]
    """Wait points: point index of the awaited comm op."""
    coalesced: list[int]
    """Comm points: point index of the first op of their coalesced launch (own index if none)."""
    num_ops: int
    sig: list[int] = field(default_factory=list)
    """Per point: an id of its (group, collective, bytes, dtype, peer), equal for points the
    network sees alike (the fast engine keys its per-class shape cache by it)."""
    spans: dict[str, np.ndarray] = field(default_factory=dict)
    """GPU type -> compute seconds before each point (len points + 1; the last is the tail)."""
    phase_compute: dict[str, dict[str, float]] = field(default_factory=dict)
    """GPU type -> phase -> compute seconds of the whole program."""

    def __len__(self) -> int:
        return len(self.kind)


def build_skeleton(w: Workload, role_id: int, gpus: Sequence[str], xp: Any = np) -> RoleSkeleton:
    """Collect a role's points and, for each GPU type, its compute spans (prefix sums).

    Each distinct block is read once; the program's points are then concatenations of the blocks'
    columns (a role repeats a few blocks thousands of times), with op ids and point indices offset
    per segment in numpy.
    """
    role = w.trace.roles[role_id]
    program = list(map(attrgetter("block"), role.program))
    local: dict[str, _BlockPoints] = {}
    sig_ids: dict[tuple, int] = {}
    for b, blk in role.blocks.items():
        local[b] = _block_points(blk.columns, sig_ids)
    parts = [local[b] for b in program]
    npts = np.fromiter(map(attrgetter("n"), parts), dtype=np.int64, count=len(parts))
    nops = np.fromiter(map(attrgetter("num_ops"), parts), dtype=np.int64, count=len(parts))
    p0 = np.zeros(len(parts), dtype=np.int64)
    base = np.zeros(len(parts), dtype=np.int64)
    if parts:
        np.cumsum(npts[:-1], out=p0[1:])
        np.cumsum(nops[:-1], out=base[1:])
    chain = itertools.chain.from_iterable
    seg_p0 = np.repeat(p0, npts)
    op_id = np.concatenate([p.pos for p in parts] or [np.zeros(0, dtype=np.int64)]) + np.repeat(base, npts)
    own = np.arange(int(npts.sum()), dtype=np.int64)

    def resolve(rel: np.ndarray, missing: np.ndarray | None) -> np.ndarray:
        """Point index of each point's earlier partner: ``rel`` holds the block point index (>= 0),
        -1 - distance for an op of an earlier segment, or _NONE; ``missing`` (None: must exist)
        is taken where an earlier op is not a point."""
        out = np.where(rel >= 0, seg_p0 + rel, -1)
        cross = np.flatnonzero((rel < 0) & (rel != _NONE))
        if cross.size:
            oid = op_id[cross] + 1 + rel[cross]
            at = np.searchsorted(op_id, oid)
            found = (at < op_id.size) & (op_id[np.minimum(at, op_id.size - 1)] == oid)
            if missing is None and not found.all():
                raise KeyError(int(oid[np.argmin(found)]))
            out[cross] = at if missing is None else np.where(found, at, missing[cross])
        return out

    tgt = np.concatenate([p.tgt for p in parts] or [np.zeros(0, dtype=np.int64)])
    coal = np.concatenate([p.coal for p in parts] or [np.zeros(0, dtype=np.int64)])
    coalesced = resolve(coal, own)
    coalesced = np.where(coal == _NONE, own, coalesced)

    def cat(name: str) -> list:
        return list(chain(map(attrgetter(name), parts)))

    sk = RoleSkeleton(
        role=role_id, op_id=op_id.tolist(), kind=cat("kinds"), name=cat("names"), phase=cat("phases"),
        mb=np.repeat(np.fromiter(map(attrgetter("mb"), role.program), dtype=np.int64, count=len(parts)),
                     npts).tolist(),
        stream=cat("streams"), group=cat("groups"), collective=cat("colls"), nbytes=cat("nbytes"),
        dtype=cat("dtypes"), peer=cat("peers"), target=resolve(tgt, None).tolist(),
        coalesced=coalesced.tolist(), num_ops=int(nops.sum()), sig=cat("sigs"))
    counts = Counter(program)
    for gpu in dict.fromkeys(gpus):
        block_spans: dict[str, np.ndarray] = {}
        phase_tot: dict[str, float] = {}
        for b, blk in role.blocks.items():
            dur = xp.asarray(w.block_durations(role_id, b, gpu))
            prefix = xp.concatenate([xp.zeros(1), xp.cumsum(dur)])
            pos = xp.asarray(local[b].pos)
            starts = xp.concatenate([xp.zeros(1, dtype=pos.dtype), pos + 1])
            ends = xp.concatenate([pos, xp.asarray([len(blk)], dtype=pos.dtype)])
            block_spans[b] = _host(prefix[ends] - prefix[starts])
        for b, n in counts.items():
            dur = w.block_durations(role_id, b, gpu)
            for ph, d in zip(role.blocks[b].columns["phase"], dur.tolist()):
                phase_tot[ph] = phase_tot.get(ph, 0.0) + d * n
        sk.spans[gpu] = _program_spans(program, block_spans, len(sk.kind))
        sk.phase_compute[gpu] = phase_tot
    return sk


_NONE = np.iinfo(np.int64).min
"""A point without a wait target / coalesced partner (:func:`_block_points`)."""


@dataclass(slots=True)
class _BlockPoints:
    """One block's points (its non-compute ops) as :func:`build_skeleton` concatenates them."""

    pos: np.ndarray
    kinds: list
    names: list
    phases: list
    streams: list
    groups: list
    colls: list
    nbytes: list
    dtypes: list
    peers: list
    tgt: np.ndarray
    """Wait target: its block point index, -1 - distance for an op before the block, else _NONE."""
    coal: np.ndarray
    """Coalesced partner (an earlier op), encoded as ``tgt``."""
    sigs: list
    n: int
    """Number of points."""
    num_ops: int
    """Number of ops of the block."""


def _block_points(cols: Any, sig_ids: dict[tuple, int]) -> _BlockPoints:
    pos = [i for i, k in enumerate(cols["kind"]) if k != "compute"]
    at = {i: j for j, i in enumerate(pos)}  # block op index -> block point index
    kinds = [cols["kind"][i] for i in pos]
    tgt = [at.get(i - cols["target"][i], -1 - cols["target"][i]) if k == "wait" else _NONE
           for i, k in zip(pos, kinds)]
    coal = [at.get(i - cols["coalesced"][i], -1 - cols["coalesced"][i])
            if cols["coalesced"][i] > 0 and k != "wait" else _NONE for i, k in zip(pos, kinds)]
    sigs = [sig_ids.setdefault((cols["group"][i], cols["collective"][i], int(cols["comm_bytes"][i]),
                                cols["dtype"][i], int(cols["peer"][i])), len(sig_ids)) for i in pos]
    return _BlockPoints(
        pos=np.asarray(pos, dtype=np.int64), kinds=kinds, names=[cols["name"][i] for i in pos],
        phases=[cols["phase"][i] for i in pos], streams=[cols["stream"][i] for i in pos],
        groups=[cols["group"][i] for i in pos], colls=[cols["collective"][i] for i in pos],
        nbytes=[int(cols["comm_bytes"][i]) for i in pos], dtypes=[cols["dtype"][i] for i in pos],
        peers=[int(cols["peer"][i]) for i in pos], tgt=np.asarray(tgt, dtype=np.int64),
        coal=np.asarray(coal, dtype=np.int64), sigs=sigs, n=len(pos),
        num_ops=len(cols["kind"]))


def _program_spans(program: Sequence[str], block_spans: dict[str, np.ndarray], npoints: int) -> np.ndarray:
    """Compute seconds before each point of the program (and the tail after the last): a block's
    spans between its points, the compute after a block's last point carried onto the next point
    (summed in program order over blocks without points)."""
    spans = np.zeros(npoints + 1)
    if not program:
        return spans
    if all(bs.size > 1 for bs in block_spans.values()):  # every block has a point: no sums to carry
        spans[:npoints] = np.concatenate([block_spans[b][:-1] for b in program])
        last = np.fromiter((block_spans[b][-1] for b in program), dtype=np.float64, count=len(program))
        firsts = np.zeros(len(program), dtype=np.int64)
        np.cumsum([block_spans[b].size - 1 for b in program[:-1]], out=firsts[1:])
        spans[firsts[1:]] += last[:-1]
        spans[npoints] += last[-1]
        return spans
    k = 0
    carry = 0.0
    for b in program:
        bs = block_spans[b]
        n = bs.size - 1
        if n == 0:
            carry += float(bs[0])
            continue
        spans[k:k + n] = bs[:n]
        spans[k] += carry
        carry = float(bs[n])
        k += n
    spans[k] += carry
    return spans


def _host(a: Any) -> np.ndarray:
    get = getattr(a, "get", None)  # cupy arrays copy to host with .get()
    return np.asarray(get() if callable(get) else a, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# Overlap slowdown: the compute clock of one rank (reference) or class (fast engine)
#
# ``st`` carries tc (time up to which progress is accounted), work (full-speed seconds left in the
# span in progress; None: none started), busy (comm ops in flight), ver / t_reach (the pending
# end-of-span event) and compute (stretched busy time). Compute runs at ``busy_rate`` = 1 - F while
# busy > 0, else at full speed; the engines push the returned times as versioned events.


def span_step(st: Any, d: float, busy_rate: float) -> float | None:
    """Start (or finish) a span of ``d`` full-speed seconds: the time its end event is due (``st.ver``
    bumped), or None when it is done and the stream moves on."""
    if st.work is None:
        st.work = d
    if st.work > 0:
        st.ver += 1
        st.t_reach = st.tc + st.work / (busy_rate if st.busy else 1.0)
        return st.t_reach
    st.work = None
    return None


def busy_change(st: Any, t: float, delta: int, busy_rate: float) -> float | None:
    """A comm op of the stream's rank started (+1) or ended (-1) at ``t``: the re-planned end of the
    span in progress (``st.ver`` bumped), or None when its speed does not change."""
    was = st.busy
    st.busy += delta
    if (was > 0) == (st.busy > 0) or st.work is None or st.work <= 0 or st.t_reach <= t:
        return None
    w = st.work - (t - st.tc) * (busy_rate if was else 1.0)
    st.work = 0.0 if 0.0 > w else w  # max(w, 0.0), without the call
    st.compute += t - st.tc
    st.tc = t
    st.ver += 1
    st.t_reach = t + st.work / (busy_rate if st.busy else 1.0)
    return st.t_reach
