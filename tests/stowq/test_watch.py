"""The bucket ready watch (``steadqd.s3.watch``) and its doorbell (``steadqd.s3.doorbell``) on the memory store.

The poll schedule is driven tick by tick (``tick()`` returns the news and
sets the next pause), so its bound is counted from the store's own trace
rather than timed; the doorbell tests run the watch's thread for real.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from steadqd.constants import CancelResult
from steadqd.errors import InvalidInput
from steadqd.s3 import cancel as s3_cancel
from steadqd.s3 import doorbell
from steadqd.s3.handle import BucketQueue
from steadqd.s3.keys import KeyKind, parse_key
from steadqd.s3.layout import DEFAULT_FORMAT
from steadqd.s3.store.faults import Fault, FaultKind, FaultyStore
from steadqd.s3.store.memory import MemoryStore, WallClock
from steadqd.s3.watch import DEFAULT_RING_INTERVAL_S, BucketReadyWatch, check_poll_max, idle_lists_per_minute
from tests.integration.test_shared_queue import PRODUCER, QUEUE_GID, as_user

SECOND = 1_000_000_000
PREFIX = "farm/"


class _Queue:
    def __init__(self, shards: int = 16) -> None:
        self.memory = MemoryStore(clock=WallClock())
        self.store = FaultyStore(self.memory)
        fmt = replace(DEFAULT_FORMAT, shard_count=shards)
        self.q = BucketQueue.init(self.store, PREFIX, fmt=fmt, certify_store=False, floor_staleness_s=0)

    def watch(self, **options: object) -> BucketReadyWatch:
        return BucketReadyWatch(self.q.layout, **options)  # type: ignore[arg-type]


@pytest.fixture
def bells(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A doorbell base of the test's own, shared with a group as /run/steadq/doorbell is.

    Short and directly in /tmp: a unix socket's path has at most 107 bytes, and pytest's tmp_path is long.
    """
    base = Path(tempfile.mkdtemp(prefix="bell-", dir="/tmp"))
    base.chmod(0o2770)
    monkeypatch.setenv(doorbell.DOORBELL_DIR_ENV, str(base))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def queue() -> Iterator[_Queue]:
    yield _Queue()


# -- the poll schedule and its bound ------------------------------------------------------


def test_an_idle_watch_lists_once_per_tick_and_backs_off_to_the_cap(queue: _Queue) -> None:
    watch = queue.watch(poll_first_s=0.25, poll_max_s=2.0, doorbell=False)
    try:
        before = queue.store.count("list")
        pauses = []
        for _ in range(40):
            assert watch.tick() is False
            pauses.append(watch.pause)
        assert queue.store.count("list") - before == 40 == watch.lists
        assert pauses[:4] == [0.5, 1.0, 2.0, 2.0] and set(pauses[3:]) == {2.0}
        # Ticks in one idle minute once at the cap: 60 / 2 = 30 LISTs, whatever the shard count.
        assert 60 / pauses[-1] == 30
    finally:
        watch.close()
    # A claim pass, what lease(wait=) repeats while idle, lists every one of the 16 shards.
    known = len(queue.store.trace)
    assert queue.q.claim_once(duration=30) is None
    listed = [c.key for c in queue.store.trace[known:] if c.op == "list"]
    assert len([k for k in listed if k.startswith(PREFIX + "jobs/")]) == 16
    assert idle_lists_per_minute(2.0, 16) == 46.0  # the watch's 30 and a safety rescan's 16


def test_a_held_watch_lists_nothing_until_the_hold_ends_and_then_reports_what_came(queue: _Queue) -> None:
    """A worker that keeps claiming holds its watch (steadqd.tasks.consumer): no LIST while the hold lasts,
    and a job put meanwhile is news once it ends, not lost."""
    watch = queue.watch(poll_first_s=0.05, poll_max_s=0.1, doorbell=False)
    try:
        watch.hold(0.8)
        watch.watch_missing()  # the thread's first tick is due at once: put off
        time.sleep(0.3)
        assert watch.lists == 0
        queue.q.enqueue(b"put while held")
        assert watch.wait(0.2) is False, "news while held"
        assert watch.lists == 0
        assert watch.wait(5.0) is True, "the job put while held was not news after the hold"
        watch.hold(0.0)
        listed = watch.lists
        deadline = time.monotonic() + 5
        while watch.lists < listed + 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch.lists >= listed + 3, "ticks did not go on after the hold ended"
    finally:
        watch.close()


