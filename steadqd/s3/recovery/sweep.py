"""StowQ/1 sweeps (recovery.md): the expired-lease sweep over ``leases/`` and the delayed sweep over ``delayed/``.

Why *evaluate-and-prune* and not the timely variant (a takeover claim or a
doorbell per due entry): the errata allow either, and on a bucket the
takeover is the worker's business. A sweeper that took a claim would hold a
lease it does not run, spending an attempt and two more writes to give the
job back, and its correctness would rest on the same checks the claim path
makes anyway. Liveness does not need it: every worker's ordinary shard scan
lists ``jobs/`` and claims a job whose tail has expired (``claim.claim_job``
re-reads every authoritative object), so an index entry only has to be
re-evaluated against the authoritative records, counted, and deleted. The
one thing the sweep does write is what the claim path would also write on
the same evidence: the ``attempts_exhausted`` dead record of an expired
claim that was the job's last attempt, so a job nobody polls still ends.

Only *fully due* buckets are swept: a lease bucket whose end plus the skew
guard the floor has passed (every claim indexed there has expired), a
delayed bucket whose end the floor has passed. Keys list in bucket order
(fixed-width hex), so a walk stops at the first bucket not yet due; every
entry it reads is then deleted (stale, superseded, settled, or counted),
which is what makes a sweep resumable after any single operation: a pass cut
short by its budget leaves the rest to the next one, which starts at the
oldest entry left. Two sweepers at once race only to idempotent deletes and
to one create of the same dead record, so no lock and no cursor is needed.

Every store call of a pass is counted in its :class:`Budget` (operations and
milliseconds, as the filesystem sweeper gets them) by wrapping the store of
the layout the phases use (:func:`budgeted`), so no phase can forget to;
the phases stop between two entries once their share is spent.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import cast

from steadqd.constants import DeadReason
from steadqd.errors import CorruptRecord, InvalidKey, NotCommitted, OutcomeUnknown, StateExhausted
from steadqd.s3 import keys
from steadqd.s3.chain import AttemptsExhausted, next_claim
from steadqd.s3.claim import Unusable, chain_tail, read_checked, settle_dead
from steadqd.s3.keys import KeyKind, ParsedKey
from steadqd.s3.layout import QueueLayout
from steadqd.s3.records import ClaimRecord, FailRecord, JobRecord
from steadqd.s3.resolve import best_effort
from steadqd.s3.store.base import (
    LIST_PAGE_MAX,
    Committed,
    ListPage,
    ObjectMeta,
    ObjectStore,
    StoredObject,
    StoreProfile,
)
from steadqd.s3.timemath import bucket_end_ns, is_expired, saturating_add
from steadqd.view_records import RecoveryReport as SharedReport

__all__ = [
    "Budget",
    "BudgetedStore",
    "Exhausted",
    "INDEX_PAGE",
    "ObservedStore",
    "RecoveryReport",
    "budgeted",
    "checkpoint",
    "prune",
    "sweep_delayed",
    "sweep_leases",
    "walk",
]

# Keys asked for per LIST of an index plane: a pass rarely gets through more
# entries than this, and a page costs one request whatever its length.
INDEX_PAGE = min(100, LIST_PAGE_MAX)


class Exhausted(Exception):
    """The phase's budget ran out; raised between two pieces of work, never in the middle of one."""


