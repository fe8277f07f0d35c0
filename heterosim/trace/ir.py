"""The workload trace: the contract between capture and everything downstream. Imports no torch.

On disk a trace is a directory (:mod:`heterosim.trace.store` writes and validates it)::

    TRACE/
      trace.json            header (schema_version, command, world size, layout, groups, roles, FLOPs)
      roles/role_0000.json  one file per role: blocks of ops and the program that sequences them

Vocabulary (fixed here for the whole project):

- *rank*: a process of the job. *role*: a set of ranks that run the same program, up to which
  member of each process-group family they talk to. One rank per role is *captured*.
- *op*: one recorded operation. ``kind`` is ``compute`` (a kernel), ``collective`` (an NCCL
  collective issued on a communication stream), ``p2p`` (a send or a recv) or ``wait`` (the compute
  stream waits for a communication op to finish).
- *block*: a list of ops recorded once. The role's *program* is a list of segments
  ``(block, micro_batch, chunk)``; a block that repeats (the forward of every micro-batch on a
  pipeline stage) is stored once and referenced many times, so trace size does not grow with the
  number of micro-batches.
- *host sync*: an op whose ``host_sync`` is True is issued only after the CPU has waited for the
  GPU to finish every op issued before it (the script read a value back: ``.item()``, a copy to
  the host, ``torch.cuda.synchronize()``); replay's host model (``replay/host.py``) lets the
  CPU's lead over the GPU collapse there.
- *op id*: the position of an op in the role's program once expanded (segment by segment).
  Inside a block, ``deps`` and wait ``target`` are stored as *backward distances* (``op_id - dep``),
  which keeps a block position-independent.
- *group family*: process groups created by the same loop (all TP groups, all DP groups ...). A
  collective on group ``g`` of the captured rank runs, for another rank of the role, on the member
  of ``g``'s family that contains that rank (:meth:`Trace.group_for`).

Collective ``comm_bytes`` follow nccl-tests' "size": the whole buffer for all_reduce / broadcast /
reduce, the gathered output for all_gather, the unscattered input for reduce_scatter, what one
rank sends for all_to_all, the message for send/recv.

FLOPs per op: ``flops`` is what the kernel executes (causal attention counted as a flash kernel
computes it: only the unmasked blocks), ``flops_full`` is Megatron's convention (full attention).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Mapping, Sequence

from heterosim.errors import TraceSchemaError

__all__ = [
    "SCHEMA_VERSION",
    "OP_KINDS",
    "PHASES",
    "PARALLEL_DIMS",
    "LAUNCHES",
    "COLUMNS",
    "Op",
    "Block",
    "Segment",
    "GroupInfo",
    "Role",
    "Trace",
    "flop_totals",
]

SCHEMA_VERSION = 2
"""The trace schema this code writes. Bump it, and add a ``migrate_v{N}_to_v{N+1}`` to
:mod:`heterosim.trace.store`, whenever a field is added or changes meaning. v2 added the
``host_sync`` and ``launch`` columns (v1 traces load with False and ``eager`` everywhere)."""

OpKind = Literal["compute", "collective", "p2p", "wait"]
OP_KINDS: tuple[str, ...] = ("compute", "collective", "p2p", "wait")

PHASES: tuple[str, ...] = ("fwd", "bwd", "recompute", "optimizer", "grad_sync", "other")
PARALLEL_DIMS: tuple[str, ...] = ("tp", "dp", "pp", "cp", "ep", "world", "other")

LAUNCHES: tuple[str, ...] = ("eager", "graph", "in_graph")
"""How the CPU launched a compute op: ``eager`` (one dispatch of its own), ``graph`` (the first op
of a CUDA-graph replay: one graph launch for the ops of the replay), ``in_graph`` (a later op of
that replay: launched with it, no CPU cost of its own). ``capture/graphs.py`` records graphs."""

# Column name -> (python type, default). Every block stores every column, in this order.
COLUMNS: dict[str, tuple[type, Any]] = {
    "kind": (str, "compute"),
    "name": (str, ""),
    "kernel_class": (str, ""),
    "module": (str, ""),
    "phase": (str, "other"),
    "flops": (float, 0.0),
    "flops_full": (float, 0.0),
    "bytes_read": (int, 0),
    "bytes_written": (int, 0),
    "dtype": (str, ""),
    "dims": (dict, None),
    "signature": (str, ""),
    "stream": (str, "compute"),
    "deps": (list, None),
    "collective": (str, ""),
    "group": (str, ""),
    "comm_bytes": (int, 0),
    "peer": (int, -1),
    "target": (int, 0),
    "coalesced": (int, 0),
    "host_sync": (bool, False),
    "launch": (str, "eager"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One operation of a role's program, with absolute ids (see the module docstring)."""

    id: int
    """Position in the expanded program of the role."""
    kind: str
    """One of :data:`OP_KINDS`."""
    name: str
    """The aten (or c10d) op name as captured, e.g. ``aten.mm.default``."""
    kernel_class: str
    """One of :data:`heterosim.trace.vocab.KERNEL_CLASSES`; ``comm`` for collective / p2p / wait."""
    module: str = ""
    """Fully qualified module path (forward and backward alike)."""
    phase: str = "other"
    """One of :data:`PHASES`."""
    mb: int = -1
    """Micro-batch index, -1 outside any micro-batch."""
    chunk: int = 0
    """Virtual-pipeline chunk (model chunk) index."""
    flops: float = 0.0
    """FLOPs the kernel executes (causal attention counted as a flash kernel computes it)."""
    flops_full: float = 0.0
    """FLOPs in Megatron's convention (attention counted full)."""
    bytes_read: int = 0
    """Bytes read from device memory (tensor inputs, numel * itemsize)."""
    bytes_written: int = 0
    """Bytes written to device memory (tensor outputs)."""
    dtype: str = ""
    """Compute dtype: a name of :data:`heterosim.trace.vocab.DTYPE_BYTES` (fp32, bf16, fp8, ...)."""
    dims: Mapping[str, Any] = field(default_factory=dict)
    """Shape parameters that key the kernel DB: gemm m/n/k/batch, attention b/h/sq/sk/d/causal, numel."""
    signature: str = ""
    """Canonical shape/dtype signature (kernel DB key together with kernel class)."""
    stream: str = "compute"
    """``compute`` for kernels; ``comm:<group>`` or ``p2p:<group>:<peer>`` for communication."""
    deps: tuple[int, ...] = ()
    """Op ids this op reads data from (data dependencies)."""
    collective: str = ""
    """For collective / p2p ops: one of :data:`heterosim.trace.vocab.COLLECTIVES`."""
    group: str = ""
    """Process-group id (key of :attr:`Trace.groups`) as seen by the captured rank."""
    comm_bytes: int = 0
    """nccl-tests "size" of the collective (see module docstring), or the p2p message size."""
    peer: int = -1
    """For p2p: the peer's rank *within* ``group``."""
    target: int = -1
    """For wait ops: the id of the communication op waited for."""
    coalesced: int = -1
    """For ops launched together (``batch_isend_irecv``, coalesced collectives): id of the first."""
    launch: str = "eager"
    """One of :data:`LAUNCHES`: eager, or part of a CUDA-graph replay."""
    host_sync: bool = False
    """The CPU waited for the GPU to finish every earlier op before issuing this one (a value read
    back by ``.item()``, a copy to the host or ``torch.cuda.synchronize()`` just before it)."""


