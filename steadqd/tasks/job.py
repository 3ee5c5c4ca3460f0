"""What a handler gets (:class:`Job`) and what it may raise to say how its job ends (:class:`Bury`,
:class:`BadPayload`, :class:`Retry`); what a worker did (:class:`WorkStats`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from steadqd import progress as progress_mod
from steadqd.constants import DeadReason
from steadqd.errors import InvalidInput


class Bury(Exception):
    """Raised by a handler: the job is dead-lettered with ``reason`` and not retried.

    ``reason`` is a dead-letter reason code (reasons.md): the registry's
    0x0001 consumer_rejected by default, or the application's own in
    0x0100-0x7fff, which ``steadq ls dead`` and ``admin dead-inspect`` show.
    """

    def __init__(self, message: str = "", reason: int = DeadReason.CONSUMER_REJECTED) -> None:
        if isinstance(reason, bool) or not isinstance(reason, int) or not 0 <= reason <= 0xFFFF:
            raise InvalidInput(f"Bury reason must be a u16 dead-letter reason code, got {reason!r}")
        super().__init__(message)
        self.reason = int(reason)


class BadPayload(Bury, ValueError):
    """The payload cannot be decoded (not JSON, not UTF-8, nested deeper than the decoder goes).

    No retry can make it readable, so, uncaught, it buries the job at once
    as an unsupported content type rather than burning every attempt; a
    ValueError too, for the handlers that catch the one ``json.loads`` raises.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, DeadReason.UNSUPPORTED_CONTENT_TYPE)


class Retry(Exception):
    """Raised by a handler: give the job back now, or after ``delay`` seconds,
    instead of after the backoff (it still uses up the attempt)."""

    def __init__(self, message: str = "", delay: float | None = None) -> None:
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int | float) or not delay >= 0):
            raise InvalidInput(f"Retry delay must be a non-negative number of seconds, got {delay!r}")
        super().__init__(message)
        self.delay = delay


@dataclass(frozen=True)
class Job:
    """What a handler gets: the verified payload and the job's facts."""

    id: str
    attempt: int
    max_attempts: int
    content_type: str
    metadata: Mapping[str, bool | int | str | bytes]
    payload: bytes
    _lost: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    _progress: list[tuple[float, str]] = field(default_factory=list, repr=False, compare=False)

    def json(self) -> Any:
        """The payload as JSON; :class:`BadPayload` (a ValueError) if the decoder cannot read it."""
        try:
            return json.loads(self.payload)
        except (ValueError, RecursionError) as e:  # RecursionError: arrays nested ~100k deep
            raise BadPayload(f"job {self.id} has a bad payload, not JSON: {e}") from e

    def text(self) -> str:
        return self.payload.decode()

    def progress(self, percent: float, text: str = "") -> None:
        """Report progress (0–100, and a short text) for ``steadq show``/``ls`` on this host.

        Cheap to call often: the latest value is published by the worker's
        renewing thread, at most once a second (steadqd/progress.py), and
        removed when the job ends.
        """
        if isinstance(percent, bool) or not isinstance(percent, int | float) or not 0 <= percent <= 100:
            raise InvalidInput(f"progress must be a number from 0 to 100, got {percent!r}")
        if not isinstance(text, str):
            raise InvalidInput(f"progress text must be a string, got {type(text).__name__}")
        self._progress[:] = [(float(percent), text[: progress_mod.MAX_TEXT])]  # one item: replaced atomically

    @property
    def lease_lost(self) -> bool:
        """True once the lease is gone: a long handler may check it and stop early."""
        return self._lost.is_set()


@dataclass
class WorkStats:
    """What :meth:`Worker.run` did, for the caller's own logs and tests."""

    acked: int = 0
    retried: int = 0
    buried: int = 0
    lost: int = 0  # leases lost before the handler's result could settle them
    handed_back: int = 0  # running at a forced stop, leases returned
    quarantined: int = 0  # corrupt jobs the queue isolated (at the lease scan or the payload check) instead
