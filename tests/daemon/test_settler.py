"""Settling off the loop thread (issue 20, point 3): the worker hands finished runs to its settling thread.

Driven in-process on a real queue with finished ``true`` children, as the
loop would see them. The thread is held at a gate where a test needs runs
to pile up (a group) or to be caught in the middle (drain, forced stop):
which runs settle together is then exact, not a race.
"""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from steadqd import Queue
from steadqd.daemon.service import Loop
from steadqd.daemon.worker import claim, settle
from steadqd.daemon.worker import role as worker
from steadqd.daemon.worker.role import WorkerRole, _Job
from steadqd.fs import linux
from tests.daemon.conftest import DEADLINE, worker_in_process

Worker = tuple[WorkerRole, Loop, str, io.StringIO]


@pytest.fixture
def worker_role(make_queue: Callable[..., Queue], queue_path: str) -> Iterator[Worker]:
    """No leasing of its own: the test hands it finished jobs."""
    with worker_in_process(make_queue(shards=1), queue_path, jobs=6, concurrency=8) as (role, loop, out):
        yield role, loop, queue_path, out


class Gate:
    """Holds the settling thread before it takes its next group, until :meth:`open`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.held = threading.Event()  # the thread is waiting at the gate
        self._open = threading.Event()
        real = settle.Settler._take

        def take(s: settle.Settler, first: Any) -> Any:
            self.held.set()
            self._open.wait(DEADLINE)
            return real(s, first)

        monkeypatch.setattr(settle.Settler, "_take", take)

    def open(self) -> None:
        self._open.set()


def _finished_job(role: WorkerRole, tmp: Path) -> _Job:
    """A leased job whose command (`true`) has already exited 0."""
    assert role.q is not None and role.settings.worker is not None
    lease = role.q.lease()
    assert lease is not None
    proc = subprocess.Popen(["true"])
    proc.wait()
    job = _Job(role, lease, role.settings.worker, proc, tempfile.mkdtemp(dir=tmp))
    job.child.returncode = 0
    role.jobs[proc.pid] = job
    return job


def _finish(role: WorkerRole, loop: Loop, *jobs: _Job) -> None:
    """The runs end in one loop pass, whose end hands them to the settling thread together (Settler)."""
    for job in jobs:
        role._finish(job)
    loop.run_once(0)


def _pump(loop: Loop, until: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not until():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        loop.run_once(0.05)


def _receipts(qpath: str) -> int:
    return sum(1 for p in Path(qpath, "receipts").rglob("*.rct"))


def _settle_one(role: WorkerRole, loop: Loop, tmp: Path) -> None:
    """One job settled alone, start to end (the first ack also creates the receipts bucket)."""
    done = role.tally.done
    _finish(role, loop, _finished_job(role, tmp))
    _pump(loop, lambda: role.tally.done == done + 1, "a lone ack")


def test_runs_handed_over_together_share_their_directory_fsyncs(worker_role: Worker, tmp_path: Path, monkeypatch):
    role, loop, qpath, out = worker_role
    _settle_one(role, loop, tmp_path)
    gate = Gate(monkeypatch)
    jobs = [_finished_job(role, tmp_path) for _ in range(3)]
    _finish(role, loop, jobs[0])
    assert gate.held.wait(DEADLINE)
    _finish(role, loop, *jobs[1:])
    assert role.tally.done == 1 and len(role.jobs) == 3  # nothing is reported before the thread answers
    with linux.trace() as events:
        gate.open()
        _pump(loop, lambda: not role.jobs, "the group")
    fsyncs = [e for e in events if e.op == "fsync"]
    assert role.tally.done == 4 and _receipts(qpath) == 4
    # One fsync of the receipts shard and one of the ready shard for all three
    # acks (strict settling: two per ack, six); a watermark advance may add two.
    assert len(fsyncs) <= 4, fsyncs
    finished = [line for line in out.getvalue().splitlines() if " finished: ack " in line]
    assert [line.split()[2] for line in finished[1:]] == [j.lease.job_id[:8] for j in jobs]  # in hand-over order


def _record_renewals(role: WorkerRole, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The leases the loop's handle renews from now on (renewed for real)."""
    renewed: list[object] = []
    assert role.q is not None
    real = role.q.renew

    def renew(lease: Any, duration: float = 30.0) -> Any:
        renewed.append(lease)
        return real(lease, duration)

    monkeypatch.setattr(role.q, "renew", renew)
    return renewed


