"""StowQ/1 retention GC (recovery.md, Retention and GC): terminal graphs, orphan payloads, old clock beacons.

Why the terminal record goes last: it is the job's tombstone. While it
exists the job is settled whatever else is left, so a collection cut short
at any operation leaves a graph that is still terminal, never a job that
could be delivered again; the job record goes just before it, after the
claim chain and the payload it names (a job record without its tombstone is
only claimable if its chain says so, and the chain outlives the payload).
Per job, :func:`delete_job_graph` deletes in recovery.md's order: the
advisory entries it can address (the tail hint, each generation's lease
entry, the delayed entries of the job's ``not_before`` and of each nack's
deadline), ``fails/``, ``claims/``, ``payloads/``, ``jobs/``, the job's
``steadq cancel`` request if one was left (application space, s3/cancel.py:
one DELETE, absent or not), the terminal record. The ``termidx/`` entry that led there is deleted after the tombstone:
it is GC's own work item, advisory like the other entries, and keeping it
until the graph is gone is what lets the next pass find an interrupted
collection again (a ``termidx/`` entry whose terminal record is absent is
then just deleted). Index entries this cannot address (a lease entry written
from a floor because its claim's store time was unknown) are in buckets long
due by then, and the sweep deletes an entry whose job is settled or gone.

What time it is comes from the store: the pass's floor. A graph is
collected when its terminal record's store time is ``retention`` behind the
floor; ``termidx/`` buckets list oldest first and an entry's terminal record
is never older than its bucket's start (the settling floor was a lower bound
of the record's store time), so a walk stops at the first bucket too young.
Each walk keeps its place in the handle between passes (``Positions``) and
starts over when it has reached its end; nothing is lost by forgetting it.

Never collected: ``meta/FORMAT``, ``meta/watermark``, ``quarantine/``, and a
graph whose terminal record is corrupt or has both a receipt and a dead
record: those are the repair scan's findings, recorded there once, and an
operator decides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

from steadqd.errors import CorruptRecord, InvalidKey, NotCommitted, NotFound, OutcomeUnknown, StateExhausted
from steadqd.s3 import keys
from steadqd.s3.keys import KeyKind, ParsedKey, TermKind
from steadqd.s3.layout import QueueLayout
from steadqd.s3.records import ClaimRecord, FailRecord, FeatureBit, JobRecord
from steadqd.s3.recovery.sweep import INDEX_PAGE, Budget, RecoveryReport, checkpoint, walk
from steadqd.s3.timemath import bucket_start_ns, saturating_add
from steadqd.s3.verify import read_record

__all__ = [
    "BEACON_STALENESS_MULTIPLE",
    "MIN_FLOOR_STALENESS_NS",
    "Positions",
    "Retention",
    "GcPass",
    "collect_beacons",
    "collect_orphan_payloads",
    "collect_terminal",
    "delete_job_graph",
]

# Beacons are collected this many floor-staleness windows after their creation
# (the reference's multiple), and the window is taken to be at least the
# reference's 30 s, so that no participant still reading a beacon's time back loses it.
BEACON_STALENESS_MULTIPLE = 10
MIN_FLOOR_STALENESS_NS = 30 * 1_000_000_000
# After the last dead entry of a termidx bucket: '~' sorts after every hex digit.
_PAST_BUCKET_KIND = "~"


@dataclass(frozen=True)
class Retention:
    """How long settled jobs stay, in store nanoseconds; the sweeper's YAML settings, as the filesystem's.

    ``dead_ns`` None keeps dead jobs forever (``sweeper.dead_retention``
    unset); ``orphan_ns`` is the enqueue-orphan horizon (``sweeper.temp_ttl``:
    on a bucket an orphan payload is what an abandoned temp file is on a
    filesystem); ``beacon_ns`` the age of a collectable clock beacon.
    """

    receipt_ns: int
    dead_ns: int | None
    orphan_ns: int
    beacon_ns: int


@dataclass
class Positions:
    """Where each walk stopped last pass (relative keys; None: from the start). Safe to lose."""

    termidx: str | None = None
    payloads: str | None = None
    beacons: str | None = None


@dataclass(frozen=True)
class GcPass:
    """What each collection phase of one recovery pass works with: the queue, its floor, the settings,
    where the last pass stopped, the report it adds to, and the budget that may cut it short."""

    layout: QueueLayout
    floor_ns: int
    retention: Retention
    positions: Positions
    report: RecoveryReport
    budget: Budget | None = None


def _delete(layout: QueueLayout, rel: str) -> None:
    """One delete; deleting what is not there succeeds (store contract), a failure raises to the caller."""
    layout.store.delete(layout.key(rel))


def _chain(layout: QueueLayout, kind: KeyKind, shard: int, job_id: bytes) -> list[tuple[str, int]]:
    """(relative key, generation) of each link of the job's claim or fail chain."""
    out: list[tuple[str, int]] = []
    for rel, _meta in walk(layout, keys.chain_prefix(kind, shard, job_id)):
        try:
            generation = keys.parse_key(rel).generation
        except InvalidKey:
            continue  # not ours to delete: the repair scan reports it
        if generation is not None:
            out.append((rel, generation))
    return out


