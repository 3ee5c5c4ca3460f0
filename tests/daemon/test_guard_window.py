"""The guard knows a job's group before its command can run (CI: a grandchild outlived a SIGKILLed worker).

The worker used to tell the guard ``+PGID`` only after the spawn returned,
that is after the command's exec. Under load the worker's thread can wait
for the CPU there while the command runs, forks a grandchild and reports
itself started; a worker SIGKILLed in that window left a group the guard
never heard of, and the grandchild (no parent-death signal) lived on.

Reproduced deterministically: a worker process whose spawn stalls right
after it returned (as a thread waiting for the GIL would), and a command
that forks a grandchild and then SIGKILLs the worker itself. The guard must
have been told by the spawn, so it kills the grandchild.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from steadqd.daemon.worker.run import child, exec_helper, fastspawn, guard
from tests.procs import running

from .conftest import DEADLINE, wait_for

_WORKER = r"""
import os, sys, time
from steadqd.daemon.config import WorkerConfig
from steadqd.daemon.worker.run import child, exec_helper, fastspawn

def stalled(real):
    def spawn(*args, **kwargs):
        result = real(*args, **kwargs)
        time.sleep(600)  # the loop thread stalls after the exec: the command SIGKILLs this worker meanwhile
        return result
    return spawn

fastspawn.spawn = stalled(fastspawn.spawn)
exec_helper.start = stalled(exec_helper.start)
child._popen_telling_the_guard = stalled(child._popen_telling_the_guard)
command = 'sleep 1000 & echo $! > %s.tmp && mv %s.tmp %s; kill -9 $PPID; wait' % ((sys.argv[1],) * 3)
cfg = WorkerConfig(command=(command,), shell=True)
env = {"PATH": os.environ["PATH"], "STEADQ_JOB_ID": sys.argv[2], "STEADQ_QUEUE": "window"}
credentials = {"user": os.getuid(), "group": os.getgid(), "extra_groups": os.getgroups()} if sys.argv[3] else {}
if sys.argv[4]:  # the spawn pool: its thread spawns, the loop (this thread) never hears of the result
    child.submit(fastspawn.pool(), cfg, env, os.devnull, credentials)
    time.sleep(600)
child.launch(cfg, env, os.devnull, credentials)
"""


@pytest.mark.parametrize("spawn_path", ["compiled", "pool", "popen", "popen-preexec"])
@pytest.mark.parametrize("job_id", ["0123456789abcdef0123456789abcdef", ""])
def test_a_worker_killed_right_after_the_exec_leaves_no_grandchild(
    tmp_path: Path, spawn_path: str, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With and without a job id: the group kill alone must do it (the env scan needs the id).

    ``popen-preexec``: a command run as a user (this one) on the fallback is started by Popen with a
    ``preexec_fn``, not through ``steadq-exec``. ``pool``: the worker's spawn pool (fastspawn.Pool), whose
    thread outlives the job: the worker's death must still end it."""
    if spawn_path.startswith("popen"):
        monkeypatch.setenv(fastspawn.SWITCH, "popen")
    else:  # also when the whole suite runs on the fallback (STEADQ_SPAWN=popen): this case is the compiled one
        monkeypatch.delenv(fastspawn.SWITCH, raising=False)
        assert fastspawn.available(), fastspawn.path()
    env = dict(os.environ)
    marker = tmp_path / "grandchild"
    argv = [sys.executable, "-c", _WORKER, str(marker), job_id, "as" if spawn_path == "popen-preexec" else ""]
    argv.append("pool" if spawn_path == "pool" else "")
    worker = subprocess.Popen(argv, env=env)
    grandchild = 0
    try:
        assert worker.wait(timeout=DEADLINE) == -9  # killed by its own command, stalled before the spawn returned
        grandchild = int(marker.read_text())
        wait_for(lambda: not running(grandchild), DEADLINE, "the guard to kill the job's grandchild")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        if grandchild and running(grandchild):
            os.kill(grandchild, 9)


def _start(path: str, argv: list[str], guard_fd: int, env: dict[str, str]) -> subprocess.Popen[bytes] | Any:
    """Start ``argv`` on one spawn path, its child writing its guard line to ``guard_fd``; Popen's OSError."""
    kwargs: dict[str, Any] = dict(
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
    )
    tail = guard.GroupGuard().tail(env.get("STEADQ_JOB_ID", ""))
    if path == "compiled":
        return fastspawn.spawn(
            argv, env=env, cwd=None, stdin_fd=None, credentials={}, guard_fd=guard_fd, guard_tail=tail
        )
    if path == "helper":
        proc, report = exec_helper.start(argv, guard_fd=guard_fd, **kwargs)
        exec_helper.wait_report(proc, report, argv[0])
        return proc
    pid_r, pid_w = os.pipe2(os.O_CLOEXEC)
    try:
        return subprocess.Popen(argv, preexec_fn=guard.die_with_parent(guard_fd, tail, pid_w), **kwargs)
    finally:
        os.close(pid_r)
        os.close(pid_w)


