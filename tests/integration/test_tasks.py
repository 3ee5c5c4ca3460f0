"""The Python worker API (steadqd.tasks) on a real queue: outcomes, renewals, stops.

In-process tests drive :class:`Worker` from the test thread; the signal tests
run a worker script as a real process and send it SIGTERM, as systemd would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from steadqd import Queue
from steadqd.backoff import RetryPolicy
from steadqd.constants import DeadReason
from steadqd.errors import InvalidInput, SteadQError
from steadqd.fs import linux
from steadqd.fs.recovery.driver import run_recovery
from steadqd.tasks import Bury, Job, Retry, Task, Worker, task
from tests.invariants import check_tree, live_tree

DEADLINE = 30.0
FAST = RetryPolicy(base_ms=1, cap_ms=1, use_jitter=False)


def wait_for(pred: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def serve(w: Worker, until: Callable[[], bool], what: str) -> None:
    """Run ``w`` in a thread until ``until()``; then stop it and wait for the drain."""
    t = threading.Thread(target=w._serve, args=(w._call_sync,), daemon=True)
    t.start()
    try:
        wait_for(until, what)
    finally:
        w.stop()
        t.join(DEADLINE)
    assert not t.is_alive(), "the worker did not stop"


def dead_reason(queue: Queue, job: str) -> int:
    (obj,) = [o for o in queue.inspect_detailed(job) if o.state == "dead"]
    reason = obj.details["reason"]
    assert isinstance(reason, int), obj.details
    return reason


def promote_now(queue: Queue) -> None:
    """Delayed retries (1 ms backoff) go back to ready: what the promoter does."""
    queue.recover(phases=("promote_delayed",))


# -- outcomes -----------------------------------------------------------------------------


def test_a_returning_handler_acks_with_the_verified_payload(queue: Queue, queue_path: str) -> None:
    job = queue.enqueue(b"hello", content_type="text/plain", metadata={"k": "v"})
    seen: list[Job] = []
    w = Worker(queue_path, seen.append, poll=0.1)
    serve(w, lambda: w.stats.acked == 1, "the ack")
    (got,) = seen
    assert (got.id, got.payload, got.text(), got.content_type, dict(got.metadata)) == (
        job,
        b"hello",
        "hello",
        "text/plain",
        {"k": "v"},
    )
    assert (got.attempt, got.max_attempts) == (1, 3)
    assert check_tree(queue_path).receipts == {job}


def test_an_exception_retries_with_backoff_then_dead_letters(queue: Queue, queue_path: str) -> None:
    job = queue.enqueue(b"x", max_attempts=2)
    attempts: list[int] = []

    def fail(j: Job) -> None:
        attempts.append(j.attempt)
        raise ValueError("boom")

    w = Worker(queue_path, fail, poll=0.1, retry=FAST)

    def done() -> bool:
        promote_now(queue)
        return job in check_tree(queue_path).dead

    serve(w, done, "attempts to run out")
    assert attempts == [1, 2]
    assert (w.stats.retried, w.stats.buried) == (1, 1)
    assert dead_reason(queue, job) == DeadReason.ATTEMPTS_EXHAUSTED


def test_the_backoff_is_the_policy_given(queue: Queue, queue_path: str) -> None:
    job = queue.enqueue(b"x")
    w = Worker(queue_path, lambda j: 1 / 0, poll=0.1, retry=RetryPolicy(base_ms=3_600_000, cap_ms=3_600_000))
    serve(w, lambda: w.stats.retried == 1, "the retry")
    (obj,) = queue.inspect_detailed(job)
    assert obj.state == "delayed"
    not_before = obj.details["not_before_ns"]
    assert isinstance(not_before, int), obj.details
    assert not_before - queue.wall_floor_ns() > 1800 * 10**9  # the upper half of an hour


def test_bury_dead_letters_with_the_application_reason(queue: Queue, queue_path: str) -> None:
    job = queue.enqueue(b"x")

    def reject(j: Job) -> None:
        raise Bury("not for us", reason=0x0100)

    w = Worker(queue_path, reject, poll=0.1)
    serve(w, lambda: w.stats.buried == 1, "the bury")
    assert job in check_tree(queue_path).dead
    assert dead_reason(queue, job) == 0x0100


def test_retry_with_a_delay_of_zero_runs_the_job_again_at_once(queue: Queue, queue_path: str) -> None:
    job = queue.enqueue(b"x")
    attempts: list[int] = []

    def once(j: Job) -> None:
        attempts.append(j.attempt)
        if j.attempt == 1:
            raise Retry("not yet", delay=0)

    w = Worker(queue_path, once, poll=0.1)
    serve(w, lambda: w.stats.acked == 1, "the second attempt's ack")
    assert attempts == [1, 2] and check_tree(queue_path).receipts == {job}


def test_a_corrupt_payload_never_reaches_the_handler(queue: Queue, queue_path: str) -> None:
    job = queue.enqueue(b"precious payload")
    (path,) = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(queue_path, "ready")) for f in fs]
    os.chmod(path, 0o600)
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"X")
    called: list[Job] = []
    w = Worker(queue_path, called.append, poll=0.1)
    serve(w, lambda: w.stats.quarantined == 1, "the payload check")
    assert not called
    assert job not in check_tree(queue_path).all_ids  # quarantined, not delivered


# -- renewals ------------------------------------------------------------------------------


def test_a_handler_longer_than_its_lease_keeps_it(queue: Queue, queue_path: str) -> None:
    """Renewed in the background: recovery, run all along, never takes the job away."""
    job = queue.enqueue(b"x")
    ran: list[int] = []
    release = threading.Event()

    def slow(j: Job) -> None:
        ran.append(j.attempt)
        release.wait(DEADLINE)

    w = Worker(queue_path, slow, lease=1.0, renew_every=0.2, poll=0.1)
    t = threading.Thread(target=w._serve, args=(w._call_sync,), daemon=True)
    t.start()
    try:
        wait_for(lambda: ran, "the handler to start")
        end = time.monotonic() + 3.0  # three lease lengths
        while time.monotonic() < end:
            rep = queue.recover()
            assert rep.leases_reaped == 0 and rep.leases_to_dead == 0
            time.sleep(0.1)
        release.set()
        wait_for(lambda: w.stats.acked == 1, "the ack")
    finally:
        release.set()
        w.stop()
        t.join(DEADLINE)
    assert ran == [1] and check_tree(queue_path).receipts == {job}


def test_a_lease_lost_meanwhile_is_not_settled(queue: Queue, queue_path: str) -> None:
    """The machine slept (recovery saw the lease expire): the handler's late success is dropped."""
    job = queue.enqueue(b"x")
    started, release = threading.Event(), threading.Event()
    lost: list[bool] = []

    def slow(j: Job) -> None:
        started.set()
        release.wait(DEADLINE)
        lost.append(j.lease_lost)

    w = Worker(queue_path, slow, lease=30.0, poll=0.1)
    t = threading.Thread(target=w._serve, args=(w._call_sync,), daemon=True)
    t.start()
    try:
        started.wait(DEADLINE)
        ctx = queue._ctx  # recovery with an injected clock is not public API
        with ctx.tree.operation():
            rep = run_recovery(ctx, now_boottime=linux.boottime_ns() + 3600 * 10**9)
        assert rep.leases_reaped == 1
        w._wake_renewer.set()
        for r in list(w._running.values()):
            r.next_renew = 0.0  # renew now: it finds the lease gone
        wait_for(lambda: all(r.job.lease_lost for r in list(w._running.values())), "the renewer to notice")
        w.stop()  # before the job is back in ready: this worker must not take it again
        release.set()
        t.join(DEADLINE)
    finally:
        release.set()
        w.stop()
    assert lost == [True] and w.stats.lost == 1 and w.stats.acked == 0
    assert check_tree(queue_path).ready == {job}  # attempt 2 is its next owner's


