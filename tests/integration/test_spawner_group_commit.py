"""The worker spawner's group commit (docs/performance.md, fix 4).

Jobs whose commands finish in the same loop pass are settled inside one
``q.batch()``: each verdict still renames at once, but the directory fsyncs
are issued together, one per directory. Driven in-process on a real queue
with finished ``true`` children, so which jobs finish "together" is exact.
"""

from __future__ import annotations

import errno
import io
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.daemon.config import parse_config
from steadqd.daemon.journal import Log
from steadqd.daemon.service import Loop
from steadqd.daemon.worker import WorkerRole, _Job
from steadqd.fs import linux


@pytest.fixture
def worker(make_queue: Callable[..., Queue], queue_path: str) -> Iterator[tuple[WorkerRole, Loop, str, io.StringIO]]:
    with make_queue(shards=1) as q:
        for i in range(6):
            q.enqueue(f"job {i}".encode())
    settings = parse_config(
        f"queue: {queue_path}\nworker:\n  command: ['true']\n  concurrency: 8\n", path="t.yaml", name="t"
    )
    out = io.StringIO()
    loop = Loop()
    role = WorkerRole(settings, Log("worker", "t", journal=False, stream=out))
    role.start(loop)
    role.drain()  # no leasing of its own: the test hands it finished jobs
    try:
        yield role, loop, queue_path, out
    finally:
        role.close()
        loop.close()


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


def test_jobs_finishing_in_one_pass_share_their_directory_fsyncs(worker, tmp_path: Path) -> None:
    role, loop, qpath, _ = worker
    first = _finished_job(role, loop, tmp_path)
    role._finish(first)
    loop.run_once(0)  # the first ack also creates the receipts bucket
    assert role.tally.done == 1
    jobs = [_finished_job(role, loop, tmp_path) for _ in range(3)]
    with linux.trace() as events:
        for job in jobs:
            role._finish(job)
        assert role.tally.done == 1  # nothing settled before the end of the pass
        loop.run_once(0)
    fsyncs = sum(1 for e in events if e.op == "fsync")
    assert role.tally.done == 4 and not role.jobs
    assert _receipts(qpath) == 4
    # One fsync of the receipts shard and one of the ready shard for all three
    # acks (strict settling: two per ack, six); a watermark advance may add two.
    assert fsyncs <= 4, [e for e in events if e.op == "fsync"]


def test_a_failed_group_barrier_makes_every_outcome_unknown_and_reopens(worker, tmp_path: Path) -> None:
    role, loop, qpath, out = worker
    jobs = [_finished_job(role, loop, tmp_path) for _ in range(2)]
    old = role.q
    for job in jobs:
        role._finish(job)
    with linux.inject(op="fsync", nth=1, errno=errno.EIO) as fault:
        loop.run_once(0)
    assert fault.fired
    assert "settling outcome unknown for 2 jobs" in out.getvalue()
    assert role.q is not None and role.q is not old and role.q.poisoned is None
    assert not role.jobs


def test_close_settles_jobs_still_waiting_for_their_group(worker, tmp_path: Path) -> None:
    role, loop, qpath, _ = worker
    jobs = [_finished_job(role, loop, tmp_path) for _ in range(2)]
    for job in jobs:
        role._finish(job)
    role.close()  # before the loop pass that would have settled them
    assert _receipts(qpath) == 2
    with Queue.open(qpath) as q:
        assert q.stats()["ready"].objects == 4
