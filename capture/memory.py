"""Storage lifetimes of one captured rank: what is allocated and freed, and when.

Fake tensors hold no memory, but their storages are real ``UntypedStorage`` objects with the
sizes the GPU would allocate, and PyTorch keeps one Python object per storage for as long as the
C++ ``StorageImpl`` lives (PyObject preservation: ``t.untyped_storage() is t.untyped_storage()``,
and a view keeps the storage alive). So:

- *allocation*: an op (recorded or not: ``aten.empty`` too) returns a tensor whose storage has not
  been seen; its ``nbytes`` is allocated (rounded like the CUDA caching allocator, below);
- *free*: a ``weakref.ref`` callback on the storage's Python object fires when the last tensor
  (view, autograd saved tensor, optimizer state...) lets go of it.

``docs/capture.md`` ("Memory") says why this is reliable in torch 2.13 and what it ignores.

Events are kept in the order they happen as ``(category, bytes)`` pairs (a free is negative) and
handed to the recorder, which files them under the op they precede (:meth:`MemoryTracker.take`).
Categories are those of :data:`heterosim.trace.memory.CATEGORIES`; a storage's category is set at
allocation (``activations`` in forward / backward / recompute, ``other`` elsewhere) and corrected
for what lives across iterations by :meth:`MemoryTracker.classify` (parameters, gradients,
optimizer state found from the live modules and optimizers).
"""

from __future__ import annotations

import gc
import weakref
from functools import partial
from typing import Any, Callable

import torch

from heterosim.trace.memory import ACTIVATIONS, GRADIENTS, OPTIMIZER, OTHER, PARAMETERS, SLACK, allocator_sizes

__all__ = ["MemoryTracker"]


def _key(t: torch.Tensor) -> int:
    local = getattr(t, "_local_tensor", None)  # a DTensor (FSDP2's sharded parameters): its shard's storage
    return (local if isinstance(local, torch.Tensor) else t).untyped_storage()._cdata


