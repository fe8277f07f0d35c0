"""FLOPs and memory traffic of Mamba-2's fused conv + SSD scan op and its backward.

``heterosim::mamba_split_conv1d_scan`` (:mod:`models.layers.mamba`) stands for mamba_ssm's
``mamba_split_conv1d_scan_combined`` (``mamba_ssm/ops/triton/ssd_combined.py``), the training path of
Megatron-core's ``MambaMixer``. Its forward runs ``causal_conv1d_fwd`` and the five Triton kernels of
``_mamba_chunk_scan_combined_fwd``; with ``b`` sequences of ``l`` tokens, ``H`` heads of dim ``P``,
``G`` groups of state size ``N``, chunks of ``Q`` tokens (``c = ceil(l / Q)``), a conv of width ``K``
over ``Cv = H P + 2 G N`` channels and ``S = b c H P N`` state elements, the multiply-adds are
(2 FLOPs each)::

    conv1d                    2 b l K Cv
    _chunk_state_fwd          2 b l H P N     (B^T (decay dt x) per chunk)
    _state_passing_fwd        2 S             (states carried across chunks)
    _bmm_chunk_fwd            2 b l Q G N     (C B^T per chunk and group)
    _chunk_scan_fwd           b l H P Q       (causal (C B^T o decay) x: half the Q x Q blocks)
                            + 2 b l H P N     (C . the entering state)

The backward (``MambaSplitConv1dScanCombinedFn.backward`` -> ``_mamba_chunk_scan_combined_bwd``)
recomputes the conv, the chunk states, ``C B^T`` and the gated output, then runs the gradient
kernels (``_chunk_scan_bwd_dstates``, ``_state_passing_bwd``, ``_chunk_scan_chunk_state_bwd_dx``,
``_chunk_state_bwd_db``, ``_chunk_scan_bwd_dC``, ``_chunk_scan_bwd_dcb``, two ``_bmm_chunk_bwd``)
and the conv's two gradients: ``2 b l (3 K Cv + 6 H P N + 3 Q G N + 1.5 H P Q) + 4 S``.

Memory traffic (element size ``e`` of the activations, float32 where the kernels keep it): the
forward reads ``zxbcdt`` once, the conv output three times (chunk state: ``x``, ``B``; ``C B^T``:
``B``, ``C``; chunk scan: ``x``, ``C``) and ``z`` once, ``dt`` / ``dA_cumsum`` (fp32) three times,
the states once in fp32 (state passing) and once in ``e`` (chunk scan), ``C B^T`` (fp32) once; it
writes the conv output, ``dt`` and ``dA_cumsum``, the states in fp32 and in ``e``, ``C B^T`` and
``y``. The backward reads ``dy`` and writes ``dzxbcdt`` and the parameters' gradients, and moves
every intermediate of the forward twice (recomputed, then its gradient) otherwise.

NB: FLOPs of the exponentials, softplus, SiLU and the ``dt`` cumsums are left out (elementwise,
under the traffic); tiles are taken as fully used (no partial last chunk padding); L2 reuse between
the kernels is not modelled (each intermediate goes through HBM).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

__all__ = ["PACKETS", "ssd_cost"]

PACKETS = ("mamba_split_conv1d_scan", "mamba_split_conv1d_scan_backward")


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def ssd_cost(packet: str, args: Sequence[Any]) -> tuple[int, int, float, dict]:
    """``(bytes_read, bytes_written, flops, dims)`` of one call of ``packet`` with ``args`` (tensors,
    or anything with ``shape`` and ``element_size()``; the op's schema order)."""
    bwd = packet == PACKETS[1]
    if bwd:
        args = args[1:]  # dy first
    zxbcdt, conv_w, _conv_b, dt_bias, _A, _D, q, p, g = args[:9]
    b, l, din = _shape(zxbcdt)
    cv, k = _shape(conv_w)
    h = _shape(dt_bias)[0]
    q, p, g = int(q), int(p), int(g)
    n = (cv - h * p) // (2 * g)
    e = float(zxbcdt.element_size())
    c = math.ceil(l / q)
    tok, states, cb = b * l, b * c * h * p * n, b * c * g * q * q * 4.0
    conv, scan_state, cbt, intra = tok * k * cv, tok * h * p * n, tok * q * g * n, tok * h * p * q / 2
    params = (cv * k + cv) * e + 3 * h * 4.0  # conv weight and bias; dt_bias, A, D in fp32
    read = (tok * (din + (h * p + g * n) + 2 * g * n + (2 * h * p + g * n)) * e + 3 * tok * h * 4.0
            + states * (4.0 + e) + cb + params)
    written = tok * (cv + h * p) * e + 2 * tok * h * 4.0 + states * (4.0 + e) + cb
    dims = {"b": b, "l": l, "h": h, "p": p, "n": n, "g": g, "q": q, "dir": "bwd" if bwd else "fwd"}
    if not bwd:
        flops = 2.0 * (conv + 2 * scan_state + cbt + intra) + 2.0 * states
        return round(read), round(written), flops, dims
    flops = 2.0 * (3 * conv + 6 * scan_state + 3 * cbt + 3 * intra) + 4.0 * states
    y = tok * h * p * e
    read_b = y + 2 * read  # dy, then every forward read twice
    written_b = tok * din * e + params + 2 * (written - y)  # dzxbcdt, parameter grads, intermediates twice
    return round(read_b), round(written_b), flops, dims
