"""Megatron-core's pipeline layouts (``--pipeline-model-parallel-layout``): which layers each virtual
pipeline stage holds.

A layout string such as ``"Et|(tt|)*30mL"`` (Megatron-core's ``PipelineParallelLayerLayout``,
``megatron/core/transformer/pipeline_parallel_layer_layout.py``) lists the virtual stages in layer
order; stage ``s`` of ``pp`` holds virtual stages ``s, s + pp, s + 2 pp, ...``. Both the model
(``models.parallel_state``) and the case reader (``heterosim.validation``, which checks a recipe's
layout against a case without importing torch) read it here.
"""

from __future__ import annotations

import re

from heterosim.errors import ConfigError

__all__ = ["parse_pipeline_layout"]

_LAYOUT_SYMBOLS = {"E": "the input embedding", "t": "a transformer layer", "m": "a multi-token prediction layer",
                   "L": "the loss"}


def parse_pipeline_layout(text: str, pp: int) -> tuple[tuple[int, ...], int, int]:
    """``(layers per virtual stage, virtual stages per rank, MTP layers)`` of a Megatron-core
    ``--pipeline-model-parallel-layout`` such as ``"Et|(tt|)*30mL"``: ``|`` ends a virtual stage,
    ``X*N`` and ``(...)*N`` repeat, ``E`` / ``L`` (embedding / loss) open the first and close the last
    stage, ``t`` is a transformer layer, ``m`` an MTP layer, commas are cosmetic (Megatron-core's
    ``parse_str_to_list`` drops them); ``pp x vpp`` stages in layer order."""
    expanded = re.sub(r"[\s,]+", "", text)
    while True:
        nxt = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), expanded)
        nxt = re.sub(r"([EtmL|])\*(\d+)", lambda m: m.group(1) * int(m.group(2)), nxt)
        if nxt == expanded:
            break
        expanded = nxt
    stages = expanded.split("|")
    bad = sorted(set(expanded) - set(_LAYOUT_SYMBOLS) - {"|"})
    if bad or len(stages) % pp:
        raise ConfigError(f"--pipeline-model-parallel-layout {text!r}: "
                          + (f"unknown symbol {bad[0]!r}; valid: " + ", ".join(f"{k} ({v})" for k, v in _LAYOUT_SYMBOLS.items())
                             if bad else f"{len(stages)} virtual stages do not divide over {pp} pipeline stages"))
    inner = "".join(stages[1:]) + stages[0].lstrip("E")
    if "E" in inner or "L" in "".join(stages[:-1]) + stages[-1].rstrip("L"):
        raise ConfigError(f"--pipeline-model-parallel-layout {text!r}: E may only open the first virtual stage "
                          "and L only close the last")
    return tuple(st.count("t") for st in stages), len(stages) // pp, expanded.count("m")
