"""The backend contract: what the daemons and the ``steadq`` command may ask of a queue.

The daemons (``steadqd.daemon``), the command line (``steadqd.cli``) and the
demo never import a backend package; they open a queue here and talk to it
through the protocols below. That keeps the exit policy, the renewal schedule,
the journal story and every command written once, whichever store holds the
jobs: SteadQ/1 on a local filesystem (``steadqd.fs``) today, StowQ/1 on an
object store behind the same seam next. ``lint-imports`` (pyproject.toml)
fails the build when a program imports a backend directly.

The protocols are structural (``typing.Protocol``): a backend implements them
by having the methods, and mypy checks every caller against them, so a method
a role needs and a backend lacks is a type error, not a crash in production.
A lease is passed back to the backend that returned it; its parameters are
typed ``Any`` because each backend's lease is its own class, and the
protocol only promises what a caller may read from one (``LeaseHandle``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any, BinaryIO, Protocol

from steadqd.backoff import RetryPolicy
from steadqd.errors import InvalidInput
from steadqd.fs.handle import Queue as FsQueue

__all__ = [
    "Backend",
    "LeaseHandle",
    "Payload",
    "URL_SCHEMES",
    "init_queue",
    "open_queue",
]

# Schemes of queue URLs this version knows of; a target with any other
# ``scheme://`` prefix is refused rather than taken for a relative path.
URL_SCHEMES: tuple[str, ...] = ()

# What a payload may be: bytes, or a binary file object that is streamed.
Payload = bytes | bytearray | memoryview | BinaryIO


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
    ) -> str:
        """Publish one job durably; returns its 32-hex id."""
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
        """Publish one job per payload; on failure ``EnqueueIncomplete`` names the published prefix."""
        ...

    # -- consuming -------------------------------------------------------------
    def lease(self, wait: float = 0.0, duration: float = 30.0) -> LeaseHandle | None: ...
    def renew(self, lease: Any, duration: float = 30.0) -> LeaseHandle: ...
    def ack(self, lease: Any) -> Any: ...
    def retry(self, lease: Any, delay: float | None = None, *, policy: RetryPolicy | None = None) -> str: ...
    def bury(self, lease: Any, reason: int = 1) -> None: ...
    def read_payload(self, lease: Any) -> bytes: ...
    def copy_payload(self, lease: Any, out: BinaryIO) -> int: ...

    # -- durability and maintenance --------------------------------------------
    def batch(self) -> AbstractContextManager[Any]:
        """Share barriers across the mutations made inside the block."""
        ...

    def sync(self) -> None: ...
    def recover(self, budget_ops: int = 1000, budget_ms: int = 100, *, phases: tuple[str, ...] | None = None) -> Any:
        """One bounded recovery pass; store problems are reported, never raised."""
        ...

    def close(self) -> None: ...

    # -- waking the daemons (owned by the daemon restructure) ------------------

    # -- operator views and tools (owned by the CLI restructure) ---------------


def _check_target(target: str) -> None:
    scheme, sep, _ = target.partition("://")
    if sep and scheme and scheme.isalnum() and scheme not in URL_SCHEMES:
        raise InvalidInput(
            f"{target!r}: queues at {scheme}:// URLs are not supported by this version; give a directory path"
        )


def open_queue(target: str, **options: Any) -> Backend:
    """Open the queue at ``target`` with the backend that serves it."""
    _check_target(target)
    return FsQueue.open(target, **options)


def init_queue(target: str, **options: Any) -> Backend:
    """Create a queue at ``target`` (refused if one is there) and open it."""
    _check_target(target)
    return FsQueue.init(target, **options)


def _fs_conforms(q: FsQueue) -> Backend:
    """Never called: mypy proves here that the filesystem backend meets the contract."""
    return q
