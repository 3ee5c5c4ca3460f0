"""``steadq stats``, ``watch``, ``ls``, ``inspect`` and ``show``: read-only views of a queue.

Their output formats are cli.md's (dashboards and scripts parse them), so
the formatting of each lives here beside its command, and the backend only
hands over records.
"""

from __future__ import annotations

import argparse
import base64
import json
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from steadqd import progress
from steadqd.backend import PauseState, is_bucket_url
from steadqd.cli.common import (
    ALL_STATES,
    CliError,
    Subcommands,
    add_command,
    add_queue_argument,
    discard_stdout,
    duration,
    err,
    error_code,
    error_text,
    find_job,
    int_in,
    job_id,
    job_object_json,
    open_queue,
    os_exit_code,
    out,
    out_json,
    reason_name,
    state_name,
)
from steadqd.cli.control_cmd import pause_json, pause_line
from steadqd.constants import NS_PER_SECOND, U32_MAX, DeadReason, QuarantineReason, State
from steadqd.durations import format_duration
from steadqd.errors import SteadQError
from steadqd.text import printable

# ``ls STATE`` takes these words (the states' own), ``all``, or nothing for all but receipts.
LISTABLE_STATES = tuple(s.value for s in State)


def add_stats(sub: Subcommands) -> None:
    s = add_command(sub, "stats", "object counts and oldest age per state", "steadq stats /srv/q --prometheus")
    add_queue_argument(s)
    s.add_argument("--prometheus", action="store_true", help="print Prometheus text exposition instead")
    s.set_defaults(run=cmd_stats)


def add_inspect(sub: Subcommands) -> None:
    s = add_command(sub, "inspect", "every object of one job", "steadq inspect /srv/q 0123456789abcdef0123456789abcdef")
    add_queue_argument(s)
    s.add_argument("job_id", metavar="JOB_ID")
    s.set_defaults(run=cmd_inspect)


def add_ls(sub: Subcommands) -> None:
    s = add_command(sub, "ls", "list jobs with state, attempt, age and deadline", "steadq ls /srv/q running")
    add_queue_argument(s)
    s.add_argument("state", metavar="STATE", nargs="?", default=None,
                   help="ready | running (or leased) | delayed | dead | receipt | all (default: all but receipts)")  # fmt: skip
    s.add_argument("--meta", action="append", default=[], metavar="KEY",
                   help="add a column of this metadata key (repeatable; reads each job's header)")  # fmt: skip
    s.add_argument("--filter", action="append", default=[], type=_meta_filter, metavar="KEY=VALUE",
                   help="list only the jobs whose metadata KEY is VALUE (repeatable: all must match)")  # fmt: skip
    s.set_defaults(run=cmd_ls)


def _meta_filter(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"invalid --filter {text!r}: expected KEY=VALUE, e.g. task=thumbnail")
    return key, value


def add_watch(sub: Subcommands) -> None:
    s = add_command(
        sub,
        "watch",
        "live view of counts, throughput and oldest job per state (--json: one object per line)",
        "steadq watch /srv/q",
    )
    add_queue_argument(s)
    s.add_argument("--interval", type=duration, default=1.0, metavar="DURATION", help="time between frames")
    s.add_argument("--count", type=int_in(0, U32_MAX, "count"), default=0, metavar="N", help="stop after N frames")
    s.set_defaults(run=cmd_watch)


# =========================================================================== stats / watch


# A running job: one whose lease is held (its command runs now). The spec's state word is "leased",
# which the JSON shapes keep; every plain view says "running", so stats, watch, ls, show, status and
# the daemons' STATUS= use one word (issue 33 #6).
RUNNING = "running"


def shown_state(state: str) -> str:
    """The word a plain view prints for a job state: ``running`` for a leased job, else the state."""
    return RUNNING if state == "leased" else state


