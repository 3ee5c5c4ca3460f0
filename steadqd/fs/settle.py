"""Settling a lease: acknowledge, retry (now or later) and bury.

Each is one exact-source move of the leased file: into ``receipts/`` (ack),
back to ``ready/`` or into ``delayed/`` (retry), or into ``dead/`` (bury),
with the barriers of protocol.md. Ack re-hashes the payload first: a job is
never acknowledged on the strength of bytes that no longer verify.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable
from typing import Any

from steadqd.backoff import RetryPolicy, retry_delay_ms
from steadqd.constants import (
    I63_MAX,
    U16_MAX,
    U64_MAX,
    AckResult,
    DeadReason,
    State,
)
from steadqd.errors import (
    CorruptObject,
    ErrorKind,
    InvalidInput,
    LeaseLost,
    NotCommitted,
    QueueCorrupt,
    SteadQError,
    kind_for_errno,
)
from steadqd.fs import linux
from steadqd.fs.clock import checked_seconds_ns
from steadqd.fs.compiled import bridge
from steadqd.fs.context import Context, not_committed
from steadqd.fs.json_records import DeadLocation, DelayedLocation, Location, ReadyLocation, ReceiptLocation
from steadqd.fs.lease import Lease, Source, checked_path, forget_settled, indeterminate, validate_source
from steadqd.fs.names import (
    JobName,
    dead_name,
    delayed_bucket,
    delayed_name,
    make_filename,
    next_generation,
    ready_name,
    receipt_fields_plain,
    receipt_filename,
    receipt_name,
    shard_of,
    state_dir,
    terminal_bucket,
)
from steadqd.fs.receipt import ExpectedReceipt, verify_receipt
from steadqd.fs.tree import Collision, DestinationGone, Indeterminate, MoveFailed, SourceChanged, SourceMissing
from steadqd.fs.verify import verified_head, verify_payload

# Globals: an enum member read through its class is slow on 3.11 (names._READY).
_RECEIPT, _ACKED = State.RECEIPT, AckResult.ACKED


def _shard(ctx: Context, lease: Lease) -> int:
    return shard_of(ctx.fmt.queue_id, lease.job_id_bytes, ctx.fmt.shard_count)


def _move(
    ctx: Context,
    lease: Lease,
    src: Source,
    dest_rel: str,
    dest_name: str,
    operation: str,
    destination: Location | Callable[[], Location],
    on_collision: Callable[[], SteadQError] | None = None,
) -> None:
    """The witnessed move shared by every settlement, with its outcome mapping.

    ``destination`` (or a function making it: the ack's, so that an ack that
    commits builds none) is only needed to describe an indeterminate outcome.
    """
    try:
        dest_fd = ctx.tree.ensure_dir(dest_rel)
    except OSError as e:
        raise not_committed(e, f"create {dest_rel}") from e
    try:
        _move_into(ctx, src, dest_rel, dest_fd, dest_name)
    except SourceMissing as e:
        raise LeaseLost(f"lease of job {lease.job_id} is gone") from e
    except Collision as e:
        if on_collision is not None:
            raise on_collision() from e
        raise NotCommitted(f"{operation}: destination {dest_rel}/{dest_name} exists", ErrorKind.QUEUE_CORRUPT) from e
    except SourceChanged as e:
        ctx.poison(f"{operation} of {lease.job_id}: {e}")
        raise NotCommitted(f"{operation}: leased file changed: {e}", ErrorKind.QUEUE_CORRUPT) from e
    except MoveFailed as e:
        raise NotCommitted(f"{operation}: {e}", kind_for_errno(e.errno)) from e  # ENOSPC -> ResourceExhausted
    except Indeterminate as e:
        where = destination() if callable(destination) else destination
        raise indeterminate(ctx, lease, operation, e, where) from e


def _move_into(ctx: Context, src: Source, dest_rel: str, dest_fd: int, dest_name: str) -> None:
    """The witnessed move; once more, into the directory made again, if recovery
    removed it since it was opened (an empty bucket: the lease is not lost)."""
    try:
        ctx.tree.move_witnessed(src.dir_fd, src.name, dest_fd, dest_name, src.witness, force=True)
    except DestinationGone:
        try:
            dest_fd = ctx.tree.refresh(dest_rel)
        except OSError as e:
            raise MoveFailed(e.errno, f"create {dest_rel}") from e
        ctx.tree.move_witnessed(src.dir_fd, src.name, dest_fd, dest_name, src.witness, force=True)


def ack(ctx: Context, lease: Lease) -> AckResult:
    """Acknowledge: the leased file becomes this lease's receipt."""
    if ctx.poisoned is not None:  # check_usable's test, without its call
        ctx.check_usable()
    fmt = ctx.fmt
    wall = ctx.wall_floor()
    bucket = terminal_bucket(wall, fmt.terminal_width_ns)
    job = lease.job_id_bytes  # once: the shard and the receipt's name
    shard = shard_of(fmt.queue_id, job, fmt.shard_count)
    core = ctx.c_core
    if core is not None:
        g = lease.generation
        # next_generation's fast test, then receipt_filename's (receipt_fields_plain) on the receipt's
        # generation: names that cannot fail, so the C core, which makes the receipt's name itself,
        # raises nothing the Python would have raised first.
        if (
            type(g) is int
            and 0 <= g < U64_MAX
            and receipt_fields_plain(job, g + 1, lease.attempt, lease.max_attempts, lease.token)
        ):
            return _ack_fast(ctx, lease, core, job, wall, shard, bucket)
    return _ack_named(ctx, lease, job, wall, shard, bucket)


