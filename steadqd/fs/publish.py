"""Enqueue: publish a new job file (protocol.md "Enqueue").

The file is written complete and fsynced while it has no name (O_TMPFILE),
then linked under its final name: the link is the linearization point, so no
reader can ever see a partial job. Where O_TMPFILE or linking an anonymous
file is unavailable (ZFS, some kernels) the same bytes go to a named temp in
``tmp/<boot>/<shard>/`` and a no-replace rename publishes them.
:func:`enqueue_many` runs the same steps for a group of jobs phase by phase
(all written, all fsynced, then all linked) so the file fsyncs share journal
commits.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from steadqd.constants import (
    ENQUEUE_MANY_GROUP,
    HEADER_SIZE,
    MAX_MAXIMUM_ATTEMPTS,
    MAX_PAYLOAD_LENGTH,
    MIN_MAXIMUM_ATTEMPTS,
    TMP_DIR,
    U64_MAX,
    State,
)
from steadqd.errors import (
    EnqueueIncomplete,
    ErrorKind,
    InvalidInput,
    NotCommitted,
    OutcomeUnknown,
    SteadQError,
    kind_for_errno,
)
from steadqd.fs import linux
from steadqd.fs.clock import checked_seconds_ns
from steadqd.fs.compiled import bridge
from steadqd.fs.context import Context, not_committed
from steadqd.fs.json_records import EnqueueTicket
from steadqd.fs.names import (
    delayed_bucket,
    delayed_name,
    make_filename,
    make_temp_name,
    ready_filename,
    shard_dir,
    shard_of,
    shard_of_ids,
    state_dir,
)
from steadqd.fs.records import Extension, JobHeader, build_header, encode_extension
from steadqd.fs.tree import (
    Collision,
    DestinationGone,
    Indeterminate,
    MoveFailed,
    SourceChanged,
    SourceMissing,
    Witness,
    is_removed_dir,
)

_CHUNK = 1 << 20
_ONE_WRITE = 64 * 1024  # payloads up to this size are written with the header in one write (one copy)
# Times a publication re-creates a destination directory that recovery removed
# (an empty delayed bucket) before giving up with NotCommitted.
_RECREATE_ATTEMPTS = 3
_TMPFILE_UNSUPPORTED = (errno.EISDIR, errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL)
# sync_file_range answers that only mean "no such hint here" (EPERM: a seccomp
# filter refusing it); fsync is the barrier anyway.
_WRITEBACK_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ESPIPE, errno.EPERM)

Payload = bytes | bytearray | memoryview | BinaryIO


@dataclass(frozen=True, init=False)
class Published:
    """A committed job: its id, its path and its state ("ready" or "delayed").

    The constructor fills the frozen fields directly (every enqueue makes one):
    the generated one would set each through ``object.__setattr__``.
    """

    job_id: str
    path: str
    state: str

    def __init__(self, job_id: str, path: str, state: str) -> None:
        f = self.__dict__
        f["job_id"] = job_id
        f["path"] = path
        f["state"] = state


@dataclass(slots=True, init=False)
class _Options:
    """The caller's options of one enqueue call (their one list here: the
    keyword arguments of :meth:`steadqd.backend.Backend.enqueue`, which says
    what each means), validated once: with :func:`enqueue_many` they apply
    to every job of the call. (Not frozen:
    built once per enqueue and never changed, and a frozen dataclass's
    generated constructor sets each field through ``object.__setattr__``.)"""

    max_attempts: int = 3
    content_type: str = "application/octet-stream"
    metadata: Mapping[str, bool | int | str | bytes] | None = None
    producer_id: str | None = None
    trace_context: bytes | None = None
    delay: float | None = None
    not_before_ns: int | None = None
    # Drawn by the caller from getrandom (backend.new_job_id) and recorded
    # before the call, so that it can find out after a crash whether the job exists.
    job_id: bytes | None = None

    def __init__(
        self,
        *,
        max_attempts: int = 3,
        content_type: str = "application/octet-stream",
        metadata: Mapping[str, bool | int | str | bytes] | None = None,
        producer_id: str | None = None,
        trace_context: bytes | None = None,
        delay: float | None = None,
        not_before_ns: int | None = None,
        job_id: bytes | None = None,
    ) -> None:
        # Written out (keyword-only, the fields' defaults) with the checks in it: the
        # generated constructor would call a __post_init__ besides, on every enqueue.
        self.max_attempts = max_attempts
        self.content_type = content_type
        self.metadata = metadata
        self.producer_id = producer_id
        self.trace_context = trace_context
        self.delay = delay
        self.not_before_ns = not_before_ns
        self.job_id = job_id
        m = max_attempts
        if not isinstance(m, int) or isinstance(m, bool) or not MIN_MAXIMUM_ATTEMPTS <= m <= MAX_MAXIMUM_ATTEMPTS:
            raise InvalidInput(
                f"max_attempts must be an integer in {MIN_MAXIMUM_ATTEMPTS}..{MAX_MAXIMUM_ATTEMPTS}, got {m!r}"
            )
        if self.delay is not None and self.not_before_ns is not None:
            raise InvalidInput("give either delay or not_before_ns, not both")
        if self.delay is not None:
            checked_seconds_ns("delay", self.delay)  # refused before any file is written


_NO_OPTIONS = _Options()  # the options of an enqueue given none (never changed, as no _Options is)


def enqueue(ctx: Context, payload: Payload, **options: Any) -> Published:
    """Publish one job; ``options``: the fields of :class:`_Options` (an unknown one is a TypeError)."""
    if ctx.poisoned is not None:  # check_usable's test, without its call
        ctx.check_usable()
    opts = _Options(**options) if options else _NO_OPTIONS
    core = ctx.c_core
    if (
        core is not None
        and type(payload) is bytes
        and (n := len(payload)) <= _ONE_WRITE
        and opts.delay is None
        and opts.not_before_ns is None
        and not opts.metadata
        and opts.trace_context is None
        and ctx.publication != "named"
    ):
        tree = ctx.tree
        if not tree.batching and not tree.deferred and not ctx.modes.enforce and ctx.modes.owner is None:
            return _enqueue_fast(ctx, payload, n, opts, core)
    return _enqueue_drawn(ctx, payload, opts, None)


def _enqueue_drawn(ctx: Context, payload: Payload, opts: _Options, drawn: tuple[bytes, int] | None) -> Published:
    """The enqueue from _prepare on (``drawn``: the job id and wall floor, when already read)."""
    publication = _prepare(ctx, payload, opts, drawn)
    publication.run()
    return publication.result()


def _enqueue_fast(ctx: Context, payload: bytes, n: int, opts: _Options, core: Any) -> Published:
    """A small bytes payload (``n``: its length, which enqueue read) to ready/ through the C core (bridge.Core.enqueue).

    The Python draws the id and reads the wall floor (_prepare's first steps), encodes the extension
    (a memo) and finds the shard's ready directory open in the tree; the core makes the name and
    header, then the O_TMPFILE, write, nlink check, fsync, link and directory fsync. At its first
    deviation _enqueue_drawn runs from _prepare with the core's syscalls replayed, so every outcome,
    error and later syscall (a named temp, a recreated directory, OutcomeUnknown) is the Python's.
    Not here, the Python's alone: streams, delays, metadata, trace context, named temps, batches,
    deferred barriers, owned or mode-enforced queues, a ready directory not open yet.
    """
    job_id = opts.job_id if opts.job_id is not None else ctx.random(16)
    wall = ctx.wall_floor()
    drawn = (job_id, wall)
    fmt = ctx.fmt
    if type(job_id) is not bytes or len(job_id) != 16 or n > fmt.max_payload_length:
        return _enqueue_drawn(ctx, payload, opts, drawn)
    # An enqueue with no option (most producers) has the default content type and no producer id: its
    # extension's bytes, encoded once (_plain_extension's value for them), without the call
    extension = _DEFAULT_EXTENSION if opts is _NO_OPTIONS else _plain_extension(opts.content_type, opts.producer_id)
    # shard_of_ids, not shard_of: its type test passes here (job_id: bytes, tested above; the queue id and
    # count: FORMAT's, which the C core was made from)
    shard = shard_of_ids(fmt.queue_id, job_id, fmt.shard_count)
    rel = ctx.ready_rels[shard]
    dest_fd = ctx.tree.cached_fd(rel)
    if dest_fd is None:
        return _enqueue_drawn(ctx, payload, opts, drawn)
    stage, e = core.enqueue(
        job_id,
        opts.max_attempts,
        wall,
        extension,
        payload,
        n,
        dest_fd,
        shard,
        ctx.modes.file,
        ctx.publication == "proc",
    )
    if stage != bridge.PUBLISHED:
        if stage == bridge.STOP_PURE:
            return _enqueue_drawn(ctx, payload, opts, drawn)
        with bridge.replaying(e, skip_open=False):
            return _enqueue_drawn(ctx, payload, opts, drawn)
    linux.close_quietly(e.fd)
    ctx.last_enqueued_shard = shard
    return Published(job_id.hex(), f"{rel}/{bridge.ffi.string(e.name).decode('ascii')}", "ready")


def enqueue_many(ctx: Context, payloads: Iterable[Payload], **options: Any) -> list[Published]:
    """Publish one job per payload, in order, with one group of file fsyncs per
    :data:`ENQUEUE_MANY_GROUP` jobs. ``options``: as :func:`enqueue`'s but
    ``job_id`` (each job's id is drawn for it).

    Why: on ext4 every job's own fsync commits its own journal transaction.
    Here a group is published in phases: (a) prepare, create the O_TMPFILE,
    write and check every job of the group; (b) start writeback of each
    (``sync_file_range``, no durability promise); (c) fsync each, so the
    first fsync commits the allocations of the whole group; (d) link each, in
    order; (e) fsync each distinct destination directory once (handed to the
    batch barrier inside ``Queue.batch()`` or deferred mode). Every file is
    durable before it gets a name, as in :func:`enqueue`. The payloads are
    pulled from the iterable one at a time and each is written before the
    next is pulled (a generator may close each streamed payload when asked
    for the next); at most one group of unlinked files is open at once.

    Failures: before the first link of a group, no job of the group is
    published (its files are closed and vanish); jobs of earlier groups stay
    published. A failed k-th link (collision, ENOSPC, ...) leaves the jobs
    linked before it published, with their directory barrier, and the rest
    not. A failed directory barrier makes every linked job of the group
    unknown: OutcomeUnknown with one EnqueueTicket per such job (a tuple in
    ``.ticket``), and the handle is poisoned, as with :func:`enqueue`. When
    some jobs were published before the failure, the error is
    :class:`EnqueueIncomplete` (``.published`` is a prefix of the input,
    ``.cause`` the NotCommitted or OutcomeUnknown); otherwise the cause
    itself is raised. An exception raised by the iterable itself that is not
    an OSError or SteadQError propagates unchanged.

    Where the filesystem cannot publish an O_TMPFILE (``ctx.publication ==
    "named"``: ZFS, some kernels), the jobs are published one at a time
    through :func:`enqueue`'s named-temp path, with the same failure rules.
    """
    ctx.check_usable()
    if "job_id" in options:
        raise TypeError("enqueue_many() got an unexpected keyword argument 'job_id'")
    opts = _Options(**options)
    done: list[Published] = []
    items = iter(payloads)
    try:
        while _publish_group(ctx, items, opts, done):
            pass
    except (SteadQError, OSError) as e:
        if not done:
            raise
        raise EnqueueIncomplete([p.job_id for p in done], _as_outcome(e)) from e
    return done


def _publish_group(ctx: Context, items: Iterator[Payload], opts: _Options, done: list[Published]) -> bool:
    """Publish the next group of ``items``, appending each job to ``done`` once
    it is committed; False when ``items`` had nothing left."""
    if ctx.publication == "named":  # no O_TMPFILE to hold: one job at a time, as enqueue() does
        for payload in itertools.islice(items, 1):
            single = _prepare(ctx, payload, opts)
            single.run()
            done.append(single.result())
            return True
        return False
    fds: list[int] = []
    group: list[tuple[_Publication, int, JobHeader]] = []
    unsupported: _Publication | None = None  # the job that found O_TMPFILE unusable here
    try:
        for payload in itertools.islice(items, ENQUEUE_MANY_GROUP):
            publication = _prepare(ctx, payload, opts)
            fd = publication.open_anonymous()
            if fd is None:
                unsupported = publication
                break
            fds.append(fd)
            group.append((publication, fd, publication.write_anonymous(fd)))
        for publication, fd, _ in group:
            _start_writeback(publication, fd)
        for publication, fd, _ in group:
            publication.sync_anonymous(fd)
        _link_group(ctx, group, done)
    finally:
        for fd in fds:
            linux.close_quietly(fd)
    if unsupported is not None:
        unsupported.run()  # the named-temp path; the rest of the input follows one at a time
        done.append(unsupported.result())
    return bool(group) or unsupported is not None


def _link_group(ctx: Context, group: list[tuple[_Publication, int, JobHeader]], done: list[Published]) -> None:
    """Phases (d) and (e): link every durable file in order, then one barrier per directory."""
    linked: list[tuple[_Publication, JobHeader]] = []
    dirs: dict[str, int] = {}
    failed: NotCommitted | None = None
    for publication, fd, header in group:
        try:
            publication.refresh_dest()
            if publication.link(fd):
                # The latest fd: one made again after a removal replaced (closed) the cached one.
                dirs[publication.dest_rel] = publication.dest_fd
        except NotCommitted as e:
            failed = e
            break
        except OutcomeUnknown as e:  # the named-temp fallback of one job: nothing more may be done
            linked.append((publication, header))
            raise _unknown_many(ctx, linked, e.message) from e
        linked.append((publication, header))
    for rel, dir_fd in dirs.items():
        try:
            ctx.tree.barrier(dir_fd)
        except OSError as e:
            why = f"fsync {rel}: {e.strerror}" + (f" (after {failed.message})" if failed is not None else "")
            raise _unknown_many(ctx, linked, why) from e
    done.extend(publication.result() for publication, _ in linked)
    if failed is not None:
        raise failed


def _start_writeback(publication: _Publication, fd: int) -> None:
    """Phase (b): let the group's fsyncs find every file's data already on its way."""
    try:
        linux.sync_file_range(fd, 0, 0, linux.SYNC_FILE_RANGE_WRITE)
    except OSError as e:
        if e.errno not in _WRITEBACK_UNSUPPORTED:  # only a hint, but EIO/ENOSPC are real answers
            raise not_committed(e, "start writeback of job file", job_id=publication.job_hex) from e


def _unknown_many(ctx: Context, linked: list[tuple[_Publication, JobHeader]], cause: str) -> OutcomeUnknown:
    """The linked jobs of a group whose barrier failed: each may or may not survive a crash."""
    tickets = tuple(p.ticket(header) for p, header in linked)
    ids = ", ".join(p.job_hex for p, _ in linked[:3]) + (", ..." if len(linked) > 3 else "")
    ctx.poison(f"enqueue_many {ids}: {cause}")
    return OutcomeUnknown(f"enqueue outcome unknown for {len(tickets)} job(s) ({ids}): {cause}", tickets)


def _as_outcome(e: SteadQError | OSError) -> NotCommitted | OutcomeUnknown:
    """The cause of an EnqueueIncomplete in the outcome classes Queue.enqueue would raise."""
    if isinstance(e, NotCommitted | OutcomeUnknown):
        return e
    if isinstance(e, SteadQError):
        return NotCommitted(f"enqueue: {e.message}", e.kind)
    return not_committed(e, "enqueue")


def _prepare(ctx: Context, payload: Payload, opts: _Options, drawn: tuple[bytes, int] | None = None) -> _Publication:
    """Protocol.md "Enqueue", preparation: id, wall floor, extension, name,
    destination directory and the writer of one job (NotCommitted on failure).
    ``drawn``: the id and wall floor the C core's caller read already (_enqueue_fast)."""
    if drawn is None:
        job_id = opts.job_id if opts.job_id is not None else ctx.random(16)
        wall = ctx.wall_floor()
    else:
        job_id, wall = drawn
    not_before_ns = opts.not_before_ns
    if opts.delay is not None:
        not_before_ns = wall + checked_seconds_ns("delay", opts.delay) if opts.delay > 0 else None
    if not_before_ns is not None and not 0 <= not_before_ns <= U64_MAX:
        raise InvalidInput(f"not_before_ns out of range: {not_before_ns}")
    if not_before_ns is None and not opts.metadata and opts.trace_context is None:
        extension = _plain_extension(opts.content_type, opts.producer_id)
    else:
        extension = encode_extension(
            Extension(
                content_type=opts.content_type,
                initial_not_before=not_before_ns,
                metadata=dict(opts.metadata) if opts.metadata else None,
                producer_id=opts.producer_id,
                trace_context=opts.trace_context,
            )
        )
    fmt = ctx.fmt
    max_attempts = opts.max_attempts
    shard = shard_of(fmt.queue_id, job_id, fmt.shard_count)
    if not_before_ns is not None and not_before_ns > wall:
        bucket = delayed_bucket(not_before_ns, fmt.delayed_width_ns)
        # clocks.md: the eligibility instant bucket × width is a checked multiply. A job
        # whose instant does not fit u64 could never become due; the reference refuses it.
        if bucket * fmt.delayed_width_ns > U64_MAX:
            raise InvalidInput(
                f"not_before_ns {not_before_ns} is too far ahead: its delayed bucket would start after 2^64-1 ns"
            )
        name = make_filename(
            fmt.queue_id,
            delayed_name(job_id=job_id, generation=0, attempt=0, max_attempts=max_attempts, not_before=not_before_ns),
            shard=shard,
            bucket=bucket,
            lease_width_ns=fmt.lease_width_ns,
        )
        dest_rel, state = state_dir(State.DELAYED, shard, bucket), "delayed"
    else:
        name = ready_filename(fmt.queue_id, job_id, 0, 0, max_attempts, shard=shard, lease_width_ns=fmt.lease_width_ns)
        dest_rel, state = ctx.ready_rels[shard], "ready"  # state_dir(READY, shard), made once per handle
    max_payload = min(fmt.max_payload_length, MAX_PAYLOAD_LENGTH)
    writer = _writer(payload, job_id, max_attempts, wall, extension, max_payload)
    job_hex = job_id.hex()
    try:
        dest_fd = ctx.tree.ensure_dir(dest_rel)
    except OSError as e:
        raise not_committed(e, f"create {dest_rel}", job_id=job_hex) from e
    return _Publication(ctx, dest_rel, dest_fd, name, shard, writer, job_hex, state)


def _plain_extension(content_type: str, producer_id: str | None) -> bytes:
    """The extension of a job with only a content type (and producer id): most jobs, and
    the same few bytes for each, so encoded once per value (not for another type: an
    unhashable value is left to encode_extension to refuse by name)."""
    if type(content_type) is str and (producer_id is None or type(producer_id) is str):
        return _plain_extension_memo(content_type, producer_id)
    return encode_extension(Extension(content_type=content_type, producer_id=producer_id))


@functools.lru_cache(maxsize=64)
def _plain_extension_memo(content_type: str, producer_id: str | None) -> bytes:
    return encode_extension(Extension(content_type=content_type, producer_id=producer_id))


# _plain_extension of _NO_OPTIONS' content type and producer id: what every enqueue given no option encodes
_DEFAULT_EXTENSION = _plain_extension(_NO_OPTIONS.content_type, _NO_OPTIONS.producer_id)


Writer = Callable[[int], JobHeader]


def _writer(
    payload: Payload, job_id: bytes, max_attempts: int, created_at: int, extension: bytes, max_payload: int
) -> Writer:
    """Return a function that writes the whole job file into an fd."""
    if type(payload) is bytes or isinstance(payload, bytes | bytearray | memoryview):
        # bytes are already one immutable run of bytes: the view is only for the other two
        data = payload if type(payload) is bytes else memoryview(payload).cast("B")
        if len(data) > max_payload:
            raise InvalidInput(f"payload of {len(data)} bytes exceeds the queue maximum of {max_payload}")
        header = build_header(
            job_id=job_id,
            max_attempts=max_attempts,
            created_at_ns=created_at,
            extension=extension,
            payload_length=len(data),
            payload_digest=hashlib.sha256(data).digest(),
        )

        def write_bytes(fd: int) -> JobHeader:
            if len(data) <= _ONE_WRITE:  # one system call for a typical small job
                linux.write_all(fd, b"".join((header.encode(), extension, data)))
                return header
            linux.write_all(fd, header.encode() + extension)
            linux.write_all(fd, data)
            return header

        return write_bytes
    if not hasattr(payload, "read"):
        raise InvalidInput(f"payload must be bytes or a binary file object, got {type(payload).__name__}")
    stream = payload
    consumed = False

    def write_stream(fd: int) -> JobHeader:
        nonlocal consumed
        if consumed:
            raise InvalidInput("a streamed payload can be published only once")
        consumed = True
        # Streaming (protocol.md): placeholder header, extension, payload
        # while hashing, then the real header at offset 0 before the fsync.
        linux.write_all(fd, bytes(HEADER_SIZE) + extension)
        h = hashlib.sha256()
        total = 0
        while True:
            chunk = stream.read(_CHUNK)
            if not chunk:
                break
            if not isinstance(chunk, bytes | bytearray):
                raise InvalidInput("payload file object must be opened in binary mode")
            total += len(chunk)
            if total > max_payload:
                raise InvalidInput(f"payload exceeds the queue maximum of {max_payload} bytes")
            h.update(chunk)
            linux.write_all(fd, chunk)
        header = build_header(
            job_id=job_id,
            max_attempts=max_attempts,
            created_at_ns=created_at,
            extension=extension,
            payload_length=total,
            payload_digest=h.digest(),
        )
        linux.pwrite_all(fd, header.encode(), 0)
        return header

    return write_stream


class _Publication:
    """One job's publication attempt, with its fallback paths."""

    def __init__(
        self, ctx: Context, dest_rel: str, dest_fd: int, name: str, shard: int, writer: Writer, job_hex: str, state: str
    ):
        self.ctx = ctx
        self.dest_rel = dest_rel
        self.dest_fd = dest_fd
        self.name = name
        self.shard = shard
        self.writer = writer
        self.job_hex = job_hex
        self.state = state
        self.rel_path = f"{dest_rel}/{name}"
        self._recreated = 0  # times a deleted destination directory was made again

    def result(self) -> Published:
        """What a committed publication reports (and the claim scan's hint of where to look)."""
        if self.state == "ready":
            self.ctx.last_enqueued_shard = self.shard
        return Published(self.job_hex, self.rel_path, self.state)

    def ticket(self, header: JobHeader) -> EnqueueTicket:
        return EnqueueTicket(
            job_id=bytes.fromhex(self.job_hex),
            envelope_digest=header.envelope_digest,
            state=self.dest_rel.split("/", 1)[0],
            path=self.rel_path,
        )

    def _unknown(self, header: JobHeader, cause: str) -> OutcomeUnknown:
        self.ctx.poison(f"enqueue {self.job_hex}: {cause}")
        return OutcomeUnknown(f"enqueue outcome unknown: {cause}", self.ticket(header))

    def run(self) -> JobHeader:
        if self.ctx.publication != "named":
            fd = self.open_anonymous()
            if fd is not None:
                try:
                    return self._via_tmpfile(fd)
                finally:
                    linux.close_quietly(fd)
        return self._via_named_temp(None)

    def open_anonymous(self) -> int | None:
        """An O_TMPFILE in the destination directory; None where the filesystem
        cannot make one (the handle switches to named temps)."""
        try:
            return linux.open_tmpfile(self.dest_fd, self.ctx.modes.file)
        except OSError as e:
            if self.recreate_dest():
                # The cached destination directory was removed (EPERM/ENOENT from
                # O_TMPFILE): recreate it, as layout.md asks of every put.
                return self.open_anonymous()
            if e.errno not in _TMPFILE_UNSUPPORTED:
                raise not_committed(e, "create anonymous file", job_id=self.job_hex) from e
            self.ctx.publication = "named"
            return None

    def refresh_dest(self) -> None:
        """Look the destination fd up again: another job of an enqueue_many group may
        have recreated the directory (closing the cached fd) since this one was prepared."""
        try:
            self.dest_fd = self.ctx.tree.ensure_dir(self.dest_rel)
        except OSError as e:
            raise not_committed(e, f"create {self.dest_rel}", job_id=self.job_hex) from e

    def recreate_dest(self) -> bool:
        """Make the destination directory again if it was removed; False if it was not
        removed or was already made again too often (the caller then fails as it would).

        Recovery removes empty delayed buckets well in the past, but a producer
        can take longer than that between choosing the bucket and linking (a
        slow stream): the job still gets its name, in a new directory.
        """
        if self._recreated >= _RECREATE_ATTEMPTS or not is_removed_dir(self.dest_fd):
            return False
        self._recreated += 1
        try:
            self.dest_fd = self.ctx.tree.refresh(self.dest_rel)
        except OSError as e:
            raise not_committed(e, f"create {self.dest_rel}", job_id=self.job_hex) from e
        return True

    def write_anonymous(self, fd: int) -> JobHeader:
        """Write the whole job into the anonymous file; it must still have no name."""
        try:
            self.ctx.new_file_mode(fd)
            header = self.writer(fd)
            st = linux.fstat(fd)
            if st.st_nlink != 0:
                raise NotCommitted("anonymous file unexpectedly has a name", ErrorKind.IO_FAILURE, job_id=self.job_hex)
        except OSError as e:
            raise not_committed(e, "write job file", job_id=self.job_hex) from e
        return header

    def sync_anonymous(self, fd: int) -> None:
        """The content is durable before it gets a name."""
        try:
            linux.fsync(fd)
        except OSError as e:
            raise not_committed(e, "write job file", job_id=self.job_hex) from e

    def link(self, fd: int) -> bool:
        """Give the durable anonymous file its name: the linearization point.

        True when linked (its directory barrier is still owed); False when no
        link form works here and the job went through a named temp instead,
        barrier included (the handle then stays on named temps).
        """
        while True:
            try:
                form = linux.link_tmpfile(fd, self.dest_fd, self.name, prefer_proc=self.ctx.publication == "proc")
                break
            except linux.TmpfileLinkUnsupported:
                self.ctx.publication = "named"
                self._via_named_temp(fd)
                return False
            except OSError as e:
                if _linked_anyway(fd):
                    form = self.ctx.publication  # the link happened although an error was reported
                    break
                if e.errno == errno.EEXIST:
                    raise NotCommitted(
                        f"job id collision at {self.rel_path}", ErrorKind.IDENTITY_COLLISION, job_id=self.job_hex
                    ) from e
                if e.errno == errno.ENOENT and self.recreate_dest():
                    continue  # the directory was removed after the file was written: link there again
                if e.errno == errno.ENOENT:
                    self.ctx.tree.forget(self.dest_rel)  # deleted directory: recreate next time
                raise not_committed(e, f"link into {self.dest_rel}", job_id=self.job_hex) from e
        if self.ctx.publication != "named":  # a later job of the group found O_TMPFILE unusable: keep that
            self.ctx.publication = form
        return True

    def _via_tmpfile(self, fd: int) -> JobHeader:
        header = self.write_anonymous(fd)
        self.sync_anonymous(fd)
        if self.link(fd):
            try:
                self.ctx.tree.barrier(self.dest_fd)
            except OSError as e:
                raise self._unknown(header, f"fsync {self.dest_rel}: {e.strerror}") from e
        return header

    def _via_named_temp(self, source_fd: int | None) -> JobHeader:
        ctx = self.ctx
        tmp_rel = f"{TMP_DIR}/{ctx.boot_id}/{shard_dir(self.shard)}"
        try:
            tmp_fd = ctx.tree.ensure_dir(tmp_rel)
            tmp_name = make_temp_name(linux.boottime_ns(), ctx.random(16))
        except OSError as e:
            raise not_committed(e, "create temp file", job_id=self.job_hex) from e
        try:
            fd = linux.open_at(
                tmp_fd, tmp_name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, self.ctx.modes.file
            )
        except OSError as e:
            if e.errno != errno.EEXIST:  # the create may have happened before the error: guard the name
                try:
                    linux.unlink_at(tmp_fd, tmp_name)
                except OSError:
                    pass
            raise not_committed(e, "create temp file", job_id=self.job_hex) from e
        published = False
        try:
            try:
                ctx.new_file_mode(fd)
                header = self.writer(fd) if source_fd is None else _copy_file(source_fd, fd)
                linux.fsync(fd)
                witness = Witness.of(linux.fstat(fd))
            except OSError as e:
                raise not_committed(e, "write temp file", job_id=self.job_hex) from e
            try:
                self._move_from_temp(tmp_fd, tmp_name, witness)
                published = True
            except Collision as e:
                raise NotCommitted(
                    f"job id collision at {self.rel_path}", ErrorKind.IDENTITY_COLLISION, job_id=self.job_hex
                ) from e
            except (SourceMissing, SourceChanged) as e:
                raise NotCommitted(
                    f"temp file changed before publication: {e}", ErrorKind.IO_FAILURE, job_id=self.job_hex
                ) from e
            except MoveFailed as e:
                raise NotCommitted(f"publish: {e}", kind_for_errno(e.errno), job_id=self.job_hex) from e
            except Indeterminate as e:
                published = True
                raise self._unknown(header, e.cause) from e
            return header
        finally:
            linux.close_quietly(fd)
            if not published:
                try:
                    linux.unlink_at(tmp_fd, tmp_name)
                except OSError:
                    pass

    def _move_from_temp(self, tmp_fd: int, tmp_name: str, witness: Witness) -> None:
        """The named-temp linearization, into a re-created directory if recovery removed it."""
        while True:
            try:
                self.ctx.tree.move_witnessed(tmp_fd, tmp_name, self.dest_fd, self.name, witness)
                return
            except DestinationGone:
                if not self.recreate_dest():
                    raise


def _linked_anyway(fd: int) -> bool:
    try:
        return linux.fstat(fd).st_nlink > 0
    except OSError:
        return False


def _copy_file(src: int, dst: int) -> JobHeader:
    header = JobHeader.decode(linux.pread(src, HEADER_SIZE, 0))
    offset = 0
    while True:
        chunk = linux.pread(src, _CHUNK, offset)
        if not chunk:
            return header
        linux.pwrite_all(dst, chunk, offset)
        offset += len(chunk)
