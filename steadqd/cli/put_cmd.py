"""``steadq put``: enqueue one job, or many from a directory, a JSON-lines or text file, or file paths.

A single put streams its payload (never held in memory whole) and refuses an
empty one unless ``--allow-empty``: an empty stdin is far more often a
producer that printed nothing than an intended job. A bulk put (``--dir``,
``--jsonl``, ``--lines``, ``--path`` with several files) goes through
``enqueue_many`` group by group, shows a progress bar on a terminal, and
always ends with one summary line that says how many jobs are durable, so a
script can tell what to resubmit.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import IO, Any, BinaryIO, cast

from steadqd.backend import Backend, OutcomeTicket
from steadqd.cli.common import (
    CliError,
    Interrupted,
    Interrupts,
    Subcommands,
    add_queue_command,
    duration,
    err,
    int_in,
    open_queue,
    os_exit_code,
    out,
    out_json,
    printed,
    stdin_bytes,
)
from steadqd.constants import ENQUEUE_MANY_GROUP, MAX_MAXIMUM_ATTEMPTS, MIN_MAXIMUM_ATTEMPTS, U64_MAX
from steadqd.errors import DuplicateJob, EnqueueIncomplete, NotCommitted, OutcomeUnknown, SteadQError

_METADATA_KEY = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def add_put(sub: Subcommands) -> None:
    s = add_queue_command(
        sub,
        "put",
        "enqueue a job (or many with --dir, --jsonl, --lines, --path)",
        "echo hello | steadq put /srv/q --meta user=ann",
        run=cmd_put,
    )
    s.add_argument("file", metavar="FILE", nargs="?", default="-", help="payload file; '-' or omitted: stdin")
    s.add_argument(
        "--content-type", default=None, help="default application/octet-stream (application/json for --jsonl)"
    )
    s.add_argument(
        "--max-attempts",
        type=int_in(MIN_MAXIMUM_ATTEMPTS, MAX_MAXIMUM_ATTEMPTS, "max attempts"),
        default=3,
        help="leases before the job goes to dead/ (reason exhausted)",
    )
    s.add_argument(
        "--not-before",
        type=int_in(0, U64_MAX, "unix ns"),
        default=None,
        metavar="UNIX_NS",
        help="absolute instant in Unix nanoseconds before which no one may lease it (see --delay)",
    )
    s.add_argument("--producer-id", default=None, metavar="ID", help="who produced it, stored with the job")
    s.add_argument("--delay", type=duration, default=None, metavar="DURATION", help="e.g. 90s, 15m, 2h, 1d")
    s.add_argument("--meta", type=_meta, action="append", default=[], metavar="KEY=VALUE", help="repeatable")
    s.add_argument("--dir", default=None, metavar="DIR", help="bulk: one job per regular file of DIR")
    s.add_argument("--jsonl", default=None, metavar="FILE", help="bulk: one job per JSON line of FILE ('-' = stdin)")
    s.add_argument("--lines", nargs="?", const="-", default=None, metavar="FILE",
                   help="bulk: one job per non-empty line of FILE (omitted or '-': stdin), the line its payload")  # fmt: skip
    s.add_argument("--path", nargs="+", default=None, metavar="FILE", dest="paths",
                   help="one job per FILE whose payload is the file's absolute path (the file is not copied)")  # fmt: skip
    s.add_argument("--allow-empty", action="store_true", help="enqueue an empty payload (refused otherwise)")
    s.add_argument("--print-ids", action="store_true", help="bulk: print '<job_id> <source>' per job on stdout")
    s.add_argument(
        "--unique",
        default=None,
        metavar="KEY",
        help="refused (exit 1, the existing job's id) while a job of KEY is anywhere in the queue",
    )


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


@dataclass
class PutOptions:
    """Everything of ``put`` that applies to each job of a (bulk) put."""

    content_type: str
    max_attempts: int
    not_before: int | None
    delay: float | None
    producer_id: str | None
    metadata: dict[str, str] | None
    unique: str | None = None

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
        if self.unique is not None:
            kw["unique"] = self.unique
        return kw


_SOURCES = ("--dir", "--jsonl", "--lines", "--path")


def cmd_put(a: argparse.Namespace) -> int:
    if a.delay is not None and a.not_before is not None:
        raise CliError("put: give either --delay or --not-before, not both", 1)
    given = [f for f, v in zip(_SOURCES, (a.dir, a.jsonl, a.lines, a.paths), strict=True) if v is not None]
    if len(given) > 1:
        raise CliError(f"put: give one of {', '.join(_SOURCES)}, not {' and '.join(given)}", 1)
    if given and a.file != "-":
        raise CliError(f"put: unexpected FILE {a.file!r} with {given[0]}", 1)
    metadata = dict(a.meta) if a.meta else None
    default_type = {"--jsonl": "application/json", "--lines": "text/plain", "--path": "text/plain"}.get(
        given[0] if given else "", "application/octet-stream"
    )
    opts = PutOptions(a.content_type or default_type, a.max_attempts, a.not_before, a.delay, a.producer_id, metadata)
    opts.unique = a.unique
    if a.unique is not None and given and given[0] != "--path":
        raise CliError(f"put: --unique names one job; it cannot be given with {given[0]}", 1)
    paths = _absolute_paths(a.paths) if a.paths is not None else None
    if a.unique is not None and paths is not None and len(paths) != 1:
        raise CliError("put: --unique names one job; give one --path FILE with it", 1)
    if paths is not None and len(paths) == 1:  # one file: a single put's lines, as `put FILE` prints them
        return single_put(a, opts, io.BytesIO(paths[0]))
    if not given:
        return single_put(a, opts)
    with Interrupts() as stop:
        try:
            if paths is not None:
                source = _paths_source(paths)
            elif a.dir is not None:
                source = _dir_source(a.dir, a.allow_empty)
            else:
                source = _lines_source(a.jsonl, json_lines=True) if a.jsonl else _lines_source(a.lines)
            return bulk_put(a, opts, source, stop)
        except Interrupted as e:  # before the first job was handed to the queue
            raise CliError(f"put: interrupted by {stop.name}: nothing was enqueued", 128 + e.signum) from e


def single_put(a: argparse.Namespace, opts: PutOptions, payload: BinaryIO | None = None) -> int:
    """One job (``payload``, else FILE or stdin); the payload is streamed (never held in memory whole).

    A signal stops the payload's reading (nothing is committed before it
    ends) and is otherwise held until the enqueue's outcome is known, so
    the line it leads to can say whether the job was committed.
    """
    with Interrupts() as stop:
        try:
            job_id, path = _put_one(a, opts, stop, payload)
        except EmptyPayload as e:
            raise CliError(
                f"put: the payload is empty ({e.source}): nothing was enqueued; "
                "give --allow-empty to enqueue an empty job",
                1,
            ) from e
        except Interrupted as e:
            raise CliError(
                f"put: interrupted by {stop.name}: not committed: nothing was enqueued", stop.exit_code
            ) from e
    if a.json:
        out_json({"job_id": job_id, "path": path})
    else:
        out(f"job_id: {job_id}", f"path: {path}")
    if stop.signum is not None:
        err(f"put: interrupted by {stop.name}: job {job_id} was committed")
        return stop.exit_code
    return 0


def _put_one(a: argparse.Namespace, opts: PutOptions, stop: Interrupts, given: BinaryIO | None) -> tuple[str, str]:
    empty_means = "stdin gave no bytes" if a.file == "-" else f"{a.file} has no bytes"
    stream: BinaryIO
    if given is not None:
        stream, owned = given, False
    elif a.file == "-":
        stream = stdin_bytes()
        owned = False
        if sys.stdin.isatty():
            err("put: reading the payload from stdin; end with Ctrl-D")
            stream = cast(BinaryIO, _TerminalInput(stream))
    else:
        try:
            stream = open(a.file, "rb")  # noqa: SIM115 - closed below
        except OSError as e:  # read failure -> OS mapping, before the queue is opened
            raise CliError(f"cannot read {a.file}: {e.strerror}", os_exit_code(e)) from e
        owned = True
    try:
        q = open_queue(a.path)
        stop.hold()
        try:
            say_if_paused(q)
            payload = cast(BinaryIO, _StoppableReads(_progress_reader(stream), stop, a.allow_empty, empty_means))
            return q.enqueue_detailed(payload, **opts.kwargs())
        except DuplicateJob as e:  # the existing job's id on stdout, where a script reads a put's id
            if a.json:
                out_json({"job_id": e.job_id, "duplicate": True})
            else:
                out(f"job_id: {e.job_id}")
            raise CliError(f"put: not enqueued: {e.message}", e.exit_code) from e
        except OutcomeUnknown as e:
            t = e.ticket
            lines = [f"outcome unknown: {e.message}"]
            if isinstance(t, OutcomeTicket):
                lines += t.outcome_lines()
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


def say_if_paused(q: Backend) -> None:
    """Once per put: the jobs are stored, but no worker claims them until ``steadq resume``."""
    try:
        paused = q.pause_state()
    except (SteadQError, OSError):  # the enqueue says what is wrong with the store, if anything
        return
    if paused is not None:
        err(f"put: note: the queue is {paused.summary()}; jobs wait until 'steadq resume'")


class EmptyPayload(Exception):
    """The payload ended before its first byte and ``--allow-empty`` was not given."""

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self.source = source


class _StoppableReads:
    """A payload stream read with signals live (``Interrupts.interruptible``), up to its end.

    Unless ``allow_empty``, an end before the first byte raises :class:`EmptyPayload`
    from inside the enqueue, which then publishes nothing (as for a signal)."""

    def __init__(self, stream: BinaryIO, stop: Interrupts, allow_empty: bool = True, source: str = "") -> None:
        self.stream, self.stop, self.ended = stream, stop, False
        self.allow_empty, self.source, self.seen = allow_empty, source, 0

    def read(self, n: int = -1) -> bytes:
        if self.ended:
            return b""
        with self.stop.interruptible():
            chunk = self.stream.read(n)
        self.ended = not chunk
        self.seen += len(chunk)
        if self.ended and not self.seen and not self.allow_empty:
            raise EmptyPayload(self.source)
        return chunk


# A single payload at least this large shows its progress on a terminal.
LARGE_PAYLOAD = 64 << 20


class _ReadProgress:
    """A payload stream that redraws ``put: 120 MiB of 900 MiB (13%)`` on stderr as it is read."""

    def __init__(self, stream: BinaryIO, total: int) -> None:
        self.stream, self.total, self.done, self._last = stream, total, 0, 0.0

    def read(self, n: int = -1) -> bytes:
        chunk = self.stream.read(n)
        self.done += len(chunk)
        now = time.monotonic()
        if not chunk or now - self._last >= 0.1:
            self._last = now
            end = "\n" if not chunk else ""
            pct = 100 * self.done // max(self.total, 1)
            sys.stderr.write(f"\rput: {self.done >> 20} MiB of {self.total >> 20} MiB ({pct}%){end}")
            sys.stderr.flush()
        return chunk


class _TerminalInput:
    """stdin on a terminal, where Ctrl-D ends one read, not the input: a short read is the end.

    Without this the payload loop reads again after the user's Ctrl-D and
    waits for a second one."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream, self.eof = stream, False

    def read(self, n: int = -1) -> bytes:
        if self.eof:
            return b""
        data = self.stream.read(n)
        self.eof = n < 0 or len(data) < n
        return data

    def fileno(self) -> int:
        return self.stream.fileno()

    def tell(self) -> int:
        return self.stream.tell()


