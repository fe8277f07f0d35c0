"""A trace on disk: the directory writer and the validating loader (:mod:`heterosim.trace.ir` is
the schema they read and write).

Writing is atomic and never destroys what is not a trace (:func:`check_trace_output`). Loading
checks every field's type and range before use, so a damaged or hostile trace gives one
:class:`~heterosim.errors.TraceSchemaError` and never another exception; role files must lie inside
the trace directory.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

from heterosim.atomic import atomic_dir, check_dir_output
from heterosim.errors import TraceSchemaError
from heterosim.gcpause import paused_gc
from heterosim.trace.ir import (
    COLUMNS,
    LAUNCHES,
    OP_KINDS,
    PHASES,
    SCHEMA_VERSION,
    Block,
    GroupInfo,
    Role,
    Segment,
    Trace,
    flop_totals,
)
from heterosim.trace.memory import RoleMemory
from heterosim.trace.vocab import COLLECTIVES, KERNEL_CLASSES

__all__ = ["load_trace", "write_trace", "is_trace_dir", "check_trace_output", "MAX_WORLD_SIZE",
           "migrate_v1_to_v2"]


def migrate_v1_to_v2(body: dict[str, Any]) -> dict[str, Any]:
    """A v1 role file as v2: every block gains the ``host_sync`` column, False for every op (v1
    capture recorded no host syncs; ``.item()`` failed under it), and the ``launch`` column,
    ``eager`` for every op (v1 did not capture CUDA graphs). Blocks that are not well-formed are
    left as they are for the loader to reject."""
    blocks = body.get("blocks")
    out = {**body, "schema_version": 2}
    if isinstance(blocks, dict):
        new = {}
        for b, bd in blocks.items():
            cols = bd.get("columns") if isinstance(bd, dict) else None
            if isinstance(cols, dict) and isinstance(cols.get("kind"), list):
                n = len(cols["kind"])
                bd = {**bd, "columns": {"host_sync": [False] * n, "launch": ["eager"] * n, **cols}}
            new[b] = bd
        out["blocks"] = new
    return out


_MIGRATIONS = {1: migrate_v1_to_v2}
"""schema_version N -> the pure function that turns an N role file into N+1."""

def _check_columns(where: str, cols: Mapping[str, list], n: int) -> None:
    missing = [c for c in COLUMNS if c not in cols]
    extra = [c for c in cols if c not in COLUMNS]
    if missing or extra:
        raise TraceSchemaError(
            f"{where}: columns missing {missing} / unknown {extra}; expected exactly {list(COLUMNS)}"
        )
    for c, values in cols.items():
        if not isinstance(values, list) or len(values) != n:
            got = f"{len(values)} values" if isinstance(values, list) else f"a {type(values).__name__}"
            raise TraceSchemaError(f"{where}: column {c!r} has {got}, expected a list of n={n}")
        _check_values(where, c, values)
    for i, k in enumerate(cols["kind"]):
        if k not in OP_KINDS:
            raise TraceSchemaError(f"{where}: op {i} has kind {k!r}; valid kinds are {OP_KINDS}")
        kc = cols["kernel_class"][i]
        if kc not in KERNEL_CLASSES:
            raise TraceSchemaError(
                f"{where}: op {i} ({cols['name'][i]}) has kernel class {kc!r}; "
                f"valid classes are {KERNEL_CLASSES}"
            )
        if cols["phase"][i] not in PHASES:
            raise TraceSchemaError(f"{where}: op {i} has phase {cols['phase'][i]!r}; valid: {PHASES}")
        if k in ("collective", "p2p") and cols["collective"][i] not in COLLECTIVES:
            raise TraceSchemaError(
                f"{where}: op {i} has collective {cols['collective'][i]!r}; valid: {COLLECTIVES}"
            )
        if cols["launch"][i] not in LAUNCHES or (k != "compute" and cols["launch"][i] != "eager"):
            raise TraceSchemaError(f"{where}: op {i} ({k}) has launch {cols['launch'][i]!r}; valid: {LAUNCHES} "
                                   "(compute ops only may be part of a CUDA graph)")
        if k == "wait" and cols["target"][i] <= 0:
            raise TraceSchemaError(f"{where}: wait op {i} has no target (distance {cols['target'][i]})")


_NONNEGATIVE = ("flops", "flops_full", "bytes_read", "bytes_written", "comm_bytes", "target", "coalesced")


def _check_values(where: str, column: str, values: list) -> None:
    """Every value of ``column`` has the column's type; counts are finite and not negative."""
    t = COLUMNS[column][0]
    if t is float:
        ok = all(type(v) in (float, int) for v in values) and all(map(math.isfinite, values))
        what = "a finite number"
    elif t is int:
        ok = all(type(v) is int for v in values)
        what = "an integer"
    else:
        ok = all(type(v) is t for v in values)
        what = f"a {t.__name__}"
    if ok and column in _NONNEGATIVE:
        ok, what = min(values, default=0) >= 0, "a number >= 0"
    if not ok:
        raise TraceSchemaError(f"{where}: column {column!r} holds a value that is not {what}")