# -- pause (issue 32 #2) -------------------------------------------------------------------------


def test_a_pause_stops_claims_running_handlers_finish_and_resume_is_heard_at_once(
    queue: Queue, queue_path: str
) -> None:
    """``steadq pause`` on a filesystem queue: no claim later than 1 s after the pause is visible, the
    running handler finishes and acks, jobs put meanwhile wait; the resume is heard through the ready
    watch's control/ notification (``poll`` is 8 s, so a resume noticed by polling would miss the 4 s wait)."""
    long_job = queue.enqueue(b"long")
    release = threading.Event()
    started: dict[str, float] = {}

    def handler(j: Job) -> None:
        started[j.id] = time.monotonic()
        if j.payload == b"long":
            assert release.wait(DEADLINE)

    w = Worker(queue_path, handler, concurrency=2, poll=8.0)
    t = threading.Thread(target=w._serve, args=(w._call_sync,), daemon=True)
    t.start()
    try:
        wait_for(lambda: long_job in started, "the long job to start")
        queue.pause("maintenance")
        visible = time.monotonic()
        held = [queue.enqueue(b"short") for _ in range(3)]
        time.sleep(max(0.0, visible + 2.0 - time.monotonic()))
        assert [j for j in held if j in started] == []
        assert queue.stats()["ready"].objects == 3
        assert w.paused is not None and w.paused.reason == "maintenance"
        release.set()  # the running handler finishes while the queue is paused, and acks
        wait_for(lambda: w.stats.acked == 1, "the running job's ack while paused")
        assert queue.stats()["ready"].objects == 3
        assert queue.resume() is not None
        wait_for(lambda: w.stats.acked == 4, "the held jobs after the resume", timeout=4.0)
        assert w.paused is None
    finally:
        release.set()
        w.stop()
        t.join(DEADLINE)
    assert not t.is_alive()
    assert all(started[j] > visible + 1.0 for j in held), "a held job ran before the resume"
    assert check_tree(queue_path).receipts == {long_job, *held}


