"""``steadq bench`` runs its producers and consumers as processes and prints the reference's lines.

No speed is asserted: only that every count it prints is what the tree holds
afterwards (nothing lost, nothing counted twice across processes) and that a
worker's failure is reported instead of being printed as a rate.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from steadqd import Queue
from steadqd.cli.bench_cmd import Plan, run_bench
from tests.invariants import check_tree

from .helpers import steadq


def _counts(lines: list[str]) -> dict[str, int]:
    counts = {}
    for line, key in zip(lines, ("enqueued", "leased", "acked"), strict=True):
        m = re.fullmatch(rf"{key}: (\d+) \(\d+/s\)", line)
        assert m, line
        counts[key] = int(m.group(1))
    return counts


def test_several_processes_count_what_the_tree_holds(qpath: str) -> None:
    r = steadq("bench", qpath, "--producers", "2", "--consumers", "3", "--duration-seconds", "1", "--payload-size", "8")
    assert r.code == 0, r.err
    assert r.err_lines[0] == "bench: 2 producers, 3 consumers, 1s, 8B payload"
    counts = _counts(r.err_lines[1:4])
    assert len(r.err_lines) == 4
    assert counts["acked"] == counts["leased"] <= counts["enqueued"]
    ts = check_tree(qpath)
    assert len(ts.receipts) == counts["acked"]
    assert len(ts.ready) == counts["enqueued"] - counts["acked"]
    assert not ts.leased


def test_workers_add_up_in_the_parent(qpath: str) -> None:
    """The totals are the sum over worker processes, not one process's share."""
    totals, errors = run_bench(Plan(qpath, 4, 30.0), producers=3, consumers=0, duration=0.5)
    assert errors == []
    assert totals["leased"] == totals["acked"] == 0
    assert totals["enqueued"] == len(check_tree(qpath).ready) > 0


def test_a_failing_worker_is_reported_not_counted(make_queue: Callable[..., Queue], queue_path: str) -> None:
    make_queue(max_payload_length=16).close()
    r = steadq("bench", queue_path, "--producers", "2", "--consumers", "0", "--duration-seconds", "0.3")
    assert r.code == 6
    assert _counts(r.err_lines[1:4]) == {"enqueued": 0, "leased": 0, "acked": 0}
    errors = r.err_lines[4:]
    assert len(errors) == 2 and all(e.startswith("error: producer ") for e in errors), r.err
    assert check_tree(queue_path).ready == set()


def test_a_missing_queue_is_one_line(tmp_path: Path) -> None:
    """Refused before any worker starts: one line, not one per process (the exit code is open_queue's)."""
    r = steadq("bench", tmp_path / "nowhere", "--producers", "3", "--duration-seconds", "0.1")
    assert r.code != 0 and len(r.err_lines) == 1 and r.err.startswith("cannot open queue ")
