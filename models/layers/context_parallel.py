"""Context-parallel causal attention, the three schemes of Megatron's ``--cp-comm-type``
(implemented in Transformer Engine's ``attention/dot_product_attention/context_parallel.py``).

Every CP rank holds two load-balanced sequence chunks (``i`` and ``2cp-1-i`` of ``2cp``, each
``c = s / 2cp`` tokens) of Q, K and V. The kernels are the CPU flash kernel
``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward, called directly because
the schemes merge partial results by their log-sum-exp, as TE does with flash-attn.

``p2p`` (ring, :class:`RingAttention`): K and V travel round the CP ring in ``cp`` steps; at step
``i`` rank ``r`` holds the K/V of rank ``r - i`` and sends it on (isend to ``r + 1``, irecv from
``r - 1``, issued before the step's kernel so they overlap it; even ranks send first, odd ranks
receive first). Step 0 is causal over the local 2c x 2c; for ``i <= r`` all local queries see the
first K/V chunk; for ``i > r`` only the second query chunk sees both K/V chunks. So every rank
issues ``2 (cp-1)`` K/V p2p ops forward. Backward walks the ring again for K/V (``2 (cp-1)``) and
passes the K/V gradient one step behind it (``2 cp``: after the last step it returns home).

``all_gather`` (:func:`allgather_attention`): all-gather K and V over CP (reduce-scatter of their
gradients in backward), reorder the chunks to sequence order, and let each query chunk attend the
prefix up to and including its own chunk: a full block plus a causal diagonal block merged by
log-sum-exp (the CPU kernel aligns ``is_causal`` top-left, flash-attn aligns it bottom-right).

``a2a`` (:func:`a2a_attention`, DeepSpeed-Ulysses): all-to-all Q, K, V from sequence-split to
head-split, run causal attention over the whole sequence, all-to-all the output back.

Partial results are merged as TE's ``AttnFuncWithCPAndKVP2P`` merges them: the log-sum-exps step by
step (``flash_attn_fwd_softmax_lse_correction``), then the output, in the input dtype, zero-filled
and corrected once per step by one fused kernel (``flash_attn_fwd_out_correction``:
``out += out_step * exp(lse_step - lse)``, TE ``@jit_fuser``); gradients accumulate in the input
dtype (``dq.add_``, the K/V gradient added into the buffer received from the previous rank).
NB: TE runs alternate steps on two CUDA streams so that one step's kernel overlaps the next; here
they are one stream.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from heterosim.errors import ConfigError
from models.layers.fusions import jit_fuser
from models.layers.mappings import gather_from_sp

__all__ = ["cp_attention", "RingAttention", "allgather_attention", "a2a_attention",
           "flash_fwd", "flash_bwd"]


def flash_fwd(q, k, v, causal: bool):
    """``(out, lse)`` of flash attention on ``[b, heads, s, d]`` (lse fp32 ``[b, heads, sq]``)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)


def flash_bwd(dout, q, k, v, out, lse, causal: bool):
    """``(dq, dk, dv)`` of :func:`flash_fwd` given the (merged) ``out`` and ``lse``."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout, q, k, v, out, lse, 0.0, causal)


@jit_fuser
def _lse_correction(lse: torch.Tensor, part_lse: torch.Tensor) -> torch.Tensor:
    """Log-sum-exp of two softmax partitions (TE ``flash_attn_fwd_softmax_lse_correction``): the
    online-softmax merge of Milakov & Gimelshein 2018 (arXiv:1805.02867)."""
    hi, lo = torch.max(lse, part_lse), torch.min(lse, part_lse)
    return hi + torch.log1p(torch.exp(lo - hi))


@jit_fuser
def _out_correction(out: torch.Tensor, part_out: torch.Tensor, lse: torch.Tensor, part_lse: torch.Tensor) -> None:
    """``out += part_out * exp(part_lse - lse)`` in place (TE ``flash_attn_fwd_out_correction``)."""
    out.add_(part_out * torch.exp(part_lse - lse).unsqueeze(-1))


def _combine(q: torch.Tensor, parts: list) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of partial attentions ``(out_i, lse_i, second_half_only)`` of ``q``: the
    final log-sum-exp first, then each partial output rescaled into a zero-filled output."""
    c = q.shape[2] // 2
    lse = parts[0][1].clone()
    for _, part_lse, half in parts[1:]:
        if half:
            lse[:, :, c:] = _lse_correction(lse[:, :, c:], part_lse)
        else:
            lse = _lse_correction(lse, part_lse)
    out = torch.zeros_like(q)
    for part_out, part_lse, half in parts:
        if half:
            _out_correction(out[:, :, c:], part_out, lse[:, :, c:], part_lse)
        else:
            _out_correction(out, part_out, lse, part_lse)
    return out, lse


