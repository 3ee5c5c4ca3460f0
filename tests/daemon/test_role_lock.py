"""One process per (queue, role) on a host (issue 33 #3).

A foreground ``steadqd run`` beside the active unit used to start a second
sweeper and promoter without a word. Every role now holds a lock file under
the role-lock directory; a second run of a role the first holds is refused in
one line naming the holder and the unit to stop, exit 75.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from steadqd.daemon import role_lock
from tests.daemon.conftest import Env
from tests.daemon.test_start_failures import _steadqd


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
