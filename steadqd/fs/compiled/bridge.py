"""The C claim core's Python side: the syscall tables, the calls, and the replay of a deviation.

claim.py is the specification of a claim; ``compiled/claim.c`` does its happy path for one
candidate name in two calls (:meth:`Core.verify`: name, tag, shard, attempts, open, fstat,
envelope; :meth:`Core.move`: the leased name and tag, the witnessed no-replace rename, the
after-rename re-read, the directory fsync, the payload digest), with the clock, wall floor and
token read by the Python between them, where claim_open reads them. At its first deviation C
stops; :func:`replaying` then runs the Python's own code for that candidate from the start,
serving the syscalls C made from their recorded results (syscall_hook.replay), so every error,
quarantine reason, message and later syscall is the Python's. The ack (settle.py the
specification) is one call, :meth:`Core.ack`, and so are a small payload() (lease.py and verify.py),
:meth:`Core.read_payload`, and a small enqueue (publish.py), :meth:`Core.enqueue`, replayed the same way
(settle._ack_fast, lease.core_payload, publish._enqueue_fast). The claim scan's read of a ready shard's
chunk and its sorting of the names (claim._Scan._read_ready) is :meth:`Core.read_ready`: one call that
completes or raises what the read raised, so there is nothing to replay.

Every syscall of the core goes through a table: libc directly, or, when syscall_hook is armed or
tracing (the test steadqd.fs.linux makes), callbacks that make each call through the wrapper of
steadqd.fs.linux the Python would use, so traces, injected faults and the crash lab see one
sequence on both paths. A callback's exception (an injected fault, or anything else) is kept and
raised again by the replay at the very point the Python makes that call.

Without the built module, or with ``STEADQ_PURE_PYTHON=1``, claims, acks and enqueues run in pure Python;
:func:`path` says which path runs and why (``steadq --version``, ``steadq doctor``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from typing import Any

from steadqd.constants import JOB_EXT
from steadqd.fs import linux
from steadqd.fs.libc import _DIRENT64  # a getdents64 record's head: d_ino, d_off, d_reclen, d_type
from steadqd.fs.names import READY_DOTS
from steadqd.fs.syscall_hook import _armed, _traces, replay

try:
    from steadqd.fs.compiled._core import ffi, lib  # type: ignore[import-not-found,unused-ignore]
except ImportError as e:  # not built: pure Python
    ffi = lib = None
    _MISSING = f"the C claim core is not built ({e})"
else:
    _MISSING = ""

__all__ = ["Core", "available", "core_for", "path", "replaying"]

SWITCH = "STEADQ_PURE_PYTHON"  # "1": the pure path even where the module is built

# Stages and ops: api.h's #defines, read from the module (0 without it: never compared then).
STOP_PURE = getattr(lib, "SQ_STOP_PURE", 0)
STOP_SYSCALL = getattr(lib, "SQ_STOP_SYSCALL", 0)
VERIFIED = getattr(lib, "SQ_VERIFIED", 0)
MOVED = getattr(lib, "SQ_MOVED", 0)
MOVED_PAYLOAD_LEFT = getattr(lib, "SQ_MOVED_PAYLOAD_LEFT", 0)
ACKED = getattr(lib, "SQ_ACKED", 0)
PUBLISHED = getattr(lib, "SQ_PUBLISHED", 0)
MOVED_BARRIER_LEFT = getattr(lib, "SQ_MOVED_BARRIER_LEFT", 0)
PAYLOAD_READ = getattr(lib, "SQ_PAYLOAD_READ", 0)
_OP_STAT = getattr(lib, "SQ_OP_STAT", 0)
# Each recorded op (SQ_OP_<NAME>) as syscall_hook names it.
_HOOK_OP = {
    "OPEN": "open",
    "FSTAT": "fstat",
    "PREAD": "read",
    "STAT": "stat",
    "RENAME": "rename_noreplace",
    "FSYNC": "fsync",
    "TMPFILE": "tmpfile",
    "WRITE": "write",
    "LINK": "link",
}
_OP_NAMES = {getattr(lib, f"SQ_OP_{k}"): v for k, v in _HOOK_OP.items()} if lib is not None else {}
# Their OSError carries the name, as os.open, os.stat, libc.renameat2 and libc.linkat give it.
_NAMED_OPS = frozenset(("open", "stat", "rename_noreplace", "link", "tmpfile"))


def available() -> bool:
    """Do claims run through the C core?"""
    return lib is not None and os.environ.get(SWITCH, "") != "1"


def path() -> str:
    """Which claim path runs and why, one line (``steadq doctor`` and ``--version``)."""
    if available():
        return "C claim core (a claim's checks, open, reads, rename and fsync in two calls, an ack's, a payload()'s and a small enqueue's in one: steadqd/fs/compiled)"
    why = f"{SWITCH}=1 is set" if lib is not None else _MISSING
    return f"pure Python: {why}"


_local = threading.local()


def _log() -> list[tuple[str, Any]]:
    """The running call's (op, result or exception) list, filled by the hook callbacks."""
    log: list[tuple[str, Any]] = _local.log
    return log


