"""Readers of control/wall-watermark while it is being replaced (issue 20's 4+4 bench round that exited 6).

Why a real ext4 and real processes: ext4's rename(2) drops the link count of
the inode it replaces, then updates that inode and the orphan list in the
journal (which waits whenever a concurrent commit is writing the same
blocks), and only after that moves the name to the new inode. For that whole
stretch, milliseconds under fsync load, every open of the name returns the old
inode with ``st_nlink == 0``. The reader used to try 8 times back to back
(some 100 µs) and then report MaintenanceBusy to producers and consumers alike.

The deterministic tests stand in for the kernel with a patched
``linux.open_regular`` that reports the unlinked inode for a while; the
loop-device test provokes the real thing with a delayed width small enough
that the watermark is replaced many times a second.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import pytest

from steadqd import Queue
from steadqd.constants import NS_PER_SECOND, WATERMARK_FILE
from steadqd.errors import MaintenanceBusy, QueueCorrupt
from steadqd.fs import linux, watermark
from steadqd.fs.records import Watermark
from tests.loopfs import loop_filesystem

# Small enough that every worker crosses a bucket several times a second (the
# terminal width, 60 s, must stay a multiple of it).
FAST_WIDTH_NS = 20_000_000
RUN_SECONDS = 4.0
ROLES = ("producer", "producer", "consumer", "consumer", "floor", "floor")


def _control(root: str) -> int:
    return os.open(os.path.join(root, "control"), os.O_RDONLY | os.O_DIRECTORY)


def _unlinked(st: os.stat_result) -> os.stat_result:
    """``st`` as fstat reports it once rename(2) has dropped the inode's last link."""
    fields = list(st[:10])
    fields[3] = 0
    return os.stat_result(fields)


@pytest.fixture
def control_fd(tmp_path: Any) -> Iterator[int]:
    Queue.init(str(tmp_path / "q")).close()
    fd = _control(str(tmp_path / "q"))
    try:
        yield fd
    finally:
        os.close(fd)


def _name_resolves_to_unlinked(monkeypatch: pytest.MonkeyPatch, seconds: float | None) -> list[int]:
    """Make opens of the watermark see an unlinked inode for ``seconds`` (None: for ever); returns the open count."""
    real = linux.open_regular
    opens: list[int] = [0]
    until = None if seconds is None else time.monotonic() + seconds

    def open_regular(dirfd: int, name: str, flags: int, mode: int = 0o600, *, label: str | None = None) -> Any:
        fd, st = real(dirfd, name, flags, mode, label=label)
        if name == WATERMARK_FILE:
            opens[0] += 1
            if until is None or time.monotonic() < until:
                return fd, _unlinked(st)
        return fd, st

    monkeypatch.setattr(linux, "open_regular", open_regular)
    return opens


