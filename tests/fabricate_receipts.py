"""Fabricating a receipt backlog fast, for recovery tests and benchmarks.

A backlog of full (uncompacted) receipts is what makes a recovery pass slow,
and acknowledging a million jobs through the durable path takes hours. These
receipts are written directly (no fsync, no rename), each with its own
header, a name tagged for its bucket and shard, and the template job's
extension and payload, so every one verifies and compacts like a real one.
Only for scratch queues.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from steadqd import Queue
from steadqd.fs import names
from steadqd.fs.records import build_header

# What an acknowledged first attempt of a max-3 job is named with: claim made generation 1.
_GENERATION = 2
_ATTEMPT = 1
_MAX_ATTEMPTS = 3


def write_receipts(q: Queue, n: int, *, bucket: int | None = None, payload: bytes = b"template payload") -> int:
    """``n`` full receipts in ``receipts/<bucket>/`` (default: the current
    terminal bucket), spread over the shards; returns the bucket used."""
    fmt = q.format
    if bucket is None:
        bucket = names.terminal_bucket(q.wall_floor_ns(), fmt.terminal_width_ns)
    _, rel = q.enqueue_detailed(payload)
    template = Path(q.path, rel).read_bytes()
    os.unlink(os.path.join(q.path, rel))  # only its layout was needed
    ext_len = int.from_bytes(template[12:16], "big")
    ext = template[128 : 128 + ext_len]
    body = template[128 + ext_len :]
    digest = hashlib.sha256(body).digest()
    top = os.path.join(q.path, "receipts", names.bucket_dir(bucket))
    dir_fds: dict[int, int] = {}
    try:
        for s in range(fmt.shard_count):
            path = os.path.join(top, names.shard_dir(s))
            os.makedirs(path, mode=0o700, exist_ok=True)
            dir_fds[s] = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        for _ in range(n):
            job = os.urandom(16)
            header = build_header(
                job_id=job,
                max_attempts=_MAX_ATTEMPTS,
                created_at_ns=1,
                extension=ext,
                payload_length=len(body),
                payload_digest=digest,
            )
            shard = names.shard_of(fmt.queue_id, job, fmt.shard_count)
            name = names.make_filename(
                fmt.queue_id,
                names.receipt_name(job, _GENERATION, _ATTEMPT, _MAX_ATTEMPTS, lease_token=os.urandom(16)),
                shard=shard,
                bucket=bucket,
                lease_width_ns=fmt.lease_width_ns,
            )
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fds[shard])
            try:
                os.write(fd, header.encode() + ext + body)
            finally:
                os.close(fd)
    finally:
        for fd in dir_fds.values():
            os.close(fd)
    return bucket
