"""``steadq watch``: the live view of a queue's counts, rates and running jobs, and its ``--json`` frames.

Apart from stats because it is a loop with its own concerns: the refresh interval's bounds, the
terminal's frames, a line written whole between stop signals, and a reader that went away.
"""

from __future__ import annotations

import argparse
import json
import select
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from steadqd import progress
from steadqd.backend import PauseState, is_bucket_url
from steadqd.cli.common import (
    CliError,
    Subcommands,
    add_queue_command,
    discard_stdout,
    duration,
    err,
    int_in,
    open_queue,
    os_exit_code,
)
from steadqd.cli.control_cmd import pause_json, pause_line
from steadqd.cli.view_cmd import RUNNING, shown_state, stats_doc
from steadqd.constants import U32_MAX
from steadqd.durations import format_duration
from steadqd.text import printable


def add_watch(sub: Subcommands) -> None:
    s = add_queue_command(
        sub,
        "watch",
        "live view of counts, throughput and oldest job per state (--json: one object per line)",
        "steadq watch /srv/q",
        run=cmd_watch,
    )
    s.add_argument("--interval", type=duration, default=1.0, metavar="DURATION", help="time between frames")
    s.add_argument("--count", type=int_in(0, U32_MAX, "count"), default=0, metavar="N", help="stop after N frames")


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


COMMANDS = {"watch": add_watch}
