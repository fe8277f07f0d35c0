"""Device memory per rank: the captured peak plus what the GPU holds beside it, against capacity.

What a rank needs = the caching allocator's reserved peak (:func:`heterosim.trace.memory.memory_peak`:
512-byte blocks, own 2 MiB-rounded segments for requests of 10 MiB and more, one partly used
segment per pool) + the CUDA context + NCCL's communication buffers. It is compared with the
memory of the rank's GPU type from the GPU registry (``heterosim/cluster/data/gpus.yaml``), so on
a heterogeneous cluster each GPU type is held to its own capacity.

Ignored: allocator fragmentation and block caching across sizes (``reserved`` can exceed this in
practice), ``expandable_segments``, per-stream pools, cuBLAS / cuDNN workspaces, NCCL's LL and
LL128 buffers and proxy memory, and memory other processes hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from heterosim.trace.ir import Role, Trace
from heterosim.trace.memory import MemoryPeak, memory_peak

__all__ = ["CUDA_CONTEXT_BYTES", "NCCL_BUFFSIZE", "NCCL_CHANNELS", "ClassMemory", "cuda_context_bytes",
           "nccl_buffer_bytes", "memory_report", "GIB"]

GIB = float(1 << 30)

CUDA_CONTEXT_BYTES: Mapping[str, int] = {"default": 500 << 20}
"""Device memory the CUDA context (with PyTorch's kernels loaded) takes on each GPU before any
tensor, by architecture; ``default`` for the rest. ~500 MiB is what ``nvidia-smi`` shows for a
fresh PyTorch process on A100 / H100 with lazy module loading (CUDA 11.7+, ``CUDA_MODULE_LOADING=LAZY``,
PyTorch's default); a documented estimate, not a measurement of this project."""

NCCL_BUFFSIZE = 4 << 20
"""NCCL_BUFFSIZE default, 4 MiB: "the size of the buffer used by NCCL when communicating data
between pairs of GPUs" (NCCL user guide, Environment Variables, NCCL_BUFFSIZE:
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-buffsize)."""

NCCL_CHANNELS = {"collective": 16, "p2p": 2}
"""Channels assumed per communicator: collectives on NVLink-class nodes run 16-32 rings; PyTorch
sends p2p over its own two-rank communicators, which NCCL gives NCCL_NCHANNELS_PER_NET_PEER (2)."""


def cuda_context_bytes(arch: str) -> int:
    """CUDA context bytes for a GPU architecture (:data:`CUDA_CONTEXT_BYTES`)."""
    return CUDA_CONTEXT_BYTES.get(arch, CUDA_CONTEXT_BYTES["default"])


def nccl_buffer_bytes(trace: Trace, role: Role) -> int:
    """NCCL buffers of one rank of ``role``: per communicator it uses, channels x 2 peers (the
    ring's previous and next rank, or a p2p pair's two directions) x NCCL_BUFFSIZE."""
    comms: set[tuple[str, int]] = set()
    for b in {s.block for s in role.program}:
        cols = role.blocks[b].columns
        for kind, g, peer in zip(cols["kind"], cols["group"], cols["peer"]):
            if kind == "collective" and len(trace.groups[g].ranks) > 1:
                comms.add((g, -1))
            elif kind == "p2p":
                comms.add((g, peer))
    return sum(NCCL_CHANNELS["p2p" if peer >= 0 else "collective"] * 2 * NCCL_BUFFSIZE for _, peer in comms)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassMemory:
    """Memory of the ranks of one role on one GPU type (all alike)."""

    ranks: tuple[int, ...]
    role: int
    gpu_type: str
    peak: MemoryPeak
    cuda_context: int
    nccl_buffers: int
    capacity: int

    @property
    def needed(self) -> int:
        """Bytes the rank needs on its GPU: reserved peak + CUDA context + NCCL buffers."""
        return self.peak.reserved + self.cuda_context + self.nccl_buffers

    @property
    def out_of_memory(self) -> bool:
        return self.needed > self.capacity

    def to_dict(self, ranges: Any) -> dict[str, Any]:
        return {"ranks": ranges(self.ranks), "num_ranks": len(self.ranks), "role": self.role,
                "gpu_type": self.gpu_type, "needed": self.needed, "capacity": self.capacity,
                "out_of_memory": self.out_of_memory, "cuda_context": self.cuda_context,
                "nccl_buffers": self.nccl_buffers, **self.peak.to_dict()}

    def line(self, ranges: Any) -> str:
        parts = ", ".join(f"{c} {_size(v)}" for c, v in self.peak.at_peak.items() if v)
        head = "OUT OF MEMORY" if self.out_of_memory else "memory"
        return (f"  {head} on ranks {ranges(self.ranks)} ({self.gpu_type}): needs {_size(self.needed)} "
                f"of {_size(self.capacity)} (peak allocated {_size(self.peak.allocated)}: {parts}; "
                f"reserved {_size(self.peak.reserved)}, CUDA context {_size(self.cuda_context)}, "
                f"NCCL {_size(self.nccl_buffers)})")


def _size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def memory_report(trace: Trace, gpu_type: Sequence[str], gpu_spec: Any) -> tuple[ClassMemory, ...]:
    """One entry per (role, GPU type) with memory recorded; empty for traces without memory.

    ``gpu_type[r]`` is rank ``r``'s GPU type, ``gpu_spec(name)`` its registry entry (``hbm_bytes``, ``arch``).
    """
    out = []
    for role in trace.roles:
        if role.memory is None:
            continue
        peak = memory_peak(role.memory, role.program)
        nccl = nccl_buffer_bytes(trace, role)
        by_gpu: dict[str, list[int]] = {}
        for r in role.ranks:
            by_gpu.setdefault(gpu_type[r], []).append(r)
        for g, ranks in sorted(by_gpu.items()):
            spec = gpu_spec(g)
            out.append(ClassMemory(ranks=tuple(ranks), role=role.id, gpu_type=g, peak=peak,
                                   cuda_context=cuda_context_bytes(spec.arch), nccl_buffers=nccl,
                                   capacity=int(spec.hbm_bytes)))
    return tuple(out)
