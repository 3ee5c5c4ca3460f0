"""Operator tools for the two places jobs end up when nobody will process them:
``dead/`` (dead letters) and ``quarantine/`` (corrupt objects).

Spec: protocol.md "Administrative operations", cli.md ``admin …``,
open-questions 6, 7 and 20. Where the reference is careless this module is
deliberately stricter, without changing anything on disk that the
reference reads:

* exports write a temp file next to the output, fsync it, rename it into
  place and fsync the output directory, so a crash never leaves a partial
  export that looks complete (the reference copies in place);
* quarantine removal fsyncs the directory (the reference does not);
* exports never follow a symlink: quarantine can hold symlinks wearing job
  names (claim isolates them), and copying through one would read an
  arbitrary file;
* ``requeue_dead`` exists (the reference lists it in its state machine but
  never implemented it): the dead object is renamed back into ``ready/``
  with the next generation and attempt 0, header untouched, so the reference
  claims it like any ready job.

Listing functions only report names that parse and authenticate for the
directory they are in: a stray file must not be mistaken for a dead job.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from steadqd.constants import DEAD_DIR, HEADER_SIZE, QUARANTINE_DIR, READY_DIR, QuarantineReason, State
from steadqd.errors import (
    CorruptObject,
    ErrorKind,
    InvalidInput,
    NotCommitted,
    OutcomeUnknown,
    QueueCorrupt,
    SteadQError,
    kind_for_errno,
)
from steadqd.fs import linux
from steadqd.fs.context import Context, not_committed
from steadqd.fs.json_records import EnqueueTicket
from steadqd.fs.names import (
    dead_job,
    make_filename,
    next_generation,
    parse_bucket_dir,
    parse_job_id,
    parse_name,
    parse_quarantine_name,
    parse_shard_dir,
    ready_name,
    shard_dir,
    shard_of,
)
from steadqd.fs.quarantine import quarantine
from steadqd.fs.records import JobHeader
from steadqd.fs.tree import Collision, Indeterminate, MoveError, MoveFailed, SourceChanged, SourceMissing, Witness
from steadqd.fs.verify import CHUNK, check_name_matches, iter_payload, read_envelope, verify_payload
from steadqd.text import printable

__all__ = [
    "DeadFile",
    "DeadJob",
    "QuarantinedObject",
    "export_dead",
    "export_quarantine",
    "find_dead",
    "find_quarantined",
    "inspect_quarantine",
    "list_dead",
    "list_dead_files",
    "list_quarantine",
    "remove_dead",
    "remove_quarantine",
    "requeue_dead",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # O_CLOEXEC is always added by linux.open_at
_MAX_QUARANTINE_DEPTH = 16  # nested layouts are tolerated, not unbounded recursion


@dataclass(frozen=True)
class DeadJob:
    """One authenticated dead object; ``path`` is relative to the queue root."""

    job_id: str
    generation: int
    attempt: int
    max_attempts: int
    reason: int
    path: str


@dataclass(frozen=True)
class DeadFile:
    """One entry of ``dead/<bucket>/<shard>/`` found by a plain walk (raw bytes, nothing authenticated).

    The name's fields are set when it parses as a dead job's name, else None.
    """

    name: bytes
    path: bytes
    job_id: str | None = None
    generation: int | None = None
    attempt: int | None = None
    max_attempts: int | None = None
    reason: int | None = None


@dataclass(frozen=True)
class QuarantinedObject:
    """One quarantined object; ``size`` and ``mtime_ns`` are its lstat's (it may be a symlink or a directory)."""

    quarantine_id: str
    reason: int
    path: str
    size: int
    mtime_ns: int | None = field(default=None, compare=False)  # its age for selection, not its identity


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _mutation(ctx: Context, what: str) -> Iterator[None]:
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


def _not_found(what: str) -> SteadQError:
    return SteadQError(f"not found: {what}", ErrorKind.NOT_FOUND)


def _io(e: OSError, what: str) -> SteadQError:
    return SteadQError(f"{what}: {e.strerror or e}", kind_for_errno(e.errno) if e.errno else ErrorKind.IO_FAILURE)


