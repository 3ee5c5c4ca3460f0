"""``steadq list`` and ``steadq status [QUEUE]``: the configured queues, their counts and their units.

Why: the first thing a newcomer types on a machine running steadq is ``steadq
list`` or ``steadq status``, and before these they got "invalid choice". The
queues are the daemons' config files (``<config dir>/*.yaml``), so this is the
one view of what the machine runs: each queue's jobs (ready, delayed, running,
dead) and its three units, as ``systemctl is-active`` reports them. A machine
without systemd (a container, ``steadqd run`` in a shell) is said plainly, not
treated as a failure. ``--json`` has a stable shape (docs/cli.md) for dashboards.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
from dataclasses import dataclass
from typing import Any

from steadqd.cli.common import (
    CliError,
    Subcommands,
    add_command,
    err,
    error_text,
    open_queue,
    os_exit_code,
    out,
    out_json,
    resolve_queue,
)
from steadqd.cli.control_cmd import pause_json
from steadqd.errors import ConfigError
from steadqd.queue_names import config_dir, configured_names, is_queue_name, read_queue_entry

ROLES = ("worker", "sweeper", "promoter")
COUNTED = ("ready", "delayed", "running", "dead")  # running: the leased jobs, whose commands run now
_SYSTEMCTL_TIMEOUT_S = 10.0


def add_list(sub: Subcommands) -> None:
    s = add_command(sub, "list", "every configured queue: its counts and its units (as status)", "steadq list")
    s.set_defaults(run=cmd_status, queue=None)


def add_status(sub: Subcommands) -> None:
    s = add_command(sub, "status", "the configured queues (or one): counts and units", "steadq status transcode")
    s.add_argument("queue", metavar="QUEUE", nargs="?", default=None, help="one queue (default: every configured one)")
    s.set_defaults(run=cmd_status)


@dataclass
class _Row:
    name: str | None  # None: a queue given by its path, which has no units
    config: str | None
    queue: str | None
    counts: dict[str, int] | None = None
    ages: dict[str, int | None] | None = None  # oldest_age_seconds per counted state
    paused: dict[str, object] | None = None  # control_cmd.pause_json of the queue's pause, None when it runs
    error: str | None = None
    units: dict[str, str] | None = None


_STATS_KEY = {"ready": "ready", "delayed": "delayed", "running": "leased", "dead": "dead"}  # COUNTED -> stats()


def _counts(
    target: str, options: dict[str, Any]
) -> tuple[dict[str, int], dict[str, int | None], dict[str, object] | None]:
    """The jobs per counted state, how long the oldest of each has been there (None: none is), and the pause."""
    q = open_queue(target, **options)
    try:
        stats = q.stats()
        paused = pause_json(q.pause_state())
    finally:
        with contextlib.suppress(Exception):
            q.close()
    counts: dict[str, int] = {}
    ages: dict[str, int | None] = {}
    for word in COUNTED:
        v = stats.get(_STATS_KEY[word])
        counts[word] = int(v.objects) if v is not None else 0
        ages[word] = v.oldest_age_seconds if v is not None and v.objects else None
    return counts, ages, paused


def _row(name: str, directory: str | None) -> _Row:
    """One configured queue; a problem is its row's ``error``, never the end of the listing."""
    try:
        entry = read_queue_entry(name, directory)
    except ConfigError as e:
        return _Row(name, None, None, error=e.message)
    except OSError as e:
        return _Row(name, None, None, error=f"cannot read its configuration: {error_text(e)}")
    row = _Row(name, entry.config, entry.queue)
    try:
        row.counts, row.ages, row.paused = _counts(entry.queue, entry.options)
    except CliError as e:
        row.error = "; ".join(e.lines)
    except Exception as e:  # noqa: BLE001 - a queue that cannot be counted is said in its row
        row.error = f"cannot count the jobs: {error_text(e)}"
    return row


