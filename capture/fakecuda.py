"""The fake CUDA device of a capture: scripts written for GPUs run unchanged on the CPU wheel.

A captured rank has no GPU and may run a CPU-only torch. Its tensors are FakeTensors whose real
device is the CPU (a fake *CUDA* tensor would abort the CPU wheel's autograd engine, which starts
a device thread through CUDA's device guard). What the script sees is a CUDA device:

- ``device="cuda"`` / ``"cuda:N"`` / ``torch.device("cuda", N)`` / an index in factory kwargs,
  ``Tensor.to("cuda")``, ``Tensor.cuda()``, ``Tensor.pin_memory()`` all give fake tensors (a
  ``TorchFunctionMode`` maps the device to the CPU), and ``t.device`` / ``t.is_cuda`` answer
  ``cuda:<current device>`` / True;
- ``torch.cuda`` answers as a node of ``--nproc-per-node`` target GPUs (``--gpu``, an entry of
  the GPU catalogue ``heterosim/cluster/data/gpus.yaml``): ``is_available``, ``device_count``,
  ``current_device`` / ``set_device`` / ``device(i)``, ``get_device_properties`` / ``_name`` /
  ``_capability``, memory queries (``memory_allocated`` and its peak are the capture's own
  storage accounting, :mod:`capture.memory`), ``synchronize``, RNG states (one CPU generator per
  fake GPU as ``default_generators``), ``nvtx``; ``torch.accelerator`` likewise, and the
  submodules of ``torch.cuda`` that bind these functions under their own names;
- ``t.type()`` names a CUDA type, ``t.record_stream(s)`` is accepted, ``torch.tensor([t0, t1])``
  of one-element fake tensors is their stack (it would copy data fake tensors do not have);
- ``torch.cuda.Stream`` / ``Event`` / ``stream(s)`` / ``current_stream`` are recorded by the
  recorder's :class:`capture.streams.StreamTracker` (what they mean for the trace is there);
- ``torch.autocast("cuda", dtype)`` runs as CPU autocast with the same dtype (same op list for
  GEMMs: mm, bmm, addmm, baddbmm, linear, matmul run in the low precision);
- ``nn.Module.to(...)`` / ``.cuda()`` / ``.half()`` on fake parameters replace each parameter's
  data in place (``param.data = new``), as torch does for real tensors; torch itself would swap
  the tensor objects, which fails for FakeTensors held by weak references.

- ``t.cpu()`` / ``t.to("cpu")`` (the string) return the tensor itself (it is on the CPU already) and report a
  copy to the host to :attr:`FakeCuda.on_host_copy` (a host sync, :mod:`capture.hostsync`).

CUDA graphs (``torch.cuda.CUDAGraph``, ``torch.cuda.graph``) are the recorder's
(:mod:`capture.graphs`).

Known limitations: ``torch.Generator(device="cuda")``, ``torch.cuda.*Tensor`` types and custom
CUDA extensions are not faked. A tensor copied to the host still reports
``cuda`` as its device.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import types
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from capture.fusion import compile_eagerly
from capture.memory import MemoryTracker
from capture.streams import FakeEvent, FakeStream, StreamTracker

__all__ = ["FakeCuda", "DeviceProperties", "Dispatching", "cpu_device_kwargs"]

_CPU = torch.device("cpu")


def _is_cpu(d: Any) -> bool:
    # NB: the string only: torch's own code moves tensors to device objects it read from tensors,
    # which are the CPU here (``clip_grad_norm_``'s ``.to(device)``); a script's
    # ``.to(torch.device("cpu"))`` is therefore not seen as a copy to the host.
    return isinstance(d, str) and d == "cpu"


def _is_cuda(d: Any) -> bool:
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d == "cuda" or d.startswith("cuda:")
    return False


def _holds_fake(data: Any) -> bool:
    """Whether ``data`` is a (nested) list or tuple holding a fake tensor."""
    return isinstance(data, (list, tuple)) and any(isinstance(x, FakeTensor) for x in tree_flatten(data)[0])


class DeviceProperties:
    """``torch.cuda.get_device_properties`` of the target GPU (catalogue figures)."""

    def __init__(self, gpu: Any) -> None:
        self.name = next((a for a in gpu.aliases if a.startswith("NVIDIA ")), gpu.name)
        self.total_memory = int(gpu.hbm_bytes)
        self.major, self.minor = divmod(gpu.compute_capability, 10)
        self.multi_processor_count = gpu.sm_count
        self.L2_cache_size = int(gpu.l2_bytes)
        self.is_integrated = False
        self.is_multi_gpu_board = False
        self.warp_size = 32
        self.max_threads_per_multi_processor = 2048
        self.regs_per_multiprocessor = 65536
        self.uuid = f"fake-{gpu.name}"

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // 2**20}MB, multi_processor_count={self.multi_processor_count})")


class _DeviceMode(TorchFunctionMode):
    """Maps CUDA devices to the CPU in every torch call; reports CUDA where the script asks."""

    def __init__(self, fake: "FakeCuda") -> None:
        super().__init__()
        self.fake = fake
        T = torch.Tensor
        self.special = {T.is_cuda.__get__: "is_cuda", T.get_device: "get_device", T.cuda: "self",
                        T.pin_memory: "self", T.backward: "backward", torch.autograd.backward: "backward",
                        torch.autograd.grad: "grad", T.cpu: "to_host", T.type: "type"}

    def active(self) -> bool:
        """Whether the script's code is running (this mode on the stack), not torch's dispatch."""
        return self in torch.overrides._get_current_function_mode_stack()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        special = self.special.get(func)
        if special is not None:
            if special == "self":
                return args[0]
            if special == "backward":
                return self._backward(func, args, kwargs)
            if special == "grad":
                return self._grad(func, args, kwargs)
            if special == "to_host":
                self._to_host(args[0], kwargs.get("non_blocking", False))
                return func(*args, **kwargs)
            if special == "type":
                return self._type(func, args, kwargs)
            t = args[0]
            if not isinstance(t, FakeTensor) or t.fake_device.type != "cpu":
                return func(*args)  # real tensors (DeviceMesh's rank map) and meta ones say what they are
            return True if special == "is_cuda" else self.fake.device
        if func in (torch.tensor, torch.as_tensor) and args and _holds_fake(args[0]):
            return self._tensor_of_tensors(args[0], kwargs)
        dev = kwargs.get("device")
        if dev is not None and (_is_cuda(dev) or isinstance(dev, int)):
            kwargs = {**kwargs, "device": _CPU}
        if func is torch.Tensor.to and (_is_cpu(kwargs.get("device")) or any(_is_cpu(a) for a in args[1:3])):
            self._to_host(args[0], kwargs.get("non_blocking", False))
        if len(args) > 1 and any(_is_cuda(a) for a in args[1:3]):
            args = tuple(_CPU if i and _is_cuda(a) else a for i, a in enumerate(args))
        return func(*args, **kwargs)

    def _to_host(self, t: Any, non_blocking: bool) -> None:
        """``t.cpu()`` / ``t.to("cpu")`` of a tensor the script sees on the GPU: a copy to the host,
        reported to :attr:`FakeCuda.on_host_copy` (the tensor itself is already on the CPU)."""
        if isinstance(t, FakeTensor) and t.fake_device.type == "cpu" and self.fake.on_host_copy is not None:
            self.fake.on_host_copy(t, bool(non_blocking))

    @staticmethod
    def _type(func: Any, args: Any, kwargs: dict) -> Any:
        # t.type() names a CUDA tensor type ("torch.cuda.FloatTensor"); t.type("torch.cuda.HalfTensor")
        # converts to the CPU type of that name.
        t, rest = args[0], list(args[1:])
        to = rest[0] if rest else kwargs.get("dtype")
        if isinstance(to, str):
            to = to.replace("torch.cuda.", "torch.", 1)
            return func(t, to, *rest[1:], **{k: v for k, v in kwargs.items() if k != "dtype"})
        out = func(*args, **kwargs)
        if to is None and isinstance(t, FakeTensor) and t.fake_device.type == "cpu":
            return out.replace("torch.", "torch.cuda.", 1)
        return out

    @staticmethod
    def _tensor_of_tensors(data: Any, kwargs: dict) -> torch.Tensor:
        # torch.tensor([t0, t1, ...]) of one-element fake tensors copies their data in C++, which
        # fake tensors do not have (Megatron's local multi_tensor_l2norm builds one from per-tensor
        # norms): stack them instead, the same values in the same shape.
        def build(d: Any) -> torch.Tensor:
            if isinstance(d, (list, tuple)):
                return torch.stack([build(x) for x in d])
            return d.reshape(()) if isinstance(d, torch.Tensor) else torch.tensor(d)

        out = build(data)
        dtype = kwargs.get("dtype")
        if dtype is None and not out.dtype.is_floating_point and any(
                isinstance(x, float) for x in tree_flatten(data)[0]):
            dtype = torch.get_default_dtype()
        out = out if dtype is None else out.to(dtype)
        return out.requires_grad_() if kwargs.get("requires_grad") else out

    def _backward(self, func: Any, args: Any, kwargs: dict) -> None:
        # A mode is off the stack while its handler runs, so ``backward()`` would run hooks and
        # custom backward code (FSDP2's reduce-scatter allocations with device="cuda") without
        # it: run the engine here, with the mode back on the stack.
        a = inspect.signature(func).bind(*args, **kwargs).arguments
        tensors = a["self"] if "self" in a else a["tensors"]
        grads = a.get("gradient", a.get("grad_tensors"))
        inputs = a.get("inputs")
        tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
        inputs = () if inputs is None else (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
        create = a.get("create_graph", False)
        retain = a.get("retain_graph")
        # The engine reads tensors' devices from C++, which for a FakeTensor calls its Python
        # ``device`` property: that call (made from _engine_run_backward's frame) sees the CPU,
        # hooks and custom backward code (their own frames) see CUDA (_fake_device).
        with self:
            grads = torch.autograd._make_grads(
                tensors, torch.autograd._tensor_or_tensors_to_tuple(grads, len(tensors)), is_grads_batched=False)
            torch.autograd.graph._engine_run_backward(tensors, grads, create if retain is None else retain, create,
                                                      inputs, allow_unreachable=True, accumulate_grad=True)


    def _grad(self, func: Any, args: Any, kwargs: dict) -> Any:
        # torch.autograd.grad as _backward runs backward(): the engine with the mode on the stack
        # (pipeline stages' shape inference, DTensor's backward moving grads to "cuda").
        a = inspect.signature(func).bind(*args, **kwargs).arguments
        if a.get("is_grads_batched") or a.get("materialize_grads") or isinstance(a["inputs"], dict):
            return func(*args, **kwargs)
        outputs, inputs = a["outputs"], a["inputs"]
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
        create = a.get("create_graph", False)
        retain = a.get("retain_graph")
        with self:
            grads = torch.autograd._make_grads(outputs, torch.autograd._tensor_or_tensors_to_tuple(
                a.get("grad_outputs"), len(outputs)), is_grads_batched=False)
            return torch.autograd.graph._engine_run_backward(
                outputs, grads, create if retain is None else retain, create, inputs,
                a.get("allow_unused") or False, accumulate_grad=False)


class Dispatching:
    """How deep the aten dispatch of the capture is (the recorder counts its handler): torch's own
    kernels and FakeTensorMode must see the CPU device, whatever mode is on the stack."""

    depth = 0


def _philox_state() -> torch.Tensor:
    """What ``torch.cuda.get_rng_state`` returns: a CPU uint8 tensor of 16 bytes, the Philox seed
    and offset (int64 each); DTensor's RNG tracker reads and advances the offset in place."""
    return torch.zeros(16, dtype=torch.uint8)