def _list(root_fd: int, rel: str, *, missing_ok: bool = True) -> list[bytes] | None:
    """Sorted raw entries of ``rel`` beneath the root; None if it does not exist."""
    try:
        fd = linux.open_beneath(root_fd, rel, _DIR_FLAGS)
    except OSError as e:
        if missing_ok and e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise _io(e, f"open {rel}") from e
    try:
        return linux.list_dir(fd)
    except OSError as e:
        raise _io(e, f"list {rel}") from e
    finally:
        with contextlib.suppress(OSError):
            linux.close(fd)


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        linux.close(fd)


def _dead_in(ctx: Context, bucket: int, shard: int, rel: str, prefix: bytes = b"") -> Iterator[DeadJob]:
    """The dead jobs (:func:`names.dead_job`) of ``dead/<bucket>/<shard>/`` = ``rel`` whose names start with ``prefix``.

    Each candidate is lstat'ed: a symlink or a FIFO bearing a job's name is
    not a dead job, so no admin command selects it (fsck reports it).
    """
    fmt = ctx.fmt
    try:
        dir_fd = linux.open_beneath(ctx.root_fd, rel, _DIR_FLAGS)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return
        raise _io(e, f"open {rel}") from e
    try:
        try:
            entries = linux.list_dir(dir_fd)
        except OSError as e:
            raise _io(e, f"list {rel}") from e
        for raw in entries:
            if not raw.startswith(prefix):
                continue
            try:
                mode = linux.stat_at(dir_fd, raw).st_mode
            except FileNotFoundError:
                continue  # moved on since it was listed
            except OSError as e:
                raise _io(e, f"stat {rel}") from e
            name = dead_job(fmt.queue_id, fmt.shard_count, fmt.lease_width_ns, bucket, shard, raw, mode)
            if name is None:
                continue
            assert name.reason is not None
            yield DeadJob(name.job_hex, name.generation, name.attempt, name.max_attempts, name.reason,
                          f"{rel}/{raw.decode('ascii')}")  # fmt: skip
    finally:
        _close(dir_fd)


def _buckets(ctx: Context) -> list[tuple[int, str]]:
    entries = _list(ctx.root_fd, DEAD_DIR) or []
    out = []
    for raw in entries:
        b = parse_bucket_dir(raw)
        if b is not None:
            out.append((b, raw.decode("ascii")))
    return out


# --------------------------------------------------------------------------- dead letters


def list_dead(ctx: Context) -> Iterator[DeadJob]:
    """Every authenticated dead object, bucket by bucket, shard by shard, bytewise sorted.

    Streams: one shard directory is listed at a time, so a huge dead-letter
    backlog is never held in memory. Unparseable or unauthenticated names are
    skipped (fsck reports them); a missing ``dead/`` is an empty listing.
    """
    for bucket, bname in _buckets(ctx):
        shards = _list(ctx.root_fd, f"{DEAD_DIR}/{bname}") or []
        for sraw in shards:
            shard = parse_shard_dir(sraw, ctx.fmt.shard_count)
            if shard is None:
                continue
            yield from _dead_in(ctx, bucket, shard, f"{DEAD_DIR}/{bname}/{shard_dir(shard)}")


