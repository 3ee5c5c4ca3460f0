"""``steadq show``: one job's whole story: its state, attempts, ages, metadata, payload head, and its
lines in the journal (the worker's verdicts and the job's stderr), told in text or as JSON.

Why one command: an operator looking at a failed job needed inspect, dead-export, xxd and journalctl.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

from steadqd import progress
from steadqd.cli.common import (
    ALL_STATES,
    CliError,
    Subcommands,
    add_queue_command,
    failure,
    find_job,
    job_id,
    job_object_json,
    open_queue,
    out,
    out_json,
    reason_name,
)
from steadqd.cli.view_cmd import fmt_deadline, meta_text, shown_state
from steadqd.constants import DeadReason, QuarantineReason
from steadqd.text import printable

SHOW_HEAD_BYTES = 4096  # the payload shown inline; --payload writes all of it
_BINARY_DUMP_BYTES = 256  # a binary payload is shown as a hex dump of this much
_JOURNAL_ENTRIES = 20  # shown
_JOURNAL_READ = 1000  # read, to choose those from
_JOURNAL_LINE_CHARS = 400
_JOURNAL_TIMEOUT_S = 10.0
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/x-ndjson", "application/yaml")


def add_show(sub: Subcommands) -> None:
    s = add_queue_command(sub, "show", "one job's whole story: state, attempts, ages, metadata, payload, journal",
                          "steadq show /srv/q 0123456789abcdef0123456789abcdef", run=cmd_show)  # fmt: skip
    s.add_argument("job_id", metavar="JOB_ID")
    s.add_argument("--payload", action="store_true",
                   help="write the whole payload to stdout, and only once it has verified (nothing else is printed)")  # fmt: skip
    s.add_argument("--no-journal", action="store_true", help="do not look for the job's lines in the journal")


def cmd_show(a: argparse.Namespace) -> int:
    """Why one command: an operator looking at a failed job needed inspect, dead-export, xxd and journalctl."""
    job = job_id(a.job_id)
    q = open_queue(a.path)
    try:
        try:
            job = find_job(q, job, ALL_STATES)
        except CliError as e:
            if e.lines[0].startswith("not found"):  # the prefix search reads names; quarantine has no job names
                e.lines[0] += "; a job in quarantine is found by its whole id"
            raise
        if a.payload:
            return _show_payload(q, job)
        try:
            story = q.job_story(job, SHOW_HEAD_BYTES)
        except Exception as e:  # noqa: BLE001
            raise failure("show", e) from e
        queue_id = q.queue_id
    finally:
        q.close()
    if story is None:
        raise CliError(f"show: no object of job {job} in {a.path} (not in any state, nor in quarantine)", 1)
    journal = None if a.no_journal else journal_entries(job)
    # Published by the worker running it on this host (steadqd/progress.py); a leased job only.
    prog = progress.lookup(queue_id, job) if story.state == "leased" else None
    if a.json:
        out_json({**story_json(story, journal), "progress": prog})
    else:
        lines = story_lines(story, journal)
        if prog is not None:
            lines.insert(1, f"  progress:      {progress.shown(prog)}")
        out(*lines)
    return 0


def _show_payload(q: Any, job: str) -> int:
    try:
        q.copy_job_payload(job, sys.stdout.buffer)
    except Exception as e:  # noqa: BLE001
        raise failure("show --payload", e, " (nothing was written)") from e
    sys.stdout.buffer.flush()
    return 0


def _reason_of(story: Any) -> str | None:
    """The dead or quarantine reason by name (None when the job has none)."""
    if story.reason is None:
        return None
    return reason_name(story.reason, QuarantineReason if story.state == "quarantine" else DeadReason)


def _stamp(ns: int | None, now_ns: int) -> str:
    if ns is None:
        return "-"
    return fmt_deadline(ns, now_ns)


def _is_text(content_type: str | None, head: bytes) -> bool:
    if content_type is not None and content_type.lower().startswith(_TEXT_TYPES):
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start >= len(head) - 3  # a character cut at the end of the head is still text
    return b"\x00" not in head


def _text_of(head: bytes) -> str:
    return head.decode("utf-8", "replace")


def _hex_dump(data: bytes) -> list[str]:
    lines = []
    for off in range(0, len(data), 16):
        row = data[off : off + 16]
        hexes = " ".join(f"{b:02x}" for b in row)
        chars = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in row)
        lines.append(f"  {off:08x}  {hexes:<47}  {chars}")
    return lines


def story_lines(story: Any, journal: Mapping[str, Any] | None) -> list[str]:
    """The plain rendering of ``show`` (every line escaped by ``out``)."""
    now = time.time_ns()
    f = story.file
    cur = story.current
    reason = f": {_reason_of(story)} (0x{story.reason:04x})" if story.reason is not None else ""
    state = shown_state(story.state) + reason
    lines = [f"job {story.job_id}: {state}", f"  path:          {story.path}"]
    if story.quarantine_id is not None:
        lines.append(f"  quarantine id: {story.quarantine_id}")
    if cur is not None:
        lines.append(f"  generation:    {cur.generation}")
        lines.append(f"  attempts:      {cur.attempt} used of {cur.max_attempts}")
        details = cur.details or {}
        if "wall_deadline_ns" in details:
            lines.append(f"  lease until:   {_stamp(details['wall_deadline_ns'], now)}")
        if "not_before_ns" in details:
            lines.append(f"  not before:    {_stamp(details['not_before_ns'], now)}")
    if f is None:
        lines.append("  payload:       gone (the job was acknowledged; its receipt is what is left)")
    else:
        lines.append(f"  created:       {_stamp(f.created_at_ns, now)}")
        lines.append(f"  state since:   {_stamp(f.changed_ns, now)}")
        lines.append(f"  content type:  {f.content_type or '-'}")
        lines.append(f"  producer:      {f.producer_id or '-'}")
        meta = f.metadata or {}
        lines.append("  metadata:      " + (", ".join(f"{k}={meta_text(v)}" for k, v in sorted(meta.items())) or "-"))
        if f.problem is not None:
            lines.append(f"  problem:       {f.problem}")
        if f.payload_length is not None:
            verdict = "verified" if f.payload_verified else "NOT verified"
            lines.append(f"  payload:       {f.payload_length} bytes, {verdict}")
            lines.extend(_payload_lines(f))
    others = [o for o in story.objects if o is not cur]
    for o in others:
        lines.append(f"  also:          {o.state} gen={o.generation} attempt={o.attempt}/{o.max_attempts} {o.path}")
    lines.extend(_journal_lines(story.job_id, journal))
    return lines


def _payload_lines(f: Any) -> list[str]:
    head, total = f.payload_head, f.payload_length
    if not total:
        return []
    if _is_text(f.content_type, head):
        more = f" (first {len(head)} of {total} bytes; --payload writes all)" if len(head) < total else ""
        # Split on LF only: a CR or U+2028 in a payload is a fact to show escaped, not a line break.
        text = _text_of(head).removesuffix("\n")
        return [f"payload (text){more}:", *("  " + line for line in text.split("\n"))]
    shown = head[:_BINARY_DUMP_BYTES]
    more = f" (first {len(shown)} of {total} bytes; --payload writes all)" if len(shown) < total else ""
    return [f"payload (binary){more}:", *_hex_dump(shown)]


def _journal_lines(job: str, journal: Mapping[str, Any] | None) -> list[str]:
    if journal is None:
        return []
    if journal.get("error"):
        return [f"journal: {journal['error']}"]
    entries = journal["entries"]
    if not entries:
        return [
            f"journal: no entries with STEADQ_JOB_ID={job}" + (f" ({journal['note']})" if journal.get("note") else "")
        ]
    omitted = journal.get("omitted") or 0
    if omitted:
        lines = [
            f"journal ({len(entries)} of {len(entries) + omitted} entries with STEADQ_JOB_ID={job}: "
            "the worker's, the job's stderr, its last stdout):"
        ]
    else:
        lines = [f"journal (last {len(entries)} entries with STEADQ_JOB_ID={job}):"]
    for e in entries:
        stream = f" [{e['stream']}]" if e["stream"] else ""
        lines.append(f"  {e['time']} {e['unit'] or e['identifier']}{stream}: {e['message']}")
    if omitted:
        lines.append(f"  ({omitted} lines of stdout not shown: journalctl STEADQ_JOB_ID={job} has all)")
    if journal.get("note"):
        lines.append(f"  ({journal['note']})")
    return lines


def story_json(story: Any, journal: Mapping[str, Any] | None) -> dict[str, Any]:
    """``show --json``: every fact of the plain output, and the payload head as text or base64."""
    f = story.file
    cur = story.current
    doc: dict[str, Any] = {
        "job_id": story.job_id,
        "state": story.state,
        "path": story.path,
        "reason": story.reason,
        "reason_name": _reason_of(story),
        "quarantine_id": story.quarantine_id,
        "generation": None if cur is None else cur.generation,
        "attempt": None if cur is None else cur.attempt,
        "max_attempts": None if cur is None else cur.max_attempts,
        "details": None if cur is None else cur.details,
        "objects": [job_object_json(o) for o in story.objects],
    }
    if f is not None:
        head = f.payload_head
        text = _is_text(f.content_type, head)
        doc.update(
            created_at_ns=f.created_at_ns,
            in_state_since_ns=f.changed_ns,
            content_type=f.content_type,
            producer_id=f.producer_id,
            metadata={k: meta_text(v) for k, v in (f.metadata or {}).items()},
            initial_not_before_ns=f.initial_not_before_ns,
            payload_length=f.payload_length,
            payload_verified=f.payload_verified,
            problem=f.problem,
            payload_head_text=_text_of(head) if text else None,
            payload_head_base64=None if text else base64.b64encode(head).decode("ascii"),
            payload_head_bytes=len(head),
        )
    doc["journal"] = journal
    doc["failure"] = failure_story(journal)
    return doc


_STDERR_TAIL = 10  # stderr lines a failure story keeps (of the entries read, the last ones)


def _count(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def failure_story(journal: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What ``show --json`` readers want of a failed job, from the worker's structured fields.

    ``runs``: each ``job finished`` entry (it carries STEADQ_VERDICT) with its attempt, exit status
    or signal, timeout and duration; ``outcomes``: what followed a verdict (``job retried: delayed``,
    ``job buried: ...``, carrying STEADQ_STATE or STEADQ_REASON); ``reason``: the last dead-letter
    reason logged; ``stderr_tail``: the command's last stderr lines. Every value is already escaped
    and bounded by :func:`_journal_entry`. None when the journal was not read.

    Only a worker unit's entries tell it: any local user can log ``STEADQ_JOB_ID=<id>
    STEADQ_VERDICT=ack``, but not the ``_SYSTEMD_UNIT`` journald adds from the sender's cgroup
    (the ``journal`` list still shows every entry, with its unit)."""
    if journal is None or journal.get("error"):
        return None
    runs: list[dict[str, Any]] = []
    outcomes: list[str] = []
    reason = None
    stderr: list[str] = []
    for e in journal["entries"]:
        f = e["fields"]
        if not (e["unit"].startswith("steadq-worker@") and e["unit"].endswith(".service")):
            continue
        if "verdict" in f:
            runs.append({"attempt": _count(f.get("attempt")), "verdict": f["verdict"],
                         "exit_status": _count(f.get("exit_status")), "signal": f.get("signal"),
                         "timed_out": f.get("timed_out") == "true", "duration_ms": _count(f.get("duration_ms")),
                         "time": e["time"]})  # fmt: skip
        elif "reason" in f or "state" in f:
            outcomes.append(e["message"])
            reason = f.get("reason", reason)
        elif e["stream"] == "stderr":
            stderr.append(e["message"])
    return {"runs": runs, "outcomes": outcomes, "reason": reason, "stderr_tail": stderr[-_STDERR_TAIL:]}