def _with_running(s: Mapping[str, Any], running: Any) -> dict[str, Any]:
    """The reference's states plus ``running`` (the leases, which its counting shows inside ``ready``)."""
    return {**s, RUNNING: running} if running is not None else dict(s)


def format_stats_text(s: Mapping[str, Any], running: Any = None) -> str:
    """cli.md plain output, including the final newline: ``ready: 1 (oldest 0s)`` / ``dead: 0``;
    the reference's lines unchanged, plus ``running:`` when given."""
    lines = []
    doc = _with_running(s, running)
    for state in sorted(doc):
        st = doc[state]
        if st.objects and st.oldest_age_seconds is not None:
            lines.append(f"{state}: {st.objects} (oldest {st.oldest_age_seconds}s)")
        else:
            lines.append(f"{state}: {st.objects}")
    return "".join(line + "\n" for line in lines)


def stats_doc(s: Mapping[str, Any], running: Any = None) -> dict[str, Any]:
    """``{state: {objects, oldest_age_seconds}}``, with ``running`` (the leases, also counted in ``ready``) when given."""
    doc = {k: {"objects": v.objects, "oldest_age_seconds": v.oldest_age_seconds} for k, v in s.items()}
    if running is not None:
        doc[RUNNING] = {"objects": running.objects, "oldest_age_seconds": running.oldest_age_seconds}
    return doc


def format_stats_json(s: Mapping[str, Any], running: Any = None, paused: dict[str, object] | None = None) -> str:
    """cli.md ``--json``: 2-space pretty JSON, keys sorted, final newline included;
    ``running`` (the leases, also counted in ``ready``) when given, ``paused`` when the queue is."""
    doc: dict[str, object] = dict(stats_doc(s, running))
    if paused is not None:
        doc["paused"] = paused
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def format_stats_prometheus(s: Mapping[str, Any], running: Any = None) -> str:
    """cli.md ``--prometheus``: object gauges for every state, then age gauges
    for states with objects; no HELP, labels or timestamps; final newline included.
    ``running`` adds its two gauges beside the reference's."""
    doc = _with_running(s, running)
    lines: list[str] = []
    for state in sorted(doc):
        lines.append(f"# TYPE steadq_{state}_objects gauge")
        lines.append(f"steadq_{state}_objects {doc[state].objects}")
    for state in sorted(doc):
        st = doc[state]
        if st.objects and st.oldest_age_seconds is not None:
            lines.append(f"# TYPE steadq_{state}_oldest_age_seconds gauge")
            lines.append(f"steadq_{state}_oldest_age_seconds {st.oldest_age_seconds}")
    return "".join(line + "\n" for line in lines)


def cmd_stats(a: argparse.Namespace) -> int:
    q = open_queue(a.path)
    try:
        try:
            s = q.entry_stats()
            # Leases sit in ready/ and the reference's counting lists them there; every
            # output adds them as "running" (the reference's lines stay as they are).
            running = q.stats()["leased"]
            paused = q.pause_state()
        except OSError as e:
            raise CliError(f"stats: {e.filename}: {e.strerror}", os_exit_code(e)) from e
    finally:
        q.close()
    if a.prometheus:
        text = (
            format_stats_prometheus(s, running)
            + f"# TYPE steadq_paused gauge\nsteadq_paused {int(paused is not None)}\n"
        )
    elif a.json:
        text = format_stats_json(s, running, pause_json(paused))
    else:
        text = format_stats_text(s, running) + ("" if paused is None else printable(pause_line(paused)) + "\n")
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
    return 0


# watch shows jobs by what they are doing: ready (waiting), running, delayed, done, dead;
# "tmp" and "stray" appear only when there are some (fsck names them).
_WATCH_ONLY_WHEN_ANY = ("tmp", "stray")


def watch_counts(detailed: Mapping[str, Any]) -> dict[str, Any]:
    """The rows of ``watch`` from a backend's ``stats()``: the leases (colocated and legacy) as
    ``running``, ``ready`` the jobs waiting; tmp and stray only when there are any."""
    rows = {shown_state(k): v for k, v in detailed.items()}
    return {k: v for k, v in rows.items() if k not in _WATCH_ONLY_WHEN_ANY or v.objects}


