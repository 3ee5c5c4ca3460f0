"""The service loop every daemon role runs in.

One thread, one ``epoll`` loop: file descriptors (inotify, child output
pipes) and timers wake it, and signals arrive through ``set_wakeup_fd`` so
nothing polls. The loop owns the systemd contract shared by all roles:
READY=1 once every role has opened its queue, STATUS= lines a person can
read, watchdog pings at half WATCHDOG_USEC, SIGHUP reload (RELOADING=1 ...
READY=1) and SIGTERM drain (STOPPING=1, no new work, running work finishes,
the rest is handed back) with exit statuses systemd can act on.
"""

from __future__ import annotations

import errno
import functools
import heapq
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from steadqd import backend
from steadqd.daemon import preflight, role_lock
from steadqd.daemon.config import QueueSettings, open_options
from steadqd.daemon.journal import ErrorDigest, Log
from steadqd.daemon.notify import Notifier
from steadqd.errors import ConfigError, ErrorKind, SteadQError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 78  # EX_CONFIG: the unit uses RestartPreventExitStatus=78
# Start failures that no restart can cure: the configured queue is missing, not a
# queue, a symlink, corrupt or not ours to open. systemd must not loop on them.
_NEEDS_AN_OPERATOR = frozenset(
    {ErrorKind.INVALID_INPUT, ErrorKind.NOT_FOUND, ErrorKind.PERMISSION_DENIED, ErrorKind.QUEUE_CORRUPT}
)
_OPERATOR_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EROFS})


def start_failure_status(e: SteadQError) -> int:
    """The exit status of a role that could not start (the one home of that rule)."""
    if isinstance(e, ConfigError) or e.kind in _NEEDS_AN_OPERATOR:
        return EXIT_CONFIG
    return e.exit_code  # transient (I/O, busy, full disk) or already a no-restart status (64)


STATUS_EVERY = 5.0


def open_queue(settings: QueueSettings, *, certify: bool = False, **options: Any) -> backend.Backend:
    """Open the configured queue the way every role does: one place for the file-system
    switch (``allow_unsupported_fs``) and a bucket's ``s3:`` settings, so no role can forget them.

    ``certify`` makes a bucket queue's store pass its certification first (the worker at start)."""
    return backend.open_queue(settings.queue, **open_options(settings, certify=certify), **options)


_SOON = float("-inf")  # the time of a call_soon timer
TIMERS_COMPACT_MIN = 256  # timers in the loop's heap below which cancelled ones are left to expire


class Timer:
    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """The named one-shot timers of one thing (a job): setting a name again replaces its timer.

    Each callback runs through ``guard``, which the owner uses to turn an
    exception into a log line instead of a dead service loop. A job sets three
    or four of them and nearly all are cancelled unfired, so ``guard`` wraps a
    callback when it fires, not when it is set (Loop._push puts it in the
    heap): setting one costs a handful of calls, not a dozen.
    """

    def __init__(self, loop: Loop, guard: Callable[[Callable[[], None]], Callable[[], None]]) -> None:
        self._loop = loop
        self._guard = guard
        self._timers: dict[str, Timer] = {}

    def set(self, key: str, delay: float, fn: Callable[[], None]) -> None:
        self.set_at(key, self._loop.now() + (delay if delay > 0.0 else 0.0), fn)  # NaN: now, as max()

    def set_at(self, key: str, when: float, fn: Callable[[], None]) -> None:
        """:meth:`set` by the loop's clock time (one in the past: now), for a caller that knows it."""
        timers = self._timers
        if key in timers:
            timers[key].cancelled = True
        timers[key] = self._loop._push(Timer(when, functools.partial(_guarded_call, self._guard, fn)))

    def cancel(self, key: str) -> None:
        timers = self._timers
        if key in timers:
            timers.pop(key).cancelled = True

    def cancel_all(self) -> None:
        if self._timers:  # a job's end has cancelled each already: nothing to walk
            timers, self._timers = self._timers, {}
            for t in timers.values():
                t.cancelled = True

    def __bool__(self) -> bool:
        return bool(self._timers)


def _guarded_call(guard: Callable[[Callable[[], None]], Callable[[], None]], fn: Callable[[], None]) -> None:
    """A :class:`Timers` timer fires: its callback, wrapped by its owner's guard now."""
    guard(fn)()


