"""Issue 34 #2: ``steadq history QUEUE --since 1h --json``: the worker's verdicts per minute, read
from the journal (the one record of every verdict), for a dashboard's chart.

The entries are real journal files, written by ``systemd-journal-remote`` from the export
format (no journald is needed, and the entries' timestamps are the test's own), and read
with ``--directory``, the same reader the system journal is read with.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from .helpers import steadq

JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
MINUTE_US = 60_000_000


def _journal(tmp_path: Path, entries: list[dict[str, str | bytes]]) -> Path:
    """A directory holding one journal file with ``entries`` (each a dict of fields; timestamps in µs)."""
    if not os.access(JOURNAL_REMOTE, os.X_OK):
        pytest.skip(f"{JOURNAL_REMOTE} is missing: install systemd-journal-remote (./dev.sh setup does)")
    export = bytearray()
    for i, e in enumerate(entries, 1):
        export += f"__CURSOR=s=0;i={i}\n__MONOTONIC_TIMESTAMP={i}\n_BOOT_ID={'0' * 31}1\n".encode()
        for k, v in e.items():
            if isinstance(v, bytes):  # the binary form: name, newline, little-endian length, data
                export += k.encode() + b"\n" + len(v).to_bytes(8, "little") + v + b"\n"
            else:
                export += f"{k}={v}\n".encode()
        export += b"\n"
    d = tmp_path / "journal"
    d.mkdir()
    (tmp_path / "export").write_bytes(bytes(export))
    subprocess.run(
        [JOURNAL_REMOTE, f"--output={d}/steadq.journal", str(tmp_path / "export")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return d


def _verdicts(queue: str, at_us: int) -> list[dict[str, str | bytes]]:
    """A minute's worth of a worker's lines: 2 acks, a retry, a retry out of attempts (buried), a bury."""
    job = {"STEADQ_QUEUE": queue, "STEADQ_ROLE": "worker", "SYSLOG_IDENTIFIER": "steadqd",
           "_SYSTEMD_UNIT": f"steadq-worker@{queue}.service"}  # fmt: skip
    lines: list[dict[str, str | bytes]] = []
    for n, (verdict, follow) in enumerate(
        [("ack", None), ("ack", None), ("retry", {"STEADQ_STATE": "delayed"}),
         ("retry", {"STEADQ_REASON": "0x0002"}), ("bury", {"STEADQ_REASON": "0x0001"})]
    ):  # fmt: skip
        fields = {**job, "STEADQ_JOB_ID": f"{n:032x}", "__REALTIME_TIMESTAMP": str(at_us + n * 1000)}
        lines.append({**fields, "MESSAGE": f"job {n:08x} finished: {verdict}", "STEADQ_VERDICT": verdict})
        if follow:
            lines.append({**fields, "MESSAGE": f"job {n:08x} followed", **follow})
    return lines


def test_history_counts_each_minutes_verdicts(tmp_path: Path) -> None:
    now_us = time.time_ns() // 1000
    minute = now_us - now_us % MINUTE_US - 10 * MINUTE_US  # a whole minute, ten minutes ago
    unit = {"STEADQ_QUEUE": "render", "_SYSTEMD_UNIT": "steadq-worker@render.service"}
    entries = [
        *_verdicts("render", minute - 120 * MINUTE_US),  # before --since: not counted
        *_verdicts("render", minute),
        *_verdicts("other", minute),  # another queue's: not counted
        {**unit, "MESSAGE": "quarantined a corrupt object", "STEADQ_REASON": "0x0001",
         "__REALTIME_TIMESTAMP": str(minute + 1)},  # a reason without a job: not a verdict
        {**unit, "STEADQ_JOB_ID": "f" * 32, "STEADQ_VERDICT": "ack", "PRIORITY": "3",
         "MESSAGE": "job ffffffff finished (exit 0), but its ack was not committed",
         "__REALTIME_TIMESTAMP": str(minute + 2)},  # a verdict that did not take effect
        *_verdicts("render", minute + 3 * MINUTE_US),
    ]  # fmt: skip
    d = _journal(tmp_path, entries)
    r = steadq("history", "render", "--since", "1h", "--directory", d, "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["queue"] == "render" and doc["bucket_seconds"] == 60 and doc["truncated"] is False
    assert len(doc["minutes"]) in (60, 61)  # every minute of the hour, the current one included
    by_start = {m["start_ns"] // 1000: m for m in doc["minutes"]}
    counts = {"acked": 2, "retried": 1, "buried": 2, "abandoned": 0}
    assert {k: by_start[minute][k] for k in counts} == counts
    assert {k: by_start[minute + 3 * MINUTE_US][k] for k in counts} == counts
    assert sum(m["acked"] for m in doc["minutes"]) == 4
    assert doc["totals"] == {"acked": 4, "retried": 2, "buried": 4, "abandoned": 0}
    assert doc["entries_read"] == 18  # the queue's worker's, from --since on
    text = steadq("history", "render", "--since", "1h", "--directory", d)
    assert text.code == 0, text.err
    assert text.out_lines[0].split() == ["MINUTE", "ACKED", "RETRIED", "BURIED", "ABANDONED"]
    assert len(text.out_lines) == 4 and text.out_lines[-1].split() == ["total", "4", "2", "4", "0"]


def test_history_believes_only_the_queues_worker_unit(tmp_path: Path) -> None:
    """Any local user can log STEADQ_QUEUE=render STEADQ_VERDICT=... (logger, systemd-cat); journald's
    _SYSTEMD_UNIT, from the sender's cgroup, they cannot set: only the worker unit's entries count."""
    now_us = time.time_ns() // 1000
    forged = [
        {**e, "_SYSTEMD_UNIT": unit}
        for unit in ("user@1000.service", "steadq-worker@other.service")
        for e in _verdicts("render", now_us - 5 * MINUTE_US)
    ]
    d = _journal(tmp_path, [*forged, *_verdicts("render", now_us - 2 * MINUTE_US)])
    doc = json.loads(steadq("history", "render", "--directory", d, "--json").out)
    assert doc["totals"] == {"acked": 2, "retried": 1, "buried": 2, "abandoned": 0}
    doc = json.loads(steadq("history", "render", "--directory", d, "--json", "--any-unit").out)
    assert doc["totals"] == {"acked": 6, "retried": 3, "buried": 6, "abandoned": 0}


def test_history_reads_a_bounded_number_of_entries(tmp_path: Path) -> None:
    now_us = time.time_ns() // 1000
    entries = [
        {"STEADQ_QUEUE": "busy", "STEADQ_JOB_ID": f"{n:032x}", "STEADQ_VERDICT": "ack", "MESSAGE": "job finished: ack",
         "__REALTIME_TIMESTAMP": str(now_us - 1_000_000 - n)}
        for n in range(30)
    ]  # fmt: skip
    d = _journal(tmp_path, entries)
    r = steadq("history", "busy", "--directory", d, "--json", "--max-entries", "10", "--any-unit")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["truncated"] is True and doc["entries_read"] == 10 and doc["totals"]["acked"] == 10
    assert "history: read the first 10 entries only" in r.err


def test_history_without_a_journal_says_so(tmp_path: Path) -> None:
    r = steadq("history", "render", "--directory", tmp_path / "none")
    assert r.code == 1 and r.out == ""
    assert r.err_lines == [
        f"history: no journal in {tmp_path / 'none'}: give --directory a directory of *.journal files"
    ]
    (tmp_path / "empty").mkdir()
    r = steadq("history", "render", "--directory", tmp_path / "empty")
    assert r.code == 1
    assert r.err_lines == [
        f"history: no journal in {tmp_path / 'empty'}: give --directory a directory of *.journal files"
    ]


def test_history_takes_a_queue_name_not_a_path(tmp_path: Path) -> None:
    r = steadq("history", str(tmp_path), "--directory", tmp_path)
    assert r.code == 1
    assert "the journal names a queue by its configured name" in r.err


def test_history_since_is_bounded(tmp_path: Path) -> None:
    r = steadq("history", "render", "--since", "30d", "--directory", tmp_path)
    assert r.code == 1 and "--since 30d is longer than 7d" in r.err


def test_history_names_the_missing_system_journal() -> None:
    """Without --directory the system journal is read; a machine without one is told plainly."""
    r = steadq("history", "render-never-configured-here")
    if any(os.listdir(d) for d in ("/var/log/journal", "/run/log/journal") if os.path.isdir(d)):
        assert r.code == 0, r.err  # a machine with a journal: read, nothing of this queue in it
        assert r.out_lines[-1].split() == ["total", "0", "0", "0", "0"]
        return
    assert r.code == 1
    assert r.err_lines == [
        "history: no journal on this machine (/var/log/journal and /run/log/journal have no files): "
        "is systemd-journald running? (--directory DIR reads journal files copied from elsewhere)"
    ]
