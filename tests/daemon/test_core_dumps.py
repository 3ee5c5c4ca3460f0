"""The daemons' memory holds the store's secrets: no core dump of it, no same-user peek (issue 30 B).

A bucket queue's daemon holds its S3 keys (from its environment or a
credentials file). A core dump would write them to disk, and a job command
running as the daemon's own user could read ``/proc/<daemon>/environ`` or
attach to it. Each daemon makes itself non-dumpable and sets RLIMIT_CORE to 0
before it loads its configuration (steadqd.daemon.process).
"""

from __future__ import annotations

import ctypes
import os
import resource
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.daemon import process

from .conftest import Env, job_spec

_PR_GET_DUMPABLE = 3


def _core_limit(pid: int) -> tuple[str, str]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max core file size"):
            soft, hard = line.split()[4:6]
            return soft, hard
    raise AssertionError(f"no core limit in /proc/{pid}/limits")


@pytest.mark.parametrize("role", ["worker", "run"])
def test_a_daemon_cannot_dump_core(denv: Env, daemons, role: str) -> None:
    denv.write_config()
    with Queue.open(denv.queue_path):
        pass
    d = daemons(denv, role)
    d.ready()
    assert _core_limit(d.pid) == ("0", "0")


def _in_child(fn) -> int:  # type: ignore[no-untyped-def]
    """Run ``fn`` in a forked child; its return value (0-255) is the child's exit status."""
    pid = os.fork()
    if pid == 0:
        code = 255
        try:
            code = fn()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_keep_secrets_makes_the_process_non_dumpable_without_a_core_limit() -> None:
    def child() -> int:
        process.keep_secrets()
        dumpable = ctypes.CDLL(None).prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)
        return 10 * dumpable + (resource.getrlimit(resource.RLIMIT_CORE) == (0, 0))

    assert _in_child(child) == 1  # not dumpable, core limit 0/0


def test_a_same_user_process_cannot_read_the_daemon_s_environment() -> None:
    """What a job running as the daemon's user could do: read /proc/<daemon>/environ."""
    if os.geteuid() != 0:
        pytest.fail("needs root to run both processes as another user")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the "daemon": nobody, with a secret in its environment
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            process.keep_secrets()
            os.write(w, b"x")
            while True:
                os.pause()
        finally:
            os._exit(1)
    os.close(w)
    try:
        assert os.read(r, 1) == b"x"

        def peek() -> int:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                Path(f"/proc/{pid}/environ").read_bytes()
            except PermissionError:
                return 0
            return 1

        assert _in_child(peek) == 0, "a process of the same user read the daemon's environment"
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(r)


def test_the_guard_process_does_not_carry_the_daemon_s_credentials(denv: Env, daemons) -> None:
    """The guard is a fresh exec, dumpable again: its environment must not hold the store's secret."""
    denv.write_config()
    d = daemons(denv, extra_env={"AWS_SECRET_ACCESS_KEY": "daemon-secret"})
    with Queue.open(denv.queue_path) as q:
        job = q.enqueue(job_spec(exit=0))
    d.ready()
    denv.result(job, 1)  # the guard, started with the first job, lives as long as the worker
    guards = [
        p.name
        for p in Path("/proc").iterdir()
        if p.name.isdigit()
        and _parent(int(p.name)) == d.pid
        and b"steadqd.daemon.worker.run.guard" in _cmdline(int(p.name))
    ]
    assert len(guards) == 1
    assert b"AWS_SECRET_ACCESS_KEY" not in Path(f"/proc/{guards[0]}/environ").read_bytes()


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
