"""`steadqd demo` end to end: the README's "run" command must show the real product.

The demo is run exactly as a user runs it (the ``steadqd`` console script, a
subprocess, its own daemon and producer subprocesses), on a small number of
jobs. What is asserted is what the demo claims: its summary numbers, which
must match the job plan *and* the tree read independently afterwards
(``tests.invariants.check_tree`` and ``Queue.stats``), and that the
daemon's own log lines reached the output and ``daemon.log``. A second run
on the same directory must reuse the queue and report only what it added.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.demo.daemon_log import LogLine, Tally
from steadqd.demo.job import EXIT_ACK, EXIT_BAD_INPUT, EXIT_BURY, EXIT_RETRY, run
from steadqd.demo.plan import job_delay, job_kind, payload, plan_counts
from tests.invariants import check_tree

STEADQD = os.path.join(os.path.dirname(sys.executable), "steadqd")
TIMEOUT = 150  # s; the demo itself gives up after 120 s of not settling
SUMMARY = re.compile(
    r"^summary: (?P<acked>\d+) acked, (?P<retried>\d+) retried, (?P<buried>\d+) buried, "
    r"(?P<quarantined>\d+) quarantined in [\d.]+s \([\d.]+ jobs/s\)$",
    re.M,
)


def run_demo(path: Path, jobs: int) -> subprocess.CompletedProcess[str]:
    cmd = [STEADQD] if os.access(STEADQD, os.X_OK) else [sys.executable, "-m", "steadqd.daemon.main"]
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM")}
    return subprocess.run(
        [*cmd, "demo", "--path", str(path), "--jobs", str(jobs)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
        check=False,
    )


def summary(out: str) -> dict[str, int]:
    m = SUMMARY.search(out)
    assert m is not None, f"no summary line in:\n{out}"
    return {k: int(v) for k, v in m.groupdict().items()}


# --- the pieces, without processes -------------------------------------------------


def test_plan_has_every_kind_and_payloads_say_their_kind():
    c = plan_counts(60)
    assert (c["plain"], c["flaky"], c["poison"], c["delayed"]) == (52, 6, 2, 1)
    assert c["plain"] + c["flaky"] + c["poison"] == 60
    assert job_kind(7) == "poison" and job_kind(3) == "flaky" and job_kind(0) == "plain"
    assert job_delay(25) > 0 and job_delay(24) == 0
    assert json.loads(payload(3)) == {"frame": 3, "kind": "flaky"}


@pytest.mark.parametrize(
    ("kind", "attempt", "code"),
    [
        ("plain", "1", EXIT_ACK),
        ("flaky", "1", EXIT_RETRY),
        ("flaky", "2", EXIT_ACK),
        ("poison", "1", EXIT_BURY),
        ("poison", "3", EXIT_BURY),
    ],
)
def test_demo_job_exit_status_follows_kind_and_attempt(kind, attempt, code, capsys):
    body = json.dumps({"frame": 5, "kind": kind}).encode()
    assert run(body, {"STEADQ_JOB_ID": "ab" * 16, "STEADQ_ATTEMPT": attempt}) == code
    out = capsys.readouterr()
    assert (out.out if code == EXIT_ACK else out.err).startswith("demo-job abababababab: frame 5")


def test_demo_job_rejects_foreign_payload(capsys):
    assert run(b"not json", {}) == EXIT_BAD_INPUT
    assert "not a demo payload" in capsys.readouterr().err


def test_log_line_parsing_and_shortening():
    raw = "<4>run[demo]: job c3887e45 buried: exit 100 (reason 0x0100) STEADQ_ATTEMPT=1 STEADQ_JOB_ID=c3887e457c6fa88d90b0ae366145af22 STEADQ_REASON=0x0100"
    line = LogLine.parse(raw)
    assert line.priority == 4 and line.message == "job c3887e45 buried: exit 100 (reason 0x0100)"
    assert line.fields["STEADQ_JOB_ID"] == "c3887e457c6fa88d90b0ae366145af22"
    assert (
        line.short()
        == "<4>run[demo]: job c3887e45 buried: exit 100 (reason 0x0100) ATTEMPT=1 JOB_ID=c3887e457c6f… REASON=0x0100"
    )
    quoted = LogLine.parse("<5>run[demo]: started STEADQ_PATH=/q STEADQ_ROLES='worker,sweeper,promoter'")
    assert quoted.message == "started" and quoted.fields["STEADQ_ROLES"] == "worker,sweeper,promoter"
    trace = LogLine.parse("Traceback (most recent call last):")
    assert trace.priority == 3 and trace.short() == trace.raw
    t = Tally()
    assert t.feed(line) and t.buried == 1
    assert t.feed(LogLine.parse("<6>run[demo]: job 0000000x retried: delayed STEADQ_JOB_ID=x STEADQ_STATE=delayed"))
    assert t.retried == 1
    assert not t.feed(LogLine.parse("<6>run[demo]: job 0000000x started (attempt 1/3, pid 7) STEADQ_JOB_ID=x"))
    assert t.lines == 3


# --- the real thing ------------------------------------------------------------------


def test_demo_runs_the_daemon_and_settles_every_job(tmp_path):
    base = tmp_path / "demo"
    jobs = 60
    plan = plan_counts(jobs)
    r = run_demo(base, jobs)
    out = r.stdout
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{out}\nstderr:\n{r.stderr}"

    # The summary: every plain and flaky job acked, every poison job buried,
    # every flaky job retried exactly once, nothing quarantined.
    s = summary(out)
    assert s == {
        "acked": plan["plain"] + plan["flaky"],
        "retried": plan["flaky"],
        "buried": plan["poison"],
        "quarantined": 0,
    }
    assert "PROBLEM" not in out
    assert "daemon exited with status 0" in out

    # The tree agrees, read independently of the demo.
    qpath = base / "queue"
    state = check_tree(qpath, allow_temps=False, allow_quarantine=False)
    assert len(state.receipts) == s["acked"]
    assert len(state.dead) == s["buried"]
    assert not state.ready and not state.leased and not state.delayed
    for job_id in state.dead:
        obj = state.get(job_id)
        assert obj is not None and obj.name.reason == 0x0100  # the demo's bury_reason
    with Queue.open(qpath) as q:
        st = q.stats()
        assert st["receipts"].objects == s["acked"] and st["dead"].objects == s["buried"]
        assert st["ready"].objects == st["leased"].objects == st["delayed"].objects == 0

    # The daemon really ran: its log lines reached the output (shortened) and
    # daemon.log (verbatim), with the journal-style fields.
    assert "daemon| <5>run[demo]: started" in out
    assert "daemon| <5>run[demo]: stopping: draining" in out and "daemon| <5>run[demo]: stopped" in out
    assert len(re.findall(r"run\[demo\]: job \w+ buried: ", out)) == plan["poison"]
    assert len(re.findall(r"run\[demo\]: job \w+ retried: delayed", out)) == plan["flaky"]
    assert "run[demo]: promoted " in out
    log = (base / "daemon.log").read_text()
    assert (
        len(re.findall(r"^<\d>run\[demo\]: job \w+ finished: ack \(exit 0, .*STEADQ_VERDICT=ack", log, re.M))
        == s["acked"]
    )
    assert (
        len(re.findall(r"^<\d>run\[demo\]: job \w+ finished: bury \(exit 100, .*STEADQ_EXIT_STATUS=100", log, re.M))
        == plan["poison"]
    )
    assert re.search(r"^<6>run\[demo\]: demo-job [0-9a-f]{12}: frame \d+ .*STEADQ_STREAM=stdout", log, re.M)
    # The producer used both paths: `steadq put` and the library.
    assert out.count("producer: $ ") == 5 and f"enqueued {jobs - 5} jobs with the library" in out
    # The config the demo wrote is a valid daemon config.
    check = subprocess.run(
        [sys.executable, "-m", "steadqd.daemon.main", "--config-dir", str(base / "etc"), "check-config", "demo"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr

    # A second run reuses the queue and reports only what it added.
    again = run_demo(base, 10)
    assert again.returncode == 0, f"exit {again.returncode}\n{again.stdout}\n{again.stderr}"
    assert "reusing queue" in again.stdout
    plan2 = plan_counts(10)
    s2 = summary(again.stdout)
    assert (s2["acked"], s2["buried"], s2["retried"]) == (
        plan2["plain"] + plan2["flaky"],
        plan2["poison"],
        plan2["flaky"],
    )
    state = check_tree(qpath, allow_temps=False, allow_quarantine=False)
    assert len(state.receipts) == s["acked"] + s2["acked"]
    assert len(state.dead) == s["buried"] + s2["buried"]
