"""Issue 33 #5: the short ids the journal shows are accepted wherever a job id is.

The journal says ``job fed535fe finished``; ``steadq show Q fed535fe`` and ``steadq admin
requeue Q 74c0e8f4`` once answered "expected 32 lowercase hex chars". A unique prefix of
at least 6 hex characters now names the job, found among the states the command acts on,
on both backends; an ambiguous one lists the candidates (exit 1), none found is "not found".
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.cli.main import main
from steadqd.s3.backend import BucketBackend
from steadqd.s3.layout import init_layout
from steadqd.s3.store.memory import ManualClock, MemoryStore

from .helpers import steadq

TWIN_A = "abcdef01" + "1" * 24
TWIN_B = "abcdef02" + "2" * 24


def _dead(q: Queue | BucketBackend, payload: bytes = b"poison") -> str:
    job = q.enqueue(payload, max_attempts=1)
    lease = q.lease()
    assert lease is not None and lease.job_id == job
    q.bury(lease, reason=1)
    return job


@pytest.fixture
def fs_queue(make_queue: object, queue_path: str) -> Queue:
    q = make_queue()  # type: ignore[operator]
    assert isinstance(q, Queue)
    return q


def test_show_and_inspect_take_the_journals_short_id(fs_queue: Queue, queue_path: str) -> None:
    job = fs_queue.enqueue(b"frame 7", delay=600)
    r = steadq("show", queue_path, job[:8], "--no-journal")
    assert r.code == 0, r.err
    assert job in r.out and "delayed" in r.out
    r = steadq("inspect", queue_path, job[:6])
    assert r.code == 0, r.err
    assert r.out.startswith("delayed ")


def test_admin_commands_take_a_dead_jobs_short_id(fs_queue: Queue, queue_path: str) -> None:
    dead = _dead(fs_queue)
    r = steadq("admin", "dead-inspect", queue_path, dead[:8])
    assert r.code == 0 and f"/{dead}" in r.out, r.err
    r = steadq("admin", "requeue", queue_path, dead[:8])
    assert r.code == 0, r.err
    assert f"job_id: {dead}" in r.out_lines
    assert [j.job_id for j in fs_queue.list_jobs({"ready"})] == [dead]


def test_bulk_requeue_takes_short_ids(fs_queue: Queue, queue_path: str) -> None:
    one, two = _dead(fs_queue), _dead(fs_queue)
    r = steadq("admin", "requeue", queue_path, one[:7], two[:9])
    assert r.code == 0, r.err
    assert sorted(j.job_id for j in fs_queue.list_jobs({"ready"})) == sorted([one, two])


def test_an_ambiguous_prefix_lists_the_candidates_and_changes_nothing(fs_queue: Queue, queue_path: str) -> None:
    fs_queue.enqueue(b"a", job_id=TWIN_A)
    fs_queue.enqueue(b"b", job_id=TWIN_B)
    r = steadq("show", queue_path, "abcdef", "--no-journal")
    assert r.code == 1
    assert "ambiguous" in r.err_lines[0] and TWIN_A in r.err_lines and TWIN_B in r.err_lines
    assert steadq("show", queue_path, "abcdef01", "--no-journal").code == 0


def test_a_prefix_found_nowhere_is_not_found_and_a_short_one_is_refused(fs_queue: Queue, queue_path: str) -> None:
    live = fs_queue.enqueue(b"x")
    r = steadq("admin", "requeue", queue_path, live[:8])  # not dead: the dead letters are searched
    assert r.code == 1 and r.err.startswith("not found"), r.err
    r = steadq("show", queue_path, "fed535", "--no-journal") if not live.startswith("fed535") else None
    assert r is None or (r.code == 1 and "not found" in r.err)
    r = steadq("show", queue_path, live[:5])
    assert r.code == 1 and "at least 6" in r.err


def test_show_asks_the_journal_for_the_full_id(fs_queue: Queue, queue_path: str, tmp_path: Path) -> None:
    job = fs_queue.enqueue(b"x")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    asked = tmp_path / "asked"
    script = bin_dir / "journalctl"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {asked}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    r = steadq("show", queue_path, job[:8], env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert r.code == 0, r.err
    assert f"STEADQ_JOB_ID={job}" in asked.read_text().splitlines()


def test_a_bucket_queue_resolves_short_ids_through_its_views(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = MemoryStore(clock=ManualClock(step_ns=1000))
    q = BucketBackend(init_layout(store, "farm/", worker_id="w", certify_store=False), url="s3://mem/farm")
    monkeypatch.setattr(q, "close", lambda: None)
    monkeypatch.setattr("steadqd.cli.common.open_backend", lambda target, **options: q)
    dead = _dead(q)
    q.enqueue(b"a", job_id=TWIN_A)
    q.enqueue(b"b", job_id=TWIN_B)
    assert main(["show", "s3://mem/farm", dead[:8], "--no-journal"]) == 0
    assert dead in capsys.readouterr().out
    assert main(["inspect", "s3://mem/farm", "abcdef"]) == 1
    assert TWIN_A in capsys.readouterr().err
    assert main(["admin", "requeue", "s3://mem/farm", dead[:8]]) == 0
    assert f"job_id: {dead}" in capsys.readouterr().out
