"""Record a workload's syscalls as a logical operation log (the ALICE approach).

Why a *live* recorder: :class:`steadqd.fs.linux.TraceEvent` records each call
before it runs, with file descriptors rather than paths and byte counts
rather than bytes. A crash state needs paths relative to the queue root, the
identity of the inode every write/fsync/link touches, and the bytes written.
All of that can be read from the process itself while the workload runs: the
recorder is a list registered with the Linux layer's trace hook whose
``append`` (called by ``linux._call`` just before the syscall) first
*completes* the previous event (its syscall has returned by now, so its
effect is visible: was the name created, how many bytes were written) and
then *prepares* the new one (resolve fds via ``fstat`` and
``/proc/self/fd``, stat the names it will touch). The library is not
modified; only plain ``os`` calls are made here, so the recorder never shows
up in its own trace.

Files are identified by a *file id* (``fid``), not by inode number: inode
numbers are reused after an unlink, and every creation (``tmpfile``,
``open(O_CREAT)``) is observed, so each creation gets a fresh fid.

The recorder assumes a single-threaded workload (checked) and that every
mutation of the queue tree goes through ``steadqd.fs.linux`` (that is the
premise of this lane; the oracle lane does not rely on it).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from steadqd.fs import linux

# --- The logical operations. ------------------------------------------------------


@dataclass(frozen=True)
class Mkdir:
    path: str
    mode: int


@dataclass(frozen=True)
class Rmdir:
    path: str


@dataclass(frozen=True)
class Create:
    """A new inode; ``path`` is its first name (named create) or None (O_TMPFILE)."""

    fid: int
    path: str | None
    mode: int


@dataclass(frozen=True)
class Write:
    fid: int
    offset: int
    data: bytes


@dataclass(frozen=True)
class Chmod:
    """fchmod of a file (``fid``) or of a directory (``path``)."""

    fid: int | None
    path: str | None
    mode: int


@dataclass(frozen=True)
class FsyncFile:
    fid: int


@dataclass(frozen=True)
class FsyncDir:
    path: str


@dataclass(frozen=True)
class Link:
    fid: int
    path: str


@dataclass(frozen=True)
class Rename:
    src: str
    dst: str
    replace: bool  # plain rename(2), may replace dst (watermark, cursor, compaction); else RENAME_NOREPLACE


@dataclass(frozen=True)
class Unlink:
    path: str


Op = Mkdir | Rmdir | Create | Write | Chmod | FsyncFile | FsyncDir | Link | Rename | Unlink
DIR_OPS = (Mkdir, Rmdir, Create, Link, Rename, Unlink)  # Create only when named


def is_dir_op(op: Op) -> bool:
    """Directory-entry changes: durable only after an fsync of the directory."""
    return isinstance(op, DIR_OPS) and not (isinstance(op, Create) and op.path is None)


def describe(op: Op) -> str:
    """A short human-readable form for reports."""
    match op:
        case Write(fid=fid, offset=off, data=data):
            return f"write(f{fid}, @{off}, {len(data)}B)"
        case Create(fid=fid, path=p):
            return f"create(f{fid}, {p or 'O_TMPFILE'})"
        case FsyncFile(fid=fid):
            return f"fsync(f{fid})"
        case FsyncDir(path=p):
            return f"fsync({p or '/'}/)"
        case Link(fid=fid, path=p):
            return f"link(f{fid} -> {p})"
        case Rename(src=s, dst=d, replace=r):
            return f"rename{'' if r else '_noreplace'}({s} -> {d})"
        case _:
            return repr(op)


# --- The file-system image (pre-workload snapshot and crash states). -----------------


@dataclass
class Image:
    """An in-memory tree: directories, names and file contents.

    ``names`` maps a path to a fid; two names mapping to one fid are hard
    links. The root directory is ``""``.
    """

    dirs: dict[str, int] = field(default_factory=dict)  # path -> mode
    names: dict[str, int] = field(default_factory=dict)  # path -> fid
    data: dict[int, bytes] = field(default_factory=dict)  # fid -> content
    modes: dict[int, int] = field(default_factory=dict)  # fid -> mode

    def copy(self) -> Image:
        return Image(dict(self.dirs), dict(self.names), dict(self.data), dict(self.modes))


def snapshot(root: str, inodes: dict[tuple[int, int], int]) -> Image:
    """Read the tree at ``root`` into an Image (treated as fully durable).

    Fills ``inodes`` ((dev, ino) -> fid) so the recorder recognises the
    files that existed before the workload.
    """
    img = Image()
    img.dirs[""] = stat.S_IMODE(os.lstat(root).st_mode)
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        for d in dirnames:
            p = f"{rel_dir}/{d}" if rel_dir else d
            st = os.lstat(os.path.join(root, p))
            if not stat.S_ISDIR(st.st_mode):
                raise RuntimeError(f"snapshot: {p} is a symlink to a directory")
            img.dirs[p] = stat.S_IMODE(st.st_mode)
        for f in filenames:
            p = f"{rel_dir}/{f}" if rel_dir else f
            full = os.path.join(root, p)
            st = os.lstat(full)
            if not stat.S_ISREG(st.st_mode):
                raise RuntimeError(f"snapshot: {p} is not a regular file")
            key = (st.st_dev, st.st_ino)
            fid = inodes.get(key)
            if fid is None:
                fid = len(inodes) + 1
                inodes[key] = fid
                with open(full, "rb") as fh:
                    img.data[fid] = fh.read()
                img.modes[fid] = stat.S_IMODE(st.st_mode)
            img.names[p] = fid
    return img


# --- The live recorder. ---------------------------------------------------------------


class _Recorder(list):  # type: ignore[type-arg]
    """A trace list whose ``append`` turns raw events into logical ops (see module doc)."""

    def __init__(self, root: str, inodes: dict[tuple[int, int], int]) -> None:
        super().__init__()
        self.root = os.path.realpath(root)
        self.inodes = inodes
        self.next_fid = max(inodes.values(), default=0) + 1
        self.ops: list[Op] = []
        self.errors: list[str] = []
        self.tid = threading.get_ident()
        self._pending: tuple[str, tuple[Any, ...]] | None = None
        self.raw_events = 0

    # -- hook -----------------------------------------------------------------

    def append(self, event: Any) -> None:  # called under linux._lock, before the syscall
        self.raw_events += 1
        if threading.get_ident() != self.tid:
            self.errors.append(f"syscall {event.op} from another thread: the recorder needs a single thread")
            return
        try:
            self._complete()
            self._prepare(event.op, event.detail)
        except Exception as e:  # never break the workload's syscall; report at the end
            self.errors.append(f"{event.op}{event.detail}: {type(e).__name__}: {e}")
            self._pending = None

    def flush(self) -> int:
        """Complete the last event; the number of ops so far (a commit index)."""
        with linux._lock:
            try:
                self._complete()
            except Exception as e:
                self.errors.append(f"flush: {type(e).__name__}: {e}")
                self._pending = None
            return len(self.ops)

    # -- resolution helpers -------------------------------------------------------

    def _fd_path(self, fd: int) -> str | None:
        """Path of an open fd relative to the root; None when outside it or deleted."""
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.endswith(" (deleted)"):
            return None
        if target == self.root:
            return ""
        if target.startswith(self.root + "/"):
            return target[len(self.root) + 1 :]
        return None

    def _at_path(self, dirfd: int, name: str) -> str | None:
        """Path of ``name`` relative to ``dirfd``, relative to the root (None outside)."""
        if name.startswith("/"):
            if name == self.root:
                return ""
            return name[len(self.root) + 1 :] if name.startswith(self.root + "/") else None
        if dirfd == linux.AT_FDCWD:
            return self._at_path(dirfd, os.path.join(os.getcwd(), name))
        base = self._fd_path(dirfd)
        if base is None:
            return None
        return f"{base}/{name}" if base else name

    def _lstat(self, dirfd: int, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=None if dirfd == linux.AT_FDCWD else dirfd, follow_symlinks=False)
        except OSError:
            return None

    def _file_of(self, fd: int) -> int | None:
        """The fid of a regular-file fd; None if the file is outside the queue."""
        st = os.fstat(fd)
        fid = self.inodes.get((st.st_dev, st.st_ino))
        if fid is not None:
            return fid
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.startswith(self.root + "/"):
            raise RuntimeError(f"fd {fd} names an inode inside the queue whose creation was not seen: {target}")
        return None

    def _new_fid(self, st: os.stat_result) -> int:
        fid = self.next_fid
        self.next_fid += 1
        self.inodes[(st.st_dev, st.st_ino)] = fid
        return fid

    @staticmethod
    def _open_fds() -> set[int]:
        fds = set()
        for n in os.listdir("/proc/self/fd"):
            fd = int(n)
            with contextlib.suppress(OSError):
                os.fstat(fd)  # the listing's own fd is closed by now: EBADF drops it
                fds.add(fd)
        return fds

    # -- prepare (before the syscall) ---------------------------------------------

    def _prepare(self, op: str, d: tuple[Any, ...]) -> None:
        p: tuple[Any, ...] | None = None
        if op == "write":
            fd, _n = d
            fid = self._file_of(fd)
            if fid is not None:
                p = (fid, fd, os.lseek(fd, 0, os.SEEK_CUR), None)
        elif op == "pwrite":
            fd, n, off = d
            fid = self._file_of(fd)
            if fid is not None:
                p = (fid, fd, off, n)
        elif op == "fsync":
            (fd,) = d
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                path = self._fd_path(fd)
                p = None if path is None else ("dir", path)
            else:
                fid = self._file_of(fd)
                p = None if fid is None else ("file", fid)
        elif op == "fchmod":
            fd, mode = d
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                path = self._fd_path(fd)
                p = None if path is None else (None, path, mode)
            else:
                fid = self._file_of(fd)
                p = None if fid is None else (fid, None, mode)
        elif op == "link":
            _form, fd, dirfd, name = d
            fid = self._file_of(fd)
            path = self._at_path(dirfd, name)
            if fid is not None and path is not None:
                p = (fid, path, dirfd, name, self._lstat(dirfd, name) is not None)
        elif op in ("rename", "rename_noreplace"):
            odir, old, ndir, new = d
            src, dst = self._at_path(odir, old), self._at_path(ndir, new)
            if src is not None or dst is not None:
                if src is None or dst is None:
                    raise RuntimeError(f"rename across the queue boundary: {old} -> {new}")
                sst = self._lstat(odir, old)
                if sst is not None and stat.S_ISDIR(sst.st_mode):
                    raise RuntimeError(f"directory rename {src} -> {dst} is not modelled")
                p = (src, dst, odir, old, ndir, new, sst, op == "rename")
        elif op == "unlink":
            dirfd, name = d
            path = self._at_path(dirfd, name)
            if path is not None:
                p = (path, dirfd, name, self._lstat(dirfd, name))
        elif op in ("mkdir", "rmdir"):
            dirfd, name = d[0], d[1]
            path = self._at_path(dirfd, name)
            if path is not None:
                p = (path, dirfd, name, self._lstat(dirfd, name) is not None, d[2] if op == "mkdir" else 0)
        elif op in ("open", "openat2"):
            dirfd, name, flags = d[0], d[1], d[2]
            if flags & os.O_CREAT:
                path = self._at_path(dirfd, name)
                if path is not None:
                    p = (path, dirfd, name, self._lstat(dirfd, name) is not None)
        elif op == "tmpfile":
            dirfd, _flags = d
            if self._fd_path(dirfd) is not None:
                p = (self._open_fds(),)
        elif op == "sync_file_range":
            pass  # starts writeback only, promises nothing: no op, so the model cannot count it as a barrier
        self._pending = None if p is None else (op, p)

    # -- complete (after the syscall returned or raised) -----------------------------

    def _complete(self) -> None:
        if self._pending is None:
            return
        op, p = self._pending
        self._pending = None
        if op == "write":
            fid, fd, off, _ = p
            end = os.lseek(fd, 0, os.SEEK_CUR)
            if end > off:
                self.ops.append(Write(fid, off, self._read(fd, off, end - off)))
        elif op == "pwrite":
            fid, fd, off, n = p
            data = self._read(fd, off, n)
            if data:
                self.ops.append(Write(fid, off, data))
        elif op == "fsync":
            self.ops.append(FsyncDir(p[1]) if p[0] == "dir" else FsyncFile(p[1]))
        elif op == "fchmod":
            self.ops.append(Chmod(*p))
        elif op == "link":
            fid, path, dirfd, name, existed = p
            st = self._lstat(dirfd, name)
            if not existed and st is not None and self.inodes.get((st.st_dev, st.st_ino)) == fid:
                self.ops.append(Link(fid, path))
        elif op in ("rename", "rename_noreplace"):
            src, dst, odir, old, ndir, new, sst, plain = p
            dst_now = self._lstat(ndir, new)
            moved = (
                sst is not None
                and dst_now is not None
                and (dst_now.st_dev, dst_now.st_ino) == (sst.st_dev, sst.st_ino)
                and (src == dst or self._lstat(odir, old) is None)
            )
            if moved and src != dst:
                self.ops.append(Rename(src, dst, replace=plain))
        elif op == "unlink":
            path, dirfd, name, before = p
            if before is not None and self._lstat(dirfd, name) is None:
                self.ops.append(Unlink(path))
        elif op == "mkdir":
            path, dirfd, name, existed, mode = p
            st = self._lstat(dirfd, name)
            if not existed and st is not None and stat.S_ISDIR(st.st_mode):
                self.ops.append(Mkdir(path, stat.S_IMODE(st.st_mode)))
        elif op == "rmdir":
            path, dirfd, name, existed, _ = p
            if existed and self._lstat(dirfd, name) is None:
                self.ops.append(Rmdir(path))
        elif op in ("open", "openat2"):
            path, dirfd, name, existed = p
            st = self._lstat(dirfd, name)
            if not existed and st is not None and stat.S_ISREG(st.st_mode):
                fid = self._new_fid(st)
                self.ops.append(Create(fid, path, stat.S_IMODE(st.st_mode)))
        elif op == "tmpfile":
            (before,) = p
            new = []
            for fd in self._open_fds() - before:
                with contextlib.suppress(OSError):
                    st = os.fstat(fd)
                    if stat.S_ISREG(st.st_mode) and st.st_nlink == 0:
                        new.append(st)
            if len(new) > 1:
                raise RuntimeError("tmpfile: more than one new anonymous fd")
            if new:
                fid = self._new_fid(new[0])
                self.ops.append(Create(fid, None, stat.S_IMODE(new[0].st_mode)))

    @staticmethod
    def _read(fd: int, off: int, n: int) -> bytes:
        try:
            return os.pread(fd, n, off)
        except OSError:  # a write-only fd: read the inode through /proc
            rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                return os.pread(rfd, n, off)
            finally:
                os.close(rfd)


@dataclass
class Recording:
    """What :func:`record` produced: the pre-image and the op log."""

    pre: Image
    ops: list[Op]
    raw_events: int = 0


class Session:
    """The handle a recording gives its workload: op indices for commit marks."""

    def __init__(self, rec: _Recorder) -> None:
        self._rec = rec

    def index(self) -> int:
        """Number of logical ops issued so far (every earlier syscall has returned)."""
        return self._rec.flush()


@contextlib.contextmanager
def record(root: str) -> Iterator[tuple[Session, Recording]]:
    """Snapshot ``root`` and record every syscall of the block as logical ops.

    The Recording's ``ops`` list is filled while the block runs; any event the
    recorder could not resolve raises RuntimeError when the block ends (a lab
    that silently dropped an op would check the wrong states).
    """
    inodes: dict[tuple[int, int], int] = {}
    pre = snapshot(root, inodes)
    rec = _Recorder(root, inodes)
    recording = Recording(pre, rec.ops)
    # The Linux layer's trace hook: every active list gets each event appended
    # under its lock, before the syscall (see linux.trace()).
    with linux._lock:
        linux._traces.append(rec)
    try:
        yield Session(rec), recording
        rec.flush()
    finally:
        with linux._lock:
            for i, active in enumerate(linux._traces):
                if active is rec:
                    del linux._traces[i]
                    break
    recording.raw_events = rec.raw_events
    if rec.errors:
        raise RuntimeError("recorder could not resolve events:\n  " + "\n  ".join(rec.errors[:20]))
