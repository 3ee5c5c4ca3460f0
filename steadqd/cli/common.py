"""What every ``steadq`` command group shares: failures and exit codes, output, files it
writes for the user, argument types, the parser class, and opening a queue.

Conventions that hold for every subcommand:

* A failure is raised as :class:`CliError` (message lines for stderr plus an
  exit code) and printed once by ``main``; nothing else calls ``sys.exit``.
  Exit codes follow cli.md: library errors map through their
  :class:`~steadqd.errors.ErrorKind`, raw OS errors through
  :func:`os_exit_code`, OutcomeUnknown is always 2.
* Usage errors (unknown flag, malformed number or duration, bad metadata
  key) exit **1** ("invalid input") with one line naming the bad value; the
  reference's argument parser would exit 2, which scripts must read as
  "outcome unknown", so we deliberately do not copy that.
* Files the CLI writes for the user (handle files, tickets) are written
  atomically: temp name, fsync, rename, fsync of the parent directory, so a
  crash never leaves a half-written handle that a later ``ack`` would trust.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import errno
import json
import os
import pwd
import re
import signal
import stat
import sys
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any, BinaryIO, NoReturn, TypeAlias, TypeVar

from steadqd.backend import Backend
from steadqd.backend import open_queue as open_backend
from steadqd.constants import DeadReason, State
from steadqd.durable_file import fsync_directory, replace_durably
from steadqd.durations import format_duration, parse_duration
from steadqd.errors import ConfigError, OutcomeUnknown, SteadQError, UnsupportedFormat
from steadqd.queue_names import QueueEntry, config_path, did_you_mean, is_queue_name, read_queue_entry
from steadqd.text import printable, redacted

PROG = "steadq"
HEX32 = re.compile(r"[0-9a-f]{32}")
JOB_PREFIX_MIN = 6
JOB_REF = re.compile(rf"[0-9a-f]{{{JOB_PREFIX_MIN},32}}")  # a whole job id, or a prefix of one
ALL_STATES = tuple(s.value for s in State)  # the words Backend.list_jobs takes, in the order cli.md lists them


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
    if isinstance(e, OutcomeUnknown):
        return 2
    if isinstance(e, SteadQError):
        return e.exit_code
    if isinstance(e, OSError):
        return os_exit_code(e)
    return 6


def error_text(e: BaseException) -> str:
    """One-line description of an error (library message or strerror with the file)."""
    if isinstance(e, SteadQError):
        return e.message
    if isinstance(e, OSError):
        where = f"{e.filename}: " if e.filename is not None else ""
        return f"{where}{e.strerror or e}"
    return str(e)


def failure(what: str, e: BaseException, after: str = "") -> CliError:
    """A library error as a command's failure: ``<what>: <error text><after>``, with the error's exit code."""
    return CliError(f"{what}: {error_text(e)}{after}", error_code(e))


def err(*lines: str) -> None:
    if sys.stderr is None:  # closed (2>&-): print(file=None) would write the lines into stdout
        return
    for line in lines:
        print(printable(redacted(line)), file=sys.stderr)
    sys.stderr.flush()


def out(*lines: str) -> None:
    for line in lines:
        print(printable(line))
    sys.stdout.flush()


def discard_stdout() -> None:
    """Point stdout at /dev/null once its reader is gone (``| head``), so the flush at exit cannot fail again."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def printed(line: str) -> bool:
    """Print one line that reports a change made; False when the reader is gone (``| head -1``).

    Why not let BrokenPipeError end the command as it ends a listing: the
    change was made, and a silent exit 0 would hide that the rest was not,
    so a command that changes one thing per line stops and says how far it got."""
    try:
        out(line)
    except BrokenPipeError:
        discard_stdout()
        return False
    return True


def out_json(doc: Any) -> None:
    """2-space pretty JSON on stdout, keys in the order given (documented shapes)."""
    print(json.dumps(doc, indent=2, default=str))
    sys.stdout.flush()