def test_a_flapping_pause_costs_reads_and_log_lines_per_change_not_per_moment(
    queue: Queue, queue_path: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A writer of ``control/`` pauses and resumes in a loop to make the consumers spin or flood the log.
    A paused consumer reads the record again only on watch news (or after ``poll``, 4 s here): a steady
    pause costs no reads, a flap at most one read per consumer per change, and a pause or resume is
    logged once per worker, not once per consumer thread."""
    threads, flaps = 3, 100
    me = threading.current_thread()
    reads: list[str] = []  # the consumer threads' pause reads (list.append is atomic)
    real = Queue.pause_state

    def counting(self: Queue) -> Any:
        if threading.current_thread() is not me:
            reads.append(threading.current_thread().name)
        return real(self)

    def lines(word: str) -> int:
        return sum(1 for r in caplog.records if word in r.getMessage())

    monkeypatch.setattr(Queue, "pause_state", counting)
    queue.pause("first")
    w = Worker(queue_path, lambda j: None, concurrency=threads, poll=4.0)
    t = threading.Thread(target=w._serve, args=(w._call_sync,), daemon=True)
    with caplog.at_level(logging.INFO, logger="steadqd.tasks"):
        t.start()
        try:
            wait_for(lambda: w.paused is not None and len(set(reads)) == threads, "every consumer to read the pause")
            time.sleep(1.0)  # the news of the start is taken up
            steady = len(reads)
            time.sleep(1.0)
            assert len(reads) - steady <= threads, "consumers re-read a steady pause with no news"
            assert lines("no new job is claimed") == 1  # once per worker, though every thread read it

            before = len(reads)
            for i in range(flaps):
                queue.resume()
                queue.pause(f"flap {i}")
            wait_for(lambda: w.paused is not None and w.paused.reason == f"flap {flaps - 1}", "the last flap")
            time.sleep(1.0)
            flapped = len(reads) - before
            assert flapped <= threads * (2 * flaps + 1), flapped
            logged = lines("no new job is claimed") + lines("resumed")
            assert logged <= flapped and logged <= threads * (2 * flaps + 1), logged

            caplog.clear()
            queue.resume()
            wait_for(lambda: w.paused is None, "the resume")
            time.sleep(1.0)
            assert lines("resumed") == 1 and lines("no new job is claimed") == 0
        finally:
            w.stop()
            t.join(DEADLINE)
    assert not t.is_alive()


# -- the decorator ----------------------------------------------------------------------------


def test_task_enqueue_makes_a_json_job_and_work_calls_the_function(queue: Queue, queue_path: str) -> None:
    calls: list[tuple[str, int]] = []

    @task(queue_path, name="resize")
    def resize(path: str, size: int = 256) -> None:
        calls.append((path, size))

    assert isinstance(resize, Task) and resize.__name__ == "resize"
    job = resize.enqueue("/srv/a.jpg", size=128)
    (obj,) = queue.inspect_detailed(job)
    lease = queue.lease()
    assert lease is not None
    assert json.loads(queue.read_payload(lease)) == {"task": "resize", "args": ["/srv/a.jpg"], "kwargs": {"size": 128}}
    assert lease.content_type == "application/json" and dict(lease.metadata) == {"task": "resize"}
    queue.retry(lease, 0.0)
    w = resize.worker(poll=0.1)
    serve(w, lambda: w.stats.acked == 1, "the task's ack")
    resize.close()
    assert calls == [("/srv/a.jpg", 128)]
    resize("/direct", 1)  # a plain call still runs here
    assert calls[-1] == ("/direct", 1)


def test_task_schedule_delays_and_adds_metadata(queue: Queue, queue_path: str) -> None:
    @task(queue_path, name="later")
    def later() -> None:
        pass

    job = later.schedule(delay=3600, metadata={"user": "ana"}, max_attempts=5)
    later.close()
    (obj,) = queue.inspect_detailed(job)
    assert obj.state == "delayed" and obj.max_attempts == 5


def test_a_worker_buries_a_job_of_another_task_or_not_a_task_call(queue: Queue, queue_path: str) -> None:
    @task(queue_path, name="mine")
    def mine() -> None:
        raise AssertionError("must not run")

    other = queue.enqueue(json.dumps({"task": "theirs", "args": [], "kwargs": {}}).encode())
    garbage = queue.enqueue(b"\xff not json")
    w = mine.worker(poll=0.1)
    serve(w, lambda: w.stats.buried == 2, "both buried")
    assert dead_reason(queue, other) == DeadReason.CONSUMER_REJECTED
    assert dead_reason(queue, garbage) == DeadReason.UNSUPPORTED_CONTENT_TYPE


@pytest.mark.parametrize(
    "payload",
    [
        b"[" * 100_000 + b"]" * 100_000,  # json.loads: RecursionError, not ValueError (issue 30)
        b'{"task": "t", "args": ["\xff"], "kwargs": {}}',  # not UTF-8: UnicodeDecodeError
    ],
    ids=["too-deep", "not-utf8"],
)
def test_an_undecodable_payload_is_buried_once_never_retried(queue: Queue, queue_path: str, payload: bytes) -> None:
    """A payload the decoder fails on is a bad payload: buried at its first attempt, not retried to the end."""

    @task(queue_path, name="t")
    def t(*args: object) -> None:
        raise AssertionError("must not run")

    job = queue.enqueue(payload, max_attempts=5)
    w = t.worker(poll=0.1, retry=FAST)
    serve(w, lambda: w.stats.buried + w.stats.retried >= 1, "the job settled")
    assert (w.stats.buried, w.stats.retried) == (1, 0)
    (obj,) = queue.inspect_detailed(job)
    assert obj.state == "dead" and obj.attempt == 1
    assert dead_reason(queue, job) == DeadReason.UNSUPPORTED_CONTENT_TYPE


def test_job_json_of_a_too_deep_payload_is_a_value_error_that_buries() -> None:
    """A plain handler's ``job.json()`` keeps its documented ValueError, and uncaught it buries the job."""
    job = Job("j", 1, 3, "application/json", {}, b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(ValueError, match="bad payload, not JSON") as e:
        job.json()
    assert isinstance(e.value, Bury) and e.value.reason == DeadReason.UNSUPPORTED_CONTENT_TYPE


def test_task_arguments_must_be_json(queue_path: str, queue: Queue) -> None:
    @task(queue_path, name="t")
    def t(x: object) -> None:
        pass

    with pytest.raises(InvalidInput, match="arguments of task t are not JSON"):
        t.enqueue(object())
    t.close()


def test_async_handlers_run_on_the_event_loop(queue: Queue, queue_path: str) -> None:
    jobs = {queue.enqueue(str(i).encode()) for i in range(6)}
    seen: list[str] = []

    async def handler(j: Job) -> None:
        await asyncio.sleep(0.01)
        seen.append(j.id)

    async def main() -> None:
        w = Worker(queue_path, handler, concurrency=3, poll=0.1)
        run = asyncio.create_task(w.run_async())
        while w.stats.acked < len(jobs):
            await asyncio.sleep(0.02)
        w.stop()
        await asyncio.wait_for(run, DEADLINE)

    asyncio.run(main())
    assert set(seen) == jobs and check_tree(queue_path).receipts == jobs


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"lease": 0}, "lease"),
        ({"lease": 10, "renew_every": 10}, "renew_every"),
    ],
)
def test_bad_worker_options_are_refused(queue_path: str, options: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        Worker(queue_path, lambda j: None, **options)


def test_bury_refuses_a_reason_that_is_not_a_u16() -> None:
    with pytest.raises(InvalidInput, match="u16"):
        Bury("x", reason=0x10000)


# -- stopping, as a process ---------------------------------------------------------------------

WORKER_SCRIPT = textwrap.dedent(
    """
    import logging, os, sys, time
    from steadqd import tasks
    queue, marks, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    logging.basicConfig(level=logging.INFO, filename=os.path.join(marks, "worker.log"))
    release = os.path.join(marks, "release")

    def released(deadline):  # bounded: a failed test never leaves a handler running
        return os.path.exists(release) or time.monotonic() > deadline

    def handler(job):
        deadline = time.monotonic() + 30
        open(os.path.join(marks, job.id + ".start"), "w").close()
        while not released(deadline):
            time.sleep(0.02)
        open(os.path.join(marks, job.id + ".end"), "w").close()

    async def ahandler(job):
        import asyncio
        deadline = time.monotonic() + 30
        open(os.path.join(marks, job.id + ".start"), "w").close()
        while not released(deadline):
            await asyncio.sleep(0.02)
        open(os.path.join(marks, job.id + ".end"), "w").close()

    if mode == "async":
        import asyncio
        stats = asyncio.run(tasks.work_async(queue, ahandler, poll=0.1))
    else:
        stats = tasks.work(queue, handler, poll=0.1)
    print(stats.acked, stats.handed_back, flush=True)
    """
)


def _start_worker(tmp_path: Path, queue_path: str, mode: str) -> tuple[subprocess.Popen[str], Path]:
    script, marks = tmp_path / "w.py", tmp_path / "marks"
    script.write_text(WORKER_SCRIPT)
    marks.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(script), queue_path, str(marks), mode], stdout=subprocess.PIPE, text=True
    )
    return proc, marks


