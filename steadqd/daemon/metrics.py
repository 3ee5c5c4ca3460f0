"""The daemons' counters as a Prometheus node-exporter textfile (``metrics_textfile:``).

Why a textfile and not an HTTP endpoint: the sweeper and promoter units have
no network at all (``PrivateNetwork=yes``, docs/security-units.md), and a
listening socket per queue and role would be one more thing to secure. node-exporter's
textfile collector already runs on the machines that are scraped; it reads
every ``*.prom`` file of its directory at each scrape. The file is written to
a temporary name beside it and renamed over it, so a scrape never reads half
a file. The directory must be one only root or the daemon's user can change
(:func:`directory_problem`), and no name in it is followed as a link.

The three roles of a queue are three processes reading one YAML file, so each
process writes its own file: the configured path with the process's role
inserted before ``.prom`` (``steadq-q.prom`` becomes ``steadq-q.worker.prom``,
``...sweeper.prom``, ``...promoter.prom``, ``...run.prom`` under ``steadqd
run``). Every sample carries ``queue`` and ``role`` labels, so the files
never repeat a series, which node-exporter refuses. The counters start at
zero with the process, as Prometheus counters may (``rate()`` handles resets).

The sweeper also counts the queue (:data:`QUEUE_STATES`, at most every
:data:`COUNT_INTERVAL` and only when a file is configured: a count lists
every state) and stamps each recovery pass, so the sweeper's file is
rewritten at least once per pass: an alert on
``steadqd_sweeper_last_pass_timestamp_seconds`` sees a sweeper (or a
node-exporter directory) that stopped, where the counters of an idle
queue would not change at all. The shipped alert rules and Grafana
dashboard (packaging: /usr/share/steadqd/monitoring/) use these names.

``steadq stats --prometheus`` is a different thing and stays as the reference
prints it: queue depths read from the tree, for a cron job or a scrape script.
"""

from __future__ import annotations

import atexit
import errno
import math
import os
import secrets
import stat
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from steadqd.backend import RecoveryReport
from steadqd.daemon.config import QueueSettings
from steadqd.daemon.journal import Log
from steadqd.durable_file import replace_durably
from steadqd.text import printable

if TYPE_CHECKING:  # only a type here: preflight (imported by the service) uses directory_problem
    from steadqd.daemon.service import Loop

__all__ = [
    "COUNT_INTERVAL",
    "DURATION_BUCKETS",
    "JOB_STATES",
    "QUEUE_STATES",
    "Metrics",
    "UncontrolledDirectory",
    "attach",
    "counted",
    "directory_problem",
    "inbox_failed",
    "job_failed_to_start",
    "job_finished",
    "job_progress",
    "recovered",
    "swept",
    "textfile_for",
    "write_textfile",
]

WRITE_INTERVAL = 5.0  # seconds between rewrites while something changed
# Job run times span a thumbnail (well under a second) to a transcode (an hour).
DURATION_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)
JOB_STATES = ("acked", "retried", "buried", "cancelled", "failed_to_start")
# The sweeper's gauges: label -> the state word of Backend.stats() (running: the leased jobs, as steadq list says).
QUEUE_STATES = {"ready": "ready", "delayed": "delayed", "running": "leased", "dead": "dead"}
COUNT_INTERVAL = 15.0  # seconds between two counts of the queue by the sweeper (a count lists every state)

