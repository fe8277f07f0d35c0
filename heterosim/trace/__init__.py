"""The trace: the contract between capture and everything that reads what it recorded.

:mod:`heterosim.trace.ir` is the schema (ops, blocks, roles, process groups);
:mod:`heterosim.trace.store` its directory writer and validating loader; :mod:`heterosim.trace.vocab` the names it is written in (dtypes, collectives,
kernel classes and which op is in which). It imports no torch, so the plan layer and the engine
read traces without it.
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
)
from heterosim.trace.store import load_trace, write_trace
from heterosim.trace.vocab import COLLECTIVES, DTYPE_BYTES, KERNEL_CLASSES, P2P, register_kernel_class

__all__ = ["SCHEMA_VERSION", "Block", "GroupInfo", "Op", "Role", "Segment", "Trace", "flop_totals",
           "load_trace", "write_trace", "COLLECTIVES", "DTYPE_BYTES", "KERNEL_CLASSES", "P2P", "register_kernel_class"]
