"""The spawner floor (``benchmarks.floor.SPAWN_C_SOURCE``) settles every job of a real queue exactly once.

The floor is what steadqd's spawner is compared with, so a floor that skipped
jobs, settled one twice or left some behind would flatter or shame steadqd for
nothing. This runs it on a queue steadqd made and filled, and counts what is
left in the tree: one receipt per enqueued job, named after it, nothing in
``ready/``, and a command started once per job.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from benchmarks import daemons, floor
from steadqd import Queue

JOBS = 60


def _files(root: Path) -> list[Path]:
    return [Path(d, f) for d, _dirs, files in os.walk(root) for f in files]


@pytest.fixture
def spawn_floor(tmp_path: Path) -> str:
    binary, why = floor.build_spawn_floor(str(tmp_path))
    if binary is None:
        pytest.skip(why)
    return binary


def test_spawn_floor_settles_every_job_once(tmp_path: Path, spawn_floor: str) -> None:
    qpath = tmp_path / "q"
    Queue.init(str(qpath), shards=64).close()
    daemons._enqueue_jobs(str(qpath), JOBS)
    enqueued = sorted(p.name.split(".")[0] for p in _files(qpath / "ready"))
    assert len(set(enqueued)) == JOBS
    # The command counts its own starts: one line appended per run.
    starts = tmp_path / "starts"
    command = tmp_path / "count.sh"
    command.write_text(f"#!/bin/sh\necho x >> {starts}\n")
    command.chmod(0o755)

    own = floor.run_spawn_floor(spawn_floor, str(qpath), 4, str(command), timeout=120)

    receipts = [p for p in _files(qpath / "receipts") if p.suffix == ".rct"]
    assert sorted(p.name.split(".")[0] for p in receipts) == enqueued  # each job once, none twice
    assert {p.parent.name for p in receipts} <= {p.name for p in (qpath / "ready").iterdir()}  # receipts/<b>/<shard>
    assert _files(qpath / "ready") == []  # nothing left ready or leased
    assert own["settled"] == JOBS and own["threads"] == 4
    assert starts.read_text().count("x") == JOBS


def test_spawn_floor_side_of_the_suite(tmp_path: Path, spawn_floor: str) -> None:
    """The suite's floor side reports what it drained, as steadqd's side does (rate from the receipts)."""
    if shutil.which("true") is None:
        pytest.skip("no true on PATH")
    r = daemons.spawn_floor_throughput(str(tmp_path), spawn_floor, 24, 4)
    assert (r["jobs"], r["acked"], r["left_ready"], r["left_leased"]) == (24, 24, 0, 0)
    assert r["floor_own"]["settled"] == 24
    assert r["jobs_per_s"] is None or r["jobs_per_s"] > 0
