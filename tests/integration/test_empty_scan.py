"""The claim scan's probe of drained shards (issue 20: the CPU cost of an empty lease).

A shard this handle's last scan read to its end, with no names left over, is
only rewound and read once before the scan moves on (linux.first_listing);
every other shard, and every shard while a trace runs or a fault is armed,
takes the full way. What must not change: a job committed before lease() is
called is found wherever it is, strays are still noticed, and the hook sees
the same calls at the same positions as before.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from steadqd import NotCommitted, Queue
from steadqd.fs import claim, linux

SHARDS = 64


@pytest.fixture
def qpath(make_queue: Callable[..., Queue], queue_path: str) -> str:
    make_queue(shards=SHARDS).close()
    return queue_path


def _drained(q: Queue) -> None:
    """Two empty scans: after them every shard is known to end where the handle stopped."""
    assert q.lease() is None
    assert q.lease() is None


def _full_way(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The shards scanned the full way from now on."""
    shards: list[int] = []
    real = claim._Scan.scan_shard

    def counting(self: claim._Scan, shard: int) -> object:
        shards.append(shard)
        return real(self, shard)

    monkeypatch.setattr(claim._Scan, "scan_shard", counting)
    return shards


def test_an_idle_queue_is_probed_not_scanned(qpath: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with Queue.open(qpath) as q:
        _drained(q)
        shards = _full_way(monkeypatch)
        for _ in range(3):
            assert q.lease() is None
        assert shards == []


def test_a_job_committed_before_the_call_is_found_in_any_drained_shard(qpath: str) -> None:
    with Queue.open(qpath) as consumer, Queue.open(qpath) as producer:
        _drained(consumer)
        for i in range(40):  # one at a time: each lands in some drained shard, behind the cursor
            job = producer.enqueue(f"job {i}".encode())
            lease = consumer.lease()
            assert lease is not None and lease.job_id == job
            consumer.ack(lease)
            assert consumer.lease() is None
        ids = {producer.enqueue(f"many {i}".encode()) for i in range(300)}  # every shard, most of them
        got = set()
        while (lease := consumer.lease()) is not None:
            got.add(lease.job_id)
            consumer.ack(lease)
        assert got == ids


def test_only_the_shard_that_lists_something_takes_the_full_way(qpath: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with Queue.open(qpath) as consumer, Queue.open(qpath) as producer:
        _drained(consumer)
        _, rel = producer.enqueue_detailed(b"one")
        shard = int(rel.split("/")[1], 16)
        shards = _full_way(monkeypatch)
        lease = consumer.lease()
        assert lease is not None
        assert shards == [shard]


def test_a_stray_in_a_drained_shard_is_still_noticed(qpath: str) -> None:
    with Queue.open(qpath) as q:
        _drained(q)
        # The shortest record there is, besides "." and "..": a chunk of the same length is not enough.
        Path(qpath, "ready", "0007", "x").write_bytes(b"")
        Path(qpath, "ready", "0009", os.fsdecode(b"\xff")).write_bytes(b"")
        assert q.lease() is None
        assert q.last_scan is not None
        assert [s.endswith("b'\\xff'") for s in q.last_scan.ignored] == [True]


def test_a_traced_scan_makes_every_call_through_the_wrappers(qpath: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with Queue.open(qpath) as q:
        _drained(q)
        shards = _full_way(monkeypatch)
        with linux.trace() as events:
            assert q.lease() is None
        ops = Counter(e.op for e in events)
        assert (ops["lseek"], ops["getdents"]) == (SHARDS, SHARDS)
        assert sorted(shards) == list(range(SHARDS))


@pytest.mark.parametrize("nth", [1, 2, SHARDS, 2 * SHARDS])  # a rewind or a read, first or last shard
def test_a_fault_in_a_drained_shard_is_reported(qpath: str, nth: int) -> None:
    with Queue.open(qpath) as q:
        _drained(q)
        with linux.inject(nth=nth, errno=errno.EIO) as fault, pytest.raises(NotCommitted, match="scan completed"):
            q.lease()
        assert fault.fired
        assert q.lease() is None  # and nothing was left behind: the next scan is clean


def test_first_listing_stops_at_the_first_directory_that_is_not_empty(tmp_path: Path) -> None:
    names = ["empty1", "full", "empty2"]
    for name in names:
        (tmp_path / name).mkdir()
    (tmp_path / "full" / "a").write_bytes(b"")
    fds = [os.open(tmp_path / name, os.O_RDONLY | os.O_DIRECTORY) for name in names]
    try:
        assert linux.first_listing(fds, 0, 4096) == 1
        assert linux.first_listing(fds, 2, 4096) == 3
        assert linux.first_listing([fds[0], None, fds[2]], 0, 4096) == 1
        os.lseek(fds[0], 0, os.SEEK_END)  # wherever the offset was, the probe starts from the first entry
        (tmp_path / "empty1" / "b").write_bytes(b"")
        assert linux.first_listing(fds, 0, 4096) == 0
    finally:
        for fd in fds:
            os.close(fd)
