"""Annotations a training script can give the capture layer; no-ops when nothing is capturing.

The ground layer holds it so that neither side imports the other: capture installs its own
:class:`Annotator` with :func:`set_annotator` before it runs a script, and a script (the
schedules in ``models``, or a user's own loop) calls :func:`get_annotator` to mark
micro-batches, phases, repeatable blocks and process groups. Capture itself imports nothing of
``models``, so a user's own top-level ``models`` package is the one the script finds. Outside a
capture the default annotator does nothing but call the function it is given.

Example::

    ann = get_annotator()
    ann.declare(layout={"tp": 8, "pp": 8, "dp": 16}, model={"num_layers": 96})
    ann.label_group(tp_group, "tp")
    with ann.scope(phase="fwd", mb=3, chunk=0):
        out = ann.block(("fwd", 0, False), forward_step, inp)

Known limitations: :meth:`Annotator.block` is a promise by the caller that running ``fn`` again
with inputs of the same shapes would issue the same ops, and that its only effects seen later are
its returned tensors and gradient accumulation into parameters that already have a ``.grad``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Hashable, Iterator

__all__ = ["Annotator", "get_annotator", "set_annotator"]


class Annotator:
    """The do-nothing annotator; capture subclasses it to record."""

    @property
    def active(self) -> bool:
        """True while a capture is recording."""
        return False

    def declare(self, layout: dict[str, Any] | None = None, model: dict[str, Any] | None = None) -> None:
        """Declare the parallel layout (tp, pp, dp, cp, ep, vpp, micro/global batch...) and model config."""

    def label_group(self, group: Any, dim: str) -> None:
        """Say which parallel dimension (tp, dp, pp, cp, ep) a process group serves."""

    def iteration(self, index: int) -> None:
        """Mark the start of training iteration ``index``; capture keeps the last iteration."""

    @contextmanager
    def scope(
        self,
        *,
        phase: str | None = None,
        mb: int | None = None,
        chunk: int | None = None,
        gemm_dtype: str | None = None,
        comm_dtype: str | None = None,
        sm_margin: int | None = None,
        region: str | None = None,
        comm_kernel: bool | None = None,
    ) -> Iterator[None]:
        """Tag ops issued inside with a phase, micro-batch, model chunk, a GEMM dtype (``fp8``), the
        element type collectives move on the wire (``fp8``: one byte per element, as Transformer
        Engine's fp8 userbuffers do while the tensors here stay in the activation dtype), or the SMs
        a GEMM leaves to a communication kernel beside it (``sm_margin``: TE's ``set_sm_margin``).
        ``region`` names the ops for the capture alone, not in the trace (``block(bare_without=)``).
        ``comm_kernel``: the tensor ops inside are data movement a communication library's own kernels
        do while they send (DeepEP / HybridEP gather the rows they send and sum the rows they
        receive): recorded with kernel class ``comm``, so they take no compute time of their own."""
        yield

    def block(self, key: Hashable, fn: Callable[..., Any], *args: Any, bare_key: Hashable | None = None,
              bare_without: str | None = None, any_chunk: bool = False, shared_waits: bool = False) -> Any:
        """Run ``fn(*args)``; a capture may run it once per ``key`` and reference it afterwards.

        ``bare_key``: the key under which the same code, run when nothing it reads is still being
        communicated, records this block's ops less its waits on communication issued before it
        (Megatron's first micro-batch waits for the overlapped parameter all-gathers; the others
        run the same ops without waiting). A capture then references that block without running it.
        ``bare_without``: a region (``scope(region=)``) whose ops, issued inside this block, the bare
        block lacks too, with the waits on them (the gathers DDP's pre-hooks issue on the first
        micro-batch without pipelining: ``"param_gather"``).
        ``any_chunk``: ``key`` alone decides the ops, whichever model chunk (``scope(chunk=)``) runs
        them; by default a capture keys blocks by the chunk too.
        ``shared_waits``: a block that waits on communication issued before it may be referenced
        at a later call where the communication then outstanding is as it was at the recording
        (the same kinds and sizes, issued the same number of ops before); the caller then
        finishes its own bookkeeping of those works, which waits for nothing more
        (``ModelGradSync.param_sync_done`` after the first micro-batch's forward).
        """
        return fn(*args)

    def shard(self, tensor: Any, parts: int) -> None:
        """``tensor``'s storage stands for a buffer the real job splits over ``parts`` ranks (each
        holding one part): a capture counts 1/``parts`` of it in the rank's memory."""

    def release(self, tensor: Any) -> None:
        """Free ``tensor``'s storage now (``untyped_storage().resize_(0)``), as Megatron-core's
        schedule nodes free inputs no backward needs; a capture counts it as freed here."""
        tensor.untyped_storage().resize_(0)

    def discard(self, out: Any) -> None:
        """The autograd graph behind tensor ``out`` will not be run: a block referenced in its
        place stands for its backward, and that block's memory events free what the graph saved."""


_current: Annotator = Annotator()


def get_annotator() -> Annotator:
    """The annotator in force (the no-op one unless a capture installed its own)."""
    return _current


def set_annotator(annotator: Annotator | None) -> Annotator:
    """Install ``annotator`` (``None`` restores the no-op one); returns the previous one."""
    global _current
    previous = _current
    _current = annotator if annotator is not None else Annotator()
    return previous
