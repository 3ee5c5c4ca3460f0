"""The exec report off the loop thread (issue 20, point 3): spawning does not wait for the command's exec.

``steadq-exec``'s report pipe is one of the loop's readers: its EOF is the
moment a job is ``started``; a reported errno is the same start failure a
synchronous spawn raised (the job is handed back, leasing holds). A command
whose exit is seen before its report was read has its report read then.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from steadqd import Queue
from steadqd.daemon.config import WorkerConfig
from steadqd.daemon.journal import Log
from steadqd.daemon.service import Loop
from steadqd.daemon.worker import claim, payload
from steadqd.daemon.worker.role import WorkerRole
from steadqd.daemon.worker.run import child, exec_helper, fastspawn, guard

from .conftest import DEADLINE, worker_in_process


@pytest.fixture(autouse=True)
def _helper_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report pipe is the fallback's (Popen and the helper); the compiled spawn knows at once (fastspawn)."""
    assert exec_helper.available(), f"{exec_helper.HELPER} missing: ./dev.sh setup (pip install -e .) builds it"
    monkeypatch.setenv(fastspawn.SWITCH, "popen")


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


def _exited(proc: Any) -> None:
    """Wait until the leader has exited, leaving it unreaped (as the worker finds it)."""
    deadline = time.monotonic() + DEADLINE
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        assert time.monotonic() < deadline, "the command did not exit"
        time.sleep(0.01)


def _child(loop: Loop, cfg: WorkerConfig, tmp_path: Path, seen: list[str]) -> child.Child:
    payload = tmp_path / "payload"
    payload.write_bytes(b"")
    proc, report = child.launch(cfg, {"PATH": "/usr/bin:/bin"}, str(payload), {})
    assert report is not None, "the helper's path: the report comes later"
    c: child.Child

    def on_report(data: bytes) -> None:
        seen.append(f"report {data!r}")
        if data:  # what the worker does with a failed exec: the run never began
            c.kill()
            c.release()

    c = child.Child(
        proc, cfg, loop=loop, log=Log("worker", "t", journal=False, stream=io.StringIO()), fields={},
        guard=lambda fn: fn, on_exit=lambda: seen.append("exit"), report_fd=report, on_report=on_report,
    )  # fmt: skip
    return c


def _close_output(c: child.Child) -> None:
    for st in list(c.streams.values()):
        c.close_stream(st)


def test_an_exit_seen_before_the_report_reads_the_report_first(loop: Loop, tmp_path: Path) -> None:
    seen: list[str] = []
    c = _child(loop, WorkerConfig(command=("/bin/true",)), tmp_path, seen)
    try:
        _exited(c.proc)
        _close_output(c)
        assert c.starting
        c.check_exit()  # the loop never read the report: the exit check reads it, then reports the end
        assert seen == ["report b''", "exit"]
        assert not c.starting and c.returncode == 0
    finally:
        guard.process_guard().forget(c.pid)
        guard.process_guard().close()


def test_a_failed_exec_seen_at_the_exit_is_not_a_run_that_ended(loop: Loop, tmp_path: Path) -> None:
    seen: list[str] = []
    c = _child(loop, WorkerConfig(command=(str(tmp_path / "gone"),)), tmp_path, seen)
    try:
        _exited(c.proc)
        _close_output(c)
        c.check_exit()
        assert seen == [f"report {str(errno.ENOENT).encode()!r}"]  # no "exit": it never ran
        assert c.released and c.returncode == 127  # the helper, reaped
    finally:
        guard.process_guard().forget(c.pid)
        guard.process_guard().close()


def test_output_comes_after_started(loop: Loop, tmp_path: Path) -> None:
    """Output means the exec is done: its report is read before the first line is forwarded."""
    seen: list[str] = []
    c = _child(loop, WorkerConfig(command=("/bin/echo", "hello")), tmp_path, seen)
    c.log = Log("worker", "t", journal=False, stream=io.StringIO())
    try:
        deadline = time.monotonic() + DEADLINE
        while not c.streams or c.starting:  # the stdout reader, whichever event the loop gets first
            assert time.monotonic() < deadline
            for st in list(c.streams.values()):
                c._on_output(st)
                break
        assert seen[0] == "report b''"
    finally:
        c.kill()
        guard.process_guard().close()