# -- the journal: the job's runs, exits and stderr, as the worker logged them


def pick_entries(entries: list[dict[str, Any]], room: int = _JOURNAL_ENTRIES) -> tuple[list[dict[str, Any]], int]:
    """The entries ``show`` prints, in time order, and how many it leaves out.

    Why not the last ``room``: a job that writes a lot to stdout pushed its
    verdict and its error lines out of them. The worker's own sentences
    (started, finished, buried, with no stream) come first, then the job's
    stderr, then its stdout, each the latest that fit."""
    keep: set[int] = set()
    for group in ([e for e in entries if not e["stream"]], [e for e in entries if e["stream"] == "stderr"],
                  [e for e in entries if e["stream"] and e["stream"] != "stderr"]):  # fmt: skip
        for e in reversed(group):
            if len(keep) >= room:
                break
            keep.add(id(e))
    return [e for e in entries if id(e) in keep], len(entries) - len(keep)


def journal_entries(job: str) -> dict[str, Any]:
    """The job's journal entries (``STEADQ_JOB_ID=``) that ``show`` prints (:func:`pick_entries`), each
    field escaped and bounded; ``omitted`` counts the ones left out.

    ``error`` says plainly why there is nothing to show when the journal
    cannot be read here; ``note`` that entries may be hidden from this user.
    """
    cmd = ["journalctl", "--no-pager", "-o", "json", "-n", str(_JOURNAL_READ), f"STEADQ_JOB_ID={job}"]
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=_JOURNAL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return {"error": "not readable here: journalctl is not installed", "entries": []}
    except subprocess.TimeoutExpired:
        return {"error": f"not readable: journalctl did not answer in {_JOURNAL_TIMEOUT_S:.0f}s", "entries": []}
    stderr = p.stderr.decode("utf-8", "replace").strip()
    if p.returncode != 0:
        why = printable(stderr.splitlines()[0]) if stderr else f"journalctl exited {p.returncode}"
        return {"error": f"not readable: {why[:_JOURNAL_LINE_CHARS]}", "entries": []}
    entries = []
    for raw in p.stdout.splitlines():
        try:
            e = json.loads(raw)
        except ValueError:
            continue
        if isinstance(e, dict):
            entries.append(_journal_entry(e))
    note = None
    if "not seeing messages" in stderr or "No journal files" in stderr:
        note = "some entries may be hidden from this user: run as root or as a member of systemd-journal or adm"
    shown, omitted = pick_entries(entries)
    return {"error": None, "note": note, "entries": shown, "omitted": omitted}


