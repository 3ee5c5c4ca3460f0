"""The operator's first hour (issue 33, points 1, 3, 4 and 5) with the .deb, under real systemd.

What an administrator does on a fresh machine, as root throughout: ``apt-get install`` the
package, ``steadq init`` a queue, write its configuration, enable its worker, produce with
``steadq put`` by the queue's name, and look at what happened with ``steadq stats``/``show``/
``doctor`` and ``journalctl``. Each step is a claim issue 33 made about that hour:

* #1 a queue made by root fails its unit once with the fix; once fixed, root's own ``steadq put``
  gives each job to the queue's owner (steadq), so the unit's worker runs it;
* #3 a foreground ``steadqd run`` beside the active unit is refused, exit 75, naming the unit;
* #4 ``steadq`` commands take the configured queue's name;
* #5 the short id the journal shows finds the job in ``steadq show``, and the journal's
  ``STEADQ_JOB_ID`` field carries the full id.

One root, booted once for the module with the first .deb of tests/package_builds (the same build
test_packages_e2e.py installs; the harness's own throwaway root, never the host's systemd).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator

import pytest

from .conftest import journal, queue_state, wait_for
from .sysroot import SystemdRoot
from .test_packages_e2e import _active, root_with_deb

pytestmark = [pytest.mark.system, pytest.mark.packaging]

NAME = "transcode"
QUEUE = f"/var/lib/steadq/{NAME}"
WORKER = f"steadq-worker@{NAME}.service"
JOB = "/usr/local/bin/transcode-job"
# The job says who ran it: the journal line shows the unit's user ran root's job.
JOB_SCRIPT = """#!/bin/sh
payload=$(cat)
echo "transcoded $payload as $(id -un)"
"""
CONFIG = f"""queue: {QUEUE}
worker:
  command: ["{JOB}"]
  concurrency: 1
"""
DEADLINE = 60.0


@pytest.fixture(scope="module")
def deb_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SystemdRoot]:
    """A booted root with the package installed by apt-get (offline) and nothing else."""
    with root_with_deb(tmp_path_factory) as root:
        wait_for("steadq.target active", lambda: _active(root, "steadq.target") == "active")
        yield root


def _messages(root: SystemdRoot, *matches: str) -> list[str]:
    return [str(e.get("MESSAGE", "")) for e in journal(root, *matches)]


def test_the_first_hour_as_root(deb_root: SystemdRoot) -> None:
    root = deb_root
    root.run("install", "-m", "0755", "/dev/stdin", JOB, input=JOB_SCRIPT)
    root.run("install", "-m", "0644", "/dev/stdin", f"/etc/steadq/queues/{NAME}.yaml", input=CONFIG)

    # -- #1: root makes the queue (no runuser): the unit fails once and names the fix ----------------
    root.run("steadq", "init", QUEUE)
    r = root.run("systemctl", "enable", "--now", WORKER, check=False)
    wait_for(
        f"{WORKER} failed", lambda: root.run("systemctl", "is-failed", WORKER, check=False).stdout.strip() == "failed"
    )
    assert root.run("systemctl", "show", "-P", "ExecMainStatus", WORKER).stdout.strip() == "78", r
    (line,) = _messages(root, f"_SYSTEMD_UNIT={WORKER}")
    assert line.startswith(f"cannot start: queue {QUEUE} is owner root:"), line
    fix = f"chown -R steadq: {QUEUE}"
    assert fix in line, line
    root.run(*fix.split())  # the fix as the line gives it
    root.run("systemctl", "reset-failed", WORKER)
    root.run("systemctl", "restart", WORKER)
    wait_for(f"{WORKER} active", lambda: _active(root, WORKER) == "active")
    root.run("steadqd", "check-config", "--open", NAME)  # as the service's user: passes now

    # root produces by the queue's name (#4): the job is steadq's, and the unit runs it
    out = root.run("steadq", "put", NAME, "-", input="clip-1").stdout
    m = re.search(r"^job_id: ([0-9a-f]{32})$", out, re.M)
    assert m, out
    job = m[1]
    wait_for("the job's receipt", lambda: job in queue_state(root, NAME)["receipts"], timeout=DEADLINE)
    (receipt,) = glob.glob(os.path.join(root.host_path(QUEUE), "receipts", "*", "*", f"{job}.*"))
    steadq_uid = int(root.run("id", "-u", "steadq").stdout)
    assert os.stat(receipt).st_uid == steadq_uid, f"root's job is not steadq's: {os.stat(receipt)}"
    ran = _messages(root, f"_SYSTEMD_UNIT={WORKER}", f"STEADQ_JOB_ID={job}")
    assert "transcoded clip-1 as steadq" in ran, ran
    doctor = root.run("steadq", "doctor", NAME, check=False)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    # The .deb carries the compiled spawn (issue 35): the installed worker starts a job with one exec.
    assert "  job_spawn: compiled (" in doctor.stderr, doctor.stderr

    # -- #3: a foreground run beside the active unit is refused, naming the unit ---------------------
    # (`timeout`: a run that is not refused would otherwise run on; it would exit 124, not 75)
    r = root.run("timeout", "30", "steadqd", "run", NAME, check=False, timeout=60)
    assert r.returncode == 75, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"the worker of queue {QUEUE} already runs on this host ({WORKER}, pid " in lines[0], lines[0]
    assert f"systemctl stop {WORKER} before running another" in lines[0], lines[0]
    assert _active(root, WORKER) == "active"

    # -- #4: stats by the configured name ------------------------------------------------------------
    stats = root.run("steadq", "stats", NAME).stdout
    assert re.search(r"^receipts: 1\b", stats, re.M) and re.search(r"^ready: 0\b", stats, re.M), stats

    # -- #5: the short id the journal shows finds the job; the journal carries the full id ------------
    text = root.run("journalctl", "--no-pager", "-u", WORKER).stdout
    shorts = re.findall(r"job ([0-9a-f]{8}) started", text)
    assert shorts == [job[:8]], text
    show = root.run("steadq", "show", NAME, shorts[0])
    assert job in show.stdout, show.stdout
    by_id = journal(root, f"STEADQ_JOB_ID={job}")
    assert by_id and all(e.get("STEADQ_JOB_ID") == job for e in by_id), by_id
    assert any(str(e.get("MESSAGE", "")).startswith(f"job {shorts[0]} started") for e in by_id), by_id