def _errno_of(e: BaseException) -> int:
    if isinstance(e, OSError) and e.errno:
        return -e.errno
    return -errno.EIO  # not an OSError: C stops, the replay raises it where the Python makes the call


def _fill_stat(out: Any, st: os.stat_result) -> None:
    out.dev, out.ino, out.nlink, out.size = st.st_dev, st.st_ino, st.st_nlink, st.st_size
    out.uid, out.gid, out.mode = st.st_uid, st.st_gid, st.st_mode
    out.atime, out.mtime, out.ctime = int(st.st_atime), int(st.st_mtime), int(st.st_ctime)


if lib is not None:
    # The hooked table: each entry makes its call through steadqd.fs.linux, which (armed or
    # tracing) passes syscall_hook.call with the op name and detail the Python path gives it.

    @ffi.def_extern()
    def sq_py_openat(dirfd: int, name: Any, flags: int) -> int:
        try:
            fd = linux.open_at(dirfd, ffi.string(name).decode("ascii"), flags)
        except BaseException as e:
            _log().append(("open", e))
            return _errno_of(e)
        _log().append(("open", fd))
        return fd

    @ffi.def_extern()
    def sq_py_fstat(fd: int, out: Any) -> int:
        try:
            st = linux.fstat(fd)
            _fill_stat(out, st)
        except BaseException as e:
            _log().append(("fstat", e))
            return _errno_of(e)
        _log().append(("fstat", st))
        return 0

    @ffi.def_extern()
    def sq_py_pread(fd: int, buf: Any, n: int, off: int) -> int:
        try:
            data = linux.pread(fd, n, off)
            got = min(len(data), n)  # never more than the buffer C gave
            ffi.memmove(buf, data, got)
        except BaseException as e:
            _log().append(("read", e))
            return _errno_of(e)
        _log().append(("read", data))
        return got

    @ffi.def_extern()
    def sq_py_lstatat(dirfd: int, name: Any, out: Any) -> int:
        try:
            st = linux.stat_at(dirfd, ffi.string(name).decode("ascii"))
            _fill_stat(out, st)
        except BaseException as e:
            _log().append(("stat", e))
            return _errno_of(e)
        _log().append(("stat", st))
        return 0

    @ffi.def_extern()
    def sq_py_rename_noreplace(olddirfd: int, old: Any, newdirfd: int, new: Any) -> int:
        try:
            linux.rename_noreplace(olddirfd, ffi.string(old).decode("ascii"), newdirfd, ffi.string(new).decode("ascii"))
        except BaseException as e:
            _log().append(("rename_noreplace", e))
            return _errno_of(e)
        _log().append(("rename_noreplace", None))
        return 0

    @ffi.def_extern()
    def sq_py_fsync(fd: int) -> int:
        try:
            linux.fsync(fd)
        except BaseException as e:
            _log().append(("fsync", e))
            return _errno_of(e)
        _log().append(("fsync", None))
        return 0

    @ffi.def_extern()
    def sq_py_tmpfile(dirfd: int, mode: int) -> int:
        try:
            fd = linux.open_tmpfile(dirfd, mode)
        except BaseException as e:
            _log().append(("tmpfile", e))
            return _errno_of(e)
        _log().append(("tmpfile", fd))
        return fd

    @ffi.def_extern()
    def sq_py_write(fd: int, buf: Any, n: int) -> int:
        try:
            got = linux.write_once(fd, ffi.buffer(buf, n)[:])
        except BaseException as e:
            _log().append(("write", e))
            return _errno_of(e)
        _log().append(("write", got))
        return got

    @ffi.def_extern()
    def sq_py_link(fd: int, dirfd: int, name: Any, proc: int) -> int:
        try:
            linux.link_as("proc" if proc else "direct", fd, dirfd, ffi.string(name))
        except BaseException as e:
            _log().append(("link", e))
            return _errno_of(e)
        _log().append(("link", None))
        return 0

    @ffi.def_extern()
    def sq_py_getdents(fd: int, buf: Any, n: int) -> int:
        try:
            data = dirent_records(linux.read_dir_chunk(fd, n))
            if len(data) > n:  # cannot be: each record is no longer than the kernel's was
                raise OSError(errno.EOVERFLOW, os.strerror(errno.EOVERFLOW))
            ffi.memmove(buf, data, len(data))
        except BaseException as e:
            _local.dents_error = e
            return _errno_of(e)
        return len(data)

    _HOOKED = ffi.new(
        "struct sq_sys *",
        {
            "openat": lib.sq_py_openat,
            "fstat": lib.sq_py_fstat,
            "pread": lib.sq_py_pread,
            "lstatat": lib.sq_py_lstatat,
            "rename_noreplace": lib.sq_py_rename_noreplace,
            "fsync": lib.sq_py_fsync,
            "tmpfile": lib.sq_py_tmpfile,
            "write": lib.sq_py_write,
            "link": lib.sq_py_link,
            "getdents": lib.sq_py_getdents,
        },
    )
    _DIRECT = lib.sq_direct_table()