def test_a_handed_over_lease_is_not_renewed_until_the_settle_comes_back(worker_role: Worker, tmp_path, monkeypatch):
    role, loop, _, _ = worker_role
    gate = Gate(monkeypatch)
    job = _finished_job(role, tmp_path)
    job.timers.set("renew", 0.0, lambda: role._renew(job))
    renewed = _record_renewals(role, monkeypatch)
    _finish(role, loop, job)
    assert gate.held.wait(DEADLINE)
    assert job.settling and not job.timers  # its renew timer went with the hand-over
    role._renew(job)  # a renewal already on its way when the run ended
    assert renewed == []
    gate.open()
    _pump(loop, lambda: not role.jobs, "the ack")
    assert role.tally.done == 1 and renewed == []


def test_not_committed_comes_back_to_the_loop_which_renews_and_retries(worker_role: Worker, tmp_path, monkeypatch):
    role, loop, qpath, out = worker_role
    job = _finished_job(role, tmp_path)
    renewals = _record_renewals(role, monkeypatch)
    with linux.inject(op="rename_noreplace", nth=1, errno=errno.ENOSPC) as fault:
        _finish(role, loop, job)
        _pump(loop, lambda: "settling not committed" in out.getvalue(), "the NotCommitted report")
    assert fault.fired
    assert "settling not committed, retrying in 1s (try 1)" in out.getvalue()
    assert job.pid in role.jobs and not job.settling
    _pump(loop, lambda: not role.jobs, "the retried ack")  # one second later
    assert renewals, "the renewals resumed while the settle waited"
    assert role.tally.done == 1 and _receipts(qpath) == 1
    assert f"job {job.lease.job_id[:8]} finished: ack" in out.getvalue()


def test_an_outcome_unknown_poisons_only_the_settlers_handle(worker_role: Worker, tmp_path: Path):
    role, loop, qpath, out = worker_role
    _settle_one(role, loop, tmp_path)
    loop_handle = role.q
    job = _finished_job(role, tmp_path)
    with linux.inject(op="fsync", nth=1, errno=errno.EIO) as fault:  # the ack's barrier, after its rename
        _finish(role, loop, job)
        _pump(loop, lambda: not role.jobs, "the unknown outcome")
    assert fault.fired
    text = out.getvalue()
    assert "but its ack may or may not have taken effect (recovery decides)" in text
    assert "queue handle poisoned (settle: " in text and "reopening the queue" in text
    assert role.q is loop_handle and loop_handle is not None and loop_handle.poisoned is None  # never in it
    assert role.tally.done == 1  # not counted: its ack raised (whether it took effect is recovery's)
    _settle_one(role, loop, tmp_path)  # the thread opened a handle of its own again
    assert _receipts(qpath) == 3


def test_a_failed_group_barrier_makes_every_outcome_unknown(worker_role: Worker, tmp_path: Path, monkeypatch):
    role, loop, _, out = worker_role
    _settle_one(role, loop, tmp_path)
    gate = Gate(monkeypatch)
    jobs = [_finished_job(role, tmp_path) for _ in range(2)]
    _finish(role, loop, *jobs)
    assert gate.held.wait(DEADLINE)
    with linux.inject(op="fsync", nth=1, errno=errno.EIO) as fault:
        gate.open()
        _pump(loop, lambda: not role.jobs, "the group")
    assert fault.fired
    text = out.getvalue()
    assert "settling outcome unknown for 2 jobs settled together (recovery decides)" in text
    for job in jobs:
        assert f"job {job.lease.job_id[:8]} finished (exit 0, " in text
    assert role.q is not None and role.q.poisoned is None


