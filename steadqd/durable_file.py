"""Writing a whole file so that a reader sees all of it or none of it, even after a power cut.

Why one home: the command's handle and ticket files and a bucket's exported
objects are written the same way (a new temp, every byte, fsync, rename
over the target, fsync the directory), and each step is there because a
crash between two of them otherwise leaves an empty or partial file under
the final name. Callers name the temp (``steadq`` keeps the reference's
stray names) and decide whether the directory's fsync may fail.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["fsync_directory", "replace_durably"]


def replace_durably(tmp: str, path: str, data: bytes, *, dir_fd: int | None = None, mode: int = 0o600) -> None:
    """Write ``data`` to the new file ``tmp`` (``mode``, whatever the umask), fsync it and rename it over ``path``.

    On any failure after ``tmp`` is created it is removed, so nothing
    half-written is left and an existing file at ``path`` is untouched;
    a ``tmp`` that already exists, a symlink included, is refused (EEXIST)
    and left alone: ``O_EXCL`` never follows a link. With ``dir_fd`` both
    names are relative to that open directory, so a directory swapped on the
    path meanwhile is not written into. The rename replaces whatever entry
    ``path`` names (a symlink itself, never its target); it is durable only
    once :func:`fsync_directory` of the parent returns.
    """
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, mode)  # by descriptor: the umask cut the mode, and a path can be raced
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def fsync_directory(path: str) -> None:
    """fsync the directory ``path``: what makes a rename inside it survive a crash."""
    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
