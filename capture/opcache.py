"""Fake outputs of ops seen before, built from their inputs' metadata (the recorder's fast path).

Under FakeTensorMode an op's outputs are metadata only, and for three kinds of op that metadata
is fully determined by the op, its non-tensor arguments and its tensors' metadata:

- *functional* (no argument written, no output aliased): fresh tensors, from the inputs' dtype,
  sizes, strides, device and bits, not from where in their storage they start (a meta kernel
  reads sizes and strides);
- *view*: one tensor on its first argument's storage, at an offset that follows that argument's
  (for slices, reshapes and permutations a fixed shift from it, so that offset is no part of
  the key: :data:`_SHIFTING_VIEWS`);
- *in-place*: its first argument, written, its metadata unchanged, wherever it starts.

FakeTensorMode caches the same (``FakeTensorMode._cached_dispatch_impl``), but a hit still costs
its key (``_prep_args_for_hash``: every tensor's full metadata, sparse checks, storage sizes) and a
rebuild through its dispatch: about a third of a rank's capture. This cache sits above it, in the
recorder. The first call of a key runs through FakeTensorMode as before, and its outputs'
metadata is kept when a rebuild reproduces them. Later calls build their outputs directly
(``torch.empty_strided`` on the meta device wrapped as a ``FakeTensor``, ``set_`` onto the
argument's storage for a view: what FakeTensorMode's own cache does on a hit) and never enter
the mode.

What it refuses, mirroring FakeTensorMode's cache (``_validate_cache_key``) and more strictly:
ops outside ``aten``, data-dependent or dynamic output shapes, ops changing their argument's
metadata (``inplace_view``), lists of outputs, ``out=`` variants, views that may or may not alias;
any argument that is not a fake tensor of a strided layout without a constant, or a plain value
(None, bool, int, float, str, dtype, device, layout, memory format, and lists of those); outputs
that share storage with an input (other than a view's), carry a constant, a storage offset, a
conjugate or negative bit, or a storage larger than their extent. Global state that can change
an output (default dtype, inference mode; a constructor's default device) is part of the key.
Random ops are cached as FakeTensorMode caches them: a fake tensor has no values to draw.

Entries carry no mode, so they hold in any process: a process keeps them (:data:`LEARNT`) and a
forked worker hands what it learnt back (:func:`exported`, :func:`absorb`), so ranks and cases
forked later start with them.
"""
from __future__ import annotations

import copyreg
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import _get_current_dispatch_mode

_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format)
_NO_SHAPE_FROM_META = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape, torch.Tag.inplace_view)

Entry = tuple
"""Per output: (shape, stride, dtype, fake device, requires_grad), a view's with its storage offset
after (for :data:`_SHIFTING_VIEWS`, its shift from the argument's offset); a tuple of those (or
None for an undefined output) for an op returning a tuple."""


FUNCTIONAL, VIEW, INPLACE = "functional", "view", "inplace"
_VIEWS_UNDECLARED = {torch.ops.aten._unsafe_view.default}
"""Ops whose output shares its first argument's storage though their schema does not say so."""
_aten = torch.ops.aten
_SHIFTING_VIEWS = {
    _aten.slice.Tensor, _aten.select.int, _aten.view.default, _aten._unsafe_view.default,
    _aten._reshape_alias.default, _aten.transpose.int, _aten.permute.default, _aten.t.default,
    _aten.expand.default, _aten.unsqueeze.default, _aten.squeeze.default, _aten.squeeze.dim,
    _aten.squeeze.dims, _aten.alias.default, _aten.diagonal.default, _aten.unfold.default,
    _aten.detach.default,
}
"""Views whose output starts a fixed number of elements after their argument, wherever that
starts (ATen: ``self.storage_offset() + start * stride`` for ``slice``, the same offset for a
reshape or a permutation): keyed without the argument's offset, their entry holds the shift.
Not ``as_strided`` (an absolute offset) nor ``view(dtype)`` (an offset rescaled by the element
size)."""


def _memory_format(name: str) -> torch.memory_format:
    return getattr(torch, name)


def _reduce_memory_format(m: torch.memory_format) -> tuple:
    # A memory format pickles by its qualified name ("torch.contiguous_format"), which pickle looks
    # up as an attribute of whichever loaded module reaches it first (often the running script's
    # __main__, which imported torch): an exported key then fails to unpickle in the parent.
    return _memory_format, (str(m).rsplit(".", 1)[-1],)


copyreg.pickle(torch.memory_format, _reduce_memory_format)


