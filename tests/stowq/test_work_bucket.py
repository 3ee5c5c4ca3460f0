"""``steadqd.work("s3://...", handler)``: the Python worker API serving a bucket queue on the live SeaweedFS.

An idle consumer thread waits on the bucket's ready watch (``steadqd.s3.watch``:
one LIST per tick with backoff, and the doorbell) and makes a claim pass only
when it has news or once a minute, not one per ``poll``. The test proves jobs
are run, acked and buried through it.
"""

from __future__ import annotations

import threading

import pytest

from steadqd.backend import init_queue, open_queue
from steadqd.errors import InvalidInput
from steadqd.tasks import Bury, Job, Task, Worker
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
