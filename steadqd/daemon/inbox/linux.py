"""The few Linux calls the watch folders need and Python's ``os`` lacks: inotify and renameat2.

The daemon may not import ``steadqd.fs`` (its syscall layer belongs to the
filesystem backend, and the watch folder is a producer above the backend
contract), so these are a handful of ctypes calls of their own, as in
``guard.py``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

_libc = ctypes.CDLL(None, use_errno=True)

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_RENAME_NOREPLACE = 1

# What a watch folder listens to: a file finished (closed after writing, or
# moved in), changed again, or went away; and the folder itself going away.
FOLDER_EVENTS = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
    | IN_EXCL_UNLINK
)
FOLDER_GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED

_EVENT = struct.Struct("iIII")
_READ_SIZE = 256 * 1024


@dataclass(frozen=True)
class Event:
    mask: int
    name: str  # "" for an event of the folder itself


def _check(result: int, what: str) -> int:
    if result < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return result


def inotify_init() -> int:
    return _check(_libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC), "inotify_init1")


def watch_folder(inotify_fd: int, folder_fd: int) -> int:
    """Watch the directory ``folder_fd`` is open on (not whatever its path names by now)."""
    path = f"/proc/self/fd/{folder_fd}".encode()
    return _check(_libc.inotify_add_watch(inotify_fd, path, FOLDER_EVENTS), "inotify_add_watch")


def read_events(inotify_fd: int) -> Iterator[Event]:
    """Every event waiting, without blocking."""
    while True:
        try:
            buf = os.read(inotify_fd, _READ_SIZE)
        except BlockingIOError:
            return
        if not buf:
            return
        offset = 0
        while offset + _EVENT.size <= len(buf):
            _wd, mask, _cookie, length = _EVENT.unpack_from(buf, offset)
            offset += _EVENT.size
            raw = buf[offset : offset + length].split(b"\0", 1)[0]
            offset += length
            yield Event(mask, os.fsdecode(raw))


def rename_noreplace(src_dir: int, src: str, dst_dir: int, dst: str) -> None:
    """Move ``src`` to ``dst`` unless ``dst`` exists (FileExistsError), in one step where the
    filesystem can; else by link and unlink, which refuses an existing ``dst`` just the same."""
    result = _libc.renameat2(src_dir, os.fsencode(src), dst_dir, os.fsencode(dst), _RENAME_NOREPLACE)
    if result == 0:
        return
    e = ctypes.get_errno()
    if e not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        raise OSError(e, os.strerror(e), src, None, dst)
    os.link(src, dst, src_dir_fd=src_dir, dst_dir_fd=dst_dir, follow_symlinks=False)
    os.unlink(src, dir_fd=src_dir)