def kind(func: Any) -> str | None:
    """How ``func``'s outputs relate to its inputs, when its inputs' metadata decides theirs:
    ``FUNCTIONAL`` (fresh tensors), ``VIEW`` (one tensor on the storage of the argument it
    aliases), ``INPLACE`` (its first argument, written, its metadata unchanged); else None."""
    if func.namespace != "aten" or any(t in func.tags for t in _NO_SHAPE_FROM_META):
        return None
    schema = func._schema
    aliased = [a for a in schema.arguments if a.alias_info is not None]
    returns = schema.returns
    if not returns or any(str(r.type) not in ("Tensor", "Tensor?") for r in returns):
        return None  # lists of tensors, scalars, nothing
    if func in _VIEWS_UNDECLARED:
        return VIEW
    if not aliased:
        return FUNCTIONAL if all(r.alias_info is None for r in returns) else None
    if len(aliased) != 1 or len(returns) != 1 or returns[0].alias_info is None:
        return None
    arg, ret = aliased[0], returns[0]
    if arg is not schema.arguments[0] or arg.alias_info.before_set != ret.alias_info.before_set:
        return None  # out= variants, ops writing an argument they do not return
    if func.is_view:
        if arg.alias_info.is_write or torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), torch._C.DispatchKey.CompositeImplicitAutograd
        ):
            return None  # FakeTensorMode does not cache these either (they may or may not alias)
        return VIEW
    return INPLACE if arg.alias_info.is_write and ret.alias_info.is_write else None


_KINDS: dict[Any, str | None] = {}  # op -> kind(op), read once per op

LEARNT: dict[tuple, tuple] = {}
"""This process's entries, key -> (kind, entry, is_tuple): what it learnt, what it inherited when it
was forked, and what its workers sent back (:func:`absorb`)."""
_NEW: list[tuple] = []  # keys this process learnt or absorbed since :func:`start_exporting`


def start_exporting() -> None:
    """Count what this process learns from now on as its own (a forked worker calls this first)."""
    _NEW.clear()


def exported() -> list[tuple]:
    """The entries this process added since :func:`start_exporting`, in a form a pipe carries
    (operators by name): what a worker sends back so that the workers forked after it start warm."""
    return [(str(k[0]), k[1:], LEARNT[k]) for k in _NEW]


def absorb(items: list[tuple]) -> None:
    """Add entries a worker :func:`exported`; exact keys, so whoever learnt one, it holds here."""
    for name, rest, value in items:
        ns, op, overload = name.split(".")
        key = (getattr(getattr(getattr(torch.ops, ns), op), overload), *rest)
        if key not in LEARNT:
            LEARNT[key] = value
            _NEW.append(key)


class OutputCache:
    """Op and argument metadata -> the metadata of the fake outputs it made; ``entries`` default to
    the process's (:data:`LEARNT`)."""

    def __init__(self, entries: dict[tuple, tuple] | None = None) -> None:
        self._entries = LEARNT if entries is None else entries
        self.hits = 0
        self.misses = 0

    def key(self, func: Any, args: Any, kwargs: dict) -> tuple | None:
        """``(key, fake tensors in argument order, an in-place op's argument's metadata before the
        call, fake mode)`` for a cacheable call, else None."""
        k = _KINDS.get(func, 0)
        if k == 0:
            k = _KINDS[func] = kind(func)
        if k is None:
            return None
        parts: list = [func, torch.get_default_dtype(), torch.is_inference_mode_enabled()]
        mode: list = []
        tensors: list = []
        with torch._C.DisableTorchFunction():
            offsets = k == VIEW and func not in _SHIFTING_VIEWS
            if not _flatten(args, parts, mode, tensors, offsets):
                return None
            if kwargs:
                for name in sorted(kwargs):
                    parts.append(name)
                    if not _flatten((kwargs[name],), parts, mode, tensors, offsets):
                        return None
        if not mode:  # a constructor: the mode it runs in, the device it defaults to
            current = _get_current_dispatch_mode()
            if k != FUNCTIONAL or not isinstance(current, FakeTensorMode):
                return None
            mode.append(current)
            parts.append(torch._C._get_default_device())
        elif k != FUNCTIONAL and not (args and args[0] is tensors[0]):
            return None
        if mode[0].in_kernel_invocation:
            return None  # inside a fake kernel tensors are meta tensors: FakeTensorMode's to answer
        return tuple(parts), tensors, parts[3] if k == INPLACE else None, mode[0]

    def lookup(self, call: tuple) -> Any:
        """The outputs of a ``call`` (what :meth:`key` returned): fresh tensors, a view, or the
        argument written; None when its key has not been learnt."""
        hit = self._entries.get(call[0])
        if hit is None:
            return None
        self.hits += 1
        k, entry, is_tuple = hit
        mode = call[3]
        if k == INPLACE:
            return call[1][0]
        if k == VIEW:
            base = call[1][0]
            return _build(mode, entry, base, base.storage_offset() if call[0][0] in _SHIFTING_VIEWS else 0)
        if is_tuple:
            return tuple(None if e is None else _build(mode, e) for e in entry)
        return _build(mode, entry)

    def learn(self, call: tuple, func: Any, out: Any) -> None:
        """Keep ``out``'s metadata under the ``call``'s key when a rebuild
        reproduces it: fresh tensors of the inputs' fake mode sharing storage with nothing, the
        view of the first argument's storage, or the first argument itself, metadata unchanged."""
        self.misses += 1
        key, ins, before, mode = call
        k = _KINDS[func]
        is_tuple = isinstance(out, tuple)
        with torch._C.DisableTorchFunction():
            if k == INPLACE:
                if out is not ins[0] or _desc_placed_anywhere(out) != before:
                    return
                entry: Any = None
            elif k == VIEW:
                if is_tuple or not isinstance(out, FakeTensor) or out.fake_mode is not mode:
                    return
                if out.untyped_storage()._cdata != ins[0].untyped_storage()._cdata or out.constant is not None:
                    return
                if out.is_conj() or out.is_neg() or out.layout is not torch.strided:
                    return
                offset = out.storage_offset() - (ins[0].storage_offset() if func in _SHIFTING_VIEWS else 0)
                entry = (tuple(out.shape), out.stride(), out.dtype, out.fake_device, out.requires_grad, offset)
            else:
                storages = {t.untyped_storage()._cdata for t in ins}
                entries = []
                for t in (out if is_tuple else (out,)):
                    if t is None:  # an output its mask left undefined (native_layer_norm_backward)
                        entries.append(None)
                        continue
                    e = _entry(t, mode, storages)
                    if e is None:
                        return
                    storages.add(t.untyped_storage()._cdata)  # two outputs on one storage: refused
                    entries.append(e)
                entry = tuple(entries) if is_tuple else entries[0]
        self._entries[key] = (k, entry, is_tuple)
        if self._entries is LEARNT:
            _NEW.append(key)