def dirent_records(names: list[bytes]) -> bytes:
    """The getdents64 records of ``names`` as the kernel lays them out (each padded to 8 bytes; inode,
    offset and type 0, which no reader of a claim chunk looks at): what the hooked table hands
    sq_read_ready for the names linux.read_dir_chunk returned ("." and ".." it drops are left out)."""
    out = []
    for name in names:
        reclen = (_DIRENT64.size + len(name) + 1 + 7) & ~7
        out.append(_DIRENT64.pack(0, 0, reclen, 0) + name + bytes(reclen - _DIRENT64.size - len(name)))
    return b"".join(out)


def _stat_result(st: Any) -> os.stat_result:
    return os.stat_result((st.mode, st.ino, st.dev, st.nlink, st.uid, st.gid, st.size, st.atime, st.mtime, st.ctime))


def lease_fields_plain(dev: Any, ino: Any, m: Any, n: Any, job: Any, ed: Any, pd: Any) -> bool:
    """The lease's fields sq_ack and sq_read_payload compare the leased file with (dev, ino, max_attempts,
    payload_length, job id, envelope and payload digests) can be those calls' arguments: the one rule
    for both. False for a Lease made by hand with a field C cannot compare as the Python does: not an
    int (a float or bool compares equal in Python), not bytes (a bytearray does), or not the length C
    copies from the pointer (16, 32: a longer digest would match on its prefix). The caller raises
    TypeError then, before any syscall, and the Python judges the lease; an int out of the C type's
    range raises OverflowError in the call, with the same outcome. (Values, not the lease: no tuple
    is built, ~1,500 instructions fewer an ack than returning the fields.)"""
    return (
        type(dev) is int
        and type(ino) is int
        and type(m) is int
        and type(n) is int
        and type(job) is bytes
        and type(ed) is bytes
        and type(pd) is bytes
        and len(job) == 16
        and len(ed) == 32
        and len(pd) == 32
    )


