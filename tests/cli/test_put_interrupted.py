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
import signal
import subprocess
import time
from pathlib import Path

from tests.invariants import check_tree

from .helpers import STEADQ, payload_dir

_SUMMARY = re.compile(r"enqueued (\d+) jobs \((\d+) bytes\)")


def _interrupted_put(args: list[str], delay: float, signum: int) -> tuple[int, list[str], str]:
    """Run ``steadq put ARGS``, send ``signum`` after ``delay`` seconds; (exit code, stdout lines, stderr)."""
    assert STEADQ is not None
    p = subprocess.Popen([STEADQ, "put", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)  # fmt: skip
    time.sleep(delay)
    if p.poll() is None:
        p.send_signal(signum)
    out, err = p.communicate(timeout=120)
    return p.returncode, out.decode().splitlines(), err.decode()


def _check_run(qpath: str, before: frozenset[str], code: int, lines: list[str], err: str, signum: int) -> set[str]:
    """The run's report against the tree; returns the ids it published."""
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
    if code != 0:
        assert code == 128 + signum, (code, err)
        assert f"interrupted by {signal.Signals(signum).name}" in err, err
    return new


def test_bulk_put_interrupted_at_random_moments_reports_exactly_what_it_published(qpath: str, tmp_path: Path) -> None:
    d = payload_dir(tmp_path, 1000)
    rng = random.Random()
    seed = rng.randrange(1 << 32)
    rng.seed(seed)
    start = time.monotonic()
    lines = subprocess.run([STEADQ, "put", qpath, "--dir", str(d), "--print-ids"], capture_output=True,
                           check=True).stdout.splitlines()  # fmt: skip
    full = time.monotonic() - start  # how long one whole run takes here: the signals land across it
    seen = frozenset(line.split()[0].decode() for line in lines)
    assert check_tree(qpath, allow_quarantine=False).all_ids == seen
    interrupted = 0
    for run in range(20):
        signum = (signal.SIGINT, signal.SIGTERM)[run % 2]
        code, out, err = _interrupted_put([qpath, "--dir", str(d), "--print-ids"], rng.uniform(0, full), signum)
        new = _check_run(qpath, seen, code, out, err, signum)
        interrupted += code != 0
        seen = seen | new
    assert interrupted >= 10, f"only {interrupted} of 20 runs were interrupted (seed {seed})"


def test_jsonl_put_interrupted_reports_its_json_count(qpath: str, tmp_path: Path) -> None:
    src = tmp_path / "jobs.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(800)))
    rng = random.Random()
    for run in range(4):
        before = check_tree(qpath, allow_quarantine=False).all_ids
        signum = (signal.SIGTERM, signal.SIGINT)[run % 2]
        code, out, err = _interrupted_put([qpath, "--jsonl", str(src), "--print-ids"], rng.uniform(0.2, 1.5), signum)
        _check_run(qpath, before, code, out, err, signum)