def _desc_placed_anywhere(a: FakeTensor) -> tuple:
    """A fresh output's metadata does not depend on where in its storage an input starts (a meta
    kernel sees sizes and strides; an offset moves data, not shapes): a layer's parameters, views
    at distinct offsets of one flat buffer, then share their ops' keys."""
    return (a.dtype, tuple(a.shape), a.stride(), a.fake_device, a.requires_grad, a.is_conj(), a.is_neg())


def _desc(a: FakeTensor) -> tuple:
    return (a.dtype, tuple(a.shape), a.stride(), a.storage_offset(), a.fake_device,
            a.requires_grad, a.is_conj(), a.is_neg())


def _flatten(args: Any, parts: list, mode: list, tensors: list, offsets: bool) -> bool:
    """Append ``args``' hashable description to ``parts`` (tensors by metadata, storage offsets
    where ``offsets``); False when an argument is not cacheable. ``mode`` receives the fake mode (all tensors must share it)."""
    for a in args:
        if isinstance(a, FakeTensor):
            if a.constant is not None or a.layout is not torch.strided:
                return False
            if mode:
                if a.fake_mode is not mode[0]:
                    return False
            else:
                mode.append(a.fake_mode)
            tensors.append(a)
            parts.append(_desc(a) if offsets else _desc_placed_anywhere(a))
        elif isinstance(a, torch.Tensor):
            return False
        elif isinstance(a, (list, tuple)):
            parts.append((type(a), len(a)))
            if not _flatten(a, parts, mode, tensors, offsets):
                return False
        elif isinstance(a, dict):
            parts.append((dict, len(a)))
            for k in sorted(a):
                parts.append(k)
                if not _flatten((a[k],), parts, mode, tensors, offsets):
                    return False
        elif type(a) in _PLAIN:
            parts.append(type(a))  # 1 and 1.0 hash alike but can give different dtypes
            parts.append(a)
        else:
            return False
    return True


def _entry(t: Any, fake_mode: Any, storages: set) -> Entry | None:
    if not isinstance(t, FakeTensor) or t.fake_mode is not fake_mode:
        return None
    if t.constant is not None or t.layout is not torch.strided or t.storage_offset() != 0:
        return None
    if t.is_conj() or t.is_neg() or t.untyped_storage()._cdata in storages:
        return None
    shape, stride = tuple(t.shape), t.stride()
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    if t.untyped_storage().nbytes() != extent * t.element_size():
        return None  # a storage empty_strided would not give back (the memory tracker sizes it)
    return (shape, stride, t.dtype, t.fake_device, t.requires_grad)


def _build(fake_mode: Any, e: Entry, base: FakeTensor | None = None, shift_from: int = 0) -> FakeTensor:
    """A fake tensor of ``e``'s metadata: on a new storage, or on ``base``'s (a view's entry carries
    its storage offset, from ``shift_from``)."""
    return fake_tensor(fake_mode, e[3], e[0], e[2], e[1], e[4], base, shift_from + e[5] if base is not None else 0)


def fake_tensor(fake_mode: Any, device: torch.device, shape: tuple, dtype: torch.dtype,
                stride: tuple | None = None, requires_grad: bool = False, base: FakeTensor | None = None,
                offset: int = 0) -> FakeTensor:
    """A ``FakeTensor`` of ``fake_mode`` on ``device`` made without any dispatch: its meta tensor
    comes straight from the meta kernel (contiguous when ``stride`` is None), on a new storage or
    ``base``'s at ``offset``."""
    with torch._C._DisableTorchDispatch(), torch._C.DisableTorchFunction():  # modes and subclasses off
        if stride is None:
            elem = torch.empty(shape, dtype=dtype, device="meta", requires_grad=requires_grad)
        else:
            elem = torch.empty_strided(shape, stride, dtype=dtype, device="meta", requires_grad=requires_grad)
        if base is not None:
            elem.set_(base.untyped_storage(), offset, shape, elem.stride())
    return FakeTensor(fake_mode, elem, device)
