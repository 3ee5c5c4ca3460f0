"""Notification commands: ``worker.on_bury`` and ``worker.on_retry``, run once per buried or retried job.

What they get
    The argv from the configuration, never anything of the job's as command
    text: job facts travel as data in the environment, the job's own
    (environment.py: ``STEADQ_JOB_ID``, ``STEADQ_META_*``, ``environment:``
    …) plus ``STEADQ_REASON``, ``STEADQ_EXIT_STATUS`` (empty when a signal
    ended the command; ``STEADQ_SIGNAL`` names it) and ``STEADQ_STDERR_FILE``,
    a read-only file with the command's last :data:`STDERR_TAIL` stderr lines
    as the job wrote them (they are the job's bytes: a notifier that shows
    them to a person escapes them). The command runs as the job's ``user:``
    and ``group:``.

Why they cannot hurt the job
    One starts only once the verdict has taken effect, so whatever it does,
    the job is already dead (or retried). Its exit status is logged, never
    acted upon. It runs in a session of its own, off the loop (its end is
    noticed through a pidfd, else a bounded poll), and the whole group is
    SIGKILLed at ``notify_timeout``. The stderr file lives in a per-job
    directory like a payload copy (payload.py), removed when the command
    ends or, after a SIGKILLed worker, by the next worker's start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from steadqd.daemon.journal import Log, short_id
from steadqd.daemon.service import Loop, Timer
from steadqd.daemon.worker import payload

__all__ = ["STDERR_TAIL", "Hooks"]

STDERR_TAIL = 20  # lines of the job's stderr handed to a notification command
POLL = 0.2  # s; how often the end of a command is looked for without a pidfd


class _Hook:
    """One running notification command."""

    def __init__(self, which: str, job_id: str, proc: subprocess.Popen[bytes], tmpdir: str, timeout: float) -> None:
        self.which, self.job_id, self.proc, self.tmpdir, self.timeout = which, job_id, proc, tmpdir, timeout
        self.timed_out = False
        self.pidfd: int | None = None
        self.timers: list[Timer] = []


class Hooks:
    """The role's running notification commands; :meth:`run` starts one and returns at once."""

    def __init__(self, loop: Loop, log: Log, guard: Callable[[Callable[[], None]], Callable[[], None]]) -> None:
        self.loop, self.log, self._guard = loop, log, guard
        self.running: dict[int, _Hook] = {}

    def run(
        self,
        which: str,
        argv: tuple[str, ...],
        env: Mapping[str, str],
        *,
        timeout: float,
        stderr_lines: Iterable[str],
        credentials: Mapping[str, Any],
        fields: Mapping[str, object],
    ) -> None:
        job_id = str(env.get("STEADQ_JOB_ID", ""))
        tmpdir = payload.make(job_id or "0" * 12)
        try:
            path = os.path.join(tmpdir, "stderr")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o400)
            with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write("".join(line + "\n" for line in stderr_lines))
                if "user" in credentials:
                    os.fchown(f.fileno(), credentials["user"], credentials["group"])
            if "user" in credentials:
                os.chown(tmpdir, credentials["user"], credentials["group"])
                os.chmod(tmpdir, 0o500)
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={**env, "STEADQ_STDERR_FILE": path},
                start_new_session=True,
                close_fds=True,
                **credentials,
            )
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            payload.remove(tmpdir)
            self.log.error(f"{which} for job {short_id(job_id)} could not start: {e}", **fields, hook=which)
            return
        hook = _Hook(which, job_id, proc, tmpdir, timeout)
        self.running[proc.pid] = hook
        hook.timers.append(self.loop.call_later(timeout, self._guard(lambda: self._timeout(hook))))
        try:
            hook.pidfd = os.pidfd_open(proc.pid)
            self.loop.add_reader(hook.pidfd, self._guard(lambda: self._check(hook)))
        except (OSError, AttributeError):  # no pidfds: a bounded poll
            hook.timers.append(self.loop.call_later(POLL, self._guard(lambda: self._poll(hook))))

    @property
    def busy(self) -> bool:
        return bool(self.running)

    def _timeout(self, hook: _Hook) -> None:
        if hook.proc.pid not in self.running:
            return
        hook.timed_out = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(hook.proc.pid, signal.SIGKILL)
        self._check(hook)

    def _poll(self, hook: _Hook) -> None:
        self._check(hook)
        if hook.proc.pid in self.running:
            hook.timers.append(self.loop.call_later(POLL, self._guard(lambda: self._poll(hook))))

    def _check(self, hook: _Hook) -> None:
        """Reap it once it has exited, killing what it left in its group while the zombie pins the group id."""
        if hook.proc.pid not in self.running:
            return
        try:
            if os.waitid(os.P_PID, hook.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return
        except ChildProcessError:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(hook.proc.pid, signal.SIGKILL)
        code = hook.proc.wait()
        self._end(hook)
        what = f"{hook.which} for job {short_id(hook.job_id)}"
        fields = {"job_id": hook.job_id, "hook": hook.which}
        if hook.timed_out:
            self.log.warning(f"{what} killed at its {hook.timeout:g}s timeout (the job is not changed)", **fields)
        elif code == 0:
            self.log.info(f"{what} exited 0", **fields)
        else:
            how = f"killed by signal {-code}" if code < 0 else f"exited {code}"
            self.log.warning(f"{what} failed: {how} (the job is not changed)", **fields, exit_status=code)

    def _end(self, hook: _Hook) -> None:
        self.running.pop(hook.proc.pid, None)
        for t in hook.timers:
            t.cancel()
        if hook.pidfd is not None:
            self.loop.remove_reader(hook.pidfd)
            os.close(hook.pidfd)
            hook.pidfd = None
        payload.remove(hook.tmpdir)

    def close(self) -> None:
        """Forced stop: kill every running notification command and reap it."""
        for hook in list(self.running.values()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(hook.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                hook.proc.wait(5)
            self.log.warning(f"{hook.which} for job {short_id(hook.job_id)} killed: the worker is stopping")
            self._end(hook)
