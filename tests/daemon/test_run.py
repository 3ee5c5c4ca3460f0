"""``steadqd run QUEUE``: worker, sweeper and promoter in one foreground process.

The point of running the three together is that a queue needs nothing else:
a job left leased by a crashed worker comes back (sweeper) and is run, a
delayed job is promoted when due (promoter) and is run, a plain job is run,
each exactly once, and SIGTERM stops all three cleanly. Without a ``worker:``
section there is nothing to run: exit 78 (EX_CONFIG, which the units do not
restart on) with a message saying so.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from steadqd import Queue
from tests.daemon.test_sweeper_promoter import (
    CTIME_SLACK_NS,
    REPO,
    STEADQD,
    daemon_env,
    not_before_of,
    spawn,  # noqa: F401  (fixture)
    wait_until,
    write_config,
)
from tests.invariants import check_tree, live_tree

WIDTH_1S = 10**9


def test_run_without_worker_section_exits_78(tmp_path: Path) -> None:
    qpath = str(tmp_path / "q")
    Queue.init(qpath, shards=4).close()
    cfg = tmp_path / "cfg"
    write_config(cfg, "t", f"queue: {qpath}\nsweeper:\n  interval: 1s\n")
    r = subprocess.run(
        [STEADQD, "--config-dir", str(cfg), "run", "t"],
        capture_output=True,
        text=True,
        timeout=60,
        env=daemon_env(),
        cwd=str(REPO),
    )
    assert r.returncode == 78, (r.stdout, r.stderr)
    assert "no `worker:` section" in r.stderr and "t.yaml" in r.stderr, r.stderr


@pytest.mark.parametrize("case", ["symlinked", "missing", "not a queue"])
def test_a_queue_that_cannot_be_opened_is_a_configuration_failure(tmp_path: Path, case: str) -> None:
    """Issue 15, item 11: a symlinked queue exited 1, which the units restart on, forever.
    Whatever makes the configured queue unusable needs an operator: one line, exit 78."""
    real = tmp_path / "real"
    Queue.init(str(real), shards=4).close()
    qpath = {"symlinked": tmp_path / "link", "missing": tmp_path / "nope", "not a queue": tmp_path / "empty"}[case]
    if case == "symlinked":
        qpath.symlink_to(real)
    elif case == "not a queue":
        qpath.mkdir()
    cfg = tmp_path / "cfg"
    write_config(cfg, "t", f'queue: {qpath}\nworker:\n  command: ["/bin/true"]\n')
    r = subprocess.run(
        [STEADQD, "--config-dir", str(cfg), "run", "t"],
        capture_output=True,
        text=True,
        timeout=60,
        env=daemon_env(),
        cwd=str(REPO),
    )
    assert r.returncode == 78, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot start: " in lines[0] and str(qpath) in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_run_reaps_promotes_and_runs_each_job_once(tmp_path: Path, spawn) -> None:  # noqa: F811
    qpath = str(tmp_path / "q")
    out = tmp_path / "out"
    out.mkdir()
    cfg = tmp_path / "cfg"
    write_config(
        cfg,
        "t",
        f"""queue: {qpath}
worker:
  command: ["/bin/sh", "-c", "cat >> {out}/$STEADQ_JOB_ID"]
  concurrency: 2
  lease: 30s
sweeper:
  interval: 1s
promoter:
  max_sleep: 60s
""",
    )
    with Queue.init(qpath, shards=4, delayed_width_ns=WIDTH_1S) as q:
        crashed = q.enqueue(b"left leased by a crashed worker")
        held = q.lease(duration=1.0)  # never settled: only the sweeper can bring it back
        assert held is not None and held.job_id == crashed
        plain = q.enqueue(b"plain")
        delayed = q.enqueue(b"delayed", delay=2.0)
        nb = not_before_of(q, delayed)
        payloads = {crashed: b"left leased by a crashed worker", plain: b"plain", delayed: b"delayed"}

        d = spawn(cfg, "run", "t")
        line = d.wait_for("started")
        assert "worker,sweeper,promoter" in line, line
        wait_until(
            lambda: live_tree(qpath).receipts == set(payloads),
            30,
            "every job to be run and acknowledged",
            step=0.1,
        )
        assert d.stop() == 0, d.output()
    ts = check_tree(qpath)
    assert ts.receipts == set(payloads) and not (ts.ready | ts.leased | ts.delayed | ts.dead), ts.objects
    for job_id, payload in payloads.items():
        # Each command ran exactly once (it appends): no double run, no lost job.
        assert (out / job_id).read_bytes() == payload, job_id
    # The crashed worker's job was reaped by the sweeper (not waited out by anyone else).
    assert "STEADQ_REAPED=1" in d.output(), d.output()
    # The delayed job was promoted (by the promoter or a sweeper pass), and its
    # command cannot have run before the job's not_before.
    assert "STEADQ_PROMOTED=1" in d.output(), d.output()
    assert (out / delayed).stat().st_mtime_ns >= nb - CTIME_SLACK_NS
    assert "Traceback" not in d.output(), d.output()
