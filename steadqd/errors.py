"""The error model of SteadQ/1 (spec: errors.md).

Every failure of a queue operation is a :class:`SteadQError` carrying an
:class:`ErrorKind`; the kind decides the CLI exit code. The three outcome
classes a caller must distinguish after a mutation are separate types:

* :class:`NotCommitted` -- provably nothing happened; safe to retry.
* :class:`OutcomeUnknown` -- the linearizing link/rename may have happened
  but a barrier after it failed; the handle is poisoned and the attached
  ticket says where to look (``Queue.resolve``).
* :class:`LeaseLost` -- the exact leased file is gone; the token is void.

Lower layers (names, records) raise :class:`CorruptObject` carrying the
quarantine reason code the object would be isolated with, so the protocol
layer never has to guess why something failed verification.
"""

from __future__ import annotations

import enum
from typing import Any


class ErrorKind(enum.Enum):
    """Error kinds with their CLI exit codes (errors.md)."""

    INVALID_INPUT = ("invalid_input", 1)
    INVALID_TICKET = ("invalid_ticket", 1)
    NOT_COMMITTED = ("not_committed", 1)
    MAINTENANCE_BUSY = ("maintenance_busy", 1)
    IDENTITY_COLLISION = ("identity_collision", 1)
    ALREADY_EXISTS = ("already_exists", 1)
    NOT_FOUND = ("not_found", 1)
    QUEUE_CORRUPT = ("queue_corrupt", 3)
    PAYLOAD_CORRUPT = ("payload_corrupt", 3)
    QUEUE_POISONED = ("queue_poisoned", 3)
    RESOURCE_EXHAUSTED = ("resource_exhausted", 4)
    STATE_EXHAUSTED = ("state_exhausted", 4)
    PERMISSION_DENIED = ("permission_denied", 5)
    IO_FAILURE = ("io_failure", 6)
    UNSUPPORTED_FILESYSTEM = ("unsupported_filesystem", 64)
    UNSUPPORTED_FORMAT = ("unsupported_format", 64)
    UNSUPPORTED_STORE = ("unsupported_store", 64)

    @property
    def label(self) -> str:
        return self.value[0]

    @property
    def exit_code(self) -> int:
        return self.value[1]


