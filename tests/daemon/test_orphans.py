"""A SIGKILLed worker leaves no job command running (issue: 168 orphans over 40 kills).

Reproduced as reported: ``kill -9`` of ``steadqd worker`` and of ``steadqd run``
while a job runs that has a grandchild in its process group. Before the fix
both lived on under PID 1, and recovery later ran the job again beside them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.daemon.config import WorkerConfig
from steadqd.daemon.worker.run import fastspawn, guard
from steadqd.daemon.worker.run.child import spawn
from tests.procs import running

from .conftest import DEADLINE, Env, job_spec, kill_group, live_group_members, wait_for


@pytest.mark.parametrize("role", ["worker", "run"])
def test_sigkill_of_the_daemon_kills_its_job_groups(denv: Env, daemons, role: str) -> None:
    denv.write_config(lease="30s")
    d = daemons(denv, role)
    pgid = None
    try:
        with Queue.open(denv.queue_path) as q:
            job = q.enqueue(job_spec(sleep=1000, grandchild=True))
        d.ready()
        info = denv.started(job, 1)
        pgid, grandchild = info["pgid"], info["grandchild"]
        wait_for(lambda: running(grandchild), DEADLINE, "the grandchild to start")
        d.proc.kill()
        d.wait()
        wait_for(lambda: not live_group_members(pgid), DEADLINE, "the job's process group to die")
        assert not running(info["pid"]) and not running(grandchild)
        wait_for(lambda: "died with 1 job command still running" in d.log(), DEADLINE, "the guard's journal line")
    finally:
        if pgid is not None:
            kill_group(pgid)


def test_a_clean_stop_leaves_the_guard_nothing_to_kill(denv: Env, daemons) -> None:
    denv.write_config()
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        job = q.enqueue(job_spec(exit=0))
        d.ready()
        denv.result(job, 1)
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    time.sleep(0.2)  # the guard writes its line, if any, right after the worker's EOF
    assert "still running" not in d.log()


_PDEATHSIG_PROBE = (
    "import ctypes, signal\n"
    "v = ctypes.c_int()\n"
    "ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0)\n"  # PR_GET_PDEATHSIG
    "print(v.value)\n"
)


@pytest.mark.parametrize("spawn_path", ["compiled", "popen"])
@pytest.mark.parametrize("as_nobody", [False, True])
def test_the_command_leader_has_a_parent_death_signal_after_the_user_change(
    tmp_path: Path, as_nobody: bool, spawn_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """setuid() clears PR_SET_PDEATHSIG: it must be set after the user change, on either spawn path."""
    if spawn_path == "popen":
        monkeypatch.setenv(fastspawn.SWITCH, "popen")
    else:
        monkeypatch.delenv(fastspawn.SWITCH, raising=False)
        assert fastspawn.available(), fastspawn.path()
    if as_nobody and os.geteuid() != 0:
        pytest.fail("needs root to run the command as another user")
    cfg = WorkerConfig(command=("/usr/bin/python3", "-c", _PDEATHSIG_PROBE))  # not the venv: nobody may not read it
    payload = tmp_path / "payload"
    payload.write_bytes(b"")
    creds = {"user": 65534, "group": 65534, "extra_groups": []} if as_nobody else {}
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    proc = spawn(cfg, env, str(payload), creds)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        with proc.stdout, proc.stderr:
            out = proc.stdout.read()
        proc.wait(timeout=DEADLINE)
    finally:
        guard.process_guard().forget(proc.pid)
        guard.process_guard().close()  # the guard this test process started exits now, not with pytest
    assert proc.returncode == 0
    assert int(out) == signal.SIGKILL


def _ignores(pid: int, sig: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def _guard_pids(g: guard.GroupGuard) -> int:
    assert g._proc is not None
    return g._proc.pid


def test_a_dead_guard_is_replaced_with_the_whole_list(tmp_path: Path) -> None:
    """The guard itself may be killed; the next message starts a new one that knows every group."""
    sleepers = [subprocess.Popen(["sleep", "1000"], start_new_session=True) for _ in range(2)]
    g = guard.GroupGuard("t")
    try:
        g.watch(sleepers[0].pid)
        first = _guard_pids(g)
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: not g.running(), DEADLINE, "the first guard to die")
        g.watch(sleepers[1].pid)  # EPIPE on the dead one: a new guard gets both groups
        assert g.running() and _guard_pids(g) != first
        g.close()  # EOF: as if the worker died with both still running
        for p in sleepers:
            assert p.wait(timeout=DEADLINE) == -signal.SIGKILL
    finally:
        for p in sleepers:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_forgotten_group_is_not_killed(tmp_path: Path) -> None:
    """``-PGID`` goes out before the reap: after it, the guard must leave that id alone."""
    p = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    g = guard.GroupGuard("t")
    try:
        g.watch(p.pid)
        g.forget(p.pid)
        g.close()
        time.sleep(0.2)
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def _wake_ups(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches in /proc/{pid}/status")


def test_the_guard_reads_a_fast_worker_s_lines_in_few_wake_ups(tmp_path: Path) -> None:
    """A worker starting hundreds of jobs a second must not wake the guard for each +/- line (issue 20)."""
    p = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    g = guard.GroupGuard("t")
    try:
        g.watch(p.pid)
        pid = _guard_pids(g)
        wait_for(lambda: _ignores(pid, signal.SIGTERM), DEADLINE, "the guard to set up its signals")
        time.sleep(0.2)  # its first read has returned: it now waits for the next lines
        before = _wake_ups(pid)
        for fake in range(1_000_000, 1_000_200):  # 400 lines over at least 0.2 s, one write each
            g.watch(fake)
            g.forget(fake)
            time.sleep(0.001)
        woken = _wake_ups(pid) - before
        assert woken < 100, f"the guard woke {woken} times for 400 lines"
        g.close()  # the lines were all read: the live group is still on its list
        assert p.wait(timeout=DEADLINE) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_the_guard_survives_the_stop_signals(tmp_path: Path) -> None:
    """SIGTERM/SIGINT to the worker's process group (a terminal's Ctrl-C) must not take the guard first."""
    p = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    g = guard.GroupGuard("t")
    try:
        g.watch(p.pid)
        wait_for(lambda: _ignores(_guard_pids(g), signal.SIGTERM), DEADLINE, "the guard to set up its signals")
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            os.kill(_guard_pids(g), sig)
        time.sleep(0.2)
        assert g.running()
        g.close()
        assert p.wait(timeout=DEADLINE) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# --- a job's process that leaves its group (issue 30 A) --------------------------------------

_ESCAPE = 'setsid sleep 1000 & echo $! > "$RESULTS/$STEADQ_JOB_ID.escaped"; '


def _escaped_pid(denv: Env, job: str) -> int:
    path = denv.results / f"{job}.escaped"
    wait_for(lambda: path.exists() and path.read_text().strip(), DEADLINE, "the escaped sleeper's pid")
    pid = int(path.read_text())
    wait_for(lambda: os.getsid(pid) == pid, DEADLINE, "setsid to give the sleeper a session of its own")
    return pid


def _escape_config(denv: Env, then: str) -> None:
    denv.write_config(command=[_ESCAPE + then], shell=True, environment={"RESULTS": str(denv.results)}, lease="30s")


def test_a_process_that_left_the_job_s_group_dies_when_the_job_ends(denv: Env, daemons) -> None:
    _escape_config(denv, "exit 0")
    d = daemons(denv)
    sleeper = None
    try:
        with Queue.open(denv.queue_path) as q:
            job = q.enqueue(b"")
        d.ready()
        sleeper = _escaped_pid(denv, job)
        d.wait_log(r"finished: ack")
        wait_for(lambda: not running(sleeper), DEADLINE, "the escaped sleeper to die with its job")
        d.wait_log(r"killed 1 process that ended jobs left outside their process groups")
    finally:
        if sleeper is not None and running(sleeper):
            os.kill(sleeper, signal.SIGKILL)


@pytest.mark.parametrize("role", ["worker", "run"])
def test_a_process_that_left_the_job_s_group_dies_with_a_sigkilled_daemon(denv: Env, daemons, role: str) -> None:
    _escape_config(denv, "exec sleep 1000")
    d = daemons(denv, role)
    sleeper = None
    try:
        with Queue.open(denv.queue_path) as q:
            job = q.enqueue(b"")
        d.ready()
        sleeper = _escaped_pid(denv, job)
        d.proc.kill()
        d.wait()
        wait_for(lambda: not running(sleeper), DEADLINE, "the escaped sleeper to die with the daemon")
        wait_for(lambda: "had left their process groups" in d.log(), DEADLINE, "the guard's journal line")
    finally:
        if sleeper is not None and running(sleeper):
            os.kill(sleeper, signal.SIGKILL)
