"""Pause records and unique keys on both backends (issue 32 #2, #5), through the backend contract.

The pause record is hostile input to every reader (a group member may write
``control/``): a link, a FIFO, an oversized or malformed record must never
be followed, block or be believed, and must still pause. Unique keys:
concurrent producers of one key, as racing processes, make exactly one job.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from steadqd.backend import Backend
from steadqd.errors import DuplicateJob, ErrorKind, InvalidInput, SteadQError
from steadqd.fs.handle import Queue
from steadqd.queue_control import PAUSE_RECORD_MAX, unique_job_id
from steadqd.s3 import keys
from steadqd.s3.backend import BucketBackend
from steadqd.s3.keys import TermKind
from steadqd.s3.layout import init_layout, open_layout
from steadqd.s3.recovery import gc
from steadqd.s3.store.memory import ManualClock, MemoryStore
from tests.invariants import check_tree

STEADQ = os.path.join(os.path.dirname(sys.executable), "steadq")


@pytest.fixture(params=["fs", "bucket"])
def q(request: pytest.FixtureRequest, make_queue) -> Iterator[Backend]:  # type: ignore[no-untyped-def]
    if request.param == "fs":
        yield make_queue()
        return
    store = MemoryStore(clock=ManualClock(step_ns=1000))
    b = BucketBackend(init_layout(store, "farm/", worker_id="w", certify_store=False), url="s3://mem/farm")
    try:
        yield b
    finally:
        b.close()


def test_pause_is_stored_read_back_and_resumed(q: Backend) -> None:
    assert q.pause_state() is None
    state = q.pause("disk \x1b[31mmigration")
    got = q.pause_state()
    assert got is not None and got.reason == "disk \x1b[31mmigration" and got.since_ns == state.since_ns
    assert "\x1b" not in got.summary() and "\\x1b" in got.summary()  # shown escaped
    # producers keep going while paused
    q.enqueue(b"while paused")
    assert q.resume() == got
    assert q.pause_state() is None
    assert q.resume() is None  # resuming a queue that is not paused changes nothing


def test_a_reason_too_long_is_refused(q: Backend) -> None:
    with pytest.raises(InvalidInput):
        q.pause("x" * 1001)
    assert q.pause_state() is None


def test_a_second_put_of_a_key_is_refused_naming_the_job_in_every_state(q: Backend) -> None:
    first = q.enqueue(b"one", unique="report-2024")
    assert first == unique_job_id(q.queue_id, "report-2024")
    with pytest.raises(DuplicateJob) as e:
        q.enqueue(b"two", unique="report-2024")
    assert e.value.job_id == first and e.value.exit_code == 1
    lease = q.lease()
    assert lease is not None and lease.job_id == first
    with pytest.raises(DuplicateJob):  # running
        q.enqueue(b"one", unique="report-2024")
    q.ack(lease)
    with pytest.raises(DuplicateJob):  # acknowledged, receipt within retention
        q.enqueue(b"one", unique="report-2024")
    other = q.enqueue(b"x", unique="other", delay=3600)
    with pytest.raises(DuplicateJob):  # delayed
        q.enqueue(b"x", unique="other")
    assert other != first


def test_a_dead_job_holds_its_key(q: Backend) -> None:
    jid = q.enqueue(b"poison", unique="k", max_attempts=1)
    lease = q.lease()
    assert lease is not None
    q.bury(lease)
    with pytest.raises(DuplicateJob) as e:
        q.enqueue(b"poison", unique="k")
    assert e.value.job_id == jid


@pytest.mark.parametrize("dead", [False, True], ids=["acknowledged", "dead"])
def test_a_bucket_key_is_refused_in_the_gc_window_and_free_once_the_graph_is_gone(
    dead: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GC deletes a settled job's record just before its tombstone (steadqd.s3.recovery.gc). A producer
    enqueueing the key in that window would make a job the old tombstone settles at once; it is refused
    (the tombstone is read before the create), and once the graph is gone the key makes a new job
    that is delivered."""
    store = MemoryStore(clock=ManualClock(step_ns=1000))
    b = BucketBackend(init_layout(store, "farm/", worker_id="w", certify_store=False), url="s3://mem/farm")
    producer = BucketBackend(open_layout(store, "farm/", worker_id="p", certify_store=False), url="s3://mem/farm")
    jid = b.enqueue(b"old", unique="nightly", max_attempts=1)
    lease = b.lease()
    assert lease is not None and lease.job_id == jid
    b.bury(lease) if dead else b.ack(lease)
    layout = b.layout
    raw = bytes.fromhex(jid)
    shard = keys.shard_of(layout.queue_id, raw, layout.format.shard_count)
    tombstone = keys.dead_key(shard, raw) if dead else keys.receipt_key(shard, raw)
    in_window: list[BaseException | str] = []
    real = gc._delete

    def deleting(lay: object, rel: str) -> None:
        if rel == tombstone and not in_window:  # the job record is gone, the tombstone not yet
            assert layout.get(keys.job_key(shard, raw)) is None
            try:
                in_window.append(producer.enqueue(b"new", unique="nightly"))
            except DuplicateJob as e:
                in_window.append(e)
        real(lay, rel)  # type: ignore[arg-type]

    monkeypatch.setattr(gc, "_delete", deleting)
    gc.delete_job_graph(layout, shard, raw, TermKind.DEAD if dead else TermKind.RECEIPT)
    (refused,) = in_window
    assert isinstance(refused, DuplicateJob) and refused.job_id == jid, refused
    assert ("dead" if dead else "acknowledged") in str(refused)
    assert layout.get(tombstone) is None and layout.get(keys.job_key(shard, raw)) is None  # the graph is gone

    assert producer.enqueue(b"new", unique="nightly") == jid  # the key is free: the same derived id, a new job
    # another consumer (b itself skips the id it settled for TERMINAL_MEMO_S; GC comes days later)
    consumer = BucketBackend(open_layout(store, "farm/", worker_id="c", certify_store=False), url="s3://mem/farm")
    lease = consumer.lease()
    assert lease is not None and lease.job_id == jid and consumer.read_payload(lease) == b"new"
    consumer.ack(lease)


