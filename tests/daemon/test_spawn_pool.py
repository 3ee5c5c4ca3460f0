"""The spawn pool (issue 35): the worker's commands are spawned by C threads, so its loop does not wait in
vfork for each command's exec.

What the loop's own spawn guaranteed must still hold: the parent-death
signal (it follows the thread that forked the child, so the pool's threads
must outlive every job), the guard hearing of each group before its command
runs (its descriptor is lent to spawns in flight, and a guard replaced
meanwhile is told again), the slot held from the hand-over, and a stop
during a spawn that leaves no child and no job behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from steadqd import Lease, Queue
from steadqd.daemon.worker import claim, payload
from steadqd.daemon.worker.run import child, escaped, fastspawn, guard
from tests.procs import running

from .conftest import DEADLINE, worker_in_process

ENV = {"PATH": "/usr/bin:/bin"}


@pytest.fixture(autouse=True)
def _built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fastspawn.SWITCH, raising=False)
    assert fastspawn.available(), f"the compiled spawn is not built ({fastspawn.path()}): ./dev.sh setup builds it"


def _results(pool: fastspawn.Pool, tokens: list[int]) -> dict[int, Any]:
    """Wait for the pool's results of ``tokens``."""
    done: dict[int, Any] = {}
    deadline = time.monotonic() + DEADLINE
    while not set(tokens) <= done.keys():
        assert time.monotonic() < deadline, f"spawns not done: {set(tokens) - done.keys()}"
        pool.wait(0.1)
        done.update(pool.collect())
    return done


def _from_a_thread(start: Callable[[], Any]) -> Any:
    """``start()`` in a thread that has ended when this returns."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(start()))
    t.start()
    t.join(DEADLINE)
    assert not t.is_alive()
    return out[0]


def _end(proc: Any) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=DEADLINE)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def test_a_pooled_command_outlives_the_thread_that_asked_for_it() -> None:
    """The parent-death signal fires when the forking *thread* ends: a spawn in a short-lived thread
    kills its command with it (shown first), a pooled one does not."""
    direct = _from_a_thread(
        lambda: fastspawn.spawn(["sleep", "1000"], env=ENV, cwd=None, stdin_fd=None, credentials={})
    )
    try:
        assert direct.wait(timeout=DEADLINE) == -signal.SIGKILL  # what a thread per spawn would do to its job
    finally:
        _end(direct)
    pool = fastspawn.pool()
    token = _from_a_thread(lambda: pool.submit(["sleep", "1000"], env=ENV, cwd=None, stdin_fd=None, credentials={}))
    proc = _results(pool, [token])[token]
    try:
        time.sleep(0.3)  # the asking thread has ended, the pool's thread is idle again
        assert proc.poll() is None
    finally:
        _end(proc)


def test_a_pooled_command_has_the_parent_death_signal_and_no_signal_blocked() -> None:
    """The pool's threads block every signal; their children get the mask of the thread that started the pool."""
    pool = fastspawn.pool()
    probe = "import ctypes, re\nv = ctypes.c_int()\nctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0)\n"
    probe += "print(v.value, re.search(r'SigBlk:\\s*(\\w+)', open('/proc/self/status').read()).group(1))\n"

    token = pool.submit([sys.executable, "-c", probe], env=ENV, cwd=None, stdin_fd=None, credentials={})
    proc = _results(pool, [token])[token]
    assert proc.stdout is not None
    out = proc.stdout.read()
    _end(proc)
    assert out.split() == [b"9", b"0000000000000000"]


def test_a_failed_pooled_start_is_the_error_popen_raises_and_leaves_no_descriptor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every pipe end the submit made is closed. Checked by identity, not by comparing /proc/self/fd before
    and after: in a CI worker an earlier test's objects are finalized (their descriptors closed) and its
    spawns settle meanwhile, so the process's listing moves on its own (it failed so under load)."""
    pool = fastspawn.pool()
    made: list[tuple[int, tuple[int, int]]] = []
    real = os.pipe2

    def recording(flags: int) -> tuple[int, int]:
        ends = real(flags)
        made.extend((fd, _identity(fd)) for fd in ends)
        return ends

    monkeypatch.setattr(os, "pipe2", recording)
    token = pool.submit(["/nonexistent/command"], env=ENV, cwd=None, stdin_fd=None, credentials={})
    monkeypatch.undo()
    result = _results(pool, [token])[token]
    assert isinstance(result, FileNotFoundError) and result.filename == "/nonexistent/command"
    assert len(made) == 4  # the command's stdout and stderr pipes
    still_open = [fd for fd, identity in made if _identity(fd) == identity]
    assert still_open == []