def _journal_field(e: Mapping[str, Any], key: str) -> str:
    v = e.get(key)
    if isinstance(v, list) and all(isinstance(b, int) for b in v):  # journald's form of a non-UTF-8 value
        v = bytes(b & 0xFF for b in v).decode("utf-8", "backslashreplace")
    text = "" if v is None else printable(str(v))
    return text if len(text) <= _JOURNAL_LINE_CHARS else text[:_JOURNAL_LINE_CHARS] + "..."


def _journal_entry(e: Mapping[str, Any]) -> dict[str, Any]:
    usec = _journal_field(e, "__REALTIME_TIMESTAMP")
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(usec) / 1e6)) if usec.isdigit() else "-"
    return {
        "time": when,
        "unit": _journal_field(e, "_SYSTEMD_UNIT"),
        "identifier": _journal_field(e, "SYSLOG_IDENTIFIER"),
        "priority": _journal_field(e, "PRIORITY"),
        "stream": _journal_field(e, "STEADQ_STREAM"),
        "message": _journal_field(e, "MESSAGE"),
        "fields": {
            k.removeprefix("STEADQ_").lower(): _journal_field(e, k)
            for k in sorted(e)
            if isinstance(k, str) and k.startswith("STEADQ_") and k not in _CONTEXT_FIELDS
        },
    }


# Fields every entry of a job's story shares (the query's own) or that the entry has elsewhere.
_CONTEXT_FIELDS = frozenset({"STEADQ_JOB_ID", "STEADQ_QUEUE", "STEADQ_ROLE", "STEADQ_STREAM"})


COMMANDS = {"show": add_show}
