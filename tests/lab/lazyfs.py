"""A FUSE file system that remembers every change, for crash lane 2 (the oracle).

Lane 1 records the syscalls steadqd issues through its own Linux layer. This
lane does not trust that layer: the queue runs on a real mount whose server
(this module) sits behind the kernel's VFS, so every change the kernel makes on
the queue's behalf — whatever code path asked for it — arrives here as a FUSE
request and is appended to :attr:`LazyFS.journal` in the order the server
applied it. :mod:`tests.lab.lazystates` turns that journal into crash states.

The server speaks the FUSE wire protocol on ``/dev/fuse`` directly (no libfuse:
the Debian fuse bindings cannot express ``RENAME_NOREPLACE`` or ``O_TMPFILE``),
keeps the whole tree in memory and runs in one thread of the calling process.
It implements what a queue needs — lookups, named and ``O_TMPFILE`` creation,
``linkat``, no-replace and plain renames, unlink, mkdir/rmdir, reads, writes,
truncation, chmod, ``fsync``/``fdatasync`` on files and directories, readdir,
statfs — and refuses the rest with the errno a real file system without the
feature would give. Locks (OFD, flock) are left to the kernel's local lock
manager, which is exact on a single machine.

Needs root and ``/dev/fuse``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import select
import stat
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

# -- the wire protocol (include/uapi/linux/fuse.h) ------------------------------------------

_IN_HDR = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid total_extlen padding
_OUT_HDR = struct.Struct("<IiQ")  # len error unique
_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr (88 bytes)
_ENTRY_OUT = struct.Struct("<QQQQII")  # nodeid generation entry_valid attr_valid (+nsec x2), then attr
_ATTR_OUT = struct.Struct("<QII")  # attr_valid attr_valid_nsec dummy, then attr
_INIT_IN = struct.Struct("<IIII")
_INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")
_OPEN_IN = struct.Struct("<II")
_OPEN_OUT = struct.Struct("<QII")
_CREATE_IN = struct.Struct("<IIII")  # flags mode umask open_flags
_MKNOD_IN = struct.Struct("<IIII")  # mode rdev umask padding
_MKDIR_IN = struct.Struct("<II")  # mode umask
_RENAME_IN = struct.Struct("<Q")
_RENAME2_IN = struct.Struct("<QII")
_LINK_IN = struct.Struct("<Q")
_SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")
_READ_IN = struct.Struct("<QQIIQII")  # fh offset size read_flags lock_owner flags padding
_WRITE_IN = struct.Struct("<QQIIQII")
_WRITE_OUT = struct.Struct("<II")
_FSYNC_IN = struct.Struct("<QII")
_STATFS_OUT = struct.Struct("<QQQQQIII4x24x")
_DIRENT = struct.Struct("<QQII")

OP = {
    "LOOKUP": 1, "FORGET": 2, "GETATTR": 3, "SETATTR": 4, "READLINK": 5, "SYMLINK": 6, "MKNOD": 8,
    "MKDIR": 9, "UNLINK": 10, "RMDIR": 11, "RENAME": 12, "LINK": 13, "OPEN": 14, "READ": 15,
    "WRITE": 16, "STATFS": 17, "RELEASE": 18, "FSYNC": 20, "FLUSH": 25, "INIT": 26, "OPENDIR": 27,
    "READDIR": 28, "RELEASEDIR": 29, "FSYNCDIR": 30, "CREATE": 35, "INTERRUPT": 36, "DESTROY": 38,
    "BATCH_FORGET": 42, "RENAME2": 45, "SYNCFS": 50, "TMPFILE": 51,
}  # fmt: skip
_NO_REPLY = {OP["FORGET"], OP["BATCH_FORGET"], OP["INTERRUPT"]}
_NAME_OF = {v: k for k, v in OP.items()}

_FATTR_MODE, _FATTR_UID, _FATTR_GID, _FATTR_SIZE = 1, 2, 4, 8
_RENAME_NOREPLACE = 1
_FUSE_BIG_WRITES = 1 << 5
_MAX_WRITE = 128 * 1024
_BUFSIZE = _MAX_WRITE + 64 * 1024
_ROOT = 1
_PROTO = (7, 31)  # RENAME2 needs >= 7.23

_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2

MARK_PREFIX = b".lazyfs-mark:"  # a lookup of <mount>/.lazyfs-mark:<text> records a mark


def mark(mountpoint: str, text: str) -> None:
    """Record ``text`` in the journal's marks at the current position, from any process.

    The lookup reaches the server after every earlier request of this thread
    was answered, so the mark sits after all of the caller's earlier changes.
    """
    try:
        os.stat(os.path.join(mountpoint, MARK_PREFIX.decode() + text))
    except FileNotFoundError:
        return
    raise AssertionError("a LazyFS mark lookup must fail with ENOENT")


# -- the journal ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Mkdir:
    parent: int
    name: bytes
    ino: int
    mode: int


@dataclass(frozen=True)
class Create:
    """A named regular file, or (parent 0) an ``O_TMPFILE`` inode with no name yet."""

    parent: int
    name: bytes
    ino: int
    mode: int


@dataclass(frozen=True)
class Link:
    parent: int
    name: bytes
    ino: int


@dataclass(frozen=True)
class Unlink:
    """unlink or rmdir."""

    parent: int
    name: bytes
    ino: int


@dataclass(frozen=True)
class Rename:
    src_parent: int
    src_name: bytes
    dst_parent: int
    dst_name: bytes
    ino: int
    replaced: int | None  # the inode a plain rename unlinked at the destination


@dataclass(frozen=True)
class Write:
    ino: int
    offset: int
    data: bytes


@dataclass(frozen=True)
class Truncate:
    ino: int
    size: int


@dataclass(frozen=True)
class Chmod:
    ino: int
    mode: int  # permission bits only


@dataclass(frozen=True)
class Fsync:
    """fsync/fdatasync of a file, or fsync of a directory (``is_dir``)."""

    ino: int
    is_dir: bool


JournalOp = Mkdir | Create | Link | Unlink | Rename | Write | Truncate | Chmod | Fsync


# -- the in-memory tree ---------------------------------------------------------------------


@dataclass
class Node:
    ino: int
    mode: int  # with the S_IFMT bits
    data: bytearray = field(default_factory=bytearray)
    entries: dict[bytes, int] = field(default_factory=dict)  # directories only, in creation order
    nlink: int = 1
    uid: int = 0
    gid: int = 0
    mtime_ns: int = 0

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


class FuseError(Exception):
    def __init__(self, err: int) -> None:
        super().__init__(os.strerror(err))
        self.errno = err


def _cstr(body: bytes, start: int = 0) -> tuple[bytes, int]:
    end = body.index(b"\0", start)
    return body[start:end], end + 1


class LazyFS:
    """Serve an in-memory tree at ``mountpoint`` and journal every change.

    Use as a context manager (mounts, serves from a thread, unmounts). ``errors``
    collects server-side exceptions: a test must check it is empty, because a
    request the server failed on is an EIO the queue saw, not a crash state.
    """

    def __init__(self, mountpoint: str) -> None:
        self.mountpoint = mountpoint
        now = time.time_ns()
        self.nodes: dict[int, Node] = {_ROOT: Node(_ROOT, stat.S_IFDIR | 0o755, nlink=2, mtime_ns=now)}
        self.journal: list[JournalOp] = []
        self.marks: list[tuple[int, str]] = []  # (journal length, text) per mark()
        self.errors: list[str] = []
        self.requests: dict[str, int] = {}
        self._next_ino = _ROOT + 1
        self._handles: dict[int, tuple[int, list[tuple[bytes, int]]]] = {}  # fh -> (ino, readdir snapshot)
        self._next_fh = 1
        self._fd = -1
        self._stop = threading.Event()
        self._unmounting = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # journal length read by other threads

    # -- lifecycle

    def __enter__(self) -> LazyFS:
        self.mount()
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmount()

    def mount(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        opts = f"fd={self._fd},rootmode=40755,user_id=0,group_id=0,default_permissions,allow_other"
        if libc.mount(b"lazyfs", os.fsencode(self.mountpoint), b"fuse.lazyfs", _MS_NOSUID | _MS_NODEV, opts.encode()):
            err = ctypes.get_errno()
            os.close(self._fd)
            raise OSError(err, f"mount fuse.lazyfs on {self.mountpoint}: {os.strerror(err)}")
        self._libc = libc
        self._thread = threading.Thread(target=self._serve, name="lazyfs", daemon=True)
        self._thread.start()

    def unmount(self) -> None:
        if self._fd < 0:
            return
        # Detach first so nothing new reaches the mount, then stop serving and
        # close the device: closing the last /dev/fuse fd aborts the connection,
        # which releases any descriptor a test leaked on the mount.
        self._unmounting = True
        self._libc.umount2(os.fsencode(self.mountpoint), _MNT_DETACH)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        os.close(self._fd)
        self._fd = -1

    def index(self) -> int:
        """Journal length: every change of a syscall that has returned is in it."""
        with self._lock:
            return len(self.journal)

    # -- serving

    def _serve(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            try:
                buf = os.read(self._fd, _BUFSIZE)
            except OSError as e:
                # The end of the connection: ENODEV once unmounted, ECONNABORTED
                # when the kernel aborted it on the way. Only an end we caused is normal.
                if e.errno in (errno.ENODEV, errno.ECONNABORTED) and self._unmounting:
                    return
                if e.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue
                self.errors.append(f"read /dev/fuse: {e}")
                return
            self._dispatch(buf)

    def _dispatch(self, buf: bytes) -> None:
        _len, opcode, unique, nodeid, _uid, _gid, _pid, _ext, _pad = _IN_HDR.unpack_from(buf)
        body = buf[_IN_HDR.size :]
        name = _NAME_OF.get(opcode, f"op{opcode}")
        self.requests[name] = self.requests.get(name, 0) + 1
        if opcode in _NO_REPLY:
            return
        handler = getattr(self, f"_op_{name.lower()}", None)
        try:
            if handler is None:
                raise FuseError(errno.ENOSYS)
            with self._lock:
                out = handler(nodeid, body)
            err = 0
        except FuseError as e:
            out, err = b"", -e.errno
        except Exception as e:  # a server bug: the caller sees EIO, the test sees the error
            self.errors.append(f"{name} on node {nodeid}: {type(e).__name__}: {e}")
            out, err = b"", -errno.EIO
        try:
            os.write(self._fd, _OUT_HDR.pack(_OUT_HDR.size + len(out), err, unique) + out)
        except FileNotFoundError:
            pass  # the request was interrupted: the kernel no longer waits for it
        except OSError as e:
            if not (self._unmounting and e.errno in (errno.ENODEV, errno.ECONNABORTED)):
                self.errors.append(f"reply to {name}: {e}")

    # -- helpers

    def _node(self, ino: int) -> Node:
        node = self.nodes.get(ino)
        if node is None:
            raise FuseError(errno.ESTALE)
        return node

    def _dir(self, ino: int) -> Node:
        node = self._node(ino)
        if not node.is_dir:
            raise FuseError(errno.ENOTDIR)
        return node

    def _attr(self, node: Node) -> bytes:
        size = len(node.data)
        s, ns = divmod(node.mtime_ns, 1_000_000_000)
        return _ATTR.pack(
            node.ino, size, (size + 511) // 512, s, s, s, ns, ns, ns, node.mode, node.nlink, node.uid, node.gid,
            0, 4096, 0,
        )  # fmt: skip

    def _entry(self, node: Node) -> bytes:
        # Entries may be cached (every change goes through this kernel); attributes may not.
        return _ENTRY_OUT.pack(node.ino, 1, 1, 0, 0, 0) + self._attr(node)

    def _new(self, mode: int, parent: Node) -> Node:
        ino = self._next_ino
        self._next_ino += 1
        node = Node(ino, mode, nlink=2 if stat.S_ISDIR(mode) else 1, mtime_ns=time.time_ns())
        if parent.mode & stat.S_ISGID:  # BSD group semantics of a setgid directory
            node.gid = parent.gid
            if node.is_dir:
                node.mode |= stat.S_ISGID
        self.nodes[ino] = node
        return node

    def _touch(self, *nodes: Node) -> None:
        now = time.time_ns()
        for n in nodes:
            n.mtime_ns = now

    def _handle(self, ino: int) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = (ino, [])
        return fh

    def _add_name(self, parent: Node, name: bytes, node: Node) -> None:
        if name in parent.entries:
            raise FuseError(errno.EEXIST)
        parent.entries[name] = node.ino
        if node.is_dir:
            parent.nlink += 1
        self._touch(parent)

    # -- requests

    def _op_init(self, nodeid: int, body: bytes) -> bytes:
        major, minor, max_readahead, _flags = _INIT_IN.unpack_from(body)
        if major != 7:
            raise FuseError(errno.EPROTO)
        minor = min(minor, _PROTO[1])
        return _INIT_OUT.pack(7, minor, max_readahead, _FUSE_BIG_WRITES, 16, 12, _MAX_WRITE, 1, 0, 0, 0, 0)

    def _op_destroy(self, nodeid: int, body: bytes) -> bytes:
        return b""

    def _op_lookup(self, nodeid: int, body: bytes) -> bytes:
        name, _ = _cstr(body)
        if nodeid == _ROOT and name.startswith(MARK_PREFIX):
            # A commit mark from any process: "everything I did so far is in the journal".
            self.marks.append((len(self.journal), name[len(MARK_PREFIX) :].decode("ascii", "replace")))
            raise FuseError(errno.ENOENT)
        child = self._dir(nodeid).entries.get(name)
        if child is None:
            raise FuseError(errno.ENOENT)
        return self._entry(self.nodes[child])

    def _op_getattr(self, nodeid: int, body: bytes) -> bytes:
        return _ATTR_OUT.pack(0, 0, 0) + self._attr(self._node(nodeid))

    def _op_setattr(self, nodeid: int, body: bytes) -> bytes:
        fields = _SETATTR_IN.unpack_from(body)
        valid, size, mode, uid, gid = fields[0], fields[3], fields[11], fields[13], fields[14]
        node = self._node(nodeid)
        if valid & _FATTR_SIZE:
            if node.is_dir:
                raise FuseError(errno.EISDIR)
            if size < len(node.data):
                del node.data[size:]
            else:
                node.data.extend(bytes(size - len(node.data)))
            self.journal.append(Truncate(node.ino, size))
        if valid & _FATTR_MODE:
            node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(mode)
            self.journal.append(Chmod(node.ino, stat.S_IMODE(mode)))
        if valid & _FATTR_UID:
            node.uid = uid
        if valid & _FATTR_GID:
            node.gid = gid
        return _ATTR_OUT.pack(0, 0, 0) + self._attr(node)

    def _op_mkdir(self, nodeid: int, body: bytes) -> bytes:
        mode, _umask = _MKDIR_IN.unpack_from(body)
        name, _ = _cstr(body, _MKDIR_IN.size)
        parent = self._dir(nodeid)
        if name in parent.entries:
            raise FuseError(errno.EEXIST)
        node = self._new(stat.S_IFDIR | stat.S_IMODE(mode), parent)
        self._add_name(parent, name, node)
        self.journal.append(Mkdir(parent.ino, name, node.ino, stat.S_IMODE(node.mode)))
        return self._entry(node)

    def _create(self, parent: Node, name: bytes, mode: int) -> Node:
        if name in parent.entries:
            raise FuseError(errno.EEXIST)
        node = self._new(stat.S_IFREG | stat.S_IMODE(mode), parent)
        self._add_name(parent, name, node)
        self.journal.append(Create(parent.ino, name, node.ino, stat.S_IMODE(node.mode)))
        return node

    def _op_mknod(self, nodeid: int, body: bytes) -> bytes:
        mode, _rdev, _umask, _ = _MKNOD_IN.unpack_from(body)
        if not stat.S_ISREG(mode):
            raise FuseError(errno.EPERM)
        name, _ = _cstr(body, _MKNOD_IN.size)
        return self._entry(self._create(self._dir(nodeid), name, mode))

    def _op_create(self, nodeid: int, body: bytes) -> bytes:
        _flags, mode, _umask, _open_flags = _CREATE_IN.unpack_from(body)
        name, _ = _cstr(body, _CREATE_IN.size)
        node = self._create(self._dir(nodeid), name, mode)
        return self._entry(node) + _OPEN_OUT.pack(self._handle(node.ino), 0, 0)

    def _op_tmpfile(self, nodeid: int, body: bytes) -> bytes:
        _flags, mode, _umask, _open_flags = _CREATE_IN.unpack_from(body)
        node = self._new(stat.S_IFREG | stat.S_IMODE(mode), self._dir(nodeid))
        node.nlink = 0
        self.journal.append(Create(0, b"", node.ino, stat.S_IMODE(node.mode)))
        return self._entry(node) + _OPEN_OUT.pack(self._handle(node.ino), 0, 0)

    def _op_link(self, nodeid: int, body: bytes) -> bytes:
        (old,) = _LINK_IN.unpack_from(body)
        name, _ = _cstr(body, _LINK_IN.size)
        node, parent = self._node(old), self._dir(nodeid)
        if node.is_dir:
            raise FuseError(errno.EPERM)
        self._add_name(parent, name, node)
        node.nlink += 1
        self.journal.append(Link(parent.ino, name, node.ino))
        return self._entry(node)

    def _remove(self, nodeid: int, body: bytes, want_dir: bool) -> bytes:
        name, _ = _cstr(body)
        parent = self._dir(nodeid)
        ino = parent.entries.get(name)
        if ino is None:
            raise FuseError(errno.ENOENT)
        node = self.nodes[ino]
        if want_dir and not node.is_dir:
            raise FuseError(errno.ENOTDIR)
        if not want_dir and node.is_dir:
            raise FuseError(errno.EISDIR)
        if want_dir and node.entries:
            raise FuseError(errno.ENOTEMPTY)
        del parent.entries[name]
        node.nlink -= 2 if node.is_dir else 1
        if node.is_dir:
            parent.nlink -= 1
        self._touch(parent)
        self.journal.append(Unlink(parent.ino, name, ino))
        return b""

    def _op_unlink(self, nodeid: int, body: bytes) -> bytes:
        return self._remove(nodeid, body, want_dir=False)

    def _op_rmdir(self, nodeid: int, body: bytes) -> bytes:
        return self._remove(nodeid, body, want_dir=True)

    def _rename(self, nodeid: int, newdir: int, flags: int, names: bytes) -> bytes:
        if flags & ~_RENAME_NOREPLACE:
            raise FuseError(errno.EINVAL)  # RENAME_EXCHANGE / WHITEOUT: not offered
        old, pos = _cstr(names)
        new, _ = _cstr(names, pos)
        src, dst = self._dir(nodeid), self._dir(newdir)
        ino = src.entries.get(old)
        if ino is None:
            raise FuseError(errno.ENOENT)
        node = self.nodes[ino]
        replaced = dst.entries.get(new)
        if replaced == ino:
            return b""  # the same file under both names: POSIX says do nothing
        if replaced is not None:
            if flags & _RENAME_NOREPLACE:
                raise FuseError(errno.EEXIST)
            victim = self.nodes[replaced]
            if victim.is_dir != node.is_dir:
                raise FuseError(errno.EISDIR if victim.is_dir else errno.ENOTDIR)
            if victim.is_dir and victim.entries:
                raise FuseError(errno.ENOTEMPTY)
            victim.nlink -= 2 if victim.is_dir else 1
            if victim.is_dir:
                dst.nlink -= 1
        del src.entries[old]
        dst.entries[new] = ino
        if node.is_dir and src is not dst:
            src.nlink -= 1
            dst.nlink += 1
        self._touch(src, dst)
        self.journal.append(Rename(src.ino, old, dst.ino, new, ino, replaced))
        return b""

    def _op_rename(self, nodeid: int, body: bytes) -> bytes:
        (newdir,) = _RENAME_IN.unpack_from(body)
        return self._rename(nodeid, newdir, 0, body[_RENAME_IN.size :])

    def _op_rename2(self, nodeid: int, body: bytes) -> bytes:
        newdir, flags, _ = _RENAME2_IN.unpack_from(body)
        return self._rename(nodeid, newdir, flags, body[_RENAME2_IN.size :])

    def _op_open(self, nodeid: int, body: bytes) -> bytes:
        node = self._node(nodeid)
        if node.is_dir:
            raise FuseError(errno.EISDIR)
        return _OPEN_OUT.pack(self._handle(node.ino), 0, 0)

    def _op_read(self, nodeid: int, body: bytes) -> bytes:
        _fh, offset, size, *_ = _READ_IN.unpack_from(body)
        return bytes(self._node(nodeid).data[offset : offset + size])

    def _op_write(self, nodeid: int, body: bytes) -> bytes:
        _fh, offset, size, *_ = _WRITE_IN.unpack_from(body)
        data = body[_WRITE_IN.size : _WRITE_IN.size + size]
        node = self._node(nodeid)
        if len(node.data) < offset:
            node.data.extend(bytes(offset - len(node.data)))
        node.data[offset : offset + len(data)] = data
        self._touch(node)
        self.journal.append(Write(node.ino, offset, bytes(data)))
        return _WRITE_OUT.pack(len(data), 0)

    def _op_flush(self, nodeid: int, body: bytes) -> bytes:
        return b""

    def _op_release(self, nodeid: int, body: bytes) -> bytes:
        (fh,) = struct.unpack_from("<Q", body)
        self._handles.pop(fh, None)
        return b""

    _op_releasedir = _op_release

    def _op_fsync(self, nodeid: int, body: bytes) -> bytes:
        self.journal.append(Fsync(self._node(nodeid).ino, is_dir=False))
        return b""

    def _op_fsyncdir(self, nodeid: int, body: bytes) -> bytes:
        self.journal.append(Fsync(self._dir(nodeid).ino, is_dir=True))
        return b""

    def _op_opendir(self, nodeid: int, body: bytes) -> bytes:
        return _OPEN_OUT.pack(self._handle(self._dir(nodeid).ino), 0, 0)

    def _op_readdir(self, nodeid: int, body: bytes) -> bytes:
        fh, offset, size, *_ = _READ_IN.unpack_from(body)
        ino, snapshot = self._handles[fh]
        if offset == 0:  # a (re)start: rewinddir must see entries created since opendir
            node = self._dir(ino)
            snapshot[:] = [(b".", ino), (b"..", ino), *node.entries.items()]
        out = bytearray()
        for i in range(offset, len(snapshot)):
            name, child = snapshot[i]
            kind = self.nodes[child].mode if child in self.nodes else stat.S_IFREG
            rec = _DIRENT.pack(child, i + 1, len(name), stat.S_IFMT(kind) >> 12) + name
            rec += bytes(-len(rec) % 8)
            if len(out) + len(rec) > size:
                break
            out += rec
        return bytes(out)

    def _op_statfs(self, nodeid: int, body: bytes) -> bytes:
        return _STATFS_OUT.pack(1 << 20, 1 << 19, 1 << 19, 1 << 20, 1 << 19, 4096, 255, 4096)


@contextlib.contextmanager
def mounted(mountpoint: str) -> Iterator[LazyFS]:
    """Mount a LazyFS at ``mountpoint`` for the block; fail the block if the server failed."""
    fs = LazyFS(mountpoint)
    with fs:
        yield fs
    if fs.errors:
        raise AssertionError("lazyfs server errors: " + "; ".join(fs.errors[:5]))


def available() -> str | None:
    """None if a LazyFS can be mounted here, else why not."""
    if os.geteuid() != 0:
        return "needs root (mount)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    return None