def list_dead_files(queue_root: str) -> list[DeadFile] | None:
    """Every entry under ``dead/*/*/``, sorted, by a plain walk that opens no queue (cli.md ``admin dead-list``).

    Why no queue: dead-list must work on a tree too damaged to open, so it
    shows raw names (unparseable ones too) rather than authenticated jobs.
    Why no symlinks: whoever can write the tree could point ``dead/`` or a
    bucket or shard at another directory, and listing its names would leak
    them; a symlinked component is QueueCorrupt naming it. A non-directory
    bucket or shard is skipped. None when there is no ``dead/`` directory;
    any other failure to read raises the OSError.
    """
    try:
        root_fd = linux.open_at(-100, queue_root, _DIR_FLAGS)
    except FileNotFoundError:
        return None
    try:
        dead_fd = _walk_dir(root_fd, DEAD_DIR.encode(), DEAD_DIR.encode(), skip_other=False)
    finally:
        _close(root_fd)
    if dead_fd is None:
        return None
    found: list[DeadFile] = []
    try:
        for b in linux.list_dir(dead_fd):
            rel_b = b"/".join((DEAD_DIR.encode(), b))
            bucket_fd = _walk_dir(dead_fd, b, rel_b)
            if bucket_fd is None:
                continue
            try:
                for s in linux.list_dir(bucket_fd):
                    rel_s = b"/".join((rel_b, s))
                    shard_fd = _walk_dir(bucket_fd, s, rel_s)
                    if shard_fd is None:
                        continue
                    try:
                        found.extend(_dead_file(name, b"/".join((rel_s, name))) for name in linux.list_dir(shard_fd))
                    finally:
                        _close(shard_fd)
            finally:
                _close(bucket_fd)
    finally:
        _close(dead_fd)
    return found


def _walk_dir(parent_fd: int, name: bytes, rel: bytes, *, skip_other: bool = True) -> int | None:
    """Open one directory of the dead-list walk without following a symlink.

    None if it is absent, or (``skip_other``) neither a directory nor a symlink.
    """
    try:
        return linux.open_dir(parent_fd, name)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise
        try:
            st = linux.stat_at(parent_fd, name)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(st.st_mode):
            raise QueueCorrupt(
                f"{printable(os.fsdecode(rel))} is a symlink; dead-list does not follow links out of the queue tree "
                "(steadq fsck reports it; put the real directory there or remove the link)"
            ) from e
        if e.errno == errno.ELOOP or not skip_other:
            raise
        return None


def _dead_file(name: bytes, path: bytes) -> DeadFile:
    try:
        jn = parse_name(State.DEAD, name)
    except SteadQError:
        return DeadFile(name, path)
    return DeadFile(name, path, jn.job_hex, jn.generation, jn.attempt, jn.max_attempts, jn.reason)


def find_dead(ctx: Context, job_id: str) -> DeadJob | None:
    """The job's first dead object (oldest bucket first), or None.

    Only ``dead/*/<S>/`` of the job's own shard is searched. InvalidInput for
    a malformed job id.
    """
    job = parse_job_id(job_id)
    shard = shard_of(ctx.fmt.queue_id, job, ctx.fmt.shard_count)
    prefix = job_id.encode("ascii") + b"."
    for bucket, bname in _buckets(ctx):
        for found in _dead_in(ctx, bucket, shard, f"{DEAD_DIR}/{bname}/{shard_dir(shard)}", prefix):
            return found
    return None


def _require_dead(ctx: Context, job_id: str) -> DeadJob:
    found = find_dead(ctx, job_id)
    if found is None:
        raise _not_found(f"no dead object for job {job_id}")
    return found


def _split(path: str) -> tuple[str, str]:
    rel, _, name = path.rpartition("/")
    return rel, name


def _open_object(ctx: Context, path: str) -> int:
    """Open a queue object read-only without following a final symlink; NOT_FOUND if gone."""
    rel, name = _split(path)
    try:
        dir_fd = linux.open_beneath(ctx.root_fd, rel, _DIR_FLAGS)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise _not_found(path) from e
        raise _io(e, f"open {rel}") from e
    try:
        return linux.open_at(dir_fd, name, _FILE_FLAGS)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise _not_found(path) from e
        if e.errno == errno.ELOOP:
            raise InvalidInput(f"{path} is a symlink; refusing to follow it (inspect it in place)") from e
        raise _io(e, f"open {path}") from e
    finally:
        _close(dir_fd)