def _exchange(send: torch.Tensor, pstate: Any) -> tuple[torch.Tensor, list]:
    """isend ``send`` to the next CP rank and irecv the same shape from the previous one."""
    ranks, r = pstate.cp_ranks, pstate.cp_rank
    nxt, prv = ranks[(r + 1) % len(ranks)], ranks[(r - 1) % len(ranks)]
    recv = torch.empty_like(send)
    if r % 2 == 0:
        works = [dist.isend(send, nxt, group=pstate.cp_group), dist.irecv(recv, prv, group=pstate.cp_group)]
    else:
        works = [dist.irecv(recv, prv, group=pstate.cp_group), dist.isend(send, nxt, group=pstate.cp_group)]
    return recv, works


def _wait(works: list) -> None:
    for w in works:
        w.wait()


class RingAttention(torch.autograd.Function):
    """Causal ring attention over CP of ``q [b, np, 2c, d]``, ``k, v [b, ng, 2c, d]``."""

    @staticmethod
    def forward(ctx, q, k, v, pstate):
        cp, r = pstate.cp_size, pstate.cp_rank
        c = q.shape[2] // 2
        kv = torch.stack((k, v))  # one p2p buffer, as TE packs K and V
        parts = []
        for i in range(cp):
            if i < cp - 1:
                nxt, works = _exchange(kv, pstate)
            if i == 0:
                parts.append((*flash_fwd(q, kv[0], kv[1], True), False))
            elif i <= r:
                parts.append((*flash_fwd(q, kv[0, :, :, :c], kv[1, :, :, :c], False), False))
            else:  # only the second query chunk sees this K/V
                parts.append((*flash_fwd(q[:, :, c:], kv[0], kv[1], False), True))
            if i < cp - 1:
                _wait(works)
                kv = nxt
        out, lse = _combine(q, parts)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.pstate = pstate
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        pstate = ctx.pstate
        cp, r = pstate.cp_size, pstate.cp_rank
        c = q.shape[2] // 2
        dout = dout.contiguous()
        kv = torch.stack((k, v))
        dq = None
        dkv_works: list = []
        dkv_recv = None
        for i in range(cp):
            if i < cp - 1:
                nxt, works = _exchange(kv, pstate)
            if i == 0:
                gq, gk, gv = flash_bwd(dout, q, kv[0], kv[1], out, lse, True)
                dq = gq
            elif i <= r:
                gq, gk, gv = flash_bwd(dout, q, kv[0, :, :, :c], kv[1, :, :, :c], out, lse, False)
                dq.add_(gq)
            else:
                gq, gk, gv = flash_bwd(dout[:, :, c:], q[:, :, c:], kv[0], kv[1], out[:, :, c:],
                                       lse[:, :, c:], False)
                dq[:, :, c:].add_(gq)
            part = torch.stack((gk, gv))  # TE packs dK and dV as it packs K and V
            if i == 0:
                dkv = part
            else:  # add into the partial gradient of this K/V block received from the ranks before
                _wait(dkv_works)
                dkv = dkv_recv
                (dkv[:, :, :, :c] if i <= r else dkv).add_(part)
            # Pass this block's gradient on; after the last step it lands on its owner.
            dkv_recv, dkv_works = _exchange(dkv, pstate)
            if i < cp - 1:
                _wait(works)
                kv = nxt
        _wait(dkv_works)
        return dq, dkv_recv[0], dkv_recv[1], None


class _SegmentedAttention(torch.autograd.Function):
    """``q`` attending several K/V segments (each causal or not), merged by log-sum-exp."""

    @staticmethod
    def forward(ctx, q, causal, *kvs):
        parts = [(*flash_fwd(q, kvs[2 * j], kvs[2 * j + 1], is_causal), False) for j, is_causal in enumerate(causal)]
        out, lse = _combine(q, parts)
        ctx.causal = causal
        ctx.save_for_backward(q, out, lse, *kvs)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, out, lse, *kvs = ctx.saved_tensors
        dout = dout.contiguous()
        dq = None
        grads = []
        for j, is_causal in enumerate(ctx.causal):
            gq, gk, gv = flash_bwd(dout, q, kvs[2 * j], kvs[2 * j + 1], out, lse, is_causal)
            dq = gq if dq is None else dq.add_(gq)
            grads += [gk, gv]
        return (dq, None, *grads)


def _sequence_order(cp: int) -> torch.Tensor:
    """Index that puts rank-major gathered chunks ``(r, 2cp-1-r)`` back into sequence order."""
    held = [x for r in range(cp) for x in (r, 2 * cp - 1 - r)]
    return torch.tensor(sorted(range(2 * cp), key=lambda j: held[j]), dtype=torch.long)


