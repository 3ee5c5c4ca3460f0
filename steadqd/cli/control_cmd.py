"""``steadq pause`` and ``steadq resume``: stop and restart the claiming of a whole queue.

The pause lives in the queue itself (steadqd.queue_control: a filesystem
queue's ``control/paused``, a bucket queue's ``meta/steadq-paused``), so it
survives daemon restarts and reboots and every host of a bucket sees it.
Workers stop claiming (running jobs finish), producers go on, the sweeper
and promoter go on. What is shown of a record is escaped: a group member
wrote it.
"""

from __future__ import annotations

import argparse

from steadqd.backend import PauseState
from steadqd.cli.common import (
    Subcommands,
    add_queue_command,
    err,
    open_queue,
    out,
    out_json,
)

__all__ = ["COMMANDS", "pause_json", "pause_line"]


def pause_line(state: PauseState | None) -> str:
    """``paused: ...`` or ``paused: no``, the line stats, watch and ls print."""
    return "paused: no" if state is None else f"paused: yes ({state.summary().removeprefix('paused').strip()})"


def pause_json(state: PauseState | None) -> dict[str, object] | None:
    if state is None:
        return None
    return {"reason": state.reason, "since_ns": state.since_ns, "by": state.by, "problem": state.problem}


def add_pause(sub: Subcommands) -> None:
    s = add_queue_command(
        sub,
        "pause",
        "stop workers claiming jobs from a queue (running jobs finish; put goes on) until resume",
        "steadq pause /srv/q --reason 'disk migration'",
        run=cmd_pause,
    )
    s.add_argument("--reason", default="", metavar="TEXT", help="why, shown by stats, ls, watch and the daemons")


def add_resume(sub: Subcommands) -> None:
    add_queue_command(
        sub, "resume", "let workers claim jobs from a paused queue again", "steadq resume /srv/q", run=cmd_resume
    )


def cmd_pause(a: argparse.Namespace) -> int:
    q = open_queue(a.path)
    try:
        state = q.pause(a.reason)
    finally:
        q.close()
    if a.json:
        out_json({"paused": pause_json(state)})
    else:
        out(f"{a.path}: {state.summary()}")
    return 0


def cmd_resume(a: argparse.Namespace) -> int:
    q = open_queue(a.path)
    try:
        was = q.resume()
    finally:
        q.close()
    if a.json:
        out_json({"resumed": was is not None, "was": pause_json(was)})
    elif was is None:
        err(f"{a.path}: was not paused")
    else:
        out(f"{a.path}: resumed (was {was.summary()})")
    return 0


COMMANDS = {"pause": add_pause, "resume": add_resume}
