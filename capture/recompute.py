"""Activation checkpointing under capture: the re-run forward is phase ``recompute``, not backward.

Non-reentrant ``torch.utils.checkpoint`` (what ``checkpoint(..., use_reentrant=False)``,
``checkpoint_wrapper`` and composable ``checkpoint`` all reach: torch 2.13,
``_checkpoint_without_reentrant_generator``) re-runs the checkpointed forward inside backward,
when autograd first unpacks a saved activation, under the second context its ``context_fn``
returns. Capture adds a ``scope(phase="recompute")`` to that context, so the recomputed ops are
labelled as such, and ``model_flops`` leaves them out (Megatron's MFU convention) whatever the
script's policy: full checkpointing, or selective (``create_selective_checkpoint_contexts``: the
ops the policy saves are not re-run, so only the re-run ones are labelled). The project's own
models tag their recompute the same way (``models/layers/recompute.py``).

Reentrant checkpointing (``use_reentrant=True``) re-runs its forward inside a custom
``Function.backward``: not tagged here; its ops stay backward.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

__all__ = ["RecomputeTagger"]


class _Both:
    """Two context managers entered as one (the checkpoint's recompute context, then our scope)."""

    def __init__(self, first: Any, second: Any) -> None:
        self._first, self._second = first, second
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> "_Both":
        stack = contextlib.ExitStack()
        stack.enter_context(self._first)
        stack.enter_context(self._second)
        self._stack = stack
        return self

    def __exit__(self, *exc: Any) -> bool:
        stack, self._stack = self._stack, None
        return bool(stack.__exit__(*exc)) if stack is not None else False


class RecomputeTagger:
    """Patches non-reentrant checkpointing so its re-run forward is scoped ``phase="recompute"``."""

    def __init__(self, scope: Callable[..., Any]) -> None:
        """``scope``: the annotator's ``scope`` (:class:`heterosim.annotate.Annotator`)."""
        self._scope = scope
        self._saved: list[tuple[Any, Any]] = []

    def install(self) -> None:
        import torch.utils.checkpoint as ckpt

        orig = ckpt._checkpoint_without_reentrant_generator
        scope = self._scope

        def generator(fn: Any, preserve_rng_state: bool = True, context_fn: Callable = ckpt.noop_context_fn,
                      *args: Any, **kwargs: Any) -> Any:
            def contexts() -> tuple[Any, Any]:
                forward, recompute = context_fn()
                return forward, _Both(recompute, scope(phase="recompute"))

            return orig(fn, preserve_rng_state, contexts, *args, **kwargs)

        self._saved.append((ckpt, orig))
        ckpt._checkpoint_without_reentrant_generator = generator
        import torch.distributed._composable.checkpoint_activation as composable

        if getattr(composable, "_checkpoint_without_reentrant_generator", None) is orig:
            self._saved.append((composable, orig))
            composable._checkpoint_without_reentrant_generator = generator

    def uninstall(self) -> None:
        for mod, orig in reversed(self._saved):
            mod._checkpoint_without_reentrant_generator = orig
        self._saved.clear()
