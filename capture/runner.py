"""Run a training script in-process as one fake rank and return what the recorder saw.

This is the body of one capture worker process (``python -m capture.worker``): it sets torchrun's
environment, patches torch.distributed into the fake world, installs the torch.cuda shims and the
recorder (also as the ``heterosim.annotate`` annotator), enters FakeTensorMode and runs the script as
``__main__``. A process can run this once: torch.distributed's global state is per process.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from capture.extensions import CudaExtensions
from capture.fakecuda import FakeCuda
from capture.hostdata import HostData
from capture.objectp2p import ObjectP2P, answerers
from capture import pipelining
from capture.recompute import RecomputeTagger
from capture.fakeworld import FakeWorld, GroupRecord, torchrun_env
from heterosim.cluster.gpus import get_gpu
from heterosim.trace.ir import COLUMNS, Block, Segment
from heterosim.trace.memory import RoleMemory
from capture.iterations import StopCapture
from capture.recorder import Recorder
from heterosim.errors import ScriptError
from heterosim.annotate import set_annotator

__all__ = ["RankCapture", "run_rank", "DEFAULT_GPU"]

DEFAULT_GPU = "H100"
"""The GPU the fake CUDA device reports unless ``--gpu`` names another (its properties only: the
trace is priced for any GPU at replay)."""


@dataclass(slots=True)
class RankCapture:
    """One rank's recording, JSON-serialisable through :meth:`to_json` / :meth:`from_json`."""

    rank: int
    world_size: int
    blocks: dict[str, Block]
    program: list[Segment]
    groups: list[GroupRecord]
    layout: dict[str, Any]
    model: dict[str, Any]
    iterations: int
    torch_version: str
    memory: RoleMemory | None = None
    iteration_info: dict[str, Any] | None = None
    """:meth:`capture.iterations.IterationClock.describe` of the run."""

    def to_json(self) -> dict:
        return {
            "memory": None if self.memory is None else self.memory.to_json(),
            "rank": self.rank,
            "world_size": self.world_size,
            "blocks": {b: {c: blk.columns[c] for c in COLUMNS} for b, blk in self.blocks.items()},
            "program": [[s.block, s.mb, s.chunk] for s in self.program],
            "groups": [[g.gid, list(g.ranks), g.family, g.dim] for g in self.groups],
            "layout": self.layout,
            "model": self.model,
            "iterations": self.iterations,
            "torch_version": self.torch_version,
            "iteration_info": self.iteration_info,
        }

    @staticmethod
    def from_json(d: dict) -> "RankCapture":
        return RankCapture(
            rank=d["rank"],
            world_size=d["world_size"],
            blocks={b: Block(cols) for b, cols in d["blocks"].items()},
            program=[Segment(b, mb, ch) for b, mb, ch in d["program"]],
            groups=[GroupRecord(g, tuple(r), f, dim) for g, r, f, dim in d["groups"]],
            layout=d["layout"],
            model=d["model"],
            iterations=d["iterations"],
            torch_version=d["torch_version"],
            memory=_memory(d.get("memory"), d["blocks"], len(d["program"])),
            iteration_info=d.get("iteration_info"),
        )


def _memory(d: dict | None, blocks: dict, nsegments: int) -> RoleMemory | None:
    if d is None:
        return None
    return RoleMemory.from_json(d, "rank capture", {b: cols["kind"] for b, cols in blocks.items()}, nsegments)


def _jsonable(d: dict) -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
        elif isinstance(v, (list, tuple)):
            out[k] = [x if isinstance(x, (str, int, float, bool)) or x is None else str(x) for x in v]
        else:
            out[k] = str(v)
    return out


class _StderrTail:
    """sys.stderr for the script: written through, and its last lines kept, so that a script
    that exits with an error (argparse's usage message) says why in the ScriptError too, where a
    library caller (a notebook) reads it."""

    LINES = 8

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._lines: collections.deque[str] = collections.deque(maxlen=self.LINES)
        self._part = ""

    def write(self, text: str) -> int:
        self._stream.write(text)
        lines = (self._part + text).split("\n")
        self._part = lines.pop()[-500:]
        self._lines.extend(line[-500:] for line in lines if line.strip())
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding ... of the real stream
        return getattr(self._stream, name)

    def said(self) -> str:
        lines = [*self._lines, *([self._part] if self._part.strip() else [])]
        return "; its last error output:\n" + "\n".join(f"  {x}" for x in lines) if lines else ""


