"""The claim scan's directory cursor and candidate cache (docs/performance.md, fix 2).

A lease must not list and parse a whole ready shard: in a deep queue that
made each lease cost O(jobs per shard). The scan reads a shard a chunk at a
time from where the handle's cached directory fd stopped, and keeps the rest
of the chunk for the next call. These tests pin what that must never change:
a lease after an enqueue (by any handle) finds the job, "empty" is only
answered after a full pass from the first entry, no job is handed out twice,
and a sweep reaches every job instead of restarting at the front.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable

import pytest

from steadqd import Queue, QueueCorrupt
from steadqd.fs import claim, linux
from steadqd.fs.lease import Lease
from tests.fabricate import write_ready_jobs


@pytest.fixture
def qpath(make_queue: Callable[..., Queue], queue_path: str) -> str:
    """A one-shard queue with no handle open: each test opens its own, some under a trace."""
    make_queue(shards=1).close()
    return queue_path


def _ops(events: list[linux.TraceEvent], op: str) -> int:
    return Counter(e.op for e in events)[op]


def test_a_deep_shard_is_read_a_chunk_at_a_time(qpath: str) -> None:
    with Queue.open(qpath) as q:
        write_ready_jobs(q, 3000)
    with Queue.open(qpath) as q:
        with linux.trace() as events:
            first = q.lease()  # a fresh handle: one chunk, never the whole directory
        assert first is not None
        assert _ops(events, "getdents") == 1 and _ops(events, "listdir") == 0
        q.ack(first)
        seen = {first.job_id}
        with linux.trace() as events:
            for _ in range(299):
                lease = q.lease()
                assert lease is not None
                seen.add(lease.job_id)
                q.ack(lease)
        assert len(seen) == 300
        assert _ops(events, "getdents") <= 5, "a chunk holds ~200 names: 300 leases need a handful of reads"


def test_a_drained_shard_is_read_from_the_start_before_empty_is_answered(qpath: str) -> None:
    with Queue.open(qpath) as q:
        ids = {q.enqueue(f"job {i}".encode()) for i in range(5)}
        got = set()
        for _ in range(5):
            lease = q.lease()
            assert lease is not None
            got.add(lease.job_id)
            q.ack(lease)
        assert got == ids
        with linux.trace() as events:
            assert q.lease() is None
        assert _ops(events, "lseek") == 1 and _ops(events, "getdents") >= 2  # rewound, read to the end
        # Asked again: the cursor is known to stand at the end, so the scan starts over at
        # once, and a job enqueued meanwhile (behind the cursor) is found.
        with linux.trace() as events:
            assert q.lease() is None
        assert (_ops(events, "lseek"), _ops(events, "getdents")) == (1, 1)
        job = q.enqueue(b"late")
        lease = q.lease()
        assert lease is not None and lease.job_id == job


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


def test_empty_is_answered_only_after_a_full_pass(qpath: str) -> None:
    with Queue.open(qpath) as a, Queue.open(qpath) as b:
        for i in range(3):
            b.enqueue(f"job {i}".encode())
        assert a.lease() is not None
        assert b.lease() is not None and b.lease() is not None
        # a's two remaining candidates are both gone: the answer is empty, from a full pass.
        with linux.trace() as events:
            assert a.lease() is None
        assert _ops(events, "lseek") == 1
        job = b.enqueue(b"late")  # behind a's cursor, which stands at the end
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
    """Retried jobs come back under a new name, possibly ahead of the cursor; with tiny
    chunks they may get a second turn in a sweep, but they cannot starve the rest: the
    cursor only moves forward, so every job is reached within a sweep or two."""
    monkeypatch.setattr(claim, "CLAIM_SCAN_CHUNK_BYTES", 512)  # two or three names per read
    with Queue.open(qpath) as q:
        ids = {q.enqueue(f"job {i}".encode(), max_attempts=100) for i in range(7)}
        leased = []
        for _ in range(40):
            lease = q.lease()
            assert lease is not None
            leased.append(lease.job_id)
            assert q.retry(lease) == "ready"
        assert set(leased) == ids


def test_two_handles_share_a_deep_shard_without_duplicates(qpath: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claim, "CLAIM_SCAN_CHUNK_BYTES", 1024)
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
    """payload() and ack both validate the lease; the pure name checks are not redone for the same path.

    A path this process built itself (claim, renew) is known to authenticate and
    is never authenticated again; a path it has not seen (here: after the memo
    is cleared, as for a lease rebuilt in another process) is authenticated once.
    """
    from steadqd.fs import lease as lease_mod

    calls: list[str] = []
    real = lease_mod.authenticate

    def counting(*args: object, **kwargs: object) -> bool:
        calls.append("auth")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(lease_mod, "authenticate", counting)
    with Queue.open(qpath) as q:
        q.enqueue(b"own")
        lease = q.lease()
        assert lease is not None
        assert lease.payload() == b"own"
        q.renew(lease, 60)
        assert q.read_payload(lease) == b"own"
        q.ack(lease)
        assert calls == []

        q.enqueue(b"foreign")
        lease = q.lease()
        assert lease is not None
        lease_mod._FACTS.clear()
        assert lease.payload() == b"foreign"
        assert q.read_payload(lease) == b"foreign"
        q.ack(lease)
    assert calls == ["auth"]


def test_a_remembered_lease_path_still_fails_every_filesystem_check(qpath: str) -> None:
    """The memo covers only what the path proves; a swapped file under the same path is still caught."""
    with Queue.open(qpath) as q:
        q.enqueue(b"original")
        lease = q.lease()
        assert lease is not None
        full = os.path.join(qpath, lease.path)
        with open(full, "rb") as f:
            data = f.read()
        with open(full + ".new", "wb") as f:  # same name and bytes, another inode
            f.write(data)
        os.rename(full + ".new", full)
        with pytest.raises(QueueCorrupt):
            lease.payload()


def test_a_candidate_taken_meanwhile_costs_one_failed_open_and_no_parse(
    qpath: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35: at 4 consumers most kept candidates are gone when tried; a leftover is
    opened first, so a lost race costs the ENOENT open alone, not a parse, tag and hash too."""
    with Queue.open(qpath) as a, Queue.open(qpath) as b:
        for i in range(3):
            b.enqueue(f"job {i}".encode())
        assert a.lease() is not None  # a keeps the other two names
        assert b.lease() is not None and b.lease() is not None
        parsed: list[str] = []
        real_parse = claim.parse_name
        monkeypatch.setattr(claim, "parse_name", lambda state, name: parsed.append(name) or real_parse(state, name))
        with linux.trace() as events:
            assert a.lease() is None
        failed_opens = [e for e in events if e.op == "open" and e.failed]
        assert len(failed_opens) == 2 and parsed == []