class Core:
    """One queue's C claim core: its FORMAT values and hash prefixes, and this thread's claim record."""

    def __init__(self, queue_id: bytes, shard_count: int, lease_width_ns: int, max_payload: int) -> None:
        q = ffi.new("struct sq_queue *")
        q.queue_id = queue_id
        q.shard_count, q.lease_width_ns, q.max_payload = shard_count, lease_width_ns, max_payload
        ext = JOB_EXT.encode("ascii")
        q.ready_ext, q.ready_ext_len, q.ready_dots = ext, len(ext), READY_DOTS  # names.looks_ready's shape
        lib.sq_queue_init(q)
        self.q = q

    def read_ready(self, dir_fd: int) -> tuple[list[str], list[bytes]] | None:
        """sq_read_ready: one chunk of the ready shard ``dir_fd`` from its offset, as claim._Scan._read_ready
        reads it in Python (linux.read_dir_chunk, then _ready_looking): None when it listed nothing,
        else the ready-looking names and the names past ASCII, each in directory order. Raises what the
        read raised: the hooked table's exception itself, or the libc table's errno as libc.getdents's OSError."""
        k = _local.__dict__.get("chunk")
        if k is None:
            k = _local.chunk = ffi.new("struct sq_chunk *")
        if not _armed and not _traces:
            n = lib.sq_read_ready(self.q, _DIRECT, k, dir_fd)
        else:
            _local.dents_error = None
            n = lib.sq_read_ready(self.q, _HOOKED, k, dir_fd)
            e, _local.dents_error = _local.dents_error, None
            if e is not None:
                raise e
        if n <= 0:
            if n:
                raise OSError(-n, os.strerror(-n))
            return None
        ready = ffi.string(k.ready).decode("ascii").split("/") if k.ready_count else []
        return ready, (ffi.string(k.ignored).split(b"/") if k.ignored_count else [])

    def verify(self, dir_fd: int, name: str, shard: int, opened: int) -> tuple[int, Any]:
        """sq_claim_verify for ``name`` in ready shard ``shard`` (``opened``: its fd, or -1): (stage, record).

        The record is this thread's, reused by its next candidate: read it before the next verify.
        """
        c = _local.__dict__.get("claim")
        if c is None:
            c = _local.claim = ffi.new("struct sq_claim *")
        if not _armed and not _traces:
            _local.log = None
            return lib.sq_claim_verify(self.q, _DIRECT, c, dir_fd, name.encode("ascii"), shard, opened), c
        _local.log = []
        return lib.sq_claim_verify(self.q, _HOOKED, c, dir_fd, name.encode("ascii"), shard, opened), c

    def move(self, c: Any, boot_id: bytes, bt_deadline: int, wall_deadline: int, token: bytes, may_fsync: bool) -> int:
        """sq_claim_move after a verify that returned VERIFIED (the syscalls' record goes on from verify's): the stage."""
        if _local.log is None and not _armed and not _traces:
            return int(lib.sq_claim_move(self.q, _DIRECT, c, boot_id, bt_deadline, wall_deadline, token, may_fsync))
        if _local.log is None:  # tracing began between the calls: the hooked table from here on
            _local.log = _records(c, 0)
        return int(lib.sq_claim_move(self.q, _HOOKED, c, boot_id, bt_deadline, wall_deadline, token, may_fsync))

    def ack(
        self,
        lease: Any,
        job: bytes,
        dir_fd: int,
        name: str,
        dst_fd: int,
        shard: int,
        bucket: int,
        ids: tuple[Any, Any],
        may_fsync: bool = True,
        known: bytes | None = None,
    ) -> tuple[int, Any]:
        """sq_ack for ``lease`` (``job``: its job id) in ``dir_fd``/``name`` into ``dst_fd``, the receipt
        directory of ``shard`` and ``bucket`` (the core makes the receipt's name): (stage, record).

        ``ids``: the two directories' (dev, ino) when the tree knows them, else None; ``known``:
        verify.verified_head of the lease's file (a read equal to it is not hashed again). The record is
        this thread's (its ``fd``: the caller closes it). TypeError or OverflowError: see
        lease_fields_plain; the receipt name's fields (generation, attempt, token: C copies 16 bytes of
        it) passed names.receipt_fields_plain in settle.ack before this call.
        """
        a = _local.__dict__.get("ack")
        if a is None:
            a = _local.ack = ffi.new("struct sq_ack *")
        dev, ino, m, n = lease.dev, lease.ino, lease.max_attempts, lease.payload_length
        ed, pd = lease.envelope_digest, lease.payload_digest
        if not lease_fields_plain(dev, ino, m, n, job, ed, pd):
            raise TypeError("a lease field of another type or length: the Python compares it")
        src_id, dst_id = ids
        if not _armed and not _traces:
            _local.log, table = None, _DIRECT
        else:
            _local.log, table = [], _HOOKED
        return lib.sq_ack(
            self.q, table, a, dir_fd, name.encode("ascii"), dev, ino, m, n, job, ed, pd, lease.generation,
            lease.attempt, lease.token, dst_fd, shard, bucket, ffi.NULL if src_id is None else src_id, ffi.NULL if dst_id is None else dst_id,
            may_fsync, ffi.NULL if known is None else known, len(known or b""),
        ), a  # fmt: skip

    def read_payload(
        self, lease: Any, job: bytes, dir_fd: int, name: str, known: bytes | None
    ) -> tuple[int, Any, bytes | None]:
        """sq_read_payload for ``lease`` (``job``: its job id) in ``dir_fd``/``name``: (stage, record, the
        payload at PAYLOAD_READ, else None). ``known``: verify.verified_head of the lease's file.

        The record is this thread's (its ``fd``: the caller closes it). TypeError or OverflowError:
        see lease_fields_plain.
        """
        dev, ino, m, n = lease.dev, lease.ino, lease.max_attempts, lease.payload_length
        ed, pd = lease.envelope_digest, lease.payload_digest
        if not lease_fields_plain(dev, ino, m, n, job, ed, pd):
            raise TypeError("a lease field of another type or length: the Python compares it")
        a = _local.__dict__.get("payload")
        if a is None:
            a = _local.payload = ffi.new("struct sq_ack *")
        if not _armed and not _traces:
            _local.log = None
            table = _DIRECT
        else:
            _local.log = []
            table = _HOOKED
        k, klen = (ffi.NULL, 0) if known is None else (known, len(known))
        stage = lib.sq_read_payload(
            self.q, table, a, dir_fd, name.encode("ascii"), dev, ino, m, n, job, ed, pd, k, klen
        )
        if stage != PAYLOAD_READ:
            return stage, a, None
        return stage, a, ffi.buffer(a.head + a.payload_offset, n)[:]

    def enqueue(
        self, job_id: bytes, max_attempts: int, created_at: int, extension: bytes, payload: bytes,
        payload_length: int, dir_fd: int, shard: int, mode: int, proc: bool,
    ) -> tuple[int, Any]:  # fmt: skip
        """sq_enqueue of ``payload`` (at most publish._ONE_WRITE bytes; ``payload_length``: its len(), which
        the caller read) into ``dir_fd``, ``shard``'s ready directory: (stage, record). The record is this thread's (its ``fd``: the caller closes it)."""
        d = _local.__dict__
        e = d.get("enqueue")
        if e is None:
            e = d["enqueue"] = ffi.new("struct sq_enqueue *")
        if not _armed and not _traces:
            _local.log, table = None, _DIRECT
        else:
            _local.log, table = [], _HOOKED
        return lib.sq_enqueue(
            self.q, table, e, job_id, max_attempts, created_at, extension, len(extension), payload, payload_length,
            dir_fd, shard, mode, proc,
        ), e  # fmt: skip


