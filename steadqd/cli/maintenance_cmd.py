"""``steadq fsck``, ``verify``, ``format-dump``, ``recover`` and ``resolve``: checking and repair.

``fsck`` checks a whole queue and ``verify``/``format-dump`` a single file
(an export, a copy: no queue is opened); ``recover`` runs the bounded
recovery pass the sweeper runs; ``resolve`` decides, from a ticket, what an
indeterminate transition did.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from steadqd.backend import Backend, RecoveryReport, dump_file, parse_ticket, remove_bad_recovery_cursor, verify_file
from steadqd.cli.common import (
    CliError,
    Subcommands,
    add_command,
    add_queue_command,
    err,
    error_code,
    error_text,
    failure,
    int_in,
    open_queue,
    os_exit_code,
    out,
    out_json,
    read_user_file,
)
from steadqd.constants import CONTROL_DIR, RECOVERY_CURSOR_FILE, U64_MAX, Resolution
from steadqd.errors import BadRecoveryCursor, QueueCorrupt, SteadQError, UnsupportedFormat
from steadqd.fsck_report import Finding


def add_fsck(sub: Subcommands) -> None:
    s = add_queue_command(
        sub, "fsck", "check (and optionally repair) the whole tree", "steadq fsck /srv/q --deep", run=cmd_fsck
    )
    s.add_argument("--deep", action="store_true", help="also read every payload and check its digest (slow)")
    s.add_argument(
        "--repair", action="store_true", help="move what is corrupt to quarantine/ and remove stray temporary files"
    )


def add_verify(sub: Subcommands) -> None:
    s = add_command(sub, "verify", "verify one job or FORMAT file", "steadq verify job.sqj --deep")
    s.add_argument("file", metavar="FILE", help="a .sqj job file, a receipt or the queue's FORMAT file")
    s.add_argument("--deep", action="store_true", help="also read the payload and check its digest")
    s.set_defaults(run=cmd_verify)


def add_format_dump(sub: Subcommands) -> None:
    s = add_command(
        sub, "format-dump", "print the header fields of a job or FORMAT file", "steadq format-dump /srv/q/FORMAT"
    )
    s.add_argument("file", metavar="FILE", help="a .sqj job file, a receipt or the queue's FORMAT file")
    s.set_defaults(run=cmd_format_dump)


def add_recover(sub: Subcommands) -> None:
    s = add_queue_command(
        sub,
        "recover",
        "run a recovery pass (reap, promote, clean up)",
        "steadq recover /srv/q --budget-ops 5000",
        run=cmd_recover,
    )
    s.add_argument("--watch", action="store_true", help="repeat the pass every 5 seconds until interrupted (Ctrl-C)")
    for flag, default, metavar, unit in (
        ("--budget-ops", 1000, "N", "changes"),
        ("--budget-ms", 100, "MS", "milliseconds"),
    ):
        s.add_argument(
            flag,
            type=int_in(0, U64_MAX, "budget"),
            default=default,
            metavar=metavar,
            help=f"stop a pass after this many {unit}",
        )


def add_resolve(sub: Subcommands) -> None:
    s = add_queue_command(
        sub,
        "resolve",
        "decide an indeterminate transition from its ticket",
        "steadq resolve /srv/q --result-file t.json",
        run=cmd_resolve,
    )
    s.add_argument(
        "--result-file", required=True, metavar="TICKET.json", help="the ticket an outcome-unknown command wrote"
    )
    s.add_argument(
        "--stabilize", action="store_true", help="also fsync what was observed, so the answer survives a crash"
    )


# =========================================================================== fsck

CURSOR_PATH = f"{CONTROL_DIR}/{RECOVERY_CURSOR_FILE}"


def format_fsck_summary(r: Any) -> str:
    """The stderr first line of ``steadq fsck`` (no newline)."""
    return (
        f"objects: {r.total_objects}, structurally verified: {r.structurally_verified}, "
        f"payload verified: {r.payloads_deep_verified}"
    )


def format_fsck_lines(r: Any) -> list[str]:
    """stdout lines: ``<SEVERITY> <relative path>: <finding_type> (<details>)``."""
    return [f"{f.severity} {f.path}: {f.finding_type} ({f.details})" for f in r.findings]


def cmd_fsck(a: argparse.Namespace) -> int:
    cursor = None
    try:
        q = open_queue(a.path)
    except CliError as e:
        if not (a.repair and isinstance(e.__cause__, BadRecoveryCursor)):
            raise
        cursor = _remove_bad_cursor(a.path)
        q = open_queue(a.path)
    try:
        try:
            r = q.fsck(deep=a.deep, repair=a.repair)
        except Exception as e:  # noqa: BLE001
            raise failure("fsck failed", e) from e
    finally:
        with contextlib.suppress(Exception):
            q.close()
    if cursor is not None:
        r.findings.insert(0, Finding("ERROR", CURSOR_PATH, "recovery_cursor_invalid", f"{cursor}; removed"))
    err(format_fsck_summary(r))
    if a.json:
        out_json(
            {
                "total_objects": r.total_objects,
                "structurally_verified": r.structurally_verified,
                "payloads_deep_verified": r.payloads_deep_verified,
                "quarantined": r.quarantined,
                "findings": [
                    {"severity": f.severity, "path": f.path, "finding_type": f.finding_type, "details": f.details}
                    for f in r.findings
                ],
            }
        )
    else:
        out(*format_fsck_lines(r))
    if r.quarantined:
        err(f"quarantined: {r.quarantined}")
    return int(r.exit_code)


def _remove_bad_cursor(path: str) -> str | None:
    """Remove the recovery cursor that stopped the open (BadRecoveryCursor says why that is safe):
    what was wrong with it, or None if a sound one replaced it meanwhile."""
    try:
        return remove_bad_recovery_cursor(path)
    except Exception as e:  # noqa: BLE001
        raise failure(f"cannot remove {CURSOR_PATH}", e) from e


# =========================================================================== verify / format-dump


@contextlib.contextmanager
def _reading(path: str, *, corrupt: str, corrupt_code: int, unknown: str) -> Iterator[None]:
    """The failures of reading one file: ``<corrupt>: <what>`` for a corrupt one, ``unknown`` for one of
    another format, the OS error's line otherwise (verify and format-dump word the first two as the
    reference does, differently)."""
    try:
        yield
    except QueueCorrupt as e:
        raise CliError(f"{corrupt}: {e.message}", corrupt_code) from e
    except UnsupportedFormat as e:
        raise CliError(unknown, 1) from e
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror}", os_exit_code(e)) from e


def cmd_verify(a: argparse.Namespace) -> int:
    """Streams the file (flat memory); each fact is printed before the check that may fail."""
    with _reading(a.file, corrupt="CORRUPT", corrupt_code=3, unknown="unknown format"):
        for name, value in verify_file(a.file, deep=a.deep):
            err(f"{name}: {value}")
    err("valid")
    return 0


def cmd_format_dump(a: argparse.Namespace) -> int:
    with _reading(a.file, corrupt="parse error", corrupt_code=1, unknown="unrecognized format"):
        fields = dump_file(a.file)
    if a.json:
        out_json(fields)
    else:
        out(*(f"{k}: {v}" for k, v in fields.items()))
    return 0


# =========================================================================== recover / resolve


def _recover_once(q: Backend, budget_ops: int, budget_ms: int, *, as_json: bool) -> int:
    try:
        r = q.recover(budget_ops=budget_ops, budget_ms=budget_ms)
    except Exception as e:  # noqa: BLE001
        err(f"recovery failed: {error_text(e)}")
        return error_code(e) or 6
    err(
        f"reaped:{r.leases_reaped} promoted:{r.delayed_promoted} temp_deleted:{r.temp_files_deleted} "
        f"dead:{r.leases_to_dead} ops:{r.operations_attempted}{' (budget exhausted)' if r.budget_exhausted else ''}"
    )
    if as_json:
        out_json(_recovery_json(r))
    if r.errors:
        # The count line is the reference's; each error follows it, so an
        # operator sees what failed without rerunning with --json.
        err(f"{len(r.errors)} recovery errors", *(f"  {code}: {detail}" for code, detail in r.errors))
        return 6
    return 0


def _recovery_json(r: RecoveryReport) -> dict[str, Any]:
    return {
        "leases_reaped": r.leases_reaped,
        "leases_to_dead": r.leases_to_dead,
        "delayed_promoted": r.delayed_promoted,
        "temp_files_deleted": r.temp_files_deleted,
        "receipts_compacted": r.receipts_compacted,
        "receipts_deleted": r.receipts_deleted,
        "dead_deleted": r.dead_deleted,
        "quarantined": r.quarantined,
        "directories_removed": r.directories_removed,
        "operations_attempted": r.operations_attempted,
        "budget_exhausted": r.budget_exhausted,
        "errors": [{"code": code, "detail": detail} for code, detail in r.errors],
    }


def cmd_recover(a: argparse.Namespace) -> int:
    q = open_queue(a.path)
    try:
        if not a.watch:
            return _recover_once(q, a.budget_ops, a.budget_ms, as_json=a.json)
        try:
            while True:
                _recover_once(q, a.budget_ops, a.budget_ms, as_json=a.json)
                time.sleep(5)
        except KeyboardInterrupt:
            return 0
    finally:
        with contextlib.suppress(Exception):
            q.close()


def cmd_resolve(a: argparse.Namespace) -> int:
    try:
        raw = read_user_file(a.result_file)
    except OSError as e:
        raise CliError(f"cannot read ticket {a.result_file}: {e.strerror}", 1) from e
    try:
        ticket = parse_ticket(raw)
    except SteadQError as e:
        raise CliError(f"invalid transition ticket: {e.message}", 1) from e
    q = open_queue(a.path, code=6)
    try:
        try:
            r = q.resolve(ticket, stabilize=a.stabilize)
        except SteadQError as e:
            raise CliError(f"ticket does not fit this queue: {e.message}", 1) from e
    finally:
        with contextlib.suppress(Exception):
            q.close()
    o = r.outcome
    if o in (Resolution.DESTINATION_OBSERVED, Resolution.DESTINATION_STABILIZED):
        err(f"destination observed: {r.destination_path}")
        return 0
    if o in (Resolution.SOURCE_OBSERVED, Resolution.SOURCE_STABILIZED):
        err(f"source observed: {r.source_path}")
        return 0
    if o is Resolution.BOTH_OBSERVED:
        raise CliError("both source and destination observed (corruption)", 3)
    if o is Resolution.NEITHER_OBSERVED:
        raise CliError("neither source nor destination observed", 1)
    if o is Resolution.CONFLICTING_OBJECT:
        raise CliError("conflicting object at expected path", 3)
    raise CliError(f"resolution failed: {r.error}", 6)


COMMANDS = {
    "fsck": add_fsck,
    "verify": add_verify,
    "format-dump": add_format_dump,
    "recover": add_recover,
    "resolve": add_resolve,
}
