"""The file handling the dead-letter and quarantine tools share: outcome classes, exports, durable unlinks.

Where the reference is careless these are deliberately stricter, without
changing anything on disk that the reference reads: an export writes a temp
file next to the output, fsyncs it, renames it into place and fsyncs the
output directory, so a crash never leaves a partial export that looks
complete (the reference copies in place); a removal fsyncs the directory
(the reference does not); an object is opened ``O_NOFOLLOW`` beneath the
queue root, never through a symlink.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator

from steadqd.durable_file import StepFailed, Syscalls, export_durably
from steadqd.errors import (
    ErrorKind,
    InvalidInput,
    NotCommitted,
    OutcomeUnknown,
    SteadQError,
    kind_for_errno,
)
from steadqd.fs import linux
from steadqd.fs.context import Context, not_committed
from steadqd.fs.linux import close_quietly
from steadqd.fs.tree import Indeterminate, MoveFailed, SourceMissing
from steadqd.fs.verify import CHUNK

__all__ = [
    "DIR_FLAGS",
    "FILE_FLAGS",
    "close_quietly",
    "fstat_object",
    "io_error",
    "list_names",
    "open_dir",
    "mutation",
    "not_found",
    "open_object",
    "raw_chunks",
    "split_path",
    "unlink_durably",
    "write_atomically",
]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # O_CLOEXEC is always added by linux.open_at


@contextlib.contextmanager
def mutation(ctx: Context, what: str) -> Iterator[None]:
    """Admin mutations report only the outcome classes, like queue mutations.

    Anything before the linearizing unlink/rename (bad id, not found, poisoned
    handle, I/O) is NotCommitted with its kind; OutcomeUnknown passes through.
    The directory cache is pinned for the whole operation.
    """
    try:
        with ctx.tree.operation():
            yield
    except (NotCommitted, OutcomeUnknown):
        raise
    except SteadQError as e:
        raise NotCommitted(f"{what}: {e.message}", e.kind) from e
    except OSError as e:
        raise not_committed(e, what) from e


def not_found(what: str) -> SteadQError:
    return SteadQError(f"not found: {what}", ErrorKind.NOT_FOUND)


def io_error(e: OSError, what: str) -> SteadQError:
    return SteadQError(f"{what}: {e.strerror or e}", kind_for_errno(e.errno) if e.errno else ErrorKind.IO_FAILURE)


def open_dir(root_fd: int, rel: str, *, missing_ok: bool = True) -> int | None:
    """The directory ``rel`` beneath the root, opened; None if it does not exist (with ``missing_ok``)."""
    try:
        return linux.open_beneath(root_fd, rel, DIR_FLAGS)
    except OSError as e:
        if missing_ok and e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise io_error(e, f"open {rel}") from e


def list_names(root_fd: int, rel: str, *, missing_ok: bool = True) -> list[bytes] | None:
    """Sorted raw entries of ``rel`` beneath the root; None if it does not exist."""
    fd = open_dir(root_fd, rel, missing_ok=missing_ok)
    if fd is None:
        return None
    try:
        return linux.list_dir(fd)
    except OSError as e:
        raise io_error(e, f"list {rel}") from e
    finally:
        with contextlib.suppress(OSError):
            linux.close(fd)


def stat_entries(dir_fd: int, rel: str, keep: Callable[[bytes], bool]) -> Iterator[tuple[bytes, os.stat_result]]:
    """Each entry of the open directory ``rel`` that ``keep`` selects, with its lstat, in listing order.

    An entry gone since the listing is skipped (it moved on meanwhile); any
    other failure to list or stat is an error of the kind its errno says.
    """
    try:
        entries = linux.list_dir(dir_fd)
    except OSError as e:
        raise io_error(e, f"list {rel}") from e
    for raw in entries:
        if not keep(raw):
            continue
        try:
            st = linux.stat_at(dir_fd, raw)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise io_error(e, f"stat {rel}") from e
        yield raw, st


def split_path(path: str) -> tuple[str, str]:
    rel, _, name = path.rpartition("/")
    return rel, name


def open_object(ctx: Context, path: str) -> int:
    """Open a queue object read-only without following a final symlink; NOT_FOUND if gone."""
    rel, name = split_path(path)
    try:
        dir_fd = linux.open_beneath(ctx.root_fd, rel, DIR_FLAGS)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise not_found(path) from e
        raise io_error(e, f"open {rel}") from e
    try:
        return linux.open_at(dir_fd, name, FILE_FLAGS)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise not_found(path) from e
        if e.errno == errno.ELOOP:
            raise InvalidInput(f"{path} is a symlink; refusing to follow it (inspect it in place)") from e
        raise io_error(e, f"open {path}") from e
    finally:
        close_quietly(dir_fd)


def _rmdir_durably(ctx: Context, dir_fd: int, rel: str, name: str, what: str) -> None:
    try:
        removed = ctx.tree.rmdir(dir_fd, rel, name)
    except SourceMissing as e:
        raise NotCommitted(f"{what}: not found", ErrorKind.NOT_FOUND) from e
    except MoveFailed as e:
        raise NotCommitted(f"{what}: {e}", kind_for_errno(e.errno)) from e
    if not removed:
        raise NotCommitted(
            f"{what}: {rel}/{name} is a directory with entries in it (planted with a job's name, then"
            f" quarantined); look inside, then remove it by hand: rm -r -- {os.path.join(ctx.path, rel, name)}",
            ErrorKind.INVALID_INPUT,
        )
    try:
        linux.fsync(dir_fd)
    except OSError as e:
        ctx.poison(f"{what}: fsync {rel}: {e.strerror}")
        raise OutcomeUnknown(f"{what}: removed, but fsync of {rel} failed: {e.strerror}") from e


def fstat_object(fd: int, path: str) -> os.stat_result:
    try:
        return linux.fstat(fd)
    except OSError as e:
        raise io_error(e, f"fstat {path}") from e


def raw_chunks(fd: int) -> Iterator[bytes]:
    """Every byte of the file, read positionally until EOF."""
    offset = 0
    while True:
        chunk = linux.pread(fd, CHUNK, offset)
        if not chunk:
            return
        offset += len(chunk)
        yield chunk


class _LinuxCalls:
    """``durable_file``'s calls through ``fs.linux``, so the syscall hook traces an export and can fail it."""

    def open_at(self, dir_fd: int | None, name: str, flags: int, mode: int) -> int:
        assert dir_fd is not None  # an export always names its directory by descriptor
        return linux.open_at(dir_fd, name, flags, mode)

    def fchmod(self, fd: int, mode: int) -> None:
        linux.fchmod(fd, mode)

    def write_all(self, fd: int, data: bytes) -> None:
        linux.write_all(fd, data)

    def fsync(self, fd: int) -> None:
        linux.fsync(fd)

    def rename_at(self, dir_fd: int | None, src: str, dst: str) -> None:
        assert dir_fd is not None
        linux.rename_replace(dir_fd, src, dir_fd, dst)

    def unlink_at(self, dir_fd: int | None, name: str) -> None:
        assert dir_fd is not None
        linux.unlink_at(dir_fd, name)