def test_the_cap_is_a_setting_refused_out_of_range(queue: _Queue) -> None:
    assert check_poll_max(10) == 10.0
    for bad in (0, -1, 0.01, 7200, True, "2s"):
        with pytest.raises(InvalidInput, match="idle poll cap"):
            check_poll_max(bad)  # type: ignore[arg-type]
    watch = queue.watch(poll_max_s=10.0, doorbell=False)
    try:
        for _ in range(12):
            watch.tick()
        assert watch.pause == 10.0
    finally:
        watch.close()


def test_a_new_job_is_news_once_and_resets_the_backoff(queue: _Queue) -> None:
    watch = queue.watch(doorbell=False)
    try:
        for _ in range(9):
            assert not watch.tick()
        assert watch.pause == 2.0
        job = queue.q.enqueue(b"x")
        assert watch.tick() is True  # the jobs/ turn: a key not listed before
        assert watch.pause == 0.25
        for _ in range(6):  # two rounds of the three listings: the same key is not news again
            assert not watch.tick()
        lease = queue.q.claim_once(duration=30)
        assert lease is not None and lease.job_id == job
    finally:
        watch.close()


def test_a_page_at_a_time_covers_every_job_across_shards(queue: _Queue) -> None:
    ids = [queue.q.enqueue(b"%d" % i) for i in range(5)]
    watch = queue.watch(doorbell=False)
    try:
        assert watch.tick() is True  # one LIST of jobs/ saw all five, in every shard
        assert len(watch._round) == 0 and {rel.rsplit("/", 1)[1] for rel in watch._seen} == set(ids)
    finally:
        watch.close()


def test_a_delayed_entry_is_news_at_its_bucket_start_and_end_then_passed(queue: _Queue) -> None:
    now = [0]
    watch = queue.watch(doorbell=False, now_ns=lambda: now[0])
    width = queue.q.layout.format.delayed_bucket_width_ns
    try:
        floor = queue.q.wall_floor_ns()
        queue.q.enqueue(b"later", not_before_ns=floor + 3 * width)
        entry = next(k for k in queue.memory.keys(PREFIX + "delayed/"))
        bucket = parse_key(entry[len(PREFIX) :]).bucket
        assert bucket is not None
        start, end = bucket * width, (bucket + 1) * width
        delayed = watch._indexes["delayed"]

        def look(at: int) -> bool:
            now[0] = at
            return watch._look_index(delayed)

        assert look(start - 1) is False  # not started: nothing may be due
        assert look(start) is True  # started: the job may be due now
        assert look(start + 1) is False  # said once per start
        assert look(end + watch._margin_ns) is True  # ended: due for certain
        assert look(end + watch._margin_ns + SECOND) is False  # the cursor has passed it
    finally:
        watch.close()


def test_a_lease_entry_is_news_after_its_expiry_bucket_plus_the_skew_guard(queue: _Queue) -> None:
    now = [0]
    watch = queue.watch(doorbell=False, now_ns=lambda: now[0])
    queue.q.enqueue(b"held")
    lease = queue.q.claim_once(duration=30)
    assert lease is not None
    entry = next(k for k in queue.memory.keys(PREFIX + "leases/"))
    parsed = parse_key(entry[len(PREFIX) :])
    assert parsed.kind is KeyKind.LEASE_INDEX and parsed.bucket is not None
    width = queue.q.layout.format.lease_bucket_width_ns
    guard = queue.q.layout.skew_guard_ns
    leases = watch._indexes["leases"]
    try:
        now[0] = parsed.bucket * width + guard - 1
        assert watch._look_index(leases) is False
        now[0] = parsed.bucket * width + guard
        assert watch._look_index(leases) is True
        now[0] = (parsed.bucket + 1) * width + guard + watch._margin_ns
        assert watch._look_index(leases) is True
        assert watch._look_index(leases) is False
    finally:
        watch.close()