def export_dead(ctx: Context, job_id: str, out_path: str, *, payload_only: bool = False) -> int:
    """Copy a dead job to ``out_path``; returns the number of bytes written.

    By default the whole file (header, extension, payload) is copied as-is,
    like the reference: it is evidence and may be inspected with
    ``format-dump``/``verify``. With ``payload_only`` only the payload is
    written, and only if it verifies against its digest (PAYLOAD_CORRUPT
    otherwise, and no output appears). Either way the output appears
    atomically and durably (temp + fsync + rename + directory fsync).
    """
    dead = _require_dead(ctx, job_id)
    fd = _open_object(ctx, dead.path)
    try:
        st = _fstat(fd, dead.path)
        if not stat.S_ISREG(st.st_mode):
            raise SteadQError(f"{dead.path} is not a regular file", ErrorKind.QUEUE_CORRUPT)
        if payload_only:
            try:
                env = read_envelope(fd, ctx.fmt.max_payload_length, st)
            except OSError as e:
                raise _io(e, f"read {dead.path}") from e
            return _write_atomically(out_path, iter_payload(fd, env), dead.path)
        return _write_atomically(out_path, _raw_chunks(fd), dead.path)
    finally:
        _close(fd)


def remove_dead(ctx: Context, job_id: str) -> None:
    """Delete a dead job for good: unlink, then fsync its shard directory.

    NOT_FOUND when there is none. A failed directory fsync after the unlink
    is OutcomeUnknown (the handle is poisoned): the unlink may not survive
    a crash.
    """
    with _mutation(ctx, f"remove dead job {job_id}"):
        ctx.check_usable()
        dead = _require_dead(ctx, job_id)
        _unlink_durably(ctx, dead.path, f"remove dead job {job_id}")


def requeue_dead(ctx: Context, job_id: str, *, max_attempts_reset: bool = True) -> str:
    """Give a dead job another life: move it back to ``ready/`` and return the new path.

    The object keeps its job id and its header (so its bytes, digests and
    maximum_attempts are unchanged and the reference can claim it); the name
    gets the next generation and, with ``max_attempts_reset``, attempt 0 --
    a fresh set of attempts. Without it the attempt is kept, and a job whose
    attempts are used up is refused (it would only be dead-lettered again).

    The envelope and payload are verified first; a corrupt dead object is
    quarantined instead (NotCommitted with the corruption kind). The move is
    the witnessed no-replace rename with barriers ready shard directory, then
    dead directory. Outcomes: the path on success; NotCommitted (NOT_FOUND
    when no dead object exists or it vanished, QUEUE_CORRUPT on a collision
    or a changed file, RESOURCE_EXHAUSTED/IO_FAILURE for errnos);
    OutcomeUnknown with an :class:`~steadqd.fs.json_records.EnqueueTicket` describing
    the expected ready path when a barrier after the rename failed.
    """
    with _mutation(ctx, f"requeue {job_id}"):
        return _requeue(ctx, job_id, max_attempts_reset)
    raise AssertionError("unreachable")  # pragma: no cover - _mutation never swallows