def _wait_draining(marks: Path) -> None:
    """Until the worker has taken the first SIGTERM: a second one sent sooner may merge with it."""

    def draining() -> bool:
        log = marks / "worker.log"
        return log.exists() and "stopping: draining" in log.read_text()

    wait_for(draining, "the worker to log that it drains")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigterm_drains_the_running_handler_and_takes_no_new_job(
    tmp_path: Path, queue: Queue, queue_path: str, mode: str
) -> None:
    first = queue.enqueue(b"1")
    proc, marks = _start_worker(tmp_path, queue_path, mode)
    try:
        wait_for(lambda: (marks / f"{first}.start").exists(), "the handler to start")
        # The handler runs until released, so a slow enqueue here cannot let it end (and the worker
        # take the second job) before the signal; it is released once the worker says it drains.
        second = queue.enqueue(b"2")
        proc.send_signal(signal.SIGTERM)
        _wait_draining(marks)
        (marks / "release").touch()
        out, _ = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and out.split() == ["1", "0"]
    assert (marks / f"{first}.end").exists() and not (marks / f"{second}.start").exists()
    tree = check_tree(queue_path)
    assert tree.receipts == {first} and tree.ready == {second}


def test_a_second_sigterm_hands_the_running_job_back(tmp_path: Path, queue: Queue, queue_path: str) -> None:
    job = queue.enqueue(b"1")
    proc, marks = _start_worker(tmp_path, queue_path, "sync")
    try:
        wait_for(lambda: (marks / f"{job}.start").exists(), "the handler to start")
        proc.send_signal(signal.SIGTERM)
        _wait_draining(marks)  # never released: the handler is still running at the second signal
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and out.split() == ["0", "1"]
    assert not (marks / f"{job}.end").exists()
    assert live_tree(queue_path).ready == {job}


