"""The worker spawner's group commit on a forced stop (docs/performance.md, fix 4).

The group commit itself (runs handed to the settling thread together share
their directory fsyncs; a failed group barrier makes every outcome unknown)
is tested against the thread in tests/daemon/test_settler.py. What stays here
is the stop: runs that finished but were never settled are settled by
``close()``. Driven in-process on a real queue with finished ``true``
children.
"""

from __future__ import annotations

import io
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.daemon.service import Loop
from steadqd.daemon.worker.role import WorkerRole, _Job
from tests.daemon.conftest import worker_in_process


@pytest.fixture
def worker(make_queue: Callable[..., Queue], queue_path: str) -> Iterator[tuple[WorkerRole, Loop, str, io.StringIO]]:
    """No leasing of its own: the test hands it finished jobs."""
    with worker_in_process(make_queue(shards=1), queue_path, jobs=6, concurrency=8) as (role, loop, out):
        yield role, loop, queue_path, out


def _finished_job(role: WorkerRole, loop: Loop, tmp: Path) -> _Job:
    """A leased job whose command (`true`) has already exited 0, as the loop would see it."""
    assert role.q is not None and role.settings.worker is not None
    lease = role.q.lease()
    assert lease is not None
    proc = subprocess.Popen(["true"])
    proc.wait()
    job = _Job(role, lease, role.settings.worker, proc, tempfile.mkdtemp(dir=tmp))
    job.child.returncode = 0
    role.jobs[proc.pid] = job
    return job


def _receipts(qpath: str) -> int:
    return sum(1 for p in Path(qpath, "receipts").rglob("*.rct"))


def test_close_settles_jobs_still_waiting_for_their_group(worker, tmp_path: Path) -> None:
    role, loop, qpath, _ = worker
    jobs = [_finished_job(role, loop, tmp_path) for _ in range(2)]
    for job in jobs:
        role._finish(job)
    role.close()  # before the loop pass that would have settled them
    assert _receipts(qpath) == 2
    with Queue.open(qpath) as q:
        assert q.stats()["ready"].objects == 4
