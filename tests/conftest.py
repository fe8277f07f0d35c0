"""Shared fixtures. Tests that need a GPU carry the ``gpu`` marker and skip without CuPy."""
