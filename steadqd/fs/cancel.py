"""Cancel on a filesystem queue: the job's current file becomes its dead file, reason ``cancelled``.

Why this is safe without any new protocol
    Every state move of SteadQ/1 is a ``renameat2(RENAME_NOREPLACE)`` of
    one exact source name. A cancel is one more such move: the file the job
    is now (ready, leased in place in ``ready/<S>/``, legacy leased, or
    delayed) is renamed straight to the dead name a bury of it would make
    (generation + 1, same attempt, reason :data:`DeadReason.CANCELLED`,
    terminal bucket of the wall floor). The holder's ack, retry, bury and
    renew rename the *same* source name, so exactly one of the two renames
    happens; the other finds the source gone (``ENOENT``): the worker's
    settle raises LeaseLost, the cancel looks again and reports where the
    job went. Nothing new appears in the tree: a dead object of a known
    grammar with a private-use reason (reasons.md: 0x8000-0xffff), which the
    reference drains around and its ``fsck`` checks like any other.

Who runs a cancelled job's process
    Nobody else: a dead job is never claimed. The worker holding the lease
    learns of it from the watch on the ready shards (its leased name moved
    away: :func:`was_cancelled` then finds the dead file this very lease
    became) or, at the latest, from its next renewal (LeaseLost), and kills
    the job's process group.
"""

from __future__ import annotations

import errno
import os

from steadqd.constants import Cancellation, CancelResult, DeadReason, State
from steadqd.errors import CorruptObject, ErrorKind, NotCommitted, OutcomeUnknown, SteadQError, kind_for_errno
from steadqd.fs import linux
from steadqd.fs.context import Context, not_committed
from steadqd.fs.json_records import DeadLocation, LeasedLocation, TransitionTicket
from steadqd.fs.lease import Lease
from steadqd.fs.names import (
    boot_dashed,
    dead_name,
    make_filename,
    next_generation,
    shard_of,
    state_dir,
    terminal_bucket,
)
from steadqd.fs.settle import _move_into
from steadqd.fs.tree import Collision, Indeterminate, MoveFailed, SourceChanged, SourceMissing
from steadqd.fs.verify import Envelope, check_name_matches, read_envelope
from steadqd.fs.views import JobObject, inspect_job

__all__ = ["cancel", "was_cancelled"]

# A job that moves between our look and our rename (a claim, a renewal, a promotion) is looked up again;
# each round follows one real move of the job, so a few dozen rounds is far more than a job makes meanwhile.
MAX_ROUNDS = 64
LIVE_STATES = ("ready", "leased", "delayed")


def cancel(ctx: Context, job_id: str) -> Cancellation:
    """Dead-letter ``job_id`` with reason ``cancelled`` wherever it is; say what happened.

    Raises SteadQError (not_found) for a job that has no object in the queue,
    NotCommitted if nothing changed for another reason, OutcomeUnknown (the
    handle poisoned) if the move happened but its barrier failed.
    """
    ctx.check_usable()
    for _ in range(MAX_ROUNDS):
        objects = inspect_job(ctx, job_id)
        live = [o for o in objects if o.state in LIVE_STATES]
        if not live:
            return _settled(objects, job_id)
        current = max(live, key=lambda o: o.generation)
        try:
            _move_to_dead(ctx, current)
        except SourceMissing:
            continue  # it moved meanwhile (claimed, renewed, settled, promoted): look again
        return Cancellation(CancelResult.CANCELLED, current.state)
    raise NotCommitted(f"cancel of job {job_id}: it kept moving; try again", ErrorKind.NOT_COMMITTED)


def _settled(objects: list[JobObject], job_id: str) -> Cancellation:
    """No live object: say how the job ended, or that there is no such job."""
    receipts = [o for o in objects if o.state == "receipt"]
    if receipts:
        return Cancellation(CancelResult.ALREADY_ACKED, "receipt")
    dead = [o for o in objects if o.state == "dead"]
    if dead:
        last = max(dead, key=lambda o: o.generation)
        return Cancellation(CancelResult.ALREADY_DEAD, "dead", int(str(last.details["reason"])))
    raise SteadQError(f"not found: job {job_id}", ErrorKind.NOT_FOUND)