class SteadQError(Exception):
    """Base of every error raised by steadqd."""

    default_kind = ErrorKind.IO_FAILURE

    def __init__(self, message: str, kind: ErrorKind | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind or self.default_kind

    @property
    def exit_code(self) -> int:
        return self.kind.exit_code


# --- Errors that are not outcomes of a mutation. ---


class InvalidInput(SteadQError):
    default_kind = ErrorKind.INVALID_INPUT


class QueueCorrupt(SteadQError):
    default_kind = ErrorKind.QUEUE_CORRUPT


class BadRecoveryCursor(QueueCorrupt):
    """``control/recovery-cursor.json`` is unreadable or malformed, so the open refuses the queue.

    The reference refuses such a queue too (open-questions 22), so steadqd
    does as well; but the file only records where maintenance stands, and
    removing it is always safe (records.md: recovery then starts over). A
    type of its own lets ``steadq fsck --repair`` take that step and nothing
    else, and lets the message name the fix (a lying fsync and a power cut
    can leave it empty).
    """


class UnsupportedFilesystem(SteadQError):
    default_kind = ErrorKind.UNSUPPORTED_FILESYSTEM


class UnsupportedFormat(SteadQError):
    default_kind = ErrorKind.UNSUPPORTED_FORMAT


class AlreadyExists(SteadQError):
    default_kind = ErrorKind.ALREADY_EXISTS


class MaintenanceBusy(SteadQError):
    default_kind = ErrorKind.MAINTENANCE_BUSY


class QueuePoisoned(SteadQError):
    """The handle saw an indeterminate failure earlier and refuses to mutate."""

    default_kind = ErrorKind.QUEUE_POISONED


class StateExhausted(SteadQError):
    """Generation, attempt, bucket or sequence arithmetic would overflow."""

    default_kind = ErrorKind.STATE_EXHAUSTED


class InvalidKey(SteadQError):
    """An object key is not one of the StowQ/1 key shapes (keys.abnf).

    ``key`` is the offending key (escape it before printing) and ``error_class``
    names the first rule it broke, spelled as the reference parser's error
    classes are: ``unknown_prefix``, ``segment_count``, ``field:<name>`` or
    ``terminal_kind``. A key listed from a bucket that fails here is a
    quarantine candidate (key_parse_failed); the scan that found it decides.
    """

    default_kind = ErrorKind.QUEUE_CORRUPT

    def __init__(self, message: str, *, key: str, error_class: str) -> None:
        super().__init__(message)
        self.key = key
        self.error_class = error_class


class CorruptObject(SteadQError):
    """An on-disk object failed parsing or verification.

    ``reason`` is the quarantine reason code (constants.QuarantineReason)
    that fits the failure; ``payload`` is True only for a payload digest
    mismatch, which the spec reports as the distinct kind PayloadCorrupt.
    """

    default_kind = ErrorKind.QUEUE_CORRUPT

    def __init__(self, message: str, reason: int, *, payload: bool = False) -> None:
        super().__init__(message, ErrorKind.PAYLOAD_CORRUPT if payload else ErrorKind.QUEUE_CORRUPT)
        self.reason = int(reason)
        self.payload = payload


class CorruptRecord(CorruptObject):
    """A canonical-CBOR item or a StowQ/1 record failed one of the decoder's checks.

    ``error_class`` names the check that failed first ("cbor:non_minimal_integer",
    "digest", "binding", "field:uint", ...: the classes of the spec's reject
    vectors), so a repair scan and the tests can tell why without parsing the
    message. ``reason`` is a StowQ/1 quarantine reason (``steadqd.s3.records``);
    its codes 0x0001-0x0007 mean the same as SteadQ/1's. ``kind`` overrides the
    default when the record is well formed but asks for what this version
    cannot do (an unknown required feature bit is UNSUPPORTED_FORMAT).
    """

    def __init__(
        self, message: str, reason: int, *, error_class: str, payload: bool = False, kind: ErrorKind | None = None
    ) -> None:
        super().__init__(message, reason, payload=payload)
        self.error_class = error_class
        if kind is not None:
            self.kind = kind


class ConfigError(SteadQError):
    """A configuration file is invalid; names the file, line and key."""

    default_kind = ErrorKind.INVALID_INPUT

    def __init__(
        self, message: str, *, path: str | None = None, line: int | None = None, key: str | None = None
    ) -> None:
        where = ""
        if path is not None:
            where = path if line is None else f"{path}:{line}"
        prefix = f"{where}: " if where else ""
        if key:
            prefix += f"{key}: "
        super().__init__(prefix + message)
        self.path = path
        self.line = line
        self.key = key


# --- Outcome classes of a mutation. ---


class NotCommitted(SteadQError):
    """The linearization point provably did not happen; nothing changed."""

    default_kind = ErrorKind.NOT_COMMITTED

    def __init__(self, message: str, kind: ErrorKind | None = None, *, job_id: str | None = None) -> None:
        super().__init__(message, kind)
        self.job_id = job_id


class DuplicateJob(NotCommitted):
    """A unique enqueue found its key's job already in the queue: nothing was written; ``job_id`` is that job.

    Not committed (the enqueue provably did nothing) with the kind already_exists (exit 1)."""

    def __init__(self, message: str, job_id: str) -> None:
        super().__init__(message, ErrorKind.ALREADY_EXISTS, job_id=job_id)


class OutcomeUnknown(SteadQError):
    """The transition may have happened; a barrier after it failed.

    ``ticket`` is a :class:`steadqd.fs.json_records.TransitionTicket` for lease
    transitions, or an :class:`steadqd.fs.json_records.EnqueueTicket` for enqueue.
    The handle that raised this is poisoned.
    """

    default_kind = ErrorKind.IO_FAILURE

    def __init__(self, message: str, ticket: Any = None) -> None:
        super().__init__(message, ErrorKind.IO_FAILURE)
        self.ticket = ticket

    @property
    def exit_code(self) -> int:
        return 2


class LeaseLost(SteadQError):
    """The exact leased file is gone: the lease no longer authorises anything."""

    default_kind = ErrorKind.NOT_FOUND


# --- What an object store answers (steadqd.s3.store). ---


class NotFound(SteadQError):
    """The store has no object at the key (or no such byte range of it, or no such bucket)."""

    default_kind = ErrorKind.NOT_FOUND


class PreconditionFailed(SteadQError):
    """A compare-and-swap lost: the object is not at the version the caller named (or is gone).

    Nothing was written; re-read the object and decide again.
    """

    default_kind = ErrorKind.NOT_COMMITTED


class ChecksumMismatch(NotCommitted):
    """The store refused a body whose SHA-256 is not the one sent with it: nothing was written."""


class StoreProfileViolation(SteadQError):
    """A store lacks, or broke, a primitive StowQ/1 relies on (store-profiles.md P1-P8).

    ``primitive`` names it ("P1 put-if-absent", "ranged GET", ...) so the refusal
    says which promise the endpoint does not keep.
    """

    default_kind = ErrorKind.UNSUPPORTED_STORE

    def __init__(self, message: str, *, primitive: str) -> None:
        super().__init__(f"{primitive}: {message}")
        self.primitive = primitive


class NotSupportedHere(SteadQError):
    """The queue's backend does not offer this operation (yet): nothing was read or changed.

    Why a refusal and not an empty answer: an operator tool that says "no
    dead letters" or "fsck: clean" for a store it never examined is worse
    than one that says it cannot look (exit 64, like an unsupported store).
    """

    default_kind = ErrorKind.UNSUPPORTED_STORE


class EnqueueIncomplete(SteadQError):
    """``enqueue_many`` published the first jobs of its input, then failed.

    ``published`` holds the ids (32 hex) of the jobs that are enqueued --
    durable, or with their directory barrier handed to the enclosing batch --
    and is always a prefix of the input: the first ``len(published)`` payloads,
    in order. ``cause`` is why the rest is not: a :class:`NotCommitted` (none of
    the rest exists; safe to retry them) or an :class:`OutcomeUnknown` naming
    the jobs whose directory barrier failed (the handle is poisoned). Kind and
    exit code are the cause's, so a caller that only looks at those sees the
    failure it would have seen from one ``enqueue``. Raised only when at least
    one job was published; otherwise the cause itself is raised.
    """

    def __init__(self, published: list[str], cause: NotCommitted | OutcomeUnknown) -> None:
        super().__init__(f"{len(published)} job(s) enqueued, the rest not: {cause.message}", cause.kind)
        self.published = published
        self.cause = cause

    @property
    def exit_code(self) -> int:
        return self.cause.exit_code


def kind_for_errno(err: int) -> ErrorKind:
    """Map an errno seen before linearization to the spec's error kind."""
    import errno as _errno

    if err in (_errno.ENOSPC, _errno.EDQUOT):
        return ErrorKind.RESOURCE_EXHAUSTED
    return ErrorKind.IO_FAILURE
