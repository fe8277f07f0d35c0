"""HeteroSim: predict LLM-training iteration time on heterogeneous GPU clusters.

This tiny package holds what every layer shares and nothing else: the exception hierarchy
(:mod:`heterosim.errors`) and atomic file writing (:mod:`heterosim.atomic`). The layers live in
the sibling packages ``capture``, ``kernel_db``, ``ncclshim``, ``replay`` and ``models``.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
