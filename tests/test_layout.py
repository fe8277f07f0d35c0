"""Tests of ``heterosim.layout``: Megatron-core's pipeline layout strings, their repeats, cosmetic
commas and the errors for a bad one."""

from __future__ import annotations

import pytest

from heterosim.errors import ConfigError
from heterosim.layout import parse_pipeline_layout


def test_pipeline_layout_commas_are_cosmetic():
    """Megatron Bridge's Llama 3 70B H100 fp8 layout (pp 8, vpp 5) writes commas between parts, which
    Megatron-core drops: 40 virtual stages of 2 layers, but the 36th of 3 and the last of 1 beside
    the loss (80 layers)."""
    counts, vpp, mtp = parse_pipeline_layout("Et*2|(t*2|)*34,t*3|(t*2|)*3,tL", 8)
    assert (len(counts), vpp, mtp, sum(counts), counts[35], counts[39]) == (40, 5, 0, 80, 3, 1)
    assert set(counts[:35]) == set(counts[36:39]) == {2}


@pytest.mark.parametrize("text,message", [
    ("Et|tx|L", r"unknown symbol 'x'; valid: E \(the input embedding\), t \(a transformer layer\)"),
    ("Et|tt|L", r"3 virtual stages do not divide over 2 pipeline stages"),
    ("t|Et|tt|L", r"E may only open the first virtual stage and L only close the last"),
])
def test_pipeline_layout_errors(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_pipeline_layout(text, 2)