def stdin_bytes() -> BinaryIO:
    """Standard input as bytes, or a refusal when it was closed (``<&-``), where Python has no stdin at all."""
    if sys.stdin is None:
        raise CliError(
            "cannot read the payload from stdin: stdin is closed (give a FILE, or redirect stdin from one)",
            os_exit_code(OSError(errno.EBADF, "closed")),
        )
    return sys.stdin.buffer


def escape(raw: bytes) -> str:
    """Non-UTF-8 bytes as ``\\xNN`` (cli.md admin dead-list)."""
    return raw.decode("utf-8", "backslashreplace")


def state_name(state: Any) -> str:
    """A state enum or word as its word."""
    return str(getattr(state, "value", state))


def job_object_json(o: Any) -> dict[str, Any]:
    """The documented JSON shape of one object of a job (``inspect``, ``admin dead-inspect``)."""
    doc = {
        "state": state_name(o.state),
        "generation": o.generation,
        "attempt": o.attempt,
        "max_attempts": o.max_attempts,
        "path": o.path,
    }
    details = getattr(o, "details", None)
    if details is not None:
        doc["details"] = details
    return doc


# =========================================================================== reasons


def reason_name(code: int, registry: type[enum.IntEnum] = DeadReason) -> str:
    """A dead or quarantine reason as an operator reads it: its registry name, or the range it is from."""
    try:
        return registry(code).name.lower()
    except ValueError:
        pass
    if registry is DeadReason and 0x0100 <= code <= 0x7FFF:
        return f"application_0x{code:04x}"
    if registry is DeadReason and code >= 0x8000:
        return f"private_0x{code:04x}"
    return f"unknown_0x{code:04x}"


def reason_code(text: str, registry: type[enum.IntEnum] = DeadReason) -> int:
    """A ``--reason`` argument: a registry name (any case) or a number (``4``, ``0x0004``)."""
    with contextlib.suppress(KeyError):
        return int(registry[text.upper().replace("-", "_")])
    try:
        value = int(text, 0)
    except ValueError:
        names = ", ".join(r.name.lower() for r in registry)
        raise CliError(f"invalid reason {text!r}: expected a number (4, 0x0004) or one of {names}", 1) from None
    if not 0 <= value <= 0xFFFF:
        raise CliError(f"invalid reason {text!r}: must be in 0..0xffff", 1)
    return value


