"""``steadq ls --meta KEY`` and ``--filter KEY=VALUE`` (issue 33 #8).

The reported defect: the Python worker docs said ``ls`` shows a task's
``task=`` metadata, but ``ls`` read names only and had no metadata column,
so an operator could not tell which task's jobs were piling up.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.cli.main import main
from steadqd.fs import handle, views
from steadqd.view_records import JobEntry

from .helpers import steadq


def test_ls_shows_the_metadata_asked_for_and_filters_by_it(qpath: str) -> None:
    with Queue.open(qpath) as q:
        thumb = q.enqueue(b"a", metadata={"task": "media.thumbnail", "user": "ann"})
        video = q.enqueue(b"b", metadata={"task": "media.transcode"})
        plain = q.enqueue(b"c")
        hostile = q.enqueue(b"d", metadata={"task": "x\x1b[2Jy"})
    r = steadq("ls", qpath, "--meta", "task", "--meta", "user")
    assert r.code == 0, r
    assert r.out_lines[0].split() == ["STATE", "JOB_ID", "ATTEMPT", "AGE", "TASK", "USER", "DEADLINE"]
    rows = {line.split()[1]: line.split() for line in r.out_lines[1:]}
    assert rows[thumb][4:6] == ["media.thumbnail", "ann"]
    assert rows[video][4:6] == ["media.transcode", "-"] and rows[plain][4:6] == ["-", "-"]
    assert "\x1b" not in r.out and rows[hostile][4] == "x\\x1b[2Jy"

    r = steadq("ls", qpath, "--filter", "task=media.thumbnail")
    assert r.code == 0 and [line.split()[1] for line in r.out_lines[1:]] == [thumb], r
    assert r.out_lines[0].split() == ["STATE", "JOB_ID", "ATTEMPT", "AGE", "DEADLINE"]
    r = steadq("ls", qpath, "ready", "--filter", "task=media.transcode", "--filter", "user=ann")
    assert r.code == 0 and r.out_lines[1:] == [], r  # every filter must match

    docs = json.loads(steadq("ls", qpath, "--meta", "task", "--json").out)
    assert {d["job_id"]: d["metadata"] for d in docs}[thumb] == {"task": "media.thumbnail"}
    assert {d["job_id"]: d["metadata"] for d in docs}[plain] == {}
    assert "metadata" not in json.loads(steadq("ls", qpath, "--json").out)[0]  # the shape only adds, when asked

    r = steadq("ls", qpath, "--filter", "task")
    assert r.code == 1 and "--filter" in r.err and "KEY=VALUE" in r.err, r


def test_ls_meta_neither_follows_nor_blocks_on_a_job_file_swapped_after_the_listing(
    qpath: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tree writer swaps a listed job file for a FIFO and another for a symlink to a job file outside
    the tree, between the listing and the header read: ``ls --meta`` must neither hang on the FIFO
    (``O_NONBLOCK``) nor show what the symlink points at (no symlink followed); both show ``-``."""
    with Queue.open(qpath) as q:
        kept = q.enqueue(b"a", metadata={"task": "kept"})
        to_fifo = q.enqueue(b"b", metadata={"task": "was.fifo"})
        to_link = q.enqueue(b"c", metadata={"task": "was.link"})
        decoy = q.enqueue(b"d", metadata={"task": "followed"})
        paths = {j.job_id: os.path.join(qpath, j.path) for j in q.list_jobs({"ready"})}
    outside = tmp_path / "decoy.job"
    outside.write_bytes(Path(paths[decoy]).read_bytes())
    os.unlink(paths[decoy])
    fifo = paths[to_fifo]
    real = views.list_jobs

    def swapping(ctx: object, states: object) -> Iterator[JobEntry]:
        for entry in real(ctx, states):  # type: ignore[arg-type]
            path = os.path.join(qpath, entry.path)
            if entry.job_id == to_fifo:
                os.unlink(path)
                os.mkfifo(path)
            elif entry.job_id == to_link:
                os.unlink(path)
                os.symlink(outside, path)
            yield entry

    monkeypatch.setattr(handle, "list_jobs", swapping)
    codes: list[int] = []
    t = threading.Thread(target=lambda: codes.append(main(["ls", qpath, "--meta", "task"])), daemon=True)
    t.start()
    t.join(timeout=30)
    if t.is_alive():  # blocked in open(2) on the FIFO: release it so the thread can end, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(timeout=30)
        pytest.fail("ls --meta blocked on a FIFO swapped in for a job file")
    out = capsys.readouterr().out
    assert codes == [0], out
    rows = {line.split()[1]: line.split() for line in out.splitlines()[1:]}
    assert rows[kept][4] == "kept"
    assert rows[to_fifo][4] == "-" and rows[to_link][4] == "-"
    assert "followed" not in out
