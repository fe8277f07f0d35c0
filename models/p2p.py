"""Point-to-point exchange between pipeline stages, as Megatron-core's ``p2p_communication.py``.

:class:`PipelineComm` is what the schedules (:mod:`models.schedules`) call to send activations
forward and gradients backward: Megatron's ``_communicate`` on its batched path, with the
scatter/gather optimization of Megatron-LM releases before Megatron-core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["PipelineComm"]

Tensor = torch.Tensor


_ACT, _GRAD = 0, 1
"""p2p tags: activations travel forward, gradients backward."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineComm:
    """Point-to-point exchange of activations and gradients between neighbouring pipeline stages.

    ``rank``/``size`` are this rank's place in ``group`` (the pipeline); neighbours wrap around as
    Megatron's ``get_pipeline_model_parallel_next_rank`` does (needed by the interleaved schedule,
    where the last stage feeds chunk c+1 of the first stage).
    """

    group: Any
    rank: int
    size: int
    shape: tuple[int, ...]
    """Shape of every activation / gradient exchanged ([s_local, b, h])."""
    dtype: torch.dtype
    scatter_gather_group: Any = None
    """Megatron-LM's scatter/gather optimization (Narayanan et al., SC'21, section 4.1; on by default
    in releases before Megatron-core, ``--no-scatter-gather-tensors-in-pipeline``): each of the
    ``tp`` ranks of this tensor-parallel group sends only its 1/tp slice of the (replicated)
    tensor over the network, and the receivers all-gather the slices over their NVLink. None: every
    rank sends the whole tensor (Megatron-core)."""
    overlap: bool = False
    """``--overlap-p2p-communication``: the interleaved schedule leaves exchanges in flight under
    the next step (:mod:`models.schedules`)."""

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.size - 1

    def communicate(
        self,
        *,
        send_next: Tensor | None = None,
        send_prev: Tensor | None = None,
        recv_prev: bool = False,
        recv_next: bool = False,
        wait: bool = True,
    ) -> Any:
        """Megatron ``_communicate`` (batched path): returns (tensor from prev, tensor from next).

        Op order is Megatron's ``_batched_p2p_ops``: send prev, recv prev, send next, recv next;
        all requests are waited at once (``batch_p2p_sync``). Peers are group-relative ranks.
        ``wait=False`` (``--overlap-p2p-communication``): nothing is waited and the requests come
        back as a third element, to be waited where the received tensor is needed.
        """
        prev, nxt = (self.rank - 1) % self.size, (self.rank + 1) % self.size
        sg = self.scatter_gather_group
        tp = dist.get_world_size(sg) if sg is not None else 1
        numel = math.prod(self.shape)
        if tp > 1 and numel % tp == 0:
            r = dist.get_rank(sg)
            part = (numel // tp,)

            def cut(t: Tensor | None) -> Tensor | None:  # Megatron split_tensor_into_1d_equal_chunks
                return None if t is None else t.reshape(-1)[r * part[0]:(r + 1) * part[0]]

            send_next, send_prev = cut(send_next), cut(send_prev)
        else:
            tp, part = 1, self.shape
        # Received activations need grad: the stage's backward returns d(loss)/d(input).
        from_prev = torch.empty(part, dtype=self.dtype, requires_grad=tp == 1) if recv_prev else None
        from_next = torch.empty(part, dtype=self.dtype) if recv_next else None
        # Tags keep the two directions apart where prev and next are one peer (two stages of an
        # interleaved pipeline): activations 0, gradients 1, so a send of one is never matched with
        # a receive of the other (gloo matches by peer and tag, in order). NCCL ignores tags.
        ops = []
        if send_prev is not None:
            ops.append(dist.P2POp(dist.isend, send_prev, group=self.group, group_peer=prev, tag=_GRAD))
        if from_prev is not None:
            ops.append(dist.P2POp(dist.irecv, from_prev, group=self.group, group_peer=prev, tag=_ACT))
        if send_next is not None:
            ops.append(dist.P2POp(dist.isend, send_next, group=self.group, group_peer=nxt, tag=_ACT))
        if from_next is not None:
            ops.append(dist.P2POp(dist.irecv, from_next, group=self.group, group_peer=nxt, tag=_GRAD))
        reqs = dist.batch_isend_irecv(ops) if ops else []
        if not wait:
            if tp > 1:
                raise ValueError("overlapped p2p has no scatter/gather path (Megatron-core has neither)")
            return from_prev, from_next, reqs
        for req in reqs:
            req.wait()
        if tp > 1:  # Megatron gather_split_1d_tensor: all-gather the slices over the TP group
            def gather(t: Tensor | None) -> Tensor | None:
                if t is None:
                    return None
                full = torch.empty(numel, dtype=self.dtype)
                dist.all_gather_into_tensor(full, t, group=sg)
                return full.view(self.shape)

            from_prev, from_next = gather(from_prev), gather(from_next)
            if from_prev is not None:
                from_prev.requires_grad_()
        return from_prev, from_next

    # Megatron's 1F1B helpers: the first stage receives no activations, the last no gradients.
    def recv_forward(self) -> Tensor | None:
        return None if self.is_first else self.communicate(recv_prev=True)[0]

    def recv_backward(self) -> Tensor | None:
        return None if self.is_last else self.communicate(recv_next=True)[1]

    def send_forward(self, out: Tensor | None) -> None:
        if not self.is_last:
            self.communicate(send_next=out)

    def send_backward(self, grad: Tensor | None) -> None:
        if not self.is_first:
            self.communicate(send_prev=grad)

    def send_forward_recv_backward(self, out: Tensor | None) -> Tensor | None:
        return None if self.is_last else self.communicate(send_next=out, recv_next=True)[1]

    def send_backward_recv_forward(self, grad: Tensor | None) -> Tensor | None:
        return None if self.is_first else self.communicate(send_prev=grad, recv_prev=True)[0]
