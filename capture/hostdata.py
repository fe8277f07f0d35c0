"""Host data: what a training script computes on the CPU keeps its values.

The capture runs the script under FakeTensorMode, so tensors hold no data, and reading one
(``int(t)``, ``.item()``) fails. Tensors the script builds from data on the host, and the host
arithmetic it does on them, are not GPU work and can keep their values:

- ``torch.utils.data`` loaders run with FakeTensorMode off and the recorder quiet. A loader reads
  and tokenizes files, draws a base seed (``torch.empty(()).random_().item()``, torch 2.13
  ``torch/utils/data/dataloader.py``) and collates samples with ``torch.stack``: its batches are
  real CPU tensors. Loaders whose iterators subclass ``_BaseDataLoaderIter`` are covered
  (torchdata's ``StatefulDataLoader`` included: its iterators call the base ``__init__`` /
  ``__next__``).
- ``torch.tensor`` / ``torch.as_tensor`` of host values (no CUDA device, no fake tensor in the
  data) give real CPU tensors.
- A torch call whose tensor arguments are all real CPU tensors and that asks for no CUDA device
  runs on them for real, unrecorded: counting a batch's valid tokens
  (``(labels != -100).sum()``) gives a number the script can print.
- Moving a real tensor to the device (``.to("cuda")``, ``.cuda()``) gives a fake CUDA tensor
  (recorded as the copy), as before; from there on it is device data with no values.

So a script may read what it computed on the host from host data, as it would on a GPU machine;
reading a device result still fails with the hint of :mod:`capture.runner`.

Known limitations: ``num_workers > 0`` forks worker processes from the capture process; they load
data for real, which works but costs CPU time the capture does not need (prefer 0 workers).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, ContextManager

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.overrides import TorchFunctionMode

__all__ = ["HostData"]

_HOST_TYPES = (torch.Tensor, torch.nn.Parameter)
"""Plain tensors: a subclass (DTensor, FakeTensor) is never host data."""


def _names_device(d: Any) -> bool:
    """Whether a device argument names the (fake) CUDA device: ``"cuda"``, ``"cuda:N"``, an index."""
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d == "cuda" or d.startswith("cuda:")
    return isinstance(d, int) and not isinstance(d, bool)


def _is_host(t: torch.Tensor) -> bool:
    return type(t) in _HOST_TYPES and t.device.type == "cpu"


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensor arguments of a call, one list deep (``torch.cat([a, b])``)."""
    out: list[torch.Tensor] = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


class _HostMode(TorchFunctionMode):
    """Runs host arithmetic on host tensors for real (above the fake CUDA device's mode)."""

    def __init__(self, quiet: Callable[[], ContextManager[None]]) -> None:
        super().__init__()
        self.quiet = quiet
        T = torch.Tensor
        self.moves = {T.cuda, T.pin_memory}
        self.makers = {torch.tensor, torch.as_tensor}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        device = any(_names_device(a) for a in (kwargs.get("device"), *args[1:3]))
        tensors = _tensors(args, kwargs)
        if func in self.makers:
            host = not device and not any(isinstance(t, FakeTensor) or type(t) not in _HOST_TYPES for t in tensors)
        elif func in self.moves or func is torch.Tensor.to:
            host = False
            if tensors and _is_host(tensors[0]) and (device or func in self.moves):
                # to the device: a fake CUDA tensor, recorded as the copy (``.to`` of a CPU tensor
                # to the CPU, where the fake device maps CUDA, would return the tensor itself)
                return tensors[0].to("cuda", copy=True)
        else:
            host = bool(tensors) and not device and all(_is_host(t) for t in tensors)
        if not host:
            return func(*args, **kwargs)
        with unset_fake_temporarily(), self.quiet():
            return func(*args, **kwargs)


class HostData:
    """Installs the host-data rules of this module; ``quiet`` is the recorder's."""

    def __init__(self, quiet: Callable[[], ContextManager[None]]) -> None:
        self._quiet = quiet
        self._saved: list[tuple[Any, str, Any]] = []
        self._mode: _HostMode | None = None

    def _on_host(self, fn: Callable) -> Callable:
        quiet = self._quiet

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with unset_fake_temporarily(), quiet():
                return fn(*args, **kwargs)

        return run

    def install(self) -> None:
        """Patch the loaders' iterators and enter the host mode (after the fake CUDA device's)."""
        from torch.utils.data import dataloader

        base = dataloader._BaseDataLoaderIter
        for name in ("__init__", "__next__"):
            orig = base.__dict__[name]
            self._saved.append((base, name, orig))
            setattr(base, name, self._on_host(orig))
        self._mode = _HostMode(self._quiet)
        self._mode.__enter__()

    def uninstall(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        for obj, name, value in reversed(self._saved):
            setattr(obj, name, value)
        self._saved.clear()
