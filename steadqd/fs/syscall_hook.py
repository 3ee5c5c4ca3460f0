"""The one point every system call of steadqd passes: tracing and fault injection.

:mod:`steadqd.fs.linux` performs each syscall through :func:`call` (or, when
nothing is armed or tracing, tests :data:`_armed` and :data:`_traces` itself
and skips the frame). Tests and the crash lab count syscall positions with
:func:`trace` and make the Nth call fail before or after its side effect with
:func:`inject`, without monkeypatching. Op names are a stable contract
(:data:`OPS`). Kept apart from the wrappers because it answers another
question: not "how is this call made" but "which call is this, and does it fail".

This module imports nothing else from steadqd.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

__all__ = ["OPS", "Fault", "TraceEvent", "ReplayMismatch", "call", "inject", "replay", "trace"]

T = TypeVar("T")

OPS = frozenset(
    {
        "open", "openat2", "close", "mkdir", "stat", "fstat", "fsync", "write", "pwrite", "read",
        "rename_noreplace", "rename", "link", "unlink", "rmdir", "listdir", "lock", "statfs",
        "clock", "getrandom", "fchmod", "tmpfile", "dup", "sync_file_range",
    }
)  # fmt: skip
"""Every op name :func:`call` is used with; tests and the crash lab key on these strings."""


class TraceEvent(NamedTuple):
    """One syscall attempt: the op name, a small tuple of its interesting arguments,
    and the errno the real call failed with (0: it succeeded, or was never made)."""

    op: str
    detail: tuple[Any, ...]
    failed: int = 0


@dataclass
class Fault:
    """An armed fault: the ``nth`` call matching ``op`` (all ops if None) fails with ``errno``.

    ``fired`` becomes True only when the injected error was actually raised
    (with ``after=True``, a target call whose real syscall failed propagates
    the real error, consumes the fault and leaves ``fired`` False).
    ``calls_seen`` counts every matching call while armed, also after the
    fault fired, so arming a huge ``nth`` counts an operation's positions.
    """

    nth: int
    errno: int
    op: str | None = None
    after: bool = False
    fired: bool = False
    fired_op: str | None = None
    calls_seen: int = 0


_lock = threading.Lock()
# The armed fault (at most one) and the live traces. Lists, changed in place and
# never rebound, so that the wrappers' module can import them and test them
# directly on every call (an empty list: the production case).
_armed: list[Fault] = []
_traces: list[list[TraceEvent]] = []


def call(
    op: str,
    fn: Callable[..., T],
    *args: Any,
    detail: tuple[Any, ...] = (),
    discard: Callable[[T], object] | None = None,
) -> T:
    """Run one syscall wrapper ``fn(*args)`` as op ``op``: record it, maybe fail it.

    ``discard`` undoes a returned resource (closes an fd) when an after-fault
    throws the result away, so injected failures do not leak descriptors.
    """
    if not _armed and not _traces:
        # Nothing armed or tracing (the production case): skip the lock. Arming
        # and tracing happen before the calls they are meant to see, so an
        # unlocked read cannot miss one of those. The hottest wrappers make this
        # same test themselves and call ``fn`` directly: a frame less per syscall.
        return fn(*args)
    if _replays:  # this thread's calls may have been made already (the C claim core: :func:`replay`)
        pending = _replays.get(threading.get_ident())
        if pending:
            return _replayed(op, pending)
    fire = False
    after = False
    code = 0
    # Names travel raw and are decoded only here, for the trace (str, lossless).
    detail = tuple(_s(x) if isinstance(x, (bytes, os.PathLike)) else x for x in detail)
    with _lock:
        # Appended before the call, under the lock, so that the trace keeps the
        # order in which threads made their calls; a real failure is noted below
        # in the plain lists of trace() (other hooks, such as the crash lab's
        # recorder, only receive appends).
        recorded = [(events, len(events)) for events in _traces if type(events) is list]
        for events in _traces:
            events.append(TraceEvent(op, detail))
        fault = _armed[0] if _armed else None
        if fault is not None and (fault.op is None or fault.op == op):
            fault.calls_seen += 1
            if fault.calls_seen == fault.nth:
                fire, after, code = True, fault.after, fault.errno
                if not after:
                    fault.fired, fault.fired_op = True, op
    if fire and not after:
        raise OSError(code, os.strerror(code))
    try:
        result = fn(*args)
    except OSError as e:
        if recorded:
            with _lock:
                for events, i in recorded:
                    events[i] = events[i]._replace(failed=e.errno or _errno.EIO)
        raise
    if fire:
        with _lock:
            assert fault is not None
            fault.fired, fault.fired_op = True, op
        if discard is not None:
            with contextlib.suppress(OSError):
                discard(result)
        raise OSError(code, os.strerror(code))
    return result


@contextlib.contextmanager
def inject(*, nth: int, errno: int, op: str | None = None, after: bool = False) -> Iterator[Fault]:
    """Arm one fault for the duration of the block; it fires at most once.

    With ``after=False`` the Nth matching call raises ``OSError(errno)`` before
    the real syscall (no side effect); with ``after=True`` the real syscall runs
    and succeeds, then the caller still gets the error (a crash-lab stand-in
    for "the rename happened but we never learned it").
    """
    if nth < 1:
        raise ValueError("nth is 1-based")
    if op is not None and op not in OPS:
        raise ValueError(f"unknown op {op!r}")
    fault = Fault(nth=nth, errno=errno, op=op, after=after)
    with _lock:
        if _armed:
            raise RuntimeError("a fault is already armed")
        _armed.append(fault)
    try:
        yield fault
    finally:
        with _lock:
            _armed.clear()


@contextlib.contextmanager
def trace() -> Iterator[list[TraceEvent]]:
    """Record every syscall made (by any thread) while the block runs; nested traces all see them."""
    events: list[TraceEvent] = []
    with _lock:
        _traces.append(events)
    try:
        yield events
    finally:
        with _lock:
            for i, active in enumerate(_traces):
                if active is events:
                    del _traces[i]
                    break


class ReplayMismatch(AssertionError):
    """The Python asked for another syscall than the one replayed: the C claim core and its Python specification disagree."""


class _ReplayMarker:
    """Kept in ``_traces`` while a replay runs, so that every wrapper takes :func:`call`'s slow path; records nothing."""

    def append(self, event: TraceEvent) -> None:
        pass