def _records(c: Any, skip: int) -> list[tuple[str, Any]]:
    """The direct table's syscalls as (op, result or OSError), from the ``skip``th on."""
    out: list[tuple[str, Any]] = []
    for i in range(skip, c.nrec):
        r = c.recs[i]
        op = _OP_NAMES[r.op]
        if r.err:
            if op == "tmpfile":  # os.open(".", O_TMPFILE | ..., dir_fd=...)
                filename: tuple[str, ...] = (".",)
            else:
                filename = (ffi.string(c.target if r.op == _OP_STAT and r.slot == 2 else c.name).decode("ascii"),)
            out.append((op, OSError(r.err, os.strerror(r.err), *(filename if op in _NAMED_OPS else ()))))
        elif op == "open" or op == "tmpfile" or op == "write":
            out.append((op, int(r.ret)))
        elif op == "fstat" or op == "stat":
            out.append((op, _stat_result(c.stats[r.slot])))
        elif op == "read":
            buf = c.head if r.slot == 0 else c.head2
            out.append((op, bytes(ffi.buffer(buf, r.ret))))
        else:
            out.append((op, None))
    return out


def failed_open(c: Any) -> BaseException:
    """What the core's failed open raised: the hook's exception, or the libc errno as os.open gives it."""
    log = _local.log
    _local.log = None
    if log is None:
        log = _records(c, 0)
    result = log[0][1]
    assert isinstance(result, BaseException)
    return result


@contextlib.contextmanager
def replaying(c: Any, *, skip_open: bool) -> Iterator[None]:
    """Run the Python with the syscalls the core made (for this candidate) served from their results.

    ``skip_open``: the Python continuation starts after the open C made (claim_open, which takes the fd).
    """
    log = _local.log
    if log is None:
        log = _records(c, 0)
    _local.log = None
    if skip_open and log and log[0][0] == "open":
        log = log[1:]
    with replay(log) as pending:
        yield
    if pending:  # the Python stopped before C did: the two definitions disagree
        raise AssertionError(f"the Python made fewer syscalls than the C claim core ({len(pending)} left)")


_CORES: dict[tuple[bytes, int, int, int], Core] = {}


def core_for(queue_id: bytes, shard_count: int, lease_width_ns: int, max_payload: int) -> Core | None:
    """The queue's core when the C path runs, else None (asked once per open handle: Context.c_core)."""
    if not available():
        return None
    key = (queue_id, shard_count, lease_width_ns, max_payload)
    core = _CORES.get(key)
    if core is None:
        if len(_CORES) >= 64:
            _CORES.clear()
        core = _CORES[key] = Core(*key)
    return core
