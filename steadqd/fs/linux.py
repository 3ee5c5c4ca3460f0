"""The Linux syscall layer of steadqd: every system call the queue makes.

SteadQ/1 compatibility depends on a handful of exact primitives that ``os``
does not expose (``renameat2(RENAME_NOREPLACE)``, ``openat2`` resolve flags,
``linkat(AT_EMPTY_PATH)``, ``statfs.f_type``); :mod:`steadqd.fs.libc` reaches
them through cffi in ABI mode; everything else uses ``os`` with ``dir_fd``.

Every wrapper performs its system call through one function,
:func:`steadqd.fs.syscall_hook.call` (here ``_call``). That single point is
what makes the protocol testable: tests and the crash lab can count syscall
positions (:func:`trace`) and make the Nth call fail before or after its side
effect (:func:`inject`) without monkeypatching. Op names are a stable
contract (see :data:`OPS`). Both are re-exported here: callers and tests use
``linux.trace``, ``linux.inject`` and the wrappers of this module only.

This module imports nothing else from steadqd but those two: with them it is the lowest layer.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import fcntl
import os
import stat
import struct
import sys
import time
from collections.abc import Sequence

from steadqd.fs import libc as _libc
from steadqd.fs.syscall_hook import OPS, Fault, TraceEvent, _armed, _traces, inject, trace
from steadqd.fs.syscall_hook import _lock as _lock  # the crash lab's recorder takes it as linux._lock
from steadqd.fs.syscall_hook import call as _call

__all__ = [
    "AT_EMPTY_PATH",
    "AT_FDCWD",
    "AT_SYMLINK_FOLLOW",
    "O_TMPFILE",
    "OPS",
    "RENAME_NOREPLACE",
    "RESOLVE_BENEATH",
    "RESOLVE_NO_MAGICLINKS",
    "RESOLVE_NO_SYMLINKS",
    "SYNC_FILE_RANGE_WRITE",
    "Fault",
    "NotRegularFile",
    "ShortRead",
    "TmpfileLinkUnsupported",
    "TraceEvent",
    "boottime_ns",
    "close",
    "dup",
    "fchmod",
    "file_kind",
    "fstat",
    "fstatfs_type",
    "fsync",
    "getrandom",
    "inject",
    "link_tmpfile",
    "list_dir",
    "mkdir_at",
    "monotonic_ns",
    "not_regular",
    "ofd_lock",
    "open_at",
    "open_beneath",
    "open_dir",
    "open_regular",
    "open_tmpfile",
    "pread",
    "pwrite_all",
    "read_exact",
    "realtime_ns",
    "rename_noreplace",
    "rename_replace",
    "rmdir_at",
    "stat_at",
    "statfs_type",
    "sync_file_range",
    "trace",
    "unlink_at",
    "write_all",
]

Name = str | bytes

# --- Constants (linux/fcntl.h, linux/openat2.h, linux/fs.h). ---
RENAME_NOREPLACE = 1
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
AT_FDCWD = -100
AT_SYMLINK_FOLLOW = 0x400
AT_EMPTY_PATH = 0x1000
O_TMPFILE: int = os.O_TMPFILE
F_OFD_SETLK: int = getattr(fcntl, "F_OFD_SETLK", 37)
F_RDLCK = 0
F_WRLCK = 1
SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h: start writeback of the dirty pages, do not wait


class ShortRead(Exception):
    """``read_exact`` got fewer bytes than asked (the file is shorter than its header claims)."""

    def __init__(self, expected: int, got: int) -> None:
        super().__init__(f"short read: expected {expected} bytes, got {got}")
        self.expected = expected
        self.got = got


class NotRegularFile(Exception):
    """A name that must hold a regular file holds a FIFO, socket, directory, device or symlink.

    Raised instead of waiting: ``open()`` of a FIFO without O_NONBLOCK blocks
    until a writer appears, which anyone able to write the directory can
    arrange forever. ``label`` is the path as the caller names it.
    """

    def __init__(self, label: str, mode: int) -> None:
        self.label = label
        self.mode = mode
        self.kind = file_kind(mode)
        super().__init__(f'{label} is {self.kind}, not a regular file (see docs/security.md, "Special files")')


_KINDS = {
    stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link",
    stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFREG: "a regular file",
}  # fmt: skip


def file_kind(mode: int) -> str:
    """``st_mode``'s file type in words, for messages."""
    return _KINDS.get(stat.S_IFMT(mode), f"a file of type 0o{stat.S_IFMT(mode):o}")


