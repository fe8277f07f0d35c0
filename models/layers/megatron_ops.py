"""Megatron's fused causal softmax as real PyTorch custom ops, so a capture records ONE op each way.

Megatron-LM's ``scaled_upper_triang_masked_softmax`` (``megatron/fused_kernels/
scaled_upper_triang_masked_softmax.h``) is the softmax of ``FusedScaleMaskSoftmax`` for a causal
GPT: input ``[attn_batches, sq, sk]`` (``attn_batches = b * np``), one warp per row with the row
held in registers. Row ``i`` loads only its ``i + 1`` unmasked elements (``local_seq =
blockIdx.x + 1``), scales them, sets the rest to ``-inf`` without loading them, and writes the
whole row (zeros where masked). The backward loads grad and output for the same ``i + 1``
elements and writes the whole row. The mask is implicit in the element index: there is no mask
tensor. :mod:`capture.opinfo` prices the ops with exactly that traffic.

Registered in the ``heterosim`` namespace when this module is first imported (idempotent: a
second import, e.g. of ``models`` under another name or after a reload, reuses the ops)::

    heterosim::scaled_upper_triang_masked_softmax(Tensor x, float scale) -> Tensor
    heterosim::scaled_upper_triang_masked_softmax_backward(Tensor grad, Tensor out, float scale) -> Tensor

each with an eager kernel for any device (16-bit inputs computed in fp32, as the CUDA kernel
accumulates in ``acc_t = float``, and cast back; fp32/fp64 in their own precision), a fake kernel (FakeTensorMode and meta tensors)
and autograd whose backward calls the backward op. The mask is top-left aligned as
``F.scaled_dot_product_attention(is_causal=True)``: query ``i`` sees keys ``0..min(i, sk - 1)``,
so no row is fully masked. Megatron asserts ``sq == sk``; these ops also take ``sq != sk``.
"""

from __future__ import annotations

from typing import Any

import torch

from heterosim.errors import ConfigError

__all__ = ["FORWARD", "BACKWARD", "scaled_upper_triang_masked_softmax", "eager_vjp", "register_pair"]

FORWARD = "heterosim::scaled_upper_triang_masked_softmax"
BACKWARD = "heterosim::scaled_upper_triang_masked_softmax_backward"


def _check(x: torch.Tensor, what: str) -> None:
    if x.dim() != 3 or not x.dtype.is_floating_point:
        raise ConfigError(f"{FORWARD} takes {what} as [attn_batches, sq, sk] floating point, got "
                          f"{x.dtype} of shape {tuple(x.shape)}; view [b, np, sq, sk] scores as "
                          f"[b*np, sq, sk] first")


def _future(x: torch.Tensor) -> torch.Tensor:
    """``[sq, sk]`` bool, True where key ``j > i`` is hidden from query ``i``."""
    sq, sk = x.shape[-2:]
    return torch.ones(sq, sk, dtype=torch.bool, device=x.device).triu(1)


def _acc(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the accumulation type: fp32 for 16-bit inputs (``acc_t``), else its own."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _forward_eager(x: torch.Tensor, scale: float) -> torch.Tensor:
    _check(x, "x")
    y = (_acc(x) * scale).masked_fill(_future(x), float("-inf")).softmax(-1)
    return y.to(x.dtype)


def _backward_eager(grad: torch.Tensor, out: torch.Tensor, scale: float) -> torch.Tensor:
    # d x = scale * y * (g - sum_j g_j y_j): masked y are 0, so masked gradients are 0.
    _check(grad, "grad")
    g, y = _acc(grad), _acc(out)
    dx = scale * y * (g - (g * y).sum(-1, keepdim=True))
    return dx.to(grad.dtype)


def _fake(x: torch.Tensor, *rest: object) -> torch.Tensor:
    _check(x, "x")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_context(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
    ctx.scale = inputs[1]
    ctx.save_for_backward(output)


def _autograd_backward(ctx: object, grad: torch.Tensor) -> tuple:
    (out,) = ctx.saved_tensors
    return _backward_op(grad, out, ctx.scale), None


def register_pair(forward: str, backward: str, *, schemas: tuple[str, str], kernels: tuple[Any, Any],
                  fakes: tuple[Any, Any], autograd: tuple[Any, Any]) -> None:
    """Register the custom op ``forward`` and its backward op ``backward`` (``"ns::name"``): their
    schemas, eager kernels and fake kernels, and the forward's autograd (``(backward function,
    setup_context)``, which calls the backward op). Idempotent: a second import (``models`` under
    another name, a reload) reuses the ops."""
    ns, name = forward.split("::")
    if hasattr(getattr(torch.ops, ns), name):  # already registered by an earlier import
        return
    fwd = torch.library.custom_op(forward, kernels[0], mutates_args=(), schema=schemas[0])
    bwd = torch.library.custom_op(backward, kernels[1], mutates_args=(), schema=schemas[1])
    fwd.register_fake(fakes[0])
    bwd.register_fake(fakes[1])
    fwd.register_autograd(autograd[0], setup_context=autograd[1])


register_pair(FORWARD, BACKWARD, schemas=("(Tensor x, float scale) -> Tensor",
                                          "(Tensor grad, Tensor out, float scale) -> Tensor"),
              kernels=(_forward_eager, _backward_eager), fakes=(_fake, _fake),
              autograd=(_autograd_backward, _setup_context))
_forward_op = torch.ops.heterosim.scaled_upper_triang_masked_softmax.default
_backward_op = torch.ops.heterosim.scaled_upper_triang_masked_softmax_backward.default


def scaled_upper_triang_masked_softmax(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Causal softmax of ``scale * x`` over the last dim of ``x [attn_batches, sq, sk]``: one op."""
    return _forward_op(x, float(scale))


def eager_vjp(fn, inputs: tuple[torch.Tensor, ...], grads: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Gradients of ``fn(*inputs)`` for ``grads``, taken inside a custom op's eager kernel (the
    backward op of :mod:`models.layers.mamba` and :mod:`models.layers.window_attention`).

    A custom op's kernel runs with autograd's dispatch keys excluded; they are put back for the
    eager forward and its gradient (the Autocast exclusions kept). Each gradient comes back in its
    input's dtype.
    """
    ins = [t.detach().requires_grad_(True) for t in inputs]
    keep = torch._C._dispatch_tls_local_exclude_set()
    for key in ("AutogradFunctionality", "AutogradOther", "AutogradNestedTensor", "ADInplaceOrView"):
        keep = keep.remove(getattr(torch._C.DispatchKey, key))
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), keep), torch.enable_grad():
        out = fn(*ins)
        got = torch.autograd.grad(out, ins, grads)
    return tuple(g.to(t.dtype) for g, t in zip(got, ins))
