"""Shared strategies for the property-based tests of the readers (trace, cluster, cases, kernel DB):
any JSON-like value put at any path of a valid document."""

from __future__ import annotations

import copy
from typing import Any, Iterator

from hypothesis import strategies as st

SCALARS = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats()
           | st.text(max_size=12) | st.sampled_from(["not stated", "12 (approx.)", "0", "-1", "1e300", "nan"]))
VALUES = st.recursive(SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                      max_leaves=8)


def paths(doc: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path into a JSON-like document (dict keys and list indices), the root included."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, prefix + (i,))


def mutated(data: Any, doc: Any) -> Any:
    """A copy of ``doc`` with one value, drawn from ``data``, put at one path drawn from it."""
    doc = copy.deepcopy(doc)
    path = data.draw(st.sampled_from(sorted(paths(doc), key=str)))
    value = data.draw(VALUES)
    if not path:
        return value
    d = doc
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    return doc
