"""One process per (queue, role) on a host (issue 33 #3).

A foreground ``steadqd run`` beside the active unit used to start a second
sweeper and promoter without a word. Every role now holds a lock file under
the role-lock directory; a second run of a role the first holds is refused in
one line naming the holder and the unit to stop, exit 75.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
from pathlib import Path

import pytest

from steadqd.daemon import role_lock
from tests.daemon.conftest import Env, traversable
from tests.daemon.test_start_failures import _steadqd
from tests.integration.test_shared_queue import PRODUCER, QUEUE_GID, as_user


def test_a_foreground_run_beside_the_running_worker_is_refused_naming_it(denv: Env, daemons, tmp_path: Path) -> None:
    locks = tmp_path / "roles"
    locks.mkdir()
    lock_env = {role_lock.LOCK_DIR_ENV: str(locks), "INVOCATION_ID": "0123456789abcdef"}
    denv.write_config()
    d = daemons(denv, "worker", lock_env)
    d.ready()
    r = _steadqd(denv, "run", denv.name, extra_env={role_lock.LOCK_DIR_ENV: str(locks)})
    assert r.returncode == 75, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0] == (
        f"<3>run[{denv.name}]: cannot start: the worker of queue {denv.queue_path} already runs on this host "
        f"(steadq-worker@{denv.name}.service, pid {d.proc.pid}); one per queue and host: "
        f"systemctl stop steadq-worker@{denv.name}.service before running another STEADQ_EXIT_STATUS=75"
    )
    # all or nothing: the refused run left no role of its own locked, so a sweeper starts
    s = daemons(denv, "sweeper", {role_lock.LOCK_DIR_ENV: str(locks)})
    s.wait_log(r"^<5>sweeper\[.*\]: started")


def test_a_lock_file_that_is_not_a_regular_file_refuses_without_following_it(denv: Env, tmp_path: Path) -> None:
    locks = tmp_path / "roles"
    locks.mkdir()
    denv.write_config()
    target = tmp_path / "elsewhere"
    target.write_text("")
    name = hashlib.sha256(denv.queue_path.encode()).hexdigest()[:32] + ".sweeper.lock"
    os.symlink(target, locks / name)
    r = _steadqd(denv, "sweeper", denv.name, extra_env={role_lock.LOCK_DIR_ENV: str(locks)})
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert stat.S_ISREG(os.lstat(target).st_mode) and target.read_text() == ""  # never written through the link


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")
@pytest.mark.parametrize(
    ("line", "named"),
    [
        (b"4242 steadq-worker@q.service\x1b[2J\x1b]0;owned\x07\n", None),  # terminal escapes
        (b"4242 fake.service; systemctl stop everything\n", None),  # text after the unit
        (b"4242 " + b"a" * 5000 + b"\n", None),  # longer than the bounded read
        (b"4242 caf\xc3\xa9.service\n", None),  # not ASCII
        (b"4242 x\n4243 y\n", None),  # two holders
        (b"4242 sshd.service\n", "sshd.service, pid 4242"),  # a fake but well-formed unit is only named
    ],
    ids=["escapes", "trailing-text", "oversized", "non-ascii", "two-lines", "well-formed-fake"],
)
def test_a_forged_holder_line_is_bounded_grammar_checked_and_escaped_in_the_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: bytes, named: str | None
) -> None:
    """A member of the queue's group (the lock directory is theirs too, 3770) writes a forged holder
    line into the lock file of a role that runs: the refusal of a second run reads at most 256 bytes,
    names a holder only when the line is ``PID UNIT`` in the unit-name grammar, and otherwise names
    the unit from our own configuration; no escape or control character reaches the one line."""
    traversable(tmp_path)
    locks = tmp_path / "roles"
    locks.mkdir()
    os.chown(locks, 0, QUEUE_GID)
    os.chmod(locks, 0o3770)  # as tmpfiles.d makes /run/steadq/roles
    queue = "/srv/queues/render"
    lock = locks / (hashlib.sha256(queue.encode()).hexdigest()[:32] + ".sweeper.lock")

    def forge() -> None:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o660)
        os.write(fd, line)
        os.close(fd)

    assert as_user(PRODUCER, forge) == "ok"
    monkeypatch.setenv(role_lock.LOCK_DIR_ENV, str(locks))
    holder = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the role runs: a second run is refused
        with pytest.raises(role_lock.RoleHeld) as refused:
            role_lock.acquire(queue, "render", ["sweeper"])
    finally:
        os.close(holder)
    message = str(refused.value)
    assert message.isprintable() and len(message) < 400, message
    fix = f"systemctl stop {named.split(',')[0]}" if named else "systemctl stop steadq-sweeper@render.service"
    assert f"({named or 'probably steadq-sweeper@render.service'}); " in message and fix in message, message
    assert lock.read_bytes() == line  # the refusal changed nothing in the file
