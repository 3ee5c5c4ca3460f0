"""Slots, progress and the bury notification under real systemd, with the .deb (issue 32 #3, #4, #6).

The queue an administrator with two GPUs writes: ``concurrency: 2``, ``slots: ["gpu0", "gpu1"]``
and ``on_bury:`` a script. Its job command reports ``50 halfway`` through ``$STEADQ_PROGRESS``,
records ``$STEADQ_SLOT $STEADQ_SLOT_VALUE``, then either waits for a release file or exits with
the bury status, as its payload says. Under the packaged units (their ``ReadWritePaths=``,
tmpfiles.d and hardening, nothing added) it checks:

* two jobs running at once hold different slots, each with its mapped value;
* ``steadq show QUEUE JOB`` by a member of the steadq group shows ``50% halfway`` while the job
  runs: the worker publishes under /run/steadq/progress, which the unit may write;
* a job that exits with the bury status runs ``on_bury`` once, inside the worker's unit, with
  ``STEADQ_REASON``, ``STEADQ_EXIT_STATUS`` and the job's stderr lines;
* ``steadq-worker@QUEUE`` stays active with the same MainPID throughout.

One root, booted once for the module with the first .deb of tests/package_builds (the build
test_packages_e2e.py installs; the harness's own throwaway root, never the host's systemd).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import journal, main_pid, queue_state, wait_for
from .sysroot import SystemdRoot
from .test_packages_e2e import _active, root_with_deb

pytestmark = [pytest.mark.system, pytest.mark.packaging]

NAME = "render"
QUEUE = f"/var/lib/steadq/{NAME}"
WORKER = f"steadq-worker@{NAME}.service"
RESULTS = "/var/lib/steadq/results"
JOB = "/usr/local/bin/render-job"
NOTIFY = "/usr/local/bin/render-buried"
DEADLINE = 90.0  # generous for a loaded 2-core box; every wait ends as soon as its fact holds

# The job: progress first, then its slot, then what the payload says.
#   block:NAME  wait until $RESULTS/release-NAME exists (bounded), exit 0
#   fail:TEXT   two stderr lines, exit 100 (bury)
JOB_SCRIPT = rf"""#!/bin/sh
set -u
R={RESULTS}
payload=$(cat)
echo "50 halfway" > "$STEADQ_PROGRESS"
echo "$STEADQ_JOB_ID $STEADQ_SLOT $STEADQ_SLOT_VALUE" >> "$R/slots.log"
case "$payload" in
  fail:*)
    echo "boom: ${{payload#fail:}}" >&2
    echo "second stderr line" >&2
    exit 100 ;;
  block:*)
    i=0
    while [ ! -e "$R/release-${{payload#block:}}" ]; do
      sleep 0.1
      i=$((i + 1))
      [ "$i" -lt 1200 ] || exit 75
    done ;;
esac
"""
# The notification: what it was given, its cgroup (the unit it runs in), the job's stderr tail;
# one file per run (a second run for the same job would make a second file).
NOTIFY_SCRIPT = rf"""#!/bin/sh
set -u
out={RESULTS}/buried-$STEADQ_JOB_ID-$$
{{
  echo "reason=$STEADQ_REASON exit=$STEADQ_EXIT_STATUS"
  echo "cgroup=$(sed -n 's/^0:://p' /proc/self/cgroup)"  # the unified (cgroup2) hierarchy's line
  cat "$STEADQ_STDERR_FILE"
}} > "$out.tmp"
mv "$out.tmp" "$out"
"""
CONFIG = f"""queue: {QUEUE}
worker:
  command: ["{JOB}"]
  concurrency: 2
  slots: ["gpu0", "gpu1"]
  on_bury: ["{NOTIFY}"]
  notify_timeout: 20s
  lease: 30s
  exit_status:
    ack: [0]
    retry: [75]
    bury: [100]
"""


@pytest.fixture(scope="module")
def deb_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SystemdRoot]:
    """A booted root with the .deb installed by apt-get, the render queue configured and its worker enabled."""
    with root_with_deb(tmp_path_factory) as root:
        root.run("install", "-m", "0755", "/dev/stdin", JOB, input=JOB_SCRIPT)
        root.run("install", "-m", "0755", "/dev/stdin", NOTIFY, input=NOTIFY_SCRIPT)
        root.run("install", "-d", "-m", "2770", "-o", "steadq", "-g", "steadq", RESULTS)
        # A producer that is not steadq, only a member of its group.
        root.run("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--groups", "steadq", "producer")
        root.run("steadq", "init", QUEUE, "--shared", "--shards", "4", user="steadq")
        root.run("install", "-m", "0644", "/dev/stdin", f"/etc/steadq/queues/{NAME}.yaml", input=CONFIG)
        root.run("systemctl", "enable", "--now", WORKER)
        wait_for(f"{WORKER} active", lambda: _active(root, WORKER) == "active", timeout=DEADLINE)
        yield root


def _put(root: SystemdRoot, payload: str) -> str:
    out = root.run("steadq", "put", NAME, "-", user="producer", input=payload).stdout
    m = re.search(r"^job_id: ([0-9a-f]{32})$", out, re.M)
    assert m, out
    return m[1]


def _slots(root: SystemdRoot) -> dict[str, tuple[str, ...]]:
    """job id -> (slot, slot value) as the jobs recorded them (host view of the spool)."""
    try:
        text = Path(root.host_path(f"{RESULTS}/slots.log")).read_text()
    except FileNotFoundError:
        return {}
    return {f[0]: tuple(f[1:]) for f in (line.split() for line in text.splitlines()) if f}


def _buried(root: SystemdRoot, job: str = "") -> list[Path]:
    """The notification's finished output files (of ``job``, or all)."""
    every = Path(root.host_path(RESULTS)).glob("buried-*")
    return sorted(p for p in every if not p.name.endswith(".tmp") and (not job or p.name.startswith(f"buried-{job}-")))


