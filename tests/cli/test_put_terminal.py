"""``steadq put`` for a person at a terminal (issue 17, point 4): it says when it waits for
stdin, a large single payload shows its progress, ``--json`` prints the id as JSON, and ages
read the same in ``stats`` and ``ls``.

The terminal cases run the console script on a pty (``PtyRun``), the only way to see
behaviour that depends on ``isatty``; the same commands without a terminal must stay quiet.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from steadqd.cli.put_cmd import LARGE_PAYLOAD
from tests.invariants import check_tree

from .helpers import steadq
from .test_tty import PtyRun


def test_put_from_a_terminal_says_it_is_reading_stdin(qpath: str) -> None:
    run = PtyRun("put", qpath)
    run.wait_for(b"reading the payload from stdin; end with Ctrl-D")
    os.write(run.master, b"typed by hand\n")
    os.write(run.master, b"\x04")  # ^D at the start of a line: end of input
    assert run.finish() == 0, run.output[-500:]
    (job,) = check_tree(qpath).ready
    assert f"job_id: {job}".encode() in run.output


def test_put_from_a_pipe_prints_nothing_on_stderr(qpath: str) -> None:
    r = steadq("put", qpath, stdin=b"x")
    assert r.code == 0 and r.err == ""


def test_a_large_single_put_shows_progress_on_a_terminal_only(qpath: str, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(LARGE_PAYLOAD + (1 << 20))
    size_mib = (LARGE_PAYLOAD >> 20) + 1
    run = PtyRun("put", qpath, big)
    assert run.finish() == 0, run.output[-500:]
    assert f"\rput: {size_mib} MiB of {size_mib} MiB (100%)\r\n".encode() in run.output
    r = steadq("put", qpath, big)
    assert r.code == 0 and r.err == ""
    small = tmp_path / "small.bin"
    small.write_bytes(b"s" * 1000)
    run = PtyRun("put", qpath, small)
    assert run.finish() == 0 and b"MiB" not in run.output
    assert len(check_tree(qpath).ready) == 3


def test_put_json_prints_the_id_and_path_as_json(qpath: str) -> None:
    for argv in (("--json", "put", qpath), ("put", qpath, "--json")):
        r = steadq(*argv, stdin=b"payload")
        assert r.code == 0 and r.err == ""
        doc = json.loads(r.out)
        assert list(doc) == ["job_id", "path"]
        obj = check_tree(qpath).get(doc["job_id"])
        assert obj is not None and obj.path == doc["path"]


def test_ages_read_the_same_in_stats_and_ls(qpath: str) -> None:
    assert steadq("put", qpath, stdin=b"x").code == 0
    (job,) = check_tree(qpath).ready
    old = time.time() - 3725  # 1h2m5s ago
    path = os.path.join(qpath, check_tree(qpath).get(job).path)  # type: ignore[union-attr]
    os.utime(path, (old, old))
    stats = steadq("stats", qpath).out
    m = re.search(r"^ready: 1 \(oldest (\d+s)\)$", stats, re.M)
    assert m, stats
    ls = steadq("ls", qpath, "ready").out
    shown = re.search(rf"\b{job}\b\s+\S+\s+(\d+)s\s", ls)
    assert shown, ls
    assert 0 <= int(shown.group(1)) - int(m.group(1).removesuffix("s")) <= 2, (stats, ls)
