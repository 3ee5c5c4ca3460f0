"""The in-memory store keeps every primitive the protocol relies on, and is linearizable under threads."""

from __future__ import annotations

import hashlib
import threading

import pytest

from steadqd.errors import AlreadyExists, ChecksumMismatch, InvalidInput, NotFound, PreconditionFailed
from steadqd.s3.store.base import MEMORY, StoreProfile
from steadqd.s3.store.memory import ManualClock, MemoryStore, WallClock


def test_put_if_absent_creates_once_and_keeps_the_first_body() -> None:
    store = MemoryStore()
    first = store.put_if_absent("q/jobs/0000/a", b"one")
    with pytest.raises(AlreadyExists, match="q/jobs/0000/a"):
        store.put_if_absent("q/jobs/0000/a", b"two")
    got = store.get("q/jobs/0000/a")
    assert got.body == b"one" and got.meta.etag == first.etag == hashlib.md5(b"one").hexdigest()


def test_cas_replaces_only_the_named_version_and_never_creates() -> None:
    store = MemoryStore()
    v1 = store.put_if_absent("q/meta/watermark", b"v1")
    with pytest.raises(PreconditionFailed, match="not deadbeef"):
        store.put_if_match("q/meta/watermark", b"x", "deadbeef")
    v2 = store.put_if_match("q/meta/watermark", b"v2", v1.etag)
    assert v2.etag != v1.etag and store.get("q/meta/watermark").body == b"v2"
    with pytest.raises(PreconditionFailed):
        store.put_if_match("q/meta/watermark", b"v3", v1.etag)  # v1 is stale now
    with pytest.raises(PreconditionFailed, match="no object"):
        store.put_if_match("q/absent", b"x", v1.etag)
    with pytest.raises(NotFound):
        store.head("q/absent")


def test_a_wrong_sha256_is_refused_and_nothing_is_written() -> None:
    store = MemoryStore()
    with pytest.raises(ChecksumMismatch):
        store.put_if_absent("k", b"body", sha256=hashlib.sha256(b"other").digest())
    with pytest.raises(NotFound):
        store.get("k")
    with pytest.raises(InvalidInput, match="32 bytes"):
        store.put_if_absent("k", b"body", sha256=b"\x00" * 31)


def test_a_profile_without_store_side_checks_stores_a_mismatched_body() -> None:
    """P7 by read-back: such an engine keeps what it was sent, and the reader must re-hash."""
    store = MemoryStore(profile=StoreProfile("no-p7", granularity_ns=1, verifies_checksum=False))
    store.put_if_absent("k", b"body", sha256=hashlib.sha256(b"other").digest())
    assert store.get("k").body == b"body"


@pytest.mark.parametrize(
    ("byte_range", "expect"),
    [((0, 5), b"01234"), ((3, 10), b"3456789"), ((9, 10), b"9"), ((0, 11), None), ((5, 5), None), ((6, 2), None)],
)
def test_ranges_are_half_open_and_absence_outside_the_object(byte_range: tuple[int, int], expect: bytes | None) -> None:
    store = MemoryStore()
    store.put_if_absent("k", b"0123456789")
    if expect is None:
        with pytest.raises(NotFound):
            store.get("k", byte_range)
    else:
        got = store.get("k", byte_range)
        assert got.body == expect and got.meta.size == 10  # the whole object's size, not the part's


def test_list_is_byte_ordered_paged_and_strictly_after_start_after() -> None:
    store = MemoryStore()
    keys = ["p/a", "p/a-c", "p/a.d", "p/a/b", "p/ab", "p/b", "q/a", "o/z"]
    for key in keys:
        store.put_if_absent(key, b"x")
    assert [m.key for m in store.list_page("p/").items] == sorted(k for k in keys if k.startswith("p/"))
    seen: list[str] = []
    after = None
    while True:
        page = store.list_page("p/", start_after=after, limit=2)
        assert len(page.items) <= 2
        seen += [m.key for m in page.items]
        if page.next_start_after is None:
            break
        after = page.next_start_after
    assert seen == sorted(k for k in keys if k.startswith("p/"))
    assert [m.key for m in store.list_page("p/", start_after="p/a.d").items] == ["p/a/b", "p/ab", "p/b"]
    assert [m.key for m in store.list_page("p/", start_after="a").items][0] == "p/a"  # before the prefix
    assert store.list_page("p/", limit=0).items == () and store.list_page("p/", limit=0).next_start_after is None
    with pytest.raises(InvalidInput, match="negative"):
        store.list_page("p/", limit=-1)


def test_delete_is_idempotent_and_unlists() -> None:
    store = MemoryStore()
    store.put_if_absent("p/k", b"x")
    store.delete("p/k")
    store.delete("p/k")
    assert store.list_page("p/").items == ()
    store.put_if_absent("p/k", b"again")  # the key is free again
    assert store.get("p/k").body == b"again"


def test_store_times_come_from_the_store_clock_and_move_on_overwrite() -> None:
    clock = ManualClock(start_ns=1_000, step_ns=10)
    store = MemoryStore(clock=clock)
    a = store.put_if_absent("a", b"1")
    assert store.head("a").store_time_ns == 1_010
    clock.advance(5_000)
    store.put_if_match("a", b"2", a.etag)
    assert store.head("a").store_time_ns == 6_020
    listed = store.list_page("").items[0]
    assert listed.store_time_ns == store.head("a").store_time_ns  # one time, whatever the surface
    with pytest.raises(InvalidInput, match="never goes back"):
        clock.advance(-1)


def test_store_times_are_quantised_to_the_profile_granularity() -> None:
    store = MemoryStore(clock=ManualClock(start_ns=1_999_999_999, step_ns=1), profile=StoreProfile("g", 10**9))
    store.put_if_absent("a", b"")
    assert store.head("a").store_time_ns == 2_000_000_000


def test_wall_clock_never_runs_back() -> None:
    clock = WallClock()
    readings = [clock.now_ns() for _ in range(1000)]
    assert readings == sorted(readings)


def test_peers_share_the_objects() -> None:
    one = MemoryStore()
    other = one.peer()
    one.put_if_absent("k", b"x")
    assert other.get("k").body == b"x" and other.profile is MEMORY
    assert dict(other.snapshot()) == {"k": b"x"} and list(other.keys("k")) == ["k"]


def test_racing_creates_have_exactly_one_winner_and_racing_cas_too() -> None:
    """Linearizability where it matters most: the claim race and the watermark race."""
    store = MemoryStore()
    results: list[str] = []
    lock = threading.Lock()

    def race(op: str, i: int, barrier: threading.Barrier, etag: str = "") -> None:
        barrier.wait()
        try:
            if op == "create":
                store.put_if_absent("claim", f"w{i}".encode())
            else:
                store.put_if_match("wm", f"w{i}".encode(), etag)
            outcome = f"won {i}"
        except (AlreadyExists, PreconditionFailed):
            outcome = "lost"
        with lock:
            results.append(outcome)

    for op in ("create", "cas"):
        results.clear()
        etag = store.put_if_absent("wm", b"start").etag if op == "cas" else ""
        barrier = threading.Barrier(8)
        threads = [threading.Thread(target=race, args=(op, i, barrier, etag)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [r for r in results if r.startswith("won")]
        assert len(winners) == 1 and results.count("lost") == 7
        key = "claim" if op == "create" else "wm"
        assert store.get(key).body == f"w{winners[0].split()[1]}".encode()
