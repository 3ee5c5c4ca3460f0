"""``steadq admin …``: the operator's tools for dead letters and quarantine.

Open failures exit 6 here (cli.md), not with the error's own code, and a
missing object is "not found" with exit 1. ``dead-list`` opens no queue: it
must work on a tree that is too damaged to open. ``requeue`` and ``purge``
act on many objects one durable change at a time (:func:`run_bulk`).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from steadqd.backend import Backend, list_dead_files
from steadqd.cli.common import (
    HEX32,
    CliError,
    Interrupted,
    Interrupts,
    Parser,
    Subcommands,
    add_command,
    add_queue_command,
    duration,
    err,
    error_text,
    escape,
    find_job,
    job_id,
    job_object_json,
    match_job,
    open_queue,
    out,
    out_json,
    printed,
    reason_code,
    reason_name,
    state_name,
)
from steadqd.constants import NS_PER_SECOND, DeadReason, QuarantineReason
from steadqd.durations import format_duration
from steadqd.errors import ErrorKind, OutcomeUnknown, SteadQError

DEAD = frozenset({"dead"})  # where the dead-letter commands look up a job id prefix


def add_admin(sub: Subcommands) -> None:
    adm = add_command(sub, "admin", "operator commands for dead letters and quarantine")
    asub = adm.add_subparsers(dest="admin_command", metavar="ADMIN_COMMAND", parser_class=Parser)
    asub.required = True
    for name, args, help_text, run in _ADMIN_COMMANDS:
        a = add_queue_command(asub, name, help_text, f"steadq admin {name} /srv/q {' '.join(args)}".rstrip(), run=run)
        for arg in args:
            a.add_argument(arg.lower(), metavar=arg)
    _add_requeue(asub)
    _add_purge(asub)


def cmd_admin_dead_list(a: argparse.Namespace) -> int:
    """Plain walk of dead/*/*/* without opening the queue (cli.md); a bucket queue has no tree to walk,
    so its dead records are listed through the backend."""
    if a.path.partition("://")[1]:
        files: list[Any] | None = _listed_dead(a)
    else:
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


@dataclass(frozen=True)
class _ListedDead:
    """A dead job of a queue at a URL, with the fields of a walked dead-letter file."""

    name: bytes
    path: bytes
    job_id: str
    generation: int
    attempt: int
    max_attempts: int
    reason: int | None


def _listed_dead(a: argparse.Namespace) -> list[Any]:
    q = _open_admin(a)
    try:
        return [_ListedDead(j.job_id.encode(), j.path.encode(), j.job_id, j.generation, j.attempt, j.max_attempts,
                            j.reason)
                for j in q.list_jobs({"dead"})]  # fmt: skip
    finally:
        with contextlib.suppress(Exception):
            q.close()


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
        job = find_job(q, job, DEAD)
        objs = [o for o in q.inspect_detailed(job) if state_name(o.state) == "dead"]
    finally:
        q.close()
    if a.json:
        out_json([_dead_json(o) for o in objs])
    else:
        out(*(f"gen={o.generation} attempt={o.attempt}/{o.max_attempts} {o.path}" for o in objs))
    return 0


def _dead_json(o: Any) -> dict[str, Any]:
    """``inspect``'s shape, and the reason (its code and its name) at the top, where a script looks first."""
    reason = int(o.details["reason"])
    return {**job_object_json(o), "reason": reason, "reason_name": reason_name(reason)}


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
    n = _admin_call(a, lambda q: q.export_dead(find_job(q, job, DEAD), a.output))
    err(f"exported {n} bytes")
    return 0


def cmd_admin_dead_remove(a: argparse.Namespace) -> int:
    job = job_id(a.job_id)
    _admin_call(a, lambda q: q.remove_dead(find_job(q, job, DEAD)))
    err("removed")
    return 0


def cmd_admin_requeue(a: argparse.Namespace) -> int:
    """One JOB_ID keeps the original extra's output (scripts read it); anything else is :func:`run_bulk`."""
    if len(a.job_ids) == 1 and not (a.all or a.reason is not None or a.older_than is not None or a.dry_run):
        return _requeue_one(a, job_id(a.job_ids[0]))
    return run_bulk(a, "requeue")


def _requeue_one(a: argparse.Namespace, job: str) -> int:
    """Not in cli.md (an extra): not found -> 1, OutcomeUnknown -> 2, else the error kind's code."""
    q = _open_admin(a)
    try:
        job = find_job(q, job, DEAD)
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
    new_id = path.rsplit("/", 1)[-1]
    if HEX32.fullmatch(new_id) and new_id != job:  # a bucket queue: the dead record is forever, a new job runs
        out(f"requeued_as: {new_id}")
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
    ("quarantine-list", (), "list quarantined objects", cmd_admin_quarantine_list),
    ("quarantine-inspect", ("ID",), "one quarantined object", cmd_admin_quarantine_inspect),
    ("quarantine-export", ("ID", "OUTPUT"), "copy a quarantined object", cmd_admin_quarantine_export),
    ("quarantine-remove", ("ID",), "delete a quarantined object", cmd_admin_quarantine_remove),
    ("compact-receipts", (), "run a full recovery pass (compaction and expiry)", cmd_admin_compact_receipts),
)