class MemoryTracker:
    """Live storages of one rank and the allocation / free events since the last :meth:`take`."""

    def __init__(self, on_free: Callable[[int], None] | None = None) -> None:
        self.live: dict[int, list] = {}  # key -> [category, allocated bytes, segment slack, counted]
        self._refs: dict[int, Any] = {}
        self.events: list[tuple[int, int]] = []
        self.on_free = on_free
        self.block_allocs: set[int] | None = None  # keys allocated while a block is recorded
        self.allocated = 0
        """Counted bytes live now (allocator-rounded): what ``torch.cuda.memory_allocated()`` answers."""
        self.peak = 0
        """The largest :attr:`allocated` since the last :meth:`reset_peak`."""

    # ---- events ----------------------------------------------------------------------------------
    def note(self, out: Any, category: int, counted: bool = True) -> None:
        """Register the new storages among ``out``'s tensors (a tensor or a list / tuple of them)."""
        if isinstance(out, torch.Tensor):
            self._one(out, category, counted)
        elif isinstance(out, (list, tuple)):
            for t in out:
                if isinstance(t, torch.Tensor):
                    self._one(t, category, counted)
                elif isinstance(t, (list, tuple)):
                    self.note(t, category, counted)

    def _one(self, t: torch.Tensor, category: int, counted: bool) -> None:
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors
            return
        key = s._cdata
        if key in self.live:
            return
        nbytes, slack = allocator_sizes(s.nbytes())
        self.live[key] = [category, nbytes, slack, counted]
        self._refs[key] = weakref.ref(s, partial(self._died, key))
        if counted and nbytes:
            self.allocated += nbytes
            self.peak = max(self.peak, self.allocated)
            self.events.append((category, nbytes))
            if slack:
                self.events.append((SLACK, slack))
            if self.block_allocs is not None:
                self.block_allocs.add(key)

    def resize(self, t: torch.Tensor, nbytes: int) -> None:
        """Count ``t``'s storage as ``nbytes`` (allocator-rounded) from now on, the difference as an
        event: a buffer the script keeps whole where the real job holds a shard of it."""
        entry = self.live.get(_key(t))
        if entry is None or not entry[3]:
            return
        new, slack = allocator_sizes(nbytes)
        if new != entry[1]:
            self.allocated += new - entry[1]
            self.events.append((entry[0], new - entry[1]))
        if slack != entry[2]:
            self.events.append((SLACK, slack - entry[2]))
        entry[1], entry[2] = new, slack

    def _died(self, key: int, _ref: Any = None) -> None:
        entry = self.live.pop(key, None)
        self._refs.pop(key, None)
        if entry is not None and entry[3] and entry[1]:
            self.allocated -= entry[1]
            self.events.append((entry[0], -entry[1]))
            if entry[2]:
                self.events.append((SLACK, -entry[2]))
        if self.on_free is not None:
            self.on_free(key)

    def take(self) -> list[tuple[int, int]]:
        """The events since the last call, consecutive ones of one category and sign merged."""
        ev, self.events = self.events, []
        out: list[tuple[int, int]] = []
        for cat, b in ev:
            if out and out[-1][0] == cat and (out[-1][1] > 0) == (b > 0):
                out[-1] = (cat, out[-1][1] + b)
            else:
                out.append((cat, b))
        return out

    def reset_peak(self) -> None:
        """Start a new peak from what is live now (``torch.cuda.reset_peak_memory_stats``)."""
        self.peak = self.allocated

    def counted_in_block(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s storage was allocated (and counted) by the block being recorded."""
        return self.block_allocs is not None and _key(t) in self.block_allocs

    # ---- snapshots -----------------------------------------------------------------------------
    def totals(self) -> list[int]:
        """Bytes live now per category (counted storages only)."""
        out = [0] * (SLACK + 1)
        for cat, nbytes, slack, counted in self.live.values():
            if counted:
                out[cat] += nbytes
                out[SLACK] += slack
        return out

    def classify(self) -> None:
        """Re-label live storages of module parameters (and their gradients) and of optimizers.

        Runs at an iteration boundary: every nn.Module and torch.optim.Optimizer alive is found
        through the garbage collector, so scripts need no annotation.
        """
        params: set[int] = set()
        grads: set[int] = set()
        optim: set[int] = set()
        sort: dict[type, int] = {}  # type -> 1 module, 2 optimizer, 0 neither (most of the heap)
        for obj in gc.get_objects():
            kind = type(obj)  # not isinstance: deprecated module proxies warn on __class__
            what = sort.get(kind)
            if what is None:
                module, optimizer = issubclass(kind, torch.nn.Module), issubclass(kind, torch.optim.Optimizer)
                what = sort[kind] = 1 if module else 2 if optimizer else 0
            if not what:
                continue
            if what == 1:
                for p in obj.parameters(recurse=False):
                    params.add(_key(p))
                    for g in (p.grad, getattr(p, "main_grad", None)):
                        if isinstance(g, torch.Tensor):
                            grads.add(_key(g))
            else:
                for group in obj.param_groups:
                    optim.update(_key(p) for p in group["params"])  # fp32 master weights
                    grads.update(_key(p.grad) for p in group["params"] if isinstance(p.grad, torch.Tensor))
                for state in obj.state.values():
                    optim.update(_key(v) for v in state.values() if isinstance(v, torch.Tensor))
        for key, entry in self.live.items():
            if key in params:
                entry[0] = PARAMETERS
            elif key in grads:
                entry[0] = GRADIENTS
            elif key in optim:
                entry[0] = OPTIMIZER
            elif entry[0] == ACTIVATIONS:
                entry[0] = OTHER  # alive across iterations: not an activation of this one

    def forget(self, key: int) -> None:
        """Stop counting storage ``key`` without a free event (a block's events freed it)."""
        entry = self.live.get(key)
        if entry is not None and entry[3]:
            self.allocated -= entry[1]
            entry[3] = False

    def adopt(self, t: torch.Tensor, category: int) -> None:
        """Count ``t``'s storage from now on without an allocation event (a block's events made it)."""
        entry = self.live.get(_key(t))
        if entry is not None:
            if not entry[3]:
                self.allocated += entry[1]
                self.peak = max(self.peak, self.allocated)
            entry[0], entry[3] = category, True
