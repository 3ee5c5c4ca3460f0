"""``BucketBackend``: a bucket queue as ``steadqd.backend`` hands it to the programs.

Why a subclass of :class:`~steadqd.s3.handle.BucketQueue` and not more
methods on it: the handle is the protocol's facade (enqueue, lease, renew,
ack, retry, bury), and what is added here is what the command line needs on
top, a handle file that a later process turns back into a lease, and where a
published job is stored. The rest of the contract is delegated to the
modules that do it (the views to ``views``, the dead letters and findings to
``admin``, recovery and fsck to ``recovery`` and ``repair``, the ready watch
to ``watch``); what a bucket cannot do is refused with
:class:`~steadqd.errors.NotSupportedHere` naming the operation, so that a
tool never reports "nothing found" about a bucket it did not look at.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, BinaryIO, NoReturn, cast

from steadqd.constants import (
    DEFAULT_RECEIPT_RETENTION_NS,
    DEFAULT_TEMP_TTL_NS,
    ID_BYTES,
    NS_PER_SECOND,
    Cancellation,
)
from steadqd.errors import (
    InvalidInput,
    LeaseLost,
    NotCommitted,
    NotSupportedHere,
    OutcomeUnknown,
    StoreProfileViolation,
)
from steadqd.s3 import admin, census, keys, views
from steadqd.s3 import cancel as bucket_cancel
from steadqd.s3.clock import WatermarkUnreadable, beacon_floor
from steadqd.s3.fsck import FsckReport, fsck
from steadqd.s3.handle import BucketQueue
from steadqd.s3.layout import QueueLayout
from steadqd.s3.lease import Lease
from steadqd.s3.records import QUEUE_ID_BYTES, TOKEN_BYTES, ClaimRecord, JobRecord
from steadqd.s3.recovery.driver import check_phases, recovery_setting, run_recovery
from steadqd.s3.recovery.sweep import Budget, RecoveryReport
from steadqd.s3.watch import (
    DEFAULT_POLL_MAX_S,
    DEFAULT_RING_INTERVAL_S,
    BucketReadyWatch,
    check_poll_max,
    check_ring_interval,
)

__all__ = ["BucketBackend", "HANDLE_FORMAT"]

# Names the handle-file shape, so that a filesystem queue's handle given to a
# bucket queue (or the other way round) is refused by name, not misread.
HANDLE_FORMAT = "stowq-lease/1"


def _refuse(operation: str) -> NoReturn:
    raise NotSupportedHere(
        f"{operation} is not yet supported for bucket queues (s3://); docs/stowq.md, Status, says what is"
    )


def _field(doc: Mapping[str, Any], name: str, kind: type) -> Any:
    value = doc.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidInput(f"field {name!r} is missing or not a {kind.__name__}")
    return value


def _hex(doc: Mapping[str, Any], name: str, length: int) -> bytes:
    text = _field(doc, name, str)
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != length or raw.hex() != text:
        raise InvalidInput(f"field {name!r} is not {2 * length} lowercase hex digits")
    return raw


class BucketBackend(BucketQueue):
    """One open bucket queue with the backend contract's method set; what it cannot do yet, it refuses."""

    def __init__(
        self,
        layout: QueueLayout,
        *,
        url: str,
        idle_poll_max: float = DEFAULT_POLL_MAX_S,
        doorbell_interval: float = DEFAULT_RING_INTERVAL_S,
        receipt_retention: float = DEFAULT_RECEIPT_RETENTION_NS / NS_PER_SECOND,
        dead_retention: float | None = None,
        temp_ttl: float = DEFAULT_TEMP_TTL_NS / NS_PER_SECOND,
        **handle: Any,
    ) -> None:
        super().__init__(layout, **handle)
        self._url = url.rstrip("/")
        self._idle_poll_max = check_poll_max(idle_poll_max)
        self._doorbell_interval = check_ring_interval(doorbell_interval)
        self._recovery = recovery_setting(
            receipt_retention, dead_retention, temp_ttl, handle.get("floor_staleness_s", 1.0)
        )

    @property
    def path(self) -> str:
        """The queue's URL as it was given (``s3://BUCKET/PREFIX``), which every message names."""
        return self._url

    # -- what the command line needs beyond the protocol ------------------------------

    def enqueue_detailed(self, payload: Any, **options: Any) -> tuple[str, str]:
        job_id = self.enqueue(payload, **options)
        return job_id, f"{self.path}/{self.job_key(job_id)}"

    def handle_text(self, lease: Lease) -> str:
        """The lease as JSON; its ``worker_token`` is the proof of holding, so the CLI writes it mode 0600.

        Only what identifies the claim is written: ``lease_from_handle``
        reads the claim and the job back from the store, which stay the truth.
        """
        claim = keys.claim_key(lease.shard, lease.job_id_bytes, lease.generation)
        doc = {
            "format": HANDLE_FORMAT,
            "queue_id": self.queue_id,
            "job_id": lease.job_id,
            "generation": lease.generation,
            "worker_token": lease.worker_token.hex(),
            "exact_source_path": claim,
        }
        return json.dumps(doc, indent=2) + "\n"

    def lease_from_handle(self, text: str) -> tuple[Lease | None, str | None]:
        """The lease a handle file names, re-read from its claim; (None, its queue) for another queue's handle."""
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise InvalidInput(f"not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise InvalidInput("not a JSON object")
        if doc.get("format") != HANDLE_FORMAT:
            raise InvalidInput(f"not a bucket queue's lease (its format is not {HANDLE_FORMAT!r})")
        queue_id = _hex(doc, "queue_id", QUEUE_ID_BYTES).hex()
        if queue_id != self.queue_id:
            return None, queue_id
        job_id = _hex(doc, "job_id", ID_BYTES)
        generation = _field(doc, "generation", int)
        token = _hex(doc, "worker_token", TOKEN_BYTES)
        if generation < 1:
            raise InvalidInput(f"field 'generation' is {generation}; generations start at 1")
        shard = keys.shard_of(self.layout.queue_id, job_id, self.layout.format.shard_count)
        claim_rel = keys.claim_key(shard, job_id, generation)
        found = self.layout.read(claim_rel)
        if found is None:
            raise LeaseLost(f"{claim_rel}: the claim is gone (its job was settled and collected)")
        claim, claim_meta = found
        if not isinstance(claim, ClaimRecord) or not hmac.compare_digest(claim.worker_token, token):
            raise InvalidInput(f"the worker_token is not the one of {claim_rel}")
        job_rel = keys.job_key(shard, job_id)
        job = self.layout.read(job_rel)
        if job is None:
            raise LeaseLost(f"{job_rel}: the job is gone (settled and collected)")
        lease = Lease(
            job_id_bytes=job_id,
            shard=shard,
            generation=generation,
            attempt=claim.attempt,
            worker_id=claim.worker_id,
            worker_token=token,
            lease_duration_ns=claim.lease_duration_ns,
            claim_store_time_ns=self.layout.store_time(claim_rel, claim_meta),
            job=cast(JobRecord, job[0]),
            job_store_time_ns=job[1].store_time_ns,
        )
        return lease, queue_id

    def quarantined_in_last_scan(self) -> list[tuple[str, int, str]]:
        """Always empty: a bucket scan records each corrupt object it meets as a ``quarantine/`` finding
        and logs it to the journal as it does (``quarantine.flag``); it does not hand them back yet."""
        return []

    def open_leased_payload(self, lease: Lease) -> tuple[int, int]:
        """An anonymous in-memory file holding the verified payload, at offset 0; the caller closes it.

        Why a copy: a bucket has no file to hand a child, and the payload is
        read whole to be verified anyway, so the copy is the verified bytes.
        """
        data = self.read_payload(lease)
        fd = os.memfd_create(f"steadq-{lease.job_id}", os.MFD_CLOEXEC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except BaseException:
            os.close(fd)
            raise
        return fd, 0

    @property
    def last_scan(self) -> None:
        """None: the findings of a scan go to the journal as they are made (see ``quarantined_in_last_scan``)."""
        return None

    def batch(self) -> contextlib.nullcontext[None]:
        """Nothing to share: every create is durable when the store answers it."""
        return contextlib.nullcontext()

    def sync(self) -> None:
        """Nothing is buffered: every create is durable when the store answers it."""

    # -- recovery, and the watches a bucket does (or does not) need ---------------------

    def recover(
        self, budget_ops: int = 1000, budget_ms: int = 100, *, phases: tuple[str, ...] | None = None
    ) -> RecoveryReport:
        """One bounded pass (steadqd/s3/recovery/repair.py): sweeps, retention GC, a slice of the repair scan.

        ``budget_ops`` counts store requests. The floor is established first
        and not charged; a store that cannot give one is reported, not raised.
        """
        check_phases(phases)
        try:
            floor = self._clock.floor()
        except (NotCommitted, OutcomeUnknown, StoreProfileViolation) as exc:
            report = RecoveryReport()
            report.error(exc, f"establishing the store-time floor of {self.path}")
            return report
        budget = Budget(max_ops=budget_ops, budget_ms=budget_ms)
        return run_recovery(self.layout, floor, budget, self._recovery, phases)

    def ready_watch(self) -> BucketReadyWatch:
        """A polling watch with a doorbell (``steadqd.s3.watch``); it starts at ``watch_missing()``."""
        return BucketReadyWatch(self.layout, poll_max_s=self._idle_poll_max, ring_interval_s=self._doorbell_interval)

    def delayed_watch(self, report: Callable[[str, str], None]) -> NoReturn:
        raise NotSupportedHere(
            "a delayed watch is not needed on a bucket queue: a delayed job becomes claimable by store time "
            "at its claim, with no promotion (docs/stowq.md, Running the daemons on a bucket)"
        )

    def trusted_wall_ns(self) -> int:
        """The store-time floor: proven by the store's own clock, so there is no host clock to bound it by."""
        return self.wall_floor_ns()

    # -- operator views (steadqd.s3.views and .census: each function's docstring states its LISTs and GETs) ----

    def stats(self) -> dict[str, views.StateStats]:
        """Jobs per state derived from their graphs by this handle's floor, and the quarantine findings."""
        return census.stats(self.layout, self.wall_floor_ns())

    def entry_stats(self) -> dict[str, views.StateStats]:
        """``stats`` counted as the filesystem reference counts: running jobs are in ready."""
        return census.entry_stats(self.layout, self.wall_floor_ns())

    def list_jobs(self, states: Collection[str], *, metadata: bool = False) -> Iterator[views.JobEntry]:
        """Every job in ``states``, streamed shard by shard, each derived from its verified graph;
        ``metadata`` is refused at once: a StowQ/1 job record has no metadata map."""
        if metadata:
            raise InvalidInput("the jobs of a bucket queue carry no metadata (a StowQ/1 job record has none)")
        return census.list_jobs(self.layout, states, self.wall_floor_ns())

    def inspect(self, job_id: str) -> list[views.JobObject]:
        return views.inspect_job(self.layout, job_id, self.wall_floor_ns())

    def inspect_detailed(self, job_id: str) -> list[views.JobObject]:
        return views.inspect_job(self.layout, job_id, self.wall_floor_ns())

    def job_story(self, job_id: str, payload_head: int = 4096) -> views.JobStory | None:
        return views.job_story(self.layout, job_id, self.wall_floor_ns(), payload_head)

    def copy_job_payload(self, job_id: str, out: BinaryIO) -> int:
        return views.copy_job_payload(self.layout, job_id, out)

    def fsck(self, deep: bool = False, repair: bool = False) -> FsckReport:
        """Every object checked (steadqd/s3/recovery/repair.py: fsck); ``repair`` regenerates indexes and records findings."""
        try:
            floor = self._clock.floor()
        except WatermarkUnreadable:
            # The scan reports it (and a repair rebuilds it); the scan needs only a floor, which a beacon proves.
            floor = beacon_floor(self.layout)
        return fsck(self.layout, floor, deep=deep, repair=repair)

    def resolve(self, ticket: Any, stabilize: bool = False) -> NoReturn:
        _refuse("resolving a ticket (every bucket operation resolves its own outcome by reading the key)")

    # -- dead letters and quarantine findings (steadqd.s3.admin) -------------------------

    def export_dead(self, job_id: str, out_path: str, *, payload_only: bool = False) -> int:
        return admin.export_dead(self.layout, job_id, out_path, payload_only=payload_only)

    def remove_dead(self, job_id: str) -> None:
        admin.remove_dead(self.layout, job_id)

    def requeue_dead(self, job_id: str, *, max_attempts_reset: bool = True) -> str:
        """A new job with the dead job's verified payload (a terminal record is forever); returns its URL."""
        _, rel = admin.requeue_dead(self.layout, job_id, max_attempts_reset=max_attempts_reset)
        return f"{self.path}/{rel}"

    def list_quarantine(self) -> Iterator[admin.QuarantinedObject]:
        return admin.list_quarantine(self.layout)

    def inspect_quarantine(self, quarantine_id: str) -> admin.QuarantinedObject:
        return admin.inspect_quarantine(self.layout, quarantine_id)

    def export_quarantine(self, quarantine_id: str, out_path: str) -> int:
        return admin.export_quarantine(self.layout, quarantine_id, out_path)

    # -- cancel (s3/cancel.py) ---------------------------------------------------------

    def cancel(self, job_id: str) -> Cancellation:
        return bucket_cancel.cancel(self.layout, job_id, self._floor())

    def was_cancelled(self, lease: Lease) -> bool:
        """A pending cancel request is carried out here by the holder: its lease buried, reason cancelled."""
        return bucket_cancel.carry_out(self.layout, lease, self._floor())

    def lease_key(self, lease: Lease) -> str:
        return keys.claim_key(lease.shard, lease.job_id_bytes, lease.generation)

    def remove_quarantine(self, quarantine_id: str) -> None:
        admin.remove_quarantine(self.layout, quarantine_id)
