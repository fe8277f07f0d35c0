"""Array backends for the engine's arithmetic: numpy (default) or CuPy (``--backend cupy``).

The engine writes its array code against a namespace ``xp`` (``xp.cumsum``, ``xp.asarray`` ...);
numpy and CuPy both provide it, so the same code runs on either. CuPy is imported only when asked
for; without it (or without a GPU) the error says what to use instead.
"""

from __future__ import annotations

from types import ModuleType

from heterosim.errors import ConfigError

__all__ = ["BACKENDS", "get_backend"]

BACKENDS: tuple[str, ...] = ("numpy", "cupy")


def get_backend(name: str) -> ModuleType:
    """The array namespace called ``name``; raises :class:`ConfigError` if it cannot be used."""
    if name == "numpy":
        import numpy

        return numpy
    if name == "cupy":
        try:
            import cupy  # type: ignore[import-not-found]
        except ImportError:
            raise ConfigError("CuPy is not installed / no GPU: use --backend numpy "
                              "(or pip install 'heterosim[gpu]' on a machine with a CUDA GPU)") from None
        try:
            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise ConfigError("CuPy is installed but sees no GPU: use --backend numpy")
        except cupy.cuda.runtime.CUDARuntimeError as e:
            raise ConfigError(f"CuPy is installed but CUDA is unusable ({e}): use --backend numpy") from None
        return cupy
    raise ConfigError(f"unknown backend {name!r}; valid backends are {', '.join(BACKENDS)}")