def test_a_store_that_does_not_answer_is_counted_and_polled_at_the_cap(queue: _Queue) -> None:
    watch = queue.watch(doorbell=False)
    try:
        with queue.store.armed(Fault(FaultKind.BEFORE_SEND, op="list", times=None)):
            assert watch.tick() is False
        assert watch.errors == 1 and watch.pause == 2.0 and "jobs/" in (watch.last_error or "")
        queue.q.enqueue(b"x")
        assert [watch.tick() for _ in range(3)].count(True) == 1
    finally:
        watch.close()


# -- the doorbell -------------------------------------------------------------------------


def test_a_ring_wakes_a_waiting_watch_that_would_not_poll_for_an_hour(queue: _Queue, bells: Path) -> None:
    watch = queue.watch(poll_first_s=3600, poll_max_s=3600)
    try:
        assert watch.watch_missing() == [] and watch.doorbell_problem is None
        assert watch.wait(0.0) is False
        producer = BucketQueue.open(queue.store, PREFIX, certify_store=False)
        producer.enqueue(b"now")  # rings every socket in the queue's directory
        assert watch.wait(60.0) is True
        assert watch.rings == 1 and watch.lists <= 1  # at most the start's look: the ring did the rest
        assert producer.enqueue(b"delayed", delay=600) and not watch.wait(0.2)  # not claimable: no ring
    finally:
        watch.close()
    assert list(bells.glob("*/*.sock")) == []  # close() removes its socket


def test_a_cancel_of_a_held_job_rings_and_the_news_says_rung(queue: _Queue, bells: Path) -> None:
    """Issue 32 #1: a same-host ``steadq cancel`` wakes the holder's watch, which tells it to check its jobs."""
    watch = queue.watch(poll_first_s=3600, poll_max_s=3600)
    try:
        watch.watch_missing()
        job = queue.q.enqueue(b"long")
        # The enqueue's ring: news of a job, not of a cancel request. The watch's first tick may list the
        # job first (a loaded machine), so wait for the ring itself, or it would be heard with the cancel's.
        for _ in range(120):
            if watch.rings >= 1:
                break
            watch.wait(0.5)
        assert watch.rings == 1
        watch.read()
        lease = queue.q.lease()
        assert lease is not None
        assert watch.read().rung is False  # nothing rang since
        assert s3_cancel.cancel(queue.q.layout, job, queue.q.wall_floor_ns()).result is CancelResult.REQUESTED
        select.select([watch.fileno()], [], [], 60.0)
        news = watch.read()
        assert news.rung is True and watch.rings == 2
        assert s3_cancel.carry_out(queue.q.layout, lease, queue.q.wall_floor_ns())  # what a rung holder does
    finally:
        watch.close()


def test_the_watch_fd_serves_a_selector(queue: _Queue, bells: Path) -> None:
    import selectors

    watch = queue.watch(poll_first_s=3600, poll_max_s=3600)
    sel = selectors.DefaultSelector()
    try:
        watch.watch_missing()
        sel.register(watch.fileno(), selectors.EVENT_READ)
        assert sel.select(0) == []
        doorbell.ring(queue.q.queue_id)
        assert sel.select(60)  # readable once rung
        assert watch.read().appeared is True
        assert watch.read().appeared is False  # read() consumed the news
    finally:
        sel.close()
        watch.close()


def test_a_lost_ring_only_means_the_next_poll_finds_the_job(queue: _Queue, bells: Path) -> None:
    watch = queue.watch(doorbell=False)
    try:
        watch.tick()
        queue.q.enqueue(b"x")  # rings nobody: no watch is listening
        assert [watch.tick() for _ in range(3)].count(True) == 1
    finally:
        watch.close()


def test_rings_never_block_or_fail_even_when_the_socket_is_full(queue: _Queue, bells: Path) -> None:
    bell, problem = doorbell.Doorbell.bind(queue.q.queue_id)
    assert bell is not None and problem is None
    try:
        for _ in range(5000):  # far past a datagram socket's buffer
            assert doorbell.ring(queue.q.queue_id) == 1
        assert bell.drain() > 0
    finally:
        bell.close()


