"""``steadqd.work("s3://...", handler)``: the Python worker API serving a bucket queue on the live SeaweedFS.

An idle consumer thread waits on the bucket's ready watch (``steadqd.s3.watch``:
one LIST per tick with backoff, and the doorbell) and makes a claim pass only
when it has news or once a minute, not one per ``poll``. The test proves jobs
are run, acked and buried through it. A failing pause GET is provoked on the
memory store behind the fault injector (steadqd.s3.store.faults), which no live
engine can be made to do on cue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from steadqd.backend import init_queue, open_queue
from steadqd.errors import InvalidInput
from steadqd.s3.backend import BucketBackend
from steadqd.s3.control import PAUSE_KEY
from steadqd.s3.layout import init_layout, open_layout
from steadqd.s3.lease import Lease
from steadqd.s3.store.base import MUTATIONS
from steadqd.s3.store.faults import Fault, FaultKind, FaultyStore
from steadqd.s3.store.memory import MemoryStore
from steadqd.tasks import Bury, Job, Task, Worker
from steadqd.tasks.feeder import Feeder
from tests.stowq.conftest import LIVE_BUCKET
from tests.stowq.seaweed import Seaweed


def test_a_worker_serves_a_bucket_queue(seaweed: Seaweed, live_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seaweed.store(LIVE_BUCKET).close()
    for name, value in seaweed.environment().items():
        monkeypatch.setenv(name, value)
    url = f"s3://{LIVE_BUCKET}/{live_prefix}work"
    q = init_queue(url, shards=2, certify_store=False)
    try:
        ids = [q.enqueue(body) for body in (b"one", b"two", b"reject")]
    finally:
        q.close()

    seen: dict[str, bytes] = {}
    done = threading.Event()

    def handler(job: Job) -> None:
        seen[job.id] = job.payload
        if len(seen) == len(ids):
            done.set()
        if job.payload == b"reject":
            raise Bury("not wanted here")

    worker = Worker(url, handler, lease=4.0, poll=0.2, open_options={"certify_store": False})
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert done.wait(60), f"the worker ran {len(seen)} of {len(ids)} jobs"
    finally:
        worker.stop()
        thread.join(60)
    assert not thread.is_alive()
    assert sorted(seen) == sorted(ids)
    assert (worker.stats.acked, worker.stats.buried, worker.stats.lost) == (2, 1, 0)
    q = open_queue(url)
    try:
        assert q.lease(duration=2.0) is None  # every job settled: nothing left to deliver
    finally:
        q.close()
    task = Task(lambda: None, url, name="noop", open_options={"certify_store": False})
    try:
        with pytest.raises(InvalidInput, match="metadata cannot be stored in a bucket queue"):
            task.enqueue()  # a task call is named in metadata, which StowQ/1 job records lack
    finally:
        task.close()


def test_a_worker_of_a_paused_bucket_queue_claims_nothing_and_resumes(
    seaweed: Seaweed, live_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``steadq pause`` on a bucket queue (issue 32 #2): the worker API reads ``meta/steadq-paused`` before
    claiming (while busy at most every PAUSE_RECHECK, and always after a quiet wait), so jobs put after
    the pause wait while the running handler finishes and acks; a paused consumer reads the pause again
    every PAUSED_BUCKET_LOOK (no event comes from a bucket)."""
    seaweed.store(LIVE_BUCKET).close()
    for name, value in seaweed.environment().items():
        monkeypatch.setenv(name, value)
    url = f"s3://{LIVE_BUCKET}/{live_prefix}paused"
    q = init_queue(url, shards=2, certify_store=False)
    release = threading.Event()
    started: dict[str, float] = {}

    def handler(job: Job) -> None:
        started[job.id] = time.monotonic()
        if job.payload == b"long":
            assert release.wait(60)

    worker = Worker(url, handler, concurrency=2, lease=4.0, poll=0.2, open_options={"certify_store": False})
    thread = threading.Thread(target=worker.run)
    try:
        long_job = q.enqueue(b"long")
        thread.start()
        _wait(lambda: long_job in started, "the long job to start")
        q.pause("bucket maintenance")
        visible = time.monotonic()
        held = [q.enqueue(b"short") for _ in range(3)]  # each rings the doorbell: the watch has news at once
        time.sleep(max(0.0, visible + 3.0 - time.monotonic()))
        assert [j for j in held if j in started] == [], "a job was claimed from a paused queue"
        assert worker.paused is not None and worker.paused.reason == "bucket maintenance"
        release.set()  # the running handler finishes while paused, and acks
        _wait(lambda: worker.stats.acked == 1, "the running job's ack while paused")
        assert [j for j in held if j in started] == []
        assert q.resume() is not None
        _wait(lambda: worker.stats.acked == 4, "the held jobs after the resume")
        assert worker.paused is None
    finally:
        release.set()
        worker.stop()
        if thread.is_alive():
            thread.join(60)
        q.close()
    assert not thread.is_alive()
    assert (worker.stats.retried, worker.stats.buried, worker.stats.lost) == (0, 0, 0)