def test_a_kept_candidate_that_fails_its_name_check_is_closed_and_quarantined(qpath: str) -> None:
    with Queue.open(qpath) as a, Queue.open(qpath) as b:
        ids = [b.enqueue(f"job {i}".encode()) for i in range(3)]
        first = a.lease()
        assert first is not None
        cand = a._ctx.shard_candidates(0)
        assert len(cand.names) == 2
        shard_dir = os.path.join(qpath, a._ctx.ready_rels[0])
        name = cand.names[0]
        forged = name[:-20] + f"{int(name[-20:-4], 16) ^ 1:016x}" + ".sqj"  # the tag no longer authenticates
        os.rename(os.path.join(shard_dir, name), os.path.join(shard_dir, forged))
        cand.names[0] = forged
        lease = a.lease()
        assert lease is not None and lease.job_id in set(ids) - {first.job_id}
        (moved,) = os.listdir(os.path.join(qpath, "quarantine"))
        open_files = {os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")}
        assert os.path.realpath(os.path.join(qpath, "quarantine", moved)) not in open_files  # the early open was closed
        assert not os.path.exists(os.path.join(shard_dir, forged))


def _shard_of_lease(q: Queue, lease: Lease) -> int:
    return q._ctx.ready_rels.index(lease.path.rsplit("/", 1)[0])


def _spy_start_hints(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """The start hint of every scan the claim makes from now on."""
    hints: list[int | None] = []
    real = claim.scan_order

    def spy(*args: object, start_hint: int | None = None) -> object:
        hints.append(start_hint)
        return real(*args, start_hint=start_hint)  # type: ignore[arg-type]

    monkeypatch.setattr(claim, "scan_order", spy)
    return hints


def _spy_scanned_shards(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every shard the claim scans the full way (not only probes) from now on, in order."""
    shards: list[int] = []
    real = claim._Scan.scan_shard

    def spy(self: claim._Scan, shard: int) -> Lease | None:
        shards.append(shard)
        return real(self, shard)

    monkeypatch.setattr(claim._Scan, "scan_shard", spy)
    return shards


def test_a_consumer_stays_on_the_shard_whose_names_it_holds_for_at_most_stay_max_claims(
    make_queue: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35: consumers that each came back to a shard after the others took its first names lost
    1-4 races a job; a handle now starts its next scan at the shard it holds names of, a bounded
    number of times in a row, then at its round's pseudo-random shard again."""
    with make_queue(shards=2) as producer:
        write_ready_jobs(producer, 100)  # ~50 a shard, all in one chunk
        with Queue.open(producer.path) as q:
            hints = _spy_start_hints(monkeypatch)
            shards, stays = [], []
            for _ in range(2 * claim.STAY_MAX):
                stays.append(q._ctx.claim_stay)
                lease = q.lease()
                assert lease is not None
                shards.append(_shard_of_lease(q, lease))
                q.ack(lease)
    first = shards[0]
    assert shards[: claim.STAY_MAX] == [first] * claim.STAY_MAX
    assert stays[: claim.STAY_MAX + 1] == [None] + [first] * (claim.STAY_MAX - 1) + [None]
    assert hints[:2] == [None, None], "a scan that stays makes no order; after STAY_MAX the order starts afresh"


def test_a_stay_that_finds_nothing_goes_on_to_the_other_shards_once_each(
    make_queue: Callable[..., Queue], queue_path: str
) -> None:
    with make_queue(shards=2) as producer:
        write_ready_jobs(producer, 60)
        with Queue.open(producer.path) as q:
            lease = q.lease()
            assert lease is not None
            stay = q._ctx.claim_stay
            assert stay is not None
            shard_dir = os.path.join(queue_path, q._ctx.ready_rels[stay])
            for name in os.listdir(shard_dir):  # the kept names vanish, and every other job of the shard
                if name != lease.path.rsplit("/", 1)[1]:
                    os.unlink(os.path.join(shard_dir, name))
            stay_fd = q._ctx.ready_dir(stay)
            with linux.trace() as events:
                other = q.lease()
            assert other is not None and _shard_of_lease(q, other) == 1 - stay
            ops = [e.op for e in events if e.op in ("lseek", "getdents") and e.detail == (stay_fd,)]
            # From the cursor to the end, rewound, from the first entry to the end: once, not scanned
            # (or probed) again by the order that goes on after it.
            assert ops == ["getdents", "lseek", "getdents", "getdents"], ops


def test_a_stay_ends_with_the_names_the_handle_holds(qpath: str) -> None:
    with Queue.open(qpath) as b, Queue.open(qpath) as a:
        for i in range(3):
            b.enqueue(f"job {i}".encode())
        assert a.lease() is not None
        assert a._ctx.claim_stay == 0  # two names kept
        assert a.lease() is not None
        assert a._ctx.claim_stay == 0  # one
        assert a.lease() is not None
        assert a._ctx.claim_stay is None  # none left: no stay
        assert a.lease() is None
        assert a._ctx.claim_stay is None


def test_the_handles_own_enqueue_comes_before_its_stay(
    make_queue: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    with make_queue(shards=64) as producer:
        write_ready_jobs(producer, 400)
        with Queue.open(producer.path) as q:
            lease = q.lease()
            assert lease is not None and q._ctx.claim_stay == _shard_of_lease(q, lease)
            hints = _spy_start_hints(monkeypatch)
            scanned = _spy_scanned_shards(monkeypatch)
            for _ in range(100):  # a job of our own in another shard than the stay
                q.enqueue(b"own")
                if q._ctx.last_enqueued_shard != q._ctx.claim_stay:
                    break
            own_shard = q._ctx.last_enqueued_shard
            assert own_shard is not None and own_shard != q._ctx.claim_stay
            lease = q.lease()
            # Scanned first, and found there: no order made (like the stay's).
            assert lease is not None and scanned == [own_shard] and hints == []
            assert _shard_of_lease(q, lease) == own_shard


def test_an_enqueue_hint_that_finds_nothing_goes_on_to_the_other_shards_once_each(
    make_queue: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    with make_queue(shards=64) as q, Queue.open(q.path) as other:
        q.enqueue(b"own")
        own_shard = q._ctx.last_enqueued_shard
        assert own_shard is not None
        assert other.lease() is not None  # another consumer takes it first
        hints = _spy_start_hints(monkeypatch)
        scanned = _spy_scanned_shards(monkeypatch)
        assert q.lease() is None
        # The hint's shard scanned first, then the order (its stride from there) once over the others.
        assert hints == [own_shard] and scanned[0] == own_shard and sorted(scanned) == list(range(64))


def test_a_lost_race_ends_the_stay(qpath: str) -> None:
    """Two handles on one shard would take turns at its names, each losing one a claim: the loser moves on."""
    with Queue.open(qpath) as b, Queue.open(qpath) as a:
        for i in range(6):
            b.enqueue(f"job {i}".encode())
        assert a.lease() is not None and a._ctx.claim_stay == 0  # a keeps five names
        assert b.lease() is not None and b.lease() is not None  # b takes the first two of them
        with linux.trace() as events:
            assert a.lease() is not None
        assert sum(1 for e in events if e.op == "open" and e.failed) == 2
        assert a._ctx.claim_stay is None
        assert a.lease() is not None and a._ctx.claim_stay == 0  # no race lost: it stays again


def test_consumers_taking_turns_rarely_lose_a_race(make_queue: Callable[..., Queue]) -> None:
    """Four handles leasing in turn from a 64-shard backlog: with the stay each mostly works
    through a shard of its own (0-4 lost races in 160 leases, 8 runs); before it each came back
    to shards whose first names the others had taken (24-32)."""
    with make_queue(shards=64) as producer:
        write_ready_jobs(producer, 1200)
        handles = [Queue.open(producer.path) for _ in range(4)]
        try:
            with linux.trace() as events:
                for _ in range(40):
                    for q in handles:
                        lease = q.lease()
                        assert lease is not None
                        q.ack(lease)
        finally:
            for q in handles:
                q.close()
    lost = [e for e in events if e.op == "open" and e.failed]
    assert len(lost) <= 12, f"{len(lost)} lost races in 160 leases"


def test_a_hint_out_of_range_is_refused_before_any_scan(
    make_queue: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hint is the handle's own (its enqueue's shard); one that is not a shard is scan_order's
    InvalidInput, as before the hint's shard was scanned ahead of the order, and nothing is scanned."""
    from steadqd import ErrorKind, NotCommitted

    with make_queue(shards=4) as q:
        q.enqueue(b"x")
        scanned = _spy_scanned_shards(monkeypatch)
        for bad in (4, -1):
            q._ctx.last_enqueued_shard = bad
            with pytest.raises(NotCommitted) as ei:
                q.lease()
            assert ei.value.kind is ErrorKind.INVALID_INPUT and "start_hint" in str(ei.value)
        assert scanned == []
        assert q.lease() is not None
