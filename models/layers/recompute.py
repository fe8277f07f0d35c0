"""Activation recomputation through ``torch.utils.checkpoint`` (non-reentrant), tagged for capture.

The recomputed forward runs inside backward when autograd first needs a saved activation; the
``context_fn`` hook wraps exactly that re-run in ``scope(phase="recompute")`` so the capture
labels those ops "recompute" rather than "bwd" (Megatron's ``CheckpointFunction`` re-runs the
forward at the start of the checkpointed region's backward in the same way).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable

import torch
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from heterosim.annotate import get_annotator

__all__ = ["recompute"]


def _contexts():
    return nullcontext(), get_annotator().scope(phase="recompute")


def recompute(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` whose activations are dropped after forward and recomputed in backward."""
    if not torch.is_grad_enabled():
        return fn(*args)
    # No early stop: Megatron re-runs the whole checkpointed forward, including ops (such as the
    # last TP all-reduce) whose outputs backward does not need.
    with set_checkpoint_early_stop(False):
        return checkpoint(fn, *args, use_reentrant=False, context_fn=_contexts,
                          preserve_rng_state=True, determinism_check="none")