def _read(layout: QueueLayout, rel: str) -> tuple[object, int] | None:
    """The checked record at ``rel`` and its store time; None when absent or unreadable (then not needed)."""
    try:
        found = layout.read(rel)
    except CorruptRecord:
        return None  # a corrupt link names no index entry we could find; it is deleted all the same
    return None if found is None else (found[0], found[1].store_time_ns)


def delete_job_graph(layout: QueueLayout, shard: int, job_id: bytes, term: TermKind) -> None:
    """Delete one settled job's objects in recovery.md's order, the terminal record last; safe to repeat.

    The caller has verified that the terminal record exists and may go.
    Raises NotCommitted/OutcomeUnknown when a store call fails: what was
    deleted stays deleted and a repeat finishes the rest.
    """
    fmt = layout.format
    job_rel = keys.job_key(shard, job_id)
    job = _read(layout, job_rel)
    claims = _chain(layout, KeyKind.CLAIM, shard, job_id)
    fails = _chain(layout, KeyKind.FAIL, shard, job_id)
    indexes: list[str] = []
    if layout.feature(FeatureBit.TAIL_HINTS):
        indexes.append(keys.tail_key(shard, job_id))
    if job is not None and cast(JobRecord, job[0]).not_before_ns is not None:
        not_before = cast(int, cast(JobRecord, job[0]).not_before_ns)
        indexes.append(keys.delay_index_key_for(not_before, fmt.delayed_bucket_width_ns, shard, job_id))
    for rel, _generation in claims:
        claim = _read(layout, rel)
        if claim is not None and isinstance(claim[0], ClaimRecord):
            record = claim[0]
            indexes.append(
                keys.lease_index_key_for(
                    claim[1], record.lease_duration_ns, fmt.lease_bucket_width_ns, shard, job_id, record.generation
                )
            )
    for rel, _generation in fails:
        fail = _read(layout, rel)
        if fail is not None and isinstance(fail[0], FailRecord):
            deadline = fail[0].retry_not_before_ns
            indexes.append(keys.delay_index_key_for(deadline, fmt.delayed_bucket_width_ns, shard, job_id))
    for rel in dict.fromkeys(indexes):
        _delete(layout, rel)
    for rel, _generation in fails:
        _delete(layout, rel)
    for rel, _generation in reversed(claims):
        _delete(layout, rel)
    if job is not None:
        payload_key = cast(JobRecord, job[0]).payload_key
        if payload_key is not None:
            _delete(layout, payload_key)
    _delete(layout, job_rel)
    _delete(layout, keys.cancel_request_key(job_id))  # a request that came after the job's last check
    _delete(layout, keys.receipt_key(shard, job_id) if term is TermKind.RECEIPT else keys.dead_key(shard, job_id))


def _collect_entry(layout: QueueLayout, rel: str, parsed: ParsedKey, floor_ns: int, retention: Retention) -> str:
    """Verify one due ``termidx/`` entry against its terminal key and act; returns what was done."""
    shard, job_id, term = cast(int, parsed.shard), cast(bytes, parsed.job_id), cast(TermKind, parsed.term)
    receipt_rel, dead_rel = keys.receipt_key(shard, job_id), keys.dead_key(shard, job_id)
    terminal_rel, other_rel = (receipt_rel, dead_rel) if term is TermKind.RECEIPT else (dead_rel, receipt_rel)
    try:
        found = layout.get(terminal_rel)
        if found is None:
            _delete(layout, rel)  # the graph is gone (collected, or the entry is stale): only the entry is left
            return "stale"
        data, meta = found
        read_record(data, layout.queue_id, terminal_rel, required_feature_bits=layout.format.required_feature_bits)
    except CorruptRecord:  # Oversized too
        # A corrupt tombstone proves nothing: the graph stays, and the repair scan records the finding
        # once (flagging it here would log it again on every pass).
        return "kept"
    retain = retention.receipt_ns if term is TermKind.RECEIPT else retention.dead_ns
    if retain is None or saturating_add(meta.store_time_ns, retain) > floor_ns:
        return "young"
    if layout.exists(other_rel):
        return "kept"  # a receipt and a dead record: the repair scan's duplicate_state_conflict
    delete_job_graph(layout, shard, job_id, term)
    _delete(layout, rel)
    return "collected"


def _due(bucket: int, retain: int | None, width_ns: int, floor_ns: int) -> bool:
    if retain is None:
        return False
    try:
        return saturating_add(bucket_start_ns(bucket, width_ns), retain) <= floor_ns
    except StateExhausted:
        return False


