"""Shared fixtures. Tests that need a GPU carry the ``gpu`` marker and skip without CuPy."""

try:  # property-based tests: the same examples on every run (CI must not find a new one by chance)
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("heterosim", derandomize=True, database=None)
    _hypothesis_settings.load_profile("heterosim")
except ImportError:  # the fuzzing tests skip without hypothesis
    pass
