"""Phase 2, promote delayed (recovery.md): due delayed jobs become ready.

Whether a bucket is due is a wall-clock decision, made against the
stabilized wall floor (clocks.md) so that it never goes backwards: without a
wall floor the phase does nothing. Later buckets are never opened, so a
corrupt delayed job is quarantined (0x0001, as specified) only once it is due.

The reference promotes a bucket only when its end (``B × width``) has passed,
so a job asked for in 2 s runs up to a whole width (10 s) late. Here the
current bucket, ``due + 1``, is looked into as well, and each of its jobs
whose own ``not_before`` has passed is promoted: never before the instant the
producer asked for, and the result is an ordinary ready job to the reference.
Its other entries are left unopened, as later buckets are.
"""

from __future__ import annotations

from steadqd.constants import DELAYED_DIR, State
from steadqd.errors import SteadQError
from steadqd.fs.names import (
    make_filename,
    next_generation,
    parse_bucket_dir,
    ready_name,
    state_dir,
)
from steadqd.fs.recovery.buckets import prune_delayed_buckets
from steadqd.fs.recovery.objects import move, valid
from steadqd.fs.recovery.state import Pass
from steadqd.fs.recovery.walk import NOT_BUCKET, Level, leaf_job, shard_level, walk


def promote_delayed(p: Pass) -> None:
    if p.wall is None:
        return
    due = p.wall // p.fmt.delayed_width_ns
    levels = (Level(parse_bucket_dir, NOT_BUCKET, lambda v: v[0] <= due + 1), shard_level(p))
    for (bucket, shard), fd, rel, raw in walk(p, DELAYED_DIR, levels):
        _delayed_entry(p, fd, rel, raw, bucket, shard, own_due=p.wall if bucket > due else None)
    prune_delayed_buckets(p, due)  # the tree is done: empty buckets well in the past go


def _delayed_entry(p: Pass, dir_fd: int, rel: str, raw: bytes, bucket: int, shard: int, *, own_due: int | None) -> None:
    """``own_due``: the bucket is not due yet, only jobs whose not_before is at most this instant are."""
    leaf = leaf_job(p, raw, rel, State.DELAYED)
    if leaf is None:
        return
    name, job = leaf
    if job is None:
        return  # not a delayed name: skipped silently (recovery.md)
    if own_due is not None and (job.not_before is None or job.not_before > own_due):
        return  # in the current bucket, not due by its own not_before: left unopened
    if not valid(p, dir_fd, rel, name, job, "promote_validate", shard=shard, bucket=bucket):
        return
    try:
        generation = next_generation(job.generation)
    except SteadQError as e:
        p.error("promote_state_exhausted", f"{rel}/{name}: {e}")
        return
    fmt = p.fmt
    target = ready_name(job.job_id, generation, job.attempt, job.max_attempts)
    target_file = make_filename(fmt.queue_id, target, shard=shard, lease_width_ns=fmt.lease_width_ns)
    dst_rel = state_dir(State.READY, shard)
    if move(p, "promote", dir_fd, rel, name, dst_rel, target_file):
        p.report.delayed_promoted += 1
