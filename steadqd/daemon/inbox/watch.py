"""The watch folder as a role: its thread, which files arrive and when each is complete.

NAS and transcoding users drop files into a folder and expect each one to be
worked on; `.path` units coalesce events and miss renames. With an ``inbox:``
section in the queue's YAML file, ``steadqd worker`` and ``steadqd run`` watch
that folder (``steadqd inbox QUEUE`` runs the watch alone) and enqueue each
file that is *complete*:

* it was closed after writing (IN_CLOSE_WRITE) or moved in (IN_MOVED_TO), or it
  was there when the role started (or when inotify lost events), and
* it has been still for ``settle`` seconds since: any further write or
  attribute change starts the wait again, so an upload that closes and
  reopens its file, or that is renamed in while still being written, is
  taken only once it stops changing.

A file some process still has open for writing is not taken either, where
the kernel will say so (``files.open_for_writing``: the file's owner or
root). Another user's file left open and idle longer than ``settle`` cannot be
told from a finished one: uploaders should write under a hidden name
(``.name``, as rsync and most NAS tools do) or a name the ``pattern`` does not
match, and rename when done. Hidden names are never taken.

Only regular files of the folder itself are taken: symbolic links, FIFOs,
sockets, devices, directories, files with other hard links and mount points
are refused with a journal line (once per file), and every file is opened by
the folder's descriptor, never by a path. Exactly one job per file, across
restarts and SIGKILLs, is ``files``'s protocol (an intent record with a
job id drawn before the enqueue).

The watching runs in a thread of its own, with its own queue handle: reading a
large file (``payload: content``) or thousands of fsyncs after a burst must not
hold up the worker's lease renewals in the service loop.

inotify is the ``inotify_simple`` dependency's: it takes any mask (``ONLYDIR``,
``EXCL_UNLINK``), reads without blocking (``read(timeout=0)``, the thread waits
in ``select`` with its wake-up pipe) and reports ``Q_OVERFLOW`` like any event.
inotify cannot watch a descriptor, only a path, so the path given is
``/proc/self/fd/N`` of the folder's descriptor: the directory that was opened
and checked, not whatever the folder's path names by then (and without
``DONT_FOLLOW``, which would watch that proc link instead).
"""

from __future__ import annotations

import contextlib
import fnmatch
import heapq
import itertools
import os
import select
import stat
import threading
import time
from collections.abc import Iterator

import inotify_simple

from steadqd.backend import Backend
from steadqd.daemon import metrics
from steadqd.daemon.config import InboxConfig, QueueSettings
from steadqd.daemon.inbox.files import (
    DONE_BEFORE,
    ENQUEUED,
    LATER,
    REFUSED,
    Folder,
    Result,
)
from steadqd.daemon.inbox.intent import STATE_DIR, Unreadable, shown
from steadqd.daemon.journal import ErrorDigest, Log
from steadqd.daemon.service import Loop, open_queue
from steadqd.errors import SteadQError

__all__ = ["InboxRole", "Watcher"]

RETRY_PAUSE = 5.0  # s before a file that could not be taken (full queue, unknown outcome) is tried again
# Refusals named one line each per summary window; the rest are counted in one line at its end
# (and when the watch stops): 20,000 directories dropped in must not be 20,000 journal lines,
# which journald's rate limit would answer by dropping the daemon's real errors too.
REFUSALS_NAMED = 10
SUMMARY_EVERY = 60.0
_JOIN_TIMEOUT = 30.0

Signature = tuple[int, int, int, int]  # inode, size, mtime_ns, ctime_ns

_F = inotify_simple.flags
# What a watch folder listens to: a file finished (closed after writing, or
# moved in), changed again, or went away; and the folder itself going away.
FOLDER_EVENTS = (
    _F.MODIFY
    | _F.ATTRIB
    | _F.CLOSE_WRITE
    | _F.MOVED_FROM
    | _F.MOVED_TO
    | _F.CREATE
    | _F.DELETE
    | _F.DELETE_SELF
    | _F.MOVE_SELF
    | _F.ONLYDIR
    | _F.EXCL_UNLINK
)
FOLDER_GONE = _F.DELETE_SELF | _F.MOVE_SELF | _F.UNMOUNT | _F.IGNORED


