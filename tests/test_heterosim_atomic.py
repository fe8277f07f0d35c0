"""Atomic writes: all-or-nothing files and directories with ordinary permissions."""

import os

import pytest

from heterosim.atomic import atomic_dir, atomic_write_text
from heterosim.errors import OutputPathError


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
        with atomic_dir(d, lambda p: (p / "a").is_file()) as t:
            (t / "a").write_text("new")
            raise RuntimeError("boom")
    assert (d / "a").read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["d"]


def test_refuses_directory_device_and_fifo_for_file_outputs(tmp_path):
    """A file output never replaces a directory, a device, a FIFO or a symlink to a device."""
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "null"
    link.symlink_to("/dev/null")
    for p, kind in [(d, "a directory"), (fifo, "a FIFO"), (link, "a device")]:
        with pytest.raises(OutputPathError, match=f"is {kind}, not a regular file"):
            atomic_write_text(p, "x")
    assert (d / "notes.txt").read_text() == "keep" and link.is_symlink() and fifo.is_fifo()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["fifo", "mine", "null"]


def test_symlink_to_regular_file_is_written_through(tmp_path):
    """A symlink to a regular file keeps the link; the file it points at gets the new content."""
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "out.json"
    link.symlink_to(real)
    atomic_write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_unwritable_place_is_one_error(tmp_path):
    """Writing where the OS refuses gives OutputPathError naming the path, and leaves nothing."""
    with pytest.raises(OutputPathError, match=r"cannot write /proc/heterosim\.json: .*choose a writable output path"):
        atomic_write_text("/proc/heterosim.json", "x")


def _ours(p):
    return (p / "MARK").is_file()


def test_directory_output_refuses_users_directory_and_keeps_it(tmp_path):
    """A non-empty directory that is not ours is refused, force or not, and left intact."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "thesis.tex").write_text("years of work")
    for force in (False, True):
        with pytest.raises(OutputPathError, match="is a directory that is not a trace; it is left as it is"):
            with atomic_dir(d, _ours, what="trace", force=force) as t:
                (t / "MARK").write_text("")
    assert [x.name for x in d.iterdir()] == ["thesis.tex"]
    assert [x.name for x in tmp_path.iterdir()] == ["d"]


def test_directory_output_replaces_ours_empty_and_forced_file(tmp_path):
    """A previous output, an empty directory, and (force) a regular file are replaced, no leftovers."""
    ours, empty, f = tmp_path / "ours", tmp_path / "empty", tmp_path / "f"
    ours.mkdir()
    (ours / "MARK").write_text("old")
    empty.mkdir()
    f.write_text("x")
    with pytest.raises(OutputPathError, match="is a regular file, not a trace; pass --force"):
        with atomic_dir(f, _ours, what="trace"):
            pass
    for p, force in [(ours, False), (empty, False), (f, True)]:
        with atomic_dir(p, _ours, what="trace", force=force) as t:
            (t / "MARK").write_text("new")
        assert (p / "MARK").read_text() == "new"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["empty", "f", "ours"]


def test_directory_output_never_replaces_symlink_or_device(tmp_path):
    """A symlink at a directory output (here to /dev/null) is refused even with force."""
    link = tmp_path / "null"
    link.symlink_to("/dev/null")
    with pytest.raises(OutputPathError, match="is a symlink"):
        with atomic_dir(link, _ours, what="trace", force=True):
            pass
    assert os.readlink(link) == "/dev/null"


def test_a_full_disk_is_one_error_and_leaves_nothing(tmp_path):
    """A file-size limit (``ulimit -f``, as a full disk would) stops the write: one OutputPathError,
    no temporary file left, the old file kept."""
    import subprocess
    import sys

    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "from heterosim.atomic import atomic_write_bytes\n"
            "from heterosim.errors import OutputPathError\n"
            "try:\n"
            "    atomic_write_bytes(sys.argv[1], b'x' * 100000)\n"
            "except OutputPathError as e:\n"
            "    print(e)\n")
    target = tmp_path / "out.json"
    target.write_text("old")
    p = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True)
    assert p.stdout.strip() == f"cannot write {target}: file size limit exceeded; choose a writable output path"
    assert target.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["out.json"]
