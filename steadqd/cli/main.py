"""``steadq``: the producer/operator command line (shared/spec/cli.md).

Why a separate module from :mod:`steadqd.daemon.main` (the daemon entry point): the
``steadq`` surface is a compatibility contract with the reference
implementation -- a shell script written against the reference binary must
run unchanged against this one -- so every subcommand, flag, stdout/stderr
line and exit code of cli.md is reproduced here, and the extras users asked
for (human durations, ``--meta``, bulk put, ``ls``, ``watch``, ``admin
requeue``, ``--json`` for listings, shell completion) are strictly additive.

Conventions that hold for every subcommand:

* A failure is raised as :class:`CliError` (message lines for stderr plus an
  exit code) and printed once by :func:`main`; nothing else calls
  ``sys.exit``. Exit codes follow cli.md: library errors map through their
  :class:`~steadqd.errors.ErrorKind`, raw OS errors through
  :func:`os_exit_code`, OutcomeUnknown is always 2.
* Usage errors (unknown flag, malformed number or duration, bad metadata
  key) exit **1** ("invalid input") with one line naming the bad value; the
  reference's argument parser would exit 2, which scripts must read as
  "outcome unknown", so we deliberately do not copy that.
* Library modules are imported lazily inside the subcommand functions: the
  command line must start (and ``--help`` / completion must work) even when
  an optional module is broken or missing, and start-up stays fast for the
  common ``put``/``lease`` calls from shell loops.
* Files the CLI writes for the user (handle files, tickets) are written
  atomically: temp name, fsync, rename, fsync of the parent directory, so a
  crash never leaves a half-written handle that a later ``ack`` would trust.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from steadqd.fs.handle import Queue
    from steadqd.fs.lease import Lease

PROG = "steadq"
NS = 1_000_000_000
U16_MAX = (1 << 16) - 1
U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1
_HEX32 = re.compile(r"[0-9a-f]{32}")
_METADATA_KEY = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_LISTABLE_STATES = ("ready", "leased", "delayed", "dead", "receipt")


# =========================================================================== errors and output


class CliError(Exception):
    """A failure to report: ``lines`` go to stderr, ``code`` is the exit status."""

    def __init__(self, lines: str | Sequence[str], code: int) -> None:
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        super().__init__("; ".join(self.lines))
        self.code = code


def os_exit_code(e: OSError) -> int:
    """cli.md's mapping of raw OS errors (Rust io::ErrorKind) to exit codes."""
    n = e.errno
    if n in (errno.ENOSYS, errno.EOPNOTSUPP):
        return 64  # Unsupported
    if n in (errno.EACCES, errno.EPERM):
        return 5  # PermissionDenied
    if n in (errno.EEXIST, errno.EINVAL, errno.EAGAIN, errno.EILSEQ):
        return 1  # AlreadyExists / InvalidInput / WouldBlock / InvalidData
    return 6


def error_code(e: BaseException) -> int:
    """Exit code of any error a subcommand may see."""
    from steadqd.errors import OutcomeUnknown, SteadQError

    if isinstance(e, OutcomeUnknown):
        return 2
    if isinstance(e, SteadQError):
        return e.exit_code
    if isinstance(e, OSError):
        return os_exit_code(e)
    return 6


def error_text(e: BaseException) -> str:
    """One-line description of an error (library message or strerror with the file)."""
    from steadqd.errors import SteadQError

    if isinstance(e, SteadQError):
        return e.message
    if isinstance(e, OSError):
        where = f"{e.filename}: " if e.filename is not None else ""
        return f"{where}{e.strerror or e}"
    return str(e)


def err(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stderr)
    sys.stderr.flush()


def out(*lines: str) -> None:
    for line in lines:
        print(line)
    sys.stdout.flush()


def out_json(doc: Any) -> None:
    """2-space pretty JSON on stdout, keys in the order given (documented shapes)."""
    print(json.dumps(doc, indent=2, default=str))
    sys.stdout.flush()


def _escape(raw: bytes) -> str:
    """Non-UTF-8 bytes as ``\\xNN`` (cli.md admin dead-list)."""
    return raw.decode("utf-8", "backslashreplace")


# =========================================================================== atomic files


def temp_sibling(path: str, rand_hex: str) -> str:
    """``<path with its extension replaced by "tmp.<hex>">`` like Rust's ``Path::with_extension``.

    ``h.json`` -> ``h.tmp.<hex>``; ``h`` -> ``h.tmp.<hex>``; ``.h`` -> ``.h.tmp.<hex>``.
    Why this exact name: an operator cleaning up after a crash sees the same
    stray names the reference would leave.
    """
    head, name = os.path.split(path)
    dot = name.rfind(".")
    stem = name[:dot] if dot > 0 else name
    return os.path.join(head, f"{stem}.tmp.{rand_hex}")


def write_atomic(path: str, text: str) -> None:
    """O_EXCL temp (0600), write, fsync, rename over ``path``, fsync the parent (best effort).

    On any failure the temp is removed, so nothing half-written is left and
    an existing file at ``path`` is untouched.
    """
    tmp = temp_sibling(path, os.urandom(16).hex())
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    try:
        try:
            data = text.encode("utf-8")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


# =========================================================================== argument types


def _int_in(lo: int, hi: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: expected an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: must be in {lo}..{hi}")
        return value

    parse.__name__ = what
    return parse


def _seconds_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if value != value or value < 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}")
    return value


def _duration(text: str) -> float:
    """Human durations (90s, 2h, 1d, 1h30m, 250ms; a bare number is seconds)."""
    from steadqd.durations import parse_duration

    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _meta(text: str) -> tuple[str, str]:
    """``key=value``; the key must satisfy the spec's metadata key grammar."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"invalid --meta {text!r}: expected key=value")
    if not _METADATA_KEY.fullmatch(key):
        raise argparse.ArgumentTypeError(
            f"invalid metadata key {key!r}: must match [a-z0-9][a-z0-9._-]{{0,63}} "
            "(lowercase letters, digits, '.', '_', '-'; 1-64 characters)"
        )
    return key, value


def _job_id(text: str) -> str:
    if not _HEX32.fullmatch(text):
        raise CliError("invalid job_id: expected 32 lowercase hex chars", 1)
    return text


# =========================================================================== parser


class _Parser(argparse.ArgumentParser):
    """argparse with clap-like failure: one line, exit 1 (invalid input)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise CliError(f"{self.prog}: {message} (see '{self.prog} --help')", 1)


