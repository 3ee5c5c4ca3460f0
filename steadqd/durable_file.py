"""Writing a whole file so that a reader sees all of it or none of it, even after a power cut.

Why one home: the command's handle and ticket files, the metrics textfile and
both backends' exports of dead and quarantined objects are written the same
way (a new temp, every byte, fsync, rename over the target, fsync the
directory), and each step is there because a crash between two of them
otherwise leaves an empty or partial file under the final name. Callers name
the temp (``steadq`` keeps the reference's stray names) and decide whether the
directory's fsync may fail.

The calls are a table (:class:`Syscalls`) because the filesystem backend
passes its own layer (``steadqd.fs.linux``), whose every call the syscall
hook traces and fails on purpose in the fault matrix; everything else uses
the plain ``os`` calls of :data:`OS_CALLS`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from typing import Protocol

__all__ = [
    "OS_CALLS",
    "StepFailed",
    "Syscalls",
    "export_durably",
    "fsync_directory",
    "replace_durably",
    "stream_durably",
    "temp_name",
]

# O_EXCL never follows a link: a planted temp (a symlink included) is refused, never written through.
CREATE_FLAGS = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class Syscalls(Protocol):
    """The calls a durable write makes, each relative to an open directory."""

    def open_at(self, dir_fd: int | None, name: str, flags: int, mode: int) -> int: ...
    def fchmod(self, fd: int, mode: int) -> None: ...
    def write_all(self, fd: int, data: bytes) -> None: ...
    def fsync(self, fd: int) -> None: ...
    def rename_at(self, dir_fd: int | None, src: str, dst: str) -> None: ...
    def unlink_at(self, dir_fd: int | None, name: str) -> None: ...


class _OsCalls:
    def open_at(self, dir_fd: int | None, name: str, flags: int, mode: int) -> int:
        return os.open(name, flags, mode, dir_fd=dir_fd)

    def fchmod(self, fd: int, mode: int) -> None:
        os.fchmod(fd, mode)

    def write_all(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def rename_at(self, dir_fd: int | None, src: str, dst: str) -> None:
        os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

    def unlink_at(self, dir_fd: int | None, name: str) -> None:
        os.unlink(name, dir_fd=dir_fd)


OS_CALLS: Syscalls = _OsCalls()


class StepFailed(OSError):
    """An ``OSError`` of one step of a durable write, naming the step (``create``, ``read``, ``write``, ...).

    Still an ``OSError`` with the original errno, so a caller that only
    cares that the write failed catches it as one; a caller that words the
    failure for a person says which step failed.
    """

    def __init__(self, step: str, error: OSError) -> None:
        super().__init__(error.errno, error.strerror or str(error))
        self.step = step


def temp_name(base: str) -> str:
    """The hidden temp beside ``base`` that an export writes first: unguessable, so nobody plants it."""
    return f".{base}.tmp.{os.urandom(8).hex()}"


def stream_durably(
    dir_fd: int | None, tmp: str, name: str, chunks: Iterable[bytes], *, mode: int = 0o600, calls: Syscalls = OS_CALLS
) -> int:
    """Write ``chunks`` to the new file ``tmp`` (``mode``, whatever the umask), fsync it, rename it over ``name``.

    Both names are relative to the open directory ``dir_fd`` (``None``: the
    working directory), so a directory swapped on the path meanwhile is not
    written into. Returns the
    number of bytes written. On any failure after ``tmp`` is created, the
    failure of the ``chunks`` iterable itself included (a source that fails
    its digest at its end), ``tmp`` is removed: nothing half-written or
    unverified is left, and an existing file at ``name`` is untouched. An
    ``OSError`` comes out as :class:`StepFailed`. The rename is durable only
    once the directory is fsynced (the caller's, by :func:`fsync_directory`
    or its own layer).
    """
    try:
        fd = calls.open_at(dir_fd, tmp, CREATE_FLAGS, mode)
    except OSError as e:
        raise StepFailed("create", e) from e
    try:
        total = 0
        try:
            _step("create", calls.fchmod, fd, mode)  # by descriptor: the umask cut the mode, and a path can be raced
            it = iter(chunks)
            while True:
                try:
                    chunk = next(it, None)
                except OSError as e:
                    raise StepFailed("read", e) from e
                if chunk is None:
                    break
                _step("write", calls.write_all, fd, chunk)
                total += len(chunk)
            _step("fsync", calls.fsync, fd)
        finally:
            os.close(fd)
        _step("rename", calls.rename_at, dir_fd, tmp, name)
    except BaseException:
        with contextlib.suppress(OSError):
            calls.unlink_at(dir_fd, tmp)
        raise
    return total


def _step(step: str, call: Callable[..., object], *args: object) -> None:
    try:
        call(*args)
    except StepFailed:
        raise
    except OSError as e:
        raise StepFailed(step, e) from e


def replace_durably(tmp: str, path: str, data: bytes, *, dir_fd: int | None = None, mode: int = 0o600) -> None:
    """:func:`stream_durably` of one buffer, by names relative to ``dir_fd`` (or the working directory).

    A ``tmp`` that already exists, a symlink included, is refused (EEXIST)
    and left alone. The rename replaces whatever entry ``path`` names (a
    symlink itself, never its target).
    """
    stream_durably(dir_fd, tmp, path, (data,), mode=mode)


def export_durably(dir_fd: int, base: str, chunks: Iterable[bytes], *, calls: Syscalls = OS_CALLS) -> int:
    """An operator's export of a queue object: durable, and ``0600`` whatever the umask.

    Both backends export this way. The mode is one fact for both: an export
    carries a job's payload out of a queue only its group may read, and a
    umask of 022 would otherwise hand it to every user of the machine.
    Returns the bytes written; the directory is fsynced too.
    """
    total = stream_durably(dir_fd, temp_name(base), base, chunks, mode=0o600, calls=calls)
    try:
        calls.fsync(dir_fd)
    except OSError as e:
        raise StepFailed("fsync directory", e) from e
    return total


def fsync_directory(path: str) -> None:
    """fsync the directory ``path``: what makes a rename inside it survive a crash."""
    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