def _worker_log(root: SystemdRoot) -> str:
    return root.run("journalctl", "--no-pager", "-u", WORKER, "-o", "cat", check=False).stdout


def test_slots_progress_and_on_bury_under_the_packaged_unit(deb_root: SystemdRoot) -> None:
    root = deb_root
    pid = main_pid(root, WORKER)
    assert pid > 0

    def still_up(when: str) -> None:
        assert _active(root, WORKER) == "active", f"{WORKER} not active {when}:\n{_worker_log(root)}"
        assert main_pid(root, WORKER) == pid, f"{WORKER} restarted {when}:\n{_worker_log(root)}"

    # -- the bury notification: once, inside the unit, with reason, status and stderr ----------------
    failing = _put(root, "fail:no GPU memory")
    try:
        (note,) = wait_for("the on_bury output", lambda: _buried(root, failing), timeout=DEADLINE)  # type: ignore[misc]
    except AssertionError as e:
        raise AssertionError(f"{e}\n{queue_state(root, NAME)}\n{_worker_log(root)}") from None
    lines = note.read_text().splitlines()
    assert lines[0] == "reason=consumer_rejected exit=100", lines
    assert lines[1].startswith("cgroup=") and lines[1].endswith(f"/{WORKER}"), lines  # inside the unit
    assert lines[2:] == ["boom: no GPU memory", "second stderr line"], lines
    assert failing in queue_state(root, NAME)["dead"]
    wait_for(
        "the journal's on_bury line",
        lambda: f"on_bury for job {failing[:8]} exited 0" in _worker_log(root),
        timeout=DEADLINE,
    )
    still_up("after the bury")

    # -- two at once: different slots, each with its value; progress shown while they run ------------
    blocked = {"a": _put(root, "block:a"), "b": _put(root, "block:b")}
    try:
        wait_for("both jobs recording their slot", lambda: set(blocked.values()) <= set(_slots(root)), timeout=DEADLINE)
        slots = _slots(root)
        got = sorted(slots[j] for j in blocked.values())
        assert got == [("0", "gpu0"), ("1", "gpu1")], slots
        assert set(blocked.values()) <= queue_state(root, NAME)["leased"]  # both still running

        for job in blocked.values():

            def shown(job: str = job) -> str:
                out = root.run("steadq", "show", NAME, job, user="producer").stdout
                return out if "50% halfway" in out else ""

            # the worker reads a job's file at most once a second: bounded wait, not a sleep
            show = str(wait_for(f"steadq show {job[:8]} to show the progress", shown, timeout=DEADLINE))
            assert re.search(r"^\s*progress:\s+50% halfway$", show, re.M), show
        still_up("while the jobs run")
    finally:
        for name in blocked:
            root.run("touch", f"{RESULTS}/release-{name}", user="steadq", check=False)
    wait_for(
        "both blocked jobs acked",
        lambda: set(blocked.values()) <= queue_state(root, NAME)["receipts"],
        timeout=DEADLINE,
    )
    # Their progress is gone with them: nothing published for a finished job.
    gone = root.run("steadq", "show", NAME, blocked["a"], user="producer").stdout
    assert "halfway" not in gone, gone

    # -- afterwards: the notification ran exactly once, the unit never restarted ---------------------
    assert len(_buried(root, failing)) == 1, _buried(root, failing)
    assert _buried(root) == _buried(root, failing), "on_bury ran for a job that was not buried"
    log = _worker_log(root)
    assert log.count(f"on_bury for job {failing[:8]}") == 1, log
    assert "job progress is not published" not in log and "progress file of job" not in log, log
    by_job = journal(root, f"_SYSTEMD_UNIT={WORKER}", f"STEADQ_JOB_ID={failing}")
    assert any(str(e.get("MESSAGE", "")).startswith(f"job {failing[:8]} buried: exit 100") for e in by_job), by_job
    still_up("at the end")
    assert root.run("systemctl", "show", "-P", "NRestarts", WORKER).stdout.strip() == "0"
