"""The registry of collective algorithms: the one place an algorithm is defined.

Each algorithm is one :class:`~ncclshim.algorithms.entry.Algorithm` entry (availability, cost,
flow template). :mod:`ncclshim.tuning` scans the registry to choose (algorithm, protocol) and
parse ``NCCL_ALGO``; :mod:`ncclshim.flows` asks it for an algorithm's flows. Nothing else
branches on algorithm names.

Order is selection order: the scan keeps the first of equally fast choices, so the built-ins are
registered in NCCL's order (:data:`ncclshim.constants.ALGOS`, ``nccl_tuner.h``), then HeteroSim's
extensions (``COHERENT_RING``); :func:`register` appends after them. Built-in entries live in
:mod:`~ncclshim.algorithms.ring` (RING, COHERENT_RING), :mod:`~ncclshim.algorithms.tree` (TREE,
PAT) and :mod:`~ncclshim.algorithms.sharp` (NVLS, NVLS_TREE, COLLNET_DIRECT, COLLNET_CHAIN).

Planners cache their choices: register an algorithm before planning on a view (a view planned
before keeps its cached choices).
"""

from __future__ import annotations

from heterosim.errors import UnsupportedCollectiveError
from ncclshim.algorithms import ring, sharp, tree
from ncclshim.algorithms.entry import Algorithm, FlowSpec, Query
from ncclshim.constants import ALGOS, PROTOS

__all__ = ["Algorithm", "Query", "FlowSpec", "register", "unregister", "get", "names", "entries", "spellings"]

_REGISTRY: dict[str, Algorithm] = {}


def _valid() -> str:
    return ", ".join(_REGISTRY)


def get(name: str) -> Algorithm:
    """The entry named ``name`` (NCCL's upper-case name, e.g. ``"RING"``).

    Raises:
        UnsupportedCollectiveError: no such algorithm; the message lists the registered names.
    """
    entry = _REGISTRY.get(name)
    if entry is None:
        raise UnsupportedCollectiveError(f"unknown collective algorithm {name!r}; valid: {_valid()}")
    return entry


def names() -> tuple[str, ...]:
    """Registered algorithm names in selection order."""
    return tuple(_REGISTRY)


def entries() -> tuple[Algorithm, ...]:
    """Registered entries in selection order."""
    return tuple(_REGISTRY.values())


def spellings() -> dict[str, frozenset[str]]:
    """``NCCL_ALGO`` token (lower case) -> the names it selects (``collnet`` -> both CollNets)."""
    out: dict[str, set[str]] = {}
    for entry in _REGISTRY.values():
        for token in entry.spellings:
            out.setdefault(token, set()).add(entry.name)
    return {token: frozenset(chosen) for token, chosen in out.items()}


def register(entry: Algorithm) -> Algorithm:
    """Add ``entry`` after the registered algorithms (last in the scan: it wins only when strictly faster).

    Raises:
        UnsupportedCollectiveError: the name is taken, a spelling is not lower case, or a
            protocol is not one of NCCL's.
    """
    if entry.name in _REGISTRY:
        raise UnsupportedCollectiveError(f"collective algorithm {entry.name!r} is already registered; "
                                         "unregister it first")
    bad = [t for t in entry.spellings if t != t.lower() or not t]
    if bad or not entry.spellings:
        raise UnsupportedCollectiveError(f"algorithm {entry.name!r}: NCCL_ALGO spellings must be non-empty "
                                         f"lower-case tokens, got {entry.spellings!r}")
    odd = sorted({p for protos in entry.protocols.values() for p in protos} - set(PROTOS))
    if odd:
        raise UnsupportedCollectiveError(f"algorithm {entry.name!r}: unknown protocol(s) {', '.join(odd)}; "
                                         f"valid: {', '.join(PROTOS)}")
    _REGISTRY[entry.name] = entry
    return entry


def unregister(name: str) -> Algorithm:
    """Remove and return the entry named ``name`` (raises like :func:`get` when there is none)."""
    entry = get(name)
    del _REGISTRY[name]
    return entry


def _register_builtins() -> None:
    builtin = {e.name: e for e in ring.ENTRIES + tree.ENTRIES + sharp.ENTRIES}
    missing = [a for a in ALGOS if a not in builtin]
    if missing:  # a programming error: constants.ALGOS names an algorithm with no entry
        raise UnsupportedCollectiveError(f"NCCL algorithm(s) {', '.join(missing)} have no registry entry")
    for name in ALGOS:  # NCCL's order decides ties
        register(builtin.pop(name))
    for entry in builtin.values():  # then the extensions, in module order
        register(entry)


_register_builtins()