_HELP = {
    "steadqd_jobs_total": (
        "counter",
        "Jobs whose run ended, by what became of them (acked, retried, buried, cancelled: an operator's "
        "steadq cancel stopped it, or failed_to_start: the worker could not start the command and handed "
        "the job back).",
    ),
    "steadqd_job_duration_seconds": ("histogram", "How long job commands ran, from start to exit."),
    "steadqd_job_progress_percent": (
        "gauge",
        "Progress (0-100) a running job reported through $STEADQ_PROGRESS, by the slot it runs in.",
    ),
    "steadqd_promotions_total": ("counter", "Delayed jobs made ready by recovery once their not_before passed."),
    "steadqd_reaps_total": ("counter", "Expired leases recovery took back (to ready, or dead when out of attempts)."),
    "steadqd_queue_paused": (
        "gauge",
        "1 while the worker's last claim pass found the queue paused (steadq pause), else 0.",
    ),
    "steadqd_inbox_failed": (
        "gauge",
        "1 while the configured watch folder (inbox:) is not watched: it could not be opened, or it went away "
        "or failed since (the journal says why); else 0.",
    ),
    "steadqd_queue_jobs": ("gauge", "Jobs in each state when the sweeper last counted (running: leased now)."),
    "steadqd_queue_oldest_job_seconds": (
        "gauge",
        "How long the oldest job of each state has been in it when the sweeper last counted (0: none).",
    ),
    "steadqd_sweeper_last_pass_timestamp_seconds": ("gauge", "Unix time the sweeper's last recovery pass ended."),
}
_SETTLED = {"ack": "acked", "retry": "retried", "bury": "buried"}  # verdict word -> state label
# Which families each role feeds: a file carries only the families of the roles in its process.
_ROLE_FAMILIES = {
    "worker": (
        "steadqd_jobs_total",
        "steadqd_job_duration_seconds",
        "steadqd_queue_paused",
        "steadqd_job_progress_percent",
    ),
    "sweeper": (
        "steadqd_promotions_total",
        "steadqd_reaps_total",
        "steadqd_queue_jobs",
        "steadqd_queue_oldest_job_seconds",
        "steadqd_sweeper_last_pass_timestamp_seconds",
    ),
    "promoter": ("steadqd_promotions_total",),
    "inbox": ("steadqd_inbox_failed",),
}


def textfile_for(configured: str, role: str) -> str:
    """The file this process writes: ``role`` inserted before the ``.prom`` the config requires."""
    return f"{configured.removesuffix('.prom')}.{role}.prom"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class Metrics:
    """One process's counters for one queue; safe to update from any thread."""

    def __init__(self, queue: str, role: str) -> None:
        self.queue = queue
        self.role = role
        self.families: set[str] = set()
        self._lock = threading.Lock()
        self._jobs = dict.fromkeys(JOB_STATES, 0)
        self._buckets = [0] * (len(DURATION_BUCKETS) + 1)  # the last one is +Inf
        self._duration_sum = 0.0
        self._promotions = 0
        self._reaps = 0
        self._paused = False
        self._progress: dict[int, float] = {}  # by slot: a bounded series count, unlike job ids
        self._inbox_failed = False
        self._counts: dict[str, tuple[int, float]] | None = None  # state -> (jobs, oldest age); None: not counted
        self._last_pass: float | None = None
        self.changes = 0  # bumped by every update: the writer skips a file that would not change

    def feed(self, roles: Iterable[str]) -> None:
        with self._lock:
            for role in roles:
                self.families.update(_ROLE_FAMILIES.get(role, ()))
            self.changes += 1

    def job_finished(self, state: str, seconds: float | None) -> None:
        """A run ended and ``state`` (acked, retried, buried) took effect; ``seconds`` it ran."""
        with self._lock:
            self._jobs[state] += 1
            if seconds is not None:
                self._duration_sum += seconds
                for i, bound in enumerate((*DURATION_BUCKETS, math.inf)):
                    if seconds <= bound:
                        self._buckets[i] += 1
                        break
            self.changes += 1

    def job_progress(self, slot: int, percent: float | None) -> None:
        """The progress of the job in ``slot``; None once it has ended (its series goes)."""
        with self._lock:
            if percent is None:
                self._progress.pop(slot, None)
            else:
                self._progress[slot] = percent
            self.changes += 1

    def job_failed_to_start(self) -> None:
        with self._lock:
            self._jobs["failed_to_start"] += 1
            self.changes += 1

    def queue_paused(self, paused: bool) -> None:
        if paused != self._paused:
            with self._lock:
                self._paused = paused
                self.changes += 1

    def inbox_failed(self, failed: bool) -> None:
        if failed != self._inbox_failed:
            with self._lock:
                self._inbox_failed = failed
                self.changes += 1

    def recovered(self, promoted: int, reaped: int) -> None:
        if promoted or reaped:
            with self._lock:
                self._promotions += promoted
                self._reaps += reaped
                self.changes += 1

    def counted(self, counts: dict[str, tuple[int, float]]) -> None:
        """The sweeper counted the queue: ``{state: (jobs, oldest age in seconds)}`` for :data:`QUEUE_STATES`."""
        with self._lock:
            self._counts = dict(counts)
            self.changes += 1

    def swept(self, at: float) -> None:
        """A recovery pass ended at unix time ``at``."""
        with self._lock:
            self._last_pass = at
            self.changes += 1

    def render(self) -> str:
        """The Prometheus text exposition format (version 0.0.4) of the families this process feeds."""
        base = f'queue="{_label(self.queue)}",role="{_label(self.role)}"'
        with self._lock:
            samples: dict[str, list[str]] = {
                "steadqd_jobs_total": [f'steadqd_jobs_total{{{base},state="{s}"}} {self._jobs[s]}' for s in JOB_STATES],
                "steadqd_job_duration_seconds": self._histogram(base),
                "steadqd_promotions_total": [f"steadqd_promotions_total{{{base}}} {self._promotions}"],
                "steadqd_reaps_total": [f"steadqd_reaps_total{{{base}}} {self._reaps}"],
                "steadqd_queue_paused": [f"steadqd_queue_paused{{{base}}} {int(self._paused)}"],
                "steadqd_job_progress_percent": [
                    f'steadqd_job_progress_percent{{{base},slot="{slot}"}} {_number(pct)}'
                    for slot, pct in sorted(self._progress.items())
                ],
                "steadqd_inbox_failed": [f"steadqd_inbox_failed{{{base}}} {int(self._inbox_failed)}"],
                "steadqd_queue_jobs": [
                    f'steadqd_queue_jobs{{{base},state="{s}"}} {n}' for s, (n, _) in (self._counts or {}).items()
                ],
                "steadqd_queue_oldest_job_seconds": [
                    f'steadqd_queue_oldest_job_seconds{{{base},state="{s}"}} {_number(age)}'
                    for s, (_, age) in (self._counts or {}).items()
                ],
                "steadqd_sweeper_last_pass_timestamp_seconds": [
                    f"steadqd_sweeper_last_pass_timestamp_seconds{{{base}}} {_number(self._last_pass)}"
                ]
                if self._last_pass is not None
                else [],
            }
            # A gauge not measured yet is left out, not written as 0 (a 0 would read as "empty queue").
            families = [f for f in _HELP if f in self.families and samples[f]]
        lines: list[str] = []
        for family in families:
            kind, text = _HELP[family]
            lines += [f"# HELP {family} {text}", f"# TYPE {family} {kind}", *samples[family]]
        return "\n".join(lines) + "\n"

    def _histogram(self, base: str) -> list[str]:
        name = "steadqd_job_duration_seconds"
        out, total = [], 0
        for bound, n in zip((*DURATION_BUCKETS, math.inf), self._buckets, strict=True):
            total += n
            out.append(f'{name}_bucket{{{base},le="{_number(bound)}"}} {total}')
        out.append(f"{name}_sum{{{base}}} {_number(self._duration_sum)}")
        out.append(f"{name}_count{{{base}}} {total}")
        return out


