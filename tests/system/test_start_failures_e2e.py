"""An operator's first-hour mistakes under real systemd: one journal line, exit 78, no restart loop.

Issue 16, points 1 and 2: a queue made by root with ``steadq init`` (the
forgotten ``runuser``) and a ``command`` that is not installed. Each must
fail the unit once, with exit status 78 (RestartPreventExitStatus=), one
journal line that names the thing and the fix, no traceback, and, for the
missing command, without leasing the job that waits: its attempt is not
used up.
"""

from __future__ import annotations

import re

import pytest

from tests.invariants import check_tree

from .conftest import init_queue, journal, put, queue_yaml, wait_for, write_config
from .sysroot import SystemdRoot

pytestmark = pytest.mark.system


def _units(name: str) -> tuple[str, ...]:
    return tuple(f"steadq-{role}@{name}.service" for role in ("worker", "sweeper", "promoter"))


def _start_and_fail(root: SystemdRoot, name: str) -> list[str]:
    """Start the worker, wait for it to fail, return the MESSAGEs its process wrote to the journal."""
    unit = f"steadq-worker@{name}.service"
    r = root.run("systemctl", "start", unit, check=False)
    assert r.returncode != 0, "a start that cannot work must fail the unit"
    wait_for(f"{unit} failed", lambda: root.run("systemctl", "is-failed", unit, check=False).stdout.strip() == "failed")
    show = root.run("systemctl", "show", "-P", "ExecMainStatus", unit).stdout.strip()
    assert show == "78", show
    assert root.run("systemctl", "show", "-P", "NRestarts", unit).stdout.strip() == "0"
    return [str(e.get("MESSAGE", "")) for e in journal(root, f"_SYSTEMD_UNIT={unit}")]


def _cleanup(root: SystemdRoot, name: str) -> None:
    root.run("systemctl", "stop", *_units(name), check=False)
    root.run("systemctl", "reset-failed", *_units(name), check=False)


def test_a_queue_made_by_root_fails_once_naming_owner_mode_and_the_fix(system_root: SystemdRoot) -> None:
    root, name = system_root, "rootmade"
    try:
        root.run("/usr/bin/steadq", "init", f"/var/lib/steadq/{name}", "--shards", "4")  # as root: no runuser
        write_config(root, name, queue_yaml(name))
        messages = _start_and_fail(root, name)
        assert len(messages) == 1, messages
        line = messages[0]
        assert line.startswith(f"cannot start: queue /var/lib/steadq/{name} is owner root:"), line
        assert re.search(r", mode [0-7]{4}: user steadq cannot read and write it", line), line
        assert f"runuser -u steadq -- steadq init --shared /var/lib/steadq/{name}" in line, line
        assert not any("Traceback" in m for m in messages)
    finally:
        _cleanup(root, name)


def test_a_missing_command_fails_once_and_leases_nothing(system_root: SystemdRoot) -> None:
    root, name = system_root, "nocmd"
    try:
        init_queue(root, name)
        write_config(root, name, queue_yaml(name).replace("/usr/local/bin/steadq-test-job", "/usr/local/bin/nope"))
        job = put(root, name, "ok:never-run")
        messages = _start_and_fail(root, name)
        assert len(messages) == 1, messages
        assert messages[0].startswith("cannot start: worker.command /usr/local/bin/nope does not exist"), messages
        tree = check_tree(root.host_path(f"/var/lib/steadq/{name}"))
        assert tree.ready == {job} and tree.get(job).attempt == 0, tree  # never leased: no attempt used
        # check-config --open says the same before anything is started, as the service's user.
        r = root.run("/usr/bin/steadqd", "check-config", "--open", name, check=False)
        assert r.returncode == 78 and "/usr/local/bin/nope does not exist" in r.stderr, r
        assert "checked as user steadq" in r.stderr, r.stderr
    finally:
        _cleanup(root, name)
