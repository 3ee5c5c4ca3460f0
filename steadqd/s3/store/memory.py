"""A linearizable in-memory object store with its own store clock.

Why it exists: the model-based and fault tests need a store whose every
answer is exactly what the primitives promise, with time the test controls,
so a failure is the protocol's and not the network's. Linearizable because
each operation takes one lock for its whole duration: the order in which
operations take it is an order consistent with real time, which is what P1
to P4 ask of a real engine.

It imitates S3 where a protocol bug could hide behind a difference: the
ETag is the MD5 of the body (so rewriting the same bytes gives the same
version, as S3 does), an overwrite gets a new store time, deleting an absent
key succeeds, ranges follow the half-open rules, LIST is in byte order and
pages at 1,000 keys.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from steadqd.errors import AlreadyExists, ChecksumMismatch, InvalidInput, NotFound, PreconditionFailed
from steadqd.s3.store.base import (
    MEMORY,
    Committed,
    ListPage,
    ObjectMeta,
    StoredObject,
    StoreProfile,
    check_if_match,
    check_list_limit,
    check_max_bytes,
    check_range,
    check_sha256,
    quantize,
    sha256_of,
)

__all__ = ["ManualClock", "MemoryStore", "WallClock"]


class ManualClock:
    """Store time a test moves: starts at ``start_ns`` and steps ``step_ns`` at every write.

    A positive step makes store times strictly increasing, as one engine's
    clock is for writes that follow each other; ``advance`` jumps ahead
    (never back) to model waiting for a lease to expire.
    """

    def __init__(self, start_ns: int = 1_700_000_000 * 1_000_000_000, step_ns: int = 1) -> None:
        if start_ns < 0 or step_ns < 0:
            raise InvalidInput("ManualClock: start_ns and step_ns must not be negative")
        self._now = start_ns
        self._step = step_ns
        self._lock = threading.Lock()

    def now_ns(self) -> int:
        """The time the next write gets; later writes get later times."""
        with self._lock:
            self._now += self._step
            return self._now

    def peek_ns(self) -> int:
        with self._lock:
            return self._now

    def advance(self, ns: int) -> None:
        if ns < 0:
            raise InvalidInput(f"ManualClock.advance({ns}): store time never goes back")
        with self._lock:
            self._now += ns


class WallClock:
    """Store time from this machine's clock, held monotone (a store's clock may stall, never run back)."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def now_ns(self) -> int:
        with self._lock:
            self._last = max(self._last, time.time_ns())
            return self._last


@dataclass(frozen=True, slots=True)
class _Entry:
    body: bytes
    etag: str
    store_time_ns: int


class _Bucket:
    """The state every handle of one in-memory bucket shares."""

    def __init__(self, clock: ManualClock | WallClock) -> None:
        self.clock = clock
        self.objects: dict[str, _Entry] = {}
        self.keys: list[str] = []  # sorted: LIST is a bisect, not a sort
        self.lock = threading.Lock()