class TmpfileLinkUnsupported(Exception):
    """Neither linkat form can publish an O_TMPFILE here; the caller switches to named temps."""

    def __init__(self, attempts: tuple[tuple[str, int], ...]) -> None:
        detail = ", ".join(f"{form}: {_errno.errorcode.get(e, e)}" for form, e in attempts)
        super().__init__(f"linking an O_TMPFILE is unsupported ({detail})")
        self.attempts = attempts


# --- Helpers. ---


def _b(name: Name) -> bytes:
    if type(name) is str:  # os.fsencode's own first case, without its frame
        return name.encode(_FS_ENCODING, _FS_ERRORS)
    return os.fsencode(name)


_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


def _close_unhooked(fd: int) -> None:
    """os.close, its error dropped, outside the hook: the cleanup of an open the caller never received."""
    with contextlib.suppress(OSError):
        os.close(fd)


# --- Opening. ---


def open_at(dirfd: int, name: Name, flags: int, mode: int = 0o600) -> int:
    """openat(2) relative to ``dirfd``; O_CLOEXEC is always added so fds never leak into children."""
    flags |= os.O_CLOEXEC
    if not _armed and not _traces:  # _call's fast path, inlined (hot), and _open's body too
        return os.open(name, flags, mode, dir_fd=dirfd)
    return _call("open", _open, dirfd, name, flags, mode, detail=(dirfd, name, flags), discard=os.close)


def _open(dirfd: int, name: Name, flags: int, mode: int) -> int:
    return os.open(name, flags, mode, dir_fd=dirfd)


def open_regular(
    dirfd: int, name: Name, flags: int, mode: int = 0o600, *, label: str | None = None
) -> tuple[int, os.stat_result]:
    """Open a name that must be a regular file, without ever blocking; returns (fd, its fstat).

    O_NONBLOCK makes the open of a FIFO return at once, and the fstat then
    refuses it; O_NOFOLLOW refuses a symlink. When the open itself fails
    (ENXIO for a socket, EISDIR or EACCES for a directory, ELOOP for a
    symlink), an lstat says what is there, so the caller can report "a
    socket" rather than a misleading errno. ENOENT and EEXIST pass through
    unchanged. Failures are :class:`NotRegularFile` naming ``label`` (default:
    ``name``), or the open's OSError.
    """
    where = label if label is not None else os.fsdecode(name)
    try:
        fd = open_at(dirfd, name, flags | os.O_NONBLOCK | os.O_NOFOLLOW, mode)
    except OSError as e:
        if e.errno not in (_errno.ENOENT, _errno.EEXIST):
            st = not_regular(dirfd, name)
            if st is not None:
                raise NotRegularFile(where, st.st_mode) from e
        raise
    try:
        st = fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(where, st.st_mode)
    except BaseException:
        _close_unhooked(fd)
        raise
    return fd, st


def not_regular(dirfd: int, name: Name) -> os.stat_result | None:
    """The lstat of ``name`` if it exists and is not a regular file, else None (an lstat error too)."""
    try:
        st = stat_at(dirfd, name)
    except OSError:
        return None
    return None if stat.S_ISREG(st.st_mode) else st