def _progress_reader(stream: BinaryIO) -> BinaryIO:
    """``stream`` itself, or wrapped to show progress when it is a large file and stderr a terminal."""
    if not sys.stderr.isatty():
        return stream
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        return stream
    if not stat.S_ISREG(st.st_mode) or st.st_size - stream.tell() < LARGE_PAYLOAD:
        return stream
    return cast(BinaryIO, _ReadProgress(stream, st.st_size - stream.tell()))


@dataclass
class BulkSource:
    """A bulk payload source: ``total`` if known up front, and an iterator of
    ``(label, opener)`` where ``opener()`` returns a binary stream for one job."""

    describe: str
    total: int | None
    items: Callable[[], Iterator[tuple[str, Callable[[], BinaryIO]]]]
    cleanup: Callable[[], None] = lambda: None


def _dir_source(directory: str, allow_empty: bool) -> BulkSource:
    """Every regular file of ``directory`` (not recursive, symlinks not followed), by name.

    Only the names are held in memory; each file is opened when its turn comes.
    Unless ``allow_empty``, an empty file is refused before anything is enqueued.
    """
    try:
        with os.scandir(directory) as it:
            entries = [(e.name, e) for e in it if e.is_file(follow_symlinks=False)]
            empty = sorted(n for n, e in entries if not allow_empty and e.stat(follow_symlinks=False).st_size == 0)
            names = sorted(n for n, _e in entries)
            del entries
    except OSError as e:
        raise CliError(f"cannot read directory {directory}: {e.strerror}", os_exit_code(e)) from e
    if empty:
        more = f" and {len(empty) - 1} more" if len(empty) > 1 else ""
        raise CliError(
            f"put --dir: {os.path.join(directory, empty[0])}{more} is empty: nothing was enqueued; "
            "give --allow-empty to enqueue empty jobs",
            1,
        )

    def items() -> Iterator[tuple[str, Callable[[], BinaryIO]]]:
        for name in names:
            full = os.path.join(directory, name)
            yield name, (lambda full=full: open(full, "rb"))  # type: ignore[misc]

    return BulkSource(f"files of {directory}", len(names), items)