def _ack_named(ctx: Context, lease: Lease, job: bytes, wall: int, shard: int, bucket: int) -> AckResult:
    """The receipt's name and directory, then the ack from validate_source on."""
    fmt = ctx.fmt
    target_file = receipt_filename(  # make_filename of _receipt_of(lease), without building the JobName
        fmt.queue_id,
        job,
        next_generation(lease.generation),
        lease.attempt,
        lease.max_attempts,
        lease_token=lease.token,
        shard=shard,
        bucket=bucket,
        lease_width_ns=fmt.lease_width_ns,
    )
    return _ack_from_source(ctx, lease, job, wall, shard, bucket, _receipt_rel(shard, bucket), target_file)


@functools.lru_cache(maxsize=4096)
def _receipt_rel(shard: int, bucket: int) -> str:
    """state_dir(RECEIPT, shard, bucket), memoised: every ack asks it, a bucket lasts hours. (A hit is
    ~250 instructions fewer than a dict memo in a Python function: the lookup runs in C.)"""
    return state_dir(_RECEIPT, shard, bucket)


def _ack_fast(ctx: Context, lease: Lease, core: Any, job: bytes, wall: int, shard: int, bucket: int) -> AckResult:
    """The ack through the C core (bridge.Core.ack), the Python's pure checks first.

    The core makes the receipt's name, opens, checks, hashes (unless its first read is byte for byte
    the one verify.py's memo holds as verified, as the Python skips it), moves and syncs; at its first
    deviation (a check fails, a syscall fails, a payload past the first read) _ack_named runs from
    the start with the core's syscalls replayed, so every outcome, error and later syscall is the
    Python's. In Queue.batch() the core stops after the rename and its checks, and the tree makes
    (postpones) the barriers as move_witnessed does (Tree.finish_move). The lease directory and the
    receipt directory must be open in the tree already (every ack after the first into a bucket
    shard): otherwise, and for a Lease made by hand with fields no file can match, the Python does it all.
    """
    facts, _ = checked_path(ctx, lease, True, job, shard)
    tree = ctx.tree
    src_fd, dst_fd = tree.cached_fd_pair(facts.dir_rel, _receipt_rel(shard, bucket))
    if src_fd is None or dst_fd is None:
        return _ack_named(ctx, lease, job, wall, shard, bucket)
    ids = tree.known_ids(src_fd, dst_fd)
    try:
        known = verified_head(lease.dev, lease.ino)  # verify.py's memo, which the Python ack would consult
        stage, a = core.ack(lease, job, src_fd, facts.parts[-1], dst_fd, shard, bucket, ids, not tree.batching, known)
    except (OverflowError, TypeError):  # a lease field no file has (before any syscall)
        return _ack_named(ctx, lease, job, wall, shard, bucket)
    if stage == bridge.MOVED_BARRIER_LEFT:
        # In Queue.batch(): renamed and checked; the rest of move_witnessed (the postponed barriers)
        # and its outcome are _move's, then Source.close.
        try:
            tree.finish_move(src_fd, dst_fd, force=True)
        except Indeterminate as e:
            raise indeterminate(ctx, lease, "acknowledge", e, ReceiptLocation(bucket)) from e
        finally:
            linux.close_quietly(a.fd)  # Source.close: a close error cannot undo the committed move
        forget_settled(ctx, lease)
        return _ACKED
    if stage != bridge.ACKED:
        with bridge.replaying(a, skip_open=False):
            return _ack_named(ctx, lease, job, wall, shard, bucket)
    if ids[0] is None or ids[1] is None:  # learn_ids keeps nothing when the tree knew both (most acks)
        tree.learn_ids(src_fd, dst_fd, a.stats, ids)
    linux.close_quietly(a.fd)  # Source.close: a close error cannot undo the committed move
    forget_settled(ctx, lease)
    return _ACKED


