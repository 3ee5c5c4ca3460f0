"""Cancel on a bucket queue: only the claim chain's tail holder may write a job's terminal record.

Why not simply write the dead record
    StowQ/1 allows at most one terminal record per job, written by the holder
    of the chain's tail (an ack's receipt and a canceller's dead record,
    written side by side, would be two). So a cancel never writes a terminal
    record for a job someone else holds:

    * a job no one holds (ready) is *claimed* by the canceller, a claim like
      any worker's, and buried at once with reason ``cancelled``: the chain
      stays legal, the reference sees a claim and a dead record;
    * a job that is held (running) or not claimable yet (delayed, backing
      off) gets a *cancel request*: an empty object at
      ``outputs/.steadq-cancel/<job-id>``, in the application space
      namespace.md leaves to applications (no protocol key lives there, the
      repair scan and the reference never read it). The holder looks for it
      at every renewal, and a worker right after each claim; whoever finds it
      buries its own lease with reason ``cancelled`` (kills the command
      first if one runs) and deletes the request.

How soon: a cancel rings the queue's doorbell (s3/doorbell.py), so a worker
of the queue waiting on this host checks the requests of the jobs it runs at
once (one HEAD per running job, at most once per ``s3.doorbell_interval``):
a same-host cancel stops its command within about that interval. A holder on
another host hears of it at its next renewal (a third of the lease by default,
``worker.renew_every``); a delayed job when it is next claimed.

Requests do not outlive their job: the holder deletes the one it carries out,
and the one it finds for a job that settled meanwhile; a cancel that finds
the job settled deletes it; GC deletes it with the job's graph
(s3/recovery/gc.py). A request can never change a settled job.

Who may write a request: anyone who can write the bucket, who could as well
write a dead record; the body is never read, only the key's existence.
"""

from __future__ import annotations

from steadqd.constants import Cancellation, CancelResult, DeadReason
from steadqd.errors import ErrorKind, LeaseLost, NotFound, SteadQError
from steadqd.s3 import keys
from steadqd.s3.claim import Miss, claim_job
from steadqd.s3.doorbell import ring
from steadqd.s3.layout import QueueLayout
from steadqd.s3.lease import Lease
from steadqd.s3.settle import bury
from steadqd.s3.views import JobObject, inspect_job

__all__ = ["cancel", "carry_out", "request_key", "requested"]

CLAIM_NS = 30_000_000_000  # the canceller's own claim of a ready job: buried at once, held only that long
MAX_ROUNDS = 16  # a job that changes hands between our look and our claim is looked at again
_LIVE = ("ready", "leased", "delayed")


def request_key(job_id: str) -> str:
    return keys.cancel_request_key(bytes.fromhex(job_id))


def requested(layout: QueueLayout, job_id: str) -> bool:
    """Is there a cancel request for the job? (one HEAD)"""
    return layout.exists(request_key(job_id))


def cancel(layout: QueueLayout, job_id: str, floor: int) -> Cancellation:
    """Cancel ``job_id``: bury it now if no one holds it, else leave a request for its holder."""
    job = bytes.fromhex(job_id)
    shard = keys.shard_of(layout.queue_id, job, layout.format.shard_count)
    for _ in range(MAX_ROUNDS):
        objects = inspect_job(layout, job_id, floor)
        live = [o for o in objects if o.state in _LIVE]
        if not live:
            layout.store.delete(layout.key(request_key(job_id)))  # a request left for a job that settled
            return _settled(objects, job_id)
        state = live[-1].state
        if state == "ready":
            got = claim_job(layout, shard, job, floor_ns=floor, lease_duration_ns=CLAIM_NS)
            if isinstance(got, Miss):
                continue  # someone claimed it first, or it settled: look again
            bury(layout, got, floor_ns=floor, reason=DeadReason.CANCELLED)
            return Cancellation(CancelResult.CANCELLED, "ready")
        layout.store.put_if_absent(layout.key(request_key(job_id)), b"")
        ring(layout.queue_id.hex())  # best effort, never raises: a holder waiting on this host checks now
        return Cancellation(CancelResult.REQUESTED, state)
    raise SteadQError(f"cancel of job {job_id}: it kept changing hands; try again", ErrorKind.NOT_COMMITTED)


def _settled(objects: list[JobObject], job_id: str) -> Cancellation:
    states = {o.state: o for o in objects}
    if "receipt" in states:
        return Cancellation(CancelResult.ALREADY_ACKED, "receipt")
    if "dead" in states:
        reason = states["dead"].details.get("reason")
        return Cancellation(CancelResult.ALREADY_DEAD, "dead", None if reason is None else int(str(reason)))
    raise NotFound(f"not found: job {job_id}")


def carry_out(layout: QueueLayout, lease: Lease, floor: int) -> bool:
    """The holder's side: if the job's cancel was requested, bury our lease with reason cancelled; True if so.

    LeaseLost from the bury means the lease was not ours any more. If the job
    has settled (acked first, or buried), the request can change nothing and is
    deleted here; if someone else holds it now, it stays for them."""
    if not requested(layout, lease.job_id):
        return False
    try:
        bury(layout, lease, floor_ns=floor, reason=DeadReason.CANCELLED)
    except LeaseLost:
        if _terminal(layout, lease.job_id):
            layout.store.delete(layout.key(request_key(lease.job_id)))
        return False
    layout.store.delete(layout.key(request_key(lease.job_id)))
    return True


def _terminal(layout: QueueLayout, job_id: str) -> bool:
    """Has the job a terminal record (a receipt or a dead record)? Two HEADs."""
    job = bytes.fromhex(job_id)
    shard = keys.shard_of(layout.queue_id, job, layout.format.shard_count)
    return layout.exists(keys.receipt_key(shard, job)) or layout.exists(keys.dead_key(shard, job))
