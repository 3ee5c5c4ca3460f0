"""The sweep for escaped job processes runs once when a job ends and once more a moment later, not twice a job.

``RoleSweep._sweep_after_job`` sweeps at the end of the loop pass (once for the jobs that ended in it)
and schedules a look ``ESCAPED_SWEEP`` later. Every job's
end used to drop the pending look without cancelling it and schedule a new one, so each job's look still
ran: two full sweeps of ``/proc`` a job instead of one a job and one per quiet spell. The look is still
never less than ``ESCAPED_SWEEP`` after a job's end: its group kill's orphans come to us as their
parents die.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable

import pytest

from steadqd.daemon import process
from steadqd.daemon.service import Loop, Timer
from steadqd.daemon.worker.run import escaped, guard
from steadqd.daemon.worker.run.escaped import RoleSweep


class _Log:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, message: str, **_fields: object) -> None:
        self.warnings.append(message)


class _Role(RoleSweep):
    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.log = _Log()  # type: ignore[assignment]
        self.jobs = {}
        self.closed = False
        self._hooks = None
        self._sweep_timer: Timer | None = None

    def _guarded(self, fn: Callable[[], None], job: object = None) -> Callable[[], None]:
        return fn


def _run_for(loop: Loop, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        loop.run_once(max_wait=max(0.0, deadline - time.monotonic()))


class _Sweeps:
    """process.kill_escaped's stand-in: counts the sweeps, answers (killed, reaped) from ``answers``, then (0, 0)."""

    def __init__(self) -> None:
        self.calls = 0
        self.answers: list[tuple[int, int]] = []
        self.every_thread: list[bool] = []  # each look's: every thread's children, or the main thread's

    def __call__(self, leaders: object, ours: object = (), *, every_thread: bool = True) -> tuple[int, int]:
        self.calls += 1
        self.every_thread.append(every_thread)
        return self.answers.pop(0) if self.answers else (0, 0)


@pytest.fixture
def sweeps(monkeypatch: pytest.MonkeyPatch) -> _Sweeps:
    fake = _Sweeps()
    monkeypatch.setattr(process, "kill_escaped", fake)
    monkeypatch.setattr(escaped, "ESCAPED_SWEEP", 0.05)
    return fake


def test_jobs_ending_in_a_row_share_the_later_look(sweeps: _Sweeps) -> None:
    loop = Loop()
    try:
        role = _Role(loop)
        for _ in range(5):
            role._sweep_after_job()
        assert sweeps.calls == 0  # the look "now" is made when the loop pass in which they ended is done
        loop.run_once(0)
        assert sweeps.calls == 1, "one look now for the five ends of one pass, not one per end"
        _run_for(loop, 0.25)
        assert sweeps.calls == 2, "the later look runs once for the five ends, not once per end"
    finally:
        loop.close()


def test_the_later_look_comes_a_full_delay_after_the_last_end(monkeypatch: pytest.MonkeyPatch, sweeps: _Sweeps) -> None:
    monkeypatch.setattr(escaped, "ESCAPED_SWEEP", 1.0)
    loop = Loop()
    try:
        role = _Role(loop)
        role._sweep_after_job()
        loop.run_once(0)
        time.sleep(0.5)
        role._sweep_after_job()  # its look is 1.0 s from now, not the first end's, 0.5 s from now
        loop.run_once(0)
        _run_for(loop, 0.7)
        assert sweeps.calls == 2, "no look before 1.0 s after the second end"
        _run_for(loop, 0.6)
        assert sweeps.calls == 3
    finally:
        loop.close()


def test_something_found_is_looked_for_again_sooner_than_the_pending_look(
    monkeypatch: pytest.MonkeyPatch, sweeps: _Sweeps
) -> None:
    monkeypatch.setattr(escaped, "ESCAPED_SWEEP", 5.0)
    sweeps.answers.append((1, 1))  # the first sweep kills one: its children come to us soon
    loop = Loop()
    try:
        role = _Role(loop)
        role._sweep_after_job()
        loop.run_once(0)
        assert sweeps.calls == 1
        _run_for(loop, 0.4)
        assert sweeps.calls == 2, "a sweep that killed something looks again after 0.1 s, whatever is pending"
        assert role.log.warnings
    finally:
        loop.close()


