"""``steadq stats``, ``watch``, ``ls`` and ``inspect``: read-only views of a queue.

Their output formats are cli.md's (dashboards and scripts parse them), so
the formatting of each lives here beside its command, and the backend only
hands over records.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from steadqd.cli.common import (
    CliError,
    Subcommands,
    add_command,
    duration,
    error_code,
    error_text,
    int_in,
    job_id,
    job_object_json,
    open_queue,
    os_exit_code,
    out,
    out_json,
    state_name,
)
from steadqd.constants import NS_PER_SECOND, U32_MAX, State
from steadqd.durations import format_duration

# ``ls STATE`` takes these words (the states' own), ``all``, or nothing for all but receipts.
LISTABLE_STATES = tuple(s.value for s in State)


def add_stats(sub: Subcommands) -> None:
    s = add_command(sub, "stats", "object counts and oldest age per state", "steadq stats /srv/q --prometheus")
    s.add_argument("path", metavar="PATH")
    s.add_argument("--prometheus", action="store_true")
    s.set_defaults(run=cmd_stats)


def add_inspect(sub: Subcommands) -> None:
    s = add_command(sub, "inspect", "every object of one job", "steadq inspect /srv/q 0123456789abcdef0123456789abcdef")
    s.add_argument("path", metavar="PATH")
    s.add_argument("job_id", metavar="JOB_ID")
    s.set_defaults(run=cmd_inspect)


def add_ls(sub: Subcommands) -> None:
    s = add_command(sub, "ls", "list jobs with state, attempt, age and deadline", "steadq ls /srv/q leased")
    s.add_argument("path", metavar="QUEUE")
    s.add_argument("state", metavar="STATE", nargs="?", default=None,
                   help="ready | leased | delayed | dead | receipt | all (default: all but receipts)")  # fmt: skip
    s.set_defaults(run=cmd_ls)


def add_watch(sub: Subcommands) -> None:
    s = add_command(sub, "watch", "live view of counts, throughput and oldest job per state", "steadq watch /srv/q")
    s.add_argument("path", metavar="QUEUE")
    s.add_argument("--interval", type=duration, default=1.0, metavar="DURATION")
    s.add_argument("--count", type=int_in(0, U32_MAX, "count"), default=0, metavar="N", help="stop after N frames")
    s.set_defaults(run=cmd_watch)


# =========================================================================== stats / watch


def format_stats_text(s: Mapping[str, Any]) -> str:
    """cli.md plain output, including the final newline: ``ready: 1 (oldest 0s)`` / ``dead: 0``."""
    lines = []
    for state in sorted(s):
        st = s[state]
        if st.objects and st.oldest_age_seconds is not None:
            lines.append(f"{state}: {st.objects} (oldest {st.oldest_age_seconds}s)")
        else:
            lines.append(f"{state}: {st.objects}")
    return "".join(line + "\n" for line in lines)


def format_stats_json(s: Mapping[str, Any]) -> str:
    """cli.md ``--json``: 2-space pretty JSON, keys sorted, final newline included."""
    doc = {k: {"objects": v.objects, "oldest_age_seconds": v.oldest_age_seconds} for k, v in s.items()}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def format_stats_prometheus(s: Mapping[str, Any]) -> str:
    """cli.md ``--prometheus``: object gauges for every state, then age gauges
    for states with objects; no HELP, labels or timestamps; final newline included."""
    lines: list[str] = []
    for state in sorted(s):
        lines.append(f"# TYPE steadq_{state}_objects gauge")
        lines.append(f"steadq_{state}_objects {s[state].objects}")
    for state in sorted(s):
        st = s[state]
        if st.objects and st.oldest_age_seconds is not None:
            lines.append(f"# TYPE steadq_{state}_oldest_age_seconds gauge")
            lines.append(f"steadq_{state}_oldest_age_seconds {st.oldest_age_seconds}")
    return "".join(line + "\n" for line in lines)


def cmd_stats(a: argparse.Namespace) -> int:
    q = open_queue(a.path)
    try:
        try:
            s = q.entry_stats()
        except OSError as e:
            raise CliError(f"stats: {e.filename}: {e.strerror}", os_exit_code(e)) from e
    finally:
        q.close()
    if a.prometheus:
        text = format_stats_prometheus(s)
    elif a.json:
        text = format_stats_json(s)
    else:
        text = format_stats_text(s)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
    return 0


def _render_watch(path: str, s: Mapping[str, Any], prev: Mapping[str, Any] | None, dt: float) -> list[str]:
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
    if prev is not None and dt > 0:
        done = (count(s, "receipts") - count(prev, "receipts")) / dt
        dead = (count(s, "dead") - count(prev, "dead")) / dt
        backlog = sum(count(s, n) for n in ("ready", "leased", "delayed"))
        eta = f", drains in ~{format_duration(backlog / done)}" if done > 0 and backlog else ""
        lines.append(f"throughput: {max(done, 0.0):.1f} acked/s, {max(dead, 0.0):.1f} dead/s, backlog {backlog}{eta}")
    else:
        lines.append("throughput: (measuring)")
    lines.append("press Ctrl-C to quit")
    return lines


def cmd_watch(a: argparse.Namespace) -> int:
    """Refresh counts every interval; ANSI home+clear on a terminal, plain frames otherwise; ^C exits 0."""
    q = open_queue(a.path)
    tty = sys.stdout.isatty()
    prev: Mapping[str, Any] | None = None
    prev_t = 0.0
    frames = 0
    try:
        if tty:
            sys.stdout.write("\x1b[?25l")
        while True:
            t = time.monotonic()
            try:
                s = q.entry_stats()
            except OSError as e:
                raise CliError(f"watch: {e.filename}: {e.strerror}", os_exit_code(e)) from e
            lines = _render_watch(a.path, s, prev, t - prev_t)
            if tty:
                sys.stdout.write("\x1b[H\x1b[2J" + "\n".join(lines) + "\n")  # the tty adds the \r
            else:
                sys.stdout.write("\n".join(lines) + "\n\n")
            sys.stdout.flush()
            prev, prev_t = s, t
            frames += 1
            if a.count and frames >= a.count:
                break
            time.sleep(max(0.0, a.interval - (time.monotonic() - t)))
    except KeyboardInterrupt:
        pass
    finally:
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
    if want in ("", "live"):
        states = {"ready", "leased", "delayed", "dead"}
    elif want == "all":
        states = set(LISTABLE_STATES)
    elif want in ("receipts",):
        states = {"receipt"}
    elif want in LISTABLE_STATES:
        states = {want}
    else:
        raise CliError(f"ls: unknown state {a.state!r}: expected one of {', '.join(LISTABLE_STATES)}, all", 1)
    q = open_queue(a.path)  # a missing or foreign path is an error, not an empty listing
    try:
        _print_jobs(q.list_jobs(states), a.json)
    finally:
        q.close()
    return 0


def _print_jobs(jobs: Iterator[Any], as_json: bool) -> None:
    now_ns = time.time_ns()
    first = True
    if as_json:
        sys.stdout.write("[")
    else:
        out(f"{'STATE':<8} {'JOB_ID':<32} {'ATTEMPT':>9} {'AGE':>7}  DEADLINE")
    for job in jobs:
        state = job.state
        age = None if job.mtime_ns is None else max(0, (now_ns - job.mtime_ns) // NS_PER_SECOND)
        deadline = job.deadline_ns
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
            sys.stdout.write(("\n  " if first else ",\n  ") + json.dumps(doc))
        else:
            attempt = f"{job.attempt}/{job.max_attempts}"
            shown_age = "-" if age is None else format_duration(age)
            shown_deadline = _fmt_deadline(deadline, now_ns, due=state == "delayed")
            sys.stdout.write(f"{state:<8} {job.job_id:<32} {attempt:>9} {shown_age:>7}  {shown_deadline}\n")
        first = False
    if as_json:
        sys.stdout.write("]\n" if first else "\n]\n")
    sys.stdout.flush()


# =========================================================================== inspect


def cmd_inspect(a: argparse.Namespace) -> int:
    job = job_id(a.job_id)
    q = open_queue(a.path)
    try:
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


COMMANDS = {"stats": add_stats, "inspect": add_inspect, "ls": add_ls, "watch": add_watch}
