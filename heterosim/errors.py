"""One exception base class for the whole project, with a typed subclass per kind of mistake.

Every user-facing error says what is wrong and how to fix it. ``assert`` is kept for internal
invariants only.
"""

__all__ = [
    "HeteroSimError",
    "ConfigError",
    "TraceSchemaError",
    "CaptureError",
    "ScriptError",
    "UnknownGPUError",
    "UnknownKernelError",
    "KernelDBError",
    "UnsupportedCollectiveError",
    "TopologyError",
    "ReplayError",
    "TraceMismatchError",
    "OutputPathError",
]


class HeteroSimError(Exception):
    """Base class of every error HeteroSim raises on purpose."""


class ConfigError(HeteroSimError, ValueError):
    """A configuration value is invalid (bad flag, world size that does not divide, ...)."""


class TraceSchemaError(HeteroSimError, ValueError):
    """A trace on disk is malformed, from an unknown schema version, or inconsistent."""


class CaptureError(HeteroSimError):
    """Capture could not run the script in the fake world."""


class ScriptError(CaptureError):
    """The captured script itself raised; the message carries its traceback."""


class UnknownGPUError(HeteroSimError, KeyError):
    """A GPU name is not in the catalogue; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class UnknownKernelError(HeteroSimError, KeyError):
    """An op cannot be priced: no kernel class or no formula; the message names the op."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class KernelDBError(HeteroSimError):
    """The kernel database file is damaged or cannot be written."""


class UnsupportedCollectiveError(HeteroSimError, ValueError):
    """A collective, algorithm or protocol that the NCCL model does not know or allow."""


class TopologyError(HeteroSimError, ValueError):
    """A cluster spec or topology view is invalid."""


class ReplayError(HeteroSimError):
    """The replay engine cannot simulate the given trace on the given cluster."""


class TraceMismatchError(ReplayError):
    """Collectives or p2p ops do not match across ranks (order, size or partner)."""


class TimeLimitError(HeteroSimError):
    """Work ran past the time limit it was given (``validate --case-timeout``)."""


class OutputPathError(HeteroSimError):
    """An output path holds something HeteroSim must not replace, or cannot be written."""
