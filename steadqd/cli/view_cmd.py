"""``steadq stats``, ``ls`` and ``inspect``: read-only views of a queue's counts and jobs.

Their output formats are cli.md's (dashboards and scripts parse them), so
the formatting of each lives here beside its command, and the backend only
hands over records. ``watch`` (watch_cmd) and ``show`` (show_cmd) build on
the words and columns defined here (``running``, the metadata cells).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from steadqd import progress
from steadqd.cli.common import (
    ALL_STATES,
    CliError,
    Subcommands,
    add_queue_command,
    err,
    failure,
    find_job,
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
from steadqd.constants import NS_PER_SECOND, State
from steadqd.durations import format_duration
from steadqd.errors import SteadQError
from steadqd.text import printable

# ``ls STATE`` takes these words (the states' own), ``all``, or nothing for all but receipts.
LISTABLE_STATES = tuple(s.value for s in State)


def add_stats(sub: Subcommands) -> None:
    s = add_queue_command(
        sub, "stats", "object counts and oldest age per state", "steadq stats /srv/q --prometheus", run=cmd_stats
    )
    s.add_argument("--prometheus", action="store_true", help="print Prometheus text exposition instead")


def add_inspect(sub: Subcommands) -> None:
    s = add_queue_command(
        sub,
        "inspect",
        "every object of one job",
        "steadq inspect /srv/q 0123456789abcdef0123456789abcdef",
        run=cmd_inspect,
    )
    s.add_argument("job_id", metavar="JOB_ID")


def add_ls(sub: Subcommands) -> None:
    s = add_queue_command(
        sub, "ls", "list jobs with state, attempt, age and deadline", "steadq ls /srv/q running", run=cmd_ls
    )
    s.add_argument("state", metavar="STATE", nargs="?", default=None,
                   help="ready | running (or leased) | delayed | dead | receipt | all (default: all but receipts)")  # fmt: skip
    s.add_argument("--meta", action="append", default=[], metavar="KEY",
                   help="add a column of this metadata key (repeatable; reads each job's header)")  # fmt: skip
    s.add_argument("--filter", action="append", default=[], type=_meta_filter, metavar="KEY=VALUE",
                   help="list only the jobs whose metadata KEY is VALUE (repeatable: all must match)")  # fmt: skip


def _meta_filter(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"invalid --filter {text!r}: expected KEY=VALUE, e.g. task=thumbnail")
    return key, value


# =========================================================================== stats


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


# =========================================================================== ls


def fmt_deadline(ns: int | None, now_ns: int, *, due: bool = False) -> str:
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
                raise failure("ls --meta/--filter", e) from e
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
        if all(k in meta and meta_text(meta[k]) == v for k, v in filters):
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
                doc["metadata"] = {k: meta_text(have[k]) for k in meta if k in have}
            if prog is not None:
                doc["progress"] = prog
            sys.stdout.write(("\n  " if first else ",\n  ") + json.dumps(doc))
        else:
            attempt = f"{job.attempt}/{job.max_attempts}"
            shown_age = "-" if age is None else f"{age}s"  # as stats prints ages (the reference's)
            shown_deadline = fmt_deadline(deadline, now_ns, due=state == "delayed")
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
            raise failure("inspect failed", e) from e
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


def meta_text(v: object) -> str:
    return v.hex() if isinstance(v, bytes) else str(v)


def _meta_width(key: str) -> int:
    return max(len(key), 16)


def _meta_cell(metadata: Mapping[str, object] | None, key: str) -> str:
    """One ``ls --meta`` cell: the value escaped, with no space in it (a column splits on spaces), or ``-``."""
    if not metadata or key not in metadata:
        return "-"
    return printable(meta_text(metadata[key])).replace(" ", "\\x20") or '""'


COMMANDS = {"stats": add_stats, "inspect": add_inspect, "ls": add_ls}
