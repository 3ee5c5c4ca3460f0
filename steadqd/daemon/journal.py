"""Structured logging: journald fields when connected to the journal, else prefixed lines.

Every entry carries SYSLOG_IDENTIFIER, STEADQ_QUEUE and STEADQ_ROLE, plus the
fields a call passes (``job_id=...`` becomes ``STEADQ_JOB_ID=...``), so
``journalctl STEADQ_QUEUE=render STEADQ_JOB_ID=<id>`` finds one job's story.
Without journald (``steadqd run`` in a container or a shell) the same entry
is one stderr line with a ``<N>`` priority prefix and ``KEY=value`` pairs.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TextIO

EMERG, ALERT, CRIT, ERR, WARNING, NOTICE, INFO, DEBUG = range(8)
IDENTIFIER = "steadqd"


def journal_connected(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """systemd sets JOURNAL_STREAM to stderr's dev:ino when it is the journal."""
    value = env.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(2)
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def _field_name(key: str) -> str:
    return "STEADQ_" + key.upper()


class Log:
    """One role's logger; thread-safe."""

    def __init__(self, role: str, queue: str, *, journal: bool | None = None, stream: TextIO | None = None) -> None:
        self.role = role
        self.queue = queue
        self._stream = stream or sys.stderr
        self._lock = threading.Lock()
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
        pairs = {_field_name(k): str(v) for k, v in fields.items() if v is not None}
        pairs["STEADQ_QUEUE"] = self.queue
        pairs["STEADQ_ROLE"] = self.role
        if self._send is not None:
            try:
                self._send(message, PRIORITY=str(priority), SYSLOG_IDENTIFIER=IDENTIFIER, **pairs)
                return
            except OSError:
                pass  # journald restarting: fall back to stderr rather than lose the entry
        extra = " ".join(
            f"{k}={_quote(v)}" for k, v in sorted(pairs.items()) if k not in ("STEADQ_QUEUE", "STEADQ_ROLE")
        )
        line = f"<{priority}>{self.role}[{self.queue}]: {message}" + (f" {extra}" if extra else "")
        with self._lock:
            try:
                self._stream.write(line.replace("\n", "\\n") + "\n")
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


def _quote(v: str) -> str:
    return v if v and all(c.isalnum() or c in "-_./:@" for c in v) else repr(v)
