"""Notification commands (issue 32 #6): ``worker.on_bury`` / ``on_retry`` run once per buried / retried
job with the job's environment, the reason, the exit status and the last stderr lines in a file; a
hanging one is killed at ``notify_timeout`` and never changes the job."""

from __future__ import annotations

import json
import os
import sys

from steadqd import Queue
from tests.daemon.conftest import Env, job_spec, wait_for
from tests.invariants import check_tree, live_tree

RECORD = r"""
import json, os, sys
env = dict(os.environ)
with open(env["STEADQ_STDERR_FILE"], "rb") as f:
    env["stderr file"] = f.read().decode("latin-1")
out = os.path.join(sys.argv[1], f"{sys.argv[2]}-{env['STEADQ_JOB_ID']}-{os.getpid()}.json")
with open(out + ".tmp", "w") as f:
    json.dump(env, f)
os.rename(out + ".tmp", out)
"""


def notes(env: Env, which: str, job: str) -> list[dict[str, str]]:
    return [json.loads(p.read_text()) for p in env.results.glob(f"{which}-{job}-*.json")]


def test_on_bury_and_on_retry_run_once_with_the_job_s_environment(denv: Env, daemons) -> None:
    record = denv.tmp / "record.py"
    record.write_text(RECORD)
    denv.write_config(
        concurrency=2,
        environment={"NTFY_TOPIC": "jobs"},
        on_bury=[sys.executable, str(record), str(denv.results), "bury"],
        on_retry=[sys.executable, str(record), str(denv.results), "retry"],
    )
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        ok = q.enqueue(job_spec(exit=0))
        rejected = q.enqueue(
            job_spec(exit=100, stderr=[f"line {i}" for i in range(30)] + ["\x1b[31mboom"]), metadata={"who": "ci"}
        )
        flaky = q.enqueue(job_spec(exit={"1": 75, "2": 0}))
    d.ready()
    d.wait_log(rf"on_bury for job {rejected[:8]} exited 0")
    d.wait_log(rf"on_retry for job {flaky[:8]} exited 0")
    wait_for(lambda: ok in live_tree(denv.queue_path).receipts, what="ok acked")
    assert not notes(denv, "bury", ok) and not notes(denv, "retry", ok)
    assert not notes(denv, "bury", flaky)
    (buried,) = notes(denv, "bury", rejected)  # once
    (retried,) = notes(denv, "retry", flaky)
    assert buried["STEADQ_JOB_ID"] == rejected and buried["STEADQ_META_WHO"] == "ci"
    assert buried["NTFY_TOPIC"] == "jobs" and "SECRET" not in buried  # the job's environment, nothing more
    assert buried["STEADQ_REASON"] == "consumer_rejected" and buried["STEADQ_EXIT_STATUS"] == "100"
    tail = buried["stderr file"].splitlines()
    assert tail[-1] == "\x1b[31mboom" and tail[0] == "line 11" and len(tail) == 20  # the last 20 lines, raw
    assert not os.path.exists(buried["STEADQ_STDERR_FILE"])  # removed once the command ended
    assert retried["STEADQ_REASON"] == "retry" and retried["STEADQ_EXIT_STATUS"] == "75"
    assert retried["STEADQ_ATTEMPT"] == "1"


def test_a_hanging_on_bury_is_killed_at_its_timeout_and_the_job_stays_dead(denv: Env, daemons) -> None:
    pidfile = denv.tmp / "hook.pid"
    denv.write_config(on_bury=["/bin/sh", "-c", f"echo $$ > {pidfile}; exec sleep 1000"], notify_timeout="1s")
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        job = q.enqueue(job_spec(exit=100))
        after = q.enqueue(job_spec(exit=0))
    d.ready()
    d.wait_log(rf"on_bury for job {job[:8]} killed at its 1s timeout")
    pid = int(pidfile.read_text())
    wait_for(lambda: not _alive(pid), what="the hanging notification command to be gone")
    wait_for(lambda: after in live_tree(denv.queue_path).receipts, what="the next job to run")
    tree = check_tree(denv.queue_path)
    assert tree.dead == {job}
    assert "Traceback" not in d.log()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_a_failing_or_crashing_notification_is_logged_and_changes_no_job(denv: Env, daemons) -> None:
    """An ``on_bury`` that exits non-zero and an ``on_retry`` that dies of a signal are each logged once
    as failed, with the job unchanged: the buried job stays dead (not retried, not notified again),
    the retried one runs its next attempt and is acked, and the worker goes on to the next job."""
    denv.write_config(
        concurrency=2,
        on_bury=["/bin/sh", "-c", "echo 'no route to the pager' >&2; exit 3"],
        on_retry=["/bin/sh", "-c", "kill -SEGV $$"],
        retry={"backoff_base": "1ms", "backoff_max": "10ms", "jitter": False},
    )
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        rejected = q.enqueue(job_spec(exit=100))
        flaky = q.enqueue(job_spec(exit={"1": 75, "2": 0}))
    d.ready()
    d.wait_log(rf"on_bury for job {rejected[:8]} failed: exited 3 \(the job is not changed\)")
    d.wait_log(rf"on_retry for job {flaky[:8]} failed: killed by signal 11 \(the job is not changed\)")
    with Queue.open(denv.queue_path) as q:  # the backed-off retry is promoted by recovery (another role)
        wait_for(lambda: q.recover() and flaky in live_tree(denv.queue_path).receipts, what="the second attempt acked")
        after = q.enqueue(job_spec(exit=0))
    wait_for(lambda: after in live_tree(denv.queue_path).receipts, what="the next job to run")
    tree = check_tree(denv.queue_path)
    assert tree.dead == {rejected} and tree.receipts == {flaky, after}
    assert denv.results_of(rejected).keys() == {1}  # never run again
    log = d.log()
    assert log.count(f"on_bury for job {rejected[:8]}") == 1 and log.count(f"on_retry for job {flaky[:8]}") == 1
    assert "Traceback" not in log
