"""The exit policy: how a finished run of a job's command settles its lease.

This is the one place that turns what happened to a command (its exit
status, a timeout, a lost lease) and the queue's ``worker.exit_status``
into an outcome. The worker only applies the answer, and the table in
tests/unit/test_verdict.py pins every case, so a change of policy is a
change here and in that table, never a string compared somewhere else.
"""

from __future__ import annotations

import enum

from steadqd.daemon.config import ExitPolicy

__all__ = ["Verdict", "verdict"]


class Verdict(enum.StrEnum):
    """What the worker does with the lease of a run that ended.

    A ``StrEnum``: the value is the word the journal shows (``verdict=retry``).
    """

    ACK = "ack"  # done: the job becomes a receipt
    RETRY = "retry"  # again later with back-off; the backend dead-letters it (reason 4) when no attempts are left
    BURY = "bury"  # dead-letter it now with the policy's bury_reason
    ABANDON = "abandoned"  # the lease is someone else's now: settle nothing


def verdict(status: int, *, timed_out: bool, lease_lost: bool, policy: ExitPolicy) -> Verdict:
    """The verdict on one run; ``status`` is ``Popen.returncode`` (``-N``: killed by signal N).

    A lost lease wins over everything: the job may already run elsewhere.
    A timeout is always retried, never buried: the run was cut short by
    the worker, not judged by the command (and its status is the kill's).
    Attempts are not looked at: retrying a job with none left is the
    backend's business, which dead-letters it atomically with reason 4.
    """
    if lease_lost:
        return Verdict.ABANDON
    if timed_out:
        return Verdict.RETRY
    if status < 0:  # death by a signal
        return Verdict(policy.other)
    if status in policy.ack:
        return Verdict.ACK
    if status in policy.bury:
        return Verdict.BURY
    if status in policy.retry:
        return Verdict.RETRY
    return Verdict(policy.other)
