"""How the worker API's sentences reach the journal: with the job's ``STEADQ_JOB_ID`` as the daemons send them,
so ``steadq show`` tells a job's story whichever program ran it."""

from __future__ import annotations

import logging

from steadqd.daemon.journal import journal_connected

__all__ = ["journal_connected", "JournalHandler", "about", "log"]

# Every module of the worker API logs here: the one logger users configure, and the one the journal handler is on.
log = logging.getLogger("steadqd.tasks")


def _journal_send(message: str, **fields: str) -> None:
    """One native journal entry (python-systemd); replaced in tests."""
    from systemd import journal

    journal.send(message, **fields)


class JournalHandler(logging.Handler):
    """The worker's records as journal entries with their fields, so ``steadq show`` finds a job's
    sentences (its ``Bury`` message above all) by ``STEADQ_JOB_ID``.

    Installed by :meth:`Worker.run` only when stderr is the journal and nothing configures logging:
    the bare stderr line Python would print then carries no field and reaches no ``show``."""

    def __init__(self, queue: str) -> None:
        super().__init__(logging.INFO)
        self.queue = queue

    def emit(self, record: logging.LogRecord) -> None:
        fields = {"PRIORITY": str(_PRIORITY.get(record.levelno, 6)), "SYSLOG_IDENTIFIER": "steadqd",
                  "STEADQ_QUEUE": self.queue, "STEADQ_ROLE": "task"}  # fmt: skip
        job = getattr(record, "STEADQ_JOB_ID", None)
        if job is not None:
            fields["STEADQ_JOB_ID"] = str(job)
        try:
            _journal_send(record.getMessage(), **fields)
        except Exception:  # noqa: BLE001 - a log line must never stop the worker
            self.handleError(record)


_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


def about(job_id: str) -> dict[str, str]:
    """``extra=`` of a record about one job: a journal handler (ours, python-systemd's) sends it as a field."""
    return {"STEADQ_JOB_ID": job_id}