PATHS = ["compiled", "helper", "preexec"]
JOB = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("path", PATHS)
def test_the_child_tells_the_guard_its_group_and_job(path: str) -> None:
    r, w = guard.guard_pipe()
    env = {"PATH": os.environ["PATH"], "STEADQ_JOB_ID": JOB}
    try:
        proc = _start(path, ["/bin/sh", "-c", "exit 0"], w, env)
    finally:
        os.close(w)
    try:
        assert proc.wait(timeout=DEADLINE) == 0
        assert guard._read_groups(r) == {proc.pid: JOB}  # one line, the command's descriptor closed at its exec
    finally:
        os.close(r)
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()


def _groups(raw: bytes) -> dict[int, str]:
    """What a guard that read ``raw`` would kill at EOF."""
    r, w = os.pipe()
    os.write(w, raw)
    os.close(w)
    try:
        return guard._read_groups(r)
    finally:
        os.close(r)


@pytest.mark.parametrize("path", PATHS)
def test_a_child_whose_exec_fails_takes_its_guard_line_back(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Else the guard would hold a pid that is free again, and kill its next owner's group at the worker's death.

    On Popen's own exec (``preexec``) the child cannot: the worker takes it back with the pid it was sent."""
    r, w = guard.guard_pipe()
    env = {"PATH": os.environ["PATH"], "STEADQ_JOB_ID": JOB}
    try:
        with pytest.raises(FileNotFoundError):
            if path == "preexec":
                g = guard.GroupGuard("t")
                monkeypatch.setattr(g, "pipe", lambda: w)
                monkeypatch.setattr(g, "running", lambda: True)
                monkeypatch.setattr(g, "_fd", w)
                child._popen_telling_the_guard(["/nonexistent/command"], g, JOB, {"env": env})
            else:
                _start(path, ["/nonexistent/command"], w, env)
    finally:
        os.close(w)
    raw = b""
    try:
        while chunk := os.read(r, 4096):
            raw += chunk
    finally:
        os.close(r)
    assert raw.startswith(b"+") and b"\n-" in raw, raw  # told, then taken back
    assert _groups(raw) == {}


@pytest.mark.parametrize("path", PATHS)
def test_a_dead_guard_does_not_stop_the_job(path: str) -> None:
    """EPIPE on the child's guard line (SIGPIPE at its default in Popen's child): the command runs as ever."""
    r, w = guard.guard_pipe()
    os.close(r)  # no reader: the guard is dead
    env = {"PATH": os.environ["PATH"], "STEADQ_JOB_ID": JOB}
    try:
        proc = _start(path, ["/bin/sh", "-c", "echo ran"], w, env)
    finally:
        os.close(w)
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stdout, proc.stderr:
        assert proc.stdout.read() == b"ran\n"
    assert proc.wait(timeout=DEADLINE) == 0


def test_a_worker_whose_guard_died_tells_a_new_one_the_group() -> None:
    """The child's line went nowhere: started() finds the guard dead and replaces it with the whole list."""
    g = guard.GroupGuard("t")
    sleeper = None
    try:
        fd = g.pipe()
        first = g._proc
        assert first is not None
        first.kill()
        first.wait()
        env = {"PATH": os.environ["PATH"]}
        sleeper = _start("compiled", ["sleep", "1000"], fd, env)
        g.started(sleeper.pid, "", told=True)
        assert g.running() and g._proc is not first
        g.close()  # EOF: as if the worker died
        assert sleeper.wait(timeout=DEADLINE) == -signal.SIGKILL
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


@pytest.mark.parametrize("path", PATHS)
def test_the_command_keeps_no_guard_descriptor(path: str) -> None:
    """A command holding the guard's pipe could write lines of its own (another group's id to kill)."""
    r, w = guard.guard_pipe()
    env = {"PATH": os.environ["PATH"]}
    try:
        proc = _start(path, ["sleep", "1000"], w, env)
    finally:
        os.close(w)
    try:
        raw = b""
        while select.select([r], [], [], DEADLINE)[0] and (chunk := os.read(r, 4096)):
            raw += chunk
        assert raw == b"+%d\n" % proc.pid
        assert proc.poll() is None  # EOF while the command runs: it has no copy of the write end
        assert _settled_descriptors(proc.pid) == ["0", "1", "2"]
    finally:
        os.close(r)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()


def _settled_descriptors(pid: int) -> list[str]:
    """The command's descriptors once its dynamic loader is done: right after the exec, ld.so holds
    /etc/ld.so.cache or a library open on descriptor 3 for a moment, which a loaded machine lets a
    listing see (CI did). A descriptor the command inherited stays, so the wait ends at the deadline."""
    deadline = time.monotonic() + DEADLINE
    while (fds := sorted(os.listdir(f"/proc/{pid}/fd"))) != ["0", "1", "2"] and time.monotonic() < deadline:
        time.sleep(0.01)
    return fds