LINUX_CALLS: Syscalls = _LinuxCalls()


def write_atomically(out_path: str, chunks: Iterator[bytes], source: str) -> int:
    """Export ``chunks`` to ``out_path`` as ``durable_file.export_durably`` does, through the hooked syscalls.

    A failure (including a payload that fails its digest at the end of the
    stream) leaves no partial or unverified output. Read errors of the
    source are I/O failures of the queue object; corruption surfaces as
    CorruptObject (QUEUE_CORRUPT / PAYLOAD_CORRUPT).
    """
    out = os.fspath(out_path)
    parent, base = os.path.split(os.path.abspath(out))
    if not base:
        raise InvalidInput(f"output path {out_path!r} names a directory")
    try:
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise io_error(e, f"open output directory {parent}") from e
    try:
        return export_durably(dir_fd, base, chunks, calls=LINUX_CALLS)
    except StepFailed as e:
        what = {"read": f"read {source}", "create": f"create a temp in {parent}", "rename": f"rename into {out}"}
        raise io_error(e, what.get(e.step, f"{e.step} {out}")) from e
    finally:
        os.close(dir_fd)


def unlink_durably(ctx: Context, path: str, what: str, *, directory_ok: bool = False) -> None:
    """Unlink one queue object and fsync its directory, with outcome classes.

    ``directory_ok``: the object may be a directory (one planted with a job's
    name and quarantined, reason 0x0008); an empty one is removed, one with
    entries is refused: what a group member put inside is for a person to look
    at, and removing a planted tree is not a queue operation.
    """
    rel, name = split_path(path)
    try:
        dir_fd = linux.open_beneath(ctx.root_fd, rel, DIR_FLAGS)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise NotCommitted(f"{what}: not found", ErrorKind.NOT_FOUND) from e
        raise not_committed(e, f"{what}: open {rel}") from e
    try:
        ctx.tree.unlink(dir_fd, name)
    except SourceMissing as e:
        raise NotCommitted(f"{what}: not found", ErrorKind.NOT_FOUND) from e
    except MoveFailed as e:
        if directory_ok and e.errno == errno.EISDIR:
            _rmdir_durably(ctx, dir_fd, rel, name, what)
            return
        raise NotCommitted(f"{what}: {e}", kind_for_errno(e.errno)) from e
    except Indeterminate as e:
        ctx.poison(f"{what}: {e.cause}")
        raise OutcomeUnknown(f"{what}: outcome unknown: {e.cause}") from e
    finally:
        close_quietly(dir_fd)