def _dumps(obj: Any) -> str:
    # sort_keys + fixed separators: byte-identical output for identical inputs.
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def is_trace_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory holding a HeteroSim trace header (any schema version)."""
    hfile = Path(path) / "trace.json"
    try:
        if not hfile.is_file() or hfile.is_symlink() or hfile.stat().st_size > (64 << 20):
            return False
        header = json.loads(hfile.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(header, dict) and header.get("format") == "heterosim-trace"


def check_trace_output(path: str | os.PathLike, *, force: bool = False) -> None:
    """Raise :class:`~heterosim.errors.OutputPathError` unless a trace may be written at ``path``:
    nothing there, an empty directory, a previous trace, or (``force``) a regular file."""
    check_dir_output(path, is_trace_dir, what="HeteroSim trace", force=force)


def write_trace(trace: Trace, path: str | os.PathLike, *, force: bool = False) -> Path:
    """Write ``trace`` to directory ``path`` atomically (all of it or nothing).

    Only a previous trace or an empty directory is replaced (``force``: a regular file too);
    see :func:`check_trace_output`.
    """
    path = Path(path)
    header = {
        "schema_version": SCHEMA_VERSION,
        "format": "heterosim-trace",
        "command": list(trace.command),
        "torch_version": trace.torch_version,
        "world_size": trace.world_size,
        "layout": trace.layout,
        "model": trace.model,
        "meta": trace.meta,
        "groups": {
            g: {"ranks": list(info.ranks), "dim": info.dim, "family": info.family}
            for g, info in sorted(trace.groups.items(), key=lambda kv: _gid_key(kv[0]))
        },
        "roles": [
            {
                "id": r.id,
                "captured_rank": r.captured_rank,
                "ranks": list(r.ranks),
                "file": f"roles/role_{r.id:04d}.json",
                "num_ops": r.num_ops,
            }
            for r in trace.roles
        ],
        "flops": flop_totals(trace),
    }
    with atomic_dir(path, is_trace_dir, what="HeteroSim trace", force=force) as tmp:
        (tmp / "roles").mkdir()
        for r in trace.roles:
            body = {
                "schema_version": SCHEMA_VERSION,
                "role": r.id,
                "captured_rank": r.captured_rank,
                "blocks": {
                    b: {"n": len(blk), "columns": {c: blk.columns[c] for c in COLUMNS}}
                    for b, blk in r.blocks.items()
                },
                "program": [[s.block, s.mb, s.chunk] for s in r.program],
            }
            if r.memory is not None:
                body["memory"] = r.memory.to_json()
            (tmp / "roles" / f"role_{r.id:04d}.json").write_text(_dumps(body) + "\n")
        (tmp / "trace.json").write_text(json.dumps(header, sort_keys=True, indent=1) + "\n")
    return path


def _gid_key(g: str) -> tuple[int, str]:
    return (int(g), g) if g.isdigit() else (1 << 60, g)


def _need(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise TraceSchemaError(f"{where}: missing key {key!r}")
    return d[key]


def _check_version(v: Any, where: str) -> None:
    if v != SCHEMA_VERSION and not (type(v) is int and v in _MIGRATIONS):
        raise TraceSchemaError(
            f"{where} has schema_version {v!r}; this HeteroSim reads schema_version "
            f"{', '.join(map(str, sorted(_MIGRATIONS)))} and {SCHEMA_VERSION}. Re-capture the trace "
            "with this version (python -m capture ...)."
        )


def _upgrade(body: dict[str, Any]) -> dict[str, Any]:
    """A role file of any version this code reads, migrated step by step to :data:`SCHEMA_VERSION`."""
    while body.get("schema_version") != SCHEMA_VERSION:
        body = _MIGRATIONS[body["schema_version"]](body)
    return body


MAX_WORLD_SIZE = 1 << 20
"""The largest world size a trace may claim (1,048,576 ranks); larger is a damaged header."""


def _read_json(file: Path, what: str) -> Any:
    """The JSON object in ``file``; one TraceSchemaError for a missing, binary or malformed file."""
    if not file.is_file():
        raise TraceSchemaError(f"{what} {file} does not exist")
    try:
        doc = json.loads(file.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise TraceSchemaError(f"{file} is not a text (UTF-8 JSON) file: it is damaged or not a trace") from None
    except ValueError as e:
        raise TraceSchemaError(f"{file} is not valid JSON: {e}") from None
    except RecursionError:
        raise TraceSchemaError(f"{file} nests too deeply to be a trace") from None
    if not isinstance(doc, dict):
        raise TraceSchemaError(f"{file} must hold a JSON object, found a {type(doc).__name__}")
    return doc


def _typed(d: Mapping[str, Any], key: str, t: type | tuple[type, ...], where: str) -> Any:
    """``d[key]``, which must exist and have type ``t`` (bool is never an int here)."""
    v = _need(d, key, where)
    names = " or ".join(x.__name__ for x in (t if isinstance(t, tuple) else (t,)))
    if not isinstance(v, t) or (isinstance(v, bool) and t is not bool):
        raise TraceSchemaError(f"{where}: {key!r} must be a {names}, found {v!r:.60}")
    return v


def _role_file(path: Path, name: Any, where: str) -> Path:
    """The role file ``name`` names, which must lie inside the trace directory ``path``."""
    if not isinstance(name, str) or not name:
        raise TraceSchemaError(f"{where}: a role's 'file' must be a path inside the trace, found {name!r:.60}")
    f = path / name
    if Path(name).is_absolute() or ".." in Path(name).parts or not f.resolve().is_relative_to(path.resolve()):
        raise TraceSchemaError(f"{where}: role file {name!r} lies outside the trace directory; "
                               "role files must be inside it (e.g. roles/role_0000.json)")
    return f


def _load_role(path: Path, rh: Any, hfile: str, groups: Mapping[str, GroupInfo], world: int) -> Role:
    if not isinstance(rh, dict):
        raise TraceSchemaError(f"{hfile}: each role must be a JSON object, found {rh!r:.60}")
    rfile = _role_file(path, _need(rh, "file", hfile), hfile)
    body = _read_json(rfile, f"{hfile} names role file")
    _check_version(body.get("schema_version"), str(rfile))
    body = _upgrade(body)
    blocks = {}
    for b, bd in _typed(body, "blocks", dict, str(rfile)).items():
        if not isinstance(bd, dict):
            raise TraceSchemaError(f"{rfile} block {b!r} must be a JSON object")
        n = _typed(bd, "n", int, f"{rfile} block {b!r}")
        _check_columns(f"{rfile} block {b!r}", _typed(bd, "columns", dict, f"{rfile} block {b!r}"), n)
        blocks[b] = Block(bd["columns"])
    program = []
    for entry in _typed(body, "program", list, str(rfile)):
        if (not isinstance(entry, list) or len(entry) != 3 or not isinstance(entry[0], str)
                or not all(type(x) is int for x in entry[1:])):
            raise TraceSchemaError(f"{rfile}: a program entry must be [block, micro-batch, chunk], found {entry!r:.60}")
        b, mb, chunk = entry
        if b not in blocks:
            raise TraceSchemaError(f"{rfile}: program references unknown block {b!r}")
        program.append(Segment(b, mb, chunk))
    ranks = _typed(rh, "ranks", list, hfile)
    if not ranks or not all(type(r) is int and 0 <= r < world for r in ranks):
        raise TraceSchemaError(f"{hfile}: a role's ranks must be ranks of the world (0..{world - 1})")
    memory = None
    if "memory" in body:  # optional: traces captured before memory was recorded have none
        memory = RoleMemory.from_json(body["memory"], str(rfile), blocks, len(program))
    role = Role(_typed(rh, "id", int, hfile), _typed(rh, "captured_rank", int, hfile), tuple(ranks), blocks, program,
                memory)
    _check_references(role, groups, str(rfile))
    return role


def _load_groups(header: Mapping[str, Any], hfile: str, world: int) -> dict[str, GroupInfo]:
    groups = {}
    for g, v in _typed(header, "groups", dict, hfile).items():
        if not isinstance(v, dict):
            raise TraceSchemaError(f"{hfile}: group {g} must be a JSON object")
        ranks = _typed(v, "ranks", list, f"{hfile} group {g}")
        bad = [r for r in ranks if type(r) is not int or not 0 <= r < world]
        if bad:
            raise TraceSchemaError(f"{hfile}: group {g} has ranks {bad[:8]} outside world size {world}")
        dim, family = v.get("dim", "other"), v.get("family", "")
        if not isinstance(dim, str) or not isinstance(family, str):
            raise TraceSchemaError(f"{hfile}: group {g}'s 'dim' and 'family' must be strings")
        groups[g] = GroupInfo(tuple(ranks), dim, family)
    return groups


@paused_gc()  # a large trace is millions of small objects (heterosim/gcpause.py)
def load_trace(path: str | os.PathLike) -> Trace:
    """Load and validate a trace directory; raises :class:`TraceSchemaError` with what is wrong.

    Everything read is checked for type and range before use (a damaged or hostile trace gives
    one TraceSchemaError, never another exception), and role files must lie inside ``path``.
    """
    path = Path(path)
    hfile = path / "trace.json"
    if not hfile.is_file():
        raise TraceSchemaError(
            f"{path} is not a HeteroSim trace: {hfile} does not exist "
            f"(create one with: python -m capture -o {path} script.py)"
        )
    header = _read_json(hfile, "trace header")
    _check_version(header.get("schema_version"), str(hfile))
    if header.get("format", "heterosim-trace") != "heterosim-trace":
        raise TraceSchemaError(f"{hfile}: format {header.get('format')!r:.60} is not 'heterosim-trace'")
    world = _typed(header, "world_size", int, str(hfile))
    if not 1 <= world <= MAX_WORLD_SIZE:
        raise TraceSchemaError(f"{hfile}: world_size {world} is outside 1..{MAX_WORLD_SIZE:,} ranks")
    for key, t in (("layout", dict), ("model", dict), ("meta", dict), ("command", list), ("torch_version", str)):
        if key in header and not isinstance(header[key], t):
            raise TraceSchemaError(f"{hfile}: {key!r} must be a {t.__name__}")
    groups = _load_groups(header, str(hfile), world)
    roles: list[Role] = []
    seen: set[int] = set()
    for rh in _typed(header, "roles", list, str(hfile)):
        role = _load_role(path, rh, str(hfile), groups, world)
        dup = seen.intersection(role.ranks)
        if dup:
            raise TraceSchemaError(f"{hfile}: ranks {sorted(dup)[:8]} belong to more than one role")
        seen.update(role.ranks)
        roles.append(role)
    if len(seen) != world:
        missing = sorted(set(range(world)) - seen)
        raise TraceSchemaError(f"{hfile}: ranks {missing[:8]}... belong to no role (world {world})")
    return Trace(
        world_size=world,
        groups=groups,
        roles=roles,
        layout=header.get("layout", {}),
        model=header.get("model", {}),
        command=header.get("command", []),
        torch_version=header.get("torch_version", ""),
        meta=header.get("meta", {}),
    )


def _check_references(role: Role, groups: Mapping[str, GroupInfo], where: str) -> None:
    """Deps and wait targets point backwards inside the program; groups exist; waits hit comm ops.

    A block's own checks run at its first segment; later segments check only the references that
    leave the block (a dependency or wait target further back than the block's start)."""
    comm = ("collective", "p2p")
    starts: list[int] = []  # op id of each segment's first op
    kinds: list[list[str]] = []  # each segment's kinds
    outward: dict[str, tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {}

    def kind_at(oid: int) -> str:
        j = bisect.bisect_right(starts, oid) - 1
        return kinds[j][oid - starts[j]]

    base = 0
    for seg in role.program:
        cols = role.blocks[seg.block].columns
        if seg.block not in outward:
            deps_out: list[tuple[int, int]] = []
            waits_out: list[tuple[int, int]] = []
            for i, kind in enumerate(cols["kind"]):
                for d in cols["deps"][i]:
                    if type(d) is not int or d <= 0:
                        raise TraceSchemaError(f"{where}: op {base + i} has dependency distance {d} out of range")
                    if d > i:
                        deps_out.append((i, d))
                if kind == "wait":
                    t = cols["target"][i]
                    if t > i:
                        waits_out.append((i, t))
                    elif t <= 0 or cols["kind"][i - t] not in comm:
                        raise TraceSchemaError(f"{where}: wait op {base + i} does not point at a communication op")
                if kind in comm and cols["group"][i] not in groups:
                    raise TraceSchemaError(
                        f"{where}: op {base + i} ({cols['name'][i]}) uses unknown process group {cols['group'][i]!r}"
                    )
            outward[seg.block] = (deps_out, waits_out)
        starts.append(base)
        kinds.append(cols["kind"])
        deps_out, waits_out = outward[seg.block]
        for i, d in deps_out:
            if d > base + i:
                raise TraceSchemaError(f"{where}: op {base + i} has dependency distance {d} out of range")
        for i, t in waits_out:
            if t > base + i or kind_at(base + i - t) not in comm:
                raise TraceSchemaError(f"{where}: wait op {base + i} does not point at a communication op")
        base += len(cols["kind"])
