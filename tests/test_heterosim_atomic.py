"""Atomic writes: all-or-nothing files and directories with ordinary permissions."""

import os

import pytest

from heterosim.atomic import atomic_dir, atomic_write_text


def test_write_replaces_whole_file_with_plain_mode(tmp_path):
    """The new content appears whole, with the mode open() would give (0666 minus umask)."""
    p = tmp_path / "f.txt"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    umask = os.umask(0)
    os.umask(umask)
    assert p.read_text() == "two" and (p.stat().st_mode & 0o777) == (0o666 & ~umask)
    assert [x.name for x in tmp_path.iterdir()] == ["f.txt"]


def test_failed_directory_write_keeps_old(tmp_path):
    """An exception inside atomic_dir leaves the previous directory and no temporary one."""
    d = tmp_path / "d"
    with atomic_dir(d) as t:
        (t / "a").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_dir(d) as t:
            (t / "a").write_text("new")
            raise RuntimeError("boom")
    assert (d / "a").read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["d"]