def test_a_settler_error_is_reported_and_the_thread_goes_on(worker_role: Worker, tmp_path: Path, monkeypatch):
    role, loop, qpath, out = worker_role
    real = settle.apply_verdict
    calls = []

    class Boom(BaseException):
        pass

    def failing_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise Boom("settler bug")
        return real(*args, **kwargs)

    monkeypatch.setattr(settle, "apply_verdict", failing_once)
    job = _finished_job(role, tmp_path)
    _finish(role, loop, job)
    _pump(loop, lambda: not role.jobs, "the failed settle")
    assert "internal error settling a job: Boom('settler bug')" in out.getvalue()
    _settle_one(role, loop, tmp_path)
    assert _receipts(qpath) == 1


def test_a_drain_waits_for_the_runs_in_the_settler(worker_role: Worker, tmp_path: Path, monkeypatch):
    role, loop, qpath, _ = worker_role
    gate = Gate(monkeypatch)
    _finish(role, loop, *(_finished_job(role, tmp_path) for _ in range(2)))
    assert gate.held.wait(DEADLINE)
    assert not role.drained()
    gate.open()
    _pump(loop, role.drained, "the drain")
    assert _receipts(qpath) == 2 and role.tally.done == 2


def test_a_forced_stop_settles_what_the_settler_holds_or_never_took(worker_role: Worker, tmp_path, monkeypatch):
    role, loop, qpath, out = worker_role
    gate = Gate(monkeypatch)
    jobs = [_finished_job(role, tmp_path) for _ in range(2)]
    _finish(role, loop, *jobs)
    assert gate.held.wait(DEADLINE)
    threading.Timer(0.2, gate.open).start()  # the held group goes on while close() waits
    role.close()
    assert _receipts(qpath) == 2
    text = out.getvalue()
    for job in jobs:
        assert f"job {job.lease.job_id[:8]} finished: ack" in text
    with Queue.open(qpath) as q:
        assert q.stats()["ready"].objects == 4


def test_a_forced_stop_gives_up_on_a_stuck_settler_and_says_so(worker_role: Worker, tmp_path, monkeypatch):
    role, loop, qpath, out = worker_role
    monkeypatch.setattr(worker, "PREPARE_GRACE", 0.2)
    gate = Gate(monkeypatch)
    job = _finished_job(role, tmp_path)
    _finish(role, loop, job)
    assert gate.held.wait(DEADLINE)
    try:
        role.close()
    finally:
        gate.open()
    assert (
        f"settling still running after 0.2s: recovery decides its outcome STEADQ_ATTEMPT=1 STEADQ_JOB_ID={job.lease.job_id}"
        in out.getvalue()
    )
    assert not role.jobs


def test_a_run_in_the_settler_frees_its_slot_for_the_next_job(
    make_queue: Callable[..., Queue], queue_path: str, monkeypatch
):
    """Concurrency counts commands: a run whose settle waits on the thread's fsyncs no longer holds a
    slot, so the next claim and run overlap them (issue 20, point 3: the spawner's chain per slot)."""
    gate = Gate(monkeypatch)
    with worker_in_process(make_queue(shards=1), queue_path, jobs=3, concurrency=1, lease=True) as (role, loop, out):
        _pump(loop, lambda: any(j.settling for j in role.jobs.values()), "the first run to be handed over")
        assert gate.held.wait(DEADLINE)
        _pump(loop, lambda: any(not j.settling for j in role.jobs.values()), "the second job, started meanwhile")
        assert sum(1 for j in role.jobs.values() if not j.settling) == 1  # never more than one command
        gate.open()
        _pump(loop, lambda: _receipts(queue_path) == 3 and not role.jobs, "all three acks")
        text = out.getvalue()
        assert text.count(" finished: ack") == 3 and text.count(" started (attempt 1/") == 3
        assert role.tally.done == 3


def test_a_run_that_comes_back_unsettled_takes_its_slot_again(worker_role: Worker, tmp_path, monkeypatch):
    """NotCommitted: the finished run waits to retry with its slot, so an unsettleable disk does not let
    finished runs pile up while new jobs are claimed."""
    role, loop, _, out = worker_role
    job = _finished_job(role, tmp_path)
    assert role._slots_taken() == 1
    with linux.inject(op="rename_noreplace", nth=1, errno=errno.ENOSPC):
        _finish(role, loop, job)
        assert job.settling and role._slots_taken() == 0
        _pump(loop, lambda: "settling not committed" in out.getvalue(), "the NotCommitted report")
    assert not job.settling and role._slots_taken() == 1
    _pump(loop, lambda: not role.jobs, "the retried ack")


