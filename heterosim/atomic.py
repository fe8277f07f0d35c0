"""Atomic, non-destructive writes: write to a temporary sibling, then rename.

A crash never leaves half a file, and an output path only ever replaces what HeteroSim may
replace: a regular file (file outputs), or an empty directory or a previous output of ours
(directory outputs, recognised by a caller-given predicate). A directory of the user's files, a
device, a FIFO or a socket is refused with :class:`~heterosim.errors.OutputPathError` before
anything is written -- ``force`` included -- and so is a symlink to one of them.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from heterosim.errors import OutputPathError

__all__ = ["atomic_write_text", "atomic_write_bytes", "atomic_dir", "check_file_output", "check_dir_output"]


def _kind(st: os.stat_result) -> str:
    m = st.st_mode
    if stat.S_ISDIR(m):
        return "a directory"
    if stat.S_ISCHR(m) or stat.S_ISBLK(m):
        return "a device"
    if stat.S_ISFIFO(m):
        return "a FIFO"
    if stat.S_ISSOCK(m):
        return "a socket"
    return "not a regular file"


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _os_error(path: Path, e: OSError) -> OutputPathError:
    why = e.strerror or str(e)
    if e.errno == errno.EFBIG:
        why = "file size limit exceeded"
    return OutputPathError(f"cannot write {path}: {why}; choose a writable output path")


def check_file_output(path: str | os.PathLike) -> Path:
    """The regular file that writing ``path`` replaces (symlinks followed); refuses anything else.

    Raises :class:`OutputPathError` if ``path`` (or what a symlink there points at) exists and is
    not a regular file.
    """
    path = Path(path)
    target = path.resolve() if path.is_symlink() else path
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return target
    except OSError as e:
        raise _os_error(path, e) from None
    if not stat.S_ISREG(st.st_mode):
        via = f" (a symlink to {target})" if target != path else ""
        raise OutputPathError(
            f"output {path}{via} is {_kind(st)}, not a regular file; HeteroSim replaces only regular "
            "files: choose another output path"
        )
    return target


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one.

    ``path`` may be new or a regular file (a symlink to one is followed and the link kept);
    anything else raises :class:`OutputPathError`, and so does a write the OS refuses (a read-only
    place, a full disk, a file-size limit), with nothing left behind.
    """
    shown = Path(path)
    path = check_file_output(shown)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        # mkstemp makes the file 0600; give it the mode a plain open() would (0666 minus umask).
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise _os_error(shown, e) from None
    except BaseException:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Text flavour of :func:`atomic_write_bytes` (UTF-8)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def check_dir_output(path: str | os.PathLike, is_ours: Callable[[Path], bool], *, what: str,
                     force: bool = False) -> None:
    """Refuse a directory output ``path`` that would destroy something not ours.

    Replaceable: nothing there, an empty directory, a directory ``is_ours`` accepts (a previous
    output), and, with ``force``, a regular file. Never a directory of other files, a device, a
    FIFO, a socket, or a symlink (the link is not followed: what it points at stays as it is).
    ``what`` names the output in the message ("trace", ...).
    """
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise _os_error(path, e) from None
    m = st.st_mode
    if stat.S_ISDIR(m):
        if is_ours(path) or not any(path.iterdir()):
            return
        raise OutputPathError(
            f"output {path} is a directory that is not a {what}; it is left as it is: choose a new "
            f"path for the {what}"
        )
    if stat.S_ISLNK(m):
        raise OutputPathError(
            f"output {path} is a symlink; the {what} is not written through it: choose a new path"
        )
    if stat.S_ISREG(m):
        if force:
            return
        raise OutputPathError(
            f"output {path} is a regular file, not a {what}; pass --force to replace it, or choose a "
            "new path"
        )
    raise OutputPathError(f"output {path} is {_kind(st)}; it is never replaced: choose a new path for the {what}")


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: str | os.PathLike, is_ours: Callable[[Path], bool] = lambda p: False, *,
               what: str = "HeteroSim output", force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``path`` only if the block finishes.

    ``path`` is checked with :func:`check_dir_output` before and again at the swap. On an
    exception the temporary directory is removed and ``path`` is left as it was.
    """
    path = Path(path)
    check_dir_output(path, is_ours, what=what, force=force)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        os.chmod(tmp, 0o777 & ~_umask())
    except OSError as e:
        raise _os_error(path, e) from None
    try:
        yield tmp
        check_dir_output(path, is_ours, what=what, force=force)
        old = None
        if os.path.lexists(path):
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
        os.replace(tmp, path)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _os_error(path, e) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        _remove(old)
