"""Host syncs of a captured rank: where the script makes its CPU wait for the GPU.

On a GPU, reading a value back stops the CPU until the GPU has finished everything issued before
(the copy to the host is ordered after it on the stream, and the host waits for the copy):

- ``.item()``, ``float(t)``, ``int(t)``, ``bool(t)``, ``.tolist()``: one ``aten._local_scalar_dense``
  per element read (a device-to-host copy of one element);
- ``.cpu()`` / ``.to("cpu")`` without ``non_blocking=True``: a device-to-host copy of the tensor
  (the fake CUDA device, :mod:`capture.fakecuda`, reports it: the tensor is already on the CPU);
- ``torch.cuda.synchronize()``, ``Stream.synchronize()``, ``Event.synchronize()``
  (:mod:`capture.streams` reports them);
- the checks an optimizer step makes with them: a grad scaler's ``found_inf.item()``,
  ``clip_grad_norm_(..., error_if_nonfinite=True)``'s ``if nonfinite:``, DeepSpeed's overflow flag.

The recorder records the copy as a compute op (kernel class ``copy``) and marks the op issued
*after* the sync with ``host_sync`` (:data:`heterosim.trace.ir.COLUMNS`): replay's host model lets
the CPU's lead over the GPU collapse there (``replay/host.py``).

Value read back. Tensors hold no data during capture, so ``.item()`` returns a placeholder
(:func:`placeholder`): ``0`` / ``0.0`` / ``False``, or ``True`` for a bool made by ``all`` — the value
of a healthy step for the checks training loops make with it (no inf found by a grad scaler, no
NaN in a norm, no overflow flag, ``isfinite(x).all()``), so the script takes its usual path and a
loss logged with ``print(loss.item())`` prints 0. NB: data-dependent control flow is still not
captured — the script follows the branch the placeholder picks (a loop ``while loss.item() > x``
ends at once; a divisor read back is 0).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException

from capture.commrec import _skey
from capture.opinfo import describe

__all__ = ["HostSyncs", "placeholder", "SCALAR_READ"]

aten = torch.ops.aten

SCALAR_READ = aten._local_scalar_dense.default
"""The aten op every read of a value (``.item()``, ``bool(t)``, ``.tolist()``) comes down to."""


def placeholder(dtype: torch.dtype, made_by: str = "") -> bool | int | float | complex:
    """The value ``.item()`` returns during capture (module docstring): zero of the dtype's Python
    type, except ``True`` for a bool made by ``all`` (``made_by`` is the producing op's name)."""
    if dtype == torch.bool:
        return made_by.startswith("aten.all.")
    if dtype.is_complex:
        return 0j
    if dtype.is_floating_point:
        return 0.0
    return 0


class HostSyncs:
    """Mixin of :class:`capture.recorder.Recorder`: records host syncs (module docstring).

    Needs the recorder's ``_append``, ``_phase``, ``_deps``, ``rows``, ``seg_start``, ``writers``
    and ``paths``; ``sync_pending`` is set by a sync and put on the next op ``_append`` records.
    """

    sync_pending: bool = False
    _last_read: tuple[int, int] | None = None

    def host_synced(self) -> None:
        """The CPU waited for the GPU (``torch.cuda.synchronize()`` ...): the next op is a host sync."""
        self.sync_pending = True

    def _take_sync(self, row: dict) -> None:
        """Called by ``_append`` for every row: the first op after a sync carries ``host_sync``."""
        if self.sync_pending:
            row["host_sync"] = True
            self.sync_pending = False

    def read_scalar(self, t: torch.Tensor, record: bool) -> Any:
        """``aten._local_scalar_dense(t)``: record the one-element copy to the host (once for the
        elements of one ``.tolist()``: consecutive reads of one storage are one copy), mark a sync,
        and return :func:`placeholder`."""
        try:
            # NB: a small tensor made from Python numbers (torch.tensor(0.0): an optimizer's step
            # count) carries its value in FakeTensorMode: read it, and no sync (such tensors live
            # on the host in eager PyTorch: Adam's non-capturable ``state["step"]``).
            return SCALAR_READ(t)
        except DataDependentOutputException:
            pass
        writer = self.writers.get(_skey(t), [])
        made_by = ""
        if writer and 0 <= writer[-1] - self.seg_start < len(self.rows):
            made_by = self.rows[writer[-1] - self.seg_start]["name"]
        if record:
            key = _skey(t)
            if self._last_read is None or self._last_read != (key, self.next_id - 1):
                oid = self._record_copy(SCALAR_READ, t, t.element_size())
                self._last_read = (key, oid)
            self.host_synced()
        return placeholder(t.dtype, made_by)

    def host_copy(self, t: torch.Tensor, non_blocking: bool = False) -> None:
        """``t.cpu()`` / ``t.to("cpu")`` of a (fake) CUDA tensor: a device-to-host copy of all of it;
        unless ``non_blocking`` (a pinned destination), the host waits for it."""
        if getattr(self, "suppress", 0) or self.clock.stopped:
            return
        self._record_copy(aten._to_copy.default, t, t.numel() * t.element_size())
        if not non_blocking:
            self.host_synced()

    def _record_copy(self, func: Any, t: torch.Tensor, nbytes: int) -> int:
        phase, in_bwd = self._phase()
        module = self.paths.path(in_bwd)
        cost = describe(func, (t,), {}, None, (), phase, None, [t], [])
        # NB: the destination is host memory: nothing is written to the device (bytes_written 0);
        # the bytes read are what crosses PCIe, which kernel_db prices as a copy of that size.
        return self._append({
            "kind": "compute", "name": str(func), "kernel_class": cost.kernel_class, "module": module, "phase": phase,
            "flops": 0.0, "flops_full": 0.0, "bytes_read": int(nbytes), "bytes_written": 0,
            "dtype": cost.dtype, "dims": {"numel": int(nbytes // max(t.element_size(), 1))},
            "signature": cost.signature, "deps": self._deps([t]),
        })