# =========================================================================== signals


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived while nothing had been changed yet: the command may stop anywhere."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupts:
    """SIGINT and SIGTERM for a command that changes a queue one durable step at a time.

    Why not KeyboardInterrupt: raised between a rename and the count that
    reports it, it makes the command under-report what it did (a bulk put
    once said 14,336 jobs when 14,592 were enqueued). Before :meth:`hold`
    a signal raises :class:`Interrupted` (nothing is under way, and a
    blocked read of stdin must still stop); inside, it is only noted, system
    calls are restarted rather than failed, and the command checks
    :attr:`signum` before each step and stops there, so every step is
    either done and counted or not begun. A second signal changes nothing:
    the step under way is bounded, and SIGKILL remains.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._holding = False
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._saved[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
            signal.siginterrupt(sig, True)

    def _note(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum = signum
        if not self._holding:
            raise Interrupted(signum)

    def hold(self) -> None:
        """From now on until the end of the block, note signals instead of raising them.

        One way on purpose: a command that has begun changing the queue
        must reach its report, however late the signal comes."""
        self._holding = True
        for sig in self._saved:
            signal.siginterrupt(sig, False)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Inside a held block, a step during which a signal raises :class:`Interrupted` again.

        For a step that commits nothing and may wait without end, such as
        reading a payload from a pipe or a terminal: the signal stops the wait
        instead of being noted until the input ends.
        """
        self._holding = False
        for sig in self._saved:
            signal.siginterrupt(sig, True)
        try:
            if self.signum is not None:  # noted before this step began
                raise Interrupted(self.signum)
            yield
        finally:
            self._holding = True
            for sig in self._saved:
                signal.siginterrupt(sig, False)

    @property
    def name(self) -> str:
        return "" if self.signum is None else signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal, as a shell reports a command the signal ended."""
        return 128 + (self.signum or signal.SIGINT)


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
    replace_durably(tmp, path, text.encode("utf-8"))
    with contextlib.suppress(OSError):
        fsync_directory(os.path.dirname(os.path.abspath(path)))


def read_user_file(path: str, limit: int = 1 << 20) -> bytes:
    """Up to ``limit`` bytes of a file the user named (a handle file, a ticket), never waiting.

    A plain open() of a FIFO blocks until a writer appears, so ``steadq ack
    FIFO`` would hang. A symlink to a regular file is fine (it is the user's
    own path). A FIFO, socket or directory raises OSError(EINVAL, "not a
    regular file"), which callers report like any unreadable file (exit 1).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno != errno.ENOENT and not _regular(path):
            raise OSError(errno.EINVAL, "not a regular file", path) from e  # ENXIO: a socket
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True  # nothing to say beyond the open's own error


# =========================================================================== argument types


_Number = TypeVar("_Number", int, float)


def _in_range(
    convert: Callable[[str], _Number], lo: _Number, hi: _Number, what: str, span: str
) -> Callable[[str], _Number]:
    """An argparse type: ``convert(text)`` when it lies in ``lo..hi``; else "invalid <what> <text>: must be <span>".

    The one range check behind :func:`int_in` and :func:`duration_in`; ``convert`` raises its own
    ArgumentTypeError for text that is no number at all."""

    def parse(text: str) -> _Number:
        value = convert(text)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: must be {span}")
        return value

    parse.__name__ = what
    return parse


def int_in(lo: int, hi: int, what: str) -> Callable[[str], int]:
    """An argparse type: a decimal integer in ``lo..hi``; ``what`` names it in the error."""

    def integer(text: str) -> int:
        try:
            return int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: expected an integer") from None

    return _in_range(integer, lo, hi, what, f"in {lo}..{hi}")


def seconds_number(text: str) -> float:
    """An argparse type: a finite, non-negative number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if value != value or value < 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}")
    return value


def duration(text: str) -> float:
    """An argparse type: human durations (90s, 2h, 1d, 1h30m, 250ms; a bare number is seconds)."""
    try:
        return parse_duration(text)
    except ValueError as e:
        if _is_negative_duration(text):
            raise argparse.ArgumentTypeError(f"invalid duration {text!r}: negative; give 0s or more") from None
        raise argparse.ArgumentTypeError(str(e)) from None


# The argparse types whose values are seconds, which --help shows as durations (90s, 5m); weak, since
# a parser built per call (tests run main() many times) makes its own duration_in types each time.
_DURATION_TYPES: weakref.WeakSet[Callable[[str], float]] = weakref.WeakSet([duration])


def _is_negative_duration(text: str) -> bool:
    """Whether ``text`` is a duration with a minus sign, which the grammar only calls malformed."""
    body = text.strip()
    if not body.startswith("-"):
        return False
    try:
        parse_duration(body[1:])
    except ValueError:
        return False
    return True


def duration_in(lo: float, hi: float, what: str) -> Callable[[str], float]:
    """An argparse type: a human duration (or a number of seconds) in ``lo..hi`` seconds.

    One type for a flag and its reference alias (``--duration 5m`` and
    ``--duration-seconds 300``), so both are checked the same way."""

    parse = _in_range(duration, lo, hi, what, f"{lo:g} s .. {hi:g} s")
    _DURATION_TYPES.add(parse)
    return parse


def job_id(text: str) -> str:
    """A job id argument, checked where the command runs (its error is the command's, exit 1): a whole id,
    or a prefix that :func:`find_job` resolves once the queue is open."""
    if not JOB_REF.fullmatch(text):
        raise CliError(
            f"invalid job_id: expected 32 lowercase hex chars, or a unique prefix of at least {JOB_PREFIX_MIN} "
            "(as the journal shows it: job fed535fe)",
            1,
        )
    return text


def match_job(text: str, ids: Iterable[str], where: str) -> str:
    """The one id of ``ids`` that begins with ``text`` (a whole id is itself).

    Why prefixes: the journal's sentences show 8 hex digits (``job fed535fe finished``),
    and an operator copies what they see. None found is "not found"; more than one lists
    them all, so the next try can be exact (exit 1 either way: nothing was done)."""
    found = sorted({i for i in ids if i.startswith(text)})
    if len(found) == 1:
        return found[0]
    if not found:
        raise CliError(f"not found: no job {text} in {where}", 1)
    raise CliError([f"job id {text} is ambiguous: {len(found)} jobs in {where} begin with it:", *found], 1)


def find_job(q: Backend, text: str, states: Collection[str]) -> str:
    """The job a JOB_ID argument names among the jobs of ``states`` (state words) of queue ``q``.

    A whole id is taken as it is (the command says if it is nowhere); a prefix is
    looked up in the backend's listing of those states."""
    if HEX32.fullmatch(text):
        return text
    where = f"{q.path} ({', '.join(s for s in ALL_STATES if s in states)})"
    return match_job(text, (j.job_id for j in q.list_jobs(states)), where)


# =========================================================================== parser


# What a positional argument is, by its metavar: one wording for every command that takes it.
POSITIONAL_HELP = {
    "PATH": "the queue directory",
    "QUEUE": "the queue: a configured queue's name (<config dir>/NAME.yaml), or its directory or s3:// URL",
    "JOB_ID": "a job id: 32 lowercase hex characters, or a unique prefix of at least 6 (job fed535fe)",
    "ID": "a quarantine id, as admin quarantine-list prints it",
    "OUTPUT": "the file to write the copy to",
}


class Parser(argparse.ArgumentParser):
    """argparse with clap-like failure (one line, exit 1: invalid input) and clap-like order.

    Why intermixed: cli.md lets options come before or after positionals, so
    ``steadq put Q --delay 5m FILE`` is a reference command line; argparse alone
    would take ``Q`` and an empty FILE in one go and refuse ``FILE`` as
    unrecognized. A command's own parser (one with no subcommands) therefore
    parses intermixed, and refuses what it does not know under its own name.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._intermixing = False
        # argparse takes a value that starts with '-' for an option unless it is a plain negative number,
        # so "--after -5s" failed as "expected one argument": any '-' and digit is a value, to be refused
        # by the option's own type, naming what is wrong with it (no option of ours looks like '-1').
        self._negative_number_matcher = re.compile(r"^-\.?[0-9]")

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{self.prog}: {message} (see '{self.prog} --help')", 1)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        has_subcommands = any(a.nargs in (argparse.PARSER, argparse.REMAINDER) for a in self._get_positional_actions())
        if has_subcommands or self._intermixing:  # the intermixed parse calls back here twice
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            parsed, extras = super().parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if action.help is None and not action.option_strings and isinstance(action.metavar, str):
            action.help = POSITIONAL_HELP.get(action.metavar)
        return action


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Examples kept as written, and every option's default shown after its help.

    Why not argparse's ArgumentDefaultsHelpFormatter: it prints
    ``(default: None)`` and ``(default: False)`` for flags that have no
    default worth reading, which teaches nothing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or not action.option_strings or default in (None, False, argparse.SUPPRESS):
            return text
        if action.type in _DURATION_TYPES:
            return f"{text} (default: {format_duration(default)})"
        return f"{text} (default: %(default)s)"


Subcommands: TypeAlias = "argparse._SubParsersAction[Parser]"


def add_command(sub: Subcommands, name: str, help_text: str, example: str = "") -> Parser:
    """A subcommand's parser, with its help as description and ``example`` as epilog."""
    epilog = f"example:\n  {example}" if example else None
    return sub.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=epilog,
        allow_abbrev=False,
        formatter_class=HelpFormatter,
    )


# =========================================================================== queues

CONFIG_DIR_HELP = "directory of the daemons' <queue>.yaml files (default $STEADQ_CONFIG_DIR or /etc/steadq/queues)"

# The queues this run named by their config files, by the target each resolved to: open_queue
# opens them with the options their daemons use (credentials, allow_unsupported_fs).
_configured: dict[str, QueueEntry] = {}


def add_queue_argument(s: argparse.ArgumentParser, *, existing: bool = True, help: str | None = None) -> None:
    """The QUEUE positional (``a.path``), which ``main`` resolves by :func:`resolve_queue` before the command runs.

    ``existing=False``: a command that may be given a queue that does not exist yet (init, doctor)."""
    s.add_argument("path", metavar="QUEUE", help=help)
    s.set_defaults(queue_must_exist=existing)


def add_queue_command(
    sub: Subcommands,
    name: str,
    help_text: str,
    example: str,
    *,
    run: Callable[[argparse.Namespace], int],
    existing: bool = True,
    queue_help: str | None = None,
) -> Parser:
    """A subcommand that acts on one queue: its parser (:func:`add_command`) with the QUEUE positional
    first (:func:`add_queue_argument`) and ``run`` as what ``main`` calls; the caller adds the rest."""
    s = add_command(sub, name, help_text, example)
    add_queue_argument(s, existing=existing, help=queue_help)
    s.set_defaults(run=run)
    return s


def resolve_queue(text: str, directory: str | None, *, must_exist: bool = True) -> str:
    """The directory or URL that the QUEUE argument ``text`` means: a path as given, else a configured queue's.

    A path is anything with a '/' (or a URL), or an existing file or directory; any other
    word is a queue's name, read from ``<config dir>/<name>.yaml`` as its daemons read it.
    A word that is neither is refused naming both places looked at (exit 6, as a missing
    queue root is), unless the command creates the queue (``must_exist=False``).
    """
    if "/" in text or os.path.lexists(text) or not is_queue_name(text):
        return text
    try:
        entry = read_queue_entry(text, directory)
    except FileNotFoundError:
        if not must_exist:
            return text
        raise CliError(
            f"no queue {text}: no directory {os.path.abspath(text)}, and no configuration "
            f"{config_path(text, directory)}{did_you_mean(text, directory)}",
            6,
        ) from None
    except ConfigError as e:
        raise CliError(f"queue {text}: {e.message}", 1) from e
    except OSError as e:
        raise CliError(
            f"queue {text}: cannot read {e.filename or config_path(text, directory)}: {e.strerror}", os_exit_code(e)
        ) from e
    _configured[entry.queue] = entry
    return entry.queue


def open_queue(path: str, *, code: int | None = None, **options: Any) -> Backend:
    """Open with default options (a configured queue's, when it was named); failure -> one line and the
    error's code (or ``code``)."""
    entry = _configured.get(path)
    try:
        return open_backend(path, **({**entry.options, **options} if entry else options))
    except Exception as e:  # noqa: BLE001 - every failure must become one line and an exit code
        if code is None:
            # cli.md: the reference opens a missing root as a raw NotFound I/O error (6); ours names it.
            code = 6 if isinstance(e.__cause__, FileNotFoundError) else error_code(e)
        named = f" (queue {entry.name}, from {entry.config})" if entry else ""
        raise CliError(f"cannot open queue {path}{named}: {error_text(e)}{_open_hint(path, e)}", code) from e


def _open_hint(path: str, e: BaseException) -> str:
    """What the operator can do about a refusal that is theirs to fix, or "" when the message says it."""
    if isinstance(e, UnsupportedFormat):
        return " (another steadq version made this queue: open it with that version, or upgrade this one)"
    if isinstance(e, PermissionError) and not path.partition("://")[1]:
        try:
            info = os.stat(path)
        except OSError:
            return " (check the permissions of the directories above it)"
        try:
            owner = pwd.getpwuid(info.st_uid).pw_name
        except KeyError:
            owner = f"uid {info.st_uid}"
        return (
            f" (the queue belongs to {owner}, mode {stat.S_IMODE(info.st_mode):04o}: run the command as {owner}, "
            "or as a member of its group if the queue was made with init --shared)"
        )
    return ""
