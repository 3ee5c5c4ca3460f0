"""Objects another tenant of the bucket writes under a queue's prefix (issue 30): oversized objects, a bad watermark.

The attacker can write any object under the prefix, so every object is
read bounded by what may be at its key (records.record_limit, a payload's
length): a garbage object of gigabytes at a valid ``jobs/`` key is refused
from its size, quarantined, and never fetched whole.
"""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from steadqd.errors import CorruptRecord, InvalidInput, QueueCorrupt
from steadqd.s3 import keys
from steadqd.s3.backend import BucketBackend
from steadqd.s3.claim import Miss, claim_job
from steadqd.s3.clock import WatermarkUnreadable, rebuild_watermark
from steadqd.s3.handle import BucketQueue
from steadqd.s3.layout import DEFAULT_FORMAT, Oversized, init_layout, open_layout
from steadqd.s3.publish import enqueue
from steadqd.s3.records import RECORD_FIELDS_MAX, QuarantineReason, QuarantineRecord, WatermarkRecord, record_limit
from steadqd.s3.store.base import SEAWEEDFS, StoredObject
from steadqd.s3.store.faults import Fault, FaultKind, FaultyStore
from steadqd.s3.store.memory import ManualClock, MemoryStore
from steadqd.s3.store.s3 import S3Store
from steadqd.s3.verify import read_record
from tests.stowq.conftest import LIVE_BUCKET
from tests.stowq.recovery_world import LEASE_S, PREFIX, RETENTION, URL, World
from tests.stowq.seaweed import Seaweed
from tests.stowq.test_cli_bucket import live_queue, ok, run

GARBAGE = 3 * 1024 * 1024  # well past the default queue's 128 KiB record limit