def test_unique_and_job_id_together_are_refused(q: Backend) -> None:
    for bad in ({"unique": "k", "job_id": "0" * 32}, {"unique": ""}, {"unique": "k" * 1025}):
        with pytest.raises(SteadQError) as e:  # the filesystem wraps it as not committed, same kind
            q.enqueue(b"x", **bad)
        assert e.value.kind is ErrorKind.INVALID_INPUT


def _produce(path: str, key: str, start: multiprocessing.synchronize.Event, out: multiprocessing.Queue) -> None:  # type: ignore[name-defined]
    qq = Queue.open(path)
    start.wait(10)
    try:
        out.put(("made", qq.enqueue(f"from {os.getpid()}".encode(), unique=key)))
    except DuplicateJob as e:
        out.put(("refused", e.job_id))
    finally:
        qq.close()


def test_racing_producer_processes_of_one_key_make_exactly_one_job(make_queue, queue_path: str) -> None:  # type: ignore[no-untyped-def]
    make_queue().close()
    ctx = multiprocessing.get_context("fork")
    for round_ in range(5):
        start, out = ctx.Event(), ctx.Queue()
        key = f"race-{round_}"
        procs = [ctx.Process(target=_produce, args=(queue_path, key, start, out)) for _ in range(6)]
        for p in procs:
            p.start()
        start.set()
        results = [out.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        made = [r for r in results if r[0] == "made"]
        assert len(made) == 1, results
        assert {jid for _, jid in results} == {made[0][1]}
    with Queue.open(queue_path) as qq:
        assert qq.stats()["ready"].objects == 5


# -- the fs pause record is hostile input ------------------------------------------------------


def test_a_symlinked_pause_record_is_not_followed_and_still_pauses(make_queue, queue_path: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    q = make_queue()
    secret = tmp_path / "secret"
    secret.write_text('{"reason": "from the target", "since": 1, "by": "x"}')
    os.symlink(secret, Path(queue_path) / "control" / "paused")
    state = q.pause_state()
    assert state is not None and state.problem is not None and "from the target" not in state.summary()


def test_a_fifo_pause_record_never_blocks_and_still_pauses(make_queue, queue_path: str) -> None:  # type: ignore[no-untyped-def]
    q = make_queue()
    os.mkfifo(Path(queue_path) / "control" / "paused")
    state = q.pause_state()
    assert state is not None and state.problem is not None


def test_an_oversized_or_malformed_pause_record_is_bounded_and_still_pauses(make_queue, queue_path: str) -> None:  # type: ignore[no-untyped-def]
    q = make_queue()
    rec = Path(queue_path) / "control" / "paused"
    rec.write_bytes(b"{" + b" " * (PAUSE_RECORD_MAX * 10) + b"}")
    state = q.pause_state()
    assert state is not None and state.problem is not None and "longer than" in state.problem
    rec.write_text(json.dumps({"reason": "ok", "since": "yesterday", "by": "x"}))
    state = q.pause_state()
    assert state is not None and state.problem == "a field has the wrong type"


# -- the command line ------------------------------------------------------------------------


def _steadq(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    return subprocess.run([STEADQ, *args], input=stdin.decode(), capture_output=True, text=True, timeout=60)


def test_cli_pause_resume_put_unique_and_stats(make_queue, queue_path: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    make_queue().close()
    r = _steadq("pause", queue_path, "--reason", "maintenance\x1b[2J")
    assert r.returncode == 0 and "\x1b" not in r.stdout and "maintenance" in r.stdout, r
    r = _steadq("put", queue_path, "--unique", "k", stdin=b"a")
    assert r.returncode == 0, r
    assert r.stderr.count("paused") == 1  # put says once that the queue is paused
    jid = r.stdout.split("job_id: ")[1].split()[0]
    r = _steadq("put", queue_path, "--unique", "k", stdin=b"a")
    assert r.returncode == 1 and f"job_id: {jid}" in r.stdout, r
    r = _steadq("stats", queue_path)
    assert "paused: yes" in r.stdout and "maintenance" in r.stdout and "\x1b" not in r.stdout, r
    r = _steadq("--json", "stats", queue_path)
    assert json.loads(r.stdout)["paused"]["reason"] == "maintenance\x1b[2J"
    r = _steadq("ls", queue_path)
    assert "paused: yes" in r.stderr and jid in r.stdout
    assert _steadq("resume", queue_path).returncode == 0
    assert "paused" not in _steadq("stats", queue_path).stdout


def test_cli_pause_of_a_missing_queue_exits_6(tmp_path: Path) -> None:
    r = _steadq("pause", str(tmp_path / "nope"))
    assert r.returncode == 6, r
    r = _steadq("resume", str(tmp_path / "nope"))
    assert r.returncode == 6, r


def test_a_paused_queue_with_unique_jobs_is_still_valid_to_the_format_oracle(make_queue, queue_path: str) -> None:  # type: ignore[no-untyped-def]
    """No reference binary is built here: the tree is checked against tests/invariants.py (the spec's
    format oracle, tests/spec_oracle.py) with the pause record and the unique lock in control/."""
    q = make_queue()
    jid = q.enqueue(b"a", unique="k")
    q.pause("check")
    ts = check_tree(queue_path)
    assert jid in str(ts)
    assert _steadq("fsck", queue_path).returncode == 0
    q.resume()
    lease = q.lease()
    assert lease is not None
    q.ack(lease)
    check_tree(queue_path)


def test_racing_bucket_producers_of_one_key_make_exactly_one_job() -> None:
    """Threads with handles of their own on one store (a memory store lives in one process): the job
    record's put-if-absent lets exactly one in; the others are refused naming it."""
    import threading

    store = MemoryStore(clock=ManualClock(step_ns=1000))
    init_layout(store, "farm/", worker_id="w0", certify_store=False)
    handles = [
        BucketBackend(open_layout(store, "farm/", worker_id=f"w{i}", certify_store=False), url="s3://mem/farm")
        for i in range(6)
    ]
    go = threading.Barrier(len(handles))
    results: list[tuple[str, str]] = []

    def produce(h: BucketBackend) -> None:
        go.wait(10)
        try:
            results.append(("made", h.enqueue(b"same", unique="race")))
        except DuplicateJob as e:
            results.append(("refused", e.job_id))

    threads = [threading.Thread(target=produce, args=(h,)) for h in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r[0] for r in results].count("made") == 1, results
    assert len({jid for _, jid in results}) == 1
    for h in handles:
        h.close()