class Loop:
    """A minimal event loop: readers, timers, and a self-pipe for signals.

    Readers are an ``epoll`` and a dict of callbacks by descriptor, not a ``selectors`` selector: a
    worker adds and removes two readers a job (its command's pipes), and the selector's layer (a key
    object for each, the file-object lookups, its ``select`` building a list of keys) cost some twenty
    Python calls a job on the loop's thread for nothing this loop uses.
    """

    def __init__(self) -> None:
        self._epoll = select.epoll()  # close-on-exec
        self._readers: dict[int, Callable[[], None]] = {}
        self._n_readers = 0  # len(self._readers), kept as a number: epoll's maxevents, asked every pass
        self._timers: list[tuple[float, int, Timer]] = []
        self._size = 0  # len(self._timers), kept as a number: asked at every push
        self._compact_at = TIMERS_COMPACT_MIN  # the heap's length at which cancelled timers are swept out
        self._seq = 0  # the last timer's sequence number: equal times fire in the order they were set
        self._soon: list[Timer] = []  # call_soon's, in the order asked
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.add_reader(self._wake_r, self._drain_wakeups)

    # The loop's clock: time.monotonic itself, not a method around it (asked some twenty times a job).
    now = staticmethod(time.monotonic)

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever ``fd`` is readable (or hung up, or in error); KeyError if it has one."""
        if fd in self._readers:
            raise KeyError(f"{fd!r} is already registered")
        self._epoll.register(fd, select.EPOLLIN)
        self._readers[fd] = callback
        self._n_readers += 1

    def remove_reader(self, fd: int) -> None:
        """Stop watching ``fd``; nothing if it is not watched. A descriptor closed already left the epoll."""
        if self._readers.pop(fd, None) is None:
            return
        self._n_readers -= 1
        try:
            self._epoll.unregister(fd)
        except OSError:
            pass

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self._push(Timer(time.monotonic() + (delay if delay > 0.0 else 0.0), callback))  # NaN: now, as max()

    def call_soon(self, callback: Callable[[], None]) -> Timer:
        """``callback`` at the end of this pass, after its readers' callbacks and due timers (asked from a
        callback of the end itself, or between passes: in the next, which does not wait then).

        What ``call_later(0.0, ...)`` was for, in the order asked, without a heap entry and its clock
        reading: a worker asks it some three times a job (a fill, a hand-over, a sweep at the pass's end).
        Its timer's ``when`` is -inf: due before any other.
        """
        t = Timer(_SOON, callback)
        self._soon.append(t)
        return t

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        return self._push(Timer(when, callback))

    def _push(self, t: Timer) -> Timer:
        """A new timer into the heap (call_later, call_at and Timers.set_at all come here)."""
        self._seq += 1
        heapq.heappush(self._timers, (t.when, self._seq, t))
        self._size += 1
        if self._size > self._compact_at:
            self._compact()
        return t

    def _compact(self) -> None:
        """Drop cancelled timers from the heap. A cancelled timer stays in it until its time comes, and a
        worker cancels a job's renewal (due in ``renew_interval``) and exit check at every end: at hundreds
        of jobs a second the heap would hold thousands of them, and every push and pop would walk it.
        Swept when it has doubled since the last sweep: amortised, a constant per timer."""
        live = [e for e in self._timers if not e[2].cancelled]
        heapq.heapify(live)
        self._timers = live
        self._size = len(live)
        self._compact_at = max(TIMERS_COMPACT_MIN, 2 * len(live))

    @property
    def wakeup_fd(self) -> int:
        return self._wake_w

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def run_once(self, max_wait: float | None = None) -> None:
        """Wait for one batch of events or the next timer, then run callbacks."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
            self._size -= 1
        # Conditional expressions, not max() and min() (two or three calls a pass); NaN still reads as 0.
        timeout = max_wait
        if self._soon:
            timeout = 0.0
        elif self._timers:
            until = self._timers[0][0] - self.now()
            until = until if until > 0.0 else 0.0
            timeout = until if timeout is None or until < timeout else timeout
        try:  # epoll_wait's milliseconds are rounded up by CPython: a timer is never woken for early
            events = self._epoll.poll(-1 if timeout is None else timeout if timeout > 0.0 else 0.0, self._n_readers)
        except InterruptedError:
            events = []
        readers = self._readers
        for fd, _ in events:
            if fd in readers:  # not: an earlier callback of this batch removed it
                readers[fd]()
        now = self.now()
        while self._timers and self._timers[0][0] <= now:
            _, _, t = heapq.heappop(self._timers)
            self._size -= 1
            if not t.cancelled:
                t.callback()
        if self._soon:
            soon, self._soon = self._soon, []
            for t in soon:
                if not t.cancelled:
                    t.callback()

    def close(self) -> None:
        self._epoll.close()
        self._readers.clear()
        self._n_readers = 0
        os.close(self._wake_r)
        os.close(self._wake_w)


class Role(Protocol):
    """What the service loop needs from a daemon role."""

    name: str

    def start(self, loop: Loop) -> None:
        """Open the queue and register fds/timers; raise to refuse starting."""

    def status(self) -> str:
        """A short fragment for STATUS=, e.g. "2 running, 14 ready"; "" for a role with nothing to do."""

    def reload(self, settings: QueueSettings) -> str:
        """Apply new settings without dropping running work; return what could not be applied ("" if all was).

        The service's reload line must never say "reloaded" for a change that did not take
        (a watch folder that cannot be watched): a role says so here, and the line names it."""

    def drain(self) -> None:
        """Stop taking new work."""

    def drained(self) -> bool:
        """True when nothing is running any more."""

    def close(self) -> None:
        """Hand back anything unfinished and release resources."""


@runtime_checkable
class RunsJobs(Protocol):
    """A role whose drain waits for jobs (the worker): the stop line says how many."""

    def running_jobs(self) -> int:
        """Jobs whose commands are running now."""


class PassRole:
    """What the sweeper and the promoter share: one queue handle, one pending timer.

    Draining only stops the timer: a pass is short and every step in it is
    atomic, so there is never anything to wait for. Problems are reported
    through an :class:`ErrorDigest`, never once per pass.
    """

    name: str

    def __init__(self, settings: QueueSettings, log: Log, what: str) -> None:
        self.settings = settings
        self.log = log
        self.queue: backend.Backend | None = None
        self.loop: Loop | None = None
        self._timer: Timer | None = None
        self._draining = False
        self.passes = 0
        self._errors = ErrorDigest(log, what)

    def drain(self) -> None:
        self._draining = True
        self._cancel()

    def drained(self) -> bool:
        return True

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _close_queue(self) -> None:
        """Give the handle up; a failure to close it is logged, not raised: there is nothing left to save."""
        if self.queue is not None:
            q, self.queue = self.queue, None
            try:
                q.close()
            except (SteadQError, OSError) as e:
                self.log.warning(f"closing the queue handle failed: {e}")


class Service:
    """Runs roles in one loop and speaks the systemd service contract."""

    def __init__(
        self,
        load_settings: Callable[[], QueueSettings],
        make_roles: Callable[[QueueSettings, Log], list[Role]],
        log: Log,
        notifier: Notifier | None = None,
    ) -> None:
        self.load_settings = load_settings
        self.make_roles = make_roles
        self.log = log
        self.notifier = notifier or Notifier()
        self.loop = Loop()
        self._reload = False
        self._stop = 0  # number of stop signals seen
        self.roles: list[Role] = []
        self.settings: QueueSettings | None = None  # the running configuration, once started
        self._last_status = ""
        self._held = role_lock.Held([], None)  # the (queue, role) locks, taken before any role starts

    # -- signals -------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            self._reload = True
        else:
            self._stop += 1

    def _install_signals(self) -> None:
        signal.set_wakeup_fd(self.loop.wakeup_fd, warn_on_full_buffer=False)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self._on_signal)

    # -- status and watchdog -------------------------------------------------

    def status_line(self) -> str:
        return "; ".join(f"{r.name}: {status}" for r in self.roles if (status := r.status()))

    def _publish_status(self, *, force: bool = False) -> None:
        line = self.status_line()
        if force or line != self._last_status:
            self.notifier.status(line)
            self._last_status = line
        self.loop.call_later(STATUS_EVERY, self._publish_status)

    def _watchdog(self) -> None:
        self.notifier.watchdog()
        assert self.notifier.watchdog_interval is not None
        self.loop.call_later(self.notifier.watchdog_interval, self._watchdog)

    # -- lifecycle -------------------------------------------------------------

    def run(self) -> int:
        try:
            settings = self.load_settings()
        except ConfigError as e:
            self.log.error(f"configuration error: {e}", config=getattr(e, "path", None))
            return EXIT_CONFIG
        self.settings = settings
        self._install_signals()
        account = preflight.Account.current()
        problems = preflight.queue_problems(settings, account)
        if problems:
            return self._refuse(problems[0].text, EXIT_CONFIG)
        try:
            self.roles = self.make_roles(settings, self.log)
            if not self.roles:  # e.g. a promoter on a bucket queue: it said why; a success, so no restart
                self.notifier.ready("nothing to run")
                self.log.notice("stopped: nothing to run for this queue")
                return EXIT_OK
            self._held = role_lock.acquire(settings.queue, settings.name, [r.name for r in self.roles])
            for r in self.roles:
                r.start(self.loop)
        except role_lock.RoleHeld as e:
            self._close_roles()
            return self._refuse(str(e), role_lock.EXIT_HELD)
        except SteadQError as e:
            self._close_roles()
            return self._refuse(str(e), start_failure_status(e))
        except OSError as e:  # what no check foresaw: still one line, never a traceback
            self._close_roles()
            status = EXIT_CONFIG if e.errno in _OPERATOR_ERRNOS else EXIT_FAILURE
            return self._refuse(preflight.describe_os_error(e, settings, account), status)
        self.notifier.ready(self.status_line())
        # STEADQ_ROLE_LOCKS: where this run's (queue, role) locks are; "none" = a second run would go unnoticed.
        self.log.notice(
            "started",
            # the roles that work: a watch role with no folder configured waits for a reload, unnamed
            roles=",".join(r.name for r in self.roles if getattr(r, "configured", True)),
            path=settings.queue,
            role_locks=self._held.where or "none",
        )
        if self.notifier.watchdog_interval:
            self.loop.call_later(self.notifier.watchdog_interval, self._watchdog)
        self.loop.call_later(STATUS_EVERY, self._publish_status)
        try:
            return self._serve()
        finally:
            self._close_roles()
            signal.set_wakeup_fd(-1)
            self.loop.close()

    def _refuse(self, why: str, status: int) -> int:
        """The one journal line of a start that cannot go on (exit 78 needs an operator)."""
        self.log.error(f"cannot start: {why}", exit_status=status)
        return status

    def _serve(self) -> int:
        draining = False
        while True:
            if self._reload and not draining:
                self._reload = False
                self._do_reload()
            if self._stop and not draining:
                draining = True
                self.notifier.stopping("draining: finishing running jobs, taking no new ones")
                self.log.notice(self._stopping_line())
                for r in self.roles:
                    r.drain()
            if draining and (self._stop > 1 or all(r.drained() for r in self.roles)):
                self.log.notice("stopped", forced=self._stop > 1 or None)
                return EXIT_OK
            self.loop.run_once(1.0 if draining else None)

    def _stopping_line(self) -> str:
        running = sum(r.running_jobs() for r in self.roles if isinstance(r, RunsJobs))
        if not running:
            return "stopping: draining, nothing is running"
        jobs = "1 running job" if running == 1 else f"{running} running jobs"
        again = "Ctrl-C again" if _on_a_terminal() else "a second SIGTERM"
        return f"stopping: draining {jobs} ({again} to hand them back now)"

    def _do_reload(self) -> None:
        self.notifier.reloading()
        try:
            settings = self.load_settings()
        except ConfigError as e:
            self.log.error(f"reload refused, keeping the running configuration: {e}")
            self.notifier.ready(self.status_line())
            return
        running = self.settings
        assert running is not None  # reloads are served only after run() started the roles
        if settings.queue != running.queue:
            # Decided here, once, for every role: a role that moved while another
            # stayed would split one service across two queues.
            self.log.error(
                f"reload refused, keeping the running configuration: `queue:` changed from {running.queue} "
                f"to {settings.queue}, and a running service keeps its queue; restart the service to serve the new one",
                config=settings.source,
            )
            self.notifier.ready(self.status_line())
            return
        if settings.s3 != running.s3:
            # Every role's handle holds a store client built from these settings (and the
            # worker's certified the store they name): changing them under it is a restart.
            self.log.error(
                "reload refused, keeping the running configuration: `s3:` changed, and a running service keeps "
                "the store connection it opened; restart the service to use the new settings",
                config=settings.source,
            )
            self.notifier.ready(self.status_line())
            return
        not_applied = []
        for r in self.roles:
            if why := r.reload(settings):
                not_applied.append(f"{r.name}: {why}")
        self.settings = settings
        if not_applied:
            self.log.warning(f"reloaded configuration except {'; '.join(not_applied)}", config=settings.source)
        else:
            self.log.notice("reloaded configuration")
        self.notifier.ready(self.status_line())

    def _close_roles(self) -> None:
        for r in reversed(self.roles):
            try:
                r.close()
            except Exception as e:  # closing one role must not keep the others' leases
                self.log.error(f"closing {r.name} failed: {e}")
        self._held.release()  # after the roles: nothing of theirs runs once another process may take over


def _on_a_terminal() -> bool:
    """``steadqd run`` in a shell: Ctrl-C is what the person types; under systemd it is a signal."""
    try:
        return sys.stdin.isatty() or sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
