"""Enqueue: publish a new job file (protocol.md "Enqueue").

The file is written complete and fsynced while it has no name (O_TMPFILE),
then linked under its final name: the link is the linearization point, so no
reader can ever see a partial job. Where O_TMPFILE or linking an anonymous
file is unavailable (ZFS, some kernels) the same bytes go to a named temp in
``tmp/<boot>/<shard>/`` and a no-replace rename publishes them.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import BinaryIO

from . import linux
from .constants import (
    DELAYED_DIR,
    HEADER_SIZE,
    MAX_PAYLOAD_LENGTH,
    NS_PER_SECOND,
    READY_DIR,
    TMP_DIR,
    U32_MAX,
    U64_MAX,
)
from .context import Context, not_committed
from .errors import ErrorKind, InvalidInput, NotCommitted, OutcomeUnknown, kind_for_errno
from .names import (
    bucket_dir,
    delayed_bucket,
    delayed_name,
    make_filename,
    make_temp_name,
    ready_name,
    shard_dir,
    shard_of,
)
from .records import EnqueueTicket, Extension, JobHeader, build_header, encode_extension
from .tree import Collision, Indeterminate, MoveFailed, SourceChanged, SourceMissing, Witness

_CHUNK = 1 << 20
_TMPFILE_UNSUPPORTED = (errno.EISDIR, errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL)

Payload = bytes | bytearray | memoryview | BinaryIO


@dataclass(frozen=True)
class Published:
    job_id: str
    path: str
    state: str


def enqueue(
    ctx: Context,
    payload: Payload,
    *,
    max_attempts: int = 3,
    content_type: str = "application/octet-stream",
    metadata: Mapping[str, bool | int | str | bytes] | None = None,
    producer_id: str | None = None,
    trace_context: bytes | None = None,
    delay: float | None = None,
    not_before_ns: int | None = None,
) -> Published:
    ctx.check_usable()
    if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or not 1 <= max_attempts <= U32_MAX:
        raise InvalidInput(f"max_attempts must be an integer in 1..{U32_MAX}, got {max_attempts!r}")
    if delay is not None and not_before_ns is not None:
        raise InvalidInput("give either delay or not_before_ns, not both")
    if delay is not None and (delay != delay or delay < 0):
        raise InvalidInput(f"delay must be a non-negative number of seconds, got {delay!r}")
    job_id = ctx.random(16)
    wall = ctx.wall_floor()
    if delay is not None:
        not_before_ns = wall + round(delay * NS_PER_SECOND) if delay > 0 else None
    if not_before_ns is not None and not 0 <= not_before_ns <= U64_MAX:
        raise InvalidInput(f"not_before_ns out of range: {not_before_ns}")
    extension = encode_extension(
        Extension(
            content_type=content_type,
            initial_not_before=not_before_ns,
            metadata=dict(metadata) if metadata else None,
            producer_id=producer_id,
            trace_context=trace_context,
        )
    )
    fmt = ctx.fmt
    shard = shard_of(fmt.queue_id, job_id, fmt.shard_count)
    if not_before_ns is not None and not_before_ns > wall:
        bucket = delayed_bucket(not_before_ns, fmt.delayed_width_ns)
        name = make_filename(
            fmt.queue_id,
            delayed_name(job_id=job_id, generation=0, attempt=0, max_attempts=max_attempts, not_before=not_before_ns),
            shard=shard,
            bucket=bucket,
            lease_width_ns=fmt.lease_width_ns,
        )
        dest_rel, state = f"{DELAYED_DIR}/{bucket_dir(bucket)}/{shard_dir(shard)}", "delayed"
    else:
        name = make_filename(
            fmt.queue_id,
            ready_name(job_id=job_id, generation=0, attempt=0, max_attempts=max_attempts),
            shard=shard,
            lease_width_ns=fmt.lease_width_ns,
        )
        dest_rel, state = f"{READY_DIR}/{shard_dir(shard)}", "ready"
    max_payload = min(fmt.max_payload_length, MAX_PAYLOAD_LENGTH)
    writer = _writer(payload, job_id, max_attempts, wall, extension, max_payload)
    job_hex = job_id.hex()
    try:
        dest_fd = ctx.tree.ensure_dir(dest_rel)
    except OSError as e:
        raise not_committed(e, f"create {dest_rel}", job_id=job_hex) from e
    rel_path = f"{dest_rel}/{name}"
    publication = _Publication(ctx, dest_rel, dest_fd, name, shard, writer, job_hex)
    publication.run()
    if state == "ready":
        ctx.last_enqueued_shard = shard
    return Published(job_hex, rel_path, state)


Writer = Callable[[int], JobHeader]


def _writer(
    payload: Payload, job_id: bytes, max_attempts: int, created_at: int, extension: bytes, max_payload: int
) -> Writer:
    """Return a function that writes the whole job file into an fd."""
    if isinstance(payload, bytes | bytearray | memoryview):
        data = memoryview(payload).cast("B")
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
            linux.write_all(fd, header.encode() + extension)
            if len(data):
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
    """One enqueue's publication attempt, with its fallback paths."""

    def __init__(self, ctx: Context, dest_rel: str, dest_fd: int, name: str, shard: int, writer: Writer, job_hex: str):
        self.ctx = ctx
        self.dest_rel = dest_rel
        self.dest_fd = dest_fd
        self.name = name
        self.shard = shard
        self.writer = writer
        self.job_hex = job_hex
        self.rel_path = f"{dest_rel}/{name}"
        self._recreated = False  # a deleted destination directory is recreated once

    def _unknown(self, header: JobHeader, cause: str) -> OutcomeUnknown:
        self.ctx.poison(f"enqueue {self.job_hex}: {cause}")
        ticket = EnqueueTicket(
            job_id=bytes.fromhex(self.job_hex),
            envelope_digest=header.envelope_digest,
            state=self.dest_rel.split("/", 1)[0],
            path=self.rel_path,
        )
        return OutcomeUnknown(f"enqueue outcome unknown: {cause}", ticket)

    def run(self) -> JobHeader:
        if self.ctx.publication != "named":
            try:
                fd = linux.open_tmpfile(self.dest_fd, self.ctx.modes.file)
            except OSError as e:
                if _dir_deleted(self.dest_fd) and not self._recreated:
                    # The cached destination directory was removed (EPERM/ENOENT from
                    # O_TMPFILE): recreate it once, as layout.md asks of every put.
                    self._recreated = True
                    self.ctx.tree.forget(self.dest_rel)
                    try:
                        self.dest_fd = self.ctx.tree.ensure_dir(self.dest_rel)
                    except OSError as e2:
                        raise not_committed(e2, f"create {self.dest_rel}", job_id=self.job_hex) from e2
                    return self.run()
                if e.errno not in _TMPFILE_UNSUPPORTED:
                    raise not_committed(e, "create anonymous file", job_id=self.job_hex) from e
                self.ctx.publication = "named"
            else:
                try:
                    return self._via_tmpfile(fd)
                finally:
                    _close_quietly(fd)
        return self._via_named_temp(None)

    def _via_tmpfile(self, fd: int) -> JobHeader:
        try:
            self.ctx.new_file_mode(fd)
            header = self.writer(fd)
            st = linux.fstat(fd)
            if st.st_nlink != 0:
                raise NotCommitted("anonymous file unexpectedly has a name", ErrorKind.IO_FAILURE, job_id=self.job_hex)
            linux.fsync(fd)  # the content is durable before it gets a name
        except OSError as e:
            raise not_committed(e, "write job file", job_id=self.job_hex) from e
        try:
            form = linux.link_tmpfile(fd, self.dest_fd, self.name, prefer_proc=self.ctx.publication == "proc")
        except linux.TmpfileLinkUnsupported:
            self.ctx.publication = "named"
            return self._via_named_temp(fd)
        except OSError as e:
            if _linked_anyway(fd):
                form = self.ctx.publication  # the link happened although an error was reported
            elif e.errno == errno.EEXIST:
                raise NotCommitted(
                    f"job id collision at {self.rel_path}", ErrorKind.IDENTITY_COLLISION, job_id=self.job_hex
                ) from e
            else:
                if e.errno == errno.ENOENT:
                    self.ctx.tree.forget(self.dest_rel)  # deleted directory: recreate next time
                raise not_committed(e, f"link into {self.dest_rel}", job_id=self.job_hex) from e
        self.ctx.publication = form
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
            fd = linux.open_at(tmp_fd, tmp_name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, self.ctx.modes.file)
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
                ctx.tree.move_witnessed(tmp_fd, tmp_name, self.dest_fd, self.name, witness)
                published = True
            except Collision as e:
                raise NotCommitted(
                    f"job id collision at {self.rel_path}", ErrorKind.IDENTITY_COLLISION, job_id=self.job_hex
                ) from e
            except (SourceMissing, SourceChanged) as e:
                raise NotCommitted(f"temp file changed before publication: {e}", ErrorKind.IO_FAILURE, job_id=self.job_hex) from e
            except MoveFailed as e:
                raise NotCommitted(f"publish: {e}", kind_for_errno(e.errno), job_id=self.job_hex) from e
            except Indeterminate as e:
                published = True
                raise self._unknown(header, e.cause) from e
            return header
        finally:
            _close_quietly(fd)
            if not published:
                try:
                    linux.unlink_at(tmp_fd, tmp_name)
                except OSError:
                    pass


def _close_quietly(fd: int) -> None:
    """Close a job fd; its bytes were fsynced before publication, so a close error
    cannot change the outcome and must not mask it (a committed enqueue is no
    NotCommitted, and an OutcomeUnknown must keep its ticket)."""
    try:
        linux.close(fd)
    except OSError:
        pass


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


def _dir_deleted(dir_fd: int) -> bool:
    """True if ``dir_fd`` names a directory that was removed (st_nlink == 0)."""
    try:
        return linux.fstat(dir_fd).st_nlink == 0
    except OSError:
        return False
