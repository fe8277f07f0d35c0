"""The dependency direction of DESIGN.md, read from every module's imports.

Layers, ground first: ``heterosim`` (errors, atomic writes, YAML reading, the fork pool), the trace
(``heterosim.trace``) and the cluster model (``heterosim.cluster``); the workload (``models``,
``capture``: capture imports nothing of ``models``, so a user's own ``models`` package wins); the plan (``kernel_db``, ``ncclshim``: read traces and the cluster model, never
``replay``); the engine (``replay``); validation on top (``heterosim.validation``, the only code
that drives capture and replay together). Every import counts, lazy and ``TYPE_CHECKING`` ones
included: an arrow is an arrow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("heterosim", "models", "capture", "kernel_db", "ncclshim", "replay")

# unit -> the units it may import (besides itself); a unit is the longest matching prefix
BASE = {"heterosim"}
GROUND = BASE | {"heterosim.trace", "heterosim.cluster"}
ALLOWED: dict[str, set[str]] = {
    "heterosim": set(),
    "heterosim.trace": BASE,
    "heterosim.cluster": BASE,
    "models": GROUND,
    "capture": GROUND,
    "kernel_db": GROUND,
    "ncclshim": GROUND,
    "replay": GROUND | {"kernel_db", "ncclshim"},
    "heterosim.validation": GROUND | {"models", "capture", "kernel_db", "ncclshim", "replay"},
}
# Command lines are programs, not layers, but one sits below what it runs: DESIGN.md's stable
# ``python -m replay validate`` forwards to the validation layer.
CLI_EXCEPTIONS = {("replay.__main__", "heterosim.validation")}


def _unit(module: str) -> str | None:
    best = None
    for u in ALLOWED:
        if module == u or module.startswith(u + "."):
            if best is None or len(u) > len(best):
                best = u
    return best


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            rel = p.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = p
    return out


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Project modules that ``module`` imports anywhere in its file (resolved to known modules)."""
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != module:
                found.add(n)
    return found


def _graph() -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for m, p in mods.items():
        for t in _imports(m, p, set(mods)):
            g.add_edge(m, t)
    return g


def test_every_module_belongs_to_a_layer():
    assert [m for m in _graph() if _unit(m) is None] == []


def test_no_import_runs_against_the_layer_order():
    bad = []
    for a, b in _graph().edges:
        ua, ub = _unit(a), _unit(b)
        if ua != ub and ub not in ALLOWED[ua] and (a, ub) not in CLI_EXCEPTIONS:
            bad.append(f"{a} -> {b}")
    assert bad == [], "imports against the layer order:\n" + "\n".join(bad)


def test_no_import_circle_between_files():
    """A package's ``__init__`` importing its own modules (re-exports) is left out; every other
    arrow of an ``__init__`` counts."""
    g = _graph()
    mods = _modules()
    g.remove_edges_from([(a, b) for a, b in list(g.edges) if mods[a].name == "__init__.py" and b.startswith(a + ".")])
    circles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert circles == [], f"import circles: {circles}"
