"""Training iterations of a captured script: where they start and end, and when to stop running it.

A trace holds one steady iteration. Its boundaries come from, in order of precedence:

1. the script's annotations (:meth:`heterosim.annotate.Annotator.iteration`, called at the start
   of each iteration; the bundled ``models/pretrain_gpt.py`` does);
2. ``torch.optim.Optimizer.step``: an iteration ends when the last optimizer step of a run of
   steps returns (global step pre/post hooks, so every optimizer counts, however it was made);
   the next one starts at the first op recorded after it outside any step. Steps that follow one
   another (one optimizer per parameter group, a GAN's two) end the same iteration;
3. none: the whole script is one iteration (the capture says so).

With boundaries, the trace keeps the last *complete* iteration: ops after the last boundary
(an evaluation, a checkpoint, the teardown) are dropped. The first iteration is not steady
(lazily created optimizer state, DDP's first-iteration bucket set-up), so a script should run at
least two; ``--iterations K`` stops the script once K iterations are complete, so a script written
to train for thousands of steps is captured in K.
"""

from __future__ import annotations

from typing import Any

__all__ = ["IterationClock", "StopCapture", "SOURCES"]

SOURCES = ("annotate", "optimizer.step", "none")
"""Where the iteration boundaries of a capture came from (the trace header says which)."""


class StopCapture(BaseException):
    """Raised into the script once ``--iterations`` iterations are complete.

    A ``BaseException`` so that a script's ``except Exception`` does not swallow it.
    """


class IterationClock:
    """Counts iterations and says when a boundary is due; the recorder acts on it."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.stop_after = stop_after
        self.source = "none"
        self.completed = 0
        """Iterations complete so far."""
        self.in_step = 0
        self.step_ended = False
        self.stopped = False
        self._hooks: list[Any] = []

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._hooks = [register_optimizer_step_pre_hook(self._pre), register_optimizer_step_post_hook(self._post)]

    def uninstall(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.in_step += 1

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.in_step = max(0, self.in_step - 1)
        if self.source != "annotate" and not self.in_step:
            self.step_ended = True

    def step_boundary_due(self) -> bool:
        """An optimizer step ended and an op outside any step is about to be recorded."""
        return self.step_ended and not self.in_step

    def end_by_step(self) -> None:
        """The iteration ended at an optimizer step; raise StopCapture if enough are complete."""
        self.step_ended = False
        self.source = "optimizer.step"
        self.completed += 1
        self._maybe_stop()

    def annotated(self) -> None:
        """The script marked the start of an iteration: the previous one (if any) is complete."""
        if self.source != "annotate":
            self.source, self.completed, self.step_ended = "annotate", 0, False
        self.completed += 1

    def annotated_stop_due(self) -> bool:
        return self.source == "annotate" and self.stop_after is not None and self.completed > self.stop_after

    def _maybe_stop(self) -> None:
        if self.stop_after is not None and self.completed >= self.stop_after:
            self.stopped = True
            raise StopCapture

    def describe(self) -> dict[str, Any]:
        """What the trace holds, for its header (``meta.iterations``): where boundaries came from,
        how many iterations ran, which one is kept (1-based; 0 = the whole script, no boundary)."""
        if self.source == "annotate":
            seen = self.completed - (1 if self.stopped else 0)
        elif self.source == "optimizer.step":
            seen = self.completed
        else:
            seen = 1
        return {"source": self.source, "seen": seen, "kept": seen if self.source != "none" else 0,
                "stopped_early": self.stopped}