def test_a_child_known_as_ours_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard, in our session, was read from /proc after every job only to be left alone."""
    read: list[int | str] = []
    real = process._stat

    def recording(pid: int | str) -> tuple[str, int, int] | None:
        read.append(int(pid))
        return real(pid)

    monkeypatch.setattr(process, "_stat", recording)
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert process.kill_escaped([]) == (0, 0)  # in our session: left alone, but read
        assert child.pid in read
        read.clear()
        assert process.kill_escaped([], ours=[child.pid]) == (0, 0)
        assert child.pid not in read
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_children_of_a_thread_started_after_the_last_listing_are_seen() -> None:
    """The thread list is kept between sweeps; a thread started since is listed, with its children."""
    process.children()  # lists the threads now
    started = threading.Event()
    done = threading.Event()
    procs: list[subprocess.Popen[bytes]] = []

    def spawner() -> None:
        procs.append(subprocess.Popen(["sleep", "30"]))
        started.set()
        done.wait(30)

    t = threading.Thread(target=spawner)
    t.start()
    try:
        assert started.wait(10)
        assert procs[0].pid in process.children()
    finally:
        done.set()
        t.join(10)
        for p in procs:
            p.kill()
            p.wait()
    assert procs[0].pid not in process.children()


def test_a_sweep_before_the_first_job_does_not_make_the_guard(monkeypatch: pytest.MonkeyPatch, sweeps: _Sweeps) -> None:
    """The guard is made by the first spawn, with the queue's name for its journal lines; a sweep (the
    safety rescan's, before any job ran) only asks for the pid of a guard that exists."""
    monkeypatch.setattr(guard, "_guard", None)
    loop = Loop()
    try:
        _Role(loop)._sweep_escaped()
    finally:
        loop.close()
    assert sweeps.calls == 1
    assert guard.process_guard("q1").queue == "q1"


def test_busy_looks_read_the_main_threads_children_and_every_threads_at_least_each_delay(
    monkeypatch: pytest.MonkeyPatch, sweeps: _Sweeps
) -> None:
    """Jobs ending pass after pass: each pass's look reads the main thread's children only (one file, not 7),
    but one look each ``ESCAPED_SWEEP`` reads every thread's, and so does the later look."""
    monkeypatch.setattr(escaped, "ESCAPED_SWEEP", 0.3)
    loop = Loop()
    try:
        role = _Role(loop)
        for _ in range(3):
            role._sweep_after_job()
            loop.run_once(0)
        assert sweeps.every_thread == [True, False, False]
        time.sleep(0.35)
        role._sweep_after_job()
        loop.run_once(0)
        assert sweeps.every_thread[3] is True, "the last look at every thread is a full delay old"
        _run_for(loop, 0.5)
        assert sweeps.every_thread == [True, False, False, True, True], "the later look reads every thread"
    finally:
        loop.close()


_ORPHAN = r"""
import os, subprocess, sys, threading, time
from steadqd.daemon import process
assert process.become_subreaper()
threads_ready = threading.Barrier(4)
def idle():
    threads_ready.wait()
    time.sleep(30)
for _ in range(3):  # threads besides the main one, like the worker's
    threading.Thread(target=idle, daemon=True).start()
threads_ready.wait()
out = {}
spawned, checked = threading.Event(), threading.Event()
def spawn():  # a command started by another thread (alive) leaves a process in a session of its own, and ends
    sh = subprocess.Popen(["sh", "-c", "setsid sleep 30 >/dev/null & echo $!"], stdout=subprocess.PIPE)
    out["orphan"] = int(sh.stdout.readline())
    sh.stdout.close()
    sh.wait()
    out["spawner"] = threading.get_native_id()
    spawned.set()
    checked.wait(30)
t = threading.Thread(target=spawn)
t.start()
spawned.wait(30)
orphan = out["orphan"]
deadline = time.monotonic() + 10
while orphan not in process.children() and time.monotonic() < deadline:
    time.sleep(0.01)
try:
    spawner = process._read(f"/proc/self/task/{out['spawner']}/children").split()
    print(orphan in process.children(every_thread=False), orphan in process.children(), str(orphan).encode() in spawner)
finally:
    checked.set()
    os.kill(orphan, 9)
    os.waitpid(orphan, 0)
"""


def test_an_orphan_of_a_command_started_by_another_thread_is_the_main_threads_child() -> None:
    """What the sweep after each job reads: the kernel re-parents an escaped process to the subreaper's main
    thread, whichever thread started the job. In a child process (the subreaper setting stays for life)."""
    import sys

    r = subprocess.run([sys.executable, "-c", _ORPHAN], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "False"], "the main thread's child, not the starting thread's"


def test_a_forked_child_reads_its_own_main_threads_children() -> None:
    """The main thread's list is named once per process: a forked child names its own, not its parent's."""
    process.children(every_thread=False)  # named in this process
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            child = subprocess.Popen(["sleep", "30"])
            os.write(w, b"1" if child.pid in process.children(every_thread=False) else b"0")
            child.kill()
            child.wait()
        finally:
            os._exit(0)
    os.close(w)
    seen = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert seen == b"1"


def test_postponing_the_later_look_keeps_its_timer(sweeps: _Sweeps) -> None:
    """Every job's end postpones the later look: the pending timer re-arms itself when it fires, rather
    than each end cancelling it and adding a new one (a cancelled timer a job left in the loop's heap)."""
    loop = Loop()
    try:
        role = _Role(loop)
        role._sweep_after_job()
        loop.run_once(0)
        timer = role._sweep_timer
        assert timer is not None
        for _ in range(20):
            role._sweep_after_job()
            loop.run_once(0)
        assert role._sweep_timer is timer and not timer.cancelled
        assert sum(1 for _, _, t in loop._timers if t.cancelled) == 0
        _run_for(loop, 0.3)
        assert sweeps.calls == 22, "one look a pass, and the later look once"
    finally:
        loop.close()
