"""CUDA streams, events and communication waits of a captured rank, as the trace needs them.

The replay engine runs every compute op of a rank on one compute stream, in program order, and
each collective / p2p op on its own communication stream; a ``wait`` op blocks the compute stream
until a communication op has finished (``heterosim/trace/ir.py``). What the script's streams
decide is therefore *where the compute stream waits*:

- ``work.wait()`` (and a synchronous collective, which waits at once) makes the *current* stream
  wait, as ProcessGroupNCCL does: on the default stream that is a ``wait`` op; on a side stream it
  is remembered as that stream's pending waits and costs the compute stream nothing yet;
- ``event.record(s)`` takes stream ``s``'s pending waits; ``t.wait_event(e)`` / ``e.wait(t)`` /
  ``t.wait_stream(s)`` hand them to stream ``t`` (a ``wait`` op when ``t`` is the default
  stream); ``torch.cuda.synchronize()`` / ``Stream.synchronize()`` / ``Event.synchronize()``
  block the host, so the compute stream waits for what they cover (a device-wide synchronize:
  every communication op issued and not yet waited for).

So FSDP2's all-gather on its own stream, waited for through an event right before the layer that
needs it, overlaps the compute issued in between, as on a GPU.

Approximations: compute issued on a side stream runs on the one compute stream in program order
(concurrent kernels are not modelled: a side stream's kernels in these stacks are copies that are
small next to the GEMMs); a collective issued on a side stream still starts only after the compute
issued before it (replay's rule for every collective, ``replay/reference.py``), where on a GPU it
waits only for its own stream's earlier work.
"""

from __future__ import annotations

from typing import Any, Callable

import torch.distributed as dist
from torch.futures import Future

__all__ = ["FakeStream", "FakeEvent", "StreamTracker", "RecWork"]


class FakeStream:
    """``torch.cuda.Stream`` during capture: an id the tracker keys pending waits by."""

    def __init__(self, device: Any = None, priority: int = 0, *, _tracker: "StreamTracker | None" = None,
                 **_: Any) -> None:
        self._tracker = _tracker if _tracker is not None else _active()
        self.stream_id, self.priority = self._tracker.next_stream_id(), priority
        self.device = "cuda"
        self.device_index = 0
        self.cuda_stream = self.stream_id
        self.after: set[int] = set()
        """Ops (program positions) its next op must follow: what the stream synchronized with since."""
        self.last = -1
        """Position of the last op issued on this stream."""
        self._tracker._all.append(self)

    def wait_stream(self, stream: "FakeStream") -> None:
        self._tracker.wait_stream(self, stream)

    def wait_event(self, event: "FakeEvent") -> None:
        event.wait(self)

    def record_event(self, event: "FakeEvent | None" = None) -> "FakeEvent":
        event = event if event is not None else FakeEvent()
        event.record(self)
        return event

    def synchronize(self) -> None:
        self._tracker.host_sync(self._tracker.pending_of(self))

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        return False  # no CUDA graphs during capture

    def __enter__(self) -> "FakeStream":  # ``with stream:`` as torch.cuda.Stream allows
        self._prev = self._tracker.set_current(self)
        return self

    def __exit__(self, *exc: Any) -> bool:
        self._tracker.set_current(self._prev)
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeStream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(("stream", self.stream_id))

    def __repr__(self) -> str:
        return f"<fake cuda stream {self.stream_id}>"