_replays: dict[int, list[tuple[str, Any]]] = {}  # thread -> its pending (op, result or exception), reversed
_REPLAY_MARKER = _ReplayMarker()


def _replayed(op: str, pending: list[tuple[str, Any]]) -> Any:
    want, result = pending.pop()
    if want != op:
        raise ReplayMismatch(f"replayed syscall is {want!r}, the Python made {op!r}")
    if isinstance(result, BaseException):
        raise result
    return result


@contextlib.contextmanager
def replay(results: list[tuple[str, Any]]) -> Iterator[list[tuple[str, Any]]]:
    """Serve this thread's next syscalls from ``results`` ((op, value or exception) in order), then go live.

    Why: the C claim core (steadqd.fs.compiled.bridge) makes the claim's syscalls itself and stops at
    the first deviation; the Python then runs its own code for that candidate from the start,
    and the syscalls C already made return what they returned to C (or raise what they raised)
    instead of being made twice. Replayed calls are neither traced nor faulted again: they were,
    when C made them. Yields the pending list (empty once all were consumed).

    While a replay runs, a marker in ``_traces`` sends every thread's syscall wrappers through
    :func:`call`'s slow path, not only this thread's: the fast path's test is one global read,
    and a per-thread test there would cost every syscall of every job. Replays happen only at
    a deviation (a hostile or changed file, a fault), so the other threads pay rarely.
    """
    pending = list(reversed(results))
    ident = threading.get_ident()
    with _lock:
        if ident in _replays:
            raise RuntimeError("a replay is already running in this thread")
        _replays[ident] = pending
        _traces.append(_REPLAY_MARKER)  # type: ignore[arg-type]
    try:
        yield pending
    finally:
        with _lock:
            del _replays[ident]
            for i, active in enumerate(_traces):
                if active is _REPLAY_MARKER:  # type: ignore[comparison-overlap]
                    del _traces[i]
                    break


def _s(name: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> str:
    """Names in trace details are str (surrogateescape keeps them lossless)."""
    return os.fsdecode(name)