def test_a_failing_pause_get_makes_the_consumer_claim_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whoever can make the bucket fail the GET of ``meta/steadq-paused`` (a 5xx, a dropped connection)
    must not get a claim out of it: a failed pause read is a queue error, so the consumer leases
    nothing, logs it and tries again after ``ERROR_PAUSE``; once the GET answers, the jobs run."""
    store = FaultyStore(MemoryStore())
    q = BucketBackend(init_layout(store, "farm/", worker_id="w", certify_store=False), url="s3://mem/farm")
    jobs = {q.enqueue(b"job %d" % i) for i in range(3)}

    def opened(target: str, **options: Any) -> BucketBackend:
        return BucketBackend(open_layout(store, "farm/", worker_id="w", certify_store=False), url=target)

    monkeypatch.setattr("steadqd.tasks.worker.open_queue", opened)
    monkeypatch.setattr("steadqd.tasks.worker.ERROR_PAUSE", 0.05)
    started: list[str] = []
    worker = Worker("s3://mem/farm", lambda job: started.append(job.id), concurrency=2, poll=0.2)
    thread = threading.Thread(target=worker.run)
    failing = store.inject(Fault(FaultKind.SERVER_ERROR, op="get", key_prefix=f"farm/{PAUSE_KEY}", times=None))
    before = len(store.trace)
    with caplog.at_level(logging.ERROR, logger="steadqd.tasks"):
        thread.start()
        try:
            _wait(lambda: failing.fired >= 10 or started, "ten failed pause reads")
            assert started == [], "a job was claimed although the pause could not be read"
            writes = [c for c in store.trace[before:] if c.op in MUTATIONS]
            assert writes == [], "the store was written (a lease) although the pause could not be read"
            assert any("read the pause failed" in r.getMessage() for r in caplog.records), caplog.text
            store.clear()  # the GET answers again: the same consumers claim and run every job
            _wait(lambda: worker.stats.acked == len(jobs), "the jobs after the pause GET recovered")
        finally:
            worker.stop()
            thread.join(60)
    assert not thread.is_alive()
    assert set(started) == jobs


class _Spied(BucketBackend):
    """A memory-store bucket handle that notes which handle claimed, and how many jobs it asked for."""

    claims: ClassVar[list[tuple[int, int]]] = []

    def lease_many(self, n: int, duration: float = 30.0, *, wait: float = 0.0) -> list[Lease]:
        self.claims.append((id(self), n))
        return super().lease_many(n, duration, wait=wait)

    def lease(self, wait: float = 0.0, duration: float = 30.0) -> Lease | None:
        self.claims.append((id(self), 1))
        return super().lease(wait, duration)


def _memory_queue(monkeypatch: pytest.MonkeyPatch, jobs: int) -> tuple[BucketBackend, set[str], MemoryStore]:
    """A bucket queue on the memory store (its clock moved by hand) with ``jobs`` jobs, which the worker
    API opens as ``s3://mem/farm``."""
    store = MemoryStore()
    q = BucketBackend(init_layout(store, "farm/", worker_id="w", certify_store=False), url="s3://mem/farm")
    ids = {q.enqueue(b"job %d" % i) for i in range(jobs)}

    def opened(target: str, **options: Any) -> BucketBackend:
        return _Spied(open_layout(store, "farm/", worker_id="w", certify_store=False), url=target)

    _Spied.claims = []
    monkeypatch.setattr("steadqd.tasks.worker.open_queue", opened)
    return q, ids, store