def _requeue(ctx: Context, job_id: str, reset: bool) -> str:
    ctx.check_usable()
    fmt = ctx.fmt
    dead = find_dead(ctx, job_id)
    if dead is None:
        raise NotCommitted(f"requeue: no dead object for job {job_id}", ErrorKind.NOT_FOUND, job_id=job_id)
    attempt = 0 if reset else dead.attempt
    if attempt >= dead.max_attempts:
        raise InvalidInput(
            f"job {job_id} has used {dead.attempt} of {dead.max_attempts} attempts; requeue with max_attempts_reset"
        )
    job = bytes.fromhex(job_id)
    shard = shard_of(fmt.queue_id, job, fmt.shard_count)
    target = ready_name(job, next_generation(dead.generation), attempt, dead.max_attempts)
    target_file = make_filename(fmt.queue_id, target, shard=shard, lease_width_ns=fmt.lease_width_ns)
    dest_rel = f"{READY_DIR}/{shard_dir(shard)}"
    src_rel, src_name = _split(dead.path)
    try:
        src_fd = ctx.tree.dir(src_rel)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise NotCommitted(f"requeue: {src_rel} is gone", ErrorKind.NOT_FOUND, job_id=job_id) from e
        raise not_committed(e, f"open {src_rel}", job_id=job_id) from e
    witness = _verify_dead(ctx, src_fd, src_rel, src_name, job_id)
    try:
        dest_fd = ctx.ready_dir(shard)
    except OSError as e:
        raise not_committed(e, f"create {dest_rel}", job_id=job_id) from e
    try:
        ctx.tree.move_witnessed(src_fd, src_name, dest_fd, target_file, witness, force=True)
    except SourceMissing as e:
        raise NotCommitted(f"requeue: dead object of {job_id} is gone", ErrorKind.NOT_FOUND, job_id=job_id) from e
    except Collision as e:
        raise NotCommitted(f"requeue: destination {dest_rel}/{target_file} exists", ErrorKind.QUEUE_CORRUPT,
                           job_id=job_id) from e  # fmt: skip
    except SourceChanged as e:
        raise NotCommitted(f"requeue: dead file changed: {e}", ErrorKind.QUEUE_CORRUPT, job_id=job_id) from e
    except MoveFailed as e:
        raise NotCommitted(f"requeue: {e}", kind_for_errno(e.errno), job_id=job_id) from e
    except Indeterminate as e:
        ctx.poison(f"requeue of {job_id}: {e.cause}")
        ticket = EnqueueTicket(job, _envelope_digest_of(ctx, src_fd, src_name, dest_fd, target_file), "ready",
                               f"{dest_rel}/{target_file}")  # fmt: skip
        raise OutcomeUnknown(f"requeue outcome unknown: {e.cause}", ticket) from e
    return f"{dest_rel}/{target_file}"


def _verify_dead(ctx: Context, dir_fd: int, rel: str, name: str, job_id: str) -> Witness:
    """Full verification of the dead object; corrupt objects go to quarantine."""
    try:
        fd = linux.open_at(dir_fd, name, _FILE_FLAGS)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise NotCommitted(f"requeue: dead object of {job_id} is gone", ErrorKind.NOT_FOUND, job_id=job_id) from e
        if e.errno == errno.ELOOP:
            _isolate(ctx, dir_fd, name, QuarantineReason.NON_REGULAR_FILE, None, job_id)
            raise NotCommitted(f"requeue: {rel}/{name} is a symlink; quarantined", ErrorKind.QUEUE_CORRUPT,
                               job_id=job_id) from e  # fmt: skip
        raise not_committed(e, f"open {rel}/{name}", job_id=job_id) from e
    try:
        st = linux.fstat(fd)
        try:
            env = read_envelope(fd, ctx.fmt.max_payload_length, st)
            check_name_matches(env.header, parse_name(State.DEAD, name))
            verify_payload(fd, env)
        except CorruptObject as e:
            qname = _isolate(ctx, dir_fd, name, e.reason, Witness.of(st), job_id)
            where = f"; quarantined as {qname}" if qname else ""
            raise NotCommitted(f"requeue: {rel}/{name} is corrupt: {e.message}{where}", e.kind, job_id=job_id) from e
        return env.witness
    finally:
        _close(fd)


def _isolate(ctx: Context, dir_fd: int, name: str, reason: int, witness: Witness | None, job_id: str) -> str | None:
    """Quarantine a corrupt dead object; best effort (it is not claimable in dead/ either)."""
    try:
        if witness is not None and reason in (QuarantineReason.NON_REGULAR_FILE, QuarantineReason.UNEXPECTED_HARD_LINK):
            # The witnessed move insists on a singly linked regular file, which this is not.
            if not witness.matches(linux.stat_at(dir_fd, name)):
                return None
            witness = None
        return quarantine(ctx, dir_fd, name, reason, witness)
    except (MoveError, Indeterminate, OSError):
        return None


def _envelope_digest_of(ctx: Context, src_fd: int, src_name: str, dest_fd: int, dest_name: str) -> bytes:
    """The header's envelope digest for the ticket, read from wherever the object is now."""
    for dir_fd, name in ((dest_fd, dest_name), (src_fd, src_name)):
        try:
            fd = linux.open_at(dir_fd, name, _FILE_FLAGS)
        except OSError:
            continue
        try:
            return read_envelope(fd, ctx.fmt.max_payload_length).header.envelope_digest
        except (SteadQError, OSError):
            continue
        finally:
            _close(fd)
    return bytes(32)


