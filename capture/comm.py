"""Collective and p2p ops as the dispatcher shows them: which collective, how many bytes, which group.

Bytes follow nccl-tests' "size" convention (``ir`` module docstring): all_reduce / broadcast /
reduce the buffer, all_gather the gathered output, reduce_scatter the unscattered input,
all_to_all what one rank sends, send/recv the message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from capture.opinfo import dtype_name, tensors_in
from heterosim.errors import CaptureError
from heterosim.trace.vocab import COLLECTIVES, P2P

__all__ = ["CommInfo", "describe_comm", "describe_comms", "find_group", "FAKE_KERNEL", "c10d_result"]

c10d = torch.ops.c10d
fc = torch.ops._c10d_functional

FAKE_KERNEL = object()
""":func:`c10d_result`'s answer for an op whose result it cannot tell: run it through FakeTensorMode."""

_FIRST_ARG, _WORK_ONLY = object(), object()
_RESULT_KIND: dict[Any, object] = {}  # op -> _FIRST_ARG | _WORK_ONLY | FAKE_KERNEL, from its schema


def _result_kind(func: Any) -> object:
    schema = func._schema
    returns = schema.returns
    if len(returns) == 1 and str(returns[0].type).endswith("Work"):
        return _WORK_ONLY
    if (len(returns) == 2 and str(returns[1].type).endswith("Work") and schema.arguments
            and str(returns[0].type) == str(schema.arguments[0].type)):
        return _FIRST_ARG
    return FAKE_KERNEL


def c10d_result(func: Any, args: Any) -> Any:
    """What a c10d op returns besides its work, without running it: its first argument for an op
    returning ``(first argument's type, Work)`` (the written buffers: ``broadcast_``, ``allreduce_``,
    ``_allgather_base_``...), as ``(that, None)``; None for an op returning a work alone (``send``,
    ``recv_``, ``reduce_``, the coalesced ops, some of which have no fake kernel at all);
    :data:`FAKE_KERNEL` otherwise. The recorder gives the script its own work
    (:class:`capture.streams.RecWork`) in place of the fake kernel's, and the fake process group
    moves no data, so the fake kernel has nothing else to say."""
    kind = _RESULT_KIND.get(func)
    if kind is None:
        kind = _RESULT_KIND[func] = _result_kind(func)
    if kind is _WORK_ONLY:
        return None
    if kind is _FIRST_ARG and args:
        return (args[0], None)
    return FAKE_KERNEL


@dataclass(frozen=True, slots=True)
class CommInfo:
    kind: str  # collective | p2p
    collective: str
    nbytes: int
    dtype: str
    peer: int
    written: tuple[torch.Tensor, ...]


def _nb(x: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(x))


# packet name -> (collective, which argument's bytes are the nccl-tests size, written argument)
_C10D = {
    "allreduce_": ("all_reduce", 0, 0),
    "allreduce_coalesced_": ("all_reduce", 0, 0),
    "broadcast_": ("broadcast", 0, 0),
    "reduce_": ("reduce", 0, 0),
    "_allgather_base_": ("all_gather", 0, 0),
    "allgather_": ("all_gather", 0, 0),
    "allgather_coalesced_": ("all_gather", 0, 0),
    "allgather_into_tensor_coalesced_": ("all_gather", 0, 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1, 0),
    "reduce_scatter_": ("reduce_scatter", 1, 0),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, 0),
    "alltoall_base_": ("all_to_all", 1, 0),
    "alltoall_": ("all_to_all", 1, 0),
    "barrier": ("barrier", None, None),
    "send": ("send", 0, None),
    "recv_": ("recv", 0, 0),
    "recv_any_source_": ("recv", 0, 0),
}

_FUNCTIONAL = {
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
}
assert {c for c, _, _ in _C10D.values()} | set(_FUNCTIONAL.values()) <= set(COLLECTIVES), "not trace vocabulary"


def describe_comm(func: Any, args: Any, kwargs: dict, out: Any) -> CommInfo:
    """What collective ``func`` is, its nccl-tests size in bytes, and the tensors it writes."""
    packet = func._overloadpacket.__name__
    if func.namespace == "c10d":
        if packet not in _C10D:
            raise CaptureError(f"unsupported c10d op {func}; supported: {sorted(_C10D)}")
        coll, size_arg, written_arg = _C10D[packet]
        nbytes = 0 if size_arg is None else _nb(args[size_arg])
        data = tensors_in(args[0]) if args and size_arg is not None else []
        written = tuple(tensors_in(args[written_arg])) if written_arg is not None else ()
        peer = int(args[2]) if coll in P2P else -1
        kind = "p2p" if coll in P2P else "collective"
        return CommInfo(kind, coll, nbytes, dtype_name(data[0].dtype) if data else "", peer, written)
    if packet not in _FUNCTIONAL:
        raise CaptureError(f"unsupported functional collective {func}; supported: {sorted(_FUNCTIONAL)}")
    coll = _FUNCTIONAL[packet]
    nbytes = _nb(args[0])
    if coll == "all_gather":  # functional all_gather takes the shard: size is the gathered output
        nbytes = _nb(out) if out is not None else nbytes * int(args[1])
    data = tensors_in(args[0])
    return CommInfo("collective", coll, nbytes, dtype_name(data[0].dtype) if data else "", -1, ())


_ROOTED = {"gather_": "gather", "scatter_": "scatter"}


def describe_comms(func: Any, args: Any, kwargs: dict, out: Any, pg: Any) -> list[CommInfo]:
    """The ops ``func`` is recorded as: one, or for a rooted gather / scatter the point-to-point
    messages ProcessGroupNCCL sends for it (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:
    ``gather`` and ``scatter`` are a group of ncclSend / ncclRecv between the root and each other
    rank; the root's own piece is a local copy, not recorded)."""
    packet = func._overloadpacket.__name__
    if func.namespace != "c10d" or packet not in _ROOTED:
        return [describe_comm(func, args, kwargs, out)]
    me = pg.rank()
    if packet == "gather_":  # gather_(output_tensors[][], input_tensors[], pg, root, timeout)
        outputs, inputs, root = args[0], args[1], int(args[3])
        if me != root:
            return [_p2p("send", inputs[0], root, ())]
        return [_p2p("recv", t, peer, (t,)) for peer, t in enumerate(outputs[0]) if peer != me]
    outputs, inputs, root = args[0], args[1], int(args[3])  # scatter_(outputs[], inputs[][], pg, root, ...)
    if me != root:
        return [_p2p("recv", outputs[0], root, (outputs[0],))]
    return [_p2p("send", t, peer, ()) for peer, t in enumerate(inputs[0]) if peer != me]


def _p2p(coll: str, t: torch.Tensor, peer: int, written: tuple) -> CommInfo:
    return CommInfo("p2p", coll, t.numel() * t.element_size(), dtype_name(t.dtype), peer, written)


def find_group(func: Any, args: Any, kwargs: dict) -> Any:
    """The ProcessGroup a c10d / functional op runs on (from its schema)."""
    from torch._C._distributed_c10d import _resolve_process_group

    for i, a in enumerate(func._schema.arguments):
        v = args[i] if i < len(args) else kwargs.get(a.name)
        if v is None:
            continue
        if "ProcessGroup" in str(a.type):
            return dist.ProcessGroup.unbox(v)
        if a.name in ("group_name", "tag_or_group") and isinstance(v, str):
            return _resolve_process_group(v)
    raise CaptureError(f"cannot find the process group of {func}")
