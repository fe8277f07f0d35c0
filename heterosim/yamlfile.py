"""Reading the project's YAML files: one error wording for a missing file, bad YAML or schema."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from heterosim.errors import ConfigError, HeteroSimError

__all__ = ["read_yaml"]


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
        doc = yaml.safe_load(p.read_text())
    except OSError as e:
        raise error(f"{what} {p}: cannot read it ({e})") from e
    except yaml.YAMLError as e:
        raise error(f"{what} {p}: not valid YAML ({e})") from e
    if schema_version is not None:
        got = doc.get("schema_version") if isinstance(doc, dict) else None
        if got != schema_version:
            raise error(f"{what} {p}: schema_version {got!r} is not supported; write "
                        f"schema_version: {schema_version}{hint}")
    return doc
