"""``steadq cancel QUEUE JOB_ID...``: a ready, delayed or running job becomes dead, reason ``cancelled``.

An extra (not in the reference's cli.md). Each job is looked up (a prefix as the
journal shows it is resolved among all the queue's jobs, an ambiguous one lists
the candidates) and cancelled by the backend in one durable step; the line
printed for it says what actually happened, because a cancel can lose a race
with the job's own ack, retry or bury: exactly one of them took effect.

Exit status: 0 when every job named is now dead ``cancelled`` (by this command
or an earlier cancel); 1 when one was not found, was ambiguous, or had already
settled otherwise (acked, or dead for another reason: nothing was changed);
2 when a cancel's outcome is unknown; else the error's own code. The highest
status of the jobs named is the command's.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from steadqd.backend import Backend
from steadqd.cli.common import (
    ALL_STATES,
    CliError,
    Subcommands,
    add_queue_command,
    err,
    error_text,
    find_job,
    job_id,
    open_queue,
    out,
    out_json,
    reason_name,
)
from steadqd.constants import Cancellation, CancelResult, DeadReason
from steadqd.errors import ErrorKind, OutcomeUnknown, SteadQError

__all__ = ["COMMANDS", "cancel_line"]

# How the operator reads the state a cancelled job was in.
_WAS = {"ready": "ready", "delayed": "delayed", "leased": "running"}


def add_cancel(sub: Subcommands) -> None:
    c = add_queue_command(
        sub,
        "cancel",
        "cancel jobs: a ready, delayed or running job becomes dead with reason cancelled (a running one is killed)",
        "steadq cancel /srv/q fed535fe",
        run=cmd_cancel,
    )
    c.add_argument("job_ids", nargs="+", metavar="JOB_ID", help="the jobs to cancel (whole ids or unique prefixes)")


def cancel_line(job: str, c: Cancellation) -> tuple[str, int]:
    """The line printed for one job and the exit status it asks for."""
    if c.result is CancelResult.CANCELLED:
        return f"{job} cancelled (was {_WAS.get(c.was, c.was)})", 0
    if c.result is CancelResult.REQUESTED:  # a bucket job someone holds: its holder buries it (s3/cancel.py)
        return f"{job} cancel requested (was {_WAS.get(c.was, c.was)}): its worker stops and buries it", 0
    if c.result is CancelResult.ALREADY_ACKED:
        return f"{job} already acked: nothing changed", 1
    reason = DeadReason.UNSPECIFIED if c.reason is None else c.reason
    if reason == DeadReason.CANCELLED:
        return f"{job} already cancelled: nothing changed", 0
    return f"{job} already dead (reason {reason_name(reason)}): nothing changed", 1


def _json(job: str, c: Cancellation) -> dict[str, Any]:
    doc: dict[str, Any] = {"job_id": job, "result": c.result.value, "was": c.was}
    if c.reason is not None:
        doc["reason"] = c.reason
        doc["reason_name"] = reason_name(c.reason)
    return doc


def _cancel_one(q: Backend, text: str) -> tuple[str, Cancellation]:
    job = find_job(q, job_id(text), ALL_STATES)
    try:
        return job, q.cancel(job)
    except OutcomeUnknown as e:
        raise CliError(
            [f"{job}: outcome unknown: {e.message}", f"steadq show {q.path} {job} says where it is"], 2
        ) from e
    except SteadQError as e:
        if e.kind is ErrorKind.NOT_FOUND:
            raise CliError(f"not found: no job {job} in {q.path}", 1) from e
        raise CliError(f"{job}: not cancelled: {e.message}", e.exit_code) from e


def cmd_cancel(a: argparse.Namespace) -> int:
    q = open_queue(a.path)
    code = 0
    docs: list[dict[str, Any]] = []
    try:
        for text in a.job_ids:
            try:
                job, c = _cancel_one(q, text)
            except CliError as e:
                err(*e.lines)
                code = max(code, e.code)
                if e.code == 2:  # the handle is poisoned: the next jobs need a new one
                    with contextlib.suppress(Exception):
                        q.close()
                    q = open_queue(a.path)
                continue
            line, status = cancel_line(job, c)
            code = max(code, status)
            if a.json:
                docs.append(_json(job, c))
            else:
                out(line)
    except OSError as e:
        raise CliError(f"cancel: {error_text(e)}", 6) from e
    finally:
        with contextlib.suppress(Exception):
            q.close()
    if a.json:
        out_json(docs)
    return code


COMMANDS = {"cancel": add_cancel}