def _render_watch(
    path: str,
    s: Mapping[str, Any],
    prev: Mapping[str, Any] | None,
    dt: float,
    paused: PauseState | None = None,
    progress_of: Sequence[tuple[str, Mapping[str, Any]]] = (),
) -> list[str]:
    def count(st: Mapping[str, Any], name: str) -> int:
        v = st.get(name)
        return int(v.objects) if v is not None else 0

    lines = [f"steadq watch {path}   {time.strftime('%Y-%m-%d %H:%M:%S')}", ""]
    lines.append(f"{'STATE':<12}{'OBJECTS':>10}{'CHANGE/S':>12}  OLDEST")
    for name in sorted(s):
        v = s[name]
        rate = "" if prev is None or dt <= 0 else f"{(count(s, name) - count(prev, name)) / dt:+.1f}"
        oldest = "-" if v.oldest_age_seconds is None else format_duration(v.oldest_age_seconds)
        lines.append(f"{name:<12}{v.objects:>10}{rate:>12}  {oldest}")
    lines.append("")
    if paused is not None:
        lines.append(printable(pause_line(paused)))
    for job, prog in progress_of:  # the job's own text: escaped
        lines.append(f"  {job[:8]}  {printable(progress.shown(prog))}")
    if prev is not None and dt > 0:
        done = (count(s, "receipts") - count(prev, "receipts")) / dt
        dead = (count(s, "dead") - count(prev, "dead")) / dt
        backlog = sum(count(s, n) for n in ("ready", RUNNING, "delayed"))
        eta = f", drains in ~{format_duration(backlog / done)}" if done > 0 and backlog else ""
        lines.append(f"throughput: {max(done, 0.0):.1f} acked/s, {max(dead, 0.0):.1f} dead/s, backlog {backlog}{eta}")
    else:
        lines.append("throughput: (measuring)")
    lines.append("press Ctrl-C to quit")
    return lines


# Bounds of ``watch --interval``: shorter would spin on the tree, longer is surely a typo. A bucket
# queue's refresh lists its state prefixes (requests billed and rate-limited), so it refreshes slower.
WATCH_MIN_INTERVAL = 0.1
WATCH_MIN_INTERVAL_BUCKET = 2.0
WATCH_MAX_INTERVAL = 3600.0


def watch_interval(asked: float, *, bucket: bool) -> tuple[float, str | None]:
    """The interval ``watch`` uses for ``asked``, and the note that says so when it differs."""
    floor = WATCH_MIN_INTERVAL_BUCKET if bucket else WATCH_MIN_INTERVAL
    if asked < floor:
        why = "the shortest for a bucket queue: each refresh lists the bucket" if bucket else "the shortest"
        return floor, f"watch: --interval raised to {floor:g}s ({why})"
    if asked > WATCH_MAX_INTERVAL:
        return WATCH_MAX_INTERVAL, f"watch: --interval lowered to {format_duration(WATCH_MAX_INTERVAL)} (the longest)"
    return asked, None


def _watch_frame(
    path: str,
    interval: float,
    s: Mapping[str, Any],
    prev: Mapping[str, Any] | None,
    dt: float,
    paused: PauseState | None = None,
    progress_of: Sequence[tuple[str, Mapping[str, Any]]] = (),
) -> dict[str, Any]:
    """One ``watch --json`` line: the rows ``watch`` shows (``ready`` waiting, ``running`` leased), the time,
    the rates since the last frame, the pause and the running jobs' progress published on this host."""

    def count(st: Mapping[str, Any], name: str) -> int:
        v = st.get(name)
        return int(v.objects) if v is not None else 0

    states = stats_doc(s)
    throughput = None
    if prev is not None and dt > 0:
        throughput = {
            "acked_per_second": round(max(0.0, (count(s, "receipts") - count(prev, "receipts")) / dt), 3),
            "dead_per_second": round(max(0.0, (count(s, "dead") - count(prev, "dead")) / dt), 3),
        }
    return {"time_ns": time.time_ns(), "queue": path, "interval_seconds": interval, "states": states,
            "running": states.get(RUNNING, {"objects": 0, "oldest_age_seconds": None}),
            "paused": pause_json(paused),
            "progress": {job: dict(prog) for job, prog in progress_of},
            "throughput": throughput}  # fmt: skip


