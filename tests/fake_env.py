"""Test helpers shared by the models tests: one rank of a fake world, and an annotator that
remembers the phase / micro-batch / chunk scope (what a capture's recorder would tag ops with)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.distributed.fake_pg import FakeStore

from heterosim import annotate


class TagAnnotator(annotate.Annotator):
    """Keeps ``tags`` = the innermost phase / mb / chunk scope in force."""

    def __init__(self) -> None:
        self.tags: dict = {}

    @contextlib.contextmanager
    def scope(self, *, phase=None, mb=None, chunk=None, gemm_dtype=None, comm_dtype=None, sm_margin=None,
              region=None) -> Iterator[None]:
        old = dict(self.tags)
        self.tags.update({k: v for k, v in (("phase", phase), ("mb", mb), ("chunk", chunk),
                                            ("comm_dtype", comm_dtype)) if v is not None})
        try:
            yield
        finally:
            self.tags = old


@contextlib.contextmanager
def fake_world(rank: int, world: int, annotator: annotate.Annotator | None = None,
               mode: Any = None) -> Iterator[None]:
    """``rank`` of a ``world``-rank fake process group under FakeTensorMode, with ``annotator``
    installed and ``mode`` (a TorchDispatchMode, e.g. a collective log) entered on top."""
    prev = annotate.set_annotator(annotator) if annotator is not None else None
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), (mode or contextlib.nullcontext()):
            yield
    finally:
        dist.destroy_process_group()
        if annotator is not None:
            annotate.set_annotator(prev)
