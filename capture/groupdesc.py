"""Parallel dimensions named by a process group's description (``new_group(group_desc=...)``).

torch lets a script describe each group it creates (``torch.distributed.new_group(ranks,
group_desc="TENSOR_MODEL_PARALLEL_GROUP")``). Libraries that build their groups themselves set it:
megatron-core's ``parallel_state.initialize_model_parallel`` describes every group it creates, so a
script that calls it unmodified gets its tp / pp / dp / cp / ep groups labelled (roles and
breakdowns need the labels, :mod:`capture.roles`), as a script using
:class:`heterosim.annotate.Annotator` labels its own.

The names below are megatron-core's (``megatron/core/parallel_state.py``, 0.16); a ``_GLOO`` suffix
(the CPU twin of a group, created beside it) names the same dimension. Groups mixing dimensions
(``MODEL_PARALLEL_GROUP`` = tp x pp, ``TENSOR_AND_DATA_PARALLEL_GROUP`` ...) are left ``other``.
"""

from __future__ import annotations

__all__ = ["DIM_OF_DESC", "dim_of_desc"]

DIM_OF_DESC: dict[str, str] = {
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "EXPERT_TENSOR_PARALLEL_GROUP": "tp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    # The first and last stages' tied word (and position) embeddings: pipeline traffic, as
    # models/pretrain_gpt.py labels its own embedding group.
    "EMBEDDING_GROUP": "pp",
    "POSITION_EMBEDDING_GROUP": "pp",
    "DATA_PARALLEL_GROUP": "dp",
    "DATA_PARALLEL_GROUP_WITH_CP": "dp",  # the gradient group of megatron-core's DDP (dp x cp)
    "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "dp",
    "EXPERT_DATA_PARALLEL_GROUP": "dp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
}
"""Group description -> parallel dimension (``heterosim.trace.ir.PARALLEL_DIMS``)."""


def dim_of_desc(desc: str | None) -> str | None:
    """The parallel dimension a group description names, or None (no description, or a group
    that is not one dimension's)."""
    if not desc:
        return None
    key = desc.upper()
    if key.endswith("_GLOO"):
        key = key[: -len("_GLOO")]
    return DIM_OF_DESC.get(key)
