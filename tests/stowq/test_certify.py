"""Certification passes a store that keeps every promise and names the one a broken store breaks.

Each broken store below is the in-memory store with one primitive bent the
way real look-alikes bend it; certification must fail that primitive and
only that one, and :meth:`Certification.require` must refuse it by name.
"""

from __future__ import annotations

import hashlib

import pytest

from steadqd.errors import ErrorKind, NotCommitted, NotFound, StoreProfileViolation
from steadqd.s3.certify import Certification, certify
from steadqd.s3.store.base import Committed, ListPage, ObjectMeta, StoredObject, StoreProfile
from steadqd.s3.store.faults import Fault, FaultKind, FaultyStore
from steadqd.s3.store.memory import ManualClock, MemoryStore

NO_WAIT = {"sleep": lambda _s: None, "large_body_bytes": 64 * 1024}


def _failed(result: Certification) -> list[str]:
    return [f"{c.primitive} {c.title}" for c in result.failures]


def test_a_store_that_keeps_every_promise_is_certified_and_left_clean() -> None:
    store = MemoryStore()
    store.put_if_absent("someone-else/key", b"untouched")
    result = certify(store, peer=store.peer(), **NO_WAIT)
    assert result.certified, result.report()
    assert len(result.checks) == 11 and all(c.passed for c in result.checks)
    result.require()
    assert store.snapshot() == {"someone-else/key": b"untouched"}  # only its scratch prefix, and all of it deleted
    assert "certified" in result.report().splitlines()[0]
    assert result.measured["P7 mode"] == "the store verifies SHA-256"


class IgnoresIfNoneMatch(MemoryStore):
    """Accepts a create over an existing key: the engine that drops the header."""

    def put_if_absent(self, key: str, body: bytes, *, sha256: bytes | None = None) -> Committed:
        self.delete(key)
        return super().put_if_absent(key, body, sha256=sha256)


class CasCreates(MemoryStore):
    """Treats If-Match on an absent key as a plain PUT."""

    def put_if_match(self, key: str, body: bytes, etag: str, *, sha256: bytes | None = None) -> Committed:
        try:
            self.head(key)
        except NotFound:
            return super().put_if_absent(key, body, sha256=sha256)
        return super().put_if_match(key, body, etag, sha256=sha256)


class IgnoresIfMatch(MemoryStore):
    def put_if_match(self, key: str, body: bytes, etag: str, *, sha256: bytes | None = None) -> Committed:
        return super().put_if_match(key, body, self.head(key).etag, sha256=sha256)


class UnsortedList(MemoryStore):
    def list_page(self, prefix: str, *, start_after: str | None = None, limit: int = 1000) -> ListPage:
        page = super().list_page(prefix, start_after=start_after, limit=limit)
        return ListPage(tuple(reversed(page.items)), page.next_start_after)


class ClockRunsBack(MemoryStore):
    def head(self, key: str) -> ObjectMeta:
        meta = super().head(key)
        return ObjectMeta(meta.key, meta.etag, meta.size, 10**18 - meta.store_time_ns)


class SurfacesDisagree(MemoryStore):
    def list_page(self, prefix: str, *, start_after: str | None = None, limit: int = 1000) -> ListPage:
        page = super().list_page(prefix, start_after=start_after, limit=limit)
        shifted = tuple(ObjectMeta(m.key, m.etag, m.size, m.store_time_ns + 7) for m in page.items)
        return ListPage(shifted, page.next_start_after)


class TornReads(MemoryStore):
    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> StoredObject:
        got = super().get(key, byte_range)
        if len(got.body) > 1024:
            return StoredObject(got.meta, got.body[:-1])
        return got


class ClampsRanges(MemoryStore):
    """Answers a past-EOF range with the bytes it has, as an RFC 9110 206 does."""

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> StoredObject:
        if byte_range is not None and byte_range[0] < byte_range[1]:
            whole = super().get(key)
            return StoredObject(whole.meta, whole.body[byte_range[0] : byte_range[1]])
        return super().get(key, byte_range)