def _absolute_paths(files: list[str]) -> list[bytes]:
    """``--path``: each FILE's absolute path (symlinks kept: the worker opens what was named),
    all checked before anything is enqueued; a missing one is refused with the OS mapping."""
    paths = []
    for f in files:
        try:
            os.stat(f)
        except OSError as e:
            raise CliError(f"put --path: {f}: {e.strerror}: nothing was enqueued", os_exit_code(e)) from e
        paths.append(os.fsencode(os.path.abspath(f)))
    return paths


def _paths_source(paths: list[bytes]) -> BulkSource:
    """One job per path (already checked by :func:`_absolute_paths`); the label is the path."""

    def items() -> Iterator[tuple[str, Callable[[], BinaryIO]]]:
        for p in paths:
            yield os.fsdecode(p), (lambda p=p: io.BytesIO(p))  # type: ignore[misc]

    return BulkSource(f"{len(paths)} paths", len(paths), items)


def _lines_source(path: str, *, json_lines: bool = False) -> BulkSource:
    """One job per non-blank line (its payload: the line without its newline); with ``json_lines``
    each must be a JSON document (``--jsonl``; then surrounding blanks are dropped too), validated
    *before* anything is enqueued.

    Why validate first: a malformed line 5000 must not leave 4999 jobs
    enqueued ("nothing half-written"). stdin is spooled to an anonymous temp
    file while it is read (and counted), so memory stays flat for any input size.
    """
    if path == "-":
        src: IO[bytes] = stdin_bytes()
        spool: IO[bytes] = tempfile.TemporaryFile()
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
            if json_lines:
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
            if line.strip():
                body = line.strip() if json_lines else line.removesuffix(b"\n").removesuffix(b"\r")
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