@pytest.fixture
def worker_role(make_queue: Callable[..., Queue], queue_path: str) -> Iterator[tuple[WorkerRole, Loop, io.StringIO]]:
    """No leasing of its own: the test hands it the prepared job."""
    with worker_in_process(make_queue(shards=1), queue_path, jobs=1, concurrency=2) as role:
        yield role


def test_a_late_exec_failure_is_the_same_start_failure(worker_role, tmp_path: Path) -> None:
    role, lp, out = worker_role
    assert role.q is not None and role.settings.worker is not None
    missing = str(tmp_path / "vanished-command")
    cfg = dataclasses.replace(role.settings.worker, command=(missing,))
    lease = role.q.lease()
    assert lease is not None
    tmpdir = tempfile.mkdtemp(dir=tmp_path)
    path = payload.write_copy(tmpdir, lambda f: f.write(b"job"))
    prepared = claim.Prepared(cfg, {}, lease=lease, renewed=lp.now(), tmpdir=tmpdir, payload_path=path)
    role._start_job(prepared)
    assert len(role.jobs) == 1 and "not started" not in out.getvalue()  # spawned; the report comes later
    deadline = time.monotonic() + DEADLINE
    while role.jobs:
        assert time.monotonic() < deadline, out.getvalue()
        lp.run_once(0.05)
    text = out.getvalue()
    assert (
        f"job {lease.job_id[:8]} not started: cannot start the command {missing!r}: "
        f"[Errno 2] No such file or directory: {missing!r}"
    ) in text
    assert f"job {lease.job_id[:8]} handed back: ready (attempt 1/3)" in text
    assert "started (attempt" not in text
    assert role.held is not None and "No such file or directory" in role.held
    assert not os.path.exists(tmpdir)
    with Queue.open(role.settings.queue) as q:
        assert q.stats()["ready"].objects == 1


def test_no_job_is_claimed_while_a_start_is_unreported(worker_role, tmp_path: Path) -> None:
    """Another claim before the report would cost a second job an attempt if this exec fails (daemon/worker/run/hold.py)."""
    role, lp, out = worker_role
    assert role.q is not None and role.settings.worker is not None and role._prep is not None
    with Queue.open(role.settings.queue) as q:
        q.enqueue(b"the next job")
    lease = role.q.lease()
    assert lease is not None
    tmpdir = tempfile.mkdtemp(dir=tmp_path)
    path = payload.write_copy(tmpdir, lambda f: f.write(b"job"))
    cfg = role.settings.worker
    role._start_job(claim.Prepared(cfg, {}, lease=lease, renewed=lp.now(), tmpdir=tmpdir, payload_path=path))
    (job,) = role.jobs.values()
    assert job.child.starting
    role.draining = False
    role._fill()
    assert not role._prep.busy  # nothing claimed while the start is unreported
    deadline = time.monotonic() + DEADLINE
    while out.getvalue().count(" started (attempt ") < 2:  # reported: the next claim follows
        assert time.monotonic() < deadline, out.getvalue()
        lp.run_once(0.05)


def _start_prepared(role: WorkerRole, lp: Loop, tmp_path: Path, cfg: WorkerConfig) -> None:
    assert role.q is not None
    lease = role.q.lease()
    assert lease is not None
    tmpdir = tempfile.mkdtemp(dir=tmp_path)
    path = payload.write_copy(tmpdir, lambda f: f.write(b"job"))
    role._start_job(claim.Prepared(cfg, {}, lease=lease, renewed=lp.now(), tmpdir=tmpdir, payload_path=path))


def _pump_until(lp: Loop, done: Callable[[], bool], shown: Callable[[], object]) -> None:
    """Run the loop until ``done()``; past the deadline the failure shows ``shown()`` (the log, the events)."""
    deadline = time.monotonic() + DEADLINE
    while not done():
        assert time.monotonic() < deadline, shown()
        lp.run_once(0.05)