class _Stop(Exception):
    """SIGTERM (or SIGINT) asked ``watch`` to stop."""


def _stop(_signum: int, _frame: object) -> None:
    raise _Stop


def _reader_gone(fd: int, timeout: float) -> bool:
    """Sleep up to ``timeout`` seconds, waking early (True) when the reader of pipe ``fd`` closed its end.

    poll reports POLLERR on a pipe whose reader is gone even with no event asked for,
    so a dashboard that stops reading ends the stream at once, not at the next write."""
    p = select.poll()
    p.register(fd, 0)
    return bool(p.poll(max(0, round(timeout * 1000))))


def cmd_watch(a: argparse.Namespace) -> int:
    """Refresh counts every interval; ANSI home+clear on a terminal, plain frames otherwise; ^C exits 0.

    ``--json``: one object per line per refresh, flushed, for a program reading a pipe. A line
    is written whole with SIGTERM and SIGINT blocked, so a stop never leaves half a line."""
    interval, note = watch_interval(a.interval, bucket=is_bucket_url(a.path))
    if note:
        err(note)
    q = open_queue(a.path)
    tty = sys.stdout.isatty() and not a.json
    prev: Mapping[str, Any] | None = None
    prev_t = 0.0
    frames = 0
    stops = (signal.SIGTERM, signal.SIGINT)
    saved = {sig: signal.signal(sig, _stop) for sig in stops} if a.json else {}
    try:
        if tty:
            sys.stdout.write("\x1b[?25l")
        while True:
            t = time.monotonic()
            try:
                s = watch_counts(q.stats())
                paused = q.pause_state()
            except OSError as e:
                raise CliError(f"watch: {e.filename}: {e.strerror}", os_exit_code(e)) from e
            # running jobs' progress, as their workers on this host publish it
            progress_of = progress.published(q.queue_id)
            if a.json:
                frame = _watch_frame(a.path, interval, s, prev, t - prev_t, paused, progress_of)
                line = json.dumps(frame) + "\n"
                signal.pthread_sigmask(signal.SIG_BLOCK, stops)
                try:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
            elif tty:
                lines = _render_watch(a.path, s, prev, t - prev_t, paused, progress_of)
                sys.stdout.write("\x1b[H\x1b[2J" + "\n".join(lines) + "\n")  # the tty adds the \r
            else:
                sys.stdout.write("\n".join(_render_watch(a.path, s, prev, t - prev_t, paused, progress_of)) + "\n\n")
            sys.stdout.flush()
            prev, prev_t = s, t
            frames += 1
            if a.count and frames >= a.count:
                break
            if _reader_gone(sys.stdout.fileno(), interval - (time.monotonic() - t)):
                discard_stdout()
                break
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        if tty:
            sys.stdout.write("\x1b[?25h\n")
            sys.stdout.flush()
        q.close()
    return 0


# =========================================================================== ls


def _fmt_deadline(ns: int | None, now_ns: int, *, due: bool = False) -> str:
    """``due``: the instant is a delayed job's not-before, read as when it runs ("due in 6s")."""
    if ns is None:
        return "-"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns // NS_PER_SECOND))
    delta = (ns - now_ns) / NS_PER_SECOND
    rel = f"in {format_duration(delta)}" if delta >= 0 else f"{format_duration(-delta)} ago"
    return f"{stamp} ({'due ' if due else ''}{rel})"