# --------------------------------------------------------------------------- quarantine


def list_quarantine(ctx: Context) -> Iterator[QuarantinedObject]:
    """Every ``q<id>.x<reason>.raw`` under ``quarantine/``, nested directories included.

    Entries are visited in bytewise order; directories are descended without
    following symlinks, except one that bears a quarantine name: that is a
    planted directory claim isolated whole, and what is inside it is its
    content, not more quarantined objects. Other names are skipped.
    """
    yield from _walk_quarantine(ctx, QUARANTINE_DIR, 0)


def _walk_quarantine(ctx: Context, rel: str, depth: int) -> Iterator[QuarantinedObject]:
    try:
        dir_fd = linux.open_beneath(ctx.root_fd, rel, _DIR_FLAGS)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return
        raise _io(e, f"open {rel}") from e
    found: list[QuarantinedObject] = []
    subdirs: list[str] = []
    try:
        try:
            entries = linux.list_dir(dir_fd)
        except OSError as e:
            raise _io(e, f"list {rel}") from e
        for raw in entries:
            try:
                text = raw.decode("ascii")
                st = linux.stat_at(dir_fd, raw)
            except UnicodeDecodeError:
                continue
            except OSError as e:
                if e.errno == errno.ENOENT:
                    continue  # removed meanwhile
                raise _io(e, f"stat {rel}") from e
            parsed = parse_quarantine_name(text)
            if parsed is not None:  # a quarantined directory (reason 0x0008) is one object, never walked
                found.append(QuarantinedObject(parsed[0].hex(), parsed[1], f"{rel}/{text}", st.st_size, st.st_mtime_ns))
            elif stat.S_ISDIR(st.st_mode) and depth < _MAX_QUARANTINE_DEPTH:
                subdirs.append(text)
    finally:
        _close(dir_fd)
    # Sorted listing interleaves files and directories bytewise; keep that order.
    by_name = {o.path.rsplit("/", 1)[1]: o for o in found}
    for name in sorted(list(by_name) + subdirs):
        if name in by_name:
            yield by_name[name]
        else:
            yield from _walk_quarantine(ctx, f"{rel}/{name}", depth + 1)


def find_quarantined(ctx: Context, job_id: str) -> QuarantinedObject | None:
    """The first quarantined regular file whose header names ``job_id``, or None.

    Quarantine names carry no job id (the object may be too damaged to have
    one), so each file's header is read: this costs one small read per
    quarantined object, which is why only ``steadq show`` asks, and only for
    a job found nowhere else.
    """
    want = parse_job_id(job_id)
    for obj in list_quarantine(ctx):
        try:
            fd = _open_object(ctx, obj.path)
        except SteadQError:
            continue  # a symlink, removed meanwhile, unreadable: it names no job we can tell
        try:
            if not stat.S_ISREG(linux.fstat(fd).st_mode):
                continue
            header = JobHeader.decode(linux.pread(fd, HEADER_SIZE, 0))
        except (SteadQError, OSError):
            continue
        finally:
            _close(fd)
        if header.job_id == want:
            return obj
    return None


def _parse_quarantine_id(quarantine_id: str) -> str:
    if (
        not isinstance(quarantine_id, str)
        or len(quarantine_id) != 32
        or any(c not in "0123456789abcdef" for c in quarantine_id)
    ):
        raise InvalidInput("invalid quarantine_id")
    return quarantine_id


def inspect_quarantine(ctx: Context, quarantine_id: str) -> QuarantinedObject:
    """The quarantined object with this id (32 lowercase hex); NOT_FOUND if none."""
    qid = _parse_quarantine_id(quarantine_id)
    for obj in list_quarantine(ctx):
        if obj.quarantine_id == qid:
            return obj
    raise _not_found(f"no quarantined object {qid}")