def _ack_from_source(
    ctx: Context, lease: Lease, job: bytes, wall: int, shard: int, bucket: int, dest_rel: str, target_file: str
) -> AckResult:
    """The ack from validate_source on: the specification the C core mirrors (and replays into)."""
    try:
        src = validate_source(ctx, lease, moving=True, job=job)
    except LeaseLost:
        return _probe_or_lost(ctx, lease, wall, shard)
    try:
        try:
            verify_payload(src.fd, src.envelope)
        except CorruptObject as e:
            ctx.poison(f"ack of {lease.job_id}: {e.message}")
            raise NotCommitted(f"ack refused: {e.message}", e.kind) from e
        except OSError as e:
            raise not_committed(e, "read payload") from e
        try:
            _move(
                ctx,
                lease,
                src,
                dest_rel,
                target_file,
                "acknowledge",
                lambda: ReceiptLocation(bucket),
                on_collision=lambda: _receipt_collision(ctx, lease, dest_rel, target_file, bucket, shard),
            )
        except LeaseLost:
            return _probe_or_lost(ctx, lease, wall, shard)
    finally:
        src.close()
    forget_settled(ctx, lease)
    return _ACKED


def _receipt_of(lease: Lease) -> JobName:
    """The receipt name acknowledging ``lease`` (the name ack writes and the duplicate-ack probe looks for)."""
    return receipt_name(
        lease.job_id_bytes,
        next_generation(lease.generation),
        lease.attempt,
        lease.max_attempts,
        lease_token=lease.token,
    )


def _expected_receipt(lease: Lease) -> ExpectedReceipt:
    return ExpectedReceipt(
        generation=next_generation(lease.generation),
        attempt=lease.attempt,
        max_attempts=lease.max_attempts,
        lease_token=lease.token,
        envelope_digest=lease.envelope_digest,
        payload_length=lease.payload_length,
    )


def _receipt_collision(ctx: Context, lease: Lease, dest_rel: str, name: str, bucket: int, shard: int) -> QueueCorrupt:
    """The receipt path is taken while our lease still exists: corruption either way."""
    try:
        ok = _receipt_matches_in(ctx, ctx.tree.dir(dest_rel), name, bucket, shard, lease)
    except OSError:
        ok = False
    why = "source lease and receipt both exist" if ok else "conflicting object at the receipt path"
    ctx.poison(f"ack of {lease.job_id}: {why}")
    return QueueCorrupt(why)