# =========================================================================== bulk requeue / purge


def _add_requeue(asub: Subcommands) -> None:
    a = add_queue_command(asub, "requeue", "move dead jobs back to ready with fresh attempts (one, some, or a selection)",
                          "steadq admin requeue /srv/q --reason attempts_exhausted --older-than 1h --dry-run",
                          run=cmd_admin_requeue)  # fmt: skip
    a.add_argument("job_ids", metavar="JOB_ID", nargs="*", help="the dead jobs to requeue (or select with the options)")
    a.add_argument("--all", action="store_true", help="every dead job")
    _add_selection(a, "dead jobs", "attempts_exhausted, consumer_rejected, 0x0004")


def _add_purge(asub: Subcommands) -> None:
    a = add_queue_command(asub, "purge", "delete dead jobs or quarantined objects for good, one durable unlink at a time",
                          "steadq admin purge /srv/q dead --older-than 7d --dry-run", run=cmd_admin_purge)  # fmt: skip
    a.add_argument("place", metavar="dead|quarantine", choices=("dead", "quarantine"),
                   help="what to purge (with no option: all of it)")  # fmt: skip
    _add_selection(a, "objects", "a dead reason for dead (attempts_exhausted, 0x0004), a quarantine reason "
                   "for quarantine (payload_corrupt, 0x0002)")  # fmt: skip


def _add_selection(a: Parser, what: str, reasons: str) -> None:
    a.add_argument("--reason", metavar="CODE", default=None, help=f"only {what} with this reason: {reasons}")
    a.add_argument("--older-than", type=duration, metavar="DURATION", default=None,
                   help=f"only {what} older than this, by the age ls shows (e.g. 30m, 7d)")  # fmt: skip
    a.add_argument("--dry-run", action="store_true", help="list and count what would be done; change nothing")


@dataclass(frozen=True)
class _Target:
    """One object a bulk command acts on: what it prints, and the id the backend takes."""

    key: str
    path: str
    reason: str
    age_seconds: int | None


def _age(mtime_ns: int | None, now_ns: int) -> int | None:
    return None if mtime_ns is None else max(0, now_ns - mtime_ns) // NS_PER_SECOND


def _selected(targets: Iterable[_Target], older_than: float | None) -> list[_Target]:
    if older_than is None:
        return list(targets)
    return [t for t in targets if t.age_seconds is not None and t.age_seconds > older_than]


def _dead_targets(q: Backend, a: argparse.Namespace, now_ns: int) -> list[_Target]:
    code = None if a.reason is None else reason_code(a.reason, DeadReason)
    given = list(getattr(a, "job_ids", None) or ())
    dead = list(q.list_jobs(DEAD))
    wanted: set[str] = set()
    problems: list[str] = []
    for text in given:  # each a whole id or a prefix (the journal's short id), resolved among the dead
        if HEX32.fullmatch(text) and not any(j.job_id == text for j in dead):
            problems.append(f"not found: no dead object for job {text}")
            continue
        try:
            wanted.add(match_job(text, (j.job_id for j in dead), f"the dead letters of {a.path}"))
        except CliError as e:
            problems += e.lines
    if problems:
        raise CliError([*problems, "nothing was changed"], 1)
    seen: set[str] = set()
    found: list[_Target] = []
    for job in dead:
        if job.job_id in seen or (wanted and job.job_id not in wanted) or (code is not None and job.reason != code):
            continue
        seen.add(job.job_id)
        found.append(_Target(job.job_id, job.path, reason_name(job.reason), _age(job.mtime_ns, now_ns)))
    return _selected(found, a.older_than)


def _quarantine_targets(q: Backend, a: argparse.Namespace, now_ns: int) -> list[_Target]:
    code = None if a.reason is None else reason_code(a.reason, QuarantineReason)
    found = [
        _Target(o.quarantine_id, o.path, reason_name(o.reason, QuarantineReason), _age(o.mtime_ns, now_ns))
        for o in q.list_quarantine()
        if code is None or o.reason == code
    ]
    return _selected(found, a.older_than)


# (verb for the summary, what is acted on, the past tense, the backend call)
_BULK: dict[str, tuple[str, str, str, Callable[[Backend, str], object]]] = {
    "requeue": ("requeue", "dead jobs", "requeued", lambda q, key: q.requeue_dead(key)),
    "dead": ("purge", "dead jobs", "removed", lambda q, key: q.remove_dead(key)),
    "quarantine": ("purge", "quarantined objects", "removed", lambda q, key: q.remove_quarantine(key)),
}


