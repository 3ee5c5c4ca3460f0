"""``steadq lease``, ``ack``, ``retry``, ``bury`` (one job, through a handle file) and ``work``.

``lease`` claims one job and may write its handle file; ``ack``, ``retry``
and ``bury`` read that file back in another process and settle the job.
``work`` is the whole loop for a shell user: it leases jobs on N threads,
runs a command per job with the payload on its stdin, renews the lease
while it runs, and settles by the command's exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from steadqd.backend import Backend
from steadqd.cli.common import (
    CliError,
    Interrupts,
    Parser,
    Subcommands,
    add_queue_command,
    duration_in,
    err,
    error_code,
    failure,
    int_in,
    open_queue,
    os_exit_code,
    out,
    read_user_file,
    write_atomic,
)
from steadqd.constants import MAX_LEASE_NS, MIN_LEASE_NS, NS_PER_SECOND, U16_MAX, U64_MAX, AckResult
from steadqd.daemon.worker.renew import interval as renew_interval
from steadqd.daemon.worker.renew import renew
from steadqd.durations import format_duration
from steadqd.errors import LeaseLost, NotCommitted, OutcomeUnknown, SteadQError

# lease --duration and work --lease: a lease the format can hold, checked alike for both
_LEASE_DURATION = duration_in(MIN_LEASE_NS // NS_PER_SECOND, MAX_LEASE_NS // NS_PER_SECOND, "lease duration")
_SETTLERS = "ack, retry and bury"
_HANDLE_HELP = "the handle file lease wrote (lease --handle-file)"


def add_lease(sub: Subcommands) -> None:
    s = add_queue_command(sub, "lease", "claim one job", "steadq lease /srv/q --handle-file h.json", run=cmd_lease)
    s.add_argument(
        "--duration",
        "--duration-seconds",
        dest="duration_seconds",
        type=_LEASE_DURATION,
        default=30.0,
        metavar="DURATION",
        help="how long the lease lasts: 30s, 5m, 1h, or seconds",
    )
    s.add_argument("--handle-file", default=None, metavar="FILE", help=f"write the lease handle here for {_SETTLERS}")
    s.add_argument(
        "--ticket-out", default=None, metavar="FILE", help="on outcome unknown, write the ticket for resolve here"
    )


def _add_settler(
    sub: Subcommands, name: str, help_text: str, run: Callable[[argparse.Namespace], int], example_options: str = ""
) -> Parser:
    """One of ack, retry and bury: a queue command that settles the job of the handle file ``lease`` wrote."""
    s = add_queue_command(sub, name, help_text, f"steadq {name} /srv/q --handle-file h.json{example_options}", run=run)
    s.add_argument("--handle-file", required=True, metavar="FILE", help=_HANDLE_HELP)
    return s


def add_ack(sub: Subcommands) -> None:
    _add_settler(sub, "ack", "acknowledge a leased job", cmd_ack)


def add_retry(sub: Subcommands) -> None:
    s = _add_settler(sub, "retry", "give a leased job back (now or later)", cmd_retry, " --after 1m")
    s.add_argument(
        "--after",
        "--after-seconds",
        dest="after_seconds",
        type=duration_in(0, float(U64_MAX), "delay"),
        default=None,
        metavar="DURATION",
        help="make the job leasable again only after this long (90s, 15m, 2h, or seconds); default: now",
    )


def add_bury(sub: Subcommands) -> None:
    s = _add_settler(sub, "bury", "dead-letter a leased job", cmd_bury, " --reason 1")
    s.add_argument(
        "--reason",
        type=int_in(0, U16_MAX, "reason"),
        default=0,
        metavar="N",
        help="dead reason 0-4 (1 consumer rejected, 2 permanent failure, ...); others are recorded as 0",
    )


def add_work(sub: Subcommands) -> None:
    s = add_queue_command(
        sub,
        "work",
        "run a command for every job (payload on its stdin)",
        "steadq work /srv/q --concurrency 4 -- ./handle.sh",
        run=cmd_work,
    )
    s.add_argument(
        "--concurrency", type=int_in(1, 4096, "concurrency"), default=1, metavar="N", help="jobs run at once"
    )
    s.add_argument(
        "--lease",
        "--lease-seconds",
        dest="lease_seconds",
        type=_LEASE_DURATION,
        default=60.0,
        metavar="DURATION",
        help="each job's lease, renewed every half of it while the command runs (1m, 90s, or seconds)",
    )
    s.add_argument("--once", action="store_true", help="run one job (or none) and exit with its result")


# =========================================================================== one job through a handle file


def load_handle(handle_file: str, q: Backend) -> Any:
    """Read and check a handle file: unreadable -> OS mapping, malformed or foreign -> 1."""
    try:
        raw = read_user_file(handle_file)
    except OSError as e:
        raise CliError(f"cannot read handle file {handle_file}: {e.strerror}", os_exit_code(e)) from e
    try:
        lease, queue_id = q.lease_from_handle(raw.decode("utf-8"))
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
    if isinstance(e, LeaseLost):
        return CliError("lease lost", 1)
    if isinstance(e, OutcomeUnknown):
        return CliError(["outcome unknown", f"  {e.message}"], 2)
    if isinstance(e, NotCommitted):
        return CliError(f"not committed: {e.message}", e.exit_code)
    return failure("not committed", e)


def cmd_lease(a: argparse.Namespace) -> int:
    q = open_queue(a.path)  # the duration's range was checked by its argument type
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
                write_atomic(a.handle_file, q.handle_text(lease))
            except OSError as e:
                raise CliError(f"failed to write handle file {a.handle_file}: {e.strerror}", 6) from e
        else:
            err(*_unsettleable(a, q, lease))
        out(
            f"job_id: {lease.job_id}",
            f"generation: {lease.generation}",
            f"attempt: {lease.attempt}/{lease.max_attempts}",
        )
        return 0
    finally:
        q.close()


def _unsettleable(a: argparse.Namespace, q: Backend, lease: Any) -> list[str]:
    """What a lease without a handle file did, said on stderr (stdout stays the reference's).

    Why: such a lease cannot be acked, retried or buried by anyone, yet it
    used up one of the job's attempts; a user trying ``steadq lease Q`` to
    look at the next job should learn that, and where the leased file is
    until it expires."""
    where = json.loads(q.handle_text(lease)).get("exact_source_path", "?")
    return [
        f"note: no --handle-file, so nothing can {_SETTLERS.replace(' and ', ' or ')} this lease; "
        f"it used attempt {lease.attempt} of {lease.max_attempts}",
        f"note: the lease is {os.path.join(a.path, where)}; the job is leasable again when it expires "
        f"in {format_duration(a.duration_seconds)} (steadq inspect {a.path} {lease.job_id})",
    ]


def _scan_quarantined(q: Backend) -> list[str]:
    """One line per object the last lease scan moved to quarantine."""
    return [
        f"corrupt object {path} quarantined as {qname} (reason 0x{reason:04x})"
        for path, reason, qname in q.quarantined_in_last_scan()
    ]


def _settle(a: argparse.Namespace, action: Callable[[Backend, Any], str]) -> int:
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
    def act(q: Backend, lease: Any) -> str:
        return "acked" if q.ack(lease) is AckResult.ACKED else "already acked (idempotent success)"

    return _settle(a, act)


def cmd_retry(a: argparse.Namespace) -> int:
    def act(q: Backend, lease: Any) -> str:
        if a.after_seconds is None:
            q.retry(lease)
        else:
            # wall floor + S x 10^9, saturating: anything past 2^63-1 ns is refused by the library.
            q.retry(lease, delay=float(min(a.after_seconds, U64_MAX // NS_PER_SECOND)))
        return "retried"

    return _settle(a, act)


def cmd_bury(a: argparse.Namespace) -> int:
    reason = a.reason if a.reason <= 4 else 0  # cli.md: only 0-4 are honoured, anything else is 0x0000

    def act(q: Backend, lease: Any) -> str:
        q.bury(lease, reason=reason)
        return "buried"

    return _settle(a, act)


# =========================================================================== work


class _NullSink:
    """A write-only sink: verifying a payload without holding it."""

    def write(self, b: bytes) -> int:
        return len(b)


def _settled_code(settle: Callable[[], object]) -> int:
    """``work``'s result code for one settling call (ack, or a retry now): 0, 1 lease lost, 2 outcome unknown."""
    try:
        settle()
        return 0
    except LeaseLost:
        return 1
    except OutcomeUnknown:
        return 2
    except SteadQError as e:
        return e.exit_code


# How long a command may take to end after steadq work passed it the signal that stopped work.
_STOP_GRACE_S = 10.0


def _stop_command(proc: subprocess.Popen[bytes], signum: int, since: float | None) -> float:
    """Pass the signal to the command once, then SIGKILL it after the grace; returns when it was passed."""
    now = time.monotonic()
    if since is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)
        return now
    if now - since > _STOP_GRACE_S:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    return since