def test_reader_waits_out_a_replacement_that_takes_milliseconds(
    control_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = watermark.read_watermark(control_fd)
    opens = _name_resolves_to_unlinked(monkeypatch, 0.05)
    assert watermark.read_watermark(control_fd) == before
    assert opens[0] > 1  # it did meet the unlinked inode and retried


def test_wall_floor_is_not_refused_during_a_slow_replacement(control_fd: int, monkeypatch: pytest.MonkeyPatch) -> None:
    floor = watermark.WallFloor(control_fd, FAST_WIDTH_NS)
    first = floor.for_mutation()
    _name_resolves_to_unlinked(monkeypatch, 0.05)
    time.sleep(FAST_WIDTH_NS / NS_PER_SECOND)  # the next mutation must advance, reading first
    assert floor.for_mutation() > first


def test_the_floor_advances_the_watermark_exactly_at_the_next_buckets_start(
    control_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """for_mutation advances the watermark to floor // width when that is past the stored bucket, and only
    then: it tests floor >= the next bucket's start instead of dividing, so one below it keeps the bucket,
    the start itself and anything later advance, to the bucket the floor is in."""
    floor = watermark.WallFloor(control_fd, FAST_WIDTH_NS)
    floor.for_mutation()  # the stored bucket read (and advanced to the clock's)
    bucket = floor._bucket
    assert bucket is not None
    advanced: list[int] = []
    monkeypatch.setattr(watermark.WallFloor, "_advance", lambda self, wanted: advanced.append(wanted))
    clock = [(bucket + 1) * FAST_WIDTH_NS - 1]
    monkeypatch.setattr(linux, "realtime_ns", lambda: clock[0])
    assert floor.for_mutation() == clock[0] and advanced == []
    clock[0] += 1
    assert floor.for_mutation() == clock[0] and advanced == [bucket + 1]
    clock[0] = (bucket + 3) * FAST_WIDTH_NS + 5
    assert floor.for_mutation() == clock[0] and advanced == [bucket + 1, bucket + 3]


def test_a_replacement_that_never_ends_is_still_maintenance_busy(
    control_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watermark, "_READ_BUDGET_NS", 50_000_000)
    _name_resolves_to_unlinked(monkeypatch, None)
    with pytest.raises(MaintenanceBusy, match="wall watermark kept changing"):
        watermark.read_watermark(control_fd)


def test_extra_links_are_still_corruption_not_busy(control_fd: int) -> None:
    os.link(WATERMARK_FILE, "wm-extra-link", src_dir_fd=control_fd, dst_dir_fd=control_fd)
    with pytest.raises(QueueCorrupt, match="extra hard links"):
        watermark.read_watermark(control_fd)


# --------------------------------------------------------------------------- the real race, on ext4


def _work(role: str, root: str, conn: Connection) -> None:
    """One process: its role until the common deadline, then what it did and every error it met."""
    enqueued: list[str] = []
    acked: list[str] = []
    floors: list[int] = []
    errors: list[str] = []
    try:
        with Queue.open(root) as q:
            conn.send("ready")
            deadline: float = conn.recv()
            while time.monotonic() < deadline:
                try:
                    if role == "producer":
                        enqueued.append(q.enqueue(b"x" * 1024))
                    elif role == "consumer":
                        lease = q.lease(wait=0.0, duration=60.0)
                        if lease is None:
                            time.sleep(0.001)
                            continue
                        q.ack(lease)
                        acked.append(lease.job_id)
                    else:
                        floors.append(q.wall_floor_ns())
                        time.sleep(0.0005)
                except Exception as e:  # noqa: BLE001 - every error is the test's finding
                    errors.append(f"{role} {os.getpid()}: {type(e).__name__}: {e}")
                    if len(errors) > 20:
                        break
    except Exception as e:  # noqa: BLE001
        errors.append(f"{role} {os.getpid()}: {type(e).__name__}: {e}")
    conn.send({"role": role, "enqueued": enqueued, "acked": acked, "floors": floors, "errors": errors})


def _run_workers(root: str) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("fork")  # the parent holds no handle when it forks
    workers = []
    for role in ROLES:
        mine, theirs = ctx.Pipe()
        p = ctx.Process(target=_work, args=(role, root, theirs), daemon=True)
        p.start()
        theirs.close()
        workers.append((p, mine))
    try:
        for _, conn in workers:
            assert conn.poll(60), "a worker never opened the queue"
            assert conn.recv() == "ready"
        deadline = time.monotonic() + RUN_SECONDS
        for _, conn in workers:
            conn.send(deadline)
        results = []
        for _, conn in workers:
            assert conn.poll(RUN_SECONDS + 90), "a worker hung"
            results.append(conn.recv())
        return results
    finally:
        for p, conn in workers:
            conn.close()
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()


def _watermark(root: str) -> Watermark:
    fd = _control(root)
    try:
        return watermark.read_watermark(fd)
    finally:
        os.close(fd)


@pytest.mark.loopfs
@pytest.mark.slow
def test_producers_and_consumers_never_see_the_watermark_replacement_on_ext4() -> None:
    with loop_filesystem("ext4", 256) as mnt:
        root = os.path.join(mnt, "q")
        Queue.init(root, delayed_width_ns=FAST_WIDTH_NS).close()
        start = _watermark(root)
        results = _run_workers(root)
        errors = [e for r in results for e in r["errors"]]
        assert errors == []
        advanced = _watermark(root)
        assert advanced.sequence > start.sequence + 10  # the record really was replaced, many times
        for r in results:
            assert r["floors"] == sorted(r["floors"]), f"{r['role']}'s wall floor went backwards"
        enqueued = [j for r in results for j in r["enqueued"]]
        acked = [j for r in results for j in r["acked"]]
        assert len(set(enqueued)) == len(enqueued)
        assert len(set(acked)) == len(acked), "a job was acknowledged twice"
        assert set(acked) <= set(enqueued)
        with Queue.open(root) as q:
            while (lease := q.lease(wait=0.0, duration=60.0)) is not None:
                q.ack(lease)
                acked.append(lease.job_id)
        assert sorted(acked) == sorted(enqueued), "a job was lost or handed out twice"