def export_quarantine(ctx: Context, quarantine_id: str, out_path: str) -> int:
    """Copy a quarantined object's raw bytes to ``out_path`` (atomically, durably).

    Refuses anything but a regular file: a quarantined symlink is never
    followed and a FIFO is never read.
    """
    obj = inspect_quarantine(ctx, quarantine_id)
    fd = _open_object(ctx, obj.path)
    try:
        st = _fstat(fd, obj.path)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"{obj.path} is not a regular file; inspect it in place")
        return _write_atomically(out_path, _raw_chunks(fd), obj.path)
    finally:
        _close(fd)


def remove_quarantine(ctx: Context, quarantine_id: str) -> None:
    """Unlink a quarantined object and fsync its directory (the reference skips the fsync)."""
    with _mutation(ctx, f"remove quarantined object {quarantine_id}"):
        ctx.check_usable()
        obj = inspect_quarantine(ctx, quarantine_id)
        _unlink_durably(ctx, obj.path, f"remove quarantined object {quarantine_id}", directory_ok=True)


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


# --------------------------------------------------------------------------- shared I/O


def _fstat(fd: int, path: str) -> os.stat_result:
    try:
        return linux.fstat(fd)
    except OSError as e:
        raise _io(e, f"fstat {path}") from e


def _raw_chunks(fd: int) -> Iterator[bytes]:
    """Every byte of the file, read positionally until EOF."""
    offset = 0
    while True:
        chunk = linux.pread(fd, CHUNK, offset)
        if not chunk:
            return
        offset += len(chunk)
        yield chunk


def _write_atomically(out_path: str, chunks: Iterator[bytes], source: str) -> int:
    """Write ``chunks`` to a temp beside ``out_path``, fsync, rename over it, fsync the directory.

    A failure (including a payload that fails its digest at the end of the
    stream) unlinks the temp, so no partial or unverified output is visible.
    Read errors of the source are I/O failures of the queue object;
    corruption surfaces as CorruptObject (QUEUE_CORRUPT / PAYLOAD_CORRUPT).
    """
    out = os.fspath(out_path)
    parent, base = os.path.split(os.path.abspath(out))
    if not base:
        raise InvalidInput(f"output path {out_path!r} names a directory")
    try:
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise _io(e, f"open output directory {parent}") from e
    tmp = f".{base}.tmp.{linux.getrandom(8).hex()}"
    created = False
    try:
        try:
            fd = linux.open_at(dir_fd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as e:
            raise _io(e, f"create {os.path.join(parent, tmp)}") from e
        created = True
        total = 0
        try:
            while True:
                try:
                    chunk = next(chunks, None)
                except OSError as e:
                    raise _io(e, f"read {source}") from e
                if chunk is None:
                    break
                try:
                    linux.write_all(fd, chunk)
                except OSError as e:
                    raise _io(e, f"write {out}") from e
                total += len(chunk)
            try:
                linux.fsync(fd)
            except OSError as e:
                raise _io(e, f"fsync {out}") from e
        finally:
            _close(fd)
        try:
            linux.rename_replace(dir_fd, tmp, dir_fd, base)
        except OSError as e:
            raise _io(e, f"rename into {out}") from e
        created = False
        try:
            linux.fsync(dir_fd)
        except OSError as e:
            raise _io(e, f"fsync directory of {out}") from e
        return total
    finally:
        if created:
            with contextlib.suppress(OSError):
                linux.unlink_at(dir_fd, tmp)
        os.close(dir_fd)


def _unlink_durably(ctx: Context, path: str, what: str, *, directory_ok: bool = False) -> None:
    """Unlink one queue object and fsync its directory, with outcome classes.

    ``directory_ok``: the object may be a directory (one planted with a job's
    name and quarantined, reason 0x0008); an empty one is removed, one with
    entries is refused: what a group member put inside is for a person to look
    at, and removing a planted tree is not a queue operation.
    """
    rel, name = _split(path)
    try:
        dir_fd = linux.open_beneath(ctx.root_fd, rel, _DIR_FLAGS)
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
        _close(dir_fd)