def _retry_stopped(q: Backend, lease: Any, signal_name: str) -> int:
    """Give back a job whose command the signal stopped, and say where it went."""
    head = f"work: interrupted by {signal_name}: job {lease.job_id}: its command was stopped"
    try:
        state = q.retry(lease)
    except SteadQError as e:
        err(f"{head}; giving the job back failed: {e.message}")
        return 1 if isinstance(e, LeaseLost) else error_code(e)
    err(f"{head}; the job is now {state} (attempt {lease.attempt} of {lease.max_attempts} used)")
    return 0


def work_one(q: Backend, lease: Any, command: list[str], lease_seconds: float, stop: Interrupts) -> int:
    """Run ``command`` for one leased job and settle it; returns the job's result code.

    Why the command is stopped with ``work``: left running, it would outlive
    the lease's renewals and run again under the next lease, while nothing
    settles this one until it expires."""
    # 2. verified payload (full hash first; a corrupt payload is quarantined by the library)
    try:
        q.copy_payload(lease, _NullSink())  # type: ignore[arg-type]
        fd, offset = q.open_leased_payload(lease)
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
        return max(127, _settled_code(lambda: q.retry(lease)))
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
    # 4. poll every 50 ms, renew every S/2 (the lease keeper: steadqd.daemon.worker.renew)
    renewing = True
    interval = renew_interval(lease_seconds, lease_seconds / 2)
    next_renew = time.monotonic() + interval
    stopped_at: float | None = None
    try:
        while True:
            try:
                code = proc.wait(timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                pass
            if stop.signum is not None:
                stopped_at = _stop_command(proc, stop.signum, stopped_at)
            if renewing and time.monotonic() >= next_renew:
                next_renew += interval
                r = renew(q, lease, lease_seconds)
                lease = r.lease  # a bucket's renewal is a new generation, which ack needs
                if r.lost or r.unknown:
                    assert r.error is not None
                    err(f"work: job {lease.job_id}: renew failed, no further renewals: {r.error.message}")
                    renewing = False
                elif r.error is not None:
                    err(f"work: job {lease.job_id}: renew not committed (will retry): {r.error.message}")
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
        return _settled_code(lambda: q.ack(lease))  # Acked or AlreadyAcked
    if stopped_at is not None:
        given_back = _retry_stopped(q, lease, stop.name)
    else:
        given_back = _settled_code(lambda: q.retry(lease))
    return max(code or 1, given_back)


def _worker(
    path: str, command: list[str], lease_seconds: float, once: bool, stop: Interrupts, results: list[int], idx: int
) -> None:
    try:
        q = open_queue(path, deferred=True)
    except CliError as e:
        err(*e.lines)
        results[idx] = e.code
        return
    try:
        while stop.signum is None:
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
            result = work_one(q, lease, command, lease_seconds, stop)
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
    with Interrupts() as stop:
        # From here a signal is noted: each worker stops leasing, stops its command and gives its job back.
        stop.hold()
        threads = [
            threading.Thread(
                target=_worker, args=(a.path, command, a.lease_seconds, a.once, stop, results, i), daemon=True
            )
            for i in range(a.concurrency)
        ]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    if stop.signum is not None:
        return stop.exit_code
    return max(results)


COMMANDS = {"lease": add_lease, "ack": add_ack, "retry": add_retry, "bury": add_bury, "work": add_work}
