"""Structured logging: journald fields when connected to the journal, else prefixed lines.

Every entry carries SYSLOG_IDENTIFIER, STEADQ_QUEUE and STEADQ_ROLE, plus the
fields a call passes (``job_id=...`` becomes ``STEADQ_JOB_ID=...``), so
``journalctl STEADQ_QUEUE=render STEADQ_JOB_ID=<id>`` finds one job's story.
Without journald (``steadqd run`` in a container or a shell) the same entry
is one stderr line with a ``<N>`` priority prefix and ``KEY=value`` pairs.
A problem that recurs on every pass is reported through an :class:`ErrorDigest`,
so that it cannot flood the journal.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TextIO

from steadqd.constants import DeadReason
from steadqd.text import _UNPRINTABLE, printable, redacted

EMERG, ALERT, CRIT, ERR, WARNING, NOTICE, INFO, DEBUG = range(8)
IDENTIFIER = "steadqd"
ERROR_LOG_WINDOW = 600.0  # seconds between two warnings with the same error code


def journal_connected(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """systemd sets JOURNAL_STREAM to stderr's dev:ino when it is the journal."""
    value = env.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(2)
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


# A word that reads as a field of the text line (KEY=value).
_LOOKS_LIKE_FIELD = re.compile(r"(?:^|\s)[A-Z][A-Z0-9_]*=")


def _message_text(message: str) -> str:
    """The MESSAGE as the text line shows it: one line, no control characters, and
    quoted when it contains a KEY= word, so that a job printing ``STEADQ_JOB_ID=x``
    cannot pass for a field of the entry."""
    if _PLAIN_MESSAGE(message) is None:  # the usual message: nothing to quote or escape, one regex
        return message
    if _LOOKS_LIKE_FIELD.search(message):
        return repr(message)
    return printable(message)


# Either thing _message_text acts on: a KEY= word, or a character printable() escapes.
_PLAIN_MESSAGE = re.compile(f"{_LOOKS_LIKE_FIELD.pattern}|{_UNPRINTABLE.pattern}").search


def reason_name(code: int) -> str:
    """A dead-letter reason as a person reads it: the registry's name, else the application's code."""
    try:
        return DeadReason(code).name.lower()
    except ValueError:
        return f"reason 0x{code:04x}"


# Field names as the journal spells them, by keyword: every line asks again for the same few names.
_FIELD_NAMES: dict[str, str] = {}
_FIELD_NAMES_MAX = 512  # the keywords come from our code, not from input: a bound all the same


def _field_name(key: str) -> str:
    name = _FIELD_NAMES.get(key)
    if name is None:
        name = "STEADQ_" + key.upper()
        if len(_FIELD_NAMES) < _FIELD_NAMES_MAX:
            _FIELD_NAMES[key] = name
    return name


