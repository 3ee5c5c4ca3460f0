"""``steadq cancel`` under real systemd, with the .deb installed the way an administrator installs it (issue 32 #1).

A queue whose command is literally ``sleep 1000``: one job runs (its ``sleep`` is
seen running as the steadq user), ``steadq cancel`` as a member of the steadq group
stops it, the ``sleep`` is gone within seconds while the unit stays active, ``steadq
show`` says dead cancelled, and ``systemctl restart steadq.target`` then restarts the
worker (new MainPID) without waiting on anything. The worker hears of the cancel from
its inotify watch: the lease here is an hour, so no renewal (every 20 minutes) can be
what stopped it within the deadline.

The root is the package tests' (test_packages_e2e.py: its own boot, the .deb of this
session's build, no network); only the first .deb is built.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .conftest import main_pid, queue_state, wait_for
from .sysroot import SystemdRoot
from .test_packages_e2e import root_with_deb

pytestmark = [pytest.mark.system, pytest.mark.packaging]

QUEUE = "/var/lib/steadq/demo"
WORKER = "steadq-worker@demo.service"
STEADQ = "/usr/bin/steadq"  # the package's CLI
DEADLINE = 90.0  # generous for a loaded 2-core box; every wait ends as soon as its fact holds
STOPPED = 15.0  # the cancelled job's process must be gone well before a renewal (20 min) could do it


@pytest.fixture(scope="module")
def deb_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SystemdRoot]:
    """A booted root with this session's .deb installed by apt, and the demo queue running ``sleep 1000``."""
    with root_with_deb(tmp_path_factory) as root:
        root.run(STEADQ, "init", QUEUE, "--shared", "--shards", "4", user="steadq")
        root.sh(
            f"""
            sed -e 's#^queue: .*#queue: {QUEUE}#' \\
                -e 's#^  command: .*#  command: ["/bin/sleep", "1000"]#' \\
                -e 's#^  concurrency: [0-9]*#  concurrency: 1#' \\
                -e 's#^  lease: [0-9a-z]*#  lease: 1h#' \\
                -e 's#^  kill_grace: [0-9a-z]*#  kill_grace: 2s#' \\
                /usr/share/doc/steadqd/examples/example.yaml > /etc/steadq/queues/demo.yaml
            grep -q '^  command: \\["/bin/sleep", "1000"\\]$' /etc/steadq/queues/demo.yaml
            grep -q '^  lease: 1h' /etc/steadq/queues/demo.yaml
            """
        )
        root.run("systemctl", "enable", "--now", "steadq-worker@demo")
        wait_for(f"{WORKER} active", lambda: _active(root, WORKER) == "active", timeout=DEADLINE)
        yield root


def _active(root: SystemdRoot, unit: str) -> str:
    return root.run("systemctl", "is-active", unit, check=False).stdout.strip()


def _journal(root: SystemdRoot) -> str:
    return root.run("journalctl", "--no-pager", "-u", WORKER, "-o", "cat", check=False).stdout


def _sleeps(root: SystemdRoot) -> list[str]:
    """The PIDs of ``sleep 1000`` processes of the steadq user (the job's command)."""
    return root.run("pgrep", "-u", "steadq", "-x", "-f", "/bin/sleep 1000", check=False).stdout.split()


def test_cancel_of_a_running_sleep_kills_it_keeps_the_unit_and_the_restart_is_not_blocked(
    deb_root: SystemdRoot,
) -> None:
    root = deb_root
    put = root.run(STEADQ, "put", QUEUE, "-", user="steadq", input="x").stdout
    (job_id,) = [line.split()[1] for line in put.splitlines() if line.startswith("job_id: ")]
    try:
        (pid,) = wait_for("its sleep 1000 running", lambda: _sleeps(root), timeout=DEADLINE)  # type: ignore[misc]
    except AssertionError as e:
        raise AssertionError(f"{e}\n{queue_state(root, 'demo')}\n{_journal(root)}") from None
    worker_pid = main_pid(root, WORKER)

    done = root.run(STEADQ, "cancel", QUEUE, job_id[:8], user="steadq", check=False)
    assert (done.returncode, done.stdout.strip()) == (0, f"{job_id} cancelled (was running)"), done.stderr

    wait_for(f"the job's sleep {pid} gone", lambda: not _sleeps(root), timeout=STOPPED)
    assert _active(root, WORKER) == "active" and main_pid(root, WORKER) == worker_pid  # the daemon lives on
    shown = root.run(STEADQ, "show", QUEUE, job_id, user="steadq").stdout
    assert "dead" in shown and "cancelled" in shown, shown
    assert job_id in queue_state(root, "demo")["dead"]
    log = _journal(root)
    assert f"job {job_id[:8]} cancelled: stopping its command" in log, log

    # Nothing runs, nothing is held: a restart of the whole target goes through at once.
    restart = root.run("systemctl", "restart", "steadq.target", timeout=DEADLINE, check=False)
    assert restart.returncode == 0, restart.stderr
    wait_for(f"{WORKER} active again", lambda: _active(root, WORKER) == "active", timeout=DEADLINE)
    assert main_pid(root, WORKER) not in (0, worker_pid)
    assert not _sleeps(root), "the cancelled job was run again"
    assert job_id in queue_state(root, "demo")["dead"]