class FakeEvent:
    """``torch.cuda.Event`` during capture: the communication waits of the stream it was recorded on."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 **_: Any) -> None:
        self._targets: frozenset[int] = frozenset()
        self._epoch = -1
        self._after: frozenset[int] = frozenset()

    @property
    def targets(self) -> frozenset[int]:
        """Communication ops covered (none once an iteration boundary restarted op ids)."""
        return self._targets if self._epoch == _active().epoch else frozenset()

    def record(self, stream: FakeStream | None = None) -> None:
        tracker = _active()
        stream = stream if stream is not None else tracker.current
        self._epoch = tracker.epoch
        self._targets = frozenset(tracker.pending_of(stream))
        self._after = tracker.covered(stream)

    def wait(self, stream: FakeStream | None = None) -> None:
        tracker = _active()
        stream = stream if stream is not None else tracker.current
        tracker.stream_waits(stream, self.targets)
        if self._epoch == tracker.epoch:
            tracker.follow(stream, self._after)

    def synchronize(self) -> None:
        _active().host_sync(self.targets)

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: "FakeEvent") -> float:
        return 0.0  # no clock runs during capture; the replay says how long things take


_ACTIVE: list["StreamTracker"] = []


def _active() -> "StreamTracker":
    if not _ACTIVE:
        raise RuntimeError("a fake CUDA event was used outside a capture")
    return _ACTIVE[-1]


class StreamTracker:
    """The current stream and, per stream, the communication ops its next work must wait for.

    ``emit(target)`` records a ``wait`` op of the compute stream on communication op ``target``.
    """

    def __init__(self, emit: Callable[[int], None], position: Callable[[], int],
                 on_host_sync: Callable[[], None] | None = None) -> None:
        self.emit = emit
        self.on_host_sync = on_host_sync
        """Called when the host waits for the device (a ``synchronize``): the recorder marks a host sync."""
        self.position = position
        self._all: list[FakeStream] = []
        self._streams = 0
        self.open: dict[int, None] = {}
        self.default = FakeStream(_tracker=self)
        self.current = self.default
        self.epoch = 0
        self.reset()

    def activate(self) -> None:
        _ACTIVE.append(self)

    def deactivate(self) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    def reset(self) -> None:
        """Forget pending waits (an iteration restarts op ids, so old targets mean nothing)."""
        self.pending: dict[int, set[int]] = {}
        self.waited: set[int] = set()
        self.open = {}  # issued, not yet waited for by the compute stream, in issue order
        self.epoch += 1
        for s in self._all:
            s.after, s.last = set(), -1

    def next_stream_id(self) -> int:
        self._streams += 1
        return self._streams - 1

    def issue(self, op: int) -> None:
        """Communication op ``op`` was issued (a device-wide synchronize waits for it)."""
        self.open[op] = None

    def outstanding(self) -> list[int]:
        """Communication ops issued in this iteration and not yet waited for by the compute stream."""
        return list(self.open)

    def waited_in_block(self, target: int) -> None:
        """The compute stream waited for ``target`` through a wait op of a referenced block (no op
        to emit: the block holds it)."""
        self.waited.add(target)
        self.open.pop(target, None)

    def set_current(self, stream: FakeStream | None) -> FakeStream:
        prev, self.current = self.current, stream if stream is not None else self.default
        return prev

    def pending_of(self, stream: FakeStream) -> set[int]:
        return self.pending.get(stream.stream_id, set())

    def wait(self, target: int) -> None:
        """The current stream waits for communication op ``target`` (``work.wait()``)."""
        self.stream_waits(self.current, (target,))

    def stream_waits(self, stream: FakeStream, targets: Any) -> None:
        if stream.stream_id == 0:
            self.host_wait(targets)
        elif targets:
            self.pending.setdefault(stream.stream_id, set()).update(targets)

    def wait_stream(self, waiter: FakeStream, waitee: FakeStream) -> None:
        self.stream_waits(waiter, set(self.pending_of(waitee)))
        self.follow(waiter, self.covered(waitee))

    def covered(self, stream: FakeStream) -> frozenset[int]:
        """The ops that ``stream``'s work so far stands for (what an event recorded on it now
        covers): the last op issued, for the default stream (program order covers the rest)."""
        if stream.stream_id == 0:
            return frozenset({self.position() - 1})
        return frozenset(stream.after | {stream.last})

    def follow(self, stream: FakeStream, ops: frozenset[int]) -> None:
        if stream.stream_id != 0:
            stream.after |= ops

    def side_after(self, op: int) -> tuple[int, ...] | None:
        """Op ``op`` is being issued: the ops it must follow on its side stream (its previous op
        and what the stream synchronized with); None on the default stream."""
        s = self.current
        if s.stream_id == 0:
            return None
        after = tuple(sorted(a for a in s.after | {s.last} if a >= 0))
        s.after, s.last = set(), op
        return after

    def host_sync(self, targets: Any) -> None:
        """The host waits (``synchronize``): the compute stream waits for ``targets``, and the op
        issued next is a host sync (``capture/hostsync.py``). NB: ``Event.synchronize`` and
        ``Stream.synchronize`` are taken as waiting for the whole compute stream, not only the
        work before the event or on that stream."""
        self.host_wait(targets)
        if self.on_host_sync is not None:
            self.on_host_sync()

    def host_wait(self, targets: Any) -> None:
        """The compute stream waits for every op of ``targets`` (once each)."""
        for t in sorted(targets):
            if t not in self.waited:
                self.waited.add(t)
                self.open.pop(t, None)
                self.emit(t)


class RecWork(dist.Work):
    """Python Work handed to the script in place of the fake backend's, so ``wait()`` is recorded."""

    def __init__(self, wait: Callable[[int], None], comm_ids: tuple[int, ...], result: Any) -> None:
        super().__init__()
        self._wait, self.comm_ids, self.waited = wait, comm_ids, False
        self._fut: Future = Future()
        self._fut.set_result(result)

    def wait(self, timeout: Any = None) -> bool:
        for cid in self.comm_ids:  # a grouped launch (gather, scatter) completes with all its ops
            self._wait(cid)
        if not self.waited:
            self.waited = True
            # Completed: NCCL lets go of the buffers, and so do we (the recorder keeps its works
            # for the whole iteration; holding results would keep every all-gather buffer alive).
            self._fut = Future()
            self._fut.set_result(None)
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> Future:
        return self._fut

    def synchronize(self) -> None:
        self.wait()