def _to_sequence_order(t: torch.Tensor, cp: int) -> torch.Tensor:
    """``[s, ...]`` gathered rank-major -> sequence order (dim 0 split into 2cp chunks)."""
    chunks = t.view(2 * cp, t.shape[0] // (2 * cp), *t.shape[1:])
    return chunks.index_select(0, _sequence_order(cp).to(t.device)).reshape(t.shape)


def _from_sequence_order(t: torch.Tensor, cp: int) -> torch.Tensor:
    inverse = torch.argsort(_sequence_order(cp))
    chunks = t.view(2 * cp, t.shape[0] // (2 * cp), *t.shape[1:])
    return chunks.index_select(0, inverse.to(t.device)).reshape(t.shape)


def _bhsd(t: torch.Tensor) -> torch.Tensor:
    return t.permute(1, 2, 0, 3)  # [s, b, h, d] -> [b, h, s, d]


def allgather_attention(q, k, v, pstate) -> torch.Tensor:
    """All-gather K/V over CP; each local query chunk attends its causal prefix. ``[s_l, b, h, d]``."""
    cp, r = pstate.cp_size, pstate.cp_rank
    c = q.shape[0] // 2
    kg = _bhsd(_to_sequence_order(gather_from_sp(k, pstate.cp_group), cp))
    vg = _bhsd(_to_sequence_order(gather_from_sp(v, pstate.cp_group), cp))
    outs = []
    for half, chunk in enumerate((r, 2 * cp - 1 - r)):
        qh = _bhsd(q[half * c:(half + 1) * c])
        segs, causal = [], []
        if chunk > 0:
            segs += [kg[:, :, :chunk * c], vg[:, :, :chunk * c]]
            causal.append(False)
        segs += [kg[:, :, chunk * c:(chunk + 1) * c], vg[:, :, chunk * c:(chunk + 1) * c]]
        causal.append(True)
        outs.append(_SegmentedAttention.apply(qh, tuple(causal), *segs))
    return torch.cat(outs, dim=2)  # [b, h, s_l, d]


class _AllToAll(torch.autograd.Function):
    """Sequence-split ``[s_l, b, h, d]`` <-> head-split ``[s, b, h/cp, d]`` over ``group``."""

    @staticmethod
    def forward(ctx, x, group, to_heads):
        ctx.group, ctx.to_heads = group, to_heads
        return _a2a(x, group, to_heads)

    @staticmethod
    def backward(ctx, g):
        return _a2a(g.contiguous(), ctx.group, not ctx.to_heads), None, None


def _a2a(x, group, to_heads: bool):
    cp = dist.get_world_size(group)
    if to_heads:
        s_l, b, h, d = x.shape
        send = x.reshape(s_l, b, cp, h // cp, d).permute(2, 0, 1, 3, 4).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        return recv.reshape(cp * s_l, b, h // cp, d)  # sequence rank-major
    s, b, hl, d = x.shape
    send = x.reshape(cp, s // cp, b, hl, d).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(s // cp, b, cp * hl, d)


def a2a_attention(q, k, v, pstate) -> torch.Tensor:
    """Ulysses: all-to-all to head-split, full causal attention, all-to-all back. ``[b, h, s_l, d]``."""
    cp, g = pstate.cp_size, pstate.cp_group
    if q.shape[2] % cp or k.shape[2] % cp:
        raise ConfigError(f"--cp-comm-type a2a needs attention heads per TP rank ({q.shape[2]}) and "
                          f"query groups per TP rank ({k.shape[2]}) divisible by cp = {cp}")
    qs, ks, vs = (_to_sequence_order(_AllToAll.apply(t, g, True), cp) for t in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(
        _bhsd(qs), _bhsd(ks), _bhsd(vs), is_causal=True, enable_gqa=ks.shape[2] != qs.shape[2])
    o = _from_sequence_order(o.permute(2, 0, 1, 3), cp)  # [s, b, h/cp, d]
    return _bhsd(_AllToAll.apply(o.contiguous(), g, False))


def cp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pstate: Any) -> torch.Tensor:
    """Causal attention of this CP rank's chunks: ``q [s_l, b, np, d]`` -> ``[s_l, b, np*d]``."""
    s_l, b, np_, d = q.shape
    kind = pstate.cp_comm_type
    if kind == "p2p":
        out = RingAttention.apply(_bhsd(q), _bhsd(k), _bhsd(v), pstate)
    elif kind == "all_gather":
        out = allgather_attention(q, k, v, pstate)
    elif kind == "a2a":
        out = a2a_attention(q, k, v, pstate)
    else:
        raise ConfigError(f"unknown --cp-comm-type {kind!r}; valid: ['a2a', 'all_gather', 'p2p']")
    return out.permute(2, 0, 1, 3).reshape(s_l, b, np_ * d)