class NoConditionalGet(MemoryStore):
    def get_if_none_match(self, key: str, etag: str) -> StoredObject | None:
        return self.get(key)


class DeleteOfAbsentFails(MemoryStore):
    def delete(self, key: str) -> None:
        self.head(key)
        super().delete(key)


@pytest.mark.parametrize(
    ("store", "failing"),
    [
        (IgnoresIfNoneMatch(), "P1 put-if-absent"),
        (CasCreates(), "P2 compare-and-swap"),
        (IgnoresIfMatch(), "P2 compare-and-swap"),
        (UnsortedList(), "P4 list-after-write"),
        (ClockRunsBack(), "P6 store time"),
        (SurfacesDisagree(), "P6 store time"),
        (TornReads(), "P5 atomic whole-object PUT"),
        (ClampsRanges(), "ranged GET half-open ranges"),
        (DeleteOfAbsentFails(), "delete idempotent delete"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, MemoryStore) else v,
)
def test_a_broken_primitive_fails_by_name_and_is_refused(store: MemoryStore, failing: str) -> None:
    result = certify(store, peer=store, **NO_WAIT)
    assert failing in _failed(result), result.report()
    with pytest.raises(StoreProfileViolation) as info:
        result.require()
    assert info.value.kind is ErrorKind.UNSUPPORTED_STORE and info.value.exit_code == 64
    assert info.value.primitive == _failed(result)[0] and store.location in info.value.message


def test_the_other_primitives_still_pass_when_one_is_broken() -> None:
    result = certify(IgnoresIfNoneMatch(), **NO_WAIT)
    passed = {f"{c.primitive} {c.title}" for c in result.checks if c.passed}
    assert "P6 store time" in passed and "ranged GET half-open ranges" in passed


def test_a_store_clock_that_never_moves_fails_p6() -> None:
    store = MemoryStore(clock=ManualClock(step_ns=0))
    assert "P6 store time" in _failed(certify(store, **NO_WAIT))


def test_conditional_get_is_optional_unless_the_profile_declares_it() -> None:
    optional = NoConditionalGet(profile=StoreProfile("no-p8", granularity_ns=1, conditional_get=False))
    result = certify(optional, **NO_WAIT)
    assert result.certified and not [c for c in result.checks if c.primitive == "P8"][0].passed
    declared = NoConditionalGet()
    assert "P8 conditional GET" in _failed(certify(declared, **NO_WAIT))


def test_p7_by_read_back_is_accepted_only_where_the_profile_declares_it() -> None:
    read_back = StoreProfile("read-back", granularity_ns=1, verifies_checksum=False)
    result = certify(MemoryStore(profile=read_back), **NO_WAIT)
    assert result.certified and result.measured["P7 mode"].startswith("read-back")

    class Unchecked(MemoryStore):
        """Declares verification and does not verify."""

        def put_if_absent(self, key: str, body: bytes, *, sha256: bytes | None = None) -> Committed:
            return super().put_if_absent(key, body, sha256=hashlib.sha256(body).digest())

    assert "P7 checksum" in _failed(certify(Unchecked(), **NO_WAIT))


def test_a_lagging_listing_fails_p4() -> None:
    lagging = FaultyStore(MemoryStore(profile=StoreProfile("lagging", granularity_ns=1, strong_listing=False)))
    lagging.inject(Fault(FaultKind.STALE_LIST, times=None, lag=1))
    assert "P4 list-after-write" in _failed(certify(lagging, **NO_WAIT))


def test_an_unreachable_store_fails_every_check_without_raising() -> None:
    down = FaultyStore(MemoryStore())
    down.inject(Fault(FaultKind.BEFORE_SEND, times=None))
    result = certify(down, **NO_WAIT)
    assert not any(c.passed for c in result.checks if c.required)
    assert all(NotCommitted.__name__ in c.detail for c in result.failures)
    assert "cleanup" in result.measured
