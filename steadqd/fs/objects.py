"""One job or FORMAT file read directly: ``verify FILE``, ``format-dump``, a worker's payload fd.

The transitions find objects by name inside a queue and authenticate the
name; these tools are handed a file (an export, a copy, a leased file) and
judge only its bytes. Files are streamed, never read whole, so a huge payload
costs no memory.

Errors are the contract's: :class:`~steadqd.errors.QueueCorrupt` when the
file is a job or FORMAT file that fails a check (its message says which),
:class:`~steadqd.errors.UnsupportedFormat` when it is neither, and a plain
``OSError`` when it cannot be read.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from typing import TypeVar

from steadqd.constants import FORMAT_MAGIC, FORMAT_SIZE, HEADER_SIZE, JOB_MAGIC
from steadqd.errors import QueueCorrupt, SteadQError, UnsupportedFormat
from steadqd.fs.context import Context
from steadqd.fs.lease import Lease
from steadqd.fs.records import FormatRecord, JobHeader, envelope_digest
from steadqd.fs.verify import read_envelope

__all__ = ["dump_file", "open_leased", "verify_file"]

_CHUNK = 1 << 20
R = TypeVar("R")


def _open_prefix(path: str) -> tuple[int, bytes, int]:
    """(fd, the first FORMAT_SIZE bytes, size): enough to tell a job header from a FORMAT record."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO must not block verify/dump
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        return fd, os.pread(fd, FORMAT_SIZE, 0), st.st_size
    except BaseException:
        os.close(fd)
        raise


def _decoded(decode: Callable[[bytes], R], data: bytes) -> R:
    """A record decoder's verdict as corruption, whatever its error class."""
    try:
        return decode(data)
    except SteadQError as e:
        raise QueueCorrupt(e.message) from e


def verify_file(path: str, *, deep: bool = False) -> Iterator[tuple[str, object]]:
    """Check a job or FORMAT file; yields each fact (name, value) as soon as it is established.

    A job file: its header, exact size and envelope digest, and with ``deep``
    its payload digest. A FORMAT file: its record. The facts come before the
    check that may fail, so a caller can show how far the file got.
    """
    fd, prefix, size = _open_prefix(path)
    try:
        if size >= HEADER_SIZE and prefix.startswith(JOB_MAGIC):
            yield from _verify_job(fd, prefix[:HEADER_SIZE], size, deep)
        elif size == FORMAT_SIZE and prefix.startswith(FORMAT_MAGIC):
            f = _decoded(FormatRecord.decode, prefix)
            yield "queue_id", f.queue_id.hex()
            yield "shard_count", f.shard_count
        else:
            raise UnsupportedFormat(f"{path} is neither a job file nor a FORMAT file")
    finally:
        os.close(fd)


def _verify_job(fd: int, header: bytes, size: int, deep: bool) -> Iterator[tuple[str, object]]:
    h = _decoded(JobHeader.decode, header)
    yield "job_id", h.job_id.hex()
    yield "payload_length", h.payload_length
    yield "maximum_attempts", h.max_attempts
    if size != h.file_size:
        raise QueueCorrupt(f"expected {h.file_size} bytes, got {size}")
    ext = os.pread(fd, h.extension_length, HEADER_SIZE) if h.extension_length else b""
    if envelope_digest(header, ext) != h.envelope_digest:
        raise QueueCorrupt("envelope digest mismatch")
    yield "envelope_digest", "verified"
    if not deep:
        return
    digest = hashlib.sha256()
    pos, end = HEADER_SIZE + h.extension_length, h.file_size
    while pos < end:
        chunk = os.pread(fd, min(_CHUNK, end - pos), pos)
        if not chunk:
            break
        digest.update(chunk)
        pos += len(chunk)
    if digest.digest() != h.payload_digest:
        raise QueueCorrupt("payload digest mismatch")
    yield "payload_digest", "verified"


def dump_file(path: str) -> dict[str, object]:
    """The header fields of a job file or the record of a FORMAT file, in the record's order.

    Nothing beyond decoding is verified (``verify_file`` does that), so a
    damaged job's fields can still be read.
    """
    fd, prefix, size = _open_prefix(path)
    os.close(fd)
    if prefix.startswith(JOB_MAGIC):
        h = _decoded(JobHeader.decode, prefix[:HEADER_SIZE])
        return {
            "type": "job",
            "job_id": h.job_id.hex(),
            "payload_length": h.payload_length,
            "extension_header_length": h.extension_length,
            "maximum_attempts": h.max_attempts,
            "payload_digest": h.payload_digest.hex(),
            "envelope_digest": h.envelope_digest.hex(),
        }
    if prefix.startswith(FORMAT_MAGIC):
        if size != FORMAT_SIZE:
            raise QueueCorrupt(f"FORMAT: size {size}, expected {FORMAT_SIZE}")
        f = _decoded(FormatRecord.decode, prefix)
        return {
            "type": "format",
            "queue_id": f.queue_id.hex(),
            "shard_count": f.shard_count,
            "lease_bucket_width_ns": f.lease_width_ns,
            "delayed_bucket_width_ns": f.delayed_width_ns,
            "terminal_bucket_width_ns": f.terminal_width_ns,
            "max_payload_length": f.max_payload_length,
        }
    raise UnsupportedFormat(f"{path} is neither a job file nor a FORMAT file")


def open_leased(ctx: Context, lease: Lease) -> tuple[int, int]:
    """An fd of exactly the leased inode and its payload offset; the caller closes the fd.

    Why an fd and not a path: renewals rename the leased file, an open fd
    stays valid across them, and checking (dev, ino) against the lease proves
    it is the file that was claimed, not a replacement.
    """
    fd = os.open(os.path.join(ctx.path, lease.path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (lease.dev, lease.ino):
            raise FileNotFoundError(errno.ENOENT, "leased file was replaced", lease.path)
        env = read_envelope(fd, ctx.fmt.max_payload_length, st)
        return fd, env.payload_offset
    except BaseException:
        os.close(fd)
        raise