class UncontrolledDirectory(PermissionError):
    """The metrics directory is one somebody else may change: the file is not written there."""


_TEMP_TRIES = 8  # random temp names tried before giving up (a clash needs 64 bits guessed)


def directory_problem(directory: str, info: os.stat_result) -> str | None:
    """Why the daemon does not control ``directory``, or None when it does.

    Control means nobody but root and the daemon's own user can add, swap or
    remove an entry in it: owned by root or by the daemon's user, and not
    writable by group or others unless sticky (a sticky directory, like
    /tmp, lets nobody replace another user's entry). node-exporter's
    textfile directory is usually root-owned 0755, or owned by the service
    user; a group-writable one is the attack: a member of the queue's group
    plants a symlink where the daemon, perhaps as root, writes.
    """
    where = printable(directory)
    if info.st_uid not in (0, os.geteuid()):
        return (
            f"metrics directory {where} is owned by uid {info.st_uid}, who could swap the file for a link; "
            f"chown root {where} (or the service user) (metrics_textfile:)"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        return (
            f"metrics directory {where} is writable by its group or others, who could plant a link there; "
            f"chmod go-w {where} (metrics_textfile:)"
        )
    return None


def write_textfile(path: str, text: str) -> None:
    """Replace ``path`` atomically: node-exporter reads only ``*.prom``, so the temporary name is not read.

    Everything happens relative to the directory opened once without
    following a link, and the temp file is created with ``O_EXCL`` under a
    random name, so a link planted at any name is never followed (the pid a
    predictable name would use is public). A directory the daemon does not
    control (:func:`directory_problem`) is refused with UncontrolledDirectory.
    """
    directory, name = os.path.split(path)
    dir_fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        problem = directory_problem(directory, os.fstat(dir_fd))
        if problem is not None:
            raise UncontrolledDirectory(errno.EPERM, problem)
        data = text.encode("utf-8")
        for attempt in range(_TEMP_TRIES):
            tmp = f".{name}.{secrets.token_hex(8)}.tmp"
            try:
                replace_durably(tmp, name, data, dir_fd=dir_fd, mode=0o644)
                return
            except FileExistsError:
                if attempt == _TEMP_TRIES - 1:
                    raise
    finally:
        os.close(dir_fd)


class _Writer:
    """Rewrites this process's file every WRITE_INTERVAL while something changed, and once at exit."""

    def __init__(self, metrics: Metrics, path: str, log: Log, loop: Loop) -> None:
        self.metrics, self.path, self.log, self.loop = metrics, path, log, loop
        self._written = -1
        self._failing = False

    def write(self) -> None:
        changes = self.metrics.changes
        if changes == self._written:
            return
        try:
            write_textfile(self.path, self.metrics.render())
        except UncontrolledDirectory as e:
            if not self._failing:
                self._failing = True
                self.log.warning(f"cannot write the metrics file {self.path}: {e.strerror}", path=self.path)
            return
        except OSError as e:
            if not self._failing:  # once per outage, not every interval
                self._failing = True
                self.log.warning(
                    f"cannot write the metrics file {self.path}: {e.strerror or e}; "
                    "check that its directory exists and is writable by the service user (metrics_textfile:)",
                    path=self.path,
                )
            return
        if self._failing:
            self._failing = False
            self.log.info(f"metrics file {self.path} written again", path=self.path)
        self._written = changes

    def tick(self) -> None:
        self.write()
        self.loop.call_later(WRITE_INTERVAL, self.tick)


_process: Metrics | None = None
_lock = threading.Lock()


def attach(loop: Loop, settings: QueueSettings, log: Log, role: str) -> None:
    """A role of this process starts: count for it, and write the file if the config names one.

    The first role to start sets the file up; the path is read then (a reload
    that changes ``metrics_textfile`` takes effect at the next start)."""
    global _process
    with _lock:
        first = _process is None
        if _process is None:
            _process = Metrics(settings.name, log.role)
        metrics = _process
    metrics.feed((role,))
    if first and settings.metrics_textfile is not None:
        writer = _Writer(metrics, textfile_for(settings.metrics_textfile, log.role), log, loop)
        loop.call_later(0.0, writer.tick)
        atexit.register(writer.write)


def job_finished(verdict: str, duration_ms: object, *, dead: bool) -> None:
    """A run's verdict (``ack``, ``retry``, ``bury``) took effect after ``duration_ms`` of running;
    ``dead``: the job went to dead/ (a retry with no attempts left counts as buried). An abandoned
    run (its lease was lost) settled nothing and is not counted."""
    state = _SETTLED.get(verdict)
    if _process is not None and state is not None:
        seconds = duration_ms / 1000 if isinstance(duration_ms, int | float) else None
        _process.job_finished("buried" if dead else state, seconds)


def job_cancelled(duration_ms: object) -> None:
    """A running job was cancelled (``steadq cancel``) and its command stopped after ``duration_ms``."""
    if _process is not None:
        _process.job_finished("cancelled", duration_ms / 1000 if isinstance(duration_ms, int | float) else None)


def job_progress(slot: int, percent: float | None) -> None:
    if _process is not None:
        _process.job_progress(slot, percent)


def job_failed_to_start() -> None:
    if _process is not None:
        _process.job_failed_to_start()


def queue_paused(paused: bool) -> None:
    """The worker's last claim pass found the queue paused (or not)."""
    if _process is not None:
        _process.queue_paused(paused)


def inbox_failed(failed: bool) -> None:
    """The configured watch folder is not watched (or is again)."""
    if _process is not None:
        _process.inbox_failed(failed)


def recovered(report: RecoveryReport) -> None:
    if _process is not None:
        _process.recovered(report.delayed_promoted, report.leases_reaped + report.leases_to_dead)


def swept(at: float) -> None:
    if _process is not None:
        _process.swept(at)


def counted(stats: Mapping[str, Any]) -> None:
    """The sweeper's count of the queue (``Backend.stats()``) as the :data:`QUEUE_STATES` gauges."""
    if _process is None:
        return
    counts: dict[str, tuple[int, float]] = {}
    for label, word in QUEUE_STATES.items():
        v = stats.get(word)
        jobs = int(v.objects) if v is not None else 0
        age = v.oldest_age_seconds if v is not None and jobs and v.oldest_age_seconds is not None else 0
        counts[label] = (jobs, float(age))
    _process.counted(counts)
