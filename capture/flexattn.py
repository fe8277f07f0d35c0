"""FlexAttention (``torch.nn.attention.flex_attention``), recorded as attention kernels.

Eager ``flex_attention`` calls the higher-order ops ``flex_attention`` and, in backward,
``flex_attention_backward`` (torch 2.13, ``torch/_higher_order_ops/flex_attention.py``). A
higher-order op reaches a dispatch mode only through a rule registered for the mode's class:
:func:`register` gives the recorder one per op, which runs the op (FakeTensorMode's rule gives the
output shapes) and records it as one compute op named ``higher_order.<op>.default``, kernel class
``attention``, with the SDPA dims ``b, h, sq, sk, d`` of its query and key.

FLOPs are torch's flex formulas (``torch/utils/flop_counter.py``: forward as SDPA, ``4 b h sq sk
d``; backward as a flash backward, 2.5x the forward); :mod:`capture.opinfo` counts the mask as
causal (``flops`` on and below the diagonal in 128x128 tiles, ``flops_full`` the full square,
backward 2x forward as Megatron counts).

Known limitations: the block mask's contents are data (built on the device from the batch's
document positions), so its sparsity is unknown here; a block-causal document mask, which skips
the blocks across documents, is priced as plain causal (an upper bound). ``score_mod`` /
``mask_mod`` functions add no recorded work.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HigherOrderKernel", "register"]


class _NoArguments:
    arguments: tuple = ()


class HigherOrderKernel:
    """A higher-order op as the recorder's dispatch sees an aten op: a name, a namespace, no
    schema arguments (it mutates none of its inputs), not a view."""

    namespace = "higher_order"
    is_view = False
    tags: tuple = ()
    _schema = _NoArguments()

    def __init__(self, hop: Any) -> None:
        self.hop = hop
        self._overloadpacket = hop  # its __name__ is the op's; torch's flop registry keys it

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.hop(*args, **kwargs)

    def __str__(self) -> str:
        return f"higher_order.{self.hop.__name__}.default"


def register(mode_cls: type) -> None:
    """Route FlexAttention's higher-order ops through ``mode_cls.__torch_dispatch__`` (once)."""
    from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_backward

    for hop in (flex_attention, flex_attention_backward):
        if mode_cls in hop.python_key_table:
            continue
        kernel = HigherOrderKernel(hop)

        def handler(mode: Any, *args: Any, _kernel: HigherOrderKernel = kernel, **kwargs: Any) -> Any:
            # the mode is off the stack here: running the op reaches FakeTensorMode's rule
            return mode.__torch_dispatch__(_kernel, (), args, kwargs)

        hop.py_impl(mode_cls)(handler)
