"""``steadq admin …``: the operator's tools for dead letters and quarantine.

Open failures exit 6 here (cli.md), not with the error's own code, and a
missing object is "not found" with exit 1. ``dead-list`` opens no queue: it
must work on a tree that is too damaged to open.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from typing import Any

from steadqd.backend import Backend, list_dead_files
from steadqd.cli.common import (
    HEX32,
    CliError,
    Parser,
    Subcommands,
    add_command,
    err,
    error_text,
    escape,
    job_id,
    job_object_json,
    open_queue,
    out,
    out_json,
    state_name,
)
from steadqd.errors import ErrorKind, OutcomeUnknown, SteadQError


def add_admin(sub: Subcommands) -> None:
    adm = add_command(sub, "admin", "operator commands for dead letters and quarantine")
    asub = adm.add_subparsers(dest="admin_command", metavar="ADMIN_COMMAND", parser_class=Parser)
    asub.required = True
    for name, args, help_text, run in _ADMIN_COMMANDS:
        a = add_command(asub, name, help_text, f"steadq admin {name} /srv/q {' '.join(args)}".rstrip())
        a.add_argument("path", metavar="PATH")
        for arg in args:
            a.add_argument(arg.lower(), metavar=arg)
        a.set_defaults(run=run)


def cmd_admin_dead_list(a: argparse.Namespace) -> int:
    """Plain walk of dead/*/*/* without opening the queue (cli.md)."""
    try:
        files = list_dead_files(a.path)
    except OSError as e:
        raise CliError(f"cannot read {a.path}/dead: {e.strerror}", 6) from e
    if files is None:
        err(f"no dead/ directory under {a.path} (nothing to list)")
        if a.json:
            out_json([])
        return 0
    if a.json:
        docs = []
        for f in files:
            doc: dict[str, Any] = {"name": escape(f.name), "path": escape(f.path)}
            if f.job_id is not None:
                doc.update(job_id=f.job_id, generation=f.generation, attempt=f.attempt,
                           max_attempts=f.max_attempts, reason=f.reason)  # fmt: skip
            docs.append(doc)
        out_json(docs)
    else:
        out(*(f"{escape(f.name)} {escape(f.path)}" for f in files))
    return 0


def _open_admin(a: argparse.Namespace) -> Backend:
    return open_queue(a.path, code=6)  # cli.md: admin open failures exit 6


def _admin_failure(e: Exception) -> CliError:
    if isinstance(e, SteadQError) and e.kind is ErrorKind.NOT_FOUND:
        return CliError("not found", 1)
    if isinstance(e, FileNotFoundError):
        return CliError("not found", 1)
    return CliError(f"failed: {error_text(e)}", 6)


def cmd_admin_dead_inspect(a: argparse.Namespace) -> int:
    job = job_id(a.job_id)
    q = _open_admin(a)
    try:
        objs = [o for o in q.inspect(job) if state_name(o.state) == "dead"]
    finally:
        q.close()
    if a.json:
        out_json([job_object_json(o) for o in objs])
    else:
        out(*(f"gen={o.generation} attempt={o.attempt}/{o.max_attempts} {o.path}" for o in objs))
    return 0


def _admin_call(a: argparse.Namespace, fn: Callable[[Backend], Any]) -> Any:
    q = _open_admin(a)
    try:
        return fn(q)
    except CliError:
        raise
    except Exception as e:  # noqa: BLE001
        raise _admin_failure(e) from e
    finally:
        with contextlib.suppress(Exception):
            q.close()


def cmd_admin_dead_export(a: argparse.Namespace) -> int:
    job = job_id(a.job_id)
    n = _admin_call(a, lambda q: q.export_dead(job, a.output))
    err(f"exported {n} bytes")
    return 0


def cmd_admin_dead_remove(a: argparse.Namespace) -> int:
    job = job_id(a.job_id)
    _admin_call(a, lambda q: q.remove_dead(job))
    err("removed")
    return 0


def cmd_admin_requeue(a: argparse.Namespace) -> int:
    """Not in cli.md (an extra): not found -> 1, OutcomeUnknown -> 2, else the error kind's code."""
    job = job_id(a.job_id)
    q = _open_admin(a)
    try:
        path = q.requeue_dead(job)
    except OutcomeUnknown as e:
        raise CliError([f"outcome unknown: {e.message}", f"job_id: {job}"], 2) from e
    except SteadQError as e:
        if e.kind is ErrorKind.NOT_FOUND:
            raise CliError("not found", 1) from e
        raise CliError(f"not committed: {e.message}", e.exit_code) from e
    finally:
        with contextlib.suppress(Exception):
            q.close()
    out(f"job_id: {job}", f"path: {path}")
    err("requeued")
    return 0


