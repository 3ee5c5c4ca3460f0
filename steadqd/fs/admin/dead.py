"""Operator tools for ``dead/`` (dead letters): list, export, remove and requeue (protocol.md
"Administrative operations", cli.md ``admin dead …``, open-questions 6, 7 and 20).

``requeue_dead`` exists although the reference only lists it in its state
machine: the dead object is renamed back into ``ready/`` with the next
generation and attempt 0, header untouched, so the reference claims it like
any ready job. Listing functions only report names that parse and
authenticate for the directory they are in: a stray file must not be
mistaken for a dead job. The file handling (exports, durable unlinks) is
``files``, shared with ``quarantine``.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from steadqd.constants import DEAD_DIR, QuarantineReason, State
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
from steadqd.fs.admin.files import (
    DIR_FLAGS,
    FILE_FLAGS,
    close_quietly,
    fstat_object,
    io_error,
    list_names,
    mutation,
    not_found,
    open_dir,
    open_object,
    raw_chunks,
    split_path,
    stat_entries,
    unlink_durably,
    write_atomically,
)
from steadqd.fs.context import Context, not_committed
from steadqd.fs.json_records import EnqueueTicket
from steadqd.fs.names import (
    dead_job,
    make_filename,
    next_generation,
    parse_bucket_dir,
    parse_job_id,
    parse_name,
    parse_shard_dir,
    ready_name,
    shard_dir,
    shard_of,
    state_dir,
)
from steadqd.fs.quarantine import quarantine
from steadqd.fs.tree import Collision, Indeterminate, MoveError, MoveFailed, SourceChanged, SourceMissing, Witness
from steadqd.fs.verify import check_name_matches, iter_payload, read_envelope, verify_payload
from steadqd.text import printable

__all__ = [
    "DeadFile",
    "DeadJob",
    "export_dead",
    "find_dead",
    "list_dead",
    "list_dead_files",
    "remove_dead",
    "requeue_dead",
]


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


def _dead_in(ctx: Context, bucket: int, shard: int, rel: str, prefix: bytes = b"") -> Iterator[DeadJob]:
    """The dead jobs (:func:`names.dead_job`) of ``dead/<bucket>/<shard>/`` = ``rel`` whose names start with ``prefix``.

    Each candidate is lstat'ed: a symlink or a FIFO bearing a job's name is
    not a dead job, so no admin command selects it (fsck reports it).
    """
    fmt = ctx.fmt
    dir_fd = open_dir(ctx.root_fd, rel)
    if dir_fd is None:
        return
    try:
        for raw, st in stat_entries(dir_fd, rel, lambda raw: raw.startswith(prefix)):
            name = dead_job(fmt.queue_id, fmt.shard_count, fmt.lease_width_ns, bucket, shard, raw, st.st_mode)
            if name is None:
                continue
            assert name.reason is not None
            yield DeadJob(name.job_hex, name.generation, name.attempt, name.max_attempts, name.reason,
                          f"{rel}/{raw.decode('ascii')}")  # fmt: skip
    finally:
        close_quietly(dir_fd)


def _buckets(ctx: Context) -> list[tuple[int, str]]:
    entries = list_names(ctx.root_fd, DEAD_DIR) or []
    out = []
    for raw in entries:
        b = parse_bucket_dir(raw)
        if b is not None:
            out.append((b, raw.decode("ascii")))
    return out


def list_dead(ctx: Context) -> Iterator[DeadJob]:
    """Every authenticated dead object, bucket by bucket, shard by shard, bytewise sorted.

    Streams: one shard directory is listed at a time, so a huge dead-letter
    backlog is never held in memory. Unparseable or unauthenticated names are
    skipped (fsck reports them); a missing ``dead/`` is an empty listing.
    """
    for bucket, bname in _buckets(ctx):
        shards = list_names(ctx.root_fd, f"{DEAD_DIR}/{bname}") or []
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
        root_fd = linux.open_at(-100, queue_root, DIR_FLAGS)
    except FileNotFoundError:
        return None
    try:
        dead_fd = _walk_dir(root_fd, DEAD_DIR.encode(), DEAD_DIR.encode(), skip_other=False)
    finally:
        close_quietly(root_fd)
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
                        close_quietly(shard_fd)
            finally:
                close_quietly(bucket_fd)
    finally:
        close_quietly(dead_fd)
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
        raise not_found(f"no dead object for job {job_id}")
    return found


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
    fd = open_object(ctx, dead.path)
    try:
        st = fstat_object(fd, dead.path)
        if not stat.S_ISREG(st.st_mode):
            raise SteadQError(f"{dead.path} is not a regular file", ErrorKind.QUEUE_CORRUPT)
        if payload_only:
            try:
                env = read_envelope(fd, ctx.fmt.max_payload_length, st)
            except OSError as e:
                raise io_error(e, f"read {dead.path}") from e
            return write_atomically(out_path, iter_payload(fd, env), dead.path)
        return write_atomically(out_path, raw_chunks(fd), dead.path)
    finally:
        close_quietly(fd)


def remove_dead(ctx: Context, job_id: str) -> None:
    """Delete a dead job for good: unlink, then fsync its shard directory.

    NOT_FOUND when there is none. A failed directory fsync after the unlink
    is OutcomeUnknown (the handle is poisoned): the unlink may not survive
    a crash.
    """
    with mutation(ctx, f"remove dead job {job_id}"):
        ctx.check_usable()
        dead = _require_dead(ctx, job_id)
        unlink_durably(ctx, dead.path, f"remove dead job {job_id}")


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
    with mutation(ctx, f"requeue {job_id}"):
        return _requeue(ctx, job_id, max_attempts_reset)
    raise AssertionError("unreachable")  # pragma: no cover - mutation never swallows


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
    dest_rel = state_dir(State.READY, shard)
    src_rel, src_name = split_path(dead.path)
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
        fd = linux.open_at(dir_fd, name, FILE_FLAGS)
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
        close_quietly(fd)


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
            fd = linux.open_at(dir_fd, name, FILE_FLAGS)
        except OSError:
            continue
        try:
            return read_envelope(fd, ctx.fmt.max_payload_length).header.envelope_digest
        except (SteadQError, OSError):
            continue
        finally:
            close_quietly(fd)
    return bytes(32)
