"""Blocking lease: an inotify wake-up across processes, and the bounded timeout.

The waiting consumer must notice a job published by *another process*
promptly, through the inotify watch on the ready shards, not by sleeping out
its wait or the 5 s rescan safety net. Bounds are deliberately generous (the
machine may be loaded); what they separate is "woken by the event" (about
0.5 s plus interpreter start-up) from "woken by a timeout" (5 s).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from steadqd import Queue

_PRODUCER = textwrap.dedent(
    """
    import sys, time
    from steadqd import Queue
    time.sleep(float(sys.argv[2]))
    with Queue.open(sys.argv[1]) as q:
        print(q.enqueue(b"from another process"), flush=True)
    """
)


@pytest.fixture
def qpath(queue_path: str) -> str:
    """The root queue_path (tests/conftest.py), under this module's short name."""
    return queue_path


@pytest.fixture
def q(make_queue: Callable[..., Queue]) -> Queue:
    # Several shards: the producer's job lands in a shard the consumer has not just scanned.
    return make_queue(shards=8)


def test_wait_wakes_on_enqueue_by_another_process(q: Queue, qpath: str) -> None:
    producer = subprocess.Popen(
        [sys.executable, "-c", _PRODUCER, qpath, "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=str(Path(__file__).resolve().parents[2]),  # import steadqd from this checkout
    )
    try:
        t0 = time.monotonic()
        lease = q.lease(wait=5.0)
        elapsed = time.monotonic() - t0
        out, err = producer.communicate(timeout=30)
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait()
    assert producer.returncode == 0, err.decode()
    assert lease is not None, "wait ran out although another process enqueued a job"
    assert lease.job_id == out.decode().strip()
    assert lease.payload() == b"from another process"
    # Woken by inotify, not by the 5 s wait/rescan timeout.
    assert elapsed < 4.0, elapsed


def test_wait_times_out_on_empty_queue(q: Queue) -> None:
    t0 = time.monotonic()
    lease = q.lease(wait=0.3)
    elapsed = time.monotonic() - t0
    assert lease is None
    assert elapsed >= 0.3
    assert q.last_scan is not None and q.last_scan.errors == []


def test_zero_wait_is_one_scan(q: Queue) -> None:
    """wait=0 never sleeps: an empty queue answers None at once (no watch needed)."""
    assert q.lease(wait=0.0) is None
    q.enqueue(b"x")
    lease = q.lease(wait=0.0)
    assert lease is not None
