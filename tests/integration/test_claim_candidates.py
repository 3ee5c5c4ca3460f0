"""The claim scan's per-handle candidate cache (docs/performance.md, fix 2).

A lease must not list and parse a whole ready shard for every call: in a
deep queue that made each lease cost O(jobs per shard). The handle keeps the
names of its last listing and consumes them across lease calls. These tests
pin what the cache must never change: a lease after an enqueue (by any
handle) finds the job, "empty" is only answered after a fresh listing, no job
is handed out twice, and a sweep reaches every job instead of restarting at
the front of the listing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from steadqd import Queue, claim, linux
from tests.fabricate import write_ready_jobs


@pytest.fixture
def qpath(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "q")
    Queue.init(path, shards=1).close()
    yield path


def _listings(events: list[linux.TraceEvent]) -> int:
    return Counter(e.op for e in events)["listdir"]


def test_a_deep_shard_is_listed_once_for_many_leases(qpath: str) -> None:
    with Queue.open(qpath) as q:
        write_ready_jobs(q, 40)
    with Queue.open(qpath) as q:
        seen = set()
        with linux.trace() as events:
            for _ in range(40):
                lease = q.lease()
                assert lease is not None
                seen.add(lease.job_id)
                q.ack(lease)
        assert len(seen) == 40
        assert _listings(events) == 1
        # Used up: the next lease lists again, finds nothing, and says so.
        with linux.trace() as events:
            assert q.lease() is None
        assert _listings(events) == 1


def test_candidates_taken_by_another_handle_do_not_hide_a_new_job(qpath: str) -> None:
    with Queue.open(qpath) as a, Queue.open(qpath) as b:
        for i in range(5):
            b.enqueue(f"old {i}".encode())
        first = a.lease()
        assert first is not None  # a now holds the other four names as candidates
        others = [b.lease() for _ in range(4)]
        assert all(x is not None for x in others)
        new_id = b.enqueue(b"new")
        lease = a.lease()
        assert lease is not None and lease.job_id == new_id
        assert a.read_payload(lease) == b"new"


def test_empty_is_answered_only_after_a_fresh_listing(qpath: str) -> None:
    with Queue.open(qpath) as a, Queue.open(qpath) as b:
        for i in range(3):
            b.enqueue(f"job {i}".encode())
        assert a.lease() is not None
        assert b.lease() is not None and b.lease() is not None
        # a's two remaining candidates are both gone: the answer is empty, from a listing.
        with linux.trace() as events:
            assert a.lease() is None
        assert _listings(events) == 1
        job = b.enqueue(b"late")
        lease = a.lease()
        assert lease is not None and lease.job_id == job


def test_own_enqueue_is_found_while_candidates_remain(qpath: str) -> None:
    with Queue.open(qpath) as q:
        ids = {q.enqueue(f"job {i}".encode()) for i in range(3)}
        first = q.lease()
        assert first is not None
        ids.add(q.enqueue(b"fresh"))
        got = set()
        while (lease := q.lease()) is not None:
            got.add(lease.job_id)
            q.ack(lease)
        assert got == ids - {first.job_id}


def test_a_sweep_reaches_every_job_when_jobs_keep_coming_back(qpath: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a small cache, retried jobs (which sort where they were) must not starve the rest."""
    monkeypatch.setattr(claim, "CLAIM_CACHE_NAMES", 2)
    monkeypatch.setattr(claim, "CLAIM_CACHE_MIN_PER_SHARD", 2)
    with Queue.open(qpath) as q:
        ids = {q.enqueue(f"job {i}".encode(), max_attempts=10) for i in range(7)}
        leased = []
        for _ in range(7):
            lease = q.lease()
            assert lease is not None
            leased.append(lease.job_id)
            assert q.retry(lease) == "ready"
        assert sorted(leased) == sorted(ids)


def test_two_handles_share_a_deep_shard_without_duplicates(qpath: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claim, "CLAIM_CACHE_NAMES", 3)
    monkeypatch.setattr(claim, "CLAIM_CACHE_MIN_PER_SHARD", 3)
    with Queue.open(qpath) as a, Queue.open(qpath) as b:
        write_ready_jobs(a, 25)
        got: list[str] = []
        idle = 0
        turn = 0
        while idle < 2:
            q = (a, b)[turn % 2]
            turn += 1
            lease = q.lease()
            if lease is None:
                idle += 1
                continue
            idle = 0
            got.append(lease.job_id)
            q.ack(lease)
        assert len(got) == 25 and len(set(got)) == 25


def test_a_lease_path_is_parsed_and_authenticated_once_for_all_its_uses(
    qpath: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """payload() and ack both validate the lease; the pure name checks are not redone for the same path."""
    from steadqd import lease as lease_mod

    calls: list[str] = []
    real = lease_mod.authenticate

    def counting(*args: object, **kwargs: object) -> bool:
        calls.append("auth")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(lease_mod, "authenticate", counting)
    with Queue.open(qpath) as q:
        q.enqueue(b"once")
        lease = q.lease()
        assert lease is not None
        assert lease.payload() == b"once"
        assert q.read_payload(lease) == b"once"
        q.ack(lease)
    assert calls == ["auth"]
