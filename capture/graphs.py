"""CUDA graphs during capture: ``torch.cuda.CUDAGraph``, ``torch.cuda.graph(...)`` and ``graph.replay()``.

On a GPU, capturing a graph runs nothing: the kernels issued inside ``with torch.cuda.graph(g):``
are recorded into ``g``, and every ``g.replay()`` later launches all of them with one
``cudaGraphLaunch`` — one CPU dispatch for many kernels (NVIDIA, *Getting Started with CUDA
Graphs*, 2019: the launch overhead is paid once per graph instead of once per kernel).

During capture the script's code inside the context runs on fake tensors as usual (its outputs are
the graph's static outputs), but the recorder keeps its ops aside (:class:`GraphRecorder`); each
``replay()`` appends them to the trace with the ``launch`` column set: ``graph`` on the first op
(it carries the CPU cost of the replay) and ``in_graph`` on the others (no CPU cost). Replay's host
model charges the graph one ``nograd`` dispatch (``replay/host.py``); the GPU runs every kernel as
priced. ``torch.cuda.make_graphed_callables`` works through these (its warm-up runs are eager, as
on a GPU).

Known limitations:

- NB: a graph holds compute only: a collective, p2p or wait recorded inside a capture raises
  (NCCL in graphs, Megatron's full-iteration graphs, are not captured).
- NB: the data dependencies between a graph's ops, and from them to eager ops, are not recorded
  (the graph's ops run in order on the compute stream, which is what replay uses).
- NB: the replay's own ops take the phase the replay runs in (forward, backward, optimizer); their
  kernel classes are those of the capture.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

__all__ = ["GraphRecorder", "FakeCUDAGraph"]


class FakeCUDAGraph:
    """``torch.cuda.CUDAGraph`` during capture: the ops of its capture, appended at each replay."""

    _bound: "GraphRecorder | None" = None
    """The recorder of the class that :meth:`GraphRecorder.graphs_installed` binds (a class, so that
    ``torch.cuda.CUDAGraph`` stays usable in annotations such as ``CUDAGraph | None``)."""

    def __init__(self, recorder: "GraphRecorder | None" = None, keep_graph: bool = False) -> None:
        if isinstance(recorder, bool):  # CUDAGraph(keep_graph) positionally
            recorder, keep_graph = None, recorder
        self._recorder = recorder if recorder is not None else type(self)._bound
        self.rows: list[dict] | None = None
        """The captured ops (trace rows), None before ``capture_end``."""

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global", **_: Any) -> None:
        self._recorder.begin_graph()

    def capture_end(self) -> None:
        self.rows = self._recorder.end_graph()

    def replay(self) -> None:
        if self.rows is None:
            raise RuntimeError("CUDAGraph.replay() before its capture ended (capture with torch.cuda.graph(g) first)")
        self._recorder.replay_graph(self.rows)

    def instantiate(self) -> None:
        pass

    def reset(self) -> None:
        self.rows = None

    def pool(self) -> tuple[int, int]:
        return (0, id(self))

    def enable_debug_mode(self) -> None:
        pass

    def debug_dump(self, path: str) -> None:
        pass


class _GraphContext:
    """``torch.cuda.graph(g, pool=None, stream=None)`` during capture."""

    def __init__(self, cuda_graph: FakeCUDAGraph, pool: Any = None, stream: Any = None,
                 capture_error_mode: str = "global", **_: Any) -> None:
        self.cuda_graph = cuda_graph
        self.stream = stream

    def __enter__(self) -> None:
        torch.cuda.synchronize()  # as torch.cuda.graph does: the host waits before a capture
        self._stream_ctx = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        self._stream_ctx.__enter__()
        self.cuda_graph.capture_begin()

    def __exit__(self, *exc: Any) -> None:
        self.cuda_graph.capture_end()
        self._stream_ctx.__exit__(*exc)


class GraphRecorder:
    """Mixin of :class:`capture.recorder.Recorder`: keeps a capture's ops aside, replays them.

    ``_append`` calls :meth:`_divert` first: while a graph is being captured it takes the row.
    """

    graph_rows: list[dict] | None = None

    def begin_graph(self) -> None:
        if self.graph_rows is not None:
            raise RuntimeError("a CUDA graph capture began inside another one")
        self.graph_rows = []

    def end_graph(self) -> list[dict]:
        rows, self.graph_rows = self.graph_rows or [], None
        return rows

    def _divert(self, row: dict) -> bool:
        """Keep ``row`` for the graph being captured (True), or let ``_append`` record it (False)."""
        if self.graph_rows is None:
            return False
        if row["kind"] != "compute":
            raise NotImplementedError(
                f"{row['name']} inside a CUDA graph capture: capture records graphs of compute ops only; "
                "run communication outside torch.cuda.graph(...) while capturing (capture/graphs.py)")
        self.graph_rows.append(dict(row))
        return True

    def replay_graph(self, rows: list[dict]) -> None:
        """Append a graph's ops: one launch (``graph``) for all of them (``in_graph``)."""
        if self.suppress or self.clock.stopped or not rows:
            return
        if self.clock.step_ended and self.in_block is None and self.clock.step_boundary_due():
            self._step_boundary()
        phase = self._phase()[0]
        for i, row in enumerate(rows):
            self._append({**row, "deps": [], "phase": phase, "launch": "graph" if i == 0 else "in_graph"})

    @contextlib.contextmanager
    def graphs_installed(self) -> Iterator[None]:
        """Patch ``torch.cuda.CUDAGraph``, ``torch.cuda.graph``, ``graph_pool_handle`` and
        ``is_current_stream_capturing`` (and their ``torch.cuda.graphs`` names) for the capture."""
        import torch.cuda.graphs as graphs

        rec = self
        answers = {
            "CUDAGraph": type("CUDAGraph", (FakeCUDAGraph,), {"_bound": rec, "__module__": __name__}),
            "graph": _GraphContext,
            "graph_pool_handle": lambda: (0, 0),
            "is_current_stream_capturing": lambda: rec.graph_rows is not None,
        }
        saved = [(mod, name, mod.__dict__.get(name, _MISSING)) for mod in (torch.cuda, graphs) for name in answers]
        for mod, name, _ in saved:
            setattr(mod, name, answers[name])
        try:
            yield
        finally:
            for mod, name, old in saved:
                if old is _MISSING:
                    delattr(mod, name)
                else:
                    setattr(mod, name, old)


_MISSING = object()