def _proven(role: WorkerRole, lp: Loop, out: io.StringIO, tmp_path: Path) -> WorkerConfig:
    """Three more jobs, and the command seen to start once (the job ended too, freeing its slot)."""
    assert role.settings.worker is not None and role._prep is not None
    cfg = role.settings.worker
    with Queue.open(role.settings.queue) as q:
        for i in range(3):
            q.enqueue(b"job %d" % i)
    _start_prepared(role, lp, tmp_path, cfg)
    _pump_until(lp, lambda: not role.jobs, out.getvalue)
    return cfg


def test_once_the_command_has_started_claims_overlap_the_next_exec_report(worker_role, tmp_path: Path) -> None:
    """The wait is for an unproven command only: a proven one's next claim does not queue behind each exec."""
    role, lp, out = worker_role
    cfg = _proven(role, lp, out, tmp_path)
    _start_prepared(role, lp, tmp_path, cfg)
    assert any(j.child.starting for j in role.jobs.values())
    role.draining = False
    role._fill()
    assert role._prep.busy  # claimed while the second start is still unreported


def test_a_start_failure_brings_the_wait_for_the_report_back(worker_role, tmp_path: Path) -> None:
    role, lp, out = worker_role
    cfg = _proven(role, lp, out, tmp_path)
    _start_prepared(role, lp, tmp_path, dataclasses.replace(cfg, command=(str(tmp_path / "vanished"),)))
    _pump_until(lp, lambda: " not started: " in out.getvalue() and not role.jobs, out.getvalue)
    assert role._hold is not None and role.held is not None
    role._hold.cancel()
    role._hold.reason = None  # as if the checks had passed again
    _start_prepared(role, lp, tmp_path, cfg)
    assert any(j.child.starting for j in role.jobs.values())
    role.draining = False
    role._fill()
    assert not role._prep.busy  # unproven again: the claim waits for this report


def test_an_exit_after_the_output_closed_is_seen_by_its_pidfd_not_by_polling(
    loop: Loop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command that closes its output and exits later: the exit wakes the loop (no exit-check timer runs)."""
    real_set = child.Timers.set

    def no_exit_timers(self: Any, name: str, delay: float, fn: Callable[[], None]) -> None:
        if name != "exit":  # without the pidfd, this command's end would never be noticed
            real_set(self, name, delay, fn)

    monkeypatch.setattr(child.Timers, "set", no_exit_timers)
    seen: list[str] = []
    cfg = WorkerConfig(command=("/bin/sh", "-c", "exec >&- 2>&-; sleep 0.2"))
    c = _child(loop, cfg, tmp_path, seen)
    try:
        c.start()
        _pump_until(loop, lambda: "exit" in seen, lambda: seen)
        assert c.returncode == 0 and not c.streams
    finally:
        c.kill()
        guard.process_guard().close()


def test_a_command_whose_output_outlives_it_needs_no_pidfd(
    loop: Loop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pidfd is opened only for a leader still running once its output is closed: here the output (held
    by a background process) closes well after the leader's exit, so EOF's check finds the end itself."""
    opened: list[int] = []
    real_open = os.pidfd_open

    def counting(pid: int, flags: int = 0) -> int:
        opened.append(pid)
        return real_open(pid, flags)

    monkeypatch.setattr(os, "pidfd_open", counting)
    seen: list[str] = []
    c = _child(loop, WorkerConfig(command=("/bin/sh", "-c", "sleep 0.3 & exit 0")), tmp_path, seen)
    try:
        c.start()
        _pump_until(loop, lambda: "exit" in seen, lambda: seen)
        assert c.returncode == 0 and opened == []
    finally:
        c.kill()
        guard.process_guard().close()


def test_the_end_is_told_once_though_eof_and_the_pidfd_both_report_it(loop: Loop, tmp_path: Path) -> None:
    """The owner may hold the child a while after on_exit (the settler): later wake-ups must not tell it again."""
    seen: list[str] = []
    c = _child(loop, WorkerConfig(command=("/bin/true",)), tmp_path, seen)
    try:
        c.start()
        _pump_until(loop, lambda: "exit" in seen, lambda: seen)
        for _ in range(10):  # whatever else is pending (the pidfd, the exit timer) gets its turn
            loop.run_once(0.02)
        c.check_exit()
        assert seen.count("exit") == 1, seen
    finally:
        c.kill()
        guard.process_guard().close()