def _add(sub: Any, name: str, help_text: str, example: str = "") -> _Parser:
    epilog = f"example:\n  {example}" if example else None
    return sub.add_parser(  # type: ignore[no-any-return]
        name,
        help=help_text,
        description=help_text,
        epilog=epilog,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> _Parser:
    """The whole command tree (also the source of the completion scripts)."""
    p = _Parser(
        prog=PROG,
        description="SteadQ/1 broker-less filesystem job queue: producer, consumer and operator commands.",
        epilog="The global flag --json is accepted anywhere. Exit codes: 0 ok, 1 failure, 2 outcome unknown, "
        "3 corruption, 4 exhausted, 5 permission denied, 6 I/O failure, 64 unsupported.",
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (stats, doctor, listings)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    s = _add(sub, "init", "create a queue", "steadq init /srv/q --shards 64")
    s.add_argument("path", metavar="PATH")
    s.add_argument("--shards", type=_int_in(1, 4096, "shard count"), default=64)
    s.add_argument("--terminal-bucket-width-ns", type=_int_in(0, U64_MAX, "width"), default=3_600_000_000_000)
    s.add_argument(
        "--shared",
        action="store_true",
        help="setgid 2770 root: every user in the directory's group may produce and consume",
    )

    s = _add(
        sub, "put", "enqueue a job (or many with --dir / --jsonl)", "echo hello | steadq put /srv/q --meta user=ann"
    )
    s.add_argument("path", metavar="PATH")
    s.add_argument("file", metavar="FILE", nargs="?", default="-", help="payload file; '-' or omitted: stdin")
    s.add_argument(
        "--content-type", default=None, help="default application/octet-stream (application/json for --jsonl)"
    )
    s.add_argument("--max-attempts", type=_int_in(0, U32_MAX, "max attempts"), default=3)
    s.add_argument("--not-before", type=_int_in(0, U64_MAX, "unix ns"), default=None, metavar="UNIX_NS")
    s.add_argument("--producer-id", default=None, metavar="ID")
    s.add_argument("--delay", type=_duration, default=None, metavar="DURATION", help="e.g. 90s, 15m, 2h, 1d")
    s.add_argument("--meta", type=_meta, action="append", default=[], metavar="KEY=VALUE", help="repeatable")
    s.add_argument("--dir", default=None, metavar="DIR", help="bulk: one job per regular file of DIR")
    s.add_argument("--jsonl", default=None, metavar="FILE", help="bulk: one job per JSON line of FILE ('-' = stdin)")
    s.add_argument("--print-ids", action="store_true", help="bulk: print '<job_id> <source>' per job on stdout")

    s = _add(sub, "lease", "claim one job", "steadq lease /srv/q --handle-file h.json")
    s.add_argument("path", metavar="PATH")
    s.add_argument("--duration-seconds", type=_seconds_number, default=30.0, metavar="S")
    s.add_argument("--handle-file", default=None, metavar="FILE")
    s.add_argument("--ticket-out", default=None, metavar="FILE")

    s = _add(sub, "ack", "acknowledge a leased job", "steadq ack /srv/q --handle-file h.json")
    s.add_argument("path", metavar="PATH")
    s.add_argument("--handle-file", required=True, metavar="FILE")

    s = _add(
        sub,
        "retry",
        "give a leased job back (now or later)",
        "steadq retry /srv/q --handle-file h.json --after-seconds 60",
    )
    s.add_argument("path", metavar="PATH")
    s.add_argument("--handle-file", required=True, metavar="FILE")
    s.add_argument("--after-seconds", type=_int_in(0, U64_MAX, "seconds"), default=None, metavar="S")

    s = _add(sub, "bury", "dead-letter a leased job", "steadq bury /srv/q --handle-file h.json --reason 1")
    s.add_argument("path", metavar="PATH")
    s.add_argument("--handle-file", required=True, metavar="FILE")
    s.add_argument("--reason", type=_int_in(0, U16_MAX, "reason"), default=0, metavar="N")

    s = _add(
        sub,
        "work",
        "run a command for every job (payload on its stdin)",
        "steadq work /srv/q --concurrency 4 -- ./handle.sh",
    )
    s.add_argument("path", metavar="PATH")
    s.add_argument("--concurrency", type=_int_in(1, 4096, "concurrency"), default=1, metavar="N")
    s.add_argument("--lease-seconds", type=_int_in(1, 604_800, "lease seconds"), default=60, metavar="S")
    s.add_argument("--once", action="store_true")

    s = _add(sub, "stats", "object counts and oldest age per state", "steadq stats /srv/q --prometheus")
    s.add_argument("path", metavar="PATH")
    s.add_argument("--prometheus", action="store_true")

    s = _add(sub, "fsck", "check (and optionally repair) the whole tree", "steadq fsck /srv/q --deep")
    s.add_argument("path", metavar="PATH")
    s.add_argument("--deep", action="store_true")
    s.add_argument("--repair", action="store_true")

    s = _add(sub, "doctor", "check the machine and filesystem", "steadq doctor /srv/q")
    s.add_argument("path", metavar="PATH")

    s = _add(sub, "inspect", "every object of one job", "steadq inspect /srv/q 0123456789abcdef0123456789abcdef")
    s.add_argument("path", metavar="PATH")
    s.add_argument("job_id", metavar="JOB_ID")

    s = _add(sub, "verify", "verify one job or FORMAT file", "steadq verify job.sqj --deep")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--deep", action="store_true")

    s = _add(sub, "format-dump", "print the header fields of a job or FORMAT file", "steadq format-dump /srv/q/FORMAT")
    s.add_argument("file", metavar="FILE")

    s = _add(sub, "recover", "run a recovery pass (reap, promote, clean up)", "steadq recover /srv/q --budget-ops 5000")
    s.add_argument("path", metavar="PATH")
    s.add_argument("--watch", action="store_true")
    s.add_argument("--budget-ops", type=_int_in(0, U64_MAX, "budget"), default=1000, metavar="N")
    s.add_argument("--budget-ms", type=_int_in(0, U64_MAX, "budget"), default=100, metavar="MS")

    s = _add(
        sub,
        "resolve",
        "decide an indeterminate transition from its ticket",
        "steadq resolve /srv/q --result-file t.json",
    )
    s.add_argument("path", metavar="PATH")
    s.add_argument("--result-file", required=True, metavar="TICKET.json")
    s.add_argument("--stabilize", action="store_true")

    s = _add(sub, "bench", "throughput test on an existing queue", "steadq bench /srv/q --producers 2 --consumers 2")
    s.add_argument("path", metavar="PATH")
    s.add_argument("--producers", type=_int_in(0, 4096, "count"), default=1)
    s.add_argument("--consumers", type=_int_in(0, 4096, "count"), default=1)
    s.add_argument("--duration-seconds", type=_seconds_number, default=10.0, metavar="S")
    s.add_argument("--payload-size", type=_int_in(0, 1 << 30, "size"), default=1024, metavar="BYTES")
    s.add_argument("--lease-duration-seconds", type=_seconds_number, default=30.0, metavar="S")

    s = _add(sub, "ls", "list jobs with state, attempt, age and deadline", "steadq ls /srv/q leased")
    s.add_argument("path", metavar="QUEUE")
    s.add_argument("state", metavar="STATE", nargs="?", default=None,
                   help="ready | leased | delayed | dead | receipt | all (default: all but receipts)")  # fmt: skip

    s = _add(sub, "watch", "live view of counts, throughput and oldest job per state", "steadq watch /srv/q")
    s.add_argument("path", metavar="QUEUE")
    s.add_argument("--interval", type=_duration, default=1.0, metavar="DURATION")
    s.add_argument("--count", type=_int_in(0, U32_MAX, "count"), default=0, metavar="N", help="stop after N frames")

    s = _add(sub, "completion", "print a shell completion script", "source <(steadq completion bash)")
    s.add_argument("shell", choices=("bash", "zsh"))

    adm = _add(sub, "admin", "operator commands for dead letters and quarantine")
    asub = adm.add_subparsers(dest="admin_command", metavar="ADMIN_COMMAND", parser_class=_Parser)
    asub.required = True
    for name, args, help_text in (
        ("dead-list", (), "list dead-letter files (no queue open)"),
        ("dead-inspect", ("JOB_ID",), "dead objects of one job"),
        ("dead-export", ("JOB_ID", "OUTPUT"), "copy a dead job file"),
        ("dead-remove", ("JOB_ID",), "delete a dead job"),
        ("requeue", ("JOB_ID",), "move a dead job back to ready with fresh attempts"),
        ("quarantine-list", (), "list quarantined objects"),
        ("quarantine-inspect", ("ID",), "one quarantined object"),
        ("quarantine-export", ("ID", "OUTPUT"), "copy a quarantined object"),
        ("quarantine-remove", ("ID",), "delete a quarantined object"),
        ("compact-receipts", (), "run a full recovery pass (compaction and expiry)"),
    ):
        a = _add(asub, name, help_text, f"steadq admin {name} /srv/q {' '.join(args)}".rstrip())
        a.add_argument("path", metavar="PATH")
        for arg in args:
            a.add_argument(arg.lower(), metavar=arg)
    return p


# =========================================================================== queue helpers


def open_queue(path: str, *, code: int | None = None, **options: Any) -> Queue:
    """Open with default options; failure -> one line and the error's code (or ``code``)."""
    from steadqd.fs.handle import Queue

    try:
        return Queue.open(path, **options)
    except Exception as e:  # noqa: BLE001 - every failure must become one line and an exit code
        raise CliError(f"cannot open queue {path}: {error_text(e)}", code if code is not None else error_code(e)) from e


def load_handle(handle_file: str, q: Queue) -> Lease:
    """Read and check a handle file: unreadable -> OS mapping, malformed or foreign -> 1."""
    from steadqd.errors import SteadQError
    from steadqd.fs.lease import Lease

    try:
        with open(handle_file, "rb") as f:
            raw = f.read(1 << 20)
    except OSError as e:
        raise CliError(f"cannot read handle file {handle_file}: {e.strerror}", os_exit_code(e)) from e
    try:
        lease, queue_id = Lease.from_handle(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise CliError(f"invalid handle file {handle_file}: not UTF-8", 1) from None
    except SteadQError as e:
        raise CliError(f"invalid handle file {handle_file}: {e.message}", 1) from e
    if queue_id is None:
        raise CliError(f"invalid handle file {handle_file}: it has no queue_id", 1)
    if queue_id != q.queue_id:
        raise CliError(f"handle file {handle_file} belongs to queue {queue_id}, not {q.queue_id}", 1)
    return lease


def settle_failure(e: BaseException) -> CliError:
    """cli.md's common messages for ack/retry/bury failures."""
    from steadqd.errors import LeaseLost, NotCommitted, OutcomeUnknown

    if isinstance(e, LeaseLost):
        return CliError("lease lost", 1)
    if isinstance(e, OutcomeUnknown):
        return CliError(["outcome unknown", f"  {e.message}"], 2)
    if isinstance(e, NotCommitted):
        return CliError(f"not committed: {e.message}", e.exit_code)
    return CliError(f"not committed: {error_text(e)}", error_code(e))


def _state_name(state: Any) -> str:
    return str(getattr(state, "value", state))


# =========================================================================== init


def cmd_init(a: argparse.Namespace) -> int:
    from steadqd.fs.layout import QueueConfig, init_queue

    try:
        config = QueueConfig(shards=a.shards, terminal_width_ns=a.terminal_bucket_width_ns)
        fmt = init_queue(a.path, config, shared=a.shared)
    except Exception as e:  # noqa: BLE001
        raise CliError(f"init failed: {error_text(e)}", error_code(e)) from e
    err(f"initialized queue at {a.path}", f"queue_id: {fmt.queue_id.hex()}", f"shards: {fmt.shard_count}")
    if a.shared:
        err("shared: group members may produce and consume (mode 2770)")
    return 0


# =========================================================================== put


@dataclass
class PutOptions:
    """Everything of ``put`` that applies to each job of a (bulk) put."""

    content_type: str
    max_attempts: int
    not_before: int | None
    delay: float | None
    producer_id: str | None
    metadata: dict[str, str] | None

    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "content_type": self.content_type,
            "max_attempts": self.max_attempts,
            "metadata": self.metadata,
            "producer_id": self.producer_id,
        }
        if self.not_before is not None:
            kw["not_before_ns"] = self.not_before
        if self.delay:
            kw["delay"] = self.delay
        return kw


def cmd_put(a: argparse.Namespace) -> int:
    if a.delay is not None and a.not_before is not None:
        raise CliError("put: give either --delay or --not-before, not both", 1)
    if a.dir is not None and a.jsonl is not None:
        raise CliError("put: give either --dir or --jsonl, not both", 1)
    if (a.dir is not None or a.jsonl is not None) and a.file != "-":
        raise CliError(f"put: unexpected FILE {a.file!r} with --dir/--jsonl", 1)
    metadata = dict(a.meta) if a.meta else None
    default_type = "application/json" if a.jsonl is not None else "application/octet-stream"
    opts = PutOptions(a.content_type or default_type, a.max_attempts, a.not_before, a.delay, a.producer_id, metadata)
    if a.dir is not None:
        return bulk_put(a, opts, _dir_source(a.dir))
    if a.jsonl is not None:
        return bulk_put(a, opts, _jsonl_source(a.jsonl))
    return single_put(a, opts)


def single_put(a: argparse.Namespace, opts: PutOptions) -> int:
    """One job; the payload is streamed (never held in memory whole)."""
    from steadqd.errors import NotCommitted, OutcomeUnknown

    if a.file == "-":
        stream: BinaryIO = sys.stdin.buffer
        owned = False
    else:
        try:
            stream = open(a.file, "rb")  # noqa: SIM115 - closed below
        except OSError as e:  # read failure -> OS mapping, before the queue is opened
            raise CliError(f"cannot read {a.file}: {e.strerror}", os_exit_code(e)) from e
        owned = True
    try:
        q = open_queue(a.path)
        try:
            job_id, path = q.enqueue_detailed(stream, **opts.kwargs())
        except OutcomeUnknown as e:
            t = e.ticket
            lines = [f"outcome unknown: {e.message}"]
            if t is not None:
                lines += [f"job_id: {t.job_id.hex()}", f"path: {t.path}"]
            raise CliError(lines, 2) from e
        except NotCommitted as e:
            lines = [f"not committed: {e.message}"]
            if e.job_id:
                lines.append(f"job_id: {e.job_id}")
            raise CliError(lines, e.exit_code) from e
        finally:
            q.close()
    finally:
        if owned:
            stream.close()
    out(f"job_id: {job_id}", f"path: {path}")
    return 0


@dataclass
class BulkSource:
    """A bulk payload source: ``total`` if known up front, and an iterator of
    ``(label, opener)`` where ``opener()`` returns a binary stream for one job."""

    describe: str
    total: int | None
    items: Callable[[], Iterator[tuple[str, Callable[[], BinaryIO]]]]
    cleanup: Callable[[], None] = lambda: None


def _dir_source(directory: str) -> BulkSource:
    """Every regular file of ``directory`` (not recursive, symlinks not followed), by name.

    Only the names are held in memory; each file is opened when its turn comes.
    """
    try:
        with os.scandir(directory) as it:
            names = sorted(e.name for e in it if e.is_file(follow_symlinks=False))
    except OSError as e:
        raise CliError(f"cannot read directory {directory}: {e.strerror}", os_exit_code(e)) from e

    def items() -> Iterator[tuple[str, Callable[[], BinaryIO]]]:
        for name in names:
            full = os.path.join(directory, name)
            yield name, (lambda full=full: open(full, "rb"))  # type: ignore[misc]

    return BulkSource(f"files of {directory}", len(names), items)


def _jsonl_source(path: str) -> BulkSource:
    """One job per non-blank line, each a JSON document (validated *before* anything is enqueued).

    Why validate first: a malformed line 5000 must not leave 4999 jobs
    enqueued ("nothing half-written"). stdin is spooled to an anonymous temp
    file during validation, so memory stays flat for any input size.
    """
    import io
    import tempfile

    if path == "-":
        spool: IO[bytes] = tempfile.TemporaryFile()
        src: IO[bytes] = sys.stdin.buffer
        label = "stdin"
    else:
        try:
            src = open(path, "rb")  # noqa: SIM115 - closed below
        except OSError as e:
            raise CliError(f"cannot read {path}: {e.strerror}", os_exit_code(e)) from e
        spool = src
        label = path
    count = 0
    try:
        for lineno, line in enumerate(src, 1):
            if path == "-":
                spool.write(line)
            body = line.strip()
            if not body:
                continue
            try:
                json.loads(body)
            except ValueError as e:
                raise CliError(f"{label}:{lineno}: invalid JSON: {e}", 1) from None
            count += 1
    except OSError as e:
        spool.close()
        raise CliError(f"cannot read {label}: {e.strerror}", os_exit_code(e)) from e
    except BaseException:
        spool.close()
        raise

    def items() -> Iterator[tuple[str, Callable[[], BinaryIO]]]:
        spool.seek(0)
        for lineno, line in enumerate(spool, 1):
            body = line.strip()
            if body:
                yield f"{label}:{lineno}", (lambda body=body: io.BytesIO(body))  # type: ignore[misc]

    return BulkSource(f"lines of {label}", count, items, spool.close)


class Progress:
    """A progress bar on a terminal (stderr, ``\\r`` updates at most 10/s); silent otherwise."""

    def __init__(self, total: int | None, enabled: bool, stream: IO[str] | None = None) -> None:
        self.total = total
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.start = time.monotonic()
        self._last = 0.0
        self.done = 0

    def update(self, done: int, *, force: bool = False) -> None:
        self.done = done
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        rate = done / max(now - self.start, 1e-9)
        if self.total:
            width = 30
            filled = width * done // self.total
            pct = 100 * done // self.total
            line = f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} {pct:3d}% {rate:8.0f}/s"
        else:
            line = f"\r{done} jobs {rate:8.0f}/s"
        self.stream.write(line)
        self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.update(self.done, force=True)
            self.stream.write("\n")
            self.stream.flush()


def bulk_put(a: argparse.Namespace, opts: PutOptions, source: BulkSource) -> int:
    """Enqueue every item of ``source``; progress on a TTY, one summary line always.

    Jobs go through ``Queue.enqueue_many`` one group (ENQUEUE_MANY_GROUP jobs)
    per call: the group's files are written, fsynced together, linked, then
    each directory is fsynced once, and a group's jobs count as enqueued only
    after that. Sources are opened one at a time and each is closed once it
    is written. On a failure the summary says how many jobs are durable (a
    prefix of the input), so a script can tell what to resubmit.
    """
    from steadqd.constants import ENQUEUE_MANY_GROUP
    from steadqd.errors import EnqueueIncomplete, NotCommitted, OutcomeUnknown

    try:
        q = open_queue(a.path)
    except CliError:
        source.cleanup()
        raise
    progress = Progress(source.total, sys.stderr.isatty())
    start = time.monotonic()
    durable = 0
    nbytes = 0
    kwargs = opts.kwargs()
    failure: CliError | None = None
    items = source.items()
    exhausted = False

    def group(labels: list[str], sizes: list[int]) -> Iterator[BinaryIO]:
        """The next group's payload streams; each is closed when the next is asked for."""
        nonlocal exhausted, failure
        for _ in range(ENQUEUE_MANY_GROUP):
            try:
                label, opener = next(items)
            except StopIteration:
                exhausted = True
                return
            try:
                stream = opener()
            except OSError as e:
                failure = CliError(f"cannot read {label}: {e.strerror}", os_exit_code(e))
                return
            with stream:
                labels.append(label)
                try:
                    yield stream
                finally:
                    sizes.append(stream.tell())

    try:
        while not exhausted and failure is None:
            labels: list[str] = []
            sizes: list[int] = []
            payloads = group(labels, sizes)
            ids: list[str] = []
            error: CliError | None = None
            try:
                ids = q.enqueue_many(payloads, **kwargs)
            except EnqueueIncomplete as e:
                ids = e.published
                kind = "outcome unknown" if isinstance(e.cause, OutcomeUnknown) else "not committed"
                error = CliError(f"{kind}: {e.cause.message}", e.exit_code)
            except OutcomeUnknown as e:
                error = CliError(f"outcome unknown: {e.message}", 2)
            except NotCommitted as e:
                error = CliError(f"not committed: {e.message}", e.exit_code)
            finally:
                payloads.close()
            if error is not None:  # after an unreadable source, if any: both are reported
                failure = error if failure is None else CliError([*failure.lines, *error.lines], error.code)
            durable += len(ids)
            nbytes += sum(sizes[: len(ids)])
            if a.print_ids:
                for job_id, label in zip(ids, labels, strict=False):
                    out(f"{job_id} {label}")
            progress.update(durable)
    except KeyboardInterrupt:
        failure = CliError("interrupted", 130)
    finally:
        progress.update(durable)
        progress.finish()
        try:
            q.close()
        except OutcomeUnknown as e:
            failure = CliError(f"outcome unknown: {e.message}", 2)
        source.cleanup()
    elapsed = time.monotonic() - start
    rate = durable / elapsed if elapsed > 0 else 0.0
    if a.json:
        out_json({"enqueued": durable, "bytes": nbytes, "seconds": round(elapsed, 3), "failed": failure is not None})
    summary = f"enqueued {durable} jobs ({nbytes} bytes) from {source.describe} in {elapsed:.1f}s ({rate:.0f}/s)"
    if failure is not None:
        raise CliError([*failure.lines, summary], failure.code)
    err(summary)
    return 0


# =========================================================================== lease / ack / retry / bury


def cmd_lease(a: argparse.Namespace) -> int:
    from steadqd.errors import NotCommitted, OutcomeUnknown

    if not 1 <= a.duration_seconds <= 604_800:
        raise CliError(f"lease failed: duration {a.duration_seconds} s is outside 1 .. 604800 s", 1)
    q = open_queue(a.path)
    try:
        try:
            lease = q.lease(wait=0.0, duration=a.duration_seconds)
        except OutcomeUnknown as e:
            lines = ["outcome unknown", f"  {e.message}"]
            t = e.ticket
            if t is not None and hasattr(t, "to_json"):
                lines.append(f"job_id: {t.job_id.hex()}")
                if a.ticket_out:
                    try:
                        write_atomic(a.ticket_out, t.to_json())
                        lines.append(f"ticket written to: {a.ticket_out}")
                    except OSError as we:
                        lines.append(f"failed to write ticket {a.ticket_out}: {we.strerror}")
            raise CliError(lines, 2) from e
        except NotCommitted as e:
            raise CliError(f"lease failed: {e.message}", e.exit_code) from e
        quarantined = _scan_quarantined(q)
        if lease is None:
            if quarantined:
                # cli.md: a corrupt ready object in the scan path gives exit 3. The
                # library isolates it and goes on; with nothing leased we still
                # report the corruption the reference would have failed on.
                raise CliError([f"lease failed: {line}" for line in quarantined], 3)
            raise CliError("no jobs available", 1)
        for line in quarantined:
            err(f"warning: {line}")
        if a.handle_file:
            try:
                write_atomic(a.handle_file, lease.to_handle(a.path))
            except OSError as e:
                raise CliError(f"failed to write handle file {a.handle_file}: {e.strerror}", 6) from e
        out(
            f"job_id: {lease.job_id}",
            f"generation: {lease.generation}",
            f"attempt: {lease.attempt}/{lease.max_attempts}",
        )
        return 0
    finally:
        q.close()


def _scan_quarantined(q: Queue) -> list[str]:
    """One line per object the last lease scan moved to quarantine."""
    report = q.last_scan
    if report is None:
        return []
    return [
        f"corrupt object {path} quarantined as {qname} (reason 0x{reason:04x})"
        for path, reason, qname in report.quarantined
    ]


def _settle(a: argparse.Namespace, action: Callable[[Queue, Lease], str]) -> int:
    q = open_queue(a.path)
    try:
        lease = load_handle(a.handle_file, q)
        try:
            message = action(q, lease)
        except Exception as e:  # noqa: BLE001
            raise settle_failure(e) from e
        err(message)
        return 0
    finally:
        with contextlib.suppress(Exception):
            q.close()


def cmd_ack(a: argparse.Namespace) -> int:
    from steadqd.fs.settle import AckResult

    def act(q: Queue, lease: Lease) -> str:
        return "acked" if q.ack(lease) is AckResult.ACKED else "already acked (idempotent success)"

    return _settle(a, act)


def cmd_retry(a: argparse.Namespace) -> int:
    def act(q: Queue, lease: Lease) -> str:
        if a.after_seconds is None:
            q.retry(lease)
        else:
            # wall floor + S x 10^9, saturating: anything past 2^63-1 ns is refused by the library.
            q.retry(lease, delay=float(min(a.after_seconds, U64_MAX // NS)))
        return "retried"

    return _settle(a, act)


def cmd_bury(a: argparse.Namespace) -> int:
    reason = a.reason if a.reason <= 4 else 0  # cli.md: only 0-4 are honoured, anything else is 0x0000

    def act(q: Queue, lease: Lease) -> str:
        q.bury(lease, reason=reason)
        return "buried"

    return _settle(a, act)


# =========================================================================== work


class _NullSink:
    """A write-only sink: verifying a payload without holding it."""

    def write(self, b: bytes) -> int:
        return len(b)


def _requeue_now(q: Queue, lease: Lease) -> int:
    from steadqd.errors import LeaseLost, OutcomeUnknown, SteadQError

    try:
        q.retry(lease)
        return 0
    except LeaseLost:
        return 1
    except OutcomeUnknown:
        return 2
    except SteadQError as e:
        return e.exit_code


def _open_leased_fd(q: Queue, lease: Lease) -> tuple[int, int]:
    """An fd of exactly the leased inode and its payload offset (renewals rename, the fd stays valid)."""
    from steadqd.fs.verify import read_envelope

    fd = os.open(os.path.join(q.path, lease.path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (lease.dev, lease.ino):
            raise FileNotFoundError(errno.ENOENT, "leased file was replaced", lease.path)
        env = read_envelope(fd, q.format.max_payload_length, st)
        return fd, env.payload_offset
    except BaseException:
        os.close(fd)
        raise


def work_one(q: Queue, lease: Lease, command: list[str], lease_seconds: int) -> int:
    """Run ``command`` for one leased job and settle it; returns the job's result code."""
    import subprocess

    from steadqd.errors import LeaseLost, NotCommitted, OutcomeUnknown, SteadQError
    from steadqd.fs.settle import AckResult

    # 2. verified payload (full hash first; a corrupt payload is quarantined by the library)
    try:
        q.copy_payload(lease, _NullSink())  # type: ignore[arg-type]
        fd, offset = _open_leased_fd(q, lease)
    except LeaseLost:
        err(f"work: job {lease.job_id}: lease lost before the payload was read")
        return 1
    except FileNotFoundError:
        err(f"work: job {lease.job_id}: leased file vanished")
        return 1
    except SteadQError as e:
        err(f"work: job {lease.job_id}: {e.message}")
        return error_code(e)
    except OSError as e:
        err(f"work: job {lease.job_id}: {e.strerror}")
        return 6
    # 3. spawn with the payload on stdin
    env = dict(os.environ)
    env.update(
        STEADQ_JOB_ID=lease.job_id,
        STEADQ_ATTEMPT=str(lease.attempt),
        STEADQ_MAX_ATTEMPTS=str(lease.max_attempts),
        STEADQ_CONTENT_TYPE=lease.content_type,
    )
    try:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, env=env)
    except OSError as e:
        os.close(fd)
        err(f"work: cannot run {command[0]}: {e.strerror}")
        return max(127, _requeue_now(q, lease))
    state = {"delivered": False, "read_failed": False}

    def feed() -> None:
        assert proc.stdin is not None
        pos, end = offset, offset + lease.payload_length
        try:
            while pos < end:
                chunk = os.pread(fd, min(65_536, end - pos), pos)
                if not chunk:
                    state["read_failed"] = True
                    return
                try:
                    proc.stdin.write(chunk)
                except BrokenPipeError:
                    state["delivered"] = True  # the child exited early: counts as delivered
                    return
                pos += len(chunk)
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.flush()
            state["delivered"] = True
        except OSError:
            state["read_failed"] = True
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    # 4. poll every 50 ms, renew every S/2
    renewing = True
    interval = lease_seconds / 2
    next_renew = time.monotonic() + interval
    try:
        while True:
            try:
                code = proc.wait(timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                pass
            if renewing and time.monotonic() >= next_renew:
                next_renew += interval
                try:
                    q.renew(lease, duration=lease_seconds)
                except (LeaseLost, OutcomeUnknown) as e:
                    err(f"work: job {lease.job_id}: renew failed, no further renewals: {e.message}")
                    renewing = False
                except NotCommitted as e:
                    err(f"work: job {lease.job_id}: renew not committed (will retry): {e.message}")
    except OSError as e:
        err(f"work: waiting for the command failed: {e.strerror}")
        os.close(fd)
        return 6
    feeder.join()
    os.close(fd)
    if code < 0:
        code = 1  # killed by a signal
    # 5. settle
    if code == 0 and state["delivered"]:
        try:
            q.ack(lease)  # Acked or AlreadyAcked
            _ = AckResult
            return 0
        except LeaseLost:
            return 1
        except OutcomeUnknown:
            return 2
        except SteadQError as e:
            return e.exit_code
    if code == 0:
        return max(1, _requeue_now(q, lease))
    return max(code, _requeue_now(q, lease))


def _worker(path: str, command: list[str], lease_seconds: int, once: bool, results: list[int], idx: int) -> None:
    from steadqd.errors import NotCommitted, OutcomeUnknown, SteadQError

    try:
        q = open_queue(path, deferred=True)
    except CliError as e:
        err(*e.lines)
        results[idx] = e.code
        return
    try:
        while True:
            try:
                lease = q.lease(wait=0.0 if once else 1.0, duration=lease_seconds)
            except OutcomeUnknown as e:
                err(f"work: lease outcome unknown: {e.message}")
                results[idx] = 2
                return
            except NotCommitted as e:
                err(f"work: lease failed: {e.message}")
                results[idx] = e.exit_code
                return
            quarantined = _scan_quarantined(q)
            for line in quarantined:
                err(f"work: {line}")
            if lease is None:
                if once:
                    # The only job was corrupt: its result is the corruption's code.
                    results[idx] = 3 if quarantined else 0
                    return
                continue
            result = work_one(q, lease, command, lease_seconds)
            if once:
                results[idx] = result
                return
    finally:
        try:
            q.close()
        except SteadQError as e:
            err(f"work: closing the queue: {e.message}")
            results[idx] = max(results[idx], error_code(e))


def cmd_work(a: argparse.Namespace) -> int:
    command: list[str] = a.work_command
    if not command:
        raise CliError("work: missing COMMAND (usage: steadq work PATH [options] -- COMMAND [ARGS...])", 1)
    open_queue(a.path).close()  # fail early, with the open error's code
    results = [0] * a.concurrency
    threads = [
        threading.Thread(target=_worker, args=(a.path, command, a.lease_seconds, a.once, results, i), daemon=True)
        for i in range(a.concurrency)
    ]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)
    return max(results)


# =========================================================================== stats / watch


def format_stats_text(s: dict[str, Any]) -> str:
    """cli.md plain output, including the final newline: ``ready: 1 (oldest 0s)`` / ``dead: 0``."""
    lines = []
    for state in sorted(s):
        st = s[state]
        if st.objects and st.oldest_age_seconds is not None:
            lines.append(f"{state}: {st.objects} (oldest {st.oldest_age_seconds}s)")
        else:
            lines.append(f"{state}: {st.objects}")
    return "".join(line + "\n" for line in lines)


def format_stats_json(s: dict[str, Any]) -> str:
    """cli.md ``--json``: 2-space pretty JSON, keys sorted, final newline included."""
    doc = {k: {"objects": v.objects, "oldest_age_seconds": v.oldest_age_seconds} for k, v in s.items()}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def format_stats_prometheus(s: dict[str, Any]) -> str:
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


def _render_watch(path: str, s: dict[str, Any], prev: dict[str, Any] | None, dt: float) -> list[str]:
    from steadqd.durations import format_duration

    def count(st: dict[str, Any], name: str) -> int:
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
    prev: dict[str, Any] | None = None
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


# =========================================================================== fsck / doctor / inspect


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
    q = open_queue(a.path)
    try:
        try:
            r = q.fsck(deep=a.deep, repair=a.repair)
        except Exception as e:  # noqa: BLE001
            raise CliError(f"fsck failed: {error_text(e)}", error_code(e)) from e
    finally:
        with contextlib.suppress(Exception):
            q.close()
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


def doctor_checks(path: str) -> list[tuple[str, bool, str]]:
    """cli.md doctor checks, in order; probes never leave files behind."""
    from steadqd.constants import SUPPORTED_FILESYSTEMS
    from steadqd.fs import linux
    from steadqd.fs.layout import filesystem_name

    checks: list[tuple[str, bool, str]] = []

    def check(name: str, fn: Callable[[], str]) -> None:
        try:
            checks.append((name, True, fn()))
        except Exception as e:  # noqa: BLE001 - a failed probe is a FAIL line, not a crash
            checks.append((name, False, error_text(e)))

    check("boot_id", linux.read_boot_id)
    check("clock_boottime", lambda: f"{linux.boottime_ns()} ns")
    check("clock_realtime", lambda: f"{linux.realtime_ns()} ns")
    check("getrandom", lambda: "OK" if len(linux.getrandom(16)) == 16 else "short read")
    if not os.path.exists(path):
        return checks
    try:
        magic = linux.statfs_type(path)
        checks.append(("filesystem", magic in SUPPORTED_FILESYSTEMS, f"{filesystem_name(magic)} (magic 0x{magic:x})"))
    except OSError as e:
        checks.append(("filesystem", False, error_text(e)))
    tmp = os.path.join(path, "tmp")
    if not os.path.isdir(tmp):
        return checks
    try:
        dfd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        for name in ("publication_mode", "rename_noreplace", "dir_fsync"):
            checks.append((name, False, error_text(e)))
        return checks
    try:
        check("publication_mode", lambda: _probe_publication(dfd))
        try:
            supported = _probe_rename_noreplace(dfd)
            checks.append(("rename_noreplace", supported, "supported" if supported else "unsupported"))
        except OSError as e:
            checks.append(("rename_noreplace", False, error_text(e)))
        try:
            os.fsync(dfd)
            checks.append(("dir_fsync", True, "supported"))
        except OSError:
            checks.append(("dir_fsync", False, "unsupported"))
    finally:
        os.close(dfd)
    return checks


def _probe_publication(dfd: int) -> str:
    from steadqd.fs import linux

    try:
        fd = linux.open_tmpfile(dfd)
    except OSError:
        return "named-fallback"
    name = f".pubprobe-{os.urandom(16).hex()}"
    try:
        form = linux.link_tmpfile(fd, dfd, name)
    except (linux.TmpfileLinkUnsupported, OSError):
        return "named-fallback"
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dfd)
    return "direct-at-empty-path" if form == "direct" else "proc-self-fd"


def _probe_rename_noreplace(dfd: int) -> bool:
    """Supported iff the no-replace rename onto an existing file fails with EEXIST."""
    from steadqd.fs import linux

    rand = os.urandom(16).hex()
    n1, n2 = f".rnprobe1-{rand}", f".rnprobe2-{rand}"
    for n in (n1, n2):
        os.close(os.open(n, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=dfd))
    try:
        linux.rename_noreplace(dfd, n1, dfd, n2)
        return False
    except OSError as e:
        return e.errno == errno.EEXIST
    finally:
        for n in (n1, n2):
            with contextlib.suppress(OSError):
                os.unlink(n, dir_fd=dfd)


def cmd_doctor(a: argparse.Namespace) -> int:
    checks = doctor_checks(a.path)
    if a.json:
        out_json({name: {"ok": ok, "value": value} for name, ok, value in sorted(checks)})
    else:
        err(f"steadq doctor {a.path}", *(f"  {n}: {v}{'' if ok else ' [FAIL]'}" for n, ok, v in checks))
    return 0 if all(ok for _, ok, _ in checks) else 6


def cmd_inspect(a: argparse.Namespace) -> int:
    job_id = _job_id(a.job_id)
    q = open_queue(a.path)
    try:
        try:
            objs = q.inspect_detailed(job_id)
        except Exception as e:  # noqa: BLE001
            raise CliError(f"inspect failed: {error_text(e)}", error_code(e)) from e
    finally:
        q.close()
    if a.json:
        out_json([_job_object_json(o) for o in objs])
        return 0 if objs else 1
    if not objs:
        raise CliError("not found", 1)
    out(*(format_inspect_line(o) for o in objs))
    return 0


def format_inspect_line(o: Any) -> str:
    """``<state> gen=<g> attempt=<a>/<max> <relative path>`` (cli.md)."""
    return f"{_state_name(o.state)} gen={o.generation} attempt={o.attempt}/{o.max_attempts} {o.path}"


def _job_object_json(o: Any) -> dict[str, Any]:
    doc = {
        "state": _state_name(o.state),
        "generation": o.generation,
        "attempt": o.attempt,
        "max_attempts": o.max_attempts,
        "path": o.path,
    }
    details = getattr(o, "details", None)
    if details is not None:
        doc["details"] = details
    return doc


# =========================================================================== verify / format-dump


def _read_prefix(path: str) -> tuple[int, bytes, int]:
    """(fd, first 160 bytes, size); OS errors exit via the OS mapping."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror}", os_exit_code(e)) from e
    try:
        st = os.fstat(fd)
        return fd, os.pread(fd, 160, 0), st.st_size
    except OSError as e:
        os.close(fd)
        raise CliError(f"cannot read {path}: {e.strerror}", os_exit_code(e)) from e


def cmd_verify(a: argparse.Namespace) -> int:
    """Streams the file (flat memory) instead of reading it whole; same verdicts and lines."""
    import hashlib

    from steadqd.errors import SteadQError
    from steadqd.fs.records import FormatRecord, JobHeader, envelope_digest

    fd, prefix, size = _read_prefix(a.file)
    try:
        if size >= 128 and prefix.startswith(b"SDQJOB1\0"):
            try:
                h = JobHeader.decode(prefix[:128])
            except SteadQError as e:
                raise CliError(f"CORRUPT: {e.message}", 3) from e
            err(
                f"job_id: {h.job_id.hex()}",
                f"payload_length: {h.payload_length}",
                f"maximum_attempts: {h.max_attempts}",
            )
            if size != h.file_size:
                raise CliError(f"CORRUPT: expected {h.file_size} bytes, got {size}", 3)
            ext = os.pread(fd, h.extension_length, 128) if h.extension_length else b""
            if envelope_digest(prefix[:128], ext) != h.envelope_digest:
                raise CliError("CORRUPT: envelope digest mismatch", 3)
            err("envelope_digest: verified")
            if a.deep:
                digest = hashlib.sha256()
                pos, end = 128 + h.extension_length, h.file_size
                while pos < end:
                    chunk = os.pread(fd, min(1 << 20, end - pos), pos)
                    if not chunk:
                        break
                    digest.update(chunk)
                    pos += len(chunk)
                if digest.digest() != h.payload_digest:
                    raise CliError("CORRUPT: payload digest mismatch", 3)
                err("payload_digest: verified")
            err("valid")
            return 0
        if size == 160 and prefix.startswith(b"SDQFMT1\0"):
            try:
                f = FormatRecord.decode(prefix)
            except SteadQError as e:
                raise CliError(f"CORRUPT: {e.message}", 3) from e
            err(f"queue_id: {f.queue_id.hex()}", f"shard_count: {f.shard_count}", "valid")
            return 0
        raise CliError("unknown format", 1)
    except OSError as e:
        raise CliError(f"cannot read {a.file}: {e.strerror}", os_exit_code(e)) from e
    finally:
        os.close(fd)


def cmd_format_dump(a: argparse.Namespace) -> int:
    from steadqd.errors import SteadQError
    from steadqd.fs.records import FormatRecord, JobHeader

    fd, prefix, size = _read_prefix(a.file)
    os.close(fd)
    fields: dict[str, Any]
    try:
        if prefix.startswith(b"SDQJOB1\0"):
            h = JobHeader.decode(prefix[:128])
            fields = {
                "type": "job",
                "job_id": h.job_id.hex(),
                "payload_length": h.payload_length,
                "extension_header_length": h.extension_length,
                "maximum_attempts": h.max_attempts,
                "payload_digest": h.payload_digest.hex(),
                "envelope_digest": h.envelope_digest.hex(),
            }
        elif prefix.startswith(b"SDQFMT1\0"):
            if size != 160:
                raise CliError(f"parse error: FORMAT: size {size}, expected 160", 1)
            f = FormatRecord.decode(prefix)
            fields = {
                "type": "format",
                "queue_id": f.queue_id.hex(),
                "shard_count": f.shard_count,
                "lease_bucket_width_ns": f.lease_width_ns,
                "delayed_bucket_width_ns": f.delayed_width_ns,
                "terminal_bucket_width_ns": f.terminal_width_ns,
                "max_payload_length": f.max_payload_length,
            }
        else:
            raise CliError("unrecognized format", 1)
    except SteadQError as e:
        raise CliError(f"parse error: {e.message}", 1) from e
    if a.json:
        out_json(fields)
    else:
        out(*(f"{k}: {v}" for k, v in fields.items()))
    return 0


# =========================================================================== recover / resolve


def _recover_once(q: Queue, budget_ops: int, budget_ms: int) -> int:
    try:
        r = q.recover(budget_ops=budget_ops, budget_ms=budget_ms)
    except Exception as e:  # noqa: BLE001
        err(f"recovery failed: {error_text(e)}")
        return error_code(e) or 6
    err(
        f"reaped:{r.leases_reaped} promoted:{r.delayed_promoted} temp_deleted:{r.temp_files_deleted} "
        f"dead:{r.leases_to_dead} ops:{r.operations_attempted}{' (budget exhausted)' if r.budget_exhausted else ''}"
    )
    if r.errors:
        err(f"{len(r.errors)} recovery errors")
        return 6
    return 0


def cmd_recover(a: argparse.Namespace) -> int:
    q = open_queue(a.path)
    try:
        if not a.watch:
            return _recover_once(q, a.budget_ops, a.budget_ms)
        try:
            while True:
                _recover_once(q, a.budget_ops, a.budget_ms)
                time.sleep(5)
        except KeyboardInterrupt:
            return 0
    finally:
        with contextlib.suppress(Exception):
            q.close()


def cmd_resolve(a: argparse.Namespace) -> int:
    from steadqd.errors import SteadQError
    from steadqd.fs.records import TransitionTicket
    from steadqd.constants import Resolution

    try:
        with open(a.result_file, "rb") as f:
            raw = f.read(1 << 20)
    except OSError as e:
        raise CliError(f"cannot read ticket {a.result_file}: {e.strerror}", 1) from e
    try:
        ticket = TransitionTicket.from_json(raw)
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


# =========================================================================== bench


def cmd_bench(a: argparse.Namespace) -> int:
    from steadqd.errors import SteadQError

    open_queue(a.path, allow_unsupported_fs=True).close()
    lock = threading.Lock()
    counts = {"enqueued": 0, "leased": 0, "acked": 0}
    errors: list[str] = []
    stop_at = time.monotonic() + a.duration_seconds
    payload = b"\x42" * a.payload_size

    def bump(key: str) -> None:
        with lock:
            counts[key] += 1

    def producer() -> None:
        try:
            with open_queue(a.path, allow_unsupported_fs=True) as q:
                while time.monotonic() < stop_at:
                    q.enqueue(payload, content_type="bench", max_attempts=3)
                    bump("enqueued")
        except (SteadQError, CliError) as e:
            errors.append(str(e))

    def consumer() -> None:
        try:
            with open_queue(a.path, allow_unsupported_fs=True) as q:
                while time.monotonic() < stop_at:
                    lease = q.lease(wait=0.0, duration=a.lease_duration_seconds)
                    if lease is None:
                        time.sleep(0.001)
                        continue
                    bump("leased")
                    q.ack(lease)
                    bump("acked")
        except (SteadQError, CliError) as e:
            errors.append(str(e))

    start = time.monotonic()
    threads = [threading.Thread(target=producer, daemon=True) for _ in range(a.producers)]
    threads += [threading.Thread(target=consumer, daemon=True) for _ in range(a.consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = max(time.monotonic() - start, 1e-9)
    err(
        f"bench: {a.producers} producers, {a.consumers} consumers, {a.duration_seconds:g}s, {a.payload_size}-byte payloads",
        *(f"{k}: {v} ({v / elapsed:.0f}/s)" for k, v in counts.items()),
        *(f"error: {e}" for e in errors),
    )
    return 0


# =========================================================================== ls


def iter_jobs(root: str, states: set[str]) -> Iterator[tuple[str, Any, str, os.stat_result | None]]:
    """(state, JobName, relative path, lstat) of every parseable job object, streamed.

    A plain directory walk (no tag authentication: ``fsck`` is the verifier);
    entries that do not parse as a name of their directory are skipped.
    """
    from steadqd.constants import State
    from steadqd.errors import SteadQError
    from steadqd.fs.names import parse_name, parse_ready_dir_entry

    def listdir(rel: str) -> list[str]:
        try:
            return sorted(os.listdir(os.path.join(root, rel)))
        except OSError:
            return []

    def entries(rel: str, parse: Callable[[str], Any]) -> Iterator[tuple[str, Any, str, os.stat_result | None]]:
        for name in listdir(rel):
            try:
                jn = parse(name)
            except SteadQError:
                continue
            state = _state_name(jn.state)
            if state not in states:
                continue
            try:
                st: os.stat_result | None = os.lstat(os.path.join(root, rel, name))
            except OSError:
                st = None
            yield state, jn, f"{rel}/{name}", st

    if states & {"ready", "leased"}:
        for shard in listdir("ready"):
            yield from entries(f"ready/{shard}", parse_ready_dir_entry)
    for top, state in (("delayed", State.DELAYED), ("dead", State.DEAD), ("receipts", State.RECEIPT)):
        if state.value not in states:
            continue
        for bucket in listdir(top):
            for shard in listdir(f"{top}/{bucket}"):
                yield from entries(f"{top}/{bucket}/{shard}", lambda n, s=state: parse_name(s, n))
    if "leased" in states:
        for boot in listdir("leased"):
            for bucket in listdir(f"leased/{boot}"):
                for shard in listdir(f"leased/{boot}/{bucket}"):
                    yield from entries(f"leased/{boot}/{bucket}/{shard}", lambda n: parse_name(State.LEASED, n))


def _fmt_deadline(ns: int | None, now_ns: int) -> str:
    if ns is None:
        return "-"
    from steadqd.durations import format_duration

    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns // NS))
    delta = (ns - now_ns) / NS
    rel = f"in {format_duration(delta)}" if delta >= 0 else f"{format_duration(-delta)} ago"
    return f"{stamp} ({rel})"


def cmd_ls(a: argparse.Namespace) -> int:
    """Streamed listing: memory stays flat however many jobs there are."""
    from steadqd.durations import format_duration

    want = (a.state or "").lower()
    if want in ("", "live"):
        states = {"ready", "leased", "delayed", "dead"}
    elif want == "all":
        states = set(_LISTABLE_STATES)
    elif want in ("receipts",):
        states = {"receipt"}
    elif want in _LISTABLE_STATES:
        states = {want}
    else:
        raise CliError(f"ls: unknown state {a.state!r}: expected one of {', '.join(_LISTABLE_STATES)}, all", 1)
    open_queue(a.path).close()  # a missing or foreign path is an error, not an empty listing
    now_ns = time.time_ns()
    first = True
    if a.json:
        sys.stdout.write("[")
    else:
        out(f"{'STATE':<8} {'JOB_ID':<32} {'ATTEMPT':>9} {'AGE':>7}  DEADLINE")
    for state, jn, rel, st in iter_jobs(a.path, states):
        age = None if st is None else max(0, (now_ns - st.st_mtime_ns) // NS)
        deadline = jn.wall_deadline if state == "leased" else jn.not_before if state == "delayed" else None
        if a.json:
            doc = {
                "state": state,
                "job_id": jn.job_hex,
                "generation": jn.generation,
                "attempt": jn.attempt,
                "max_attempts": jn.max_attempts,
                "age_seconds": age,
                "deadline_ns": deadline,
                "path": rel,
            }
            if state == "dead":
                doc["reason"] = jn.reason
            sys.stdout.write(("\n  " if first else ",\n  ") + json.dumps(doc))
        else:
            attempt = f"{jn.attempt}/{jn.max_attempts}"
            shown_age = "-" if age is None else format_duration(age)
            sys.stdout.write(
                f"{state:<8} {jn.job_hex:<32} {attempt:>9} {shown_age:>7}  {_fmt_deadline(deadline, now_ns)}\n"
            )
        first = False
    if a.json:
        sys.stdout.write("]\n" if first else "\n]\n")
    sys.stdout.flush()
    return 0


# =========================================================================== admin


def _admin_job_id(text: str) -> str:
    return _job_id(text)


def cmd_admin_dead_list(a: argparse.Namespace) -> int:
    """Plain walk of dead/*/*/* without opening the queue (cli.md)."""
    from steadqd.constants import State
    from steadqd.errors import SteadQError
    from steadqd.fs.names import parse_name

    root = os.fsencode(a.path)
    dead = os.path.join(root, b"dead")
    try:
        buckets = sorted(os.listdir(dead))
    except FileNotFoundError:
        err(f"no dead/ directory under {a.path} (nothing to list)")
        if a.json:
            out_json([])
        return 0
    except OSError as e:
        raise CliError(f"cannot read {a.path}/dead: {e.strerror}", 6) from e
    rows: list[tuple[bytes, bytes]] = []
    try:
        for b in buckets:
            bdir = os.path.join(dead, b)
            if not os.path.isdir(bdir):
                continue
            for s in sorted(os.listdir(bdir)):
                sdir = os.path.join(bdir, s)
                if not os.path.isdir(sdir):
                    continue
                for name in sorted(os.listdir(sdir)):
                    rows.append((name, b"dead/" + b + b"/" + s + b"/" + name))
    except OSError as e:
        raise CliError(f"cannot read {a.path}/dead: {e.strerror}", 6) from e
    if a.json:
        docs = []
        for name, rel in rows:
            doc: dict[str, Any] = {"name": _escape(name), "path": _escape(rel)}
            try:
                jn = parse_name(State.DEAD, name)
                doc.update(job_id=jn.job_hex, generation=jn.generation, attempt=jn.attempt,
                           max_attempts=jn.max_attempts, reason=jn.reason)  # fmt: skip
            except SteadQError:
                pass
            docs.append(doc)
        out_json(docs)
    else:
        out(*(f"{_escape(name)} {_escape(rel)}" for name, rel in rows))
    return 0


def _open_admin(a: argparse.Namespace) -> Queue:
    return open_queue(a.path, code=6)  # cli.md: admin open failures exit 6


def _admin_failure(e: Exception) -> CliError:
    from steadqd.errors import ErrorKind, SteadQError

    if isinstance(e, SteadQError) and e.kind is ErrorKind.NOT_FOUND:
        return CliError("not found", 1)
    if isinstance(e, FileNotFoundError):
        return CliError("not found", 1)
    return CliError(f"failed: {error_text(e)}", 6)


def cmd_admin_dead_inspect(a: argparse.Namespace) -> int:
    job_id = _admin_job_id(a.job_id)
    q = _open_admin(a)
    try:
        objs = [o for o in q.inspect(job_id) if _state_name(o.state) == "dead"]
    finally:
        q.close()
    if a.json:
        out_json([_job_object_json(o) for o in objs])
    else:
        out(*(f"gen={o.generation} attempt={o.attempt}/{o.max_attempts} {o.path}" for o in objs))
    return 0


def _admin_call(a: argparse.Namespace, fn: Callable[[Queue], Any]) -> Any:
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
    job_id = _admin_job_id(a.job_id)
    n = _admin_call(a, lambda q: q.export_dead(job_id, a.output))
    err(f"exported {n} bytes")
    return 0


def cmd_admin_dead_remove(a: argparse.Namespace) -> int:
    job_id = _admin_job_id(a.job_id)
    _admin_call(a, lambda q: q.remove_dead(job_id))
    err("removed")
    return 0


def cmd_admin_requeue(a: argparse.Namespace) -> int:
    """Not in cli.md (an extra): not found -> 1, OutcomeUnknown -> 2, else the error kind's code."""
    from steadqd.errors import ErrorKind, OutcomeUnknown, SteadQError

    job_id = _admin_job_id(a.job_id)
    q = _open_admin(a)
    try:
        path = q.requeue_dead(job_id)
    except OutcomeUnknown as e:
        raise CliError([f"outcome unknown: {e.message}", f"job_id: {job_id}"], 2) from e
    except SteadQError as e:
        if e.kind is ErrorKind.NOT_FOUND:
            raise CliError("not found", 1) from e
        raise CliError(f"not committed: {e.message}", e.exit_code) from e
    finally:
        with contextlib.suppress(Exception):
            q.close()
    out(f"job_id: {job_id}", f"path: {path}")
    err("requeued")
    return 0


def _quarantine_fields(o: Any) -> dict[str, Any]:
    """The documented JSON shape of one quarantined object (admin.QuarantinedObject)."""
    return {"quarantine_id": o.quarantine_id, "reason": int(o.reason), "path": o.path, "size": o.size}


def _quarantine_id(text: str) -> str:
    if not _HEX32.fullmatch(text):
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


# =========================================================================== completion


def _command_tree(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """``{"put": [options...], "admin dead-list": [...], ...}`` from the parser itself."""
    tree: dict[str, list[str]] = {}

    def walk(p: argparse.ArgumentParser, prefix: str) -> None:
        for action in p._actions:  # noqa: SLF001 - argparse has no public introspection
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                for name, sp in action.choices.items():
                    key = f"{prefix} {name}".strip()
                    longs = {o for act in sp._actions for o in act.option_strings if o.startswith("--")}  # noqa: SLF001
                    tree[key] = sorted(longs | {"--json"})
                    walk(sp, key)

    walk(parser, "")
    return tree


def _join(words: list[str]) -> str:
    return " ".join(words)


def completion_script(shell: str) -> str:
    tree = _command_tree(build_parser())
    top = " ".join(sorted(k for k in tree if " " not in k))
    admin_cmds = " ".join(sorted(k.split(" ", 1)[1] for k in tree if k.startswith("admin ")))
    if shell == "bash":
        cases = "\n".join(f'        "{k}") opts="{_join(v)}" ;;' for k, v in sorted(tree.items()))
        return f"""# bash completion for steadq; enable with: source <(steadq completion bash)
_steadq() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" cmd="" i opts=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            -*) ;;
            *) if [[ -z "$cmd" ]]; then cmd="${{COMP_WORDS[i]}}"
               elif [[ "$cmd" == admin && "$cmd" != *" "* ]]; then cmd="admin ${{COMP_WORDS[i]}}"; fi ;;
        esac
    done
    if [[ -z "$cmd" ]]; then
        COMPREPLY=($(compgen -W "{top} --json --help" -- "$cur")); return
    fi
    if [[ "$cmd" == admin ]]; then
        COMPREPLY=($(compgen -W "{admin_cmds}" -- "$cur")); return
    fi
    if [[ "$cmd" == completion ]]; then
        COMPREPLY=($(compgen -W "bash zsh" -- "$cur")); return
    fi
    case "$cmd" in
{cases}
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$opts --help" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -o filenames -F _steadq steadq
"""
    cases = "\n".join(f'    "{k}") opts=({_join(v)}) ;;' for k, v in sorted(tree.items()))
    return f"""#compdef steadq
# zsh completion for steadq; enable with: source <(steadq completion zsh)  (after compinit)
_steadq() {{
  local -a words_ cmds admin_cmds opts
  cmds=({top})
  admin_cmds=({admin_cmds})
  words_=(${{words[2,CURRENT-1]:#-*}})
  if (( ${{#words_}} == 0 )); then
    compadd -- $cmds --json --help; return
  fi
  local cmd=${{words_[1]}}
  if [[ $cmd == admin ]]; then
    if (( ${{#words_}} == 1 )); then compadd -- $admin_cmds; return; fi
    cmd="admin ${{words_[2]}}"
  fi
  if [[ $cmd == completion ]]; then compadd -- bash zsh; return; fi
  case $cmd in
{cases}
  esac
  if [[ $PREFIX == -* ]]; then compadd -- $opts --help; else _files; fi
}}
compdef _steadq steadq
"""


def cmd_completion(a: argparse.Namespace) -> int:
    sys.stdout.write(completion_script(a.shell))
    sys.stdout.flush()
    return 0


# =========================================================================== main

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "init": cmd_init,
    "put": cmd_put,
    "lease": cmd_lease,
    "ack": cmd_ack,
    "retry": cmd_retry,
    "bury": cmd_bury,
    "work": cmd_work,
    "stats": cmd_stats,
    "fsck": cmd_fsck,
    "doctor": cmd_doctor,
    "inspect": cmd_inspect,
    "verify": cmd_verify,
    "format-dump": cmd_format_dump,
    "recover": cmd_recover,
    "resolve": cmd_resolve,
    "bench": cmd_bench,
    "ls": cmd_ls,
    "watch": cmd_watch,
    "completion": cmd_completion,
    "admin dead-list": cmd_admin_dead_list,
    "admin dead-inspect": cmd_admin_dead_inspect,
    "admin dead-export": cmd_admin_dead_export,
    "admin dead-remove": cmd_admin_dead_remove,
    "admin requeue": cmd_admin_requeue,
    "admin quarantine-list": cmd_admin_quarantine_list,
    "admin quarantine-inspect": cmd_admin_quarantine_inspect,
    "admin quarantine-export": cmd_admin_quarantine_export,
    "admin quarantine-remove": cmd_admin_quarantine_remove,
    "admin compact-receipts": cmd_admin_compact_receipts,
}


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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``steadq`` console script; returns the exit code."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    rest, command, as_json = split_argv(args_in)
    try:
        try:
            a = build_parser().parse_args(rest)
        except SystemExit as e:  # --help
            return int(e.code or 0)
        a.json = as_json
        a.work_command = command or []
        if command is not None and a.command != "work":
            raise CliError(f"{PROG} {a.command}: unexpected arguments after '--'", 1)
        key = a.command if a.command != "admin" else f"admin {a.admin_command}"
        return COMMANDS[key](a)
    except CliError as e:
        err(*e.lines)
        return e.code
    except BrokenPipeError:
        # stdout closed early (``steadq ls Q | head``): not an error of ours.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as e:  # noqa: BLE001 - never a traceback: one line and the mapped exit code
        err(f"{PROG}: {error_text(e)}")
        return error_code(e)
    except KeyboardInterrupt:
        return 130


def console_main() -> None:
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