def _probe_or_lost(ctx: Context, lease: Lease, wall: int, shard: int) -> AckResult:
    """Duplicate-ack probe: is there an authentic receipt for this very lease?"""
    fmt = ctx.fmt
    now_b = terminal_bucket(wall, fmt.terminal_width_ns)
    r = -(-ctx.options.receipt_retention_ns // fmt.terminal_width_ns)
    name = _receipt_of(lease)
    for b in range(now_b, max(0, now_b - (r + 2)) - 1, -1):
        rel = state_dir(State.RECEIPT, shard, b)
        filename = make_filename(fmt.queue_id, name, shard=shard, bucket=b, lease_width_ns=fmt.lease_width_ns)
        try:
            dir_fd = linux.open_beneath(ctx.root_fd, rel, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                continue
            raise not_committed(e, f"open {rel}") from e
        try:
            if _receipt_matches_in(ctx, dir_fd, filename, b, shard, lease):
                return AckResult.ALREADY_ACKED
        finally:
            linux.close(dir_fd)
    raise LeaseLost(f"lease of job {lease.job_id} is gone and no receipt for it exists")


def _receipt_matches_in(ctx: Context, dir_fd: int, filename: str, bucket: int, shard: int, lease: Lease) -> bool:
    try:
        # O_NONBLOCK: a FIFO planted at the receipt's name must not hang the ack; verify_receipt refuses it.
        fd = linux.open_at(dir_fd, filename, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        verify_receipt(ctx.fmt, fd, filename, bucket, shard, _expected_receipt(lease))
        return True
    except (SteadQError, OSError):
        return False
    finally:
        linux.close(fd)


def retry(ctx: Context, lease: Lease, *, delay: float | None = None, policy: RetryPolicy | None = None) -> str:
    """Return the job to the queue now or after a delay; returns the new state.

    A lease with no attempts left is buried (reason 0x0004) instead, so a
    retry can never create a job that cannot be claimed.
    """
    ctx.check_usable()
    if delay is not None and policy is not None:
        raise InvalidInput("give either delay or policy, not both")
    wall = ctx.wall_floor()
    if lease.attempt >= lease.max_attempts:
        _bury(ctx, lease, DeadReason.ATTEMPTS_EXHAUSTED, wall)
        return "dead"
    delay_ns = 0
    if policy is not None:
        delay_ns = retry_delay_ms(policy, ctx.queue_id, lease.job_id_bytes, lease.attempt) * 1_000_000
    elif delay is not None:
        delay_ns = checked_seconds_ns("retry delay", delay)
    not_before = wall + delay_ns
    if not_before > I63_MAX:
        raise InvalidInput("retry deadline exceeds 2^63-1 ns")
    fmt = ctx.fmt
    shard = _shard(ctx, lease)
    generation = next_generation(lease.generation)
    job = lease.job_id_bytes
    destination: ReadyLocation | DelayedLocation
    if not_before <= wall:
        target = ready_name(job, generation, lease.attempt, lease.max_attempts)
        dest_rel = state_dir(State.READY, shard)
        target_file = make_filename(fmt.queue_id, target, shard=shard, lease_width_ns=fmt.lease_width_ns)
        operation, destination, state = "retry_now", ReadyLocation(), "ready"
    else:
        bucket = delayed_bucket(not_before, fmt.delayed_width_ns)
        target = delayed_name(job, generation, lease.attempt, lease.max_attempts, not_before=not_before)
        dest_rel = state_dir(State.DELAYED, shard, bucket)
        target_file = make_filename(fmt.queue_id, target, shard=shard, bucket=bucket, lease_width_ns=fmt.lease_width_ns)
        operation, destination, state = "retry_later", DelayedLocation(not_before), "delayed"
    src = validate_source(ctx, lease, moving=True)
    try:
        _move(ctx, lease, src, dest_rel, target_file, operation, destination)
    finally:
        src.close()
    return state


def bury(ctx: Context, lease: Lease, reason: int = DeadReason.CONSUMER_REJECTED) -> None:
    """Dead-letter the job with a u16 reason (application codes allowed)."""
    ctx.check_usable()
    if isinstance(reason, bool) or not isinstance(reason, int) or not 0 <= reason <= U16_MAX:
        raise InvalidInput(f"bury reason must be an integer in 0..65535, got {reason!r}")
    _bury(ctx, lease, reason, ctx.wall_floor())


def _bury(ctx: Context, lease: Lease, reason: int, wall: int) -> None:
    fmt = ctx.fmt
    shard = _shard(ctx, lease)
    bucket = terminal_bucket(wall, fmt.terminal_width_ns)
    target = dead_name(
        lease.job_id_bytes, next_generation(lease.generation), lease.attempt, lease.max_attempts, reason=int(reason)
    )
    target_file = make_filename(fmt.queue_id, target, shard=shard, bucket=bucket, lease_width_ns=fmt.lease_width_ns)
    dest_rel = state_dir(State.DEAD, shard, bucket)
    src = validate_source(ctx, lease, moving=True)
    try:
        _move(ctx, lease, src, dest_rel, target_file, "bury", DeadLocation(bucket, int(reason)))
    finally:
        src.close()
