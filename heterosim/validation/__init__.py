"""Validation: predict published training runs and collective benchmarks, and compare.

The top layer: the only code that drives capture and replay together. :mod:`.cases` reads a case
file, :mod:`.published_runs` supplies what a paper leaves unstated from its authors' launch
scripts, :mod:`.validate` captures, replays and reports. ``python -m replay validate CASES.yaml``
is its command line.
"""