def unit_states(names: list[str]) -> dict[str, dict[str, str]] | None:
    """``{queue: {unit: state}}`` from one ``systemctl is-active`` call; None when systemd does not answer.

    systemctl prints one state per unit it was asked about; anything else (no
    systemctl, "System has not been booted with systemd", a timeout) means the
    states cannot be known here, which is not the queues' failure."""
    units = [f"steadq-{role}@{name}" for name in names for role in ROLES]
    if not units:
        return {}
    try:
        p = subprocess.run(
            ["systemctl", "is-active", *(f"{u}.service" for u in units)],
            capture_output=True,
            text=True,
            timeout=_SYSTEMCTL_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    states = p.stdout.split()
    if len(states) != len(units) or not all(s.isalpha() or "-" in s for s in states):
        return None
    by_unit = dict(zip(units, states, strict=True))
    return {name: {f"steadq-{r}@{name}": by_unit[f"steadq-{r}@{name}"] for r in ROLES} for name in names}


def cmd_status(a: argparse.Namespace) -> int:
    directory = config_dir(a.config_dir)
    if a.queue is None:
        try:
            names = configured_names(directory)
        except FileNotFoundError:
            names = []
        except OSError as e:
            raise CliError(f"cannot list {directory}: {e.strerror}", os_exit_code(e)) from e
        if not names:
            err(f"no queues configured: {directory} has no <queue>.yaml files (give --config-dir DIR)")
            if a.json:
                out_json({"config_dir": directory, "systemd": None, "queues": []})
            return 0
        rows = [_row(n, directory) for n in names]
    elif is_queue_name(a.queue) and not os.path.lexists(a.queue) and "/" not in a.queue:
        resolve_queue(a.queue, directory)  # a name that is neither a queue nor a path: refused with a suggestion
        rows = [_row(a.queue, directory)]
    else:  # a path: counts only, no units
        row = _Row(None, None, a.queue)
        try:
            row.counts, row.ages, row.paused = _counts(a.queue, {})
        except CliError as e:
            row.error = "; ".join(e.lines)
        rows = [row]
    named = [r.name for r in rows if r.name is not None]
    units = unit_states(named)
    for r in rows:
        if units is not None and r.name is not None:
            r.units = units[r.name]
    if a.json:
        out_json(
            {
                "config_dir": directory,
                "systemd": units is not None,
                "queues": [
                    {"name": r.name, "config": r.config, "queue": r.queue, "counts": r.counts,
                     "oldest_age_seconds": r.ages, "paused": r.paused, "error": r.error, "units": r.units}
                    for r in rows
                ],
            }
        )  # fmt: skip
    elif a.queue is None:
        _table(rows, units is not None)
    else:
        _one(rows[0], units is not None)
    return 1 if any(r.error for r in rows) else 0


def _table(rows: list[_Row], systemd: bool) -> None:
    width = max(len("QUEUE"), *(len(r.name or "") for r in rows))
    head = f"{'QUEUE':<{width}} {'READY':>7} {'DELAYED':>7} {'RUNNING':>7} {'DEAD':>7}"
    out(f"{head}  {'WORKER':<10} {'SWEEPER':<10} {'PROMOTER':<10} WHERE")
    for r in rows:
        c = r.counts
        counts = " ".join(f"{(c[k] if c else '-'):>7}" for k in COUNTED)
        u = r.units or {}
        states = " ".join(f"{u.get(f'steadq-{role}@{r.name}', '-'):<10}" for role in ROLES)
        where = r.queue or "-"
        if r.error:
            where = r.error if r.queue is None or r.queue in r.error else f"{r.queue}: {r.error}"
        out(f"{r.name or '':<{width}} {counts}  {states} {where}")
    if not systemd:
        out("units: systemd not running here (unit states unknown)")


def _one(r: _Row, systemd: bool) -> None:
    lines = [f"queue: {r.name or r.queue}" + (f" ({r.config})" if r.config else ""), f"where: {r.queue or '-'}"]
    if r.counts is not None:
        lines += [f"{k}: {r.counts[k]}" for k in COUNTED]
    if r.error:
        lines.append(f"error: {r.error}")
    if r.name is None:
        lines.append("units: none (a queue given by its path, not a configured name)")
    elif r.units is not None:
        lines += [f"{unit}: {state}" for unit, state in r.units.items()]
    elif not systemd:
        lines.append("units: systemd not running here (unit states unknown)")
    out(*lines)


COMMANDS = {"list": add_list, "status": add_status}