def test_one_handle_claims_in_batches_for_every_thread_of_a_bucket_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a bucket the threads do not each open a handle and race each other for jobs: one claiming
    thread leases with lease_many as many jobs as threads are free, and the threads run them at once."""
    q, ids, _ = _memory_queue(monkeypatch, 12)
    together = threading.Barrier(4, timeout=30)  # passes only when four handlers run at the same time
    ran: list[str] = []
    lock = threading.Lock()

    def handler(job: Job) -> None:
        with lock:
            ran.append(job.id)
            first_four = len(ran) <= 4
        if first_four:
            together.wait()

    worker = Worker("s3://mem/farm", handler, concurrency=4, poll=0.1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        _wait(lambda: worker.stats.acked == len(ids), "every job acked")
    finally:
        worker.stop()
        thread.join(60)
        q.close()
    assert not thread.is_alive()
    assert sorted(ran) == sorted(ids), "a job ran twice or not at all"
    assert len({handle for handle, _ in _Spied.claims}) == 1, "more than one handle claimed"
    assert max(n for _, n in _Spied.claims) == 4, "the four free threads' jobs were not claimed in one round"
    assert (worker.stats.lost, worker.stats.retried) == (0, 0)


def test_a_claimed_job_no_thread_started_is_renewed_and_given_back_at_the_stop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A job claimed in a batch but not yet started is the worker's as much as a running one: the
    renewing thread keeps its lease (a new generation each time), and a stop gives it back rather
    than letting it expire into a second run while this worker still counts it as its own."""
    q, ids, store = _memory_queue(monkeypatch, 2)
    monkeypatch.setattr(Feeder, "run_loop", lambda self, call: self.w._stop.wait())  # no thread takes a claim
    worker = Worker("s3://mem/farm", lambda job: None, concurrency=2, lease=3.0, renew_every=0.3, poll=0.1)
    thread = threading.Thread(target=worker.run)
    with caplog.at_level(logging.INFO, logger="steadqd.tasks"):
        thread.start()
        try:
            _wait(lambda: len(worker._running) == 2, "both jobs claimed")
            first = {job_id: r.lease.generation for job_id, r in worker._running.items()}
            _wait(
                lambda: all(r.lease.generation > first[j] + 1 for j, r in worker._running.items()),
                "two renewals of each claimed job",
            )
        finally:
            worker.stop()
            thread.join(60)
    assert not thread.is_alive()
    assert set(first) == ids and worker._running == {}
    given_back = [r.getMessage() for r in caplog.records if "handed back" in r.getMessage()]
    assert len(given_back) == 2 and all("stopped before running it" in m for m in given_back), caplog.text
    assert worker.stats.lost == 0
    try:
        store.clock.advance(10 * 10**9)  # past the given-back leases: the jobs are then another worker's to take
        again: list[Lease] = []
        deadline = time.monotonic() + 30
        while len(again) < 2 and time.monotonic() < deadline:
            again += q.lease_many(2 - len(again), duration=5.0, wait=1.0)
        assert {lease.job_id for lease in again} == ids
        assert all(lease.attempt == 2 for lease in again), "a given-back job keeps its used attempt"
    finally:
        q.close()


def test_a_bucket_worker_that_went_idle_drains_a_burst_without_waiting_for_news_each_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a round that found nothing, the claiming thread waits on the ready watch for news; once
    the news came and a round claimed jobs, the queue is busy and the next round claims at once. It
    used to wait for fresh news before every round, and the watch lists each new job once: a burst
    put after a quiet spell ran one round per news (a handful of jobs), the rest at the minute's rescan."""
    q, _, _ = _memory_queue(monkeypatch, 0)
    worker = Worker("s3://mem/farm", lambda job: time.sleep(0.005), concurrency=2, poll=0.2)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        _wait(lambda: _Spied.claims, "a first, empty, claim round")
        time.sleep(0.3)  # the round found nothing: the consumer now waits on its watch
        ids = {q.enqueue(b"burst %d" % i) for i in range(30)}
        _wait(lambda: worker.stats.acked == len(ids), "the burst drained", timeout=15.0)
    finally:
        worker.stop()
        thread.join(60)
        q.close()
    assert not thread.is_alive()
    assert (worker.stats.acked, worker.stats.lost) == (30, 0)


def test_the_renewing_thread_is_not_woken_for_each_job_due_after_its_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job registered with the renewer is due a renewal a third of a lease later: the renewer, which
    wakes at least once a second, is woken early only for a job due before then, not for every job
    (two thread switches and a GIL hand-off a job). Its loops are counted, and bounded by the seconds."""
    q, ids, _ = _memory_queue(monkeypatch, 40)
    loops: list[float] = []
    real = Worker._publish_progress

    def counted(self: Worker) -> None:
        loops.append(time.monotonic())
        real(self)

    monkeypatch.setattr(Worker, "_publish_progress", counted)
    worker = Worker("s3://mem/farm", lambda job: None, concurrency=4, poll=0.1)
    thread = threading.Thread(target=worker.run)
    started = time.monotonic()
    thread.start()
    try:
        _wait(lambda: worker.stats.acked == len(ids), "every job acked")
        seconds = time.monotonic() - started
        woken = len([t for t in loops if t <= started + seconds])
    finally:
        worker.stop()
        thread.join(60)
        q.close()
    assert not thread.is_alive()
    assert woken <= seconds + 2, f"the renewer looped {woken} times in {seconds:.1f}s for {len(ids)} jobs"


def _wait(pred: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