@dataclass(frozen=True, slots=True)
class Block:
    """Ops recorded once, stored column-wise (one list per entry of :data:`COLUMNS`).

    ``deps`` / ``target`` / ``coalesced`` hold backward distances (0 = none).
    """

    columns: Mapping[str, list]

    def __len__(self) -> int:
        return len(self.columns["kind"])

    @staticmethod
    def from_rows(rows: Sequence[Mapping[str, Any]]) -> "Block":
        """Build a block from row dicts; missing columns take their defaults."""
        cols: dict[str, list] = {c: [] for c in COLUMNS}
        for r in rows:
            for c, (_, default) in COLUMNS.items():
                v = r.get(c, default)
                if v is None:
                    v = {} if c == "dims" else []
                cols[c].append(v)
        return Block(cols)


@dataclass(frozen=True, slots=True)
class Segment:
    """One entry of a role's program: run ``block`` for micro-batch ``mb`` of model chunk ``chunk``."""

    block: str
    mb: int = -1
    chunk: int = 0


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A process group: its global ranks, the parallel dimension it serves and its family."""

    ranks: tuple[int, ...]
    dim: str = "other"
    family: str = ""


@dataclass(slots=True)
class Role:
    """A set of ranks running the same program; ``captured_rank`` is the one that was recorded."""

    id: int
    captured_rank: int
    ranks: tuple[int, ...]
    blocks: dict[str, Block]
    program: list[Segment]
    memory: Any = None
    """Optional :class:`heterosim.trace.memory.RoleMemory` of the captured rank (None in traces
    captured before memory was recorded)."""

    @property
    def num_ops(self) -> int:
        """Number of ops once the program is expanded."""
        return sum(len(self.blocks[s.block]) for s in self.program)

    def iter_ops(self) -> Iterator[Op]:
        """Yield the expanded program's ops in order, with absolute ids."""
        base = 0
        for seg in self.program:
            cols = self.blocks[seg.block].columns
            n = len(cols["kind"])
            for i in range(n):
                oid = base + i
                tgt = cols["target"][i]
                coal = cols["coalesced"][i]
                yield Op(
                    id=oid,
                    kind=cols["kind"][i],
                    name=cols["name"][i],
                    kernel_class=cols["kernel_class"][i],
                    module=cols["module"][i],
                    phase=cols["phase"][i],
                    mb=seg.mb,
                    chunk=seg.chunk,
                    flops=cols["flops"][i],
                    flops_full=cols["flops_full"][i],
                    bytes_read=cols["bytes_read"][i],
                    bytes_written=cols["bytes_written"][i],
                    dtype=cols["dtype"][i],
                    dims=cols["dims"][i],
                    signature=cols["signature"][i],
                    stream=cols["stream"][i],
                    deps=tuple(oid - d for d in cols["deps"][i]),
                    collective=cols["collective"][i],
                    group=cols["group"][i],
                    comm_bytes=cols["comm_bytes"][i],
                    peer=cols["peer"][i],
                    target=oid - tgt if tgt else -1,
                    coalesced=oid - coal if coal else -1,
                    host_sync=cols["host_sync"][i],
                    launch=cols["launch"][i],
                )
            base += n

    def ops(self) -> list[Op]:
        """The expanded program as a list (see :meth:`iter_ops`)."""
        return list(self.iter_ops())