def read_events(ino: inotify_simple.INotify) -> Iterator[inotify_simple.Event]:
    """Every event waiting, without blocking."""
    while events := ino.read(timeout=0):
        yield from events


def _signature(st: os.stat_result) -> Signature:
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def retention_of(settings: QueueSettings) -> float:
    """How long a finished job stays findable, so an intent older than that is not trusted."""
    sw = settings.sweeper
    return sw.receipt_retention if sw.dead_retention is None else min(sw.receipt_retention, sw.dead_retention)


def _os_error(e: OSError, folder: str) -> str:
    """An OS error no check foresaw, with the whole path (a name in the folder is relative to it)."""
    name = e.filename if isinstance(e.filename, str) else ""
    where = os.path.join(folder, name) if name else folder
    return f"{shown(where)}: {e.strerror or e}"


class Watcher:
    """Events and settle timers of one folder, and what becomes of each file (one thread)."""

    def __init__(self, settings: QueueSettings, log: Log) -> None:
        assert settings.inbox is not None
        self.settings = settings
        self.config: InboxConfig = settings.inbox
        self.log = log
        self.queue: Backend = open_queue(settings)
        self.inotify: inotify_simple.INotify | None = None
        try:
            self.folder = Folder(self.config, self.queue, retention_of(settings))
            self.inotify = inotify_simple.INotify(nonblocking=True)
            # Before the first scan: nothing falls between. The directory opened, not its path now.
            self.inotify.add_watch(f"/proc/self/fd/{self.folder.fd}", FOLDER_EVENTS)
        except BaseException:
            self.close()
            raise
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stop = threading.Event()
        self._due: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self.waiting: dict[str, tuple[Signature, float]] = {}  # name -> (signature when armed, deadline)
        self._refused: dict[str, Signature | None] = {}
        self._retry_intents_at: float | None = None
        self._later = ErrorDigest(log, "watch folder: a file was not taken yet")
        self.gone = False
        self.enqueued = 0
        self.refused = 0
        self._named = 0  # refusals named in this summary window
        self._unnamed = 0  # and counted only
        self._summary_at: float | None = None
        # A folder inside the watched one (e.g. move_to) is not a file to refuse.
        m = self.config.move_to
        self._skip_dirs = {os.path.basename(m)} if m is not None and os.path.dirname(m) == self.config.path else set()

    # -- lifecycle ------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\0")

    def close(self) -> None:
        if self.inotify is not None:
            self.inotify.close()
            self.inotify = None
        if hasattr(self, "folder"):
            self.folder.close()
        if hasattr(self, "_wake_r"):
            os.close(self._wake_r)
            os.close(self._wake_w)
            del self._wake_r
        with contextlib.suppress(SteadQError, OSError):
            self.queue.close()

    def run(self) -> None:
        """Until :meth:`stop`: finish what an earlier run left, take what is there, then follow events."""
        try:
            self._resolve_intents()
            self._scan()
            while not self._stop.is_set() and not self.gone:
                self._wait()
                self._read_events()
                self._take_due()
                if self._summary_at is not None and time.monotonic() >= self._summary_at:
                    self._summarise()
        except Exception as e:  # the role reports it; the worker in the same process goes on
            self.log.error(f"watch folder {self.config.path} stopped: {e}", inbox=self.config.path)
            self.gone = True
        finally:
            self._summarise()
            if self.gone:
                metrics.inbox_failed(True)

    def _wait(self) -> None:
        timeout = None
        if self._due:
            timeout = max(0.0, self._due[0][0] - time.monotonic())
        for at in (self._retry_intents_at, self._summary_at):
            if at is not None:
                until = max(0.0, at - time.monotonic())
                timeout = until if timeout is None else min(timeout, until)
        assert self.inotify is not None
        ready, _, _ = select.select([self.inotify.fileno(), self._wake_r], [], [], timeout)
        if self._wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 64)

    # -- what arrives --------------------------------------------------------------

    def _wanted(self, name: str) -> bool:
        return not name.startswith(".") and fnmatch.fnmatchcase(name, self.config.pattern)

    def _scan(self) -> None:
        """Every entry of the folder waits out ``settle`` as if it had just been closed."""
        names = set(os.listdir(self.folder.fd))
        self.folder.forget_missing(names)
        for name in names:
            if self._wanted(name) and name not in self._skip_dirs:
                self._arm(name)

    def _arm(self, name: str) -> None:
        try:
            sig = _signature(os.stat(name, dir_fd=self.folder.fd, follow_symlinks=False))
        except FileNotFoundError:
            self._forget(name)
            return
        if name in self._refused and self._refused[name] == sig:
            return  # refused as it is; a change makes it a new file
        self._refused.pop(name, None)
        deadline = time.monotonic() + self.config.settle
        self.waiting[name] = (sig, deadline)
        heapq.heappush(self._due, (deadline, next(self._seq), name))

    def _forget(self, name: str) -> None:
        self.waiting.pop(name, None)
        self._refused.pop(name, None)
        self.folder.forget(name)

    def _read_events(self) -> None:
        assert self.inotify is not None
        for ev in read_events(self.inotify):
            if ev.mask & _F.Q_OVERFLOW:
                self.log.warning(
                    f"watch folder {self.config.path}: inotify lost events (a burst); looking at every file again",
                    inbox=self.config.path,
                )
                self._scan()
                continue
            if not ev.name:
                if ev.mask & FOLDER_GONE:
                    self.log.error(
                        f"watch folder {self.config.path} was removed, moved or unmounted; restart the service "
                        "once it is back",
                        inbox=self.config.path,
                    )
                    self.gone = True
                continue
            name = ev.name
            if not self._wanted(name) or name in self._skip_dirs:
                continue
            if ev.mask & (_F.DELETE | _F.MOVED_FROM):
                self._forget(name)
            elif ev.mask & (_F.CLOSE_WRITE | _F.MOVED_TO):
                self._arm(name)
            elif ev.mask & (_F.MODIFY | _F.ATTRIB):
                if name in self.waiting or name in self._refused:
                    self._arm(name)  # still changing: the settle time starts again
            elif ev.mask & _F.CREATE and self._made_whole(name):
                self._arm(name)  # never closed after writing: refused (or taken, a hard link) after settle

    def _made_whole(self, name: str) -> bool:
        """A symbolic link, FIFO, folder or hard link is complete the moment it is created."""
        try:
            st = os.stat(name, dir_fd=self.folder.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return not stat.S_ISREG(st.st_mode) or st.st_nlink > 1

    # -- what becomes of it --------------------------------------------------------

    def _take_due(self) -> None:
        if self._retry_intents_at is not None and time.monotonic() >= self._retry_intents_at:
            self._resolve_intents()
        while self._due and not self._stop.is_set() and not self.gone:
            deadline, _, name = self._due[0]
            if deadline > time.monotonic():
                return
            heapq.heappop(self._due)
            armed = self.waiting.get(name)
            if armed is None or armed[1] != deadline:
                continue  # re-armed or gone since
            del self.waiting[name]
            self._take(name, armed[0])
            self._read_events()  # keep the kernel's event queue short during a burst

    def _take(self, name: str, armed: Signature) -> None:
        st, why = self.folder.look(name)
        if st is None:
            if why:
                self._refuse(name, why)
            else:
                self._forget(name)
            return
        if _signature(st) != armed:
            self._arm(name)  # changed without an event we saw: wait again
            return
        done = self.folder.already_kept(st)
        if done is not None:
            self.log.debug(f"{shown(name)}: already job {done} (kept)", job_id=done, inbox_file=shown(name))
            return
        self._report(name, self.folder.take(name, st))

    def _refuse(self, name: str, why: str, job_id: str | None = None) -> None:
        try:
            sig: Signature | None = _signature(os.stat(name, dir_fd=self.folder.fd, follow_symlinks=False))
        except OSError:
            sig = None
        self._refused[name] = sig
        self.refused += 1
        if self._summary_at is None:
            self._summary_at = time.monotonic() + SUMMARY_EVERY
        if self._named >= REFUSALS_NAMED:
            self._unnamed += 1
            return
        self._named += 1
        more = ""
        if self._named == REFUSALS_NAMED:
            more = f"; further refusals are counted, in one line per {SUMMARY_EVERY:g}s"
        self.log.warning(f"watch folder: {shown(name)} refused: it {why}{more}", inbox_file=shown(name), job_id=job_id)

    def _summarise(self) -> None:
        """End a summary window: one line for the refusals not named in it."""
        if self._unnamed:
            self.log.warning(
                f"watch folder {shown(self.config.path)}: {self._unnamed} more files refused without a line each "
                f"({self.refused} in all); `systemctl status` counts them",
                inbox=self.config.path,
                refused=self._unnamed,
            )
        self._named = self._unnamed = 0
        self._summary_at = None

    def _report(self, name: str, result: Result) -> None:
        shown_name = shown(name)
        if result.outcome == ENQUEUED:
            self.enqueued += 1
            self.log.notice(
                f"watch folder: {shown_name} enqueued as job {result.job_id}",
                job_id=result.job_id,
                inbox_file=shown_name,
            )
        elif result.outcome == DONE_BEFORE:
            self.log.notice(
                f"watch folder: {shown_name} was already job {result.job_id}; finished what an earlier run began",
                job_id=result.job_id,
                inbox_file=shown_name,
            )
        elif result.outcome == REFUSED:
            self._refuse(name, result.reason, result.job_id)
        elif result.outcome == LATER:
            # A full disk makes every file wait: one line per window, with the count.
            self._later.record([("not_taken", f"{shown_name} {result.reason}; trying again every {RETRY_PAUSE:g}s")])
            self._arm_after(name, RETRY_PAUSE)
        else:  # the queue cannot say whether the job was published: reopen, then ask it
            self.log.error(
                f"watch folder: {shown_name}: outcome of job {result.job_id} unknown ({result.reason}); "
                f"reopening the queue and asking again in {RETRY_PAUSE:g}s",
                job_id=result.job_id,
                inbox_file=shown_name,
            )
            self._reopen_queue()
            self._retry_intents_at = time.monotonic() + RETRY_PAUSE

    def _arm_after(self, name: str, pause: float) -> None:
        self._arm(name)
        if name in self.waiting:
            sig, _ = self.waiting[name]
            deadline = time.monotonic() + max(pause, self.config.settle)
            self.waiting[name] = (sig, deadline)
            heapq.heappush(self._due, (deadline, next(self._seq), name))

    def _reopen_queue(self) -> None:
        with contextlib.suppress(SteadQError, OSError):
            self.queue.close()
        self.queue = open_queue(self.settings)
        self.folder.queue = self.queue

    def _resolve_intents(self) -> None:
        self._retry_intents_at = None
        for intent in self.folder.pending_intents():
            if isinstance(intent, Unreadable):
                self._not_a_record(intent)
                continue
            try:
                result = self.folder.resolve(intent)
            except (SteadQError, OSError) as e:
                self.log.error(
                    f"watch folder: cannot finish {shown(intent.name)} (job {intent.job_id}) yet: {e}",
                    job_id=intent.job_id,
                    inbox_file=shown(intent.name),
                )
                self._retry_intents_at = time.monotonic() + RETRY_PAUSE
                continue
            self._report(intent.name, result)

    def _not_a_record(self, bad: Unreadable) -> None:
        if bad.cut_short:
            self.log.warning(
                f"watch folder: removing {STATE_DIR}/{shown(bad.entry)}: an intent cut short while being written",
            )
            self.folder.drop_unreadable(bad.entry)
            return
        aside = self.folder.set_aside(bad.entry)
        self.log.warning(
            f"watch folder: {STATE_DIR}/{shown(bad.entry)} refused and set aside as {shown(aside)}: it {bad.why}; "
            "nothing was done with it",
            inbox=self.config.path,
        )


class InboxRole:
    """The watch folder as a role of the service loop: a thread, started and stopped with it.

    Beside a worker the role exists even without ``inbox:`` (a reload may add one), and a
    folder that cannot be watched does not stop the worker: jobs keep running, the folder
    is reported failed (journal, ``systemctl status``) and a reload tries it again. Alone
    (``steadqd inbox``, or a queue whose jobs run elsewhere) there is nothing else to run,
    so the same problem fails the start.
    """

    name = "inbox"

    def __init__(self, settings: QueueSettings, log: Log) -> None:
        self.settings = settings
        self.log = log
        self.alone = False  # set by the role factory when nothing else runs in this process
        self.failed = ""  # why the configured folder is not watched
        self._watcher: Watcher | None = None
        self._thread: threading.Thread | None = None

    def start(self, loop: Loop) -> None:
        self._start(self.settings)
        metrics.attach(loop, self.settings, self.log, self.name)
        metrics.inbox_failed(bool(self.failed))

    def _start(self, settings: QueueSettings) -> None:
        self.failed = ""
        config = settings.inbox
        if config is None:
            return
        try:
            self._watcher = Watcher(settings, self.log)
        except (SteadQError, OSError) as e:
            if self.alone:
                raise
            self.failed = str(e) if isinstance(e, SteadQError) else _os_error(e, config.path)
            self.log.error(
                f"watch folder {shown(config.path)} not watched: {self.failed}; jobs go on running; "
                "fix it, then `systemctl reload` (or restart) the service",
                inbox=config.path,
            )
            return
        if self._watcher.folder.exposed:
            self.log.warning(
                f"watch folder {shown(config.path)} {self._watcher.folder.exposed}: a member could rename "
                f"{STATE_DIR} away; make it sticky (chmod +t {shown(config.path)}, mode 3770)",
                inbox=config.path,
            )
        self._thread = threading.Thread(target=self._watcher.run, name="steadqd-inbox", daemon=True)
        self._thread.start()
        action = {"keep": "kept", "delete": "deleted", "move": f"moved to {config.move_to}"}[config.after]
        self.log.info(
            f"watching {config.path} for {config.pattern!r}: each file still for {config.settle:g}s becomes a job "
            f"({config.payload}), then is {action}",
            inbox=config.path,
        )

    @property
    def configured(self) -> bool:
        """A folder is configured (watched or failed); without one the role only waits for a reload to add it."""
        return self.settings.inbox is not None

    def status(self) -> str:
        if self.failed and self.settings.inbox is not None:
            return f"failed: {shown(self.settings.inbox.path)} not watched (see the journal)"
        w = self._watcher
        if w is None:
            return ""
        if w.gone:
            return f"stopped: {w.config.path} went away or failed (see the journal)"
        return f"{w.enqueued} enqueued, {len(w.waiting)} settling, {w.refused} refused"

    def reload(self, settings: QueueSettings) -> str:
        """Watch the folder anew when its settings changed or it had failed; what failed is not applied."""
        old = self.settings
        self.settings = settings
        if settings.inbox == old.inbox and settings.sweeper == old.sweeper and not self.failed:
            return ""
        self._stop()
        if settings.inbox is not None:
            self.log.notice("watch folder configuration changed: watching again")
        self._start(settings)
        metrics.inbox_failed(bool(self.failed))
        if self.failed and settings.inbox is not None:
            return f"watch folder {shown(settings.inbox.path)} not watched: {self.failed}"
        return ""

    def drain(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()

    def drained(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def close(self) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
        if self._thread is not None:
            # The file being taken is finished first: every step of it is short but one,
            # reading the file for `payload: content`.
            self._thread.join(_JOIN_TIMEOUT)
        if self._watcher is not None and (self._thread is None or not self._thread.is_alive()):
            self._watcher.close()
        self._watcher = None
        self._thread = None