def bulk_put(a: argparse.Namespace, opts: PutOptions, source: BulkSource, stop: Interrupts) -> int:
    """Enqueue every item of ``source``; progress on a TTY, one summary line always.

    Jobs go through ``Queue.enqueue_many`` one group (ENQUEUE_MANY_GROUP jobs)
    per call: the group's files are written, fsynced together, linked, then
    each directory is fsynced once, and a group's jobs count as enqueued only
    after that. Sources are opened one at a time and each is closed once it
    is written. On a failure the summary says how many jobs are durable (a
    prefix of the input), so a script can tell what to resubmit.

    SIGINT and SIGTERM are held while jobs are published (``stop``): the
    group being gathered is cut short at the next payload, published and
    counted, and the command then stops, so the summary and ``--print-ids``
    are exact whenever the signal came.
    """
    stop.hold()
    try:
        q = open_queue(a.path)
    except CliError:
        source.cleanup()
        raise
    say_if_paused(q)
    progress = Progress(source.total, sys.stderr.isatty())
    start = time.monotonic()
    durable = 0
    nbytes = 0
    kwargs = opts.kwargs()
    failure: CliError | None = None
    items = source.items()
    exhausted = False
    reader_gone = False

    def group(labels: list[str], sizes: list[int]) -> Generator[BinaryIO, None, None]:
        """The next group's payload streams; each is closed when the next is asked for."""
        nonlocal exhausted, failure
        for _ in range(ENQUEUE_MANY_GROUP):
            if stop.signum is not None:
                return
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
        while not exhausted and failure is None and stop.signum is None:
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
            unprinted = _print_ids(ids, labels) if a.print_ids else 0
            if unprinted:
                gone = CliError(
                    "put: stdout was closed while printing the ids: stopped after the jobs counted below "
                    f"(the ids of the last {unprinted} of them were not printed)",
                    6,
                )
                failure = gone if failure is None else CliError([*failure.lines, *gone.lines], failure.code)
                reader_gone = True
            progress.update(durable)
        if failure is None and stop.signum is not None and not exhausted:
            failure = CliError(f"interrupted by {stop.name}: stopped after the jobs counted below", stop.exit_code)
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
    if a.json and not reader_gone:
        out_json({"enqueued": durable, "bytes": nbytes, "seconds": round(elapsed, 3), "failed": failure is not None})
    summary = f"enqueued {durable} jobs ({nbytes} bytes) from {source.describe} in {elapsed:.1f}s ({rate:.0f}/s)"
    if failure is not None:
        raise CliError([*failure.lines, summary], failure.code)
    err(summary)
    return 0


def _print_ids(ids: list[str], labels: list[str]) -> int:
    """Print ``<job_id> <source>`` per job; returns how many could not be printed because the reader went away."""
    for done, (job_id, label) in enumerate(zip(ids, labels, strict=False)):
        if not printed(f"{job_id} {label}"):
            return len(ids) - done
    return 0


COMMANDS = {"put": add_put}