def cmd_ls(a: argparse.Namespace) -> int:
    """Streamed listing: memory stays flat however many jobs there are."""
    want = (a.state or "").lower()
    want = "leased" if want == RUNNING else want
    if want in ("", "live"):
        states = {"ready", "leased", "delayed", "dead"}
    elif want == "all":
        states = set(LISTABLE_STATES)
    elif want in ("receipts",):
        states = {"receipt"}
    elif want in LISTABLE_STATES:
        states = {want}
    else:
        raise CliError(
            f"ls: unknown state {a.state!r}: expected one of {', '.join(LISTABLE_STATES)}, {RUNNING}, all", 1
        )
    q = open_queue(a.path)  # a missing or foreign path is an error, not an empty listing
    try:
        paused = q.pause_state()
        if paused is not None:  # on stderr: the listing on stdout keeps its shape for scripts
            err(pause_line(paused))
        if a.meta or a.filter:
            try:
                jobs = q.list_jobs(states, metadata=True)
            except SteadQError as e:
                raise CliError(f"ls --meta/--filter: {error_text(e)}", error_code(e)) from e
            jobs = _matching(jobs, a.filter) if a.filter else jobs
        else:
            jobs = q.list_jobs(states)
        _print_jobs(jobs, a.json, reasons=states == {"dead"}, meta=a.meta, queue_id=q.queue_id)
    finally:
        q.close()
    return 0


def _matching(jobs: Iterator[Any], filters: list[tuple[str, str]]) -> Iterator[Any]:
    """The jobs whose metadata has every KEY=VALUE of ``filters`` (values compared as ``show`` prints them)."""
    for job in jobs:
        meta = job.metadata or {}
        if all(k in meta and _meta_text(meta[k]) == v for k, v in filters):
            yield job


