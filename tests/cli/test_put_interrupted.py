"""``steadq put --dir/--jsonl`` interrupted by SIGINT or SIGTERM reports exactly what it published.

The reported defect: a bulk put stopped with Ctrl-C said 14,336 jobs when
14,592 were enqueued, one whole group of 256 uncounted, so a script resuming
after the reported count would have enqueued 256 jobs twice. Each run here
signals the installed console script at a random moment of its life and
compares the summary and ``--print-ids`` with the ids the tree holds.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from steadqd import Queue
from tests.invariants import check_tree

from .helpers import STEADQ, payload_dir

_SUMMARY = re.compile(r"enqueued (\d+) jobs \((\d+) bytes\)")


def _interrupted_put(
    args: list[str], delay: float, signum: int, *, after_first_id: bool = False
) -> tuple[int, list[str], str]:
    """Run ``steadq put ARGS``, send ``signum`` ``delay`` seconds after it started (or after it printed
    its first id: publishing is under way); (exit code, stdout lines, stderr)."""
    assert STEADQ is not None
    p = subprocess.Popen([STEADQ, "put", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)  # fmt: skip
    assert p.stdout is not None and p.stderr is not None
    first = p.stdout.readline() if after_first_id else b""
    time.sleep(delay)
    if p.poll() is None:
        p.send_signal(signum)
    out = first + p.stdout.read()  # the buffered reader's, not communicate()'s: readline may have read ahead
    err = p.stderr.read()  # a few lines: stderr's pipe cannot fill while stdout is read
    p.wait(timeout=120)
    return p.returncode, out.decode().splitlines(), err.decode()


def _check_run(
    qpath: str, before: frozenset[str], code: int, lines: list[str], err: str, signum: int, total: int
) -> set[str]:
    """The run's report against the tree (``total``: the jobs of its input); returns the ids it published."""
    now = check_tree(qpath, allow_quarantine=False).all_ids
    new = set(now - before)
    m = _SUMMARY.search(err)
    if m is None:  # stopped before the command began (even in Python's start-up): nothing may be there
        assert code != 0, (code, err)
        assert lines == [] and new == set(), (code, err)
        return new
    ids = {line.split()[0] for line in lines}
    assert len(ids) == len(lines) == int(m.group(1)), err
    assert ids == new, f"reported {len(ids)}, tree has {len(new)} new: {err}"
    if f"interrupted by {signal.Signals(signum).name}" in err:
        assert code == 128 + signum, (code, err)
    else:  # it had finished: a signal after the summary may still end the process, and changes nothing
        assert len(ids) == total, err
    return new


def test_bulk_put_interrupted_at_random_moments_reports_exactly_what_it_published(qpath: str, tmp_path: Path) -> None:
    assert STEADQ is not None
    d = payload_dir(tmp_path, 800)
    rng = random.Random()
    seed = rng.randrange(1 << 32)
    rng.seed(seed)
    start = time.monotonic()
    lines = subprocess.run([STEADQ, "put", qpath, "--dir", str(d), "--print-ids"], capture_output=True,
                           check=True).stdout.splitlines()  # fmt: skip
    full = time.monotonic() - start  # how long one whole run takes here: the signals land across it
    seen = frozenset(line.split()[0].decode() for line in lines)
    assert check_tree(qpath, allow_quarantine=False).all_ids == seen
    interrupted = midway = runs = 0
    while (interrupted < 20 or midway < 10) and runs < 60:
        # Every other run is signalled while jobs are being published (after the first group's ids);
        # the others at any moment from the start, start-up and the listing of the directory included.
        signum = (signal.SIGINT, signal.SIGTERM)[runs % 2]
        during = runs % 4 < 2
        delay = rng.uniform(0, full / 2) if during else rng.uniform(0, full)
        # Each run gets a queue of its own: in one shared queue every check_tree re-read all earlier runs' jobs
        # (up to 48,000 by the last run).
        run_queue = str(tmp_path / f"queue-{runs}")
        Queue.init(run_queue, shards=4).close()
        code, out, err = _interrupted_put(
            [run_queue, "--dir", str(d), "--print-ids"], delay, signum, after_first_id=during
        )
        new = _check_run(run_queue, frozenset(), code, out, err, signum, 800)
        runs += 1
        interrupted += code != 0
        midway += 0 < len(new) < 800
        shutil.rmtree(run_queue)
    assert interrupted >= 20 and midway >= 10, f"{interrupted} interrupted, {midway} mid-way, of {runs} (seed {seed})"


def test_jsonl_put_interrupted_reports_its_json_count(qpath: str, tmp_path: Path) -> None:
    src = tmp_path / "jobs.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(800)))
    rng = random.Random()
    for run in range(4):
        before = check_tree(qpath, allow_quarantine=False).all_ids
        signum = (signal.SIGTERM, signal.SIGINT)[run % 2]
        code, out, err = _interrupted_put([qpath, "--jsonl", str(src), "--print-ids"], rng.uniform(0.2, 1.5), signum)
        _check_run(qpath, before, code, out, err, signum, 800)