def _field_value(value: object) -> str:
    """One spelling for every field: booleans are ``true``/``false`` wherever they come from."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def short_id(job_id: str) -> str:
    """A job id as a sentence shows it (8 hex digits, like a short git hash); fields keep all 32."""
    short = job_id[:8]
    return short if short.isalnum() else printable(short)  # letters and digits (a job id's hex): nothing to escape


class Log:
    """One role's logger; thread-safe."""

    def __init__(
        self,
        role: str,
        queue: str,
        *,
        journal: bool | None = None,
        stream: TextIO | None = None,
        timestamps: bool | None = None,
    ) -> None:
        self.role = role
        self.queue = queue
        self._stream = stream or sys.stderr
        # A person watching a terminal needs the time of each line; journald and
        # a service manager's log add their own.
        self._timestamps = _isatty(self._stream) if timestamps is None else timestamps
        self._lock = threading.Lock()
        # A line-buffered stream (sys.stderr, even redirected) writes a line at its newline: no flush() then.
        self._flush = not getattr(self._stream, "line_buffering", False)
        self._send = None
        if journal if journal is not None else journal_connected():
            try:
                from systemd import journal as _journal

                self._send = _journal.send
            except ImportError:
                self._send = None

    @property
    def to_journal(self) -> bool:
        return self._send is not None

    def log(self, priority: int, message: str, **fields: object) -> None:
        # An endpoint reaches a log inside error texts: its credentials never do (steadqd.text.redacted).
        # redacted()'s own shortcut inline: a text with neither "://" nor "=" has nothing to hide (most do not).
        if "://" in message or "=" in message:
            message = redacted(message)
        names = _FIELD_NAMES
        pairs = {
            # a number hides nothing; a str without "://" or "=" neither (only a bool or an object needs _field_value)
            (names[k] if k in names else _field_name(k)): str(v)
            if type(v) is int
            else (redacted(v) if "://" in v or "=" in v else v)
            if type(v) is str
            else redacted(_field_value(v))
            for k, v in fields.items()
            if v is not None
        }
        pairs["STEADQ_QUEUE"] = self.queue
        pairs["STEADQ_ROLE"] = self.role
        if self._send is not None:
            try:
                self._send(message, PRIORITY=str(priority), SYSLOG_IDENTIFIER=IDENTIFIER, **pairs)
                return
            except OSError:
                pass  # journald restarting: fall back to stderr rather than lose the entry
        del pairs["STEADQ_QUEUE"], pairs["STEADQ_ROLE"]  # named by the line's prefix
        bare = _PLAIN_VALUES.get(len(pairs)) or _plain_values(len(pairs))
        if bare.fullmatch("\0".join(pairs.values())):  # every value bare (the usual line): one regex, not one a field
            extra = " ".join([f"{k}={v}" for k, v in sorted(pairs.items())])
        else:
            plain = _PLAIN_ASCII.fullmatch  # _quote's ASCII rule, inline (it matches ASCII only)
            extra = " ".join([f"{k}={v if plain(v) else _quote(v)}" for k, v in sorted(pairs.items())])
        line = f"<{priority}>{self.role}[{self.queue}]: {_message_text(message)}" + (f" {extra}" if extra else "")
        if self._timestamps:
            now = time.time()
            line = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d} " + line
        with self._lock:
            try:
                self._stream.write(line + "\n")
                if self._flush:
                    self._stream.flush()
            except (OSError, ValueError):
                pass

    def debug(self, message: str, **fields: object) -> None:
        self.log(DEBUG, message, **fields)

    def info(self, message: str, **fields: object) -> None:
        self.log(INFO, message, **fields)

    def notice(self, message: str, **fields: object) -> None:
        self.log(NOTICE, message, **fields)

    def warning(self, message: str, **fields: object) -> None:
        self.log(WARNING, message, **fields)

    def error(self, message: str, **fields: object) -> None:
        self.log(ERR, message, **fields)


class ErrorDigest:
    """Rate-limited warnings per error code.

    The first occurrence of a code is logged at once; later ones within the
    window are only counted and reported (with the count) by the first
    occurrence after the window has passed. Why: recovery records the same
    benign error (another process holds the recovery lock) on every pass for
    as long as the condition lasts.
    """

    def __init__(
        self, log: Log, what: str, window: float = ERROR_LOG_WINDOW, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.log = log
        self.what = what
        self.window = window
        self.clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def record(self, errors: Iterable[tuple[str, str]]) -> None:
        grouped: dict[str, list[str]] = {}
        for code, message in errors:
            grouped.setdefault(code, []).append(message)
        now = self.clock()
        for code, messages in grouped.items():
            last = self._last.get(code)
            if last is not None and now - last < self.window:
                self._suppressed[code] = self._suppressed.get(code, 0) + len(messages)
                continue
            count = len(messages) + self._suppressed.pop(code, 0)
            more = f" ({count} occurrences since the last report)" if count > 1 else ""
            self.log.warning(f"{self.what}: {code}: {messages[0]}{more}", error=code, count=count)
            self._last[code] = now


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


_PLAIN_ASCII = re.compile(r"[A-Za-z0-9\-_./:@]+")
# By number of values: exactly that many NUL-joined values, each bare by _PLAIN_ASCII (a NUL is never bare,
# so a value holding one cannot pass for two). Built once per count; a line has a handful of fields.
_PLAIN_VALUES: dict[int, re.Pattern[str]] = {}


def _plain_values(n: int) -> re.Pattern[str]:
    pattern = _PLAIN_VALUES.get(n)
    if pattern is None:
        one = _PLAIN_ASCII.pattern
        pattern = re.compile(one + f"(?:\0{one}){{{n - 1}}}" if n else "(?!)")
        if len(_PLAIN_VALUES) < 64:
            _PLAIN_VALUES[n] = pattern
    return pattern


def _quote(v: str) -> str:
    """A field's value as the text line shows it: bare when it is letters, digits and ``-_./:@``, else quoted."""
    if v.isascii():  # every field the worker logs per job: one regex instead of a test per character
        return v if _PLAIN_ASCII.fullmatch(v) else repr(v)
    return v if v and all(c.isalnum() or c in "-_./:@" for c in v) else repr(v)