@dataclass
class Budget:
    """Store operations and milliseconds one pass may spend.

    Every store call is counted (:class:`BudgetedStore`), but a phase is
    stopped only between two pieces of work (:meth:`check`, before an index
    entry, a job graph, a key of the repair scan), so that each phase of each
    pass finishes at least one: a pass spends its budget plus at most one
    piece of work, and never repeats the same unfinished piece forever. The
    clock starts at the first operation (the filesystem sweeper's rule).
    ``limit`` is the count the current phase may reach: the driver hands
    each phase a share.
    """

    max_ops: int
    budget_ms: int
    monotonic_ns: Callable[[], int] = time.monotonic_ns
    ops: int = 0
    limit: int = -1
    started_ns: int | None = None
    exhausted: bool = False
    _phase_start: int = 0

    def __post_init__(self) -> None:
        if self.limit < 0:
            self.limit = self.max_ops

    @property
    def left(self) -> int:
        return max(0, self.max_ops - self.ops)

    def out_of_time(self) -> bool:
        return self.started_ns is not None and self.monotonic_ns() - self.started_ns >= self.budget_ms * 1_000_000

    def spent(self) -> bool:
        return self.ops >= self.max_ops or self.out_of_time()

    def give(self, share: int) -> None:
        """Start a phase that may spend ``share`` more operations (at least one piece of work)."""
        self._phase_start = self.ops
        self.limit = min(self.max_ops, self.ops + share)

    def count(self) -> None:
        """One store call made (the clock starts with the first)."""
        if self.started_ns is None:
            self.started_ns = self.monotonic_ns()
        self.ops += 1

    def check(self) -> None:
        """Before a piece of work: raise Exhausted if the phase has spent its share (after its first piece)."""
        if self.ops > self._phase_start and (self.ops >= self.limit or self.out_of_time()):
            self.exhausted = True
            raise Exhausted


def checkpoint(budget: Budget | None) -> None:
    if budget is not None:
        budget.check()


class ObservedStore(ABC):
    """An ObjectStore that reports every call to :meth:`observe` before making it, and changes nothing else.

    Why a base class: the recovery budget charges every store call and the
    benchmarks count them by kind; each needs every method forwarded
    exactly, and a method added to the store protocol is then forwarded
    once, here. ``observe`` gets the operation (``list`` for a LIST) and
    the key or prefix.
    """

    def __init__(self, inner: ObjectStore) -> None:
        self._inner = inner

    @abstractmethod
    def observe(self, operation: str, key: str) -> None:
        """Called before each store call is made."""

    @property
    def profile(self) -> StoreProfile:
        return self._inner.profile

    @property
    def location(self) -> str:
        return self._inner.location

    def put_if_absent(self, key: str, body: bytes, *, sha256: bytes | None = None) -> Committed:
        self.observe("put_if_absent", key)
        return self._inner.put_if_absent(key, body, sha256=sha256)

    def put_if_match(self, key: str, body: bytes, etag: str, *, sha256: bytes | None = None) -> Committed:
        self.observe("put_if_match", key)
        return self._inner.put_if_match(key, body, etag, sha256=sha256)

    def get(self, key: str, byte_range: tuple[int, int] | None = None, *, max_bytes: int | None = None) -> StoredObject:
        self.observe("get", key)
        return self._inner.get(key, byte_range, max_bytes=max_bytes)

    def get_if_none_match(self, key: str, etag: str) -> StoredObject | None:
        self.observe("get_if_none_match", key)
        return self._inner.get_if_none_match(key, etag)

    def head(self, key: str) -> ObjectMeta:
        self.observe("head", key)
        return self._inner.head(key)

    def list_page(self, prefix: str, *, start_after: str | None = None, limit: int = LIST_PAGE_MAX) -> ListPage:
        self.observe("list", prefix)
        return self._inner.list_page(prefix, start_after=start_after, limit=limit)

    def delete(self, key: str) -> None:
        self.observe("delete", key)
        self._inner.delete(key)

    def close(self) -> None:
        self._inner.close()


class BudgetedStore(ObservedStore):
    """An ObjectStore that counts every call in a :class:`Budget`."""

    def __init__(self, inner: ObjectStore, budget: Budget) -> None:
        super().__init__(inner)
        self._budget = budget

    def observe(self, operation: str, key: str) -> None:
        self._budget.count()

    def close(self) -> None:
        """The inner store belongs to the handle, which closes it."""


def budgeted(layout: QueueLayout, budget: Budget) -> QueueLayout:
    """The same queue, with every store call charged to ``budget``."""
    return replace(layout, store=BudgetedStore(layout.store, budget))