# -- the first hour (issue 33 #8) ------------------------------------------------------------------


def _run_bounded(w: Worker, seconds: float = 10.0) -> BaseException | None:
    """``w.run()`` in a thread for at most ``seconds`` (stopped after that); what it raised, if anything."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            w._serve(w._call_sync)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            raised.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        w.stop()
        t.join(DEADLINE)
        raise AssertionError(f"the worker was still running after {seconds:g}s")
    return raised[0] if raised else None


def test_a_worker_of_a_queue_that_does_not_exist_stops_with_one_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = str(tmp_path / "thumbs")
    with caplog.at_level("ERROR", logger="steadqd.tasks"):
        e = _run_bounded(Worker(missing, lambda j: None, poll=0.1), seconds=5.0)
    assert isinstance(e, InvalidInput), e
    assert f"queue root {missing} does not exist" in str(e)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        f"cannot open the queue {missing}: queue root {missing} does not exist "
        f"(create it with `steadq init {missing}`, or give create=True)"
    ], errors
    assert not os.path.exists(missing)


def test_create_true_makes_the_missing_queue_and_serves_it(tmp_path: Path) -> None:
    path = str(tmp_path / "thumbs")
    seen: list[bytes] = []
    w = Worker(path, lambda j: seen.append(j.payload), poll=0.1, create=True)
    t = threading.Thread(target=w._serve, args=(w._call_sync,), daemon=True)
    t.start()
    try:

        def enqueued() -> bool:
            try:
                with Queue.open(path) as q:  # refused until the worker has made it whole
                    q.enqueue(b"first job")
                return True
            except SteadQError:
                return False

        wait_for(enqueued, "the queue to be made")
        wait_for(lambda: w.stats.acked == 1, "the job to run")
    finally:
        w.stop()
        t.join(DEADLINE)
    assert seen == [b"first job"]
    make_too = Task(lambda: None, str(tmp_path / "other"), name="t")
    assert _run_bounded(make_too.worker(poll=0.1), seconds=5.0) is not None  # the task's own default: no create


TASK_MODULE = textwrap.dedent(
    """
    import sys
    import steadqd

    @steadqd.task(sys.argv[1] if __name__ == "__main__" else "QUEUE")
    def thumbnail(path):
        return None

    if __name__ == "__main__":
        print(thumbnail.name)
        print(thumbnail.enqueue("/srv/in/a.jpg"))
    """
)


def test_a_task_defined_in_a_script_has_the_name_a_worker_importing_it_finds(
    tmp_path: Path, queue: Queue, queue_path: str
) -> None:
    pkg = tmp_path / "media"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "thumbs.py").write_text(TASK_MODULE.replace('"QUEUE"', repr(queue_path)))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    as_script = subprocess.run([sys.executable, str(pkg / "thumbs.py"), queue_path], capture_output=True,
                               text=True, cwd=tmp_path, env=env, check=True).stdout.split()  # fmt: skip
    as_module = subprocess.run([sys.executable, "-m", "media.thumbs", queue_path], capture_output=True,
                               text=True, cwd=tmp_path, env=env, check=True).stdout.split()  # fmt: skip
    imported = subprocess.run([sys.executable, "-c", "import media.thumbs as t; print(t.thumbnail.name)"],
                              capture_output=True, text=True, cwd=tmp_path, env=env, check=True).stdout.split()  # fmt: skip
    assert imported == ["media.thumbs.thumbnail"]
    assert as_module[0] == "media.thumbs.thumbnail"
    assert as_script[0] == "media.thumbs.thumbnail"  # run by its file: named by its package's __init__.py files
    # A worker importing the module runs the jobs of the script and of `python -m` alike.
    sys.path.insert(0, str(tmp_path))
    try:
        import media.thumbs as mod  # type: ignore[import-not-found]

        w = mod.thumbnail.worker(poll=0.1)
        serve(w, lambda: w.stats.acked + w.stats.buried == 2, "both jobs settled")
        assert (w.stats.acked, w.stats.buried) == (2, 0)
        assert check_tree(queue_path).receipts == {as_script[1], as_module[1]}
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("media.thumbs", None)
        sys.modules.pop("media", None)


def test_a_task_without_a_module_to_name_it_by_must_be_given_a_name(queue_path: str) -> None:
    fn = lambda path: None  # noqa: E731
    fn.__module__ = "__main__"
    main = sys.modules["__main__"]
    saved = main.__dict__.get("__file__"), main.__dict__.get("__spec__")
    try:
        main.__dict__.pop("__file__", None)
        main.__spec__ = None
        with pytest.raises(InvalidInput, match=r"give the task a name: @task\(queue, name="):
            task(queue_path)(fn)
        assert task(queue_path, name="thumbnail")(fn).name == "thumbnail"
    finally:
        if saved[0] is not None:
            main.__file__ = saved[0]
        main.__spec__ = saved[1]


def test_a_bury_message_reaches_the_journal_with_the_job_id(
    queue: Queue, queue_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under systemd with logging not configured, the worker's sentences go to the journal with
    STEADQ_JOB_ID, where ``steadq show`` finds them; before, Bury's message was a bare stderr line."""
    sent: list[tuple[str, dict[str, str]]] = []
    monkeypatch.setattr("steadqd.tasks.journal.journal_connected", lambda: True)
    monkeypatch.setattr("steadqd.tasks.journal._journal_send", lambda message, **f: sent.append((message, f)))
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # nothing configured, as in a bare script
    job = queue.enqueue(b"movie.mkv")

    def reject(j: Job) -> None:  # the message quotes the payload: hostile text, escaped before the journal
        raise Bury(f"not a video: {j.text()}\x1b[2J\nSTEADQ_JOB_ID=0", reason=0x0100)

    w = Worker(queue_path, reject, poll=0.1)
    serve(w, lambda: w.stats.buried == 1, "the bury")
    mine = [(m, f) for m, f in sent if f.get("STEADQ_JOB_ID") == job]
    assert [m for m, _f in mine] == [
        f"job {job} buried (reason 0x0100): not a video: movie.mkv\\x1b[2J\\nSTEADQ_JOB_ID=0"
    ], sent
    fields = mine[0][1]
    assert fields["PRIORITY"] == "4" and fields["STEADQ_QUEUE"] == queue_path and fields["STEADQ_ROLE"] == "task"