class _FakeGenerator:
    """A ``torch.cuda.default_generators`` entry: keeps the state it is given (a CUDA generator's
    is the 16-byte Philox seed and offset, :func:`_philox_state`); seeding changes nothing that a
    fake tensor could show."""

    def __init__(self, index: int) -> None:
        self.device = torch.device("cuda", index)
        self._state = _philox_state()

    def get_state(self) -> torch.Tensor:
        return self._state.clone()

    def set_state(self, state: torch.Tensor) -> None:
        self._state = state.clone()

    def manual_seed(self, seed: int) -> "_FakeGenerator":
        return self

    def seed(self) -> int:
        return 0

    def initial_seed(self) -> int:
        return 0


def cpu_device_kwargs(kwargs: dict) -> dict:
    """``kwargs`` with a CUDA ``device`` mapped to the CPU, for an aten op. The script's torch calls
    are mapped by :class:`_DeviceMode`, but a torch call made inside another one's handler (the
    mode is off the stack there: DTensor's RNG tracker moving its state ``.to("cuda")`` inside
    ``nn.init.normal_``) reaches aten with CUDA still named."""
    dev = kwargs.get("device")
    return {**kwargs, "device": _CPU} if dev is not None and _is_cuda(dev) else kwargs


def _fake_device(orig: Any, mode: _DeviceMode) -> property:
    # C++ that reads a FakeTensor's device calls this property too: the autograd engine (from
    # _engine_run_backward's frame) and custom Function node creation (from Function.apply's)
    # must see the CPU, or they look for CUDA streams.
    from torch.autograd.function import Function

    cpp_callers = {torch.autograd.graph._engine_run_backward.__code__, Function.apply.__func__.__code__}

    def device(self: FakeTensor) -> torch.device:
        d = orig.fget(self)
        if (d.type == "cpu" and not Dispatching.depth and torch._C._len_torch_function_stack() and mode.active()
                and sys._getframe(1).f_code not in cpp_callers):
            return torch.device("cuda", mode.fake.device)
        return d

    return property(device, orig.fset)


