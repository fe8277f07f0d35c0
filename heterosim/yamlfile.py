"""Reading the project's YAML files: one error wording for a missing file, bad YAML or schema.

Bounded: a document whose aliases would expand past :data:`MAX_NODES` nodes (a "billion laughs"
alias bomb) is refused before anything walks it, and a binary file is refused as not text.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from heterosim.errors import ConfigError, HeteroSimError

__all__ = ["read_yaml", "MAX_NODES"]

MAX_NODES = 1_000_000
"""The most YAML nodes a document may expand to, aliases counted at each use (the largest
project file, a 70-row case file, has about 10,000)."""


def _expanded_size(root: Any) -> int:
    """Nodes of the document with every alias expanded, counted without expanding (memoised)."""
    import yaml

    sizes: dict[int, int] = {}
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[id(node)] = 1
            continue
        kids = [k for pair in node.value for k in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
        if done:
            sizes[id(node)] = min(1 + sum(sizes.get(id(k), 0) for k in kids), MAX_NODES + 1)
        else:
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in sizes)
    return sizes[id(root)]


def _load(text: str) -> Any:
    """The document of ``text``: parsed by libyaml where PyYAML has it (8-10x faster); a document
    libyaml refuses is parsed again by the pure-Python loader, whose error says more (it quotes the
    offending line)."""
    import yaml

    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            return _load_with(fast, text)
        except yaml.YAMLError:
            pass
    return _load_with(yaml.SafeLoader, text)


def _load_with(loader_cls: Any, text: str) -> Any:
    import yaml

    loader = loader_cls(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node) > MAX_NODES:
            raise yaml.YAMLError(f"its aliases expand to more than {MAX_NODES:,} nodes (an alias bomb?)")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml(path: str | os.PathLike, what: str, *, error: type[HeteroSimError] = ConfigError,
              schema_version: int | None = None, hint: str = "") -> Any:
    """The parsed document of ``path``, a ``what`` ("cases file", "cluster file", ...).

    Raises ``error`` with "<what> <path>: cannot read it (...)", "...: not valid YAML (...)" or,
    when ``schema_version`` is given and the top-level mapping does not carry it,
    "...: schema_version X is not supported; write schema_version: N" followed by ``hint``.
    """
    import yaml

    p = Path(path)
    try:
        doc = _load(p.read_bytes().decode("utf-8"))
    except OSError as e:
        raise error(f"{what} {p}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise error(f"{what} {p}: not a text (UTF-8 YAML) file") from None
    except (yaml.YAMLError, RecursionError) as e:
        raise error(f"{what} {p}: not valid YAML ({e})") from None
    if schema_version is not None:
        got = doc.get("schema_version") if isinstance(doc, dict) else None
        if got != schema_version:
            raise error(f"{what} {p}: schema_version {got!r} is not supported; write "
                        f"schema_version: {schema_version}{hint}")
    return doc