# -- progress (issue 32 #4) ---------------------------------------------------------------


def test_job_progress_is_visible_from_another_process_while_the_handler_runs(
    queue: Queue, queue_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``job.progress(percent, text)`` publishes where ``steadq show`` reads it, and is gone after the job."""
    (tmp_path / "progress").mkdir()
    monkeypatch.setenv("STEADQ_PROGRESS_DIR", str(tmp_path / "progress"))
    job = queue.enqueue(b"x")
    steadq = os.path.join(os.path.dirname(sys.executable), "steadq")
    shown: list[str] = []

    def handler(j: Job) -> None:
        with pytest.raises(InvalidInput):
            j.progress(101)
        j.progress(10, "starting")
        j.progress(42, "half \x1b[31mred")  # the latest counts; the text is data

        def seen() -> str | None:
            r = subprocess.run([steadq, "show", "--no-journal", queue_path, j.id], capture_output=True, text=True)
            return r.stdout if "42%" in r.stdout else None

        shown.append(wait_for(seen, "progress in steadq show"))

    w = Worker(queue_path, handler, poll=0.1)
    serve(w, lambda: w.stats.acked == 1, "the ack")
    assert "  progress:      42% half \\x1b[31mred" in shown[0], shown[0]
    assert not any((tmp_path / "progress").rglob(job))  # removed with the job