def _print_jobs(
    jobs: Iterator[Any],
    as_json: bool,
    *,
    reasons: bool = False,
    meta: list[str] | None = None,
    queue_id: str | None = None,
) -> None:
    """``reasons``: only dead jobs are listed, which have no deadline: the last column is their reason by name.
    ``meta``: a column per metadata key, before the last (values escaped: they are the producer's text).
    ``queue_id``: a running job's progress, published by its worker on this host, follows its deadline."""
    now_ns = time.time_ns()
    first = True
    listed = running = 0  # a person at a terminal gets the totals (a pipe gets the table only)
    meta = meta or []
    if as_json:
        sys.stdout.write("[")
    else:
        heads = "".join(f"{k.upper():<{_meta_width(k)}}  " for k in meta)
        out(f"{'STATE':<8} {'JOB_ID':<32} {'ATTEMPT':>9} {'AGE':>7}  {heads}{'REASON' if reasons else 'DEADLINE'}")
    for job in jobs:
        state = job.state
        listed += 1
        running += state == "leased"
        age = None if job.mtime_ns is None else max(0, (now_ns - job.mtime_ns) // NS_PER_SECOND)
        deadline = job.deadline_ns
        prog = progress.lookup(queue_id, job.job_id) if queue_id and state == "leased" else None
        if as_json:
            doc = {
                "state": state,
                "job_id": job.job_id,
                "generation": job.generation,
                "attempt": job.attempt,
                "max_attempts": job.max_attempts,
                "age_seconds": age,
                "deadline_ns": deadline,
                "path": job.path,
            }
            if state == "dead":
                doc["reason"] = job.reason
                doc["reason_name"] = reason_name(job.reason)
            if meta:
                have = job.metadata or {}
                doc["metadata"] = {k: _meta_text(have[k]) for k in meta if k in have}
            if prog is not None:
                doc["progress"] = prog
            sys.stdout.write(("\n  " if first else ",\n  ") + json.dumps(doc))
        else:
            attempt = f"{job.attempt}/{job.max_attempts}"
            shown_age = "-" if age is None else f"{age}s"  # as stats prints ages (the reference's)
            shown_deadline = _fmt_deadline(deadline, now_ns, due=state == "delayed")
            if reasons:
                shown_deadline = reason_name(job.reason)
            if prog is not None:  # the job's text: escaped
                shown_deadline += "  " + printable(progress.shown(prog))
            cells = "".join(f"{_meta_cell(job.metadata, k):<{_meta_width(k)}}  " for k in meta)
            line = f"{shown_state(state):<8} {job.job_id:<32} {attempt:>9} {shown_age:>7}  {cells}{shown_deadline}"
            sys.stdout.write(line + "\n")
        first = False
    if as_json:
        sys.stdout.write("]\n" if first else "\n]\n")
    elif sys.stdout.isatty():
        sys.stdout.write(f"{listed} jobs, {running} running\n")
    sys.stdout.flush()


# =========================================================================== inspect


def cmd_inspect(a: argparse.Namespace) -> int:
    job = job_id(a.job_id)
    q = open_queue(a.path)
    try:
        job = find_job(q, job, ALL_STATES)
        try:
            objs = q.inspect_detailed(job)
        except Exception as e:  # noqa: BLE001
            raise CliError(f"inspect failed: {error_text(e)}", error_code(e)) from e
    finally:
        q.close()
    if a.json:
        out_json([job_object_json(o) for o in objs])
        return 0 if objs else 1
    if not objs:
        raise CliError("not found", 1)
    out(*(format_inspect_line(o) for o in objs))
    return 0


def format_inspect_line(o: Any) -> str:
    """``<state> gen=<g> attempt=<a>/<max> <relative path>`` (cli.md)."""
    return f"{state_name(o.state)} gen={o.generation} attempt={o.attempt}/{o.max_attempts} {o.path}"


# =========================================================================== show

SHOW_HEAD_BYTES = 4096  # the payload shown inline; --payload writes all of it
_BINARY_DUMP_BYTES = 256  # a binary payload is shown as a hex dump of this much
_JOURNAL_ENTRIES = 20  # shown
_JOURNAL_READ = 1000  # read, to choose those from
_JOURNAL_LINE_CHARS = 400
_JOURNAL_TIMEOUT_S = 10.0
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/x-ndjson", "application/yaml")


def add_show(sub: Subcommands) -> None:
    s = add_command(sub, "show", "one job's whole story: state, attempts, ages, metadata, payload, journal",
                    "steadq show /srv/q 0123456789abcdef0123456789abcdef")  # fmt: skip
    add_queue_argument(s)
    s.add_argument("job_id", metavar="JOB_ID")
    s.add_argument("--payload", action="store_true",
                   help="write the whole payload to stdout, and only once it has verified (nothing else is printed)")  # fmt: skip
    s.add_argument("--no-journal", action="store_true", help="do not look for the job's lines in the journal")
    s.set_defaults(run=cmd_show)


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
            raise CliError(f"show: {error_text(e)}", error_code(e)) from e
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
        raise CliError(f"show --payload: {error_text(e)} (nothing was written)", error_code(e)) from e
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
    return _fmt_deadline(ns, now_ns)


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
        lines.append("  metadata:      " + (", ".join(f"{k}={_meta_text(v)}" for k, v in sorted(meta.items())) or "-"))
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


def _meta_text(v: object) -> str:
    return v.hex() if isinstance(v, bytes) else str(v)


def _meta_width(key: str) -> int:
    return max(len(key), 16)


def _meta_cell(metadata: Mapping[str, object] | None, key: str) -> str:
    """One ``ls --meta`` cell: the value escaped, with no space in it (a column splits on spaces), or ``-``."""
    if not metadata or key not in metadata:
        return "-"
    return printable(_meta_text(metadata[key])).replace(" ", "\\x20") or '""'


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
            metadata={k: _meta_text(v) for k, v in (f.metadata or {}).items()},
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


COMMANDS = {"stats": add_stats, "inspect": add_inspect, "ls": add_ls, "watch": add_watch, "show": add_show}
