"""``torch.distributed.pipelining`` under capture: a stage's shape inference without its peers' data.

A ``PipelineStage`` built without example shapes infers them on the first step (torch 2.13,
``stage.py``): stage k receives its inputs' metadata from stage k-1 (``_StageForwardMeta``), runs
its forward, sends its outputs' metadata on; then, from the last stage back, stage k receives the
metadata of its outputs' gradients from stage k+1 (``_StageBackwardMeta``), runs a backward and
sends its inputs' gradient metadata back. Every exchange is a ``recv_object_list``.

Forward metadata flows to higher ranks, so :mod:`capture.objectp2p`'s mailbox has it (the earlier
stage's captured rank sent it). Backward metadata flows to lower ranks, which run first (rank 0
runs alone to find the roles), so :func:`answer` derives it here: the gradient of a stage output
has the output's shape, stride and dtype, ``None`` where the output needs no gradient: torch's own
rule for a stage given its shapes statically (``_derive_grad_metas``, used when the user passes no
``output_grads``). Where that rule does not hold torch itself asks for explicit gradients
(a DTensor output: its gradient may be ``Partial``), and so does :class:`PipelineGradMetaError`.

The warm-up vote before the inference (is every stage static?) reads a received tensor back; the
read returns the host-sync placeholder 0, so the stages infer their shapes as when any stage was
given none. Both exchanges run in the first step, which the trace does not keep.
"""

from __future__ import annotations

import sys
from typing import Any

from heterosim.errors import ScriptError

__all__ = ["answer", "PipelineGradMetaError"]


class PipelineGradMetaError(ScriptError):
    """A stage's output gradient metadata cannot be derived from its output metadata."""


def _receiving_stage(src: int) -> Any | None:
    """The ``PipelineStage`` whose ``_recv_meta`` is receiving from global rank ``src`` now."""
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_name == "_recv_meta" and f.f_code.co_filename.endswith("pipelining/stage.py"):
            return f.f_locals.get("self")
        f = f.f_back
    return None


def answer(src: int, n: int) -> list[Any] | None:
    """The ``_StageBackwardMeta`` a stage's next stage sends it, derived from its own outputs;
    None for any other receive (forward metadata comes from the mailbox)."""
    stage = _receiving_stage(src)
    if stage is None or n != 1 or stage.is_last:
        return None
    if stage._resolve_peer_global_rank(stage.stage_index + 1) != src:
        return None  # forward metadata from the previous stage
    from torch.distributed.pipelining._utils import _DTensorMeta, _derive_grad_metas
    from torch.distributed.pipelining.stage import _StageBackwardMeta

    outputs = stage._stage_meta.outputs
    if outputs is None:
        return None
    for i, m in enumerate(outputs):
        if isinstance(m, _DTensorMeta) and m.requires_grad:
            raise PipelineGradMetaError(
                f"pipeline stage {stage.stage_index}'s output {i} is a DTensor: the metadata of its gradient "
                f"(placements) comes from stage {stage.stage_index + 1}, whose data a fake rank does not hold. "
                "Give the stage its output_grads (PipelineStage(..., output_args=..., output_grads=...)).")
    return [_StageBackwardMeta(backward_metas=_derive_grad_metas(outputs))]