def _hint(e: Exception) -> str:
    """A fix for the failures every new script meets."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    if isinstance(e, (DataDependentOutputException, DynamicOutputShapeException)):
        return ("\nTensors hold no data during capture: the script read values (.tolist(), print of a "
                "tensor, nonzero, boolean indexing; a single .item() reads 0). Skip that code while capturing, e.g. "
                "`if not heterosim.annotate.get_annotator().active: print(loss.item())`.")
    return ""


VALUE_NUMEL_LIMIT = 1 << 16
"""Tensors made from Python data (``torch.tensor(list)``) up to this many elements keep their
values under FakeTensorMode (its ``CONSTANT_NUMEL_LIMIT``, 1 by default), through every op whose
inputs all have values, c10d collectives included (the fake process group moves no data, so a
broadcast leaves each rank its own values: the agreement every rank of a capture shares). So a
framework's cross-rank consistency checks (DeepSpeed ZeRO-3 broadcasts its module order and
compares) read what they compare."""


@contextlib.contextmanager
def _values_kept() -> Any:
    import torch._subclasses.fake_tensor as fake_tensor

    saved = fake_tensor.CONSTANT_NUMEL_LIMIT
    fake_tensor.CONSTANT_NUMEL_LIMIT = max(saved, VALUE_NUMEL_LIMIT)
    try:
        yield
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = saved


def _positions(world: FakeWorld, pg: Any, src: int, dst: int) -> tuple[str, int, int] | None:
    """``(family, src position, dst position)`` of two global ranks in group ``pg``
    (:mod:`capture.objectp2p`'s mailbox keys)."""
    g = world.groups[int(world.gid_of(pg))]
    return (g.family, g.ranks.index(src), g.ranks.index(dst)) if src in g.ranks and dst in g.ranks else None


def run_rank(script: str, script_args: list[str], rank: int, world_size: int, nproc_per_node: int,
             gpu: str = DEFAULT_GPU, iterations: int | None = None, module: bool = False) -> RankCapture:
    """Run ``script`` as ``rank`` of a ``world_size`` job in the fake world; raise ScriptError on failure.

    ``gpu`` names the GPU the fake CUDA device reports (``torch.cuda.get_device_properties``);
    ``iterations``: stop the script once that many iterations are complete (:mod:`capture.iterations`).
    ``module``: ``script`` names a module, run as ``python -m`` runs it (``torchrun -m``).
    """
    spec = get_gpu(gpu)
    os.environ.update(torchrun_env(rank, world_size, nproc_per_node))
    world = FakeWorld(rank=rank, world_size=world_size)
    world.install()
    objects = ObjectP2P(functools.partial(_positions, world))
    objects.install()
    answerers.append(pipelining.answer)
    recorder = Recorder(world, stop_after=iterations)
    cuda = FakeCuda(recorder.streams, recorder.mem, spec, nproc_per_node)
    cuda.on_host_copy = recorder.host_copy
    cuda.install()
    host_data = HostData(recorder.quiet)
    host_data.install()
    extensions = CudaExtensions()
    previous = set_annotator(recorder)
    recompute = RecomputeTagger(recorder.scope)
    recompute.install()
    old_argv, old_path, old_stderr = sys.argv, list(sys.path), sys.stderr
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.getcwd() if module else os.path.dirname(os.path.abspath(script)))
    extensions.install()  # after the script's directory is on the path: its own modules win
    sys.stderr = tail = _StderrTail(old_stderr)
    try:
        with _values_kept(), FakeTensorMode(allow_non_fake_inputs=True), recorder:
            try:
                if module:
                    runpy.run_module(script, run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(script, run_name="__main__")
            except StopCapture:
                pass  # --iterations reached: the rest of the script is not needed
            except SystemExit as e:
                if e.code not in (None, 0):
                    raise ScriptError(
                        f"{script} exited with status {e.code} as rank {rank}"
                        + (f": {e.code}" if isinstance(e.code, str) else "") + tail.said()
                    ) from None
            except Exception as e:
                tb = traceback.format_exc()
                raise ScriptError(f"{script} raised {type(e).__name__} as rank {rank}:\n{tb}{_hint(e)}") from e
        blocks, program = recorder.finish()
    finally:
        sys.argv, sys.path[:], sys.stderr = old_argv, old_path, old_stderr
        recompute.uninstall()
        set_annotator(previous)
        host_data.uninstall()
        extensions.uninstall()
        cuda.uninstall()
        answerers.remove(pipelining.answer)
        objects.uninstall()
        world.uninstall()
    return RankCapture(
        rank=rank,
        world_size=world_size,
        blocks=blocks,
        program=program,
        groups=list(world.groups),
        layout=_jsonable(recorder.layout),
        model=_jsonable(recorder.model),
        iterations=recorder.iterations_seen,
        iteration_info=recorder.clock.describe(),
        torch_version=torch.__version__,
        memory=recorder.memory,
    )