def run_bulk(a: argparse.Namespace, which: str) -> int:
    """Select, then act on each object in turn, each change durable before the next begins.

    SIGINT and SIGTERM are held once the first change may begin: the object
    under way is finished, the rest are left untouched, and the summary
    counts exactly what was done. An object that vanished since it was
    listed (another operator, the sweeper) is skipped, not a failure; an
    unknown outcome stops everything (the handle refuses further changes).
    """
    if which == "requeue":
        for j in a.job_ids:
            job_id(j)
        if a.all and (a.job_ids or a.reason is not None or a.older_than is not None):
            raise CliError("admin requeue: --all selects every dead job; give it alone", 1)
        if not (a.all or a.job_ids or a.reason is not None or a.older_than is not None):
            raise CliError("admin requeue: name the jobs: JOB_ID..., --all, --reason CODE or --older-than DURATION", 1)
        if a.job_ids and (a.reason is not None or a.older_than is not None):
            raise CliError("admin requeue: give JOB_IDs or a selection (--reason, --older-than), not both", 1)
    verb, what, done_word, act = _BULK[which]
    with Interrupts() as stop:
        try:
            q = _open_admin(a)
        except Interrupted as e:
            raise CliError(f"admin {verb}: interrupted by {stop.name}: nothing was changed", 128 + e.signum) from e
        try:
            try:
                now = time.time_ns()
                targets = (_quarantine_targets if which == "quarantine" else _dead_targets)(q, a, now)
            except Interrupted as e:
                raise CliError(f"admin {verb}: interrupted by {stop.name}: nothing was changed", 128 + e.signum) from e
            except (SteadQError, OSError) as e:
                raise CliError(f"admin {verb}: cannot list the {what}: {error_text(e)}", 6) from e
            stop.hold()
            return _act_on_each(a, q, targets, stop, (verb, what, done_word, act))
        finally:
            with contextlib.suppress(Exception):
                q.close()


def _act_on_each(
    a: argparse.Namespace,
    q: Backend,
    targets: list[_Target],
    stop: Interrupts,
    how: tuple[str, str, str, Callable[[Backend, str], object]],
) -> int:
    verb, what, done_word, act = how
    done: list[dict[str, Any]] = []
    skipped: list[str] = []
    failures: list[CliError] = []
    reader_gone = False
    for t in targets:
        if stop.signum is not None or reader_gone:
            break
        if a.dry_run:
            done.append({"id": t.key, "path": t.path, "reason": t.reason, "age_seconds": t.age_seconds})
            if not a.json:
                age = "-" if t.age_seconds is None else format_duration(t.age_seconds)
                reader_gone = not printed(f"would {verb} {t.key} reason={t.reason} age={age} {t.path}")
            continue
        try:
            result = act(q, t.key)
        except OutcomeUnknown as e:
            failures.append(
                CliError([f"outcome unknown for {t.key}: {e.message}", "stopped: nothing more was tried"], 2)
            )
            break
        except SteadQError as e:
            if e.kind is ErrorKind.NOT_FOUND:
                skipped.append(t.key)
                err(f"skipped {t.key}: gone since it was listed")
                continue
            failures.append(CliError(f"failed {t.key}: {e.message}", e.exit_code))
            continue
        doc = {"id": t.key, "path": t.path, "reason": t.reason}
        if isinstance(result, str):
            doc["to"] = result
        done.append(doc)
        if not a.json:
            reader_gone = not printed(
                f"{done_word} {t.key} {t.path}" + (f" -> {result}" if isinstance(result, str) else "")
            )
    untouched = len(targets) - len(done) - len(skipped) - len(failures)
    counted = "would be " + done_word if a.dry_run else done_word
    summary = f"{counted}: {len(done)} of {len(targets)} {what} selected"
    if skipped:
        summary += f", {len(skipped)} gone meanwhile"
    if failures:
        summary += f", {len(failures)} failed"
    if reader_gone:
        raise CliError([*(line for f in failures for line in f.lines), f"admin {verb}: stdout was closed while "
                        f"printing: stopped; {summary}; {untouched} untouched"], 6)  # fmt: skip
    if a.json:
        out_json({"dry_run": a.dry_run, "selected": len(targets), done_word: len(done), "skipped": len(skipped),
                  "failed": len(failures), "untouched": untouched, "interrupted": stop.name or None,
                  "objects": done})  # fmt: skip
    if stop.signum is not None and untouched:
        raise CliError([*(line for f in failures for line in f.lines), f"interrupted by {stop.name}: {summary}; "
                        f"{untouched} untouched"], stop.exit_code)  # fmt: skip
    if failures:
        raise CliError([*(line for f in failures for line in f.lines), summary], failures[0].code)
    err(summary)
    return 0


def cmd_admin_purge(a: argparse.Namespace) -> int:
    return run_bulk(a, a.place)


COMMANDS = {"admin": add_admin}