def _identity(fd: int) -> tuple[int, int]:
    """The open file behind ``fd`` (a closed number reused for another file has another), or (0, 0)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return (0, 0)
    return (st.st_dev, st.st_ino)


def test_a_started_command_the_loop_has_not_collected_is_known_to_the_sweep() -> None:
    """The escaped-process sweep must not take a command the pool started for an escaped process: it waits for
    the spawns in flight and gets the pids of those not collected yet (its leaders); collect() still has them."""
    pool = fastspawn.pool()
    token = pool.submit(["sleep", "1000"], env=ENV, cwd=None, stdin_fd=None, credentials={})
    pids = pool.started_pids(DEADLINE)
    assert pids is not None and pool.uncollected
    done = dict(pool.collect())
    proc = done[token]
    try:
        assert pids == [proc.pid] and not pool.uncollected
    finally:
        _end(proc)


def test_a_guard_replaced_during_a_spawn_keeps_the_lent_descriptor_and_hears_of_the_group() -> None:
    """The loop replaces a dead guard while a pool thread's child may still write to the old pipe: that
    descriptor stays open (closed, its number could become another file's) until the spawn is done, and
    the new guard, which got the list without this group, is told it."""
    g = guard.GroupGuard("t")
    other = fastspawn.spawn(["sleep", "1000"], env=ENV, cwd=None, stdin_fd=None, credentials={})
    proc = None
    try:
        fd, generation = g.lend()
        first = g._proc
        assert first is not None
        first.kill()
        first.wait()
        g.watch(other.pid)  # its line meets the dead guard: replaced, with the whole list
        assert g.running() and g._proc is not first and g.generation == generation + 1
        os.fstat(fd)  # lent: set aside, not closed
        pool = fastspawn.pool()
        token = pool.submit(["sleep", "1000"], env=ENV, cwd=None, stdin_fd=None, credentials={}, guard_fd=fd)
        g_of = guard._guard
        guard._guard = g  # child.spawned() tells the process's guard
        try:
            proc = child.spawned(child.Starting(token, "", fd, generation), _results(pool, [token])[token])
        finally:
            guard._guard = g_of
        with pytest.raises(OSError):
            os.fstat(fd)  # given back: the dead guard's pipe is closed now
        g.close()  # EOF: as if the worker died
        assert proc.wait(timeout=DEADLINE) == -signal.SIGKILL
        assert other.wait(timeout=DEADLINE) == -signal.SIGKILL
    finally:
        for p in (proc, other):
            if p is not None:
                _end(p)


def _full_pipe() -> tuple[int, int]:
    """A blocking pipe with no room left: a child's guard line waits in its write until the pipe is read."""
    r, w = guard.guard_pipe()
    os.set_blocking(w, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(w, b"x" * 4096)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(w, b"x")
    os.set_blocking(w, True)
    return r, w


def _drain_later(r: int, after: float) -> threading.Thread:
    def drain() -> None:
        time.sleep(after)
        os.set_blocking(r, False)
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            try:
                if not os.read(r, 65536):
                    return
            except BlockingIOError:
                time.sleep(0.01)
            except OSError:
                return

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    return t


@dataclasses.dataclass
class Held:
    """Spawns held in flight: the guard lends a full pipe, so each child's guard line waits in its write
    until :meth:`drain`; the pids of the commands the role took as started, in order."""

    r: int
    started: list[int]

    def drain(self, after: float) -> None:
        _drain_later(self.r, after)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[Held]:
    r, w = _full_pipe()
    g = guard.process_guard()
    monkeypatch.setattr(g, "lend", lambda: (w, g.generation))
    monkeypatch.setattr(g, "give_back", lambda fd: None)
    started: list[int] = []

    def recording(starting: child.Starting, result: Any) -> Any:
        proc = child.spawned(starting, result)
        started.append(proc.pid)
        return proc

    monkeypatch.setattr("steadqd.daemon.worker.role.spawned", recording)
    try:
        yield Held(r, started)
    finally:
        os.close(w)
        os.close(r)
        guard.process_guard().close()
        for pid in started:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def _start_sleeping_job(role: Any, lp: Any, tmp_path: Path, **cfg: Any) -> tuple[Lease, str]:
    """Lease the queue's one job and hand ``sleep 1000`` for it to the spawn pool: (lease, its tmpdir)."""
    assert role.q is not None and role.settings.worker is not None and role._spawner is not None
    lease = role.q.lease()
    assert lease is not None
    tmpdir = tempfile.mkdtemp(dir=tmp_path)
    path = payload.write_copy(tmpdir, lambda f: f.write(b"job"))
    config = dataclasses.replace(role.settings.worker, command=("sleep", "1000"), **cfg)
    role._start_job(claim.Prepared(config, {}, lease=lease, renewed=lp.now(), tmpdir=tmpdir, payload_path=path))
    return lease, tmpdir


def test_a_stop_during_a_spawn_leaves_no_child_and_no_job(
    make_queue: Callable[..., Queue], queue_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: Held
) -> None:
    """A spawn is held in flight (its child's guard line waits on a full pipe): its slot is taken and the
    escaped-process sweep waits for it; the forced stop then waits for it, stops the command and hands the
    job back."""
    swept: list[Any] = []
    monkeypatch.setattr("steadqd.daemon.process.kill_escaped", lambda *a, **_k: swept.append(a) or (0, 0))
    with worker_in_process(make_queue(shards=1), queue_path, jobs=1, concurrency=2) as (role, lp, out):
        _lease, tmpdir = _start_sleeping_job(role, lp, tmp_path)
        lp.run_once(0.2)
        assert role._spawning and not role.jobs  # still in flight: the child waits on its guard line
        assert role._slots_taken() == 1 and role.running_jobs() == 1 and not role.drained()
        role._sweep_escaped()
        assert not swept  # put off: the child is not a job's leader yet
        held.drain(0.3)
        role.close()
        text = out.getvalue()
        assert not role._spawning and not role.jobs
        assert "job handed back on stop" in text, text
        (pid,) = held.started
    assert not running(pid)
    with Queue.open(queue_path) as q:
        stats = q.stats()
        assert stats["ready"].objects == 1 and stats["leased"].objects == 0
    assert not os.path.exists(tmpdir)


def test_a_cancel_heard_during_a_spawn_stops_the_command_once_it_is_a_job(
    make_queue: Callable[..., Queue], queue_path: str, tmp_path: Path, held: Held
) -> None:
    """The cancel's news (the leased object left the store) comes while the command is still being spawned,
    when it is no job to stop yet: it is asked about once it is one, and its command stopped then."""
    with worker_in_process(make_queue(shards=1), queue_path, jobs=1, concurrency=2) as (role, lp, out):
        # A first renewal (which would find the cancel too) far past the test's deadline.
        lease, _tmpdir = _start_sleeping_job(role, lp, tmp_path, lease=600.0)
        with Queue.open(queue_path) as q:
            q.cancel(lease.job_id)
        deadline = time.monotonic() + DEADLINE
        while not any(s.cancel_heard for s in role._spawning.values()):
            assert time.monotonic() < deadline and role._spawning, out.getvalue()
            lp.run_once(0.05)
        assert not role.jobs
        held.drain(0.0)
        short = lease.job_id[:8]
        while f"job {short} cancelled (" not in out.getvalue() or role.jobs:
            assert time.monotonic() < deadline, out.getvalue()
            lp.run_once(0.05)
        assert f"job {short} cancelled: stopping its command" in out.getvalue()
    with Queue.open(queue_path) as q:
        stats = q.stats()
        assert stats["dead"].objects == 1 and stats["ready"].objects == 0 and stats["leased"].objects == 0


def test_a_sweep_is_put_off_while_a_spawn_is_in_flight_and_waits_for_it_once_put_off_long(
    make_queue: Callable[..., Queue], queue_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: Held
) -> None:
    """The loop does not wait for a spawn at each sweep (put off, no wait); a stream of spawns cannot keep the
    sweep off for good: once put off for SPAWN_PUT_OFF it waits for them, and their commands are leaders."""
    monkeypatch.setattr("steadqd.daemon.worker.role.SPAWN_WAIT", DEADLINE)
    with worker_in_process(make_queue(shards=1), queue_path, jobs=1, concurrency=2) as (role, lp, out):
        _start_sleeping_job(role, lp, tmp_path)
        assert role._starting_pids() is None  # put off at once: the spawn is still held, so not waited for
        assert role._sweep_put_off is not None
        role._sweep_put_off -= escaped.SPAWN_PUT_OFF
        held.drain(0.1)
        pids = role._starting_pids()  # put off long enough: waits for the spawn
        assert pids is not None and len(pids) == 1 and role._sweep_put_off is None
        deadline = time.monotonic() + DEADLINE
        while not role.jobs:  # the loop collects what the sweep read
            assert time.monotonic() < deadline, out.getvalue()
            lp.run_once(0.05)
        assert held.started == pids and list(role.jobs) == pids


def test_the_pool_makes_the_loops_ends_non_blocking_and_the_commands_ends_stay_blocking() -> None:
    """The pool's thread sets the read ends non-blocking (the loop's two ioctls a job, without the GIL); the
    command's stdout and stderr, the other ends of the same pipes, stay blocking: a fast writer never sees
    EAGAIN. The loop's ends are no Python file objects (their fstat, two a job)."""
    pool = fastspawn.pool()
    probe = "import os\nprint(os.get_blocking(1), os.get_blocking(2))\n"
    token = pool.submit([sys.executable, "-c", probe], env=ENV, cwd=None, stdin_fd=None, credentials={})
    proc = _results(pool, [token])[token]
    assert isinstance(proc, fastspawn.Spawned) and proc.pipes_nonblocking
    assert proc.stdout is not None and proc.stderr is not None
    assert isinstance(proc.stdout, fastspawn.PipeEnd)
    assert not os.get_blocking(proc.stdout.fileno()) and not os.get_blocking(proc.stderr.fileno())
    out = proc.stdout.read()  # waits for the output although non-blocking
    _end(proc)
    assert out.split() == [b"True", b"True"]
    assert proc.stdout.closed and proc.stderr.closed
