"""What settling a verdict does to a lease, and the sentences the journal tells about it.

Why apart from the worker role (steadqd.daemon.worker.role): the role decides
*when* a run is settled (group commit, trying again after NotCommitted,
giving up on a lost lease); this module is *what* settling a verdict does
to the queue, and the one home of the lines a person reads about it
("job 3d1f6a0c finished: ack (exit 0, 1.0 s, attempt 1/3)", "... buried:
exit 100 (consumer_rejected)"), which docs/operations.md and the system
tests quote. The verdict itself comes from the exit policy
(steadqd.daemon.worker.policy).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from steadqd.backend import Backend, LeaseHandle
from steadqd.backoff import RetryPolicy
from steadqd.constants import DeadReason
from steadqd.daemon.config import WorkerConfig
from steadqd.daemon.journal import INFO, WARNING, reason_name, short_id
from steadqd.daemon.worker.policy import Verdict
from steadqd.errors import OutcomeUnknown

__all__ = ["FollowUp", "Tally", "apply_verdict", "retry_policy", "run_story", "ticket_text"]

FollowUp = tuple[int, str, dict[str, object]] | None  # (priority, message, fields) of a line to log


@dataclass
class Tally:
    """The worker's counts for STATUS=: jobs acknowledged, dead-lettered, and given back."""

    done: int = 0
    failed: int = 0
    retried: int = 0


def retry_policy(cfg: WorkerConfig) -> RetryPolicy:
    r = cfg.retry
    base = max(1, round(r.backoff_base * 1000))
    return RetryPolicy(base_ms=base, cap_ms=max(base, round(r.backoff_max * 1000)), use_jitter=r.jitter)


def apply_verdict(
    q: Backend, lease: LeaseHandle, cfg: WorkerConfig, outcome: Verdict, tally: Tally, ended: str | None = None
) -> FollowUp:
    """Ack, bury or retry the lease; returns the line that tells what followed (logged after ``job finished``).

    ``ended`` is how the command ended ("exit 100"), when it ran. The
    queue's errors pass through: the caller knows whether to try again.
    """
    if outcome is Verdict.ACK:
        q.ack(lease)
        tally.done += 1
        return None
    if outcome is Verdict.BURY:
        reason = cfg.exit_status.bury_reason
        q.bury(lease, reason=reason)
        tally.failed += 1
        why = f"{ended} ({reason_name(reason)})" if ended else reason_name(reason)
        return WARNING, f"job {short_id(lease.job_id)} buried: {why}", {"reason": f"0x{reason:04x}"}
    state = q.retry(lease, policy=retry_policy(cfg))
    if state == "dead":
        tally.failed += 1
        text = (
            f"job {short_id(lease.job_id)} buried: no attempts left"
            f" ({lease.attempt}/{lease.max_attempts}, {reason_name(DeadReason.ATTEMPTS_EXHAUSTED)})"
        )
        return WARNING, text, {"reason": f"0x{DeadReason.ATTEMPTS_EXHAUSTED:04x}"}
    tally.retried += 1
    return INFO, f"job {short_id(lease.job_id)} retried: {state}", {"state": state}


def run_story(lease: LeaseHandle, ended: str, *, timed_out: bool, duration_ms: object) -> str:
    """How the run ended, for a person: ``exit 0, 1.0 s, attempt 1/3``."""
    how = f"timed out, {ended}" if timed_out else ended
    seconds = duration_ms / 1000 if isinstance(duration_ms, int) else 0.0
    return f"{how}, {seconds:.1f} s, attempt {lease.attempt}/{lease.max_attempts}"


def ticket_text(e: OutcomeUnknown) -> str | None:
    """The outcome-unknown ticket as one journal field, so an operator can resolve it by hand."""
    t = getattr(e, "ticket", None)
    if t is None:
        return None
    for attr in ("to_json", "encode"):
        fn = getattr(t, attr, None)
        if callable(fn):
            with contextlib.suppress(Exception):
                out = fn()
                return out.hex() if isinstance(out, bytes) else str(out)
    return repr(t)
