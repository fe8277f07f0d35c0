"""Mixture-of-experts layer (filled in below)."""
from __future__ import annotations
from heterosim.errors import ConfigError
__all__ = ["MoELayer"]
class MoELayer:
    def __init__(self, *a, **k):
        raise ConfigError("MoE is not implemented yet")
