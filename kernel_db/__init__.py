"""kernel_db: the kernel database, and pricing every captured op on any GPU.

Public names:

- :func:`load_catalogue`, :func:`get_gpu`, :class:`GpuSpec`, :class:`Catalogue` -- datasheet GPUs
  (the GPU-types registry of the cluster model, :mod:`heterosim.cluster.gpus`, re-exported).
- :class:`KernelDB`, :class:`KernelRow`, :func:`merge_rows` -- measured kernel times on disk.
- :func:`price`, :class:`Pricer`, :class:`Price` -- measured -> interpolated -> scaled -> roofline.
- :func:`load_efficiency` -- the roofline efficiency curves (``data/efficiency.yaml``).
- :mod:`kernel_db.profile` fills a DB on a GPU; :mod:`kernel_db.calibrate` fits and cross-validates.

CLI: ``python -m kernel_db gpus | show | price | profile | calibrate``.
"""

from heterosim.cluster.gpus import Catalogue, GpuSpec, get_gpu, load_catalogue

from .db import KernelDB, KernelRow, merge_rows
from .pricing import Price, Pricer, price
from .roofline import load_efficiency

__all__ = [
    "Catalogue",
    "GpuSpec",
    "get_gpu",
    "load_catalogue",
    "KernelDB",
    "KernelRow",
    "merge_rows",
    "Price",
    "Pricer",
    "price",
    "load_efficiency",
]
