"""HeteroSim: predict LLM-training iteration time on heterogeneous GPU clusters.

This package holds what every layer shares: the exception hierarchy (:mod:`heterosim.errors`),
atomic file writing (:mod:`heterosim.atomic`), the trace IR (:mod:`heterosim.trace`) and the
cluster model (:mod:`heterosim.cluster`: hardware, GPU types, network, presets, placement). The
layers live in the sibling packages ``models``, ``capture``, ``kernel_db``, ``ncclshim`` and
``replay``; :mod:`heterosim.validation` sits on top of them all.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