@dataclass
class RecoveryReport(SharedReport):
    """What one bucket recovery pass did: the shared counts, and the bucket's own.

    The filesystem's names keep their meaning where a bucket has the same
    thing: ``temp_files_deleted`` counts orphan payloads (a payload whose
    enqueue never wrote its job record, the bucket's abandoned temp file),
    ``receipts_deleted``/``dead_deleted`` collected terminal graphs.
    ``leases_reaped`` counts expired claims whose job is claimable again, and
    ``delayed_promoted`` delayed jobs found due: on a bucket nothing moves,
    the index entry is deleted and the shard scan finds the job, so neither
    is a change. A receipt is one object (nothing to compact) and a bucket
    has no directories.
    """

    CHANGED = (
        "leases_to_dead",
        "temp_files_deleted",
        "receipts_deleted",
        "dead_deleted",
        "quarantined",
        "index_entries_pruned",
        "indexes_regenerated",
        "beacons_deleted",
    )

    index_entries_pruned: int = 0
    indexes_regenerated: int = 0
    beacons_deleted: int = 0
    shards_repaired: int = 0

    def error(self, exc: Exception, what: str) -> None:
        code = getattr(getattr(exc, "kind", None), "label", type(exc).__name__)
        self.errors.append((code, f"{what}: {exc}"))


def walk(
    layout: QueueLayout, prefix_rel: str, *, start_after: str | None = None, limit: int = INDEX_PAGE
) -> Iterator[tuple[str, ObjectMeta]]:
    """Every key under ``prefix_rel`` in store order, as (relative key, listing entry), page by page."""
    after = start_after
    while True:
        page = layout.list_page(prefix_rel, start_after=after, limit=limit)
        for meta in page.items:
            after = layout.relative(meta.key)
            yield after, meta
        if page.next_start_after is None:
            return
        after = layout.relative(page.next_start_after)


def prune(layout: QueueLayout, rel: str, report: RecoveryReport) -> None:
    """Delete an advisory entry; a failure is reported and the entry is simply met again next pass."""
    try:
        layout.store.delete(layout.key(rel))
    except (NotCommitted, OutcomeUnknown) as exc:
        report.error(exc, f"deleting {rel}")
        return
    report.index_entries_pruned += 1


def _due_entries(
    layout: QueueLayout, kind: KeyKind, width_ns: int, slack_ns: int, floor_ns: int
) -> Iterator[tuple[str, ParsedKey]]:
    """The entries of ``kind``'s plane in buckets whose end plus ``slack_ns`` the floor has reached, oldest first."""
    plane = keys.bucket_prefix(kind, 0).split("/")[0] + "/"
    for rel, _meta in walk(layout, plane):
        try:
            parsed = keys.parse_key(rel)
        except InvalidKey:
            continue  # not an index key: the repair scan's finding, never a sweep's decision
        if parsed.kind is not kind or parsed.bucket is None:
            continue
        try:
            due = saturating_add(bucket_end_ns(parsed.bucket, width_ns), slack_ns) <= floor_ns
        except StateExhausted:
            return  # the last bucket a u64 can hold: never due
        if not due:
            return  # buckets list in order: nothing after this one is due either
        yield rel, parsed


def _terminal(layout: QueueLayout, shard: int, job_id: bytes) -> bool:
    return layout.exists(keys.receipt_key(shard, job_id)) or layout.exists(keys.dead_key(shard, job_id))


def _lease_entry(layout: QueueLayout, parsed: ParsedKey, floor_ns: int, report: RecoveryReport) -> bool:
    """Re-evaluate one due lease entry; True when it is to be deleted (it always is, unless not yet expired)."""
    shard, job_id, generation = cast(int, parsed.shard), cast(bytes, parsed.job_id), cast(int, parsed.generation)
    if _terminal(layout, shard, job_id):
        return True  # settled: the entry is a stale hint
    tail, tail_meta = chain_tail(layout, shard, job_id)
    if tail != generation or tail_meta is None:
        return True  # superseded (renewed or taken over: the later link has its own entry), or names no claim
    claim_rel = keys.claim_key(shard, job_id, tail)
    found = read_checked(layout, claim_rel, job_id)
    if found is None:
        return True
    claim = cast(ClaimRecord, found[0])
    claim_time = layout.store_time(claim_rel, tail_meta)
    if not is_expired(floor_ns, claim_time, claim.lease_duration_ns, layout.skew_guard_ns):
        return False  # indexed early (its store time was unknown when written): met again next pass
    job = read_checked(layout, keys.job_key(shard, job_id), job_id)
    if job is None:
        return True
    plan = next_claim(cast(JobRecord, job[0]).maximum_attempts, tail, claim.attempt)
    if isinstance(plan, AttemptsExhausted):
        fail = read_checked(layout, keys.fail_key(shard, job_id, tail), job_id)
        if fail is None or floor_ns >= cast(FailRecord, fail[0]).retry_not_before_ns:
            # The claim path's decision on the same evidence: the last attempt's lease ran out.
            if (
                settle_dead(
                    layout, shard, job_id, plan.generation, plan.attempt, DeadReason.ATTEMPTS_EXHAUSTED, floor_ns
                )
                is None
            ):
                report.leases_to_dead += 1
                report.reaped_jobs.append(job_id.hex())
            return True
    report.leases_reaped += 1
    report.reaped_jobs.append(job_id.hex())
    return True