def test_the_loop_thread_gets_the_gil_back_soon_while_the_worker_runs(
    make_queue: Callable[..., Queue], queue_path: str
):
    """The claiming and settling threads must not keep the loop waiting CPython's default 5 ms at each syscall."""
    before = sys.getswitchinterval()
    with worker_in_process(make_queue(shards=1), queue_path, jobs=0, concurrency=1) as _:
        assert sys.getswitchinterval() <= worker.LOOP_SWITCH_INTERVAL < 0.005
    assert sys.getswitchinterval() == before  # close() restores the process's own


@pytest.mark.parametrize("written", [1, 63, 64, 65, 200])
def test_a_wakeup_pipe_is_left_empty_in_as_few_reads_as_its_bytes_need(
    monkeypatch: pytest.MonkeyPatch, written: int
) -> None:
    """One read for the usual single byte; a full buffer is read again until a shorter read empties the pipe."""
    reads = []
    real_read = os.read

    def counting(fd: int, n: int) -> bytes:
        reads.append(fd)
        return real_read(fd, n)

    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        os.write(w, b"\0" * written)
        monkeypatch.setattr(os, "read", counting)
        claim.drain_wakeups(r)
        monkeypatch.undo()
        assert len(reads) == written // 64 + 1
        with pytest.raises(BlockingIOError):
            os.read(r, 1)
    finally:
        os.close(r)
        os.close(w)


def test_runs_ending_in_one_pass_reach_the_thread_in_one_piece_in_order(
    worker_role: Worker, tmp_path: Path, monkeypatch
):
    """The loop hands a pass's finished runs over once, at the pass's end (one wake-up of the thread, not
    one per run): every run is settled once, in the order the runs ended."""
    role, loop, qpath, out = worker_role
    _settle_one(role, loop, tmp_path)
    taken: list[Any] = []
    real = settle.Settler._take

    def take(s: settle.Settler, first: Any) -> Any:
        taken.append(first)
        return real(s, first)

    monkeypatch.setattr(settle.Settler, "_take", take)
    jobs = [_finished_job(role, tmp_path) for _ in range(3)]
    ended = [jobs[2], jobs[0], jobs[1]]
    for job in ended:
        role._finish(job)
    assert taken == [] and all(j.settling for j in jobs)  # held until the pass ends
    loop.run_once(0)
    _pump(loop, lambda: not role.jobs, "the group")
    assert len(taken) == 1 and [it.owner for it in taken[0]] == ended
    assert role.tally.done == 4 and _receipts(qpath) == 4
    finished = [line.split()[2] for line in out.getvalue().splitlines() if " finished: ack " in line]
    assert finished[1:] == [j.lease.job_id[:8] for j in ended]


def test_a_forced_stop_before_the_pass_ends_settles_the_runs_not_handed_over(worker_role: Worker, tmp_path: Path):
    role, _, qpath, out = worker_role
    jobs = [_finished_job(role, tmp_path) for _ in range(2)]
    dirs = [j.tmpdir for j in jobs]
    for job in jobs:
        role._finish(job)
    role.close()  # the pass that would have handed them over never ends
    assert _receipts(qpath) == 2 and role.tally.done == 2
    text = out.getvalue()
    for job in jobs:
        assert text.count(f"job {job.lease.job_id[:8]} finished: ack") == 1
    assert all(dirs) and not any(os.path.exists(d) for d in dirs)  # their payload copies went too


def test_the_claiming_and_settling_threads_are_named_in_the_kernel(worker_role: Worker) -> None:
    """``top -H`` and ``/proc/PID/task/TID/stat`` tell the worker's threads apart (what each costs)."""
    role, _, _, _ = worker_role
    assert role._prep is not None and role._settler is not None
    threads = {"steadqd-prepare": role._prep._thread, "steadqd-settle": role._settler._thread}
    deadline = time.monotonic() + DEADLINE
    for name, thread in threads.items():
        path = f"/proc/self/task/{thread.native_id}/comm"
        while Path(path).read_text().strip() != name:  # named as the thread starts
            assert time.monotonic() < deadline, Path(path).read_text()
            time.sleep(0.01)
