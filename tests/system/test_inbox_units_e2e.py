"""Issue 33 #2 under real systemd: `inbox:` added to a running unit's configuration and reloaded.

A folder inside the unit's ReadWritePaths= is watched after `systemctl reload` (a dropped
file becomes a job that runs); one outside them (ProtectSystem=strict makes it read-only
to the unit) leaves the worker running jobs, the reload line says what was not applied,
`systemctl status` says the folder failed, and `check-config --open` (asking systemd,
drop-ins included) names the ReadWritePaths= to add.
"""

from __future__ import annotations

import pytest

from .conftest import init_queue, journal, put, queue_state, queue_yaml, wait_for, write_config
from .sysroot import SystemdRoot

pytestmark = pytest.mark.system


def _inbox(path: str) -> str:
    return f"inbox:\n  path: {path}\n  settle: 200ms\n  payload: content\n  after: delete\n"


def _messages(root: SystemdRoot, unit: str) -> list[str]:
    return [str(e.get("MESSAGE", "")) for e in journal(root, "-u", unit)]


def test_a_reload_adds_a_watch_folder_and_one_outside_the_writable_paths_fails_alone(
    system_root: SystemdRoot,
) -> None:
    root, name = system_root, "ibx"
    unit = f"steadq-worker@{name}.service"
    init_queue(root, name)
    inside, outside = "/var/lib/steadq/drop-ibx", "/srv/drop-ibx"
    for folder in (inside, outside):
        root.run("install", "-d", "-m", "3770", "-o", "steadq", "-g", "steadq", folder)
    try:
        root.run("systemctl", "start", unit)
        wait_for("the worker", lambda: root.run("systemctl", "is-active", unit, check=False).stdout.strip() == "active")

        write_config(root, name, queue_yaml(name) + _inbox(inside))
        root.run("systemctl", "reload", unit)
        wait_for("the reload", lambda: "reloaded configuration" in _messages(root, unit))
        root.run(
            "install", "-m", "0660", "-o", "producer", "-g", "steadq", "/dev/stdin", f"{inside}/a.job", input="ok:ibx"
        )
        enqueued = wait_for(
            "the dropped file enqueued",
            lambda: [m for m in _messages(root, unit) if m.startswith("watch folder: a.job enqueued as job ")],
        )
        job = str(enqueued[0]).split()[-1]  # type: ignore[index]
        wait_for("its job acked", lambda: job in queue_state(root, name)["receipts"])

        write_config(root, name, queue_yaml(name) + _inbox(outside))
        root.run("systemctl", "reload", unit)
        line = wait_for(
            "the reload that could not watch the folder",
            lambda: [m for m in _messages(root, unit) if m.startswith("reloaded configuration except inbox:")],
        )
        assert f"watch folder {outside} not watched" in str(line), line
        assert "Read-only file system" in str(line) and f"ReadWritePaths={outside}" in str(line), line
        assert root.run("systemctl", "is-active", unit, check=False).stdout.strip() == "active"
        status = root.run("systemctl", "show", "-P", "StatusText", unit).stdout
        assert f"inbox: failed: {outside} not watched" in status, status
        other = put(root, name, "ok:still-running")
        wait_for("jobs still run", lambda: other in queue_state(root, name)["receipts"])

        r = root.run("/usr/bin/steadqd", "check-config", "--open", name, check=False)
        assert (
            f"{name}: warning: watch folder (inbox.path) {outside} cannot be written by {unit}: ProtectSystem=strict"
        ) in r.stderr, r.stderr
        assert f"ReadWritePaths={outside}" in r.stderr, r.stderr
    finally:
        root.run(
            "systemctl", "stop", *(f"steadq-{r}@{name}.service" for r in ("worker", "sweeper", "promoter")), check=False
        )
