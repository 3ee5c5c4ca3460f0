"""``steadq``: the producer/operator command line (shared/spec/cli.md).

Why a separate command from ``steadqd`` (the daemons): the ``steadq``
surface is a compatibility contract with the reference implementation -- a
shell script written against the reference binary must run unchanged
against this one -- so every subcommand, flag, stdout/stderr line and exit
code of cli.md is reproduced, and the extras users asked for (human
durations, ``--meta``, bulk put, ``ls``, ``watch``, ``admin requeue``,
``--json`` for listings, shell completion) are strictly additive.

This module only assembles the command tree and runs it. Each command lives
in the module of its group, its parser beside its handler:

=====================  ================================================
``init_cmd``           init
``put_cmd``            put (one job, or bulk with --dir / --jsonl)
``lease_cmd``          lease, ack, retry, bury, work
``cancel_cmd``         cancel (ready, delayed or running jobs to dead, reason cancelled)
``view_cmd``           stats, ls, inspect (read-only views)
``watch_cmd``          watch (the live view, --json frames)
``show_cmd``           show (one job's story, with its journal lines)
``status_cmd``         list, status (the configured queues, their counts and units)
``history_cmd``        history (verdicts per minute, from the journal)
``maintenance_cmd``    fsck, verify, format-dump, recover, resolve
``admin_cmd``          admin dead-* / quarantine-* / requeue / compact-receipts
``doctor_cmd``         doctor
``bench_cmd``          bench
``completion_cmd``     completion
``common``             what every group shares (errors, output, argument types)
=====================  ================================================

A new command goes into its group's module as ``add_<name>(sub)`` (parser,
bound to its handler with ``set_defaults(run=...)``) listed in that module's
``COMMANDS``, and its name into :data:`HELP_ORDER` below. Commands reach a
queue only through ``steadqd.backend``.
"""

from __future__ import annotations

import argparse
import os
import sys

from steadqd.cli import (
    admin_cmd,
    bench_cmd,
    cancel_cmd,
    completion_cmd,
    control_cmd,
    doctor_cmd,
    history_cmd,
    init_cmd,
    lease_cmd,
    maintenance_cmd,
    put_cmd,
    show_cmd,
    status_cmd,
    view_cmd,
    watch_cmd,
)
from steadqd.cli.common import (
    CONFIG_DIR_HELP,
    PROG,
    CliError,
    HelpFormatter,
    Parser,
    discard_stdout,
    err,
    error_code,
    error_text,
    resolve_queue,
)
from steadqd.version import VersionAction

GROUPS = (
    init_cmd, put_cmd, lease_cmd, cancel_cmd, view_cmd, watch_cmd, show_cmd, status_cmd, history_cmd,
    maintenance_cmd, doctor_cmd, bench_cmd, completion_cmd, admin_cmd, control_cmd,
)  # fmt: skip

# The order ``steadq --help`` (and an invalid-choice error) lists the commands
# in: the reference's, which is not group by group.
HELP_ORDER = (
    "init", "put", "lease", "ack", "retry", "bury", "cancel", "work", "stats", "fsck", "doctor", "inspect", "verify",
    "format-dump", "recover", "resolve", "bench", "ls", "watch", "show", "completion", "admin", "list", "status",
    "pause", "resume", "history",
)  # fmt: skip


def build_parser() -> Parser:
    """The whole command tree (also the source of the completion scripts)."""
    p = Parser(
        prog=PROG,
        description="SteadQ/1 broker-less filesystem job queue: producer, consumer and operator commands.",
        epilog="The global flag --json is accepted anywhere before '--'. Exit codes: 0 ok, 1 failure or usage "
        "error, 2 outcome unknown, 3 corruption, 4 exhausted, 5 permission denied, 6 I/O failure, 64 unsupported "
        "(man steadq).",
        allow_abbrev=False,
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--version",
        action=VersionAction,
        spawn_path=_spawn_path,
        claim_path=_claim_path,
        help="print the version, the job spawn and the claim path",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (stats, doctor, listings)")
    p.add_argument("--config-dir", metavar="DIR", help=CONFIG_DIR_HELP)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    adders = {name: add for group in GROUPS for name, add in group.COMMANDS.items()}
    for name in sorted(adders, key=HELP_ORDER.index):  # ValueError: a command missing from HELP_ORDER
        adders[name](sub)
    _config_dir_anywhere(sub)
    return p


def _config_dir_anywhere(sub: argparse._SubParsersAction) -> None:
    """``--config-dir`` after the command too (``steadq stats transcode --config-dir DIR``), as steadqd takes it."""
    for parser in sub.choices.values():
        parser.add_argument("--config-dir", metavar="DIR", default=argparse.SUPPRESS, help=CONFIG_DIR_HELP)
        for action in parser._subparsers._group_actions if parser._subparsers else ():
            if isinstance(action, argparse._SubParsersAction):
                _config_dir_anywhere(action)


def _spawn_path() -> str:
    from steadqd.daemon.worker.run import fastspawn  # loads the compiled module: only when asked

    return fastspawn.path()


def _claim_path() -> str:
    from steadqd.backend import claim_path  # loads the C claim core: only when asked

    return claim_path()


def split_argv(argv: list[str]) -> tuple[list[str], list[str] | None, bool]:
    """(options part, command after ``--`` or None, --json seen).

    ``--json`` is global and accepted anywhere before ``--``; everything
    after the first ``--`` belongs to ``work``'s COMMAND untouched.
    """
    command: list[str] | None = None
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    as_json = "--json" in argv
    return [x for x in argv if x != "--json"], command, as_json


def fill_closed_streams() -> None:
    """Put /dev/null on a standard descriptor that was closed (``<&-``, ``2>&-``).

    Why: the first file the command opens would otherwise take the free
    number, and a job ``work`` starts inherits descriptors 0-2: its output
    would go into whatever the queue had open there. Python itself already
    knows the stream was closed (``sys.stdin``/``sys.stderr`` stay None), so
    a command that needs the stream still refuses it.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            else:
                os.set_inheritable(fd, True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``steadq`` console script; returns the exit code."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    rest, command, as_json = split_argv(args_in)
    if sys.stdout is None:  # >&-: a put would enqueue a job whose id no one can read, and be retried
        err(f"{PROG}: stdout is closed: nothing was done (redirect it, e.g. >/dev/null, instead of closing it)")
        return 1
    fill_closed_streams()
    try:
        parser = build_parser()
        try:
            a = parser.parse_args(rest)
        except SystemExit as e:  # --help
            return int(e.code or 0)
        a.json = as_json
        a.work_command = command or []
        a.parser = parser
        if command is not None and a.command != "work":
            raise CliError(f"{PROG} {a.command}: unexpected arguments after '--'", 1)
        if hasattr(a, "queue_must_exist"):  # a QUEUE argument: a name means a configured queue
            a.path = resolve_queue(a.path, a.config_dir, must_exist=a.queue_must_exist)
        return int(a.run(a))
    except CliError as e:
        err(*e.lines)
        return e.code
    except BrokenPipeError:
        # stdout closed early (``steadq ls Q | head``): not an error of ours.
        discard_stdout()
        return 0
    except Exception as e:  # noqa: BLE001 - never a traceback: one line and the mapped exit code
        err(f"{PROG}: {error_text(e)}")
        return error_code(e)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
