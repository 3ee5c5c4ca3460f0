"""Fabricating large queues fast, for tests and benchmarks that need depth.

Job files are written directly (no fsync, no rename) with correct headers
and tagged names, so a 100,000-job queue takes seconds instead of the
minutes the durable enqueue path would need. Only for scratch queues.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from steadqd import Queue
from steadqd.fs import names
from steadqd.fs.records import build_header


def write_ready_jobs(q: Queue, n: int, payload: bytes = b"template payload") -> None:
    """``n`` valid ready jobs: one real enqueue, ``n - 1`` copies of its layout
    under fresh job ids, each with its own header and a name tagged for its shard."""
    fmt = q.format
    _, rel = q.enqueue_detailed(payload)
    template = Path(q.path, rel).read_bytes()
    ext_len = int.from_bytes(template[12:16], "big")
    ext = template[128 : 128 + ext_len]
    body = template[128 + ext_len :]
    digest = hashlib.sha256(body).digest()
    dir_fds = {s: os.open(os.path.join(q.path, "ready", names.shard_dir(s)), os.O_RDONLY) for s in range(q.shard_count)}
    try:
        for _ in range(n - 1):
            job = os.urandom(16)
            header = build_header(
                job_id=job,
                max_attempts=3,
                created_at_ns=1,
                extension=ext,
                payload_length=len(body),
                payload_digest=digest,
            )
            shard = names.shard_of(fmt.queue_id, job, fmt.shard_count)
            name = names.make_filename(
                fmt.queue_id, names.ready_name(job, 0, 0, 3), shard=shard, lease_width_ns=fmt.lease_width_ns
            )
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fds[shard])
            try:
                os.write(fd, header.encode() + ext + body)
            finally:
                os.close(fd)
    finally:
        for fd in dir_fds.values():
            os.close(fd)