def _quarantine_fields(o: Any) -> dict[str, Any]:
    """The documented JSON shape of one quarantined object."""
    return {"quarantine_id": o.quarantine_id, "reason": int(o.reason), "path": o.path, "size": o.size}


def _quarantine_id(text: str) -> str:
    if not HEX32.fullmatch(text):
        raise CliError("invalid quarantine_id", 1)
    return text


def cmd_admin_quarantine_list(a: argparse.Namespace) -> int:
    items = [_quarantine_fields(o) for o in _admin_call(a, lambda q: list(q.list_quarantine()))]
    if a.json:
        out_json(items)
    else:
        out(*(f"{i['quarantine_id']} reason=0x{i['reason']:04x} {i['path']}" for i in items))
    return 0


def cmd_admin_quarantine_inspect(a: argparse.Namespace) -> int:
    qid = _quarantine_id(a.id)
    i = _quarantine_fields(_admin_call(a, lambda q: q.inspect_quarantine(qid)))
    if a.json:
        out_json(i)
    else:
        out(f"quarantine_id={i['quarantine_id']} reason=0x{i['reason']:04x} path={i['path']} size={i['size']}")
    return 0


def cmd_admin_quarantine_export(a: argparse.Namespace) -> int:
    qid = _quarantine_id(a.id)
    n = _admin_call(a, lambda q: q.export_quarantine(qid, a.output))
    err(f"exported {n} bytes")
    return 0


def cmd_admin_quarantine_remove(a: argparse.Namespace) -> int:
    qid = _quarantine_id(a.id)
    _admin_call(a, lambda q: q.remove_quarantine(qid))
    err("removed")
    return 0


def cmd_admin_compact_receipts(a: argparse.Namespace) -> int:
    q = _open_admin(a)
    try:
        r = q.recover()
        err(f"compacted: {r.receipts_compacted} expired: {r.receipts_deleted}")
    except Exception as e:  # noqa: BLE001 - cli.md: always 0 once opened
        err(f"compaction pass failed: {error_text(e)}")
    finally:
        with contextlib.suppress(Exception):
            q.close()
    return 0


# (name, positional arguments after PATH, help, handler), in ``steadq admin --help`` order.
_ADMIN_COMMANDS: tuple[tuple[str, tuple[str, ...], str, Callable[[argparse.Namespace], int]], ...] = (
    ("dead-list", (), "list dead-letter files (no queue open)", cmd_admin_dead_list),
    ("dead-inspect", ("JOB_ID",), "dead objects of one job", cmd_admin_dead_inspect),
    ("dead-export", ("JOB_ID", "OUTPUT"), "copy a dead job file", cmd_admin_dead_export),
    ("dead-remove", ("JOB_ID",), "delete a dead job", cmd_admin_dead_remove),
    ("requeue", ("JOB_ID",), "move a dead job back to ready with fresh attempts", cmd_admin_requeue),
    ("quarantine-list", (), "list quarantined objects", cmd_admin_quarantine_list),
    ("quarantine-inspect", ("ID",), "one quarantined object", cmd_admin_quarantine_inspect),
    ("quarantine-export", ("ID", "OUTPUT"), "copy a quarantined object", cmd_admin_quarantine_export),
    ("quarantine-remove", ("ID",), "delete a quarantined object", cmd_admin_quarantine_remove),
    ("compact-receipts", (), "run a full recovery pass (compaction and expiry)", cmd_admin_compact_receipts),
)

COMMANDS = {"admin": add_admin}
