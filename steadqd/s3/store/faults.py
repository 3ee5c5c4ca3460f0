"""The fault injector: any store, failing chosen calls the ways a network and an engine fail.

Why: every transition of the protocol must be proven against each way one of
its store calls can go wrong, and the ways differ in what the caller may
conclude. Each :class:`FaultKind` is one such way:

* ``BEFORE_SEND``: the request never left (connection refused, no route):
  ``NotCommitted``, nothing happened;
* ``TIMEOUT`` and ``CONNECTION_LOST``: the request left and no answer came;
  with ``applied=True`` the store did it first (the response was lost), with
  ``applied=False`` it did not; the caller gets ``OutcomeUnknown`` either
  way, so only a re-read can tell, which is the point;
* ``SERVER_ERROR``: a 5xx; a write may or may not have been applied
  (``applied`` again), so writes get ``OutcomeUnknown``;
* ``SLOW``: the answer is right but late (``delay_s``, through the ``sleep``
  the injector was given, so a test need not wait);
* ``STALE_LIST``: a listing that misses the newest ``lag`` keys written
  through this injector, allowed only when the profile does not promise P4.

A read never gets ``OutcomeUnknown``: it changes nothing, so every failed
read is ``NotCommitted``, as :mod:`steadqd.s3.store.s3` classifies them too.

Scripting is like ``steadqd.fs.linux.inject``: a fault matches an operation
(or any), a key prefix (or any), and fires at the ``nth`` matching call
(1-based) or at every one, at most ``times`` times. At most one fault fires
per call: the first armed that is due; the faults armed after it do not
count a call it took. :attr:`FaultyStore.trace`
records every call with its number, so a test counts a transition's store
calls first and then fails each position in turn.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from steadqd.errors import InvalidInput, NotCommitted, OutcomeUnknown, SteadQError
from steadqd.s3.store.base import (
    LIST_PAGE_MAX,
    MUTATIONS,
    OPERATIONS,
    Committed,
    ListPage,
    ObjectMeta,
    ObjectStore,
    PendingWrite,
    StoredObject,
    StoreProfile,
    check_sha256,
)

__all__ = ["Call", "Fault", "FaultKind", "FaultyStore"]

T = TypeVar("T")


class FaultKind(enum.Enum):
    BEFORE_SEND = "before_send"
    TIMEOUT = "timeout"
    CONNECTION_LOST = "connection_lost"
    SERVER_ERROR = "server_error"
    SLOW = "slow"
    STALE_LIST = "stale_list"


_AFTER_SEND = frozenset({FaultKind.TIMEOUT, FaultKind.CONNECTION_LOST, FaultKind.SERVER_ERROR})


@dataclass
class Fault:
    """One scripted failure; ``fired`` counts how often it did (read it after the block)."""

    kind: FaultKind
    op: str | None = None
    nth: int | None = None
    key_prefix: str = ""
    applied: bool = False
    times: int | None = 1
    delay_s: float = 0.0
    status: int = 503
    lag: int = 1
    seen: int = field(default=0, init=False)
    fired: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.op is not None and self.op not in OPERATIONS:
            raise InvalidInput(f"fault op {self.op!r} is not one of {', '.join(OPERATIONS)}")
        if self.nth is not None and self.nth < 1:
            raise InvalidInput(f"fault nth {self.nth}: calls are counted from 1")
        if self.times is not None and self.times < 1:
            raise InvalidInput(f"fault times {self.times}: give at least 1, or None for every matching call")
        if self.kind is FaultKind.STALE_LIST and self.op not in (None, "list"):
            raise InvalidInput("a STALE_LIST fault applies to list calls only: leave op unset or give 'list'")
        if self.applied and self.kind not in _AFTER_SEND:
            raise InvalidInput(
                f"applied=True means the store did the write; a {self.kind.value} fault never gets there"
            )
        if self.kind is FaultKind.SERVER_ERROR and not 500 <= self.status <= 599:
            raise InvalidInput(f"a SERVER_ERROR fault's status must be a 5xx, not {self.status}")

    def _matches(self, op: str, key: str) -> bool:
        if self.kind is FaultKind.STALE_LIST and op != "list":
            return False
        return (self.op is None or self.op == op) and key.startswith(self.key_prefix)

    def _due(self) -> bool:
        """Count one matching call; True if this fault fires on it."""
        self.seen += 1
        if self.times is not None and self.fired >= self.times:
            return False
        if self.nth is not None and self.seen != self.nth:
            return False
        self.fired += 1
        return True


@dataclass(frozen=True, slots=True)
class Call:
    """One call through the injector: its number (1-based, all operations), what, and what came of it."""

    n: int
    op: str
    key: str
    fault: FaultKind | None
    outcome: str


class FaultyStore:
    """Wraps ``inner``; faults armed with :meth:`inject` or :meth:`armed` decide each call's fate."""

    def __init__(self, inner: ObjectStore, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self._inner = inner
        self._sleep = sleep
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._recent: deque[str] = deque(maxlen=LIST_PAGE_MAX)  # keys created through here, newest last
        self.trace: list[Call] = []

    @property
    def inner(self) -> ObjectStore:
        return self._inner

    @property
    def profile(self) -> StoreProfile:
        return self._inner.profile

    @property
    def location(self) -> str:
        return f"{self._inner.location} (fault injector)"

    # -- scripting ----------------------------------------------------------------

    def inject(self, fault: Fault) -> Fault:
        """Arm ``fault`` until :meth:`clear`; faults are tried in the order they were armed."""
        if fault.kind is FaultKind.STALE_LIST and self.profile.strong_listing:
            raise InvalidInput(
                f"profile {self.profile.name!r} promises list-after-write (P4): a stale listing would be "
                "a broken engine, not a fault; use a profile with strong_listing=False"
            )
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    @contextmanager
    def armed(self, *faults: Fault) -> Iterator[tuple[Fault, ...]]:
        for fault in faults:
            self.inject(fault)
        try:
            yield faults
        finally:
            with self._lock:
                self._faults = [f for f in self._faults if all(f is not g for g in faults)]

    def count(self, op: str | None = None) -> int:
        """Calls made so far (of ``op``, or of any operation)."""
        with self._lock:
            return sum(1 for c in self.trace if op is None or c.op == op)

    # -- the calls ------------------------------------------------------------------

    def _pick(self, op: str, key: str) -> tuple[int, Fault | None]:
        """Number this call and choose its fault: the first armed one that is due (at most one fires)."""
        with self._lock:
            n = len(self.trace) + 1
            chosen = None
            for fault in self._faults:
                if fault._matches(op, key) and fault._due():
                    chosen = fault
                    break
            self.trace.append(Call(n, op, key, chosen.kind if chosen else None, "pending"))
            return n, chosen

    def _settle(self, n: int, outcome: str) -> None:
        with self._lock:
            call = self.trace[n - 1]
            self.trace[n - 1] = Call(call.n, call.op, call.key, call.fault, outcome)

    def _run(self, op: str, key: str, action: Callable[[], T], ticket: PendingWrite | None) -> T:
        n, fault = self._pick(op, key)
        try:
            result = self._with_fault(op, key, fault, action, ticket)
        except SteadQError as exc:
            self._settle(n, type(exc).__name__)
            raise
        self._settle(n, "ok")
        return result

    def _with_fault(
        self, op: str, key: str, fault: Fault | None, action: Callable[[], T], ticket: PendingWrite | None
    ) -> T:
        if fault is None or fault.kind is FaultKind.STALE_LIST:
            return action()
        if fault.kind is FaultKind.SLOW:
            self._sleep(fault.delay_s)
            return action()
        what = f"{op} {key}"
        if fault.kind is FaultKind.BEFORE_SEND:
            raise NotCommitted(f"{what}: injected failure before the request was sent; nothing happened")
        if fault.applied:
            try:
                action()
            except SteadQError:
                pass  # the store answered (e.g. 412) but the caller never hears it
        cause = f"HTTP {fault.status}" if fault.kind is FaultKind.SERVER_ERROR else fault.kind.value.replace("_", " ")
        if op not in MUTATIONS:
            raise NotCommitted(f"{what}: injected {cause}; a read changes nothing, retry it")
        raise OutcomeUnknown(f"{what}: injected {cause} after the request was sent; re-read the key", ticket)

    def put_if_absent(self, key: str, body: bytes, *, sha256: bytes | None = None) -> Committed:
        ticket = PendingWrite("put_if_absent", key, check_sha256(sha256, bytes(body)))

        def create() -> Committed:
            done = self._inner.put_if_absent(key, body, sha256=sha256)
            self._created(key)
            return done

        return self._run("put_if_absent", key, create, ticket)

    def put_if_match(self, key: str, body: bytes, etag: str, *, sha256: bytes | None = None) -> Committed:
        ticket = PendingWrite("put_if_match", key, check_sha256(sha256, bytes(body)), etag)
        return self._run("put_if_match", key, lambda: self._inner.put_if_match(key, body, etag, sha256=sha256), ticket)

    def delete(self, key: str) -> None:
        self._run("delete", key, lambda: self._inner.delete(key), PendingWrite("delete", key, None))

    def get(self, key: str, byte_range: tuple[int, int] | None = None, *, max_bytes: int | None = None) -> StoredObject:
        return self._run("get", key, lambda: self._inner.get(key, byte_range, max_bytes=max_bytes), None)

    def get_if_none_match(self, key: str, etag: str) -> StoredObject | None:
        return self._run("get_if_none_match", key, lambda: self._inner.get_if_none_match(key, etag), None)

    def head(self, key: str) -> ObjectMeta:
        return self._run("head", key, lambda: self._inner.head(key), None)

    def list_page(self, prefix: str, *, start_after: str | None = None, limit: int = LIST_PAGE_MAX) -> ListPage:
        n, fault = self._pick("list", prefix)
        try:
            page = self._with_fault(
                "list", prefix, fault, lambda: self._inner.list_page(prefix, start_after=start_after, limit=limit), None
            )
        except SteadQError as exc:
            self._settle(n, type(exc).__name__)
            raise
        if fault is not None and fault.kind is FaultKind.STALE_LIST:
            page = self._stale(page, fault.lag)
            self._settle(n, "stale")
        else:
            self._settle(n, "ok")
        return page

    def close(self) -> None:
        self._inner.close()

    # -- stale listings -----------------------------------------------------------------

    def _created(self, key: str) -> None:
        with self._lock:
            self._recent.append(key)

    def _stale(self, page: ListPage, lag: int) -> ListPage:
        """The page as an engine without list-after-write might serve it: the newest ``lag`` creations missing."""
        with self._lock:
            hidden = set(list(self._recent)[-lag:]) if lag > 0 else set()
        items = tuple(item for item in page.items if item.key not in hidden)
        return ListPage(items, page.next_start_after)