@dataclass(slots=True)
class Trace:
    """A loaded trace: the header fields plus every role."""

    world_size: int
    groups: dict[str, GroupInfo]
    roles: list[Role]
    layout: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    torch_version: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    _family_index: dict[str, dict[int, str]] | None = field(default=None, repr=False)

    def role_of(self, rank: int) -> Role:
        """The role that ``rank`` belongs to."""
        for role in self.roles:
            if rank in role.ranks:
                return role
        raise TraceSchemaError(f"rank {rank} belongs to no role (world size {self.world_size})")

    def group_for(self, gid: str, rank: int) -> str:
        """The group of ``gid``'s family that contains ``rank`` (``gid`` itself for the captured rank)."""
        if self._family_index is None:
            index: dict[str, dict[int, str]] = {}
            for g, info in self.groups.items():
                fam = index.setdefault(info.family or g, {})
                for r in info.ranks:
                    fam.setdefault(r, g)
            self._family_index = index
        info = self.groups[gid]
        fam = self._family_index[info.family or gid]
        if rank not in fam:
            raise TraceSchemaError(
                f"no group of family {info.family or gid!r} contains rank {rank}; the family "
                f"covers ranks {sorted(fam)[:8]}..."
            )
        return fam[rank]

    def peer_global(self, gid: str, peer: int, rank: int) -> int:
        """Global rank of group-rank ``peer`` in the family member of ``gid`` that holds ``rank``."""
        return self.groups[self.group_for(gid, rank)].ranks[peer]


# --------------------------------------------------------------------------------------------
# Serialisation


def flop_totals(trace: Trace) -> dict[str, float]:
    """FLOPs of one iteration summed over *all* ranks (each role's ops times its rank count).

    - ``model``: Megatron's MFU numerator, GEMM + attention FLOPs, attention counted full,
      recomputation excluded (the 72·B·s·l·h²·(1 + s/6h + V/12lh) of Narayanan et al., SC'21, eq. 3).
    - ``hardware``: the same with recomputation included (their 96·B·s·l·h²·(...) with full recompute).
    - ``executed``: every op's executed FLOPs, causal attention as a flash kernel computes it.
    """
    import numpy as np

    model = hardware = executed = 0.0
    for role in trace.roles:
        # Each distinct block's addends are listed once (an op that adds nothing is left out:
        # x + 0.0 == x); the sums then run over the program with cumsum, which adds one element
        # after another in order (unlike np.sum), so they equal a plain loop over every op bit for bit.
        adds: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for b in dict.fromkeys(seg.block for seg in role.program):
            cols = role.blocks[b].columns
            es, hs, ms = [], [], []
            for kc, ph, f, ff in zip(cols["kernel_class"], cols["phase"], cols["flops"], cols["flops_full"]):
                es.append(f)
                if kc in ("gemm", "attention", "ssm"):
                    hs.append(ff)
                    if ph != "recompute":
                        ms.append(ff)
            adds[b] = (np.asarray(es, dtype=np.float64), np.asarray(hs, dtype=np.float64),
                       np.asarray(ms, dtype=np.float64))
        e, h, m = (float(np.cumsum(np.concatenate([np.zeros(1)] + [adds[seg.block][i] for seg in role.program]))[-1])
                   for i in range(3))
        k = len(role.ranks)
        model += m * k
        hardware += h * k
        executed += e * k
    return {"model": model, "hardware": hardware, "executed": executed}