class Reads:
    """A store that remembers every GET: the key, the bound asked for, and how many bytes came back."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gets: list[tuple[str, int | None, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get(self, key: str, byte_range: tuple[int, int] | None = None, *, max_bytes: int | None = None) -> StoredObject:
        obj = self.inner.get(key, byte_range, max_bytes=max_bytes)
        self.gets.append((key, max_bytes, len(obj.body)))
        return obj

    def of(self, key: str) -> list[tuple[str, int | None, int]]:
        return [g for g in self.gets if g[0] == key]


def _world() -> tuple[World, Reads]:
    clock = ManualClock(step_ns=1000)
    memory = MemoryStore(clock=clock)
    reads = Reads(memory)
    store = FaultyStore(reads)  # type: ignore[arg-type]
    layout = init_layout(store, PREFIX, worker_id="w1", certify_store=False, fmt=replace(DEFAULT_FORMAT, shard_count=4))
    return World(clock, memory, store, BucketBackend(layout, url=URL, floor_staleness_s=0, **RETENTION)), reads


def _findings(w: World) -> list[QuarantineRecord]:
    out = []
    for rel in w.keys("quarantine/"):
        record = read_record(w.memory.get(PREFIX + rel).body, w.q.layout.queue_id, rel, required_feature_bits=1)
        assert isinstance(record, QuarantineRecord)
        out.append(record)
    return out


def _plant_garbage_job(w: World, size: int = GARBAGE) -> tuple[str, bytes]:
    job_id = os.urandom(16)
    rel = keys.job_key(w.shard(job_id.hex()), job_id)
    w.put(rel, os.urandom(size))
    return rel, job_id


# -- the store: a bounded GET ------------------------------------------------------------


def test_a_bounded_get_returns_the_head_and_the_whole_size() -> None:
    store = MemoryStore()
    store.put_if_absent("k", b"0123456789")
    got = store.get("k", max_bytes=4)
    assert got.body == b"0123" and got.meta.size == 10
    assert store.get("k", max_bytes=100).body == b"0123456789"
    store.put_if_absent("empty", b"")
    assert store.get("empty", max_bytes=4).body == b""
    with pytest.raises(InvalidInput):
        store.get("k", (0, 2), max_bytes=4)
    with pytest.raises(InvalidInput):
        store.get("k", max_bytes=0)


def test_the_fault_injector_passes_the_bound_and_still_injects() -> None:
    store = FaultyStore(MemoryStore())
    store.put_if_absent("k", b"0123456789")
    assert store.get("k", max_bytes=3).body == b"012"
    with store.armed(Fault(FaultKind.BEFORE_SEND, op="get")):
        with pytest.raises(Exception, match="injected failure"):
            store.get("k", max_bytes=3)


def test_the_record_limit_covers_every_record_and_the_inline_limit() -> None:
    assert record_limit(DEFAULT_FORMAT.inline_limit) == RECORD_FIELDS_MAX + DEFAULT_FORMAT.inline_limit
    assert record_limit(2**64 - 1) == record_limit(16 * 1024 * 1024)  # a FORMAT may say 2^64-1: the read stays bounded


# -- an oversized object at a job key -----------------------------------------------------


def test_an_oversized_job_object_is_quarantined_from_its_listed_size_and_never_fetched() -> None:
    w, reads = _world()
    rel, job_id = _plant_garbage_job(w)
    good = w.q.enqueue(b"real work")
    lease = w.q.lease(duration=LEASE_S)
    assert lease is not None and lease.job_id == good
    assert w.q.lease(duration=LEASE_S) is None
    assert reads.of(PREFIX + rel) == []  # the listing's size was enough
    [finding] = _findings(w)
    assert (finding.source_key, finding.reason) == (rel, QuarantineReason.ENVELOPE_CORRUPT)
    # A restarted worker lists it again and still fetches nothing of it; the finding is the same one.
    w.handle("w2").lease(duration=LEASE_S)
    assert reads.of(PREFIX + rel) == []
    assert len(_findings(w)) == 1


def test_a_job_read_without_a_listing_fetches_at_most_the_record_limit() -> None:
    w, reads = _world()
    rel, job_id = _plant_garbage_job(w)
    layout = w.q.layout
    got = claim_job(layout, w.shard(job_id.hex()), job_id, floor_ns=w.q.wall_floor_ns(), lease_duration_ns=10**10)
    assert got is Miss.UNUSABLE
    [(_, bound, fetched)] = reads.of(PREFIX + rel)
    assert bound == layout.record_limit + 1 and fetched <= layout.record_limit + 1
    [finding] = _findings(w)
    assert finding.source_key == rel
    with pytest.raises(Oversized, match=f"{PREFIX}{rel} is {GARBAGE} bytes"):
        layout.read(rel)


def test_fsck_reports_an_oversized_record_without_reading_it_whole() -> None:
    w, reads = _world()
    rel, _ = _plant_garbage_job(w)
    report = w.q.fsck(repair=True)
    [finding] = [f for f in report.errors if f.path == rel]
    assert finding.finding_type == "record_corrupt" and "size" in finding.details
    assert all(fetched <= w.q.layout.record_limit + 1 for _, _, fetched in reads.of(PREFIX + rel))
    assert [q.source_key for q in _findings(w)] == [rel]


def test_an_oversized_payload_is_refused_after_its_own_length_plus_one_byte() -> None:
    w, reads = _world()
    big = b"B" * (DEFAULT_FORMAT.inline_limit + 10)
    w.q.enqueue(big)
    [payload] = w.keys("payloads/")
    w.delete(payload)
    w.put(payload, big + os.urandom(GARBAGE))  # the right head, then megabytes more
    lease = w.q.lease(duration=LEASE_S)
    assert lease is not None
    with pytest.raises(CorruptRecord, match="bytes, more than the"):
        w.q.read_payload(lease)
    assert all(fetched <= len(big) + 1 for _, _, fetched in reads.of(PREFIX + payload))
    assert any(q.source_key == payload and q.reason == QuarantineReason.PAYLOAD_CORRUPT for q in _findings(w))


def test_a_writer_refuses_a_record_larger_than_a_reader_fetches() -> None:
    w, _ = _world()
    layout = replace(w.q.layout, format=replace(w.q.layout.format, inline_limit=2**64 - 1))
    with pytest.raises(InvalidInput, match="more than the .* a reader of this queue fetches"):
        enqueue(layout, b"x" * (layout.record_limit + 1))


def test_an_oversized_format_is_refused_on_open() -> None:
    store = MemoryStore()
    store.put_if_absent("p/meta/FORMAT", os.urandom(RECORD_FIELDS_MAX + 5))
    with pytest.raises(QueueCorrupt, match="meta/FORMAT is .* bytes, more than a FORMAT record can be"):
        open_layout(store, "p/", certify_store=False)


# -- live: SeaweedFS, both transports -------------------------------------------------------

LIVE_GARBAGE = 64 * 1024 * 1024


def _live_store(seaweed: Seaweed, transport: str) -> S3Store:
    store = S3Store(replace(seaweed.settings(LIVE_BUCKET), transport=transport), profile=SEAWEEDFS)
    store.create_bucket()
    return store


def _peak(action: Callable[[], Any]) -> tuple[Any, int]:
    """What ``action`` returns, and the most memory Python held for it meanwhile (a whole 64 MB body would show)."""
    tracemalloc.start()
    try:
        return action(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("transport", ["botocore", "direct"])
def test_a_bounded_get_on_seaweedfs_transfers_only_the_head(seaweed: Seaweed, live_prefix: str, transport: str) -> None:
    store = _live_store(seaweed, transport)
    try:
        store.put_if_absent(live_prefix + "big", os.urandom(LIVE_GARBAGE))
        store.put_if_absent(live_prefix + "small", b"0123456789")
        store.put_if_absent(live_prefix + "empty", b"")
        got, peak = _peak(lambda: store.get(live_prefix + "big", max_bytes=1000))
        assert len(got.body) == 1000 and got.meta.size == LIVE_GARBAGE
        assert peak < 8 * 1024 * 1024, f"a 1000-byte bounded GET held {peak} bytes"
        # The connection is usable afterwards (a dropped one is replaced, never read from mid-body).
        small = store.get(live_prefix + "small", max_bytes=100)
        assert (small.body, small.meta.size) == (b"0123456789", 10)
        assert store.get(live_prefix + "small", max_bytes=4).body == b"0123"
        empty = store.get(live_prefix + "empty", max_bytes=4)  # S3 answers 416 to a range of an empty object
        assert (empty.body, empty.meta.size) == (b"", 0)
        store.delete(live_prefix + "big")
    finally:
        store.close()


@pytest.mark.parametrize("transport", ["botocore", "direct"])
def test_a_64mb_garbage_job_on_seaweedfs_is_quarantined_unread_and_not_refetched(
    seaweed: Seaweed, live_prefix: str, transport: str
) -> None:
    reads = Reads(_live_store(seaweed, transport))
    try:
        q = BucketQueue.init(reads, live_prefix, worker_id="w1", certify_store=False)
        layout = q.layout
        job_id = os.urandom(16)
        shard = keys.shard_of(layout.queue_id, job_id, layout.format.shard_count)
        rel = keys.job_key(shard, job_id)
        reads.put_if_absent(live_prefix + rel, os.urandom(LIVE_GARBAGE))
        good = q.enqueue(b"real work")
        lease, peak = _peak(lambda: q.lease(duration=5))
        assert lease is not None and lease.job_id == good
        assert q.lease(duration=5) is None
        assert reads.of(live_prefix + rel) == [] and peak < 16 * 1024 * 1024
        findings = [m.key for m in reads.list_page(live_prefix + "quarantine/").items]
        assert len(findings) == 1
        # Read without a listing (a sweep, a resolution): at most the record limit and one byte.
        got, peak = _peak(
            lambda: claim_job(layout, shard, job_id, floor_ns=q.wall_floor_ns(), lease_duration_ns=5 * 10**9)
        )
        assert got is Miss.UNUSABLE and peak < 16 * 1024 * 1024
        [(_, bound, fetched)] = reads.of(live_prefix + rel)
        assert bound == layout.record_limit + 1 and fetched <= layout.record_limit + 1
        # A restarted worker: nothing of it is fetched again, and the finding is the same one.
        reads.gets.clear()
        assert BucketQueue.open(reads, live_prefix, worker_id="w2", certify_store=False).lease(duration=5) is None
        assert reads.of(live_prefix + rel) == []
        assert [m.key for m in reads.list_page(live_prefix + "quarantine/").items] == findings
        reads.delete(live_prefix + rel)
    finally:
        reads.close()


# -- a garbage meta/watermark ---------------------------------------------------------------

WATERMARK = "meta/watermark"
GARBAGE_WATERMARK = b"\x87" + os.urandom(118)  # 119 bytes, as the issue's


def _bad_watermark(w: World) -> None:
    """A watermark exists (a floor made it), then another tenant overwrites it with garbage."""
    w.q.wall_floor_ns()
    assert WATERMARK in w.keys("meta/")
    w.delete(WATERMARK)
    w.put(WATERMARK, GARBAGE_WATERMARK)


def test_a_garbage_watermark_names_its_key_and_the_fix() -> None:
    w, _ = _world()
    _bad_watermark(w)
    w.q.enqueue(b"work")
    with pytest.raises(WatermarkUnreadable) as raised:
        w.q.lease(duration=LEASE_S)
    message = raised.value.message
    assert f"{PREFIX}{WATERMARK} in memory:memory (fault injector) is not a watermark record" in message
    assert "119 bytes" in message and "steadq fsck --repair QUEUE" in message
    report = w.q.fsck()  # a plain fsck reports it instead of failing on it
    assert ("watermark_unreadable", WATERMARK) in {(f.finding_type, f.path) for f in report.errors}
    assert w.memory.get(PREFIX + WATERMARK).body == GARBAGE_WATERMARK  # nothing written


def test_fsck_repair_rebuilds_the_watermark_by_cas_and_a_job_then_flows() -> None:
    w, _ = _world()
    _bad_watermark(w)
    bad_etag = w.memory.head(PREFIX + WATERMARK).etag
    job = w.q.enqueue(b"work")
    w.store.trace.clear()
    report = w.q.fsck(repair=True)
    assert ("watermark_rebuilt", WATERMARK) in {(f.finding_type, f.path) for f in report.findings}
    writes = [c for c in w.store.trace if c.key == PREFIX + WATERMARK and c.op.startswith("put")]
    assert [c.op for c in writes] == ["put_if_match"]  # the protocol's CAS, on the bad object's version
    rebuilt = read_record(
        w.memory.get(PREFIX + WATERMARK).body, w.q.layout.queue_id, WATERMARK, required_feature_bits=0
    )
    assert isinstance(rebuilt, WatermarkRecord)
    # The bucket of a floor proven during the repair: a lower bound of store time, never ahead of it.
    width = w.q.layout.format.delayed_bucket_width_ns
    assert rebuilt.highest_observed_wall_bucket * width <= w.clock.peek_ns()
    assert any(q.source_key == WATERMARK for q in _findings(w))
    assert w.memory.head(PREFIX + WATERMARK).etag != bad_etag
    lease = w.q.lease(duration=LEASE_S)
    assert lease is not None and lease.job_id == job
    w.q.ack(lease)
    assert not [f for f in w.q.fsck().errors if f.finding_type == "watermark_unreadable"]


class _Racer:
    """A store on which another participant replaces the watermark just before our CAS of it reaches the store."""

    def __init__(self, inner: MemoryStore, replacement: bytes) -> None:
        self.inner = inner
        self.replacement = replacement
        self.raced = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def put_if_match(self, key: str, body: bytes, etag: str, *, sha256: bytes | None = None) -> Any:
        if key.endswith(WATERMARK) and not self.raced:
            self.raced += 1
            self.inner.put_if_match(key, self.replacement, etag)
        return self.inner.put_if_match(key, body, etag, sha256=sha256)


def test_a_rebuild_that_loses_the_cas_leaves_the_other_writers_watermark() -> None:
    w, _ = _world()
    _bad_watermark(w)
    theirs = WatermarkRecord(highest_observed_wall_bucket=7, sequence=0)
    racer = _Racer(w.memory, w.q.layout.encode(WATERMARK, theirs))
    layout = open_layout(racer, PREFIX, certify_store=False)  # type: ignore[arg-type]
    assert rebuild_watermark(layout) is None  # lost the race; what is there now reads fine
    assert racer.raced == 1
    assert w.memory.get(PREFIX + WATERMARK).body == w.q.layout.encode(WATERMARK, theirs)
    assert rebuild_watermark(layout) is None  # nothing to do for a readable watermark


def test_an_oversized_watermark_is_refused_unread_and_rebuilt() -> None:
    w, reads = _world()
    w.q.wall_floor_ns()
    w.delete(WATERMARK)
    w.put(WATERMARK, os.urandom(GARBAGE))
    with pytest.raises(WatermarkUnreadable, match="bytes, more than the"):
        w.q.wall_floor_ns()
    w.q.fsck(repair=True)
    assert all(fetched <= w.q.layout.record_limit + 1 for _, _, fetched in reads.of(PREFIX + WATERMARK))
    assert w.q.wall_floor_ns() > 0


def test_a_garbage_watermark_on_seaweedfs_via_the_cli(
    seaweed: Seaweed, live_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, url = live_queue(seaweed, live_prefix, tmp_path, monkeypatch)
    ok(env, "put", url, "-", stdin=b"before")
    ok(env, "stats", url)  # a floor, and with it the watermark
    store = seaweed.store(LIVE_BUCKET)
    key = f"{live_prefix}q/{WATERMARK}"
    try:
        assert store.head(key).size > 0
        store.delete(key)
        store.put_if_absent(key, GARBAGE_WATERMARK)
        for command in ("stats", "ls"):
            done = run(env, command, url)
            assert done.returncode == 3, done.stderr
            assert f"{key} in s3://{LIVE_BUCKET} at http" in done.stderr, done.stderr  # the key, no credential
            assert "119 bytes" in done.stderr and "steadq fsck --repair QUEUE" in done.stderr
            assert seaweed.environment()["AWS_SECRET_ACCESS_KEY"] not in done.stderr
        checked = run(env, "fsck", url)
        assert checked.returncode == 3 and "meta/watermark: watermark_unreadable" in checked.stdout
        repaired = run(env, "fsck", "--repair", url)
        assert "meta/watermark: watermark_rebuilt" in repaired.stdout, repaired.stdout + repaired.stderr
        assert "meta/watermark: quarantined" in repaired.stdout
        ok(env, "stats", url)
        ok(env, "lease", url, "--duration-seconds", "2")  # the job put before the damage flows again
        assert run(env, "fsck", url).stdout.count("watermark_unreadable") == 0
    finally:
        store.close()
