"""Python objects sent between fake ranks: ``send_object_list`` / ``recv_object_list``.

A fake rank receives no data, and an object is data: ``recv_object_list`` unpickles bytes its peer
sent (torch 2.13 reads them back with ``.numpy()``, which a FakeTensor refuses). A fake rank can
know what its peer sends only from the peer's own run, so the captured ranks of one capture share a
*mailbox* (a directory the parent creates, :func:`mailbox`): every object a rank sends is written
there, and a receive reads it. Senders are keyed by position, not by rank: ``(family of the group,
sender's rank in the group, receiver's rank in the group, n-th object on that pair)``; all groups of
a family run the same code at the same positions, so what rank 0 sends to rank 16 on its pipeline
group is what rank 1 would send to rank 17 on its own (the same assumption roles make).

A receive is answered, in order, by the mailbox (waiting while a sender started earlier may still
be running, :data:`WAIT_ENV`); by an *answerer* that knows the protocol in progress
(:mod:`capture.pipelining`: a pipeline stage's gradient metadata is its output metadata, as torch's
own static mode derives it), which never waits; else :class:`ObjectNotSentError` says which rank
would have to run first. Both sides record the two messages NCCL carries (the objects' sizes, then
their pickled bytes) on fake tensors, so sends and receives match in count and size.

Ranks are captured in ascending order (rank 0 alone first, to find the roles), so objects sent to
higher ranks are found: a pipeline's forward metadata flows from stage k to k+1. Not supported:
an object a rank receives from a higher rank with no answerer (an interleaved pipeline's last
stage sending to the first rank's second chunk, when the first rank runs alone).
"""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from heterosim.atomic import atomic_write_bytes
from heterosim.errors import ScriptError

__all__ = ["ObjectP2P", "ObjectNotSentError", "MAILBOX_ENV", "WAIT_ENV", "answerers"]

MAILBOX_ENV = "HETEROSIM_CAPTURE_MAILBOX"
"""The directory the captured ranks of one capture share objects through (unset: none shared)."""
WAIT_ENV = "HETEROSIM_CAPTURE_MAILBOX_WAIT_S"
"""Seconds a receive waits for a sender that may be running beside it (0 when a rank runs alone)."""
POLL_S = 0.05

Answerer = Callable[[int, int], "list[Any] | None"]
answerers: list[Answerer] = []
"""Called as ``answer(src_global_rank, n_objects)`` when the mailbox has nothing: the objects the
peer sends under a protocol the answerer recognises (from the call stack), or None."""


class ObjectNotSentError(ScriptError):
    """A fake rank receives an object no captured rank has sent and nothing can derive."""


class ObjectP2P:
    """Patches ``dist.send_object_list`` / ``dist.recv_object_list`` for one fake rank."""

    def __init__(self, family_of: Callable[[Any], tuple[str, int, int] | None]) -> None:
        """``family_of(group, src, dst)``: ``(family, src position, dst position)`` of a pair of
        global ranks in ``group`` (None: the group's family is not known)."""
        self._family_of = family_of
        self._count: dict[str, int] = {}
        self._saved: list[tuple[str, Any]] = []

    def _key(self, group: Any, src: int, dst: int) -> str:
        fam = self._family_of(group, src, dst)
        base = f"{fam[0]}-{fam[1]}-{fam[2]}" if fam else f"ranks-{src}-{dst}"
        n = self._count.get(base, 0)
        self._count[base] = n + 1
        return f"{base}-{n}.pkl"

    def install(self) -> None:
        import torch.distributed.distributed_c10d as c10d

        box = os.environ.get(MAILBOX_ENV)
        wait_s = float(os.environ.get(WAIT_ENV, "0"))
        p2p = self

        def send_object_list(object_list: list[Any], dst: int | None = None, group: Any = None,
                             device: Any = None, group_dst: int | None = None, use_batch: bool = False) -> None:
            g = c10d._group_or_default_group(group)
            gdst = c10d._canonicalize_group_rank(g, dst, group_dst)
            dst_global = dist.get_global_rank(g, gdst)
            _transfer("send", list(object_list), g, gdst, device, use_batch)
            key = p2p._key(g, dist.get_rank(), dst_global)
            if box:
                atomic_write_bytes(Path(box) / key, pickle.dumps(list(object_list)))

        def recv_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                             device: Any = None, group_src: int | None = None, use_batch: bool = False) -> int:
            g = c10d._group_or_default_group(group)
            gsrc = c10d._canonicalize_group_rank(g, src, group_src)
            src_global = dist.get_global_rank(g, gsrc)
            key = p2p._key(g, src_global, dist.get_rank())
            objects = _answer(box, key, wait_s, src_global, len(object_list))
            if len(objects) != len(object_list):
                raise ScriptError(f"recv_object_list expects {len(object_list)} objects from rank {src_global}; "
                                  f"it sent {len(objects)}")
            _transfer("recv", objects, g, gsrc, device, use_batch)
            object_list[:] = objects
            return src_global

        for name, fn in (("send_object_list", send_object_list), ("recv_object_list", recv_object_list)):
            self._saved.append((name, getattr(c10d, name)))
            setattr(c10d, name, fn)
            setattr(dist, name, fn)

    def uninstall(self) -> None:
        import torch.distributed.distributed_c10d as c10d

        for name, fn in reversed(self._saved):
            setattr(c10d, name, fn)
            setattr(dist, name, fn)
        self._saved.clear()


def _answer(box: str | None, key: str, wait_s: float, src: int, n: int) -> list[Any]:
    path = Path(box) / key if box else None
    if path is not None and path.exists():
        return pickle.loads(path.read_bytes())
    for answer in answerers:
        got = answer(src, n)
        if got is not None:
            return got
    deadline = time.monotonic() + wait_s
    while path is not None and time.monotonic() < deadline:
        time.sleep(POLL_S)
        if path.exists():
            return pickle.loads(path.read_bytes())
    raise ObjectNotSentError(
        f"rank {dist.get_rank()} receives a Python object (recv_object_list) from rank {src}, which no "
        "rank captured before it sent: a fake rank holds no data, so it can only be handed what a "
        "captured peer sent (ranks run in ascending order, rank 0 alone first). "
        + ("" if box else "This run shares no mailbox (python -m capture.worker runs one rank alone). ")
        + "Pass the shapes the object describes to the script statically where it allows it.")


def _transfer(op: str, objects: list[Any], group: Any, peer: int, device: Any, use_batch: bool) -> None:
    """The two sends or receives an object message is (its sizes, then its pickled bytes), as
    ``send_object_list`` / ``recv_object_list`` issue them: recorded alike on both sides."""
    sizes = [len(pickle.dumps(o)) for o in objects]
    dev = device or dist.distributed_c10d._get_object_coll_device(group)
    for t in (torch.empty(len(objects), dtype=torch.long, device=dev),
              torch.empty(sum(sizes), dtype=torch.uint8, device=dev)):
        if use_batch:
            fn = dist.isend if op == "send" else dist.irecv
            dist.batch_isend_irecv([dist.P2POp(fn, t, group_peer=peer, group=group)]).pop().wait()
        elif op == "send":
            dist.send(t, group=group, group_dst=peer)
        else:
            dist.recv(t, group=group, group_src=peer)