def open_dir(dirfd: int, name: Name) -> int:
    """Open a directory without following a symlink in its last component."""
    return open_at(dirfd, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def _split_beneath(relpath: str) -> list[str]:
    """Validate a relative path for open_beneath; the same rules apply with or without openat2."""
    if relpath.startswith("/"):
        raise OSError(_errno.EXDEV, "absolute path refused", relpath)
    parts = relpath.split("/")
    for part in parts:
        if part == "..":
            raise OSError(_errno.EXDEV, "'..' refused", relpath)
        if part in ("", "."):
            raise OSError(_errno.EINVAL, "empty or '.' path component refused", relpath)
    return parts


def open_beneath(rootfd: int, relpath: str, flags: int, mode: int = 0) -> int:
    """Open ``relpath`` strictly inside ``rootfd`` with no symlink anywhere on the way.

    Uses openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS);
    where the kernel lacks it (ENOSYS), walks the components with
    O_NOFOLLOW|O_DIRECTORY. ``..``, absolute paths and empty/``.`` components
    are refused up front in both modes so behaviour does not depend on the kernel.
    """
    parts = _split_beneath(relpath)
    flags |= os.O_CLOEXEC
    if not _libc.openat2_missing:
        how_mode = mode if flags & (os.O_CREAT | O_TMPFILE) else 0  # openat2 rejects a mode otherwise
        resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
        try:
            return _call(
                "openat2",
                _libc.openat2,
                rootfd,
                _b(relpath),
                flags,
                how_mode,
                resolve,
                detail=(rootfd, relpath, flags, resolve),
                discard=os.close,
            )
        except OSError as e:
            if e.errno != _errno.ENOSYS:
                raise
    fd = rootfd
    try:
        for part in parts[:-1]:
            nxt = open_dir(fd, part)
            if fd != rootfd:
                close(fd)
            fd = nxt
        return open_at(fd, parts[-1], flags | os.O_NOFOLLOW, mode)
    finally:
        if fd != rootfd:
            close(fd)


def close(fd: int) -> None:
    """close(2); with an after-fault the fd is closed and the caller still sees the error (like EINTR on Linux)."""
    if not _armed and not _traces:  # _call's fast path, inlined (hot)
        os.close(fd)
        return
    _call("close", os.close, fd, detail=(fd,))


def close_quietly(fd: int) -> None:
    """:func:`close`, its error dropped: for a read-only descriptor, or one whose bytes were fsynced before
    they counted, a failed close changes no outcome and must not mask the caller's (a committed claim or
    enqueue is no NotCommitted; an OutcomeUnknown keeps its ticket)."""
    try:  # not contextlib.suppress: its object and two method calls, on every enqueue and claim
        if not _armed and not _traces:  # close's fast path, inlined (an enqueue, a claim, a payload(), an ack)
            os.close(fd)
        else:
            close(fd)
    except OSError:
        pass


def dup(fd: int) -> int:
    """dup(2) with close-on-exec: a second descriptor the caller owns."""
    return _call("dup", os.dup, fd, detail=(fd,), discard=os.close)


def open_tmpfile(dirfd: int, mode: int = 0o600) -> int:
    """An unnamed O_TMPFILE inode in ``dirfd``; errors (EISDIR/ENOENT/EOPNOTSUPP = unsupported) are raised as is."""
    flags = O_TMPFILE | os.O_RDWR | os.O_CLOEXEC
    if not _armed and not _traces:  # _call's fast path, inlined (every enqueue), and _open's body too
        return os.open(".", flags, mode, dir_fd=dirfd)
    return _call("tmpfile", _open, dirfd, ".", flags, mode, detail=(dirfd, flags), discard=os.close)


# --- Directories and metadata. ---


def mkdir_at(dirfd: int, name: Name, mode: int = 0o700) -> bool:
    """mkdirat; True if this call created it (so the caller must fsync the parent), False on EEXIST."""
    try:
        _call("mkdir", _mkdir, dirfd, name, mode, detail=(dirfd, name, mode))
    except FileExistsError:  # injected EEXIST too: OSError(EEXIST, ...) constructs FileExistsError
        return False
    return True


def _mkdir(dirfd: int, name: Name, mode: int) -> None:
    os.mkdir(name, mode, dir_fd=dirfd)


def stat_at(dirfd: int, name: Name) -> os.stat_result:
    """fstatat(AT_SYMLINK_NOFOLLOW): identity checks must see the link itself, never its target."""
    if not _armed and not _traces:  # _call's fast path, inlined (hot), and _stat_nofollow's body too
        return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    return _call("stat", _stat_nofollow, dirfd, name, detail=(dirfd, name))


def _stat_nofollow(dirfd: int, name: Name) -> os.stat_result:
    return os.stat(name, dir_fd=dirfd, follow_symlinks=False)


def fstat(fd: int) -> os.stat_result:
    """fstat(2)."""
    if not _armed and not _traces:  # _call's fast path, inlined (hot)
        return os.fstat(fd)
    return _call("fstat", os.fstat, fd, detail=(fd,))


def fsync(fd: int) -> None:
    """fsync(2) of a file or directory: the durability barrier."""
    if not _armed and not _traces:  # _call's fast path, inlined (hot)
        os.fsync(fd)
        return
    _call("fsync", os.fsync, fd, detail=(fd,))


def sync_file_range(fd: int, offset: int, nbytes: int, flags: int) -> None:
    """sync_file_range(2): with SYNC_FILE_RANGE_WRITE, start writeback of a byte range
    (``nbytes`` 0 = to the end of the file). No durability promise of its own, no
    metadata: it only lets a later fsync find the data already on its way."""
    _call("sync_file_range", _libc.sync_file_range, fd, offset, nbytes, flags, detail=(fd, offset, nbytes, flags))


def fchmod(fd: int, mode: int) -> None:
    """fchmod(2) (FORMAT's temp becomes 0400 before publication)."""
    _call("fchmod", os.fchmod, fd, mode, detail=(fd, mode))


def fchown(fd: int, uid: int, gid: int) -> None:
    """fchown(2): only root in a queue another user owns gives its new entries away
    (``Modes.owner``). Not an injectable op: the crash lab never runs as that root
    in someone else's tree, and the call comes before any link or rename."""
    os.fchown(fd, uid, gid)


def list_dir(dirfd: int) -> list[bytes]:
    """Raw entry names (no ``.``/``..``) sorted bytewise, the order recovery relies on.

    ``os.listdir(fd)`` works on a dup and rewinds, so the caller's fd stays reusable.
    It rewinds only *after* reading, so we rewind first too: btrfs (kernel >= 6.5)
    caps readdir at the last index seen when the fd was opened and refreshes it only
    on a seek to 0, so a cached directory fd would otherwise miss entries created
    since it was opened (a just-enqueued job invisible to the claim scan).
    """

    def _listdir(fd: int) -> list[str]:
        os.lseek(fd, 0, os.SEEK_SET)
        return os.listdir(fd)

    names = _call("listdir", _listdir, dirfd, detail=(dirfd,))
    return sorted(os.fsencode(n) for n in names)


def read_dir_chunk(dirfd: int, size: int) -> list[bytes]:
    """The next entries of ``dirfd`` from its current offset, in directory order
    (``[]`` at the end): what lets a claim scan walk a deep directory a piece at a
    time instead of listing all of it. The offset is the fd's own, so it persists
    while the fd is cached; :func:`list_dir` and :func:`rewind_dir` reset it."""
    if not _armed and not _traces:  # _call's fast path, inlined (every claim scan)
        return _libc.getdents(dirfd, size)
    return _call("getdents", _libc.getdents, dirfd, size, detail=(dirfd,))


def rewind_dir(dirfd: int) -> None:
    """Back to the first entry (on btrfs this also lets the fd see entries created
    since it was opened; see :func:`list_dir`)."""
    if not _armed and not _traces:  # _call's fast path, inlined (every claim scan)
        os.lseek(dirfd, 0, os.SEEK_SET)
        return
    _call("lseek", os.lseek, dirfd, 0, os.SEEK_SET, detail=(dirfd,))


_DOT = ord(".")


def first_listing(dirfds: Sequence[int | None], start: int, size: int) -> int:
    """Rewind ``dirfds[start]``, ``dirfds[start + 1]``, ... in turn and read one chunk of each:
    the index of the first whose :func:`read_dir_chunk` would not be ``[]``, or ``len(dirfds)``.

    The claim scan's probe of the ready shards it found empty last time (most
    shards of an idle queue, on every lease): per directory the same rewind and
    read as :func:`rewind_dir` and :func:`read_dir_chunk`, but no name is
    decoded and no frame made. It stops early, the safe way, at a None, at a
    call that fails, at a chunk of any shape but "." and "..", and whenever a
    fault is armed or a trace is running: the caller then reads that directory
    through the two wrappers, where the hook sees every call (same ops, same
    positions).
    """
    raw = _libc.getdents64_raw
    buf = None
    for i in range(start, len(dirfds)):
        fd = dirfds[i]
        if fd is None or _armed or _traces or raw is None:
            return i
        if buf is None:  # a lease that finds work in its first shard probes nothing: no buffer either
            data, buf = _libc.probe_buffer(size)
            dots, dot, dotdot = _libc.DOTS_CHUNK_BYTES, _libc.DOT_AT, _libc.DOTDOT_AT
        try:
            os.lseek(fd, 0, os.SEEK_SET)
        except OSError:
            return i
        n = raw(fd, buf, size)
        # The two names are ".\0" and "..\0", tested byte by byte: a bytearray's startswith
        # parses its arguments the old way, ~5x the cost of the five subscripts.
        if n != 0 and not (
            n == dots
            and data[dot] == _DOT
            and data[dot + 1] == 0
            and data[dotdot] == _DOT
            and data[dotdot + 1] == _DOT
            and data[dotdot + 2] == 0
        ):
            return i
    return len(dirfds)


# --- Reading and writing. ---


def _byte_view(data: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte, looping on short writes; a zero-byte write is EIO (it would loop forever)."""
    view = data if type(data) is bytes else _byte_view(data)  # bytes: already one flat run of bytes
    while view:
        if not _armed and not _traces:  # _call's fast path, inlined (every enqueue)
            n = os.write(fd, view)
        else:
            n = _call("write", os.write, fd, view, detail=(fd, len(view)))
        if n <= 0:
            raise OSError(_errno.EIO, "write returned 0 bytes")
        view = view[n:]


def write_once(fd: int, data: bytes) -> int:
    """One write(2) as :func:`write_all` makes each (op ``write``): the C core's enqueue (bridge) when hooked."""
    n: int = _call("write", os.write, fd, data, detail=(fd, len(data)))
    return n


def link_as(form: str, fd: int, dirfd: int, name: bytes) -> None:
    """One form of :func:`link_tmpfile`'s linkat ("direct" or "proc"), as it makes it: the C core's enqueue when hooked."""
    (_link_proc if form == "proc" else _link_direct)(fd, dirfd, name)


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Positional write of every byte (the streaming enqueue's header patch), same rules as write_all."""
    view = _byte_view(data)
    while view:
        n = _call("pwrite", os.pwrite, fd, view, offset, detail=(fd, len(view), offset))
        if n <= 0:
            raise OSError(_errno.EIO, "pwrite returned 0 bytes")
        view = view[n:]
        offset += n


def pread(fd: int, n: int, offset: int) -> bytes:
    """One pread(2); may return fewer than ``n`` bytes at EOF."""
    if not _armed and not _traces:  # _call's fast path, inlined (hot)
        return os.pread(fd, n, offset)
    return _call("read", os.pread, fd, n, offset, detail=(fd, n, offset))


def read_exact(fd: int, n: int, offset: int) -> bytes:
    """Exactly ``n`` bytes at ``offset`` or :class:`ShortRead`: a truncated object is corruption, not EOF."""
    chunks: list[bytes] = []
    got = 0
    while got < n:
        chunk = pread(fd, n - got, offset + got)
        if not chunk:
            raise ShortRead(n, got)
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# --- Renames, links, removal. ---


def rename_noreplace(olddirfd: int, oldname: Name, newdirfd: int, newname: Name) -> None:
    """renameat2(RENAME_NOREPLACE): the linearization point of every state move; EEXIST = collision.

    Never emulated with link+unlink: that is not atomic and not what the reference does.
    """
    if not _armed and not _traces:  # _call's fast path, inlined (hot); str names encoded as _b would
        old = oldname.encode(_FS_ENCODING, _FS_ERRORS) if type(oldname) is str else _b(oldname)
        new = newname.encode(_FS_ENCODING, _FS_ERRORS) if type(newname) is str else _b(newname)
        _libc.renameat2(olddirfd, old, newdirfd, new, RENAME_NOREPLACE)
        return
    _call(
        "rename_noreplace",
        _libc.renameat2,
        olddirfd,
        _b(oldname),
        newdirfd,
        _b(newname),
        RENAME_NOREPLACE,
        detail=(olddirfd, oldname, newdirfd, newname),
    )


def rename_replace(olddirfd: int, oldname: Name, newdirfd: int, newname: Name) -> None:
    """Plain renameat (may replace): only watermark, receipt compaction and recovery cursor use it."""
    _call(
        "rename",
        _rename_plain,
        olddirfd,
        _b(oldname),
        newdirfd,
        _b(newname),
        detail=(olddirfd, oldname, newdirfd, newname),
    )


def _rename_plain(olddirfd: int, old: bytes, newdirfd: int, new: bytes) -> None:
    os.rename(old, new, src_dir_fd=olddirfd, dst_dir_fd=newdirfd)


def unlink_at(dirfd: int, name: Name) -> None:
    """unlinkat(dir, name, 0)."""
    _call("unlink", _unlink, dirfd, name, detail=(dirfd, name))


def _unlink(dirfd: int, name: Name) -> None:
    os.unlink(name, dir_fd=dirfd)


def rmdir_at(dirfd: int, name: Name) -> None:
    """unlinkat(dir, name, AT_REMOVEDIR); ENOTEMPTY/EEXIST mean "not empty"."""
    _call("rmdir", _rmdir, dirfd, name, detail=(dirfd, name))


def _rmdir(dirfd: int, name: Name) -> None:
    os.rmdir(name, dir_fd=dirfd)


def _link_direct(fd: int, dirfd: int, name: bytes) -> None:
    if not _armed and not _traces:  # _call's fast path, inlined (every enqueue)
        _libc.linkat(fd, b"", dirfd, name, AT_EMPTY_PATH)
        return
    _call("link", _libc.linkat, fd, b"", dirfd, name, AT_EMPTY_PATH, detail=("direct", fd, dirfd, name))


def _link_proc(fd: int, dirfd: int, name: bytes) -> None:
    src = f"/proc/self/fd/{fd}".encode()
    if not _armed and not _traces:  # _call's fast path, inlined (every enqueue)
        _libc.linkat(AT_FDCWD, src, dirfd, name, AT_SYMLINK_FOLLOW)
        return
    _call("link", _libc.linkat, AT_FDCWD, src, dirfd, name, AT_SYMLINK_FOLLOW, detail=("proc", fd, dirfd, name))


_RETRY_DIRECT = frozenset({_errno.EINVAL, _errno.ENOENT, _errno.EOPNOTSUPP})
_RETRY_PROC = frozenset({_errno.EINVAL, _errno.ENOSYS, _errno.EOPNOTSUPP})


def link_tmpfile(fd: int, dirfd: int, name: Name, *, prefer_proc: bool = False) -> str:
    """Give an O_TMPFILE inode its name: the enqueue linearization point (protocol.md Enqueue step 5).

    Tries ``linkat(fd, "", dirfd, name, AT_EMPTY_PATH)`` ("direct", needs
    CAP_DAC_READ_SEARCH) and ``linkat(AT_FDCWD, "/proc/self/fd/<fd>", dirfd,
    name, AT_SYMLINK_FOLLOW)`` ("proc"), direct first unless ``prefer_proc``.
    Returns the form that worked. EEXIST and unexpected errnos propagate as
    OSError; ENOENT from the proc form propagates when the destination
    directory was deleted (st_nlink == 0). If neither form is usable:
    :class:`TmpfileLinkUnsupported`.
    """
    target = name.encode(_FS_ENCODING, _FS_ERRORS) if type(name) is str else _b(name)  # _b, without its frame
    forms = ("proc", "direct") if prefer_proc else ("direct", "proc")
    attempts: list[tuple[str, int]] = []
    for form in forms:
        try:
            (_link_proc if form == "proc" else _link_direct)(fd, dirfd, target)
            return form
        except OSError as e:
            code = e.errno if e.errno is not None else 0
            attempts.append((form, code))
            if form == "direct":
                if code == _errno.ENOSYS:
                    raise TmpfileLinkUnsupported(tuple(attempts)) from e
                if code not in _RETRY_DIRECT:
                    raise
            elif code == _errno.ENOENT:
                if fstat(dirfd).st_nlink == 0:
                    raise
            elif code not in _RETRY_PROC:
                raise
    raise TmpfileLinkUnsupported(tuple(attempts))


# --- Locks. ---


def ofd_lock(fd: int, *, exclusive: bool) -> bool:
    """Non-blocking whole-file OFD lock (F_OFD_SETLK); False if busy. Released by closing the fd.

    OFD locks belong to the open file description, so two opens in one process
    conflict, unlike classic POSIX locks; flock(2) would not interoperate.
    """
    l_type = F_WRLCK if exclusive else F_RDLCK
    arg = struct.pack("hhqqi4x", l_type, os.SEEK_SET, 0, 0, 0)
    try:
        _call("lock", fcntl.fcntl, fd, F_OFD_SETLK, arg, detail=(fd, "exclusive" if exclusive else "shared"))
    except OSError as e:
        if e.errno in (_errno.EAGAIN, _errno.EACCES):
            return False
        raise
    return True


# --- Filesystem type. ---


def fstatfs_type(fd: int) -> int:
    """statfs f_type of the filesystem holding ``fd``, as unsigned 32-bit (0xEF53 = ext4)."""
    return _call("statfs", _libc.statfs_f_type, fd, None, detail=(fd,))


def statfs_type(path: str) -> int:
    """statfs f_type of ``path`` as unsigned 32-bit (init checks a root that may not exist yet via its parent)."""
    return _call("statfs", _libc.statfs_f_type, None, _b(path), detail=(path,))


# --- Clocks and randomness. ---


def boottime_ns() -> int:
    """CLOCK_BOOTTIME: lease deadlines and temp ages; keeps counting across suspend."""
    if not _armed and not _traces:  # _call's fast path, inlined (hot)
        return time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    return _call("clock", time.clock_gettime_ns, time.CLOCK_BOOTTIME, detail=("boottime",))


def realtime_ns() -> int:
    """CLOCK_REALTIME (Unix ns): raw wall time, only ever used through the watermarked wall floor."""
    if not _armed and not _traces:  # _call's fast path, inlined (hot)
        return time.clock_gettime_ns(time.CLOCK_REALTIME)
    return _call("clock", time.clock_gettime_ns, time.CLOCK_REALTIME, detail=("realtime",))


def monotonic_ns() -> int:
    """CLOCK_MONOTONIC: budgets and wait loops; never stored."""
    if not _armed and not _traces:  # _call's fast path, inlined (hot)
        return time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    return _call("clock", time.clock_gettime_ns, time.CLOCK_MONOTONIC, detail=("monotonic",))


def getrandom(n: int) -> bytes:
    """``n`` bytes from getrandom(2), retrying EINTR and short returns; never falls back to zeros."""
    # _call's fast path, inlined (every enqueue and claim); a short return goes on below.
    out = os.getrandom(n) if n > 0 and not _armed and not _traces else b""
    while len(out) < n:
        try:
            out += _call("getrandom", os.getrandom, n - len(out), detail=(n - len(out),))
        except InterruptedError:  # PEP 475 retries real EINTR; this catches injected ones
            continue
    return out
