"""The trace: the contract between capture and everything that reads what it recorded.

:mod:`heterosim.trace.ir` is the schema (ops, blocks, roles, process groups), its writer and its
validating loader. It imports no torch, so the plan layer and the engine read traces without it.
"""

from heterosim.trace.ir import (
    SCHEMA_VERSION,
    Block,
    GroupInfo,
    Op,
    Role,
    Segment,
    Trace,
    flop_totals,
    load_trace,
    write_trace,
)

__all__ = ["SCHEMA_VERSION", "Block", "GroupInfo", "Op", "Role", "Segment", "Trace", "flop_totals",
           "load_trace", "write_trace"]