def collect_terminal(run: GcPass) -> None:
    """Walk ``termidx/`` oldest bucket first and collect each graph past its retention."""
    width = run.layout.format.terminal_bucket_width_ns
    after = run.positions.termidx
    while True:
        page = run.layout.list_page("termidx/", start_after=after, limit=INDEX_PAGE)
        jumped = False
        for meta in page.items:
            rel = run.layout.relative(meta.key)
            try:
                parsed = keys.parse_key(rel)
            except InvalidKey:
                after = run.positions.termidx = rel
                continue
            if parsed.kind is not KeyKind.TERMIDX or parsed.bucket is None:
                after = run.positions.termidx = rel
                continue
            receipts_due = _due(parsed.bucket, run.retention.receipt_ns, width, run.floor_ns)
            dead_due = _due(parsed.bucket, run.retention.dead_ns, width, run.floor_ns)
            if not receipts_due and not dead_due:
                run.positions.termidx = None  # the rest is younger: the next walk starts over
                return
            if not (dead_due if parsed.term is TermKind.DEAD else receipts_due):
                # Skip the rest of this bucket's entries of this kind in one LIST.
                after = keys.bucket_prefix(KeyKind.TERMIDX, parsed.bucket) + cast(TermKind, parsed.term).value + "/"
                after += _PAST_BUCKET_KIND
                run.positions.termidx = after
                jumped = True
                break
            checkpoint(run.budget)
            try:
                done = _collect_entry(run.layout, rel, parsed, run.floor_ns, run.retention)
            except (NotCommitted, OutcomeUnknown) as exc:
                run.report.error(exc, f"collecting the graph of {rel}")
                done = "failed"
            if done == "collected":
                if parsed.term is TermKind.RECEIPT:
                    run.report.receipts_deleted += 1
                else:
                    run.report.dead_deleted += 1
            elif done == "stale":
                run.report.index_entries_pruned += 1
            after = run.positions.termidx = rel
        if jumped:
            continue
        if page.next_start_after is None:
            run.positions.termidx = None
            return
        after = run.positions.termidx = run.layout.relative(page.next_start_after)


def _past_horizon(
    run: GcPass, prefix_rel: str, horizon_ns: int, start_after: str | None, keep: Callable[[str | None], None]
) -> Iterator[str]:
    """Each key under ``prefix_rel`` stored at least ``horizon_ns`` before the floor, charged to the budget.

    ``keep`` is told every key walked past, so the next pass resumes after
    it, and None once the plane is walked to its end. A key old enough is
    kept only after the budget has allowed the work on it: a pass cut short
    there starts with that key next time.
    """
    for rel, meta in walk(run.layout, prefix_rel, start_after=start_after):
        if saturating_add(meta.store_time_ns, horizon_ns) > run.floor_ns:
            keep(rel)
            continue
        checkpoint(run.budget)
        keep(rel)
        yield rel
    keep(None)


def collect_orphan_payloads(run: GcPass) -> None:
    """Delete each payload older than the orphan horizon whose job record does not exist.

    A payload is written before its job record (records.md, write order), so
    one without a job record is either an enqueue in flight, which the
    horizon leaves alone, or an abandoned one. A referenced payload that is
    missing is the repair scan's finding (0x0014), not this one's.
    """
    fmt = run.layout.format

    def keep(rel: str | None) -> None:
        run.positions.payloads = rel

    for rel in _past_horizon(run, "payloads/", run.retention.orphan_ns, run.positions.payloads, keep):
        try:
            parsed = keys.parse_key(rel)
        except InvalidKey:
            continue
        if parsed.kind is not KeyKind.PAYLOAD or parsed.job_id is None:
            continue
        shard = keys.shard_of(run.layout.queue_id, parsed.job_id, fmt.shard_count)
        try:
            if run.layout.exists(keys.job_key(shard, parsed.job_id)):
                continue
            _delete(run.layout, rel)
        except (NotCommitted, OutcomeUnknown) as exc:
            run.report.error(exc, f"collecting the orphan payload {rel}")
            continue
        run.report.temp_files_deleted += 1


def collect_beacons(run: GcPass) -> None:
    """Delete clock beacons older than ``retention.beacon_ns`` (their nonces are random: the whole plane is walked)."""

    def keep(rel: str | None) -> None:
        run.positions.beacons = rel

    for rel in _past_horizon(run, "meta/clock/", run.retention.beacon_ns, run.positions.beacons, keep):
        try:
            if keys.parse_key(rel).kind is not KeyKind.BEACON:
                continue
            _delete(run.layout, rel)
        except InvalidKey:
            continue
        except (NotCommitted, OutcomeUnknown, NotFound) as exc:
            run.report.error(exc, f"deleting the clock beacon {rel}")
            continue
        run.report.beacons_deleted += 1
