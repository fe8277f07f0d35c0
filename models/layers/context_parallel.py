"""Context-parallel core attention (filled in below)."""
from __future__ import annotations
from heterosim.errors import ConfigError
__all__ = ["cp_attention"]
def cp_attention(q, k, v, pstate):
    raise ConfigError("context parallelism is not implemented yet")
