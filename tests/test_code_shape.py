"""The project's shape rules over its packages: no module over 600 lines, no function over 100.

A module is one concept (split past 600 lines); a function is short and named for what it does.
Nested functions and methods count on their own; tests and benchmarks are not checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("heterosim", "models", "capture", "kernel_db", "ncclshim", "replay")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 100


def _sources() -> list[Path]:
    files = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
    assert files, f"no .py files under {ROOT} in {', '.join(PACKAGES)}"
    return files


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def long_functions(path: Path) -> list[tuple[int, str, int]]:
    """(line, name, length in lines) of every function or method of ``path`` over the limit."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [(node.lineno, node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_module_over_600_lines():
    over = [f"{p.relative_to(ROOT)}: {n} lines" for p in _sources() if (n := _lines(p)) > MAX_FILE_LINES]
    assert not over, (f"modules over {MAX_FILE_LINES} lines (split by concept): " + "; ".join(over))


def test_no_function_over_100_lines():
    over = [f"{p.relative_to(ROOT)}:{line} {name} ({n} lines)"
            for p in _sources() for line, name, n in long_functions(p)]
    assert not over, (f"functions over {MAX_FUNCTION_LINES} lines (split into named helpers): "
                      + "; ".join(over))
