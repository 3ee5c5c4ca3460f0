"""The renew step: the one lease keeper, for the spawner, ``steadq work`` and the Python worker API.

A job's lease must be renewed for as long as it is prepared and run, or
recovery hands the job to someone else while it still runs here. Every
renewal outside the backends goes through :func:`renew`, which says what
became of it as a :class:`Renewal`:

When
    Every :func:`interval` seconds: a third of the lease unless the queue
    or the caller says otherwise (``worker.renew_every``, ``renew_every=``;
    ``steadq work`` renews every half, as its ``--lease`` help says). Two
    renewals can fail in a row and the lease still holds.

On which handle
    On a handle no other thread is using at the time: the spawner renews a
    running job on its loop's handle and a claim waiting for its payload
    copy on the claiming thread's (claim.py), the Python worker API on a
    renewing thread's own (steadqd.tasks), ``steadq work`` on its worker
    thread's. A renewal never waits behind another thread's call.

The lease to use afterwards
    :attr:`Renewal.lease` is the lease to settle (and renew) with from then
    on. On a bucket queue a renewal is a new generation of the claim and the
    old one is fenced off, so the caller must replace its handle; on the
    filesystem it is the same lease.

What a failure means
    ``not committed`` (NotCommitted): nothing changed; the lease is still
    ours until its deadline, so the caller tries again (a full disk may
    clear). ``lost`` (LeaseLost): the lease is whoever claims the job next:
    the run is never settled by us, only logged. ``unknown``
    (OutcomeUnknown): the handle is poisoned and whether the renewal took
    effect is not known; the spawner and ``steadq work`` treat the lease as
    lost, the Python worker API reopens its handle and tries again. Any other
    error passes through to the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from steadqd.backend import Backend, LeaseHandle
from steadqd.errors import LeaseLost, NotCommitted, OutcomeUnknown, SteadQError

__all__ = ["Renewal", "interval", "renew"]


def interval(lease: float, renew_every: float | None = None) -> float:
    """Seconds between two renewals of a ``lease``-second lease: ``renew_every``, else a third of it."""
    return renew_every if renew_every is not None else lease / 3


@dataclass(frozen=True)
class Renewal:
    """What one renewal did: the lease to use from now on, and the error if it failed."""

    lease: LeaseHandle
    error: SteadQError | None = None

    @property
    def lost(self) -> bool:
        """The lease is someone else's: stop renewing and never settle it."""
        return isinstance(self.error, LeaseLost)

    @property
    def unknown(self) -> bool:
        """The handle is poisoned and the renewal may or may not have taken effect."""
        return isinstance(self.error, OutcomeUnknown)

    @property
    def not_committed(self) -> bool:
        """Nothing changed: the lease is still ours until its deadline; try again later."""
        return isinstance(self.error, NotCommitted)


def renew(q: Backend, lease: LeaseHandle, duration: float) -> Renewal:
    """Renew ``lease`` for ``duration`` seconds from now on ``q``; see the module docstring for the outcomes."""
    try:
        return Renewal(q.renew(lease, duration=duration))
    except (LeaseLost, OutcomeUnknown, NotCommitted) as e:
        return Renewal(lease, e)
