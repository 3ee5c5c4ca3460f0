"""The public queue handle.

``Queue`` wires the protocol modules together (publish, claim, lease,
settle) and adds what a caller expects of a handle: a context manager,
blocking lease with inotify wake-ups, batches with one barrier, payload
reads verified against their digest, and ``inspect``. It holds no queue
state of its own: the tree is the whole truth.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

from steadqd.backoff import RetryPolicy
from steadqd.constants import (
    DEFAULT_MAX_CLOCK_SKEW_NS,
    DEFAULT_RECEIPT_RETENTION_NS,
    DEFAULT_TEMP_TTL_NS,
    MAX_PAYLOAD_LENGTH,
    NS_PER_SECOND,
    AckResult,
    Cancellation,
    QuarantineReason,
    State,
)
from steadqd.errors import (
    CorruptObject,
    ErrorKind,
    InvalidInput,
    NotCommitted,
    OutcomeUnknown,
    QueueCorrupt,
    SteadQError,
)
from steadqd.fs import linux
from steadqd.fs.admin import (
    DeadJob,
    QuarantinedObject,
    export_dead,
    export_quarantine,
    find_dead,
    find_quarantined,
    inspect_quarantine,
    list_dead,
    list_quarantine,
    remove_dead,
    remove_quarantine,
    requeue_dead,
)
from steadqd.fs.cancel import cancel, was_cancelled
from steadqd.fs.cbor import decode_extension
from steadqd.fs.claim import ScanReport, claim
from steadqd.fs.clock import checked_seconds_ns, trusted_wall
from steadqd.fs.compiled import bridge
from steadqd.fs.context import Context, not_committed
from steadqd.fs.control import clear_pause, read_pause, write_pause
from steadqd.fs.delayed_watch import DelayedWatch
from steadqd.fs.fsck import FsckResult, fsck
from steadqd.fs.guards import Validated, guarded, mutation, validated_source
from steadqd.fs.json_records import TransitionTicket
from steadqd.fs.layout import OpenOptions, QueueConfig, init_queue, open_queue_root
from steadqd.fs.lease import Lease, Source, core_payload, extension_of, lease_duration_ns, plain_duration_ns, renew
from steadqd.fs.names import JobName, parse_job_id
from steadqd.fs.objects import open_leased
from steadqd.fs.publish import Payload, enqueue, enqueue_many
from steadqd.fs.quarantine import quarantine
from steadqd.fs.ready_watch import ReadyWatch
from steadqd.fs.records import Extension, FormatRecord
from steadqd.fs.recovery import RecoveryReport, run_recovery
from steadqd.fs.resolve import ResolveResult, resolve, ticket_paths
from steadqd.fs.settle import ack, bury, retry
from steadqd.fs.tree import Indeterminate, MoveError
from steadqd.fs.unique import publish_unique
from steadqd.fs.verify import copy_payload, read_envelope, read_payload
from steadqd.fs.views import (
    JobEntry,
    JobObject,
    JobStory,
    StateStats,
    copy_job_payload,
    detailed_stats,
    inspect_job,
    job_story,
    list_jobs,
    stats,
)
from steadqd.queue_control import PauseState, new_pause

T = TypeVar("T")

_WAIT_RESCAN_S = 5.0  # safety net for missed events (e.g. a recreated shard dir)


@dataclass(frozen=True)
class JobInfo:
    """One object of a job as found in the tree."""

    state: State
    generation: int
    attempt: int
    max_attempts: int
    path: str
    name: JobName


def _dead_retention_ns(seconds: object) -> int | None:
    """Validate ``dead_retention`` here, not in recovery: a typo must fail at
    open rather than turn into a pass that deletes dead letters too early."""
    return None if seconds is None else checked_seconds_ns("dead_retention", seconds)


class Queue:
    """An open SteadQ/1 queue. Use :meth:`init` or :meth:`open`."""

    def __init__(self, ctx: Context, maintenance_fd: int) -> None:
        self._ctx = ctx
        self._maintenance_fd = maintenance_fd
        self._inotify: ReadyWatch | None = None  # lease(wait=...)'s, made at its first wait
        self.last_scan: ScanReport | None = None
        self._closed = False

    # -- opening ------------------------------------------------------------

    @classmethod
    def init(
        cls,
        path: str | os.PathLike[str],
        shards: int = 64,
        *,
        lease_width_ns: int = QueueConfig.lease_width_ns,
        delayed_width_ns: int = QueueConfig.delayed_width_ns,
        terminal_width_ns: int = QueueConfig.terminal_width_ns,
        max_payload_length: int = MAX_PAYLOAD_LENGTH,
        allow_unsupported_fs: bool = False,
        shared: bool = False,
        **open_options: object,
    ) -> Queue:
        """Create a queue at ``path`` and open it.

        ``shared=True`` makes the root setgid and group-writable so every
        user in the directory's group can produce and consume.
        """
        config = QueueConfig(shards, lease_width_ns, delayed_width_ns, terminal_width_ns, max_payload_length)
        init_queue(os.fspath(path), config, allow_unsupported_fs=allow_unsupported_fs, shared=shared)
        return cls.open(path, allow_unsupported_fs=allow_unsupported_fs, **open_options)  # type: ignore[arg-type]

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        deferred: bool = False,
        receipt_retention: float = DEFAULT_RECEIPT_RETENTION_NS / NS_PER_SECOND,
        temp_ttl: float = DEFAULT_TEMP_TTL_NS / NS_PER_SECOND,
        allow_unsupported_fs: bool = False,
        dead_retention: float | None = None,
        max_clock_skew: float = DEFAULT_MAX_CLOCK_SKEW_NS / NS_PER_SECOND,
    ) -> Queue:
        """Open an existing queue.

        ``deferred`` postpones the directory fsyncs of enqueue and renew
        until :meth:`sync` (group commit for batch producers).
        ``dead_retention`` (seconds; None, the default, keeps dead jobs
        forever like the reference) lets this handle's recovery passes delete
        verified dead jobs whose terminal bucket ended that long before the
        wall floor. The deletion is permanent.
        ``max_clock_skew`` (seconds) bounds how far this handle's recovery
        passes trust a wall watermark ahead of the local clock (fs/clock.py).
        """
        skew_ns = checked_seconds_ns("max_clock_skew", max_clock_skew)
        options = OpenOptions(
            receipt_retention_ns=checked_seconds_ns("receipt_retention", receipt_retention),
            temp_ttl_ns=checked_seconds_ns("temp_ttl", temp_ttl),
            dead_retention_ns=_dead_retention_ns(dead_retention),
            deferred=deferred,
            allow_unsupported_fs=allow_unsupported_fs,
        )
        p = os.fspath(path)
        opened = open_queue_root(p, options)
        try:
            ctx = Context(
                p, opened.root_fd, opened.format, opened.boot_id, options, opened.fs_magic, max_clock_skew_ns=skew_ns
            )
        except BaseException:
            linux.close(opened.maintenance_fd)
            linux.close(opened.root_fd)
            raise
        return cls(ctx, opened.maintenance_fd)

    # -- facts --------------------------------------------------------------

    @property
    def path(self) -> str:
        return self._ctx.path

    @property
    def format(self) -> FormatRecord:
        return self._ctx.fmt

    @property
    def queue_id(self) -> str:
        return self._ctx.queue_id.hex()

    @property
    def shard_count(self) -> int:
        return self._ctx.fmt.shard_count

    @property
    def boot_id(self) -> str:
        return self._ctx.boot_id

    @property
    def poisoned(self) -> str | None:
        """Why the handle refuses mutations, or None."""
        return self._ctx.poisoned

    @property
    def publication_mode(self) -> str:
        return self._ctx.publication

    def wall_floor_ns(self) -> int:
        """The rollback-safe wall time this handle would stamp a mutation with."""
        self._check_open()
        return self._ctx.wall.peek()

    def trusted_wall_ns(self) -> int:
        """The wall recovery judges by: the floor, but no further ahead of this
        host's clock than the handle's ``max_clock_skew`` (fs/clock.py)."""
        self._check_open()
        return trusted_wall(self._ctx.wall.peek(), linux.realtime_ns(), self._ctx.max_clock_skew_ns)[0]

    # -- the transitions ------------------------------------------------------

    def enqueue(self, payload: Payload, **options: Any) -> str:
        """Publish a job; returns its 32-hex id. The options: :meth:`steadqd.backend.Backend.enqueue`.

        ``payload`` is bytes or a binary file object (streamed, never held in
        memory whole)."""
        if not options:  # enqueue_detailed's call when no option is given (most producers), in one frame
            return guarded("enqueue", self._ctx, enqueue, self._ctx, payload).job_id
        return self.enqueue_detailed(payload, **options)[0]

    def enqueue_many(self, payloads: Iterable[Payload], **options: Any) -> list[str]:
        """Publish one job per payload (same options for all); returns their ids, in order.

        The options and the failures: :meth:`steadqd.backend.Backend.enqueue_many`;
        how a group of jobs shares its fsyncs: :func:`steadqd.fs.publish.enqueue_many`.
        No job is visible before every file of its group is durable; the
        directory barrier comes at the end of the batch inside :meth:`batch`
        or deferred mode. An OutcomeUnknown from here poisons the handle.
        """
        with mutation("enqueue", self._ctx):
            delay = options.pop("delay", None)
            published = enqueue_many(self._ctx, payloads, delay=delay if delay else None, **options)
            return [p.job_id for p in published]

    def enqueue_detailed(self, payload: Payload, **kwargs: object) -> tuple[str, str]:
        """Like :meth:`enqueue` but returns ``(job_id, relative path)``."""
        delay = kwargs.pop("delay", None)
        unique = kwargs.pop("unique", None)
        job_id = kwargs.pop("job_id", None)
        if unique is not None and job_id is not None:
            raise InvalidInput("give either job_id or unique, not both: a unique job's id is derived from its key")
        chosen = None if job_id is None else parse_job_id(str(job_id))
        if unique is None:  # most enqueues: no closure to make, the same call as publish(None) below
            published = guarded(
                "enqueue", self._ctx, lambda: enqueue(self._ctx, payload, delay=delay or None, job_id=chosen, **kwargs)
            )
            return published.job_id, published.path

        def publish(jid: str | None) -> tuple[str, str]:
            raw = chosen if jid is None else parse_job_id(jid)
            published = enqueue(self._ctx, payload, delay=delay or None, job_id=raw, **kwargs)
            return published.job_id, published.path

        with mutation("enqueue", self._ctx):
            return publish_unique(self._ctx, str(unique), publish)

    # -- pausing (steadqd.fs.control) --------------------------------------------

    def pause_state(self) -> PauseState | None:
        """The queue's pause, read from ``control/paused`` now; None if it is not paused."""
        self._check_open()
        return read_pause(self._ctx.control_fd)

    def pause(self, reason: str = "") -> PauseState:
        """Pause the queue durably (workers stop claiming; producers go on); replaces an earlier pause."""
        self._check_open()
        state = new_pause(reason, self.wall_floor_ns())
        write_pause(self._ctx, state)
        return state

    def resume(self) -> PauseState | None:
        """Remove the pause, durably; returns the pause that was in force (None if there was none)."""
        self._check_open()
        was = read_pause(self._ctx.control_fd)
        return was if clear_pause(self._ctx) else None

    def lease(self, wait: float = 0.0, duration: float = 30.0) -> Lease | None:
        """Claim one job for ``duration`` seconds; None when the queue is empty.

        With ``wait`` > 0, sleeps on inotify events of the ready shards (no
        polling) until a job arrives or the wait runs out.
        """
        # A bad duration or wait is NotCommitted(INVALID_INPUT), a clock failure NotCommitted, never a bare OSError:
        # the checks and the first scan run under guarded (``with mutation("lease", ctx)`` in one frame).
        duration_ns, deadline, lease = guarded("lease", self._ctx, self._lease_start, duration, wait)
        if deadline is None:
            return lease
        watch = self._ready_wait()
        while True:
            try:
                with mutation("lease", self._ctx):
                    lease, report = claim(self._ctx, duration_ns, self)
                self.last_scan = report
                if lease is not None:
                    return lease
            except NotCommitted as e:
                if e.kind is not ErrorKind.MAINTENANCE_BUSY:
                    raise
            with mutation("lease", self._ctx):
                remaining = (deadline - linux.monotonic_ns()) / NS_PER_SECOND
            if remaining <= 0:
                return None
            watch.wait(min(remaining, _WAIT_RESCAN_S))

    def _lease_start(self, duration: float, wait: float) -> tuple[int, int | None, Lease | None]:
        """:meth:`lease`'s checks and, without a wait, its one scan: (the duration in ns, the wait's
        monotonic deadline or None where there is no wait, the lease that scan found)."""
        exact = type(duration) is float or type(duration) is int
        duration_ns = plain_duration_ns(duration) if exact else lease_duration_ns(duration)
        # max(0.0, wait) compares ``wait > 0.0`` (its TypeError, if any, is this one); a wait that is
        # not above it is 0.0, which checked_seconds_ns always accepts: checked only when it is used.
        if not wait > 0.0:  # one scan answers wait=0 (or NaN): no deadline, no watch, one pin of the cache
            lease, report = claim(self._ctx, duration_ns, self)
            self.last_scan = report
            return duration_ns, None, lease
        wait_ns = checked_seconds_ns("wait", max(0.0, wait))
        return duration_ns, linux.monotonic_ns() + wait_ns, None

    def renew(self, lease: Lease, duration: float = 30.0) -> Lease:
        """Extend the lease; updates and returns the same object."""
        with mutation("renew", self._ctx):
            return renew(self._ctx, lease, lease_duration_ns(duration))

    def ack(self, lease: Lease) -> AckResult:
        """Acknowledge; idempotent for a lease that was already acknowledged."""
        return guarded("ack", self._ctx, ack, self._ctx, lease)

    def retry(self, lease: Lease, delay: float | None = None, *, policy: RetryPolicy | None = None) -> str:
        """Give the job back (after ``delay`` s or a backoff ``policy``); returns
        the new state: "ready", "delayed", or "dead" when attempts ran out."""
        with mutation("retry", self._ctx):
            return retry(self._ctx, lease, delay=delay, policy=policy)

    def bury(self, lease: Lease, reason: int = 1) -> None:
        """Dead-letter the job with a u16 reason code (reasons.md)."""
        with mutation("bury", self._ctx):
            bury(self._ctx, lease, reason)

    def cancel(self, job_id: str) -> Cancellation:
        """Dead-letter a ready, delayed or running job with reason ``cancelled`` (fs/cancel.py);
        a job that has settled is left as it is and the result says how it ended."""
        parse_job_id(job_id)
        with mutation("cancel", self._ctx):
            return cancel(self._ctx, job_id)

    def was_cancelled(self, lease: Lease) -> bool:
        """Did a cancel end this lease (its file is now the dead file of reason ``cancelled``)?"""
        with self._ctx.tree.operation():
            return was_cancelled(self._ctx, lease)

    def lease_key(self, lease: Lease) -> str:
        """The name the ready watch reports when this lease's file leaves (ReadyNews.left)."""
        return lease.path.rsplit("/", 1)[-1]

    def recover(
        self, budget_ops: int = 1000, budget_ms: int = 100, *, phases: tuple[str, ...] | None = None
    ) -> RecoveryReport:
        """Run one bounded recovery pass (recovery.md): reap expired leases,
        promote due delayed jobs, clean temps, compact and expire receipts
        (and dead letters, when opened with ``dead_retention``).
        ``phases`` restricts the pass (e.g. ``("promote_delayed",)``, what the
        promoter runs). On-disk problems are reported, never raised."""
        with mutation("recover", self._ctx):
            return run_recovery(self._ctx, budget_ops=budget_ops, budget_ms=budget_ms, phases=phases)

    # -- payloads ---------------------------------------------------------------

    def read_payload(self, lease: Lease) -> bytes:
        """Every payload(): through the C core when it runs (lease.core_payload), at its deviation the
        Python with the core's syscalls replayed, else the Python alone (:meth:`_read_payload`)."""
        if self._closed:
            self._check_open()
        ctx = self._ctx
        tree = ctx.tree
        tree.pin()  # Validated's steps, in its order: pin, validate; close, unpin
        try:
            core = ctx.c_core
            if core is not None:
                payload, record = core_payload(ctx, lease, core)
                if payload is not None:
                    return payload
                if record is not None:
                    with bridge.replaying(record, skip_open=False):
                        return self._read_payload(ctx, lease)
            return self._read_payload(ctx, lease)
        finally:
            tree.unpin()

    def _read_payload(self, ctx: Context, lease: Lease) -> bytes:
        """payload() in Python: the specification the core mirrors (and replays into)."""
        # _validated and _guard_payload written out: every pure payload() comes here (no closure, two frames fewer)
        src = validated_source(ctx, lease)
        try:
            return read_payload(src.fd, src.envelope)
        except (SteadQError, OSError) as e:
            self._payload_failed(lease, src, e)
            raise
        finally:
            src.close()

    def copy_payload(self, lease: Lease, out: BinaryIO) -> int:
        with self._validated(lease) as src:
            return self._guard_payload(lease, src, lambda: copy_payload(src.fd, src.envelope, out))

    def read_extension(self, lease: Lease) -> Extension | None:
        with self._validated(lease) as src:
            return extension_of(src)

    def open_leased_payload(self, lease: Lease) -> tuple[int, int]:
        """An fd of exactly the leased file and its payload offset, for streaming the payload
        to a worker across renewals (``steadq work``); the caller closes the fd."""
        self._check_open()
        return open_leased(self._ctx, lease)

    # -- handle files and the last scan (``steadq lease``) ------------------------

    def handle_text(self, lease: Lease) -> str:
        """The handle file for ``lease`` (JSON), naming this queue: what a later ``steadq ack`` reads."""
        return lease.to_handle(self.path)

    def lease_from_handle(self, text: str) -> tuple[Lease, str | None]:
        """The lease a handle file describes and the queue id it names (None if it names none)."""
        return Lease.from_handle(text)

    def quarantined_in_last_scan(self) -> list[tuple[str, int, str]]:
        """(path, reason, quarantine name) of every corrupt object the last :meth:`lease` isolated."""
        return [] if self.last_scan is None else list(self.last_scan.quarantined)

    def _check_open(self) -> None:
        """Descriptor numbers of a closed handle may belong to another queue now."""
        if self._closed:
            raise InvalidInput(f"queue handle for {self.path} is closed")

    def _validated(self, lease: Lease) -> Validated:
        """A validated source for reading, with the dir cache pinned meanwhile."""
        self._check_open()
        return Validated(self._ctx, lease)

    def _guard_payload(self, lease: Lease, src: Source, read: Callable[[], T]) -> T:
        """A payload that fails its digest is quarantined, never handed out."""
        try:
            return read()
        except (SteadQError, OSError) as e:
            self._payload_failed(lease, src, e)
            raise

    def _payload_failed(self, lease: Lease, src: Source, e: SteadQError | OSError) -> None:
        """A read of ``src``'s payload failed with ``e``: quarantine a payload that failed
        its digest (the caller re-raises ``e``); an OSError is raised here as NotCommitted."""
        if isinstance(e, OSError):
            raise not_committed(e, f"read payload of {lease.job_id}") from e
        if getattr(e, "payload", False):
            with contextlib.suppress(SteadQError, OSError, MoveError, Indeterminate):
                quarantine(self._ctx, src.dir_fd, src.name, QuarantineReason.PAYLOAD_CORRUPT, src.witness)

    # -- batches and barriers -------------------------------------------------

    def sync(self) -> None:
        """Make every postponed directory barrier durable.

        If a barrier fails the outcome of every pending operation is
        unknown: the handle is poisoned and OutcomeUnknown raised.
        """
        try:
            self._ctx.tree.sync()
        except OSError as e:
            self._ctx.poison(f"sync: {e.strerror}")
            raise OutcomeUnknown(f"deferred barrier failed: {e.strerror}") from e

    @contextlib.contextmanager
    def batch(self) -> Iterator[Queue]:
        """Postpone every directory barrier to one :meth:`sync` at the end."""
        tree = self._ctx.tree
        tree.batching += 1
        try:
            yield self
        finally:
            tree.batching -= 1
        if tree.batching == 0:
            self.sync()

    # -- inspection ---------------------------------------------------------

    def inspect(self, job_id: str) -> list[JobInfo]:
        """Every authentic object of ``job_id`` in any state (steadqd.fs.views.inspect_job)."""
        return [
            JobInfo(State(o.state), o.generation, o.attempt, o.max_attempts, o.path, o.name)
            for o in self.inspect_detailed(job_id)
        ]

    def inspect_detailed(self, job_id: str) -> list[JobObject]:
        """Like :meth:`inspect`, with each state's name fields (``steadq inspect --json``)."""
        self._check_open()
        return inspect_job(self._ctx, job_id)

    def job_story(self, job_id: str, payload_head: int = 4096) -> JobStory | None:
        """Everything the tree says of one job, in any state or quarantine (``steadq show``); None if nowhere."""
        self._check_open()

        def quarantined(job: str) -> tuple[str, str, int] | None:
            found = find_quarantined(self._ctx, job)
            return None if found is None else (found.quarantine_id, found.path, found.reason)

        with self._ctx.tree.operation():
            return job_story(self._ctx, job_id, payload_head, quarantined)

    def copy_job_payload(self, job_id: str, out: BinaryIO) -> int:
        """Write the verified payload of the job's live or quarantined object to ``out``; returns its length.

        NOT_FOUND when no object of the job holds a payload (an acknowledged job's is gone)."""
        story = self.job_story(job_id, payload_head=0)
        if story is None or story.file is None:
            raise SteadQError(f"not found: no object of job {job_id} holds a payload", ErrorKind.NOT_FOUND)
        with self._ctx.tree.operation():
            try:
                return copy_job_payload(self._ctx, story.path, out)
            except FileNotFoundError as e:
                raise SteadQError(f"job {job_id} moved on while its payload was read; try again",
                                  ErrorKind.NOT_FOUND) from e  # fmt: skip

    # -- waking the daemons (steadqd.fs.ready_watch, steadqd.fs.delayed_watch) ---

    def _ready_wait(self) -> ReadyWatch:
        """lease(wait=...)'s watch: made at its first wait, kept until close()."""
        if self._inotify is None:
            with mutation("lease", self._ctx):  # no inotify instance left is NotCommitted too
                self._inotify = ReadyWatch(self.path, self.shard_count)
            self._inotify.watch_missing()  # a shard it cannot watch is still scanned, and rescanned
        return self._inotify

    def ready_watch(self) -> ReadyWatch:
        """A new inotify watch on the ready shards, the caller's to close (the worker's wake-up).

        No shard is watched yet: ``watch_missing()`` adds them and says which failed."""
        self._check_open()
        return ReadyWatch(self.path, self.shard_count)

    def delayed_watch(self, report: Callable[[str, str], None]) -> DelayedWatch:
        """A new inotify watch on ``delayed/``, the caller's to close (the promoter's wake-up).

        OSError if ``delayed/`` cannot be watched; later problems go to ``report(code, message)``."""
        self._check_open()
        return DelayedWatch(self.path, self.shard_count, self._ctx.fmt.delayed_width_ns, report)

    # -- lifetime -----------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._ctx.tree.pending_barriers and self._ctx.poisoned is None:
                self.sync()
        finally:
            if self._inotify is not None:
                self._inotify.close()
            self._ctx.close()
            linux.close(self._maintenance_fd)
            linux.close(self._ctx.root_fd)

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Queue {self.path!r} id={self.queue_id} shards={self.shard_count}>"

    # -- resolve (steadqd.fs.resolve) ------------------------------------------

    def resolve(self, ticket: TransitionTicket, stabilize: bool = False) -> ResolveResult:
        """Decide what an indeterminate transition did (errors.md "resolve").
        Read-only apart from the stabilising fsyncs, so a poisoned handle may ask."""
        self._check_open()
        return resolve(self._ctx, ticket, stabilize=stabilize)

    def ticket_paths(self, ticket: TransitionTicket) -> tuple[str, str]:
        """(source path, destination path) the ticket predicts, relative to the queue root."""
        self._check_open()
        return ticket_paths(self._ctx, ticket)

    # -- dead letters and quarantine (steadqd.fs.admin) ---------------------------

    def list_dead(self) -> Iterator[DeadJob]:
        """Every authenticated dead object, streamed (one shard directory at a time)."""
        self._check_open()
        return list_dead(self._ctx)

    def find_dead(self, job_id: str) -> DeadJob | None:
        """The job's first dead object (oldest bucket first), or None."""
        self._check_open()
        return find_dead(self._ctx, job_id)

    def export_dead(self, job_id: str, out_path: str, *, payload_only: bool = False) -> int:
        """Copy a dead job (or only its verified payload) to ``out_path``, atomically; returns the bytes written."""
        self._check_open()
        return export_dead(self._ctx, job_id, out_path, payload_only=payload_only)

    def remove_dead(self, job_id: str) -> None:
        """Delete a dead job for good."""
        self._check_open()
        remove_dead(self._ctx, job_id)

    def requeue_dead(self, job_id: str, *, max_attempts_reset: bool = True) -> str:
        """Move a dead job back to ready/ with a fresh set of attempts; returns its new path."""
        self._check_open()
        return requeue_dead(self._ctx, job_id, max_attempts_reset=max_attempts_reset)

    def list_quarantine(self) -> Iterator[QuarantinedObject]:
        """Every quarantined object, nested directories included, in bytewise order."""
        self._check_open()
        return list_quarantine(self._ctx)

    def inspect_quarantine(self, quarantine_id: str) -> QuarantinedObject:
        """The quarantined object with this id; NOT_FOUND if none."""
        self._check_open()
        return inspect_quarantine(self._ctx, quarantine_id)

    def export_quarantine(self, quarantine_id: str, out_path: str) -> int:
        """Copy a quarantined object's raw bytes to ``out_path``, atomically; returns the bytes written."""
        self._check_open()
        return export_quarantine(self._ctx, quarantine_id, out_path)

    def remove_quarantine(self, quarantine_id: str) -> None:
        """Unlink a quarantined object durably."""
        self._check_open()
        remove_quarantine(self._ctx, quarantine_id)

    # -- stats and fsck (steadqd.fs.views, steadqd.fs.fsck) ----------------------

    def stats(self) -> dict[str, StateStats]:
        """Objects per state classified by name (colocated leases are "leased");
        :meth:`entry_stats` has the reference CLI's raw-entry counts."""
        self._check_open()
        return detailed_stats(self._ctx)

    def entry_stats(self) -> dict[str, StateStats]:
        """Jobs per state directory in the reference CLI's shape (``steadq stats``), and the strays beside them."""
        self._check_open()
        return stats(self._ctx)

    def list_jobs(self, states: Collection[str], *, metadata: bool = False) -> Iterator[JobEntry]:
        """Every job object in ``states`` (state words), streamed, by name only (``steadq ls``);
        ``metadata`` adds each file's metadata, which costs a header read per job."""
        self._check_open()
        jobs = list_jobs(self._ctx, states)
        if not metadata:
            return jobs
        return (dataclasses.replace(j, metadata=self._metadata_of(j.path)) for j in jobs)

    def _metadata_of(self, path: str) -> dict[str, object] | None:
        """The metadata in the header of the job file at ``path`` ({} when it has none); None when the file
        moved on since it was listed or cannot be read as a job (``show`` and ``fsck`` tell why)."""
        try:
            fd = linux.open_beneath(self._ctx.root_fd, path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            env = read_envelope(fd, self._ctx.fmt.max_payload_length, linux.fstat(fd))
            ext = decode_extension(env.extension) if env.extension else None
        except (OSError, CorruptObject):
            return None
        finally:
            linux.close(fd)
        return dict(ext.metadata) if ext is not None and ext.metadata else {}

    def fsck(self, deep: bool = False, repair: bool = False) -> FsckResult:
        """Check every object (recovery.md "fsck"); ``repair`` quarantines the bad ones."""
        self._check_open()
        if repair:
            self._ctx.check_usable()  # repair mutates: a poisoned handle refuses
        return fsck(self._ctx, deep=deep, repair=repair)


__all__ = ["Queue", "Lease", "JobInfo", "AckResult", "QueueCorrupt"]