def _module_apply(orig: Callable) -> Callable:
    def _apply(self: torch.nn.Module, fn: Callable, recurse: bool = True) -> torch.nn.Module:
        if not any(isinstance(p, FakeTensor) for p in self.parameters(recurse=False)):
            if recurse:
                for m in self.children():
                    m._apply(fn)
            return orig(self, fn, recurse=False)
        if recurse:
            for m in self.children():
                m._apply(fn)
        for p in self._parameters.values():
            if p is None:
                continue
            with torch.no_grad():
                new = fn(p)
            if new is not p:
                p.data = new
            if p.grad is not None:
                with torch.no_grad():
                    g = fn(p.grad)
                if g is not p.grad:
                    p.grad.data = g
        for k, b in self._buffers.items():
            if b is not None:
                self._buffers[k] = fn(b)
        return self

    return _apply


def _checkpoint_metadata(x: torch.Tensor) -> dict:
    """``torch.utils.checkpoint``'s default metadata, with a fake tensor's real device."""
    return {"shape": x.shape, "dtype": x.dtype, "device": x.fake_device if isinstance(x, FakeTensor) else x.device}


def _distinct(value: Any) -> Any:
    """A function as a new function object of its own (classes and other values as they are)."""
    if not isinstance(value, (types.FunctionType, types.MethodType)):
        return value
    def call(*a: Any, **k: Any) -> Any:
        return value(*a, **k)

    call.__name__ = call.__qualname__ = getattr(value, "__name__", "call")  # no __wrapped__: Dynamo unwraps it
    return call