def _delayed_entry(layout: QueueLayout, parsed: ParsedKey, floor_ns: int, report: RecoveryReport) -> bool:
    """Re-evaluate one due delayed entry against the job's ``not_before`` and its tail's retry deadline."""
    shard, job_id = cast(int, parsed.shard), cast(bytes, parsed.job_id)
    if _terminal(layout, shard, job_id):
        return True
    job = read_checked(layout, keys.job_key(shard, job_id), job_id)
    if job is None:
        return True  # collected, or the entry never had a job
    due = cast(JobRecord, job[0]).not_before_ns or 0
    tail, _ = chain_tail(layout, shard, job_id)
    if tail:
        fail = read_checked(layout, keys.fail_key(shard, job_id, tail), job_id)
        if fail is not None:
            due = max(due, cast(FailRecord, fail[0]).retry_not_before_ns)
    if floor_ns < due:
        # The authoritative deadline is later than this entry's bucket: index it where it belongs.
        best_effort(layout, keys.delay_index_key_for(due, layout.format.delayed_bucket_width_ns, shard, job_id))
        return True
    report.delayed_promoted += 1
    return True


def _sweep(
    layout: QueueLayout,
    kind: KeyKind,
    width_ns: int,
    slack_ns: int,
    floor_ns: int,
    report: RecoveryReport,
    evaluate: Callable[[QueueLayout, ParsedKey, int, RecoveryReport], bool],
    budget: Budget | None,
) -> None:
    for rel, parsed in _due_entries(layout, kind, width_ns, slack_ns, floor_ns):
        checkpoint(budget)
        shard, job_id = cast(int, parsed.shard), cast(bytes, parsed.job_id)
        if not keys.in_own_shard(layout.queue_id, layout.format.shard_count, shard, job_id):
            prune(layout, rel, report)  # an entry of no job's keys: acting on it would settle planted objects
            continue
        try:
            delete = evaluate(layout, parsed, floor_ns, report)
        except Unusable:
            delete = True  # a corrupt object of the job: quarantined by read_checked, never delivered
            report.quarantined += 1
        except (NotCommitted, OutcomeUnknown, CorruptRecord, StateExhausted) as exc:
            report.error(exc, f"evaluating {rel}")
            continue
        if delete:
            prune(layout, rel, report)


def sweep_leases(layout: QueueLayout, floor_ns: int, report: RecoveryReport, budget: Budget | None = None) -> None:
    """The bounded expired-lease sweep: every entry of a fully due ``leases/`` bucket, re-evaluated, then deleted."""
    width, guard = layout.format.lease_bucket_width_ns, layout.skew_guard_ns
    _sweep(layout, KeyKind.LEASE_INDEX, width, guard, floor_ns, report, _lease_entry, budget)


def sweep_delayed(layout: QueueLayout, floor_ns: int, report: RecoveryReport, budget: Budget | None = None) -> None:
    """The bounded delayed sweep: every entry of a fully due ``delayed/`` bucket, verified, then deleted."""
    width = layout.format.delayed_bucket_width_ns
    _sweep(layout, KeyKind.DELAY_INDEX, width, 0, floor_ns, report, _delayed_entry, budget)