def test_without_a_doorbell_directory_the_watch_polls_and_enqueue_still_works(
    queue: _Queue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "no-such-dir"
    monkeypatch.setenv(doorbell.DOORBELL_DIR_ENV, str(missing))
    watch = queue.watch(poll_first_s=3600, poll_max_s=3600)
    try:
        assert watch.watch_missing() == []
        assert watch.doorbell_problem is not None and str(missing) in watch.doorbell_problem
        assert "idle polling only" in watch.doorbell_problem
        assert doorbell.ring(queue.q.queue_id) == 0
        assert queue.q.enqueue(b"x")
        assert not missing.exists()  # a listener never creates the base itself
    finally:
        watch.close()


@pytest.mark.parametrize(("base_mode", "dir_mode", "sock_mode"), [(0o2770, 0o2770, 0o660), (0o700, 0o700, 0o600)])
def test_the_doorbell_is_shared_as_its_base_is(
    queue: _Queue, bells: Path, base_mode: int, dir_mode: int, sock_mode: int
) -> None:
    bells.chmod(base_mode)
    bell, _ = doorbell.Doorbell.bind(queue.q.queue_id)
    assert bell is not None
    try:
        assert stat.S_IMODE(os.stat(bells / queue.q.queue_id).st_mode) == dir_mode
        assert stat.S_IMODE(os.stat(bell.path).st_mode) == sock_mode
    finally:
        bell.close()


def test_a_dead_listeners_socket_is_removed_by_the_next_ring(queue: _Queue, bells: Path) -> None:
    directory = bells / queue.q.queue_id
    directory.mkdir()
    stale = directory / "1.deadbeef.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(stale))
    sock.close()  # its process died: the name stays, nobody reads it
    assert doorbell.ring(queue.q.queue_id) == 0
    assert not stale.exists()


def _flood(queue_id: str, seconds: float) -> int:
    """What a member of the queue's group with no store credentials can do: ring as fast as it can.

    Paced at about a thousand datagrams a second (ten times the issue's 93/s) so the flood
    does not starve the consumer thread of the shared CPU; returns how many rings were sent."""
    sent, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        doorbell.ring(queue_id)
        sent += 1
        time.sleep(0.001)
    return sent


def test_a_flood_of_rings_costs_at_most_one_claim_pass_per_ring_interval(queue: _Queue, bells: Path) -> None:
    """Issue 30 B: rings are free to send, so what they make a worker LIST must be bounded by a setting."""
    watch = queue.watch(poll_first_s=3600, poll_max_s=3600)  # no polling: every LIST below is a ring's
    stop = threading.Event()
    passes = [0]

    def worker() -> None:  # what the daemon's worker does on news: one claim pass over every shard
        while not stop.is_set():
            if watch.wait(0.1):
                passes[0] += 1
                assert queue.q.claim_once() is None

    consumer = threading.Thread(target=worker)
    try:
        watch.watch_missing()
        before = queue.store.count("list")
        consumer.start()
        seconds = 3.0
        sent = _flood(queue.q.queue_id, seconds)
        stop.set()
        consumer.join()
        lists = queue.store.count("list") - before
    finally:
        stop.set()
        watch.close()
    shards = queue.q.layout.format.shard_count
    # The first ring is heard at once, then at most one per interval (the trailing one included).
    bound_passes = int(seconds / DEFAULT_RING_INTERVAL_S) + 2
    assert sent > 1000 and watch.rings > 0
    assert passes[0] <= bound_passes, (passes[0], sent)
    assert lists <= bound_passes * shards + watch.lists, (lists, sent)


def test_a_ring_wakes_an_idle_watch_at_once_and_rings_within_the_interval_are_one(queue: _Queue, bells: Path) -> None:
    watch = queue.watch(poll_first_s=3600, poll_max_s=3600, ring_interval_s=3600)
    try:
        watch.watch_missing()
        assert watch.wait(0.0) is False
        doorbell.ring(queue.q.queue_id)
        assert watch.wait(60.0) is True  # the first ring is not held back by the hour's interval
        for _ in range(50):
            doorbell.ring(queue.q.queue_id)
        assert watch.wait(0.5) is False  # coalesced: heard again only an hour after the first
        assert watch.rings == 1
    finally:
        watch.close()


@pytest.mark.parametrize("bad", [0, 0.01, -1, 7200, True, "1s"])
def test_the_ring_interval_is_a_setting_refused_out_of_range(queue: _Queue, bad: object) -> None:
    with pytest.raises(InvalidInput, match="ring interval"):
        queue.watch(ring_interval_s=bad)


# -- the doorbell against a member of the queue's group (issue 30 C) ---------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")


@pytest.fixture
def root_only() -> Iterator[Path]:
    """A 0700 root directory outside the doorbell base: what a member must never reach through a ring."""
    d = Path(tempfile.mkdtemp(prefix="secret-", dir="/tmp"))
    d.chmod(0o700)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _shared_with_members(bells: Path) -> None:
    os.chown(bells, 0, QUEUE_GID)
    bells.chmod(0o2770)


@needs_root
def test_a_ring_does_not_follow_a_members_symlink_to_a_root_only_socket(
    queue: _Queue, bells: Path, root_only: Path
) -> None:
    _shared_with_members(bells)
    hidden = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
    hidden.bind(str(root_only / "x.sock"))
    directory = bells / queue.q.queue_id

    def plant() -> None:
        directory.mkdir()
        os.symlink(root_only / "x.sock", directory / "evil.sock")

    try:
        assert as_user(PRODUCER, plant) == "ok"
        assert doorbell.ring(queue.q.queue_id) == 0  # as root, as `steadq put` would
        with pytest.raises(BlockingIOError):
            hidden.recv(16)  # nothing reached the socket in the 0700 directory
        assert (directory / "evil.sock").is_symlink()  # and the member's link is not the ringer's to remove
    finally:
        hidden.close()


@needs_root
def test_a_ring_skips_a_socket_of_an_unexpected_owner(queue: _Queue, bells: Path) -> None:
    _shared_with_members(bells)
    bell, problem = doorbell.Doorbell.bind(queue.q.queue_id)  # root's own: rung
    assert bell is not None, problem
    received: list[bytes] = []
    read_end, write_end = os.pipe()

    def member_socket() -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(str(bells / queue.q.queue_id / "1.member.sock"))
        os.write(write_end, b"bound")
        s.settimeout(1.0)
        with pytest.raises(TimeoutError):
            received.append(s.recv(16))

    child = threading.Thread(target=as_user, args=(PRODUCER, member_socket))
    try:
        child.start()
        assert os.read(read_end, 5) == b"bound"
        assert doorbell.ring(queue.q.queue_id) == 1  # root's socket, not the member's
        child.join()
        assert bell.drain() == 1
    finally:
        child.join()
        bell.close()
        os.close(read_end)
        os.close(write_end)


@needs_root
def test_binding_changes_no_mode_by_path_that_a_member_can_swap(
    queue: _Queue, bells: Path, root_only: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The member wins the race between bind and the mode change: the socket's name is a link by then."""
    _shared_with_members(bells)
    victim = root_only / "key"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    os.chmod(root_only, 0o711)  # the member may not list it, but a link may name a file in it
    real_bind = socket.socket.bind

    def bind_then_swap(self: socket.socket, address: str) -> None:
        real_bind(self, address)
        entry = os.path.realpath(address)

        def swap() -> None:
            os.rename(entry, entry + ".moved")
            os.symlink(victim, entry)

        assert as_user(PRODUCER, swap) == "ok"

    monkeypatch.setattr(socket.socket, "bind", bind_then_swap)
    bell, problem = doorbell.Doorbell.bind(queue.q.queue_id)
    monkeypatch.undo()
    if bell is not None:
        bell.close()
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600 and victim.read_text() == "secret\n"
    assert bell is None and problem is not None and "replaced" in problem, problem
