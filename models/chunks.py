"""Which model chunks of a pipeline stage run the same ops: their structure, compared.

With virtual pipeline stages a rank holds several model chunks (Megatron's ``model[i]``). Chunks
built alike (the same module types, parameter shapes and settings; only their layers' global
numbers differ) issue the same ops in their forward and backward, so a capture records one chunk
of each class and references it for the others (:mod:`models.schedules`, ``chunk_classes``).
The first stage's first chunk (embedding) and the last stage's last chunk (output layer and loss)
are usually classes of their own.

Example::

    chunk_classes([embed_and_4_layers, four_layers, four_layers])   # [0, 1, 1]
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

from torch import nn

__all__ = ["IDENTITY_ATTRIBUTES", "module_structure", "chunk_classes"]

IDENTITY_ATTRIBUTES = frozenset({"chunk", "layer_number", "replicated_seed"})
"""Module attributes that name a chunk (``models.gpt.GPTModel``) or a layer, or seed its initial
values (``models.transformer.TransformerLayer``), without changing the ops it runs: left out of
the comparison."""

_SIMPLE = (bool, int, float, str, type(None))


def _simple(v: Any) -> bool:
    return isinstance(v, _SIMPLE) or (isinstance(v, tuple) and all(_simple(x) for x in v))


def module_structure(module: nn.Module) -> Hashable:
    """What decides the ops ``module`` runs: per submodule its path, type, simple settings (bools,
    numbers, strings and tuples of them, except :data:`IDENTITY_ATTRIBUTES`) and the shape, dtype
    and ``requires_grad`` of its own parameters and buffers.

    Objects held as settings (configs, process groups) are not compared: the chunks of one rank
    share them. A setting kept in a list or dict would be missed; the models here keep none.
    """
    out = []
    for path, m in module.named_modules():
        settings = tuple(sorted((k, v) for k, v in vars(m).items()
                                if not k.startswith("_") and k not in IDENTITY_ATTRIBUTES and _simple(v)))
        tensors = tuple((n, tuple(t.shape), str(t.dtype), t.requires_grad)
                        for n, t in (*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)))
        out.append((path, type(m).__qualname__, settings, tensors))
    return tuple(out)


def chunk_classes(chunks: Sequence[nn.Module]) -> list[int]:
    """For each chunk, the index of the first chunk with the same :func:`module_structure`."""
    first: dict[Hashable, int] = {}
    return [first.setdefault(module_structure(c), i) for i, c in enumerate(chunks)]
