"""``steadq put --dir/--jsonl`` publishes through Queue.enqueue_many.

In-process (``steadq_cli.main``) because the syscall order and an injected
link failure cannot be observed or provoked from outside; the subprocess
tests in test_cli.py / test_tty.py cover the output contract.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from steadqd import Queue, constants
from steadqd.cli.main import main
from steadqd.fs import linux, publish
from tests.invariants import check_tree

from .helpers import payload_dir


def test_bulk_put_fsyncs_a_group_before_linking_it(
    qpath: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = payload_dir(tmp_path, 5)
    with linux.trace() as events:
        code = main(["put", qpath, "--dir", str(d), "--print-ids"])
    assert code == 0
    ops = [e.op for e in events]
    writebacks = [i for i, e in enumerate(events) if e.op == "sync_file_range"]
    files = {events[i].detail[0] for i in writebacks}
    file_syncs = [i for i, e in enumerate(events) if e.op == "fsync" and e.detail[0] in files]
    links = [i for i, op in enumerate(ops) if op == "link"]
    assert len(writebacks) == len(file_syncs) == 5 and len(links) >= 5
    assert max(writebacks) < min(file_syncs) and max(file_syncs) < min(links)  # one group
    captured = capsys.readouterr()
    assert captured.err.startswith("enqueued 5 jobs (45 bytes) from files of ")
    lines = captured.out.splitlines()
    ids = [line.split()[0] for line in lines]
    assert [line.split()[1] for line in lines] == [f"p{i:05d}" for i in range(5)]
    with Queue.open(qpath) as q:
        got = {}
        while (lease := q.lease()) is not None:
            got[lease.job_id] = lease.payload()
    assert [got[j] for j in ids] == [b"payload %d" % i for i in range(5)]


def test_bulk_put_reports_the_published_prefix_after_a_failed_link(
    qpath: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Groups of two: a failed 4th link leaves the first group and the 3rd job published;
    the summary counts exactly those, --print-ids names them, the exit code is the cause's."""
    monkeypatch.setattr(constants, "ENQUEUE_MANY_GROUP", 2)
    monkeypatch.setattr(publish, "ENQUEUE_MANY_GROUP", 2)
    d = payload_dir(tmp_path, 5)
    with linux.inject(nth=4, errno=errno.EIO, op="link") as fault:
        code = main(["put", qpath, "--dir", str(d), "--print-ids"])
    assert fault.fired and code == 6
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    n = len(lines)
    # Root links with the direct form (3 jobs before the 4th link call); without
    # CAP_DAC_READ_SEARCH the first job needs two link calls (2 jobs).
    assert n in (2, 3), captured
    assert [line.split()[1] for line in lines] == [f"p{i:05d}" for i in range(n)]
    err = captured.err.splitlines()
    assert err[0].startswith("not committed: link into ready/")
    assert err[-1].startswith(f"enqueued {n} jobs ({9 * n} bytes)")  # the bytes of the published jobs only
    assert check_tree(qpath, allow_quarantine=False).all_ids == {line.split()[0] for line in lines}
