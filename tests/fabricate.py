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


def plant_in_dead(q: Queue, dead_rel: str) -> dict[str, str]:
    """Plant, beside the dead job at ``dead_rel``, what a group member can put in ``dead/`` that is not a dead job.

    Each with a name the queue would accept if it were a file: a symlink and a FIFO bearing other jobs'
    authentic dead names (tagged for this bucket and shard), a file with a garbage name, and a file whose
    dead name carries a wrong tag. Returns {what: relative path}; none of them is a dead job.
    """
    rel, _, _ = dead_rel.rpartition("/")
    _, bucket_text, shard_text = rel.split("/")
    bucket, shard = int(bucket_text, 16), int(shard_text, 16)
    fmt = q.format

    def dead_file_name() -> str:
        for _ in range(10_000):  # a job of this shard: 1 in shard_count random ids
            job = os.urandom(16)
            if names.shard_of(fmt.queue_id, job, q.shard_count) == shard:
                jn = names.dead_name(job, 1, 1, 3, reason=1)
                return names.make_filename(fmt.queue_id, jn, shard=shard, bucket=bucket,
                                           lease_width_ns=fmt.lease_width_ns)  # fmt: skip
        raise AssertionError("no job id of this shard in 10,000 tries")

    planted = {"symlink": f"{rel}/{dead_file_name()}", "fifo": f"{rel}/{dead_file_name()}",
               "garbage": f"{rel}/not-a-job.txt"}  # fmt: skip
    os.symlink("/etc/passwd", os.path.join(q.path, planted["symlink"]))
    os.mkfifo(os.path.join(q.path, planted["fifo"]))
    Path(q.path, planted["garbage"]).write_bytes(b"garbage")
    bad_tag = dead_file_name()
    tag = bad_tag.rsplit(".k", 1)[1][:16]
    planted["bad tag"] = f"{rel}/{bad_tag.replace('.k' + tag, '.k' + ('0' if tag[0] != '0' else '1') + tag[1:])}"
    Path(q.path, planted["bad tag"]).write_bytes(Path(q.path, dead_rel).read_bytes())
    return planted