def _open_source(ctx: Context, obj: JobObject) -> tuple[int, str, int, Envelope]:
    """(directory fd, name, file fd, envelope) of the object, checked against its name."""
    dir_rel, name = obj.path.rsplit("/", 1)
    try:
        dir_fd = ctx.tree.dir(dir_rel)
    except OSError as e:
        if e.errno == errno.ENOENT:  # recovery removed the emptied directory: the job moved
            raise SourceMissing(name) from e
        raise not_committed(e, f"open {dir_rel}") from e
    try:
        # O_NONBLOCK: a FIFO planted at the name must not hang the cancel; read_envelope refuses it.
        fd = linux.open_at(dir_fd, name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENOENT:  # it moved since we listed it
            raise SourceMissing(name) from e
        raise not_committed(e, f"open {obj.path}") from e
    try:
        env = read_envelope(fd, ctx.fmt.max_payload_length)
        check_name_matches(env.header, obj.name)
    except CorruptObject as e:
        linux.close(fd)
        raise NotCommitted(
            f"cancel refused: {obj.path} is corrupt ({e.message}); `steadq fsck --repair` quarantines it",
            ErrorKind.QUEUE_CORRUPT,
        ) from e
    except OSError as e:
        linux.close(fd)
        raise not_committed(e, f"read {obj.path}") from e
    return dir_fd, name, fd, env


def _move_to_dead(ctx: Context, obj: JobObject) -> None:
    """The witnessed move of the object to the dead name a bury of it would produce."""
    fmt = ctx.fmt
    jn = obj.name
    shard = shard_of(fmt.queue_id, jn.job_id, fmt.shard_count)
    bucket = terminal_bucket(ctx.wall_floor(), fmt.terminal_width_ns)
    target = dead_name(
        jn.job_id, next_generation(jn.generation), jn.attempt, jn.max_attempts, reason=DeadReason.CANCELLED
    )
    target_file = make_filename(fmt.queue_id, target, shard=shard, bucket=bucket, lease_width_ns=fmt.lease_width_ns)
    dest_rel = state_dir(State.DEAD, shard, bucket)
    try:
        dest_fd = ctx.tree.ensure_dir(dest_rel)
    except OSError as e:
        raise not_committed(e, f"create {dest_rel}") from e
    dir_fd, name, fd, env = _open_source(ctx, obj)
    try:
        _move_into(ctx, _Src(dir_fd, name, env), dest_rel, dest_fd, target_file)  # type: ignore[arg-type]
    except Collision as e:
        raise NotCommitted(f"cancel: destination {dest_rel}/{target_file} exists", ErrorKind.QUEUE_CORRUPT) from e
    except SourceChanged as e:
        ctx.poison(f"cancel of {jn.job_id.hex()}: {e}")
        raise NotCommitted(f"cancel: {obj.path} changed: {e}", ErrorKind.QUEUE_CORRUPT) from e
    except MoveFailed as e:
        raise NotCommitted(f"cancel: {e}", kind_for_errno(e.errno)) from e
    except Indeterminate as e:
        ctx.poison(f"cancel of {jn.job_id.hex()}: {e.cause}")
        raise OutcomeUnknown(
            f"cancel of job {jn.job_id.hex()} outcome unknown: {e.cause}; `steadq show` says where it is",
            _ticket(ctx, obj, env, e.phase, DeadLocation(bucket, DeadReason.CANCELLED)),
        ) from e
    finally:
        linux.close(fd)


class _Src:
    """What :func:`steadqd.fs.settle._move_into` reads of a source: its directory, name and witness."""

    def __init__(self, dir_fd: int, name: str, env: Envelope) -> None:
        self.dir_fd = dir_fd
        self.name = name
        self.witness = env.witness


def _ticket(ctx: Context, obj: JobObject, env: Envelope, phase: str, dest: DeadLocation) -> TransitionTicket | None:
    """A running job's cancel is its bury, so its ticket is a bury's (``steadq resolve`` reads it);
    a ready or delayed job's move has no ticket operation: ``steadq show`` finds it."""
    jn = obj.name
    if obj.state != State.LEASED.value or jn.lease_token is None or jn.boot_id is None:
        return None
    assert jn.boottime_deadline is not None and jn.wall_deadline is not None
    return TransitionTicket(
        queue_id=ctx.queue_id,
        operation="bury",
        phase=phase,
        job_id=jn.job_id,
        generation=jn.generation,
        attempt=jn.attempt,
        maximum_attempts=jn.max_attempts,
        lease_token=jn.lease_token,
        envelope_digest=env.header.envelope_digest,
        payload_length=env.header.payload_length,
        source=LeasedLocation(boot_dashed(jn.boot_id), jn.boottime_deadline, jn.wall_deadline),
        destination=dest,
    )


def was_cancelled(ctx: Context, lease: Lease) -> bool:
    """Did a cancel make this very lease's file dead? (a dead object of the next generation, reason cancelled)

    The holder asks this when its leased name vanished or its renewal found the
    lease gone: only a cancel kills the running command; any other loss (recovery
    reaped an expired lease) keeps today's behaviour."""
    dir_rel, name = lease.path.rsplit("/", 1)
    try:
        linux.stat_at(ctx.tree.dir(dir_rel), name)
        return False  # the lease's file is still there: nothing happened to it (the common case: one stat)
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise
    want = next_generation(lease.generation)
    return any(
        o.state == "dead" and o.generation == want and o.details.get("reason") == DeadReason.CANCELLED
        for o in inspect_job(ctx, lease.job_id)
    )
