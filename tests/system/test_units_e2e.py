"""End to end: the shipped units under a real systemd 252 and journald.

What a user does (``systemctl enable --now steadq-worker@demo``, ``steadq
put`` as a member of the steadq group, ``journalctl``, ``systemctl
reload|stop``, ``kill -9``) is done here literally, inside the throwaway root
of ``system_root`` (see conftest.py and sysroot.py). Every wait is a deadline
on an observable fact (a unit state, a line of the job's run log, a journal
entry, a file name in the queue), never a fixed sleep.

The tests share one booted root and the ``demo`` queue; each enqueues its own
jobs and asserts only about them, and leaves the demo worker running.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterator

import pytest

from .conftest import (
    RESULTS,
    VENV,
    events,
    init_queue,
    journal,
    main_pid,
    put,
    queue_state,
    queue_yaml,
    release,
    runs,
    wait_for,
    write_config,
)
from .sysroot import SystemdRoot

pytestmark = pytest.mark.system

DEMO_UNITS = ("steadq-worker@demo.service", "steadq-sweeper@demo.service", "steadq-promoter@demo.service")


def active(root: SystemdRoot, unit: str) -> str:
    return root.run("systemctl", "is-active", unit, check=False).stdout.strip()


def prop(root: SystemdRoot, unit: str, name: str) -> str:
    return root.run("systemctl", "show", "-P", name, unit).stdout.strip()


def ensure_demo(root: SystemdRoot) -> None:
    """The demo worker (and what it pulls in) enabled and running, whatever an earlier test left."""
    root.run("systemctl", "reset-failed", *DEMO_UNITS, check=False)
    r = root.run("systemctl", "enable", "--now", "steadq-worker@demo", check=False)
    if r.returncode != 0:  # say why, from systemd itself: CI logs are all we get there
        status = root.run("systemctl", "status", "--no-pager", "-l", *DEMO_UNITS, check=False).stdout
        journal = root.run("journalctl", "--no-pager", "-n", "60", "-u", "steadq-worker@demo", check=False).stdout
        raise AssertionError(f"enable --now failed ({r.returncode}): {r.stderr}\n{status}\n{journal}")
    for u in DEMO_UNITS:
        wait_for(f"{u} active", lambda u=u: active(root, u) == "active")


def done_once(root: SystemdRoot, queue: str, ids: list[str]) -> None:
    """Every job ran to a receipt and its command completed exactly once."""
    for j in ids:
        wait_for(f"job {j} done", lambda j=j: events(root, j, "done"))
    wait_for(f"receipts for {ids}", lambda: set(ids) <= queue_state(root, queue)["receipts"])
    for j in ids:
        assert len(events(root, j, "done")) == 1, [r for r in runs(root) if r[1] == j]


@pytest.fixture
def demo(system_root: SystemdRoot) -> SystemdRoot:
    ensure_demo(system_root)
    return system_root


@pytest.fixture
def blocker(system_root: SystemdRoot) -> Iterator[Callable[[str], str]]:
    """Names for ``block:NAME`` jobs; all are released at teardown, so a failed
    test never leaves a job that makes later drains wait for the whole window."""
    names: list[str] = []

    def make(prefix: str) -> str:
        names.append(f"{prefix}-{secrets.token_hex(3)}")
        return names[-1]

    yield make
    for n in names:
        release(system_root, n)


def test_enable_now_starts_worker_sweeper_and_promoter(system_root: SystemdRoot) -> None:
    root = system_root
    root.run("systemctl", "enable", "--now", "steadq-worker@demo")
    assert root.run("systemctl", "is-enabled", "steadq-worker@demo").stdout.strip() == "enabled"
    wants = root.run("systemctl", "show", "-P", "Wants", "steadq.target").stdout.split()
    assert "steadq-worker@demo.service" in wants
    for u in DEMO_UNITS:
        wait_for(f"{u} active", lambda u=u: active(root, u) == "active")
        assert prop(root, u, "User") == "steadq"
    # STATUS= from the daemon is shown by `systemctl status` (published at READY and every few seconds).
    status = wait_for(
        "a STATUS= line in systemctl status",
        lambda: re.search(
            r'Status: "(.*)"', root.run("systemctl", "status", "--no-pager", "steadq-worker@demo", check=False).stdout
        ),
    )
    assert "running" in status.group(1) and "ready" in status.group(1), status.group(0)


def test_non_root_producer_cli_and_library_jobs_run_to_receipts(demo: SystemdRoot) -> None:
    root = demo
    assert root.run("id", "-u", "producer").stdout.strip() != "0"
    assert "steadq" in root.run("id", "-nG", "producer").stdout.split()
    ids = [put(root, "demo", f"ok:cli-{i}", "--meta", f"n={i}") for i in range(3)]
    code = (
        "from steadqd import Queue\n"
        "with Queue.open('/var/lib/steadq/demo') as q:\n"
        "    for i in range(2):\n"
        "        print(q.enqueue(b'ok:lib-%d' % i, metadata={'via': 'library'}, producer_id='producer'))\n"
    )
    ids += root.run(f"{VENV}/bin/python3", "-c", code, user="producer").stdout.split()
    assert len(ids) == 5
    done_once(root, "demo", ids)
    for j in ids:
        assert [r[2] for r in events(root, j, "start")] == ["1"]


def test_journal_has_per_job_fields_and_failing_stderr(demo: SystemdRoot) -> None:
    root = demo
    marker = secrets.token_hex(4)
    ok = put(root, "demo", f"ok:{marker}")
    bad = put(root, "demo", f"fail:{marker}")
    wait_for("the good job's receipt", lambda: ok in queue_state(root, "demo")["receipts"])
    wait_for("the failing job in dead/", lambda: bad in queue_state(root, "demo")["dead"])

    by_queue = journal(root, "STEADQ_QUEUE=demo", f"STEADQ_JOB_ID={ok}")
    messages = {e["MESSAGE"] for e in by_queue}
    # the MESSAGE is the story without -o verbose: which job, what happened, how it ended
    assert f"job {ok[:8]} started (attempt 1/3, pid " in " ".join(messages), messages
    finished = next(e for e in by_queue if str(e["MESSAGE"]).startswith(f"job {ok[:8]} finished: ack"))
    assert re.fullmatch(rf"job {ok[:8]} finished: ack \(exit 0, \d+\.\d s, attempt 1/3\)", finished["MESSAGE"])
    assert finished["STEADQ_ROLE"] == "worker"
    assert finished["STEADQ_ATTEMPT"] == "1"
    assert finished["STEADQ_VERDICT"] == "ack"
    assert finished["STEADQ_EXIT_STATUS"] == "0"
    assert finished["_SYSTEMD_UNIT"] == "steadq-worker@demo.service"
    assert finished["SYSLOG_IDENTIFIER"] == "steadqd"
    out = [e for e in by_queue if e.get("STEADQ_STREAM") == "stdout"]
    assert out and f"payload=ok:{marker}" in out[0]["MESSAGE"]

    failing = journal(root, "STEADQ_QUEUE=demo", f"STEADQ_JOB_ID={bad}")
    stderr = [e for e in failing if e.get("STEADQ_STREAM") == "stderr"]
    assert [e["MESSAGE"] for e in stderr] == [f"boom: :{marker}"]
    assert stderr[0]["PRIORITY"] == "4"
    assert any(re.fullmatch(rf"job {bad[:8]} buried: exit \d+ \(.+\)", str(e["MESSAGE"])) for e in failing), failing

    text = root.run("journalctl", "--no-pager", "-u", "steadq-worker@demo", "-o", "cat").stdout
    assert f"boom: :{marker}" in text
    verbose = root.run(
        "journalctl", "--no-pager", "-u", "steadq-worker@demo", "-o", "verbose", f"STEADQ_JOB_ID={ok}"
    ).stdout
    assert f"STEADQ_JOB_ID={ok}" in verbose and "STEADQ_QUEUE=demo" in verbose


def test_kill9_of_worker_mid_job_restarts_it_and_job_completes_once(
    demo: SystemdRoot, blocker: Callable[[str], str]
) -> None:
    root = demo
    name = blocker("k9")
    job = put(root, "demo", f"block:{name}")
    wait_for("attempt 1 running", lambda: events(root, job, "start"))
    pid = main_pid(root, "steadq-worker@demo.service")
    restarts = int(prop(root, "steadq-worker@demo.service", "NRestarts"))
    root.run("kill", "-9", str(pid))
    wait_for(
        "a restarted worker",
        lambda: (
            main_pid(root, "steadq-worker@demo.service") not in (0, pid)
            and active(root, "steadq-worker@demo.service") == "active"
        ),
    )
    assert int(prop(root, "steadq-worker@demo.service", "NRestarts")) == restarts + 1
    # The killed run is gone with the cgroup; the lease expires and the sweeper returns the job.
    wait_for("attempt 2 running", lambda: [r for r in events(root, job, "start") if r[2] == "2"])
    release(root, name)
    done_once(root, "demo", [job])
    assert [r[2] for r in events(root, job, "start")] == ["1", "2"]
    assert [r[2] for r in events(root, job, "done")] == ["2"]
    state = queue_state(root, "demo")
    assert job not in state["ready"] | state["leased"] | state["delayed"] | state["dead"]
    sweeper_log = " ".join(str(e["MESSAGE"]) for e in journal(root, "STEADQ_QUEUE=demo", "STEADQ_ROLE=sweeper"))
    assert sweeper_log  # the sweeper ran passes and logged them


def test_reload_applies_a_changed_concurrency(demo: SystemdRoot, blocker: Callable[[str], str]) -> None:
    root = demo
    write_config(root, "demo", queue_yaml("demo", concurrency=1))
    root.run("systemctl", "reload", "steadq-worker@demo")
    names = [blocker("rl") for _ in range(3)]
    jobs = [put(root, "demo", f"block:{n}") for n in names]
    wait_for("one job running", lambda: sum(bool(events(root, j, "start")) for j in jobs) == 1)
    wait_for("two jobs waiting", lambda: len(set(jobs) & queue_state(root, "demo")["ready"]) == 2)
    assert sum(bool(events(root, j, "start")) for j in jobs) == 1  # concurrency 1 holds
    write_config(root, "demo", queue_yaml("demo", concurrency=3))
    root.run("systemctl", "reload", "steadq-worker@demo")
    wait_for("all three running", lambda: all(events(root, j, "start") for j in jobs))
    for n in names:
        release(root, n)
    done_once(root, "demo", jobs)
    write_config(root, "demo", queue_yaml("demo"))
    root.run("systemctl", "reload", "steadq-worker@demo")


def test_a_reload_with_an_invalid_file_fails_and_keeps_the_running_configuration(demo: SystemdRoot) -> None:
    """Like `nginx -t`: the reload itself fails, the error is in `systemctl status`, nothing is signalled."""
    root = demo
    units = ("steadq-worker@demo.service", "steadq-sweeper@demo.service", "steadq-promoter@demo.service")
    pids = {u: main_pid(root, u) for u in units}
    write_config(root, "demo", queue_yaml("demo").replace("concurrency: 2", "concurrency: [2"))
    try:
        r = root.run("systemctl", "reload", "steadq-worker@demo", check=False)
        assert r.returncode != 0, r
        status = root.run("systemctl", "status", "--no-pager", "-l", "-n", "20", "steadq-worker@demo", check=False)
        assert "demo.yaml" in status.stdout and "check-config" in status.stdout, status.stdout
        for u in units:
            assert active(root, u) == "active" and main_pid(root, u) == pids[u], u
        # no SIGHUP reached the daemon: it never logged a refused reload, and it still runs jobs
        said = " ".join(str(e["MESSAGE"]) for e in journal(root, "STEADQ_QUEUE=demo", "STEADQ_ROLE=worker"))
        assert "reload refused" not in said
        done_once(root, "demo", [put(root, "demo", "ok:after-bad-reload")])
    finally:
        write_config(root, "demo", queue_yaml("demo"))
        root.run("systemctl", "reload", "steadq-worker@demo")


def test_stop_drains_the_running_job(demo: SystemdRoot, blocker: Callable[[str], str]) -> None:
    root = demo
    name = blocker("st")
    job = put(root, "demo", f"block:{name}")
    wait_for("the job running", lambda: events(root, job, "start"))
    root.run("systemctl", "stop", "--no-block", "steadq-worker@demo")
    wait_for("the worker draining", lambda: active(root, "steadq-worker@demo.service") == "deactivating")
    assert not events(root, job, "done")  # the job was not interrupted
    release(root, name)
    wait_for("the worker stopped", lambda: active(root, "steadq-worker@demo.service") == "inactive")
    for u in DEMO_UNITS[1:]:  # PartOf= the worker
        wait_for(f"{u} stopped", lambda u=u: active(root, u) == "inactive")
    assert prop(root, "steadq-worker@demo.service", "Result") == "success"
    done_once(root, "demo", [job])
    assert [r[2] for r in events(root, job, "start")] == ["1"]
    ensure_demo(root)


def test_stop_past_the_drain_window_hands_the_job_back(demo: SystemdRoot, blocker: Callable[[str], str]) -> None:
    """Phase 2 of the stop: the window ends, the second SIGTERM returns the job to the queue."""
    root = demo
    dropin = "/etc/systemd/system/steadq-worker@demo.service.d"
    root.sh(f"mkdir -p {dropin} && printf '[Service]\\nTimeoutStopSec=5s\\n' > {dropin}/stop.conf")
    try:
        root.run("systemctl", "daemon-reload")
        name = blocker("hb")
        job = put(root, "demo", f"block:{name}")
        wait_for("the job running", lambda: events(root, job, "start"))
        root.run("systemctl", "stop", "steadq-worker@demo", timeout=90)
        # systemd reports a stop that overran TimeoutStopSec= as a failure, although
        # the daemon exited 0 after handing the job back.
        assert active(root, "steadq-worker@demo.service") == "failed"
        assert prop(root, "steadq-worker@demo.service", "Result") == "timeout"
        assert prop(root, "steadq-worker@demo.service", "ExecMainStatus") == "0"
        state = queue_state(root, "demo")
        assert job in state["ready"] | state["delayed"], state  # handed back, not lost, not acked
        assert not events(root, job, "done")
        handed = [e for e in journal(root, f"STEADQ_JOB_ID={job}") if "handed back" in str(e["MESSAGE"])]
        assert handed, "no 'job handed back on stop' entry"
    finally:
        root.sh(f"rm -rf {dropin}")
        root.run("systemctl", "daemon-reload")
    release(root, name)
    ensure_demo(root)
    done_once(root, "demo", [job])
    assert [r[2] for r in events(root, job, "start")] == ["1", "2"]


def test_watchdog_restarts_a_frozen_worker(demo: SystemdRoot) -> None:
    root = demo
    dropin = "/etc/systemd/system/steadq-worker@demo.service.d"
    root.sh(f"mkdir -p {dropin} && printf '[Service]\\nWatchdogSec=2s\\n' > {dropin}/watchdog.conf")
    try:
        root.run("systemctl", "daemon-reload")
        root.run("systemctl", "restart", "steadq-worker@demo")
        assert prop(root, "steadq-worker@demo.service", "WatchdogUSec") == "2s"
        pid = main_pid(root, "steadq-worker@demo.service")
        restarts = int(prop(root, "steadq-worker@demo.service", "NRestarts"))
        root.run("kill", "-STOP", str(pid))
        wait_for(
            "the watchdog restart",
            lambda: (
                main_pid(root, "steadq-worker@demo.service") not in (0, pid)
                and active(root, "steadq-worker@demo.service") == "active"
            ),
        )
        assert int(prop(root, "steadq-worker@demo.service", "NRestarts")) == restarts + 1
        log = root.run("journalctl", "--no-pager", "-u", "steadq-worker@demo", "-o", "cat").stdout
        assert "Watchdog timeout" in log
        job = put(root, "demo", "ok:after-watchdog")
        done_once(root, "demo", [job])
    finally:
        root.sh(f"rm -rf {dropin}")
        root.run("systemctl", "daemon-reload")
        root.run("systemctl", "restart", "steadq-worker@demo")


def test_hardening_lets_the_job_write_only_where_the_unit_allows(demo: SystemdRoot) -> None:
    root = demo
    allowed = f"{RESULTS}/hardening-{secrets.token_hex(3)}"
    ok = put(root, "demo", f"write:{allowed}")
    etc = put(root, "demo", "write:/etc/steadq-hardening-probe")
    home = put(root, "demo", "write:/root/steadq-hardening-probe")
    wait_for("the allowed write acked", lambda: ok in queue_state(root, "demo")["receipts"])
    wait_for("the refused writes buried", lambda: {etc, home} <= queue_state(root, "demo")["dead"])
    assert root.run("test", "-e", allowed, check=False).returncode == 0
    assert root.run("test", "-e", "/etc/steadq-hardening-probe", check=False).returncode == 1
    assert root.run("test", "-e", "/root/steadq-hardening-probe", check=False).returncode == 1
    assert [r[3] for r in runs(root) if r[1] == etc and r[3] in ("denied", "wrote")] == ["denied"]
    stderr = [e["MESSAGE"] for e in journal(root, f"STEADQ_JOB_ID={etc}", "STEADQ_STREAM=stderr")]
    assert stderr == ["cannot write /etc/steadq-hardening-probe"]


def test_two_queues_stay_independent_and_steadq_target_starts_both(demo: SystemdRoot) -> None:
    root = demo
    for q in ("a", "b"):
        init_queue(root, q)
        root.run("systemctl", "enable", f"steadq-worker@{q}")
    root.run("systemctl", "start", "steadq.target")
    for q in ("a", "b"):
        for role in ("worker", "sweeper", "promoter"):
            wait_for(f"{role}@{q} active", lambda u=f"steadq-{role}@{q}.service": active(root, u) == "active")
    a_jobs = [put(root, "a", f"ok:a{i}") for i in range(2)]
    b_jobs = [put(root, "b", "ok:b0")]
    done_once(root, "a", a_jobs)
    done_once(root, "b", b_jobs)
    assert {r[0] for r in runs(root) if r[1] in a_jobs} == {"a"}
    assert {r[0] for r in runs(root) if r[1] in b_jobs} == {"b"}
    sa, sb = queue_state(root, "a"), queue_state(root, "b")
    assert not set(b_jobs) & set().union(*sa.values())
    assert not set(a_jobs) & set().union(*sb.values())
    # Stopping one queue leaves the other running.
    root.run("systemctl", "stop", "steadq@a.target")
    wait_for("worker@a stopped", lambda: active(root, "steadq-worker@a.service") == "inactive")
    assert active(root, "steadq-worker@b.service") == "active"
    assert active(root, "steadq-worker@demo.service") == "active"
    # steadq.target stops every queue.
    root.run("systemctl", "stop", "steadq.target")
    for q in ("a", "b", "demo"):
        wait_for(f"worker@{q} stopped", lambda q=q: active(root, f"steadq-worker@{q}.service") == "inactive")
