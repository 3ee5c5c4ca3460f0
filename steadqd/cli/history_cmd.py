"""``steadq history QUEUE``: the worker's verdicts per minute, read from the journal.

Why the journal: every verdict the worker applies is a journal entry with
structured fields (steadqd/daemon/worker/settle.py), and the journal keeps
them for as long as the machine's journald is configured to, while the
metrics file only counts since the daemon started. A dashboard draws the
last hour's acks, retries and burials from this without a Prometheus.

What counts, by the fields (not the wording) of the worker's entries:

- ``acked``: ``job … finished: ack`` (STEADQ_VERDICT=ack);
- ``retried`` / ``buried``: the line that follows a retry or a bury
  (STEADQ_STATE: back to ready or delayed; STEADQ_REASON: dead, a retry out
  of attempts included, as the metrics count it), each with STEADQ_JOB_ID;
- ``abandoned``: a run whose lease was lost (STEADQ_VERDICT=abandon).

A run whose verdict did not take effect is logged at priority ERR with its
verdict and counted nowhere.

Only the queue's worker unit is believed: any local user can write a journal
entry with ``STEADQ_QUEUE=render STEADQ_VERDICT=bury`` (``logger``,
``systemd-cat``), but not the trusted ``_SYSTEMD_UNIT`` field journald adds
from the sender's cgroup, so entries are matched on
``_SYSTEMD_UNIT=steadq-worker@QUEUE.service``. ``--any-unit`` counts every
sender's (a worker run by ``steadqd run`` outside systemd has no unit). The work is bounded: at most ``--max-entries``
entries of the queue are read (the answer says when it stopped early) and
``--since`` at most :data:`MAX_SINCE` back.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from steadqd.cli.common import CliError, Subcommands, add_command, duration, err, int_in, out, out_json
from steadqd.durations import format_duration
from steadqd.queue_names import is_queue_name
from steadqd.text import printable

BUCKET_SECONDS = 60
MAX_SINCE = 7 * 86400.0  # 10,080 minutes at most
DEFAULT_MAX_ENTRIES = 200_000
COUNTS = ("acked", "retried", "buried", "abandoned")
SYSTEM_JOURNALS = ("/var/log/journal", "/run/log/journal")
_ERR = "3"  # PRIORITY of a run whose verdict did not take effect (settle.py _report_unsettled)


def add_history(sub: Subcommands) -> None:
    s = add_command(sub, "history", "verdicts per minute from the journal (acked, retried, buried, abandoned)",
                    "steadq history transcode --since 1h --json")  # fmt: skip
    s.add_argument("queue", metavar="QUEUE", help="the queue's configured name (the journal's STEADQ_QUEUE)")
    s.add_argument("--since", type=duration, default=3600.0, metavar="DURATION",
                   help=f"how far back (default 1h, at most {format_duration(MAX_SINCE)})")  # fmt: skip
    s.add_argument("--directory", metavar="DIR", default=None,
                   help="read the journal files in DIR (as journalctl -D) instead of this machine's journal")  # fmt: skip
    s.add_argument("--any-unit", action="store_true",
                   help="count entries of any sender, not only the steadq-worker@QUEUE unit (steadqd run in a shell)")  # fmt: skip
    s.add_argument("--max-entries", type=int_in(1, 10_000_000, "max-entries"), default=DEFAULT_MAX_ENTRIES,
                   metavar="N", help=f"read at most N of the queue's entries (default {DEFAULT_MAX_ENTRIES})")  # fmt: skip
    s.set_defaults(run=cmd_history)


def classify(entry: Mapping[str, Any]) -> str | None:
    """Which of :data:`COUNTS` a journal entry of the queue is, or None when it is not a verdict."""
    if "STEADQ_VERDICT" in entry:
        if str(entry.get("PRIORITY", "")) == _ERR:
            return None
        return {"ack": "acked", "abandon": "abandoned"}.get(str(entry["STEADQ_VERDICT"]))
    if "STEADQ_JOB_ID" not in entry:
        return None
    if "STEADQ_REASON" in entry:
        return "buried"
    if "STEADQ_STATE" in entry:
        return "retried"
    return None


def _has_journal_files(directory: str) -> bool:
    """Whether ``directory`` (or a machine-id directory in it, journald's layout) holds journal files."""
    try:
        with os.scandir(directory) as it:
            for e in it:
                if e.name.endswith((".journal", ".journal~")):
                    return True
                if e.is_dir(follow_symlinks=False) and _has_journal_files(e.path):
                    return True
    except OSError:
        return False
    return False


def worker_unit(queue: str) -> str:
    return f"steadq-worker@{queue}.service"


def _reader(directory: str | None, queue: str, since_us: int, *, any_unit: bool) -> Iterable[Mapping[str, Any]]:
    """systemd-python's Reader over the queue's entries from ``since_us`` on (None: the system journal)."""
    if directory is not None and not _has_journal_files(directory):
        raise CliError(f"history: no journal in {directory}: give --directory a directory of *.journal files", 1)
    if directory is None and not any(_has_journal_files(d) for d in SYSTEM_JOURNALS):
        raise CliError(
            f"history: no journal on this machine ({' and '.join(SYSTEM_JOURNALS)} have no files): "
            "is systemd-journald running? (--directory DIR reads journal files copied from elsewhere)",
            1,
        )
    try:
        from systemd import journal
    except ImportError as e:
        raise CliError(
            "history: cannot read the journal: systemd-python is missing (apt install python3-systemd)", 1
        ) from e
    try:
        r = journal.Reader(path=directory) if directory is not None else journal.Reader()
    except OSError as e:
        raise CliError(f"history: cannot open the journal: {e.strerror or e}", 1) from e
    r.add_match(STEADQ_QUEUE=queue)
    if not any_unit:
        r.add_match(_SYSTEMD_UNIT=worker_unit(queue))  # a different field: both must match
    r.seek_realtime(since_us / 1_000_000)
    return r


def tally(entries: Iterable[Mapping[str, Any]], since_us: int, until_us: int, max_entries: int) -> dict[str, Any]:
    """Count the verdicts of ``entries`` per minute from ``since_us`` (rounded down to its minute) to ``until_us``.

    Every minute of the range has its row, zeros included, so a chart needs no
    gaps filled; an entry outside the range is skipped."""
    first = since_us - since_us % (BUCKET_SECONDS * 1_000_000)
    n = (until_us - first) // (BUCKET_SECONDS * 1_000_000) + 1
    minutes = [dict.fromkeys(COUNTS, 0) for _ in range(n)]
    read = 0
    truncated = False
    for e in entries:
        if read >= max_entries:
            truncated = True
            break
        read += 1
        kind = classify(e)
        stamp = e.get("__REALTIME_TIMESTAMP")
        if kind is None or not isinstance(stamp, datetime.datetime):
            continue
        us = round(stamp.timestamp() * 1_000_000)
        if since_us <= us <= until_us:
            minutes[(us - first) // (BUCKET_SECONDS * 1_000_000)][kind] += 1
    rows = [{"start_ns": (first + i * BUCKET_SECONDS * 1_000_000) * 1000, **m} for i, m in enumerate(minutes)]
    totals = {k: sum(m[k] for m in minutes) for k in COUNTS}
    return {"entries_read": read, "truncated": truncated, "minutes": rows, "totals": totals}


def cmd_history(a: argparse.Namespace) -> int:
    if not is_queue_name(a.queue):
        raise CliError(
            f"history: {printable(a.queue)} is not a queue name: the journal names a queue by its configured name "
            "(steadq list shows them)",
            1,
        )
    if a.since > MAX_SINCE:
        raise CliError(
            f"history: --since {format_duration(a.since)} is longer than {format_duration(MAX_SINCE)}: give less", 1
        )
    until_us = time.time_ns() // 1000
    since_us = until_us - round(a.since * 1_000_000)
    result = tally(_reader(a.directory, a.queue, since_us, any_unit=a.any_unit), since_us, until_us, a.max_entries)
    if result["truncated"]:
        err(f"history: read the first {a.max_entries} entries only; give --max-entries or a shorter --since for all")
    if a.json:
        out_json({"queue": a.queue, "since_ns": since_us * 1000, "until_ns": until_us * 1000,
                  "bucket_seconds": BUCKET_SECONDS, **result})  # fmt: skip
        return 0
    lines = [f"{'MINUTE':<17} {'ACKED':>8} {'RETRIED':>8} {'BURIED':>8} {'ABANDONED':>9}"]
    for m in result["minutes"]:
        if any(m[k] for k in COUNTS):
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(m["start_ns"] / 1e9))
            lines.append(f"{when:<17} {m['acked']:>8} {m['retried']:>8} {m['buried']:>8} {m['abandoned']:>9}")
    t = result["totals"]
    lines.append(f"{'total':<17} {t['acked']:>8} {t['retried']:>8} {t['buried']:>8} {t['abandoned']:>9}")
    out(*lines)
    return 0


COMMANDS = {"history": add_history}
