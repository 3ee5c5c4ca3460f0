"""The C library and raw system calls steadqd reaches through cffi (ABI mode, nothing compiled).

SteadQ/1 depends on primitives that ``os`` does not expose
(``renameat2(RENAME_NOREPLACE)``, ``openat2`` resolve flags,
``linkat(AT_EMPTY_PATH)``, ``statfs.f_type``, ``getdents64`` a chunk at a
time). This module declares them and makes each call, turning ``-1`` into
OSError with the real errno. Nothing here is traced or faulted: the wrappers
of :mod:`steadqd.fs.linux` pass each of these through the syscall hook.

This module imports nothing else from steadqd.
"""

from __future__ import annotations

import errno as _errno
import os
import platform
import struct
import threading
from typing import Any

import cffi

_MACHINE = platform.machine()
# openat2 has the same number on every architecture using the unified syscall table.
_SYS_OPENAT2 = 437
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}.get(_MACHINE)

_ffi = cffi.FFI()
_ffi.cdef(
    """
    struct open_how { uint64_t flags; uint64_t mode; uint64_t resolve; };
    long syscall(long number, ...);
    int linkat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, int flags);
    int fstatfs(int fd, void *buf);
    int statfs(const char *path, void *buf);
    """
)
_libc: Any = _ffi.dlopen(None)
try:  # glibc >= 2.28; declared separately so an older libc still imports this module.
    _ffi.cdef(
        "int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags);"
    )
    _renameat2_fn: Any = _libc.renameat2
except (AttributeError, cffi.FFIError):
    _renameat2_fn = None


try:  # glibc >= 2.30; the raw syscall otherwise.
    _ffi.cdef("ssize_t getdents64(int fd, void *dirp, size_t count);")
    _getdents64_fn: Any = _libc.getdents64
except (AttributeError, cffi.FFIError):
    _getdents64_fn = None
_SYS_GETDENTS64 = {"x86_64": 217, "aarch64": 61}.get(_MACHINE)
_DIRENT64 = struct.Struct("<QqHB")  # d_ino, d_off, d_reclen, d_type; then the NUL-terminated name

try:  # glibc >= 2.6 on every architecture we run on.
    _ffi.cdef("int sync_file_range(int fd, int64_t offset, int64_t nbytes, unsigned int flags);")
    _sync_file_range_fn: Any = _libc.sync_file_range
except (AttributeError, cffi.FFIError):
    _sync_file_range_fn = None


def check(ret: int, *names: str | bytes) -> int:
    """Turn a libc ``-1`` return into OSError with the real errno."""
    if ret < 0:
        err = _ffi.errno
        raise OSError(err, os.strerror(err), *(os.fsdecode(n) for n in names[:1]))
    return ret


openat2_missing = False  # set once a real kernel answered ENOSYS


def openat2(dirfd: int, path: bytes, flags: int, mode: int, resolve: int) -> int:
    global openat2_missing
    how = _ffi.new("struct open_how *", {"flags": flags, "mode": mode, "resolve": resolve})
    ret = _libc.syscall(
        _ffi.cast("long", _SYS_OPENAT2),
        _ffi.cast("long", dirfd),
        _ffi.new("char[]", path),
        how,
        _ffi.cast("size_t", _ffi.sizeof("struct open_how")),
    )
    if ret < 0 and _ffi.errno == _errno.ENOSYS:
        openat2_missing = True  # only a real kernel ENOSYS is remembered, never an injected one
    return check(ret, path)


def sync_file_range(fd: int, offset: int, nbytes: int, flags: int) -> None:
    if _sync_file_range_fn is None:
        raise OSError(_errno.ENOSYS, "sync_file_range unavailable")
    check(_sync_file_range_fn(fd, offset, nbytes, flags))


_dents = threading.local()  # one reusable getdents buffer per thread (a claim reads a chunk per shard)


def getdents(dirfd: int, size: int) -> list[bytes]:
    buf = getattr(_dents, "buf", None)
    if buf is None or len(buf) < size:
        buf = _dents.buf = _ffi.new("char[]", size)
    if _getdents64_fn is not None:
        n = _getdents64_fn(dirfd, buf, size)
    elif _SYS_GETDENTS64 is not None:
        n = _libc.syscall(
            _ffi.cast("long", _SYS_GETDENTS64), _ffi.cast("long", dirfd), buf, _ffi.cast("unsigned long", size)
        )
    else:
        raise OSError(_errno.ENOSYS, "getdents64 unavailable")
    if n < 0:  # check's test, without its call (every claim scan reads one or two chunks)
        check(n)
    if not n:  # the end of the directory (a scan's read after its last entry): no buffer to copy
        return []
    data = _ffi.buffer(buf, n)[:]
    names: list[bytes] = []
    pos = 0
    while pos < n:
        reclen = _DIRENT64.unpack_from(data, pos)[2]
        name = data[pos + _DIRENT64.size : pos + reclen].split(b"\0", 1)[0]
        if name not in (b".", b".."):
            names.append(name)
        pos += reclen
    return names


# What a chunk of an empty directory holds on Linux: "." then "..", each a
# 24-byte record (the kernel aligns the 19 header bytes + name + NUL to 8).
DOT_RECORD_BYTES = 24
DOTS_CHUNK_BYTES = 2 * DOT_RECORD_BYTES
DOT_AT = _DIRENT64.size  # where the first record's name starts
DOTDOT_AT = DOT_RECORD_BYTES + _DIRENT64.size  # and the second's

getdents64_raw: Any = _getdents64_fn
"""``getdents64(fd, buffer, size)`` as libc has it (-1 and errno on failure, no OSError), or None
on a glibc without it: for a loop that reads many directories, without a frame for each."""


def probe_buffer(size: int) -> tuple[bytearray, Any]:
    """This thread's buffer for :data:`getdents64_raw`: a bytearray and the cffi pointer into it.

    A chunk read into it is tested in place, byte by byte, with no copy.
    """
    pair: tuple[bytearray, Any] | None = getattr(_dents, "probe", None)
    if pair is None or len(pair[0]) < size:
        data = bytearray(size)
        pair = _dents.probe = (data, _ffi.from_buffer(data))
    return pair


def renameat2(olddirfd: int, old: bytes, newdirfd: int, new: bytes, flags: int) -> None:
    if _renameat2_fn is not None:
        ret = _renameat2_fn(olddirfd, old, newdirfd, new, flags)
    elif _SYS_RENAMEAT2 is not None:
        ret = _libc.syscall(
            _ffi.cast("long", _SYS_RENAMEAT2),
            _ffi.cast("long", olddirfd),
            _ffi.new("char[]", old),
            _ffi.cast("long", newdirfd),
            _ffi.new("char[]", new),
            _ffi.cast("unsigned long", flags),
        )
    else:
        raise OSError(_errno.ENOSYS, "renameat2 unavailable")
    if ret < 0:
        check(ret, old)


def linkat(olddirfd: int, old: bytes, newdirfd: int, new: bytes, flags: int) -> None:
    if _libc.linkat(olddirfd, old, newdirfd, new, flags) < 0:
        check(-1, new)


def statfs_f_type(fd: int | None, path: bytes | None) -> int:
    buf = _ffi.new("unsigned char[256]")  # zeroed; struct statfs is 120 bytes on x86_64/aarch64
    ret = _libc.fstatfs(fd, buf) if fd is not None else _libc.statfs(path, buf)
    check(ret, *(() if path is None else (path,)))
    # f_type is the first field, a native long; glibc makes it signed, so compare as u32.
    return int(_ffi.cast("long *", buf)[0]) & 0xFFFFFFFF