class MemoryStore:
    """One bucket in memory. Handles made with :meth:`peer` share the objects, as two clients of one engine do."""

    def __init__(
        self,
        *,
        clock: ManualClock | WallClock | None = None,
        profile: StoreProfile = MEMORY,
        name: str = "memory",
        _bucket: _Bucket | None = None,
    ) -> None:
        self._bucket = _bucket or _Bucket(clock or ManualClock())
        self._profile = profile
        self._name = name

    @property
    def profile(self) -> StoreProfile:
        return self._profile

    @property
    def location(self) -> str:
        return f"memory:{self._name}"

    @property
    def clock(self) -> ManualClock | WallClock:
        return self._bucket.clock

    def peer(self) -> MemoryStore:
        """Another handle on the same objects (the certification's second client)."""
        return MemoryStore(profile=self._profile, name=self._name, _bucket=self._bucket)

    # -- writes ---------------------------------------------------------------

    def _check_body(self, key: str, body: bytes, sha256: bytes | None) -> bytes:
        body = bytes(body)
        if not key:
            raise InvalidInput("an object key must not be empty")
        digest = check_sha256(sha256, body)
        if self._profile.verifies_checksum and digest != sha256_of(body):
            raise ChecksumMismatch(f"{key}: the body's SHA-256 is not the one sent with it; nothing was written")
        return body

    def _store(self, key: str, body: bytes) -> Committed:
        etag = hashlib.md5(body, usedforsecurity=False).hexdigest()
        stamp = quantize(self._bucket.clock.now_ns(), self._profile.granularity_ns)
        if key not in self._bucket.objects:
            bisect.insort(self._bucket.keys, key)
        self._bucket.objects[key] = _Entry(body, etag, stamp)
        return Committed(key, etag)

    def put_if_absent(self, key: str, body: bytes, *, sha256: bytes | None = None) -> Committed:
        body = self._check_body(key, body, sha256)
        with self._bucket.lock:
            if key in self._bucket.objects:
                raise AlreadyExists(f"{key}: an object is already there")
            return self._store(key, body)

    def put_if_match(self, key: str, body: bytes, etag: str, *, sha256: bytes | None = None) -> Committed:
        body = self._check_body(key, body, sha256)
        check_if_match(self._profile, key, etag)
        with self._bucket.lock:
            entry = self._bucket.objects.get(key)
            if entry is None:
                raise PreconditionFailed(f"{key}: no object to replace (expected version {etag})")
            # As the engine an if_match_prefix profile describes compares (Ceph RGW: strncmp).
            matched = etag.startswith(entry.etag) if self._profile.if_match_prefix else entry.etag == etag
            if not matched:
                raise PreconditionFailed(f"{key}: at version {entry.etag}, not {etag}")
            return self._store(key, body)

    def delete(self, key: str) -> None:
        with self._bucket.lock:
            if self._bucket.objects.pop(key, None) is not None:
                del self._bucket.keys[bisect.bisect_left(self._bucket.keys, key)]

    # -- reads ----------------------------------------------------------------

    def _meta(self, key: str, entry: _Entry) -> ObjectMeta:
        return ObjectMeta(key, entry.etag, len(entry.body), entry.store_time_ns)

    def _entry(self, key: str) -> _Entry:
        entry = self._bucket.objects.get(key)
        if entry is None:
            raise NotFound(f"{key}: no such object")
        return entry

    def get(self, key: str, byte_range: tuple[int, int] | None = None, *, max_bytes: int | None = None) -> StoredObject:
        check_max_bytes(key, byte_range, max_bytes)
        with self._bucket.lock:
            entry = self._entry(key)
        span = check_range(key, byte_range, len(entry.body))
        body = entry.body if span is None else entry.body[span[0] : span[1]]
        if max_bytes is not None:
            body = body[:max_bytes]
        return StoredObject(self._meta(key, entry), body)

    def get_if_none_match(self, key: str, etag: str) -> StoredObject | None:
        with self._bucket.lock:
            entry = self._entry(key)
        if entry.etag == etag:
            return None
        return StoredObject(self._meta(key, entry), entry.body)

    def head(self, key: str) -> ObjectMeta:
        with self._bucket.lock:
            return self._meta(key, self._entry(key))

    def list_page(self, prefix: str, *, start_after: str | None = None, limit: int = 1000) -> ListPage:
        limit = check_list_limit(limit)
        if limit == 0:
            return ListPage((), None)
        keys = self._bucket.keys
        with self._bucket.lock:
            if start_after is not None and start_after >= prefix:
                i = bisect.bisect_right(keys, start_after)
            else:
                i = bisect.bisect_left(keys, prefix)
            items: list[ObjectMeta] = []
            while i < len(keys) and keys[i].startswith(prefix) and len(items) < limit:
                items.append(self._meta(keys[i], self._bucket.objects[keys[i]]))
                i += 1
            more = i < len(keys) and keys[i].startswith(prefix)
        return ListPage(tuple(items), items[-1].key if more and items else None)

    def close(self) -> None:
        """Nothing to release; the objects stay for other handles."""

    # -- for tests: the truth, independently of LIST ----------------------------

    def snapshot(self) -> dict[str, bytes]:
        """Every object's body by key, read under the lock (an atomic picture)."""
        with self._bucket.lock:
            return {key: entry.body for key, entry in self._bucket.objects.items()}

    def keys(self, prefix: str = "") -> Iterator[str]:
        with self._bucket.lock:
            return iter([k for k in self._bucket.keys if k.startswith(prefix)])
