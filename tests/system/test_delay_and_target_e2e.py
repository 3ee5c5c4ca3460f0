"""Issue 16, points 3 and 8, under real systemd: a 2 s delay runs after 2 s, and
``steadq@QUEUE.target`` is active exactly while the queue's units run.

The delayed job is put about 1 s into a 10 s delayed bucket (the default
width), so its not_before lies about 7 s before the bucket's end: a promoter
that waited for the bucket would run it that much later. Its start is the
"job started" journal entry's own timestamp.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.invariants import check_tree

from .conftest import init_queue, journal, put, queue_yaml, wait_for, write_config
from .sysroot import SystemdRoot

pytestmark = pytest.mark.system

WIDTH_S = 10  # steadq init's default delayed bucket width


def _units(name: str) -> tuple[str, ...]:
    return tuple(f"steadq-{role}@{name}.service" for role in ("worker", "sweeper", "promoter"))


def _active(root: SystemdRoot, unit: str) -> str:
    return root.run("systemctl", "is-active", unit, check=False).stdout.strip()


def test_put_delay_2s_runs_within_2_0_to_2_3_s(system_root: SystemdRoot) -> None:
    root, name = system_root, "delay2s"
    init_queue(root, name)
    try:
        root.run("systemctl", "start", f"steadq-worker@{name}.service")
        wait_for("the worker", lambda: _active(root, f"steadq-worker@{name}.service") == "active")
        while not 0.8 <= time.time() % WIDTH_S <= 1.5:
            time.sleep(0.05)
        job = put(root, name, "ok", "--delay", "2s")
        qpath = root.host_path(f"/var/lib/steadq/{name}")
        obj = check_tree(qpath).get(job)
        assert obj is not None and obj.name.not_before is not None, obj
        put_at = obj.name.not_before / 1e9 - 2.0  # the put's own wall floor, as it stamped the job
        started = wait_for(
            "job started",
            lambda: [
                e
                for e in journal(root, f"STEADQ_JOB_ID={job}")
                if str(e.get("MESSAGE", "")).startswith(f"job {job[:8]} started")
            ],
        )
        ran_after = int(started[0]["__REALTIME_TIMESTAMP"]) / 1e6 - put_at
        assert 2.0 <= ran_after <= 2.3, f"the job delayed by 2 s started {ran_after:.3f} s after the put"
    finally:
        root.run("systemctl", "stop", *_units(name), check=False)


def test_the_queue_target_is_active_while_its_units_run(system_root: SystemdRoot) -> None:
    root, name = system_root, "tgt"
    init_queue(root, name)
    target = f"steadq@{name}.target"
    try:
        assert _active(root, target) == "inactive"
        root.run("systemctl", "enable", "--now", f"steadq-worker@{name}.service")
        wait_for(f"{target} active", lambda: _active(root, target) == "active")
        assert all(_active(root, u) == "active" for u in _units(name))
        root.run("systemctl", "stop", f"steadq-worker@{name}.service")
        # The worker's sweeper and promoter stop with it; then nothing wants the target.
        wait_for(f"{target} inactive", lambda: _active(root, target) == "inactive")
        root.run("systemctl", "start", f"steadq-sweeper@{name}.service")  # one role alone is enough
        wait_for(f"{target} active again", lambda: _active(root, target) == "active")
    finally:
        root.run("systemctl", "disable", "--now", f"steadq-worker@{name}.service", check=False)
        root.run("systemctl", "stop", *_units(name), check=False)


def test_the_worker_writes_its_metrics_textfile_under_the_hardened_unit(system_root: SystemdRoot) -> None:
    """metrics_textfile: as docs/configuration.md tells an operator to set it up, under the real unit."""
    root, name = system_root, "mq"
    init_queue(root, name)
    root.run("install", "-d", "-o", "steadq", "-g", "steadq", "/var/lib/steadq/metrics")
    write_config(root, name, queue_yaml(name) + f"metrics_textfile: /var/lib/steadq/metrics/{name}.prom\n")
    prom = root.host_path(f"/var/lib/steadq/metrics/{name}.worker.prom")
    acked = re.compile(r'^steadqd_jobs_total\{[^}]*state="acked"[^}]*\} (\d+)$', re.M)

    def count() -> int:
        try:
            m = acked.search(open(prom).read())
        except OSError:
            return -1
        return int(m[1]) if m else -1

    try:
        root.run("systemctl", "start", f"steadq-worker@{name}.service")
        wait_for("the worker", lambda: _active(root, f"steadq-worker@{name}.service") == "active")
        for i in range(2):
            put(root, name, f"ok:m{i}")
        wait_for("two acks in the textfile", lambda: count() == 2)
        text = open(prom).read()
        assert "# HELP steadqd_jobs_total" in text and "# TYPE steadqd_jobs_total counter" in text
        assert f'queue="{name}"' in text and 'role="worker"' in text
        assert "steadqd_job_duration_seconds_bucket" in text
    finally:
        root.run("systemctl", "stop", *_units(name), check=False)