def _trunc_normal_once(tensor: torch.Tensor, mean: float, std: float, a: float, b: float,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    with torch.no_grad():
        return tensor.normal_(mean, std, generator=generator).clamp_(a, b)


class FakeCuda:
    """Installs the fake CUDA device (see the module docstring); :meth:`uninstall` undoes it."""

    def __init__(self, streams: StreamTracker, mem: MemoryTracker, gpu: Any, device_count: int,
                 device: int = 0) -> None:
        self.streams, self.mem, self.gpu = streams, mem, gpu
        self.device_count, self.device = device_count, device
        self.props = DeviceProperties(gpu)
        # One generator per fake GPU, as ``torch.cuda.default_generators`` (Megatron's RNG tracker
        # reads and sets their states; DTensor's reads a 16-byte Philox state and advances its
        # offset in place); random values do not matter to fake tensors.
        self.generators = tuple(_FakeGenerator(i) for i in range(device_count))
        self._saved: list[tuple[Any, str, Any, bool]] = []
        self._mode: _DeviceMode | None = None
        self.on_host_copy: Callable[[torch.Tensor, bool], None] | None = None
        """Called with (tensor, non_blocking) for a copy to the host (``capture/hostsync.py``)."""

    # ---- torch.cuda answers ----------------------------------------------------------------------
    def _index(self, d: Any = None) -> int:
        if d is None:
            return self.device
        if isinstance(d, int):
            return d
        if isinstance(d, str):
            d = torch.device(d)
        return d.index if d.index is not None else self.device

    def generator(self, d: Any = "cuda") -> "_FakeGenerator":
        """``torch.cuda.default_generators`` entry of device ``d`` (-1: the current one)."""
        i = self._index(d)
        return self.generators[self.device if i < 0 else i]

    def set_device(self, d: Any) -> None:
        i = self._index(d)
        if not 0 <= i < self.device_count:
            raise RuntimeError(f"CUDA error: invalid device ordinal {i} (the fake node has "
                               f"{self.device_count} GPUs: --nproc-per-node)")
        self.device = i

    @contextlib.contextmanager
    def device_ctx(self, d: Any) -> Any:
        prev = self.device
        if d is not None and self._index(d) >= 0:
            self.set_device(d)
        try:
            yield
        finally:
            self.device = prev

    @contextlib.contextmanager
    def stream_ctx(self, s: FakeStream | None) -> Any:
        prev = self.streams.set_current(s) if s is not None else self.streams.current
        try:
            yield s
        finally:
            self.streams.set_current(prev)

    def synchronize(self, device: Any = None) -> None:
        """The host waits for the whole device: every communication op not yet waited for."""
        self.streams.host_sync(self.streams.outstanding())

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        return {"allocated_bytes.all.current": self.mem.allocated, "allocated_bytes.all.peak": self.mem.peak,
                "reserved_bytes.all.current": self.mem.allocated, "reserved_bytes.all.peak": self.mem.peak}

    def _answers(self) -> dict[str, Any]:
        mem = self.mem
        noop = lambda *a, **k: None  # noqa: E731
        return {
            "is_available": lambda: True,
            "is_initialized": lambda: True,
            "init": noop,
            "_lazy_init": noop,
            "device_count": lambda: self.device_count,
            "current_device": lambda: self.device,
            "set_device": self.set_device,
            "device": self.device_ctx,
            "get_device_properties": lambda d=None: self.props,
            "get_device_name": lambda d=None: self.props.name,
            "get_device_capability": lambda d=None: (self.props.major, self.props.minor),
            "get_arch_list": lambda: [f"sm_{self.gpu.compute_capability}"],
            "is_bf16_supported": lambda *a, **k: self.gpu.compute_capability >= 80,
            "synchronize": self.synchronize,
            "is_current_stream_capturing": lambda: False,
            "Stream": FakeStream,
            "Event": FakeEvent,
            "current_stream": lambda device=None: self.streams.current,
            "default_stream": lambda device=None: self.streams.default,
            "set_stream": self.streams.set_current,
            "stream": self.stream_ctx,
            "default_generators": self.generators,
            "get_rng_state": lambda device="cuda": self.generator(device).get_state(),
            "get_rng_state_all": lambda: [g.get_state() for g in self.generators],
            "set_rng_state": lambda state, device="cuda": self.generator(device).set_state(state),
            "set_rng_state_all": lambda states: [g.set_state(s) for g, s in zip(self.generators, states)],
            "manual_seed": noop,
            "manual_seed_all": noop,
            "seed": noop,
            "seed_all": noop,
            "initial_seed": lambda: 0,
            "memory_allocated": lambda d=None: mem.allocated,
            "max_memory_allocated": lambda d=None: mem.peak,
            "memory_reserved": lambda d=None: mem.allocated,
            "max_memory_reserved": lambda d=None: mem.peak,
            "reset_peak_memory_stats": lambda d=None: mem.reset_peak(),
            "reset_max_memory_allocated": lambda d=None: mem.reset_peak(),
            "reset_accumulated_memory_stats": noop,
            "memory_stats": self.memory_stats,
            "mem_get_info": lambda d=None: (self.props.total_memory - mem.allocated, self.props.total_memory),
            "empty_cache": noop,
        }

    # ---- installing -------------------------------------------------------------------------------
    def _patch(self, obj: Any, name: str, value: Any) -> None:
        had = hasattr(obj, name)
        self._saved.append((obj, name, getattr(obj, name, None), had))
        setattr(obj, name, value)

    def install(self) -> None:
        # Dynamo's trace rules index torch.cuda's functions when first imported: load them from
        # the real module, not from our answers (one function under several names trips them).
        # ``init_process_group`` clears that index, and a later ``torch.compile`` (a library's
        # decorator, run at import) rebuilds it from our answers: each name gets its own function
        # object (``_own``), or one object under two names with different rules trips the index.
        import torch._dynamo  # noqa: F401

        c = torch.cuda
        answers = self._answers()
        # init_process_group clears Dynamo's index of torch functions (distributed_c10d.py): when it
        # is rebuilt from our answers, no function object may stand under two names. torch.cuda's
        # submodules hold some of its functions under their own names (torch.cuda.random's
        # get_rng_state calls its own ``current_device``): answer there too.
        subs = [m for n, m in sorted(sys.modules.items()) if n.startswith("torch.cuda.") and m is not None]
        for name, value in answers.items():
            orig = getattr(c, name, None)
            for m in subs:
                if orig is not None and vars(m).get(name) is orig:
                    self._patch(m, name, _distinct(value))
            self._patch(c, name, _distinct(value))
        noop = lambda *a, **k: None  # noqa: E731
        for name in ("range_push", "range_pop", "mark", "range_start", "range_end"):
            self._patch(c.nvtx, name, _distinct(noop))
        self._patch(c.nvtx, "range", lambda *a, **k: contextlib.nullcontext())
        acc = torch.accelerator
        for name, value in {
            "is_available": lambda: True,
            "current_accelerator": lambda check_available=False: torch.device("cuda"),
            "device_count": lambda: self.device_count,
            "current_device_index": lambda: self.device,
            "current_device_idx": lambda: self.device,
            "set_device_index": self.set_device,
            "set_device_idx": self.set_device,
            "synchronize": self.synchronize,
            "current_stream": answers["current_stream"],
            "set_stream": self.streams.set_current,
            "memory_allocated": answers["memory_allocated"],
            "max_memory_allocated": answers["max_memory_allocated"],
            "empty_cache": answers["empty_cache"],
        }.items():
            if hasattr(acc, name):
                self._patch(acc, name, _distinct(value))
        autocast = torch.amp.autocast_mode.autocast
        orig_autocast_init = autocast.__init__

        def autocast_init(ac_self: Any, device_type: str = "cuda", *a: Any, **k: Any) -> None:
            orig_autocast_init(ac_self, "cpu" if device_type == "cuda" else device_type, *a, **k)

        self._patch(autocast, "__init__", autocast_init)
        self._patch(torch.nn.Module, "_apply", _module_apply(torch.nn.Module._apply))
        # ``t.record_stream(s)``: the allocator's rule for reusing memory across streams; torch's
        # argument parser refuses our streams before any mode sees the call.
        record_stream = torch.Tensor.record_stream
        self._patch(torch.Tensor, "record_stream",
                    lambda t, s: None if isinstance(s, FakeStream) else record_stream(t, s))
        # torch.optim picks its multi-tensor (foreach) path by the parameters' device, which its own
        # code sees as the CPU, and by their type (FakeTensor here): let it take the path a GPU takes (the CPU foreach kernels exist), so
        # a default AdamW is captured as the few multi-tensor kernels a GPU runs, not a loop.
        import torch.optim.optimizer as optim_mod
        supported = optim_mod._get_foreach_kernels_supported_devices
        self._patch(optim_mod, "_get_foreach_kernels_supported_devices",
                    lambda: [*supported(), *([] if "cpu" in supported() else ["cpu"])])
        self._patch(optim_mod, "_foreach_supported_types", [*optim_mod._foreach_supported_types, FakeTensor])
        self._patch_dtensor_rng()
        # A dispatch mode makes Dynamo skip every frame, which fails a fullgraph=True compile
        # (eager flex_attention compiles its own wrapper so): compiled code runs eagerly, its
        # pointwise ops recorded as the fused kernels Inductor would generate (capture/fusion.py).
        self._patch(torch, "compile", compile_eagerly)
        # Non-reentrant checkpointing compares each recomputed tensor's device with the saved one's;
        # the two are read where the script's device view differs (C++ pack hook vs. backward).
        import torch.utils.checkpoint as ckpt

        self._patch(ckpt, "_allowed_determinism_checks_to_fns",
                    {**ckpt._allowed_determinism_checks_to_fns, ckpt._DEFAULT_DETERMINISM_MODE: _checkpoint_metadata})
        # torch 2.13's trunc_normal_ samples by rejection (draw, test, redraw while any is out of
        # range): data it cannot read here. Initial values do not matter: one draw, clamped.
        self._patch(torch.nn.init, "_no_grad_trunc_normal_", _trunc_normal_once)
        self._mode = _DeviceMode(self)
        self._patch(FakeTensor, "device", _fake_device(FakeTensor.__dict__["device"], self._mode))
        self._mode.__enter__()
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(self.device_count))))

    def _patch_dtensor_rng(self) -> None:
        """DTensor's random ops (``init.normal_`` on a sharded parameter) keep each shard's Philox
        offset in the CUDA generator state, which they read back and write as data, and the first
        one syncs that state from rank 0 (torch 2.13, ``torch/distributed/tensor/_random.py``).
        Values do not matter to a capture: the ops run on the local generator, unsynced."""
        from torch.distributed.tensor import _random as dtensor_random

        tracker = dtensor_random.OffsetBasedRNGTracker
        orig_init = tracker.__init__

        def tracker_init(t: Any, device_mesh: Any, run_state_sync: bool = True) -> None:
            orig_init(t, device_mesh, run_state_sync=False)

        self._patch(tracker, "__init__", tracker_init)
        self._patch(tracker, "_distribute_region", lambda t, spec, generator=None: contextlib.nullcontext())

    def uninstall(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        for obj, name, value, had in reversed(self._saved):
            if had:
                setattr(obj, name, value)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)
        self._saved.clear()
