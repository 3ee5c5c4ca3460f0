"""The backend contract: what the daemons and the ``steadq`` command may ask of a queue.

The daemons (``steadqd.daemon``), the command line (``steadqd.cli``) and the
demo never import a backend package; they open a queue here and talk to it
through the protocols below. That keeps the exit policy, the renewal schedule,
the journal story and every command written once, whichever store holds the
jobs: SteadQ/1 on a local filesystem (``steadqd.fs``) or StowQ/1 on an object
store (``steadqd.s3``), behind the same seam. ``lint-imports`` (pyproject.toml)
fails the build when a program imports a backend directly.

The protocols are structural (``typing.Protocol``): a backend implements them
by having the methods, and mypy checks every caller against them, so a method
a role needs and a backend lacks is a type error, not a crash in production.
A lease is passed back to the backend that returned it; its parameters are
typed ``Any`` because each backend's lease is its own class, and the
protocol only promises what a caller may read from one (``LeaseHandle``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, runtime_checkable

from steadqd.backoff import RetryPolicy
from steadqd.constants import Cancellation
from steadqd.errors import InvalidInput
from steadqd.fs.admin import list_dead_files as fs_list_dead_files
from steadqd.fs.compiled.bridge import path as fs_claim_path
from steadqd.fs.doctor import doctor_checks
from steadqd.fs.handle import Queue as FsQueue
from steadqd.fs.json_records import TransitionTicket
from steadqd.fs.objects import dump_file as fs_dump_file
from steadqd.fs.objects import verify_file as fs_verify_file
from steadqd.fs.recovery.cursor import remove_bad_cursor as fs_remove_bad_cursor
from steadqd.queue_control import PauseState
from steadqd.view_records import RecoveryReport

if TYPE_CHECKING:
    from steadqd.s3.backend import BucketBackend

__all__ = [
    "Backend",
    "BatchLeasing",
    "DelayedNews",
    "DelayedWatch",
    "LeaseHandle",
    "OutcomeTicket",
    "PauseState",
    "Payload",
    "ReadyNews",
    "ReadyWatch",
    "RecoveryReport",
    "ScanReport",
    "URL_SCHEMES",
    "check_queue_url",
    "doctor",
    "dump_file",
    "init_queue",
    "is_bucket_url",
    "list_dead_files",
    "new_job_id",
    "open_queue",
    "parse_ticket",
    "verify_file",
]

# Schemes of queue URLs this version knows of; a target with any other
# ``scheme://`` prefix is refused rather than taken for a relative path.
URL_SCHEMES: tuple[str, ...] = ("s3",)

# What a payload may be: bytes, or a binary file object that is streamed.
Payload = bytes | bytearray | memoryview | BinaryIO


@runtime_checkable
class OutcomeTicket(Protocol):
    """The ticket of an enqueue whose outcome is unknown (``OutcomeUnknown.ticket``), whichever backend wrote it.

    Why a method and not a test of the ticket's fields: the command prints
    what the backend knows of where the job may be (a filesystem's job id
    and path, a bucket's unanswered write) without knowing which backend it
    was: :class:`steadqd.fs.json_records.EnqueueTicket`,
    :class:`steadqd.s3.store.base.PendingWrite`.
    """

    def outcome_lines(self) -> list[str]:
        """The lines ``steadq put`` prints under "outcome unknown", each "name: value"."""
        ...


class LeaseHandle(Protocol):
    """A claimed job, as a caller sees it: enough to run it, log it and settle it."""

    @property
    def job_id(self) -> str: ...
    @property
    def generation(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def content_type(self) -> str: ...
    @property
    def payload_length(self) -> int: ...
    @property
    def metadata(self) -> Mapping[str, bool | int | str | bytes]: ...
    @property
    def producer_id(self) -> str | None: ...


@runtime_checkable
class BatchLeasing(Protocol):
    """A queue handle that claims several jobs in one round (a bucket's ``lease_many``).

    Apart from :class:`Backend` because only a bucket handle has it: its claims
    share one floor and its shard listings, and are in flight together, and the
    handle may be used by several threads at once, so one handle can claim for
    all of a worker's threads (steadqd.tasks). Each lease is its own claim, to be
    renewed, settled or given back like one from ``lease``.
    """

    def lease_many(self, n: int, duration: float = 30.0, *, wait: float = 0.0) -> Sequence[LeaseHandle]: ...


# -- waking the daemons ---------------------------------------------------------
#
# A daemon sleeps until the store says there is work: a job became ready (the
# worker), a delayed job is due sooner than it thought (the promoter). How the
# store says so is the backend's: the filesystem has inotify, so its watches
# are file descriptors that wake the service loop the moment a name appears; a
# bucket backend has no such events and polls behind the same methods. The
# roles keep what is theirs whatever the store: the timers, the safety
# rescans, the budgets, the back-off and every log line.


class ReadyNews(Protocol):
    """What one read of a :class:`ReadyWatch` found."""

    @property
    def appeared(self) -> bool:
        """A job became ready: a claim may succeed now."""
        ...

    @property
    def overflowed(self) -> bool:
        """Events were lost: anything may have happened (the estimate was redone)."""
        ...

    @property
    def left(self) -> Collection[str]:
        """Keys (``Backend.lease_key``) of leased objects that left: a holder whose lease's key is
        among them asks ``Backend.was_cancelled`` (empty where the store has no such events)."""
        ...

    @property
    def rung(self) -> bool:
        """The queue's doorbell rang (a bucket's; a same-host enqueue or ``steadq cancel``): a holder
        asks ``Backend.was_cancelled`` for each job it runs. At most once per ring interval."""
        ...


class ReadyWatch(Protocol):
    """Wakes a consumer when a job becomes ready; the caller closes it."""

    @property
    def ready_estimate(self) -> int | None:
        """Ready jobs as of the last :meth:`recount`, kept current by events; None if not counted."""
        ...

    def fileno(self) -> int:
        """Readable when there is news: register it with the service loop."""
        ...

    def watch_missing(self) -> list[str]:
        """Watch what is not watched yet (all of it the first time); returns why each failure failed."""
        ...

    def recount(self) -> None: ...
    def read(self) -> ReadyNews:
        """The news waiting, without blocking."""
        ...

    def wait(self, seconds: float) -> bool:
        """Block until a job may be ready, at most ``seconds``; False if the time ran out."""
        ...

    def close(self) -> None: ...


class DelayedNews(Protocol):
    """What one read of a :class:`DelayedWatch` found."""

    @property
    def rescan(self) -> bool:
        """Events were lost or could not be followed: scan again."""
        ...

    @property
    def earlier(self) -> bool:
        """A job arrived that is due before the earliest one known."""
        ...


class DelayedWatch(Protocol):
    """Knows when the earliest delayed job is due, and wakes a promoter when that changes."""

    @property
    def next_due_ns(self) -> int | None:
        """The wall time (ns) at which the earliest delayed job known becomes due; None if none is."""
        ...

    @property
    def count(self) -> int:
        """Delayed jobs as of the last scan, adjusted by events since."""
        ...

    @property
    def earliest(self) -> str | None:
        """Where the earliest delayed jobs are, for log lines."""
        ...

    def fileno(self) -> int: ...
    def scan(self, wall_floor_ns: int) -> None:
        """Look at the store again (raises OSError or SteadQError if it cannot be read)."""
        ...

    def read(self) -> DelayedNews: ...
    def forget(self) -> None:
        """A scan failed or its answer is stale: nothing is known to be due until the next."""
        ...

    def close(self) -> None: ...


class ScanReport(Protocol):
    """What the last lease's scan ran into besides jobs; the worker logs each."""

    @property
    def errors(self) -> Sequence[str]: ...
    @property
    def quarantined(self) -> Sequence[tuple[str, int, str]]:
        """(original path, reason code, quarantine name) of each corrupt object moved away."""
        ...

    @property
    def dead_lettered(self) -> Sequence[str]:
        """Paths of jobs with no attempts left that the scan dead-lettered."""
        ...


class Backend(Protocol):
    """One open queue. Every call reads the store; nothing a handle holds is the truth."""

    @property
    def path(self) -> str:
        """Where the queue lives, as given to ``open_queue``."""
        ...

    @property
    def queue_id(self) -> str: ...

    @property
    def poisoned(self) -> str | None:
        """Why the handle refuses further mutations (an unknown outcome), or None."""
        ...

    def wall_floor_ns(self) -> int:
        """The queue's wall clock: never below the watermark, never going back."""
        ...

    def trusted_wall_ns(self) -> int:
        """The wall clock recovery acts on: ``wall_floor_ns``, bounded by this host's clock plus the
        handle's allowed skew, so a watermark pushed far ahead does not make jobs due early."""
        ...

    # -- producing -------------------------------------------------------------
    def enqueue(
        self,
        payload: Payload,
        *,
        max_attempts: int = 3,
        content_type: str = "application/octet-stream",
        metadata: Mapping[str, bool | int | str | bytes] | None = None,
        producer_id: str | None = None,
        trace_context: bytes | None = None,
        delay: float = 0.0,
        not_before_ns: int | None = None,
        job_id: str | None = None,
        unique: str | None = None,
    ) -> str:
        """Publish one job durably; returns its 32-hex id.

        ``unique``: at most one job per key anywhere in the queue (ready,
        delayed, running, dead, or acknowledged within retention); a second
        enqueue of the key meanwhile raises :class:`~steadqd.errors.DuplicateJob`
        naming the job that is there. Its id is derived from the key
        (steadqd.queue_control.unique_job_id), so not with ``job_id``.

        ``job_id`` is for a producer that must learn after a crash whether its
        enqueue happened (the watch folders): it draws the id with
        :func:`new_job_id`, records it durably, enqueues, and after a restart
        asks :meth:`inspect` for it. The id is still random, as both formats
        require; a producer never reuses one, and never passes one that it has
        not first looked up when it cannot tell whether its enqueue happened."""
        ...

    def enqueue_many(
        self,
        payloads: Iterable[Payload],
        *,
        max_attempts: int = 3,
        content_type: str = "application/octet-stream",
        metadata: Mapping[str, bool | int | str | bytes] | None = None,
        producer_id: str | None = None,
        trace_context: bytes | None = None,
        delay: float = 0.0,
        not_before_ns: int | None = None,
    ) -> list[str]:
        """Publish one job per payload (the same options for all); returns their ids, in order.

        On failure: NotCommitted or OutcomeUnknown when no job was published;
        :class:`~steadqd.errors.EnqueueIncomplete` when the first
        ``len(e.published)`` jobs were (``e.cause`` is the NotCommitted or
        OutcomeUnknown of the rest; kind and exit code are the cause's)."""
        ...

    # -- pausing (steadqd.queue_control) ----------------------------------------
    def pause_state(self) -> PauseState | None:
        """The queue's pause as stored now (read afresh at every call), or None if it is not paused.

        Workers read it before claiming; the library's ``lease`` does not
        (an operator may still take a job by hand from a paused queue)."""
        ...

    def pause(self, reason: str = "") -> PauseState:
        """Pause durably (workers stop claiming, producers go on); replaces an earlier pause."""
        ...

    def resume(self) -> PauseState | None:
        """Remove the pause durably; the pause that was in force, or None if there was none."""
        ...

    # -- consuming -------------------------------------------------------------
    def lease(self, wait: float = 0.0, duration: float = 30.0) -> LeaseHandle | None: ...
    def renew(self, lease: Any, duration: float = 30.0) -> LeaseHandle: ...
    def ack(self, lease: Any) -> Any: ...
    def retry(self, lease: Any, delay: float | None = None, *, policy: RetryPolicy | None = None) -> str: ...
    def bury(self, lease: Any, reason: int = 1) -> None: ...
    def cancel(self, job_id: str) -> Cancellation:
        """Dead-letter a ready, delayed or running job with reason ``cancelled``; a job that has
        settled is left alone and the result says how it ended. Raises not_found for no such job."""
        ...

    def was_cancelled(self, lease: Any) -> bool:
        """The holder's question when its lease is gone: did a cancel end it (kill the command)?"""
        ...

    def lease_key(self, lease: Any) -> str:
        """What the ready watch reports in ``ReadyNews.left`` when this lease's object leaves."""
        ...

    def read_payload(self, lease: Any) -> bytes: ...
    def copy_payload(self, lease: Any, out: BinaryIO) -> int: ...

    # -- durability and maintenance --------------------------------------------
    def batch(self) -> AbstractContextManager[Any]:
        """Share barriers across the mutations made inside the block."""
        ...

    def sync(self) -> None: ...
    def recover(
        self, budget_ops: int = 1000, budget_ms: int = 100, *, phases: tuple[str, ...] | None = None
    ) -> RecoveryReport:
        """One bounded recovery pass; store problems are reported, never raised."""
        ...

    def close(self) -> None: ...

    # -- waking the daemons (owned by the daemon restructure) ------------------
    @property
    def last_scan(self) -> ScanReport | None:
        """What the last ``lease()`` scan ran into besides jobs; None before the first."""
        ...

    def ready_watch(self) -> ReadyWatch:
        """A new watch for jobs becoming ready (not watching yet: call ``watch_missing()``)."""
        ...

    def delayed_watch(self, report: Callable[[str, str], None]) -> DelayedWatch:
        """A new watch on the delayed jobs; problems met later go to ``report(code, message)``,
        code ``watch_limit`` when the store's event limit is reached (the next scan still sees all)."""
        ...

    # -- operator views and tools (owned by the CLI restructure) ---------------
    # What ``steadq`` shows and repairs. Results are the backend's own records;
    # the command reads from them the attributes its output (cli.md) names.

    def enqueue_detailed(self, payload: Payload, **options: Any) -> tuple[str, str]:
        """Like ``enqueue``; returns ``(job id, where the job is stored)``, both of which ``put`` prints."""
        ...

    def handle_text(self, lease: Any) -> str:
        """A handle file for ``lease``: what a later process reads back with ``lease_from_handle``."""
        ...

    def lease_from_handle(self, text: str) -> tuple[Any, str | None]:
        """The lease a handle file describes, and the queue id it names (None if it names none)."""
        ...

    def quarantined_in_last_scan(self) -> list[tuple[str, int, str]]:
        """(path, reason, quarantine name) of each corrupt object the last ``lease`` isolated.

        ``lease`` goes on past a corrupt job; the command still reports it."""
        ...

    def open_leased_payload(self, lease: Any) -> tuple[int, int]:
        """An fd of exactly the leased job and its payload's offset there, valid across renewals;
        the caller closes it (``work`` streams the payload to a child from it)."""
        ...

    def stats(self) -> Mapping[str, Any]:
        """Objects per state, classified by name; each has ``objects`` and ``oldest_age_seconds``."""
        ...

    def entry_stats(self) -> Mapping[str, Any]:
        """Like ``stats`` with the reference's counting (every entry of a state's directory)."""
        ...

    def list_jobs(self, states: Collection[str], *, metadata: bool = False) -> Iterator[Any]:
        """Every job in ``states`` (state words), streamed, as its name describes it (not verified);
        ``metadata``: each with its job file's metadata too (refused where jobs carry none)."""
        ...

    def inspect(self, job_id: str) -> list[Any]:
        """Every authentic object of one job, in any state."""
        ...

    def inspect_detailed(self, job_id: str) -> list[Any]:
        """Like ``inspect``, with each state's own fields in ``details``."""
        ...

    def job_story(self, job_id: str, payload_head: int = 4096) -> Any | None:
        """One job in any state or in quarantine, for ``show``: state, ``objects``, ``current``,
        ``reason``, and ``file`` (header and extension fields, the first ``payload_head`` payload
        bytes, whether the payload verified, or the ``problem`` found); None if it is nowhere."""
        ...

    def copy_job_payload(self, job_id: str, out: BinaryIO) -> int:
        """Write the job's payload to ``out`` only once it has verified; returns its length."""
        ...

    def fsck(self, deep: bool = False, repair: bool = False) -> Any:
        """Check every object; ``repair`` quarantines the ones that fail."""
        ...

    def resolve(self, ticket: Any, stabilize: bool = False) -> Any:
        """What an indeterminate transition did; ``outcome`` is a :class:`~steadqd.constants.Resolution`."""
        ...

    def export_dead(self, job_id: str, out_path: str, *, payload_only: bool = False) -> int: ...
    def remove_dead(self, job_id: str) -> None: ...
    def requeue_dead(self, job_id: str, *, max_attempts_reset: bool = True) -> str: ...
    def list_quarantine(self) -> Iterator[Any]: ...
    def inspect_quarantine(self, quarantine_id: str) -> Any: ...
    def export_quarantine(self, quarantine_id: str, out_path: str) -> int: ...
    def remove_quarantine(self, quarantine_id: str) -> None: ...


def _check_target(target: str) -> None:
    scheme, sep, _ = target.partition("://")
    if sep and scheme and scheme.isalnum() and scheme not in URL_SCHEMES:
        raise InvalidInput(
            f"{target!r}: queues at {scheme}:// URLs are not supported by this version; give a directory path"
        )


def new_job_id() -> str:
    """A fresh job id for ``Backend.enqueue(job_id=...)``: 16 bytes from getrandom, like every job id."""
    return os.urandom(16).hex()


def _is_bucket(target: str) -> bool:
    return target.startswith("s3://")


def is_bucket_url(target: str) -> bool:
    """Whether ``target`` names a bucket queue (``s3://``), for a program that must treat one differently."""
    return _is_bucket(target)


def check_queue_url(target: str) -> str:
    """The canonical form of a queue URL (``s3://BUCKET/PREFIX``); InvalidInput naming what is wrong.

    Opens nothing and needs no client library: a configuration is checked
    on a machine that may not have botocore installed."""
    _check_target(target)
    if not _is_bucket(target):
        raise InvalidInput(f"{target!r} is not a queue URL; write s3://BUCKET/PREFIX")
    from steadqd.s3.open import parse_url

    return str(parse_url(target))


def open_queue(target: str, **options: Any) -> Backend:
    """Open the queue at ``target`` (a directory, or ``s3://BUCKET/PREFIX``) with the backend that serves it."""
    _check_target(target)
    if _is_bucket(target):
        # Imported here: botocore is an extra, and a filesystem queue must open without it.
        from steadqd.s3.open import open_bucket_queue

        return open_bucket_queue(target, **options)
    return FsQueue.open(target, **options)


def init_queue(target: str, **options: Any) -> Backend:
    """Create a queue at ``target`` (refused if one is there) and open it."""
    _check_target(target)
    if _is_bucket(target):
        from steadqd.s3.open import init_bucket_queue

        return init_bucket_queue(target, **options)
    return FsQueue.init(target, **options)


# -- tools that act on a path, not on an open queue ------------------------------
# A damaged tree must still be diagnosable, and a job file may be an export
# far from any queue, so these open nothing but what they are given.


def doctor(target: str) -> list[tuple[str, bool, str | BaseException]]:
    """The machine and filesystem checks for a queue at ``target`` (which need not exist yet):
    (name, passed, what was found or the error that made the probe fail)."""
    return list(doctor_checks(target))


def remove_bad_recovery_cursor(target: str) -> str | None:
    """Remove a filesystem queue's recovery cursor if it is what stops the queue's open (BadRecoveryCursor):
    what was wrong with it, or None when it is sound or absent. The queue is not opened otherwise."""
    if _is_bucket(target):
        raise InvalidInput(f"{target}: a bucket queue has no recovery cursor file")
    return fs_remove_bad_cursor(target)


def claim_path() -> str:
    """Which claim path a lease takes in this process: the C claim core or pure Python, and why (issue 35)."""
    return fs_claim_path()


def verify_file(path: str, *, deep: bool = False) -> Iterator[tuple[str, object]]:
    """Check one job or FORMAT file, yielding each fact as it is established; QueueCorrupt when a
    check fails, UnsupportedFormat when the file is neither, OSError when it cannot be read."""
    return fs_verify_file(path, deep=deep)


def dump_file(path: str) -> dict[str, object]:
    """The header fields of a job file or the record of a FORMAT file (errors as ``verify_file``)."""
    return fs_dump_file(path)


def parse_ticket(raw: bytes) -> Any:
    """The transition ticket an OutcomeUnknown wrote (its ``to_json``), for ``Backend.resolve``."""
    return TransitionTicket.from_json(raw)


def list_dead_files(target: str) -> list[Any] | None:
    """Every entry of the dead letters by a plain walk, parsed where the name parses; None if the
    queue has no dead letters directory. Opens no queue: it must work on a tree that cannot open."""
    return fs_list_dead_files(target)


def _fs_conforms(q: FsQueue) -> Backend:
    """Never called: mypy proves here that the filesystem backend meets the contract."""
    return q


def _bucket_conforms(q: BucketBackend) -> Backend:
    """Never called: mypy proves here that the bucket backend meets the contract (refusals included)."""
    return q
