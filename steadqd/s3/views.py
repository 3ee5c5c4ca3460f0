"""Read-only views of a bucket queue: ``stats``, ``ls``, ``inspect`` and ``show`` (docs/stowq.md, Operating).

Why a job's state is derived here and not read: StowQ/1 stores no state.
A job is ready, delayed, leased, done, dead or quarantined because of which
objects of its graph exist (job record, claim chain, fail records, receipt
or dead record, quarantine finding) and what they say, judged by the
reader's floor, a proven lower bound of store time. :func:`derive` applies
the claim path's own rules (expiry with the skew guard, a nack's deadline,
``not_before``), so a view and a worker agree on what a worker would do.

Why the records have the filesystem views' attribute names: ``steadq``
formats every view from those attributes, so it needs no bucket branch.
Where a field means nothing on a bucket (a boot id, a temporary), it is
left out or zero, and docs/stowq.md says so.

Why nothing here writes, apart from the floor's clock beacon: a view is
what an operator runs on a queue in trouble. A corrupt object is reported
as the answer (``quarantine``, with the problem); recording the finding is
the claim path's and the repair scan's business. Every record is read
through :mod:`steadqd.s3.verify`, and a payload is shown only once its
length and SHA-256 are the job record's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import BinaryIO

from steadqd import view_records
from steadqd.constants import ID_BYTES, State
from steadqd.errors import CorruptRecord, ErrorKind, InvalidInput, InvalidKey, SteadQError
from steadqd.s3 import keys
from steadqd.s3.keys import KeyKind, ParsedKey
from steadqd.s3.layout import Oversized, QueueLayout
from steadqd.s3.records import (
    ClaimRecord,
    DeadRecord,
    FailRecord,
    JobRecord,
    QuarantineReason,
    ReceiptRecord,
    Record,
)
from steadqd.s3.store.base import ObjectMeta
from steadqd.s3.timemath import expiry_ns, is_expired, saturating_add
from steadqd.s3.verify import read_record, verify_payload
from steadqd.view_records import CLASSIFIED_STATES, JobEntry, JobFile, StateStats

__all__ = [
    "QUARANTINE",
    "STATS_STATES",
    "Graph",
    "JobEntry",
    "JobFile",
    "JobObject",
    "JobStory",
    "StateStats",
    "chain_counts",
    "copy_job_payload",
    "derive",
    "inspect_job",
    "iter_keys",
    "derive_live",
    "job_story",
    "own_shard",
    "parse_job_id",
    "plane_prefix",
    "read_graph",
    "read_payload_verified",
    "read_verified",
    "shard_prefix",
]

# The state word of a job that must not be delivered: an object of its graph failed verification.
QUARANTINE = "quarantine"
# ``stats`` keys (steadqd.s3.census): the classified states.
STATS_STATES = CLASSIFIED_STATES
_TOKEN_SHOWN = 4  # bytes of a claim's worker token a view shows: it is the holder's secret


# =========================================================================== records of the views


@dataclass(frozen=True)
class JobObject:
    """One object of a job that carries a state, as ``steadq inspect`` lists it.

    ``state`` is ready, leased, delayed (the job record or the tail claim),
    dead or receipt. ``details``: leased → worker_id, token_prefix,
    claim_store_time_ns, lease_duration_ns, wall_deadline_ns (the store time
    the lease ends), continuation; delayed → not_before_ns and cause
    (``not_before`` or ``retry``); dead → reason; receipt → worker_id, outputs.
    """

    state: str
    generation: int
    attempt: int
    max_attempts: int
    path: str
    details: dict[str, object] = field(default_factory=dict, compare=False)


# What ``show`` tells of a job, with this backend's objects.
JobStory = view_records.JobStory[JobObject]


# =========================================================================== keys and listings


def parse_job_id(job_id: str) -> bytes:
    """A job id as bytes, refused unless 32 lowercase hex digits."""
    try:
        raw = bytes.fromhex(job_id) if isinstance(job_id, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != ID_BYTES or raw.hex() != job_id:
        raise InvalidInput(f"job id {job_id!r} is not {2 * ID_BYTES} lowercase hex digits")
    return raw


def plane_prefix(kind: KeyKind) -> str:
    """The LIST prefix of a whole plane (``jobs/``), taken from the key grammar's own builder."""
    zero = bytes(ID_BYTES)
    sample = {
        KeyKind.JOB: keys.job_key(0, zero),
        KeyKind.CLAIM: keys.claim_key(0, zero, 1),
        KeyKind.FAIL: keys.fail_key(0, zero, 1),
        KeyKind.RECEIPT: keys.receipt_key(0, zero),
        KeyKind.DEAD: keys.dead_key(0, zero),
        KeyKind.DELAY_INDEX: keys.delay_index_key(0, 0, zero),
        KeyKind.QUARANTINE: keys.quarantine_key(0, bytes(keys.QID_BYTES)),
    }[kind]
    return sample.split("/", 1)[0] + "/"


def shard_prefix(kind: KeyKind, shard: int) -> str:
    """The LIST prefix of one shard of a per-shard plane (``jobs/<shard>/``)."""
    return plane_prefix(kind) + keys.job_key(shard, bytes(ID_BYTES)).split("/")[1] + "/"


def iter_keys(layout: QueueLayout, prefix_rel: str) -> Iterator[tuple[ParsedKey, ObjectMeta]]:
    """Every key under ``prefix_rel`` that parses, page by page (one LIST per 1,000 keys).

    A key that is no key shape is skipped: ``fsck`` reports it.
    """
    after: str | None = None
    while True:
        page = layout.list_page(prefix_rel, start_after=after)
        for meta in page.items:
            try:
                yield keys.parse_key(layout.relative(meta.key)), meta
            except InvalidKey:
                continue
        if page.next_start_after is None:
            return
        after = layout.relative(page.next_start_after)


def own_shard(layout: QueueLayout, parsed: ParsedKey) -> bool:
    """:func:`keys.in_own_shard` for a listed key: counting a stray one would show the job twice.

    A key without a job id or a shard passes.
    """
    if parsed.job_id is None or parsed.shard is None:
        return True
    return keys.in_own_shard(layout.queue_id, layout.format.shard_count, parsed.shard, parsed.job_id)


def read_verified(layout: QueueLayout, rel: str) -> tuple[Record | None, ObjectMeta | None, CorruptRecord | None]:
    """(record, meta, None), (None, None, None) when absent, or (None, meta, the refusal) when corrupt."""
    try:
        found = layout.get(rel)
    except Oversized as exc:
        return None, exc.meta, exc
    if found is None:
        return None, None, None
    data, meta = found
    try:
        return (
            read_record(data, layout.queue_id, rel, required_feature_bits=layout.format.required_feature_bits),
            meta,
            None,
        )
    except CorruptRecord as exc:
        return None, meta, exc


# =========================================================================== one job's graph


@dataclass
class Graph:
    """What was read of one job. Records are verified; ``problems`` holds (key, refusal) of those that were not."""

    shard: int
    job_id: bytes
    job: JobRecord | None = None
    job_time: int | None = None
    claims: list[tuple[int, int]] = field(default_factory=list)  # (generation, store time) in chain order
    fails: list[int] = field(default_factory=list)
    tail: ClaimRecord | None = None
    tail_fail: FailRecord | None = None
    tail_fail_time: int | None = None
    receipt: ReceiptRecord | None = None
    receipt_time: int | None = None
    dead: DeadRecord | None = None
    dead_time: int | None = None
    problems: list[tuple[str, CorruptRecord, int | None]] = field(default_factory=list)  # (key, refusal, store time)

    @property
    def job_rel(self) -> str:
        return keys.job_key(self.shard, self.job_id)

    @property
    def generation(self) -> int:
        return self.claims[-1][0] if self.claims else 0

    @property
    def exists(self) -> bool:
        times = (self.job_time, self.receipt_time, self.dead_time)
        return bool(self.claims or self.problems) or any(t is not None for t in times)


def _chain(layout: QueueLayout, kind: KeyKind, shard: int, job_id: bytes) -> list[tuple[int, int]]:
    out = []
    for parsed, meta in iter_keys(layout, keys.chain_prefix(kind, shard, job_id)):
        if parsed.kind is kind and parsed.generation is not None:
            out.append((parsed.generation, meta.store_time_ns))
    return out


def read_graph(layout: QueueLayout, job_id: bytes) -> Graph:
    """Read one job's graph: 2 LISTs (its claim and fail chains) and at most 5 GETs.

    The GETs: receipt, dead record, job record, tail claim, and the tail's
    fail record when one is listed.
    """
    shard = keys.shard_of(layout.queue_id, job_id, layout.format.shard_count)
    g = Graph(shard, job_id)

    def get(rel: str) -> tuple[Record | None, int | None]:
        record, meta, problem = read_verified(layout, rel)
        store_time = None if meta is None else meta.store_time_ns
        if problem is not None:
            g.problems.append((rel, problem, store_time))
        return record, store_time

    receipt, g.receipt_time = get(keys.receipt_key(shard, job_id))
    g.receipt = receipt if isinstance(receipt, ReceiptRecord) else None
    dead, g.dead_time = get(keys.dead_key(shard, job_id))
    g.dead = dead if isinstance(dead, DeadRecord) else None
    job, g.job_time = get(g.job_rel)
    g.job = job if isinstance(job, JobRecord) else None
    g.claims = _chain(layout, KeyKind.CLAIM, shard, job_id)
    g.fails = [gen for gen, _ in _chain(layout, KeyKind.FAIL, shard, job_id)]
    if g.claims:
        tail, _ = get(keys.claim_key(shard, job_id, g.generation))
        g.tail = tail if isinstance(tail, ClaimRecord) else None
        if g.generation in g.fails:
            fail, g.tail_fail_time = get(keys.fail_key(shard, job_id, g.generation))
            g.tail_fail = fail if isinstance(fail, FailRecord) else None
    return g


@dataclass(frozen=True)
class Derived:
    """A job's state by one floor, with what ``ls`` and ``inspect`` show of it."""

    state: str
    path: str
    since_ns: int | None
    deadline_ns: int | None = None
    reason: int | None = None
    details: dict[str, object] = field(default_factory=dict)


def derive_live(layout: QueueLayout, g: Graph, floor_ns: int) -> Derived:
    """ready, delayed or leased, by the claim path's rules; the graph is not terminal and verified."""
    assert g.job is not None
    tail_rel = keys.claim_key(g.shard, g.job_id, g.generation)
    if g.tail is not None:
        tail_time = g.claims[-1][1]
        end = expiry_ns(tail_time, g.tail.lease_duration_ns)
        if g.tail_fail is not None:
            # A nacked job is taken again once the deadline has passed and the nacked lease has expired.
            due = max(g.tail_fail.retry_not_before_ns, saturating_add(end, layout.skew_guard_ns))
            if floor_ns < due:
                return Derived("delayed", keys.fail_key(g.shard, g.job_id, g.generation), g.tail_fail_time, due,
                               details={"not_before_ns": due, "cause": "retry"})  # fmt: skip
        elif not is_expired(floor_ns, tail_time, g.tail.lease_duration_ns, layout.skew_guard_ns):
            details: dict[str, object] = {
                "worker_id": g.tail.worker_id,
                "token_prefix": g.tail.worker_token[:_TOKEN_SHOWN].hex(),
                "claim_store_time_ns": tail_time,
                "lease_duration_ns": g.tail.lease_duration_ns,
                "wall_deadline_ns": end,
                "continuation": g.tail.continuation,
            }
            return Derived("leased", tail_rel, tail_time, end, details=details)
    not_before = g.job.not_before_ns
    if not_before is not None and floor_ns < not_before:
        return Derived("delayed", g.job_rel, g.job_time, not_before,
                       details={"not_before_ns": not_before, "cause": "not_before"})  # fmt: skip
    return Derived("ready", g.job_rel, g.job_time)


def derive(layout: QueueLayout, g: Graph, floor_ns: int) -> Derived | None:
    """The job's state by ``floor_ns``; None when it has no object at all.

    A terminal record decides (a receipt before a dead record: the pair is
    the repair scan's duplicate_state_conflict). Otherwise any object that
    failed verification makes the job ``quarantine``, as the claim path
    would refuse it; claims without a job record are ``quarantine`` too
    (the repair scan's claims_without_job finding).
    """
    terminals = _terminals(g)
    if terminals:
        return terminals[0]
    if g.problems:
        rel, exc, store_time = g.problems[0]
        return Derived(QUARANTINE, rel, store_time, reason=exc.reason, details={"problem": str(exc)})
    if g.job is None:
        if not g.exists:
            return None
        # As the repair scan records it: at the job key, in the bucket of the tail claim's time.
        tail_time = g.claims[-1][1] if g.claims else None
        return Derived(QUARANTINE, g.job_rel, tail_time, reason=QuarantineReason.KEY_RECORD_MISMATCH,
                       details={"problem": "claims without a job record"})  # fmt: skip
    return derive_live(layout, g, floor_ns)


def chain_counts(g: Graph) -> tuple[int, int, int]:
    """(generation, attempt, max_attempts) as the views show them: the tail's, or the terminal record's."""
    maximum = 0 if g.job is None else g.job.maximum_attempts
    for terminal in (g.receipt, g.dead):
        if terminal is not None:
            return terminal.generation, terminal.attempt, maximum
    attempt = 0 if g.tail is None else g.tail.attempt
    return g.generation, attempt, maximum


# =========================================================================== inspect


def _terminals(g: Graph) -> list[Derived]:
    """The receipt and the dead record of the graph as states (both only in a conflict the repair scan records).

    A receipt object decides, as in ``stats`` (which sees keys, not records):
    when it fails verification, the dead record beside it does not make the
    job dead; the job is quarantine, by the receipt's problem.
    """
    out = []
    if g.receipt is not None:
        out.append(Derived(State.RECEIPT.value, keys.receipt_key(g.shard, g.job_id), g.receipt_time,
                           details={"worker_id": g.receipt.worker_id, "outputs": len(g.receipt.output_digests)}))  # fmt: skip
    if g.dead is not None and (g.receipt is not None or g.receipt_time is None):
        out.append(Derived(State.DEAD.value, keys.dead_key(g.shard, g.job_id), g.dead_time, reason=g.dead.reason,
                           details={"reason": g.dead.reason}))  # fmt: skip
    return out


def _objects(layout: QueueLayout, g: Graph, floor_ns: int) -> list[JobObject]:
    generation, attempt, maximum = chain_counts(g)
    terminals = _terminals(g)
    if terminals:
        return [JobObject(d.state, generation, attempt, maximum, d.path, d.details) for d in terminals]
    if g.job is None or g.problems:
        return []
    live = derive_live(layout, g, floor_ns)
    return [JobObject(live.state, generation, attempt, maximum, live.path, live.details)]


def inspect_job(layout: QueueLayout, job_id: str, floor_ns: int) -> list[JobObject]:
    """Every object of the job that carries a state, verified; the cost of :func:`read_graph`.

    A job that is live has one (ready, delayed or leased); a done or dead job
    its receipt or dead record (both, if a repair scan has a conflict to
    record). A job whose objects fail verification has none: ``show`` tells
    its story.
    """
    return _objects(layout, read_graph(layout, parse_job_id(job_id)), floor_ns)


# =========================================================================== show


def read_payload_verified(layout: QueueLayout, job: JobRecord) -> bytes:
    """The job's payload once its length and SHA-256 are the record's (one GET when detached).

    CorruptRecord when they are not, NOT_FOUND when a detached payload is
    absent. Nothing is recorded: a view reports, the claim path quarantines.
    """
    if job.payload_inline is not None:
        return verify_payload(job, job.payload_inline)
    assert job.payload_key is not None
    found = layout.get(job.payload_key, limit=job.payload_length, payload=True)
    if found is None:
        raise SteadQError(
            f"the payload of job {job.job_id.hex()} is missing at {layout.key(job.payload_key)}", ErrorKind.NOT_FOUND
        )
    return verify_payload(job, found[0])


def _job_file(
    layout: QueueLayout, g: Graph, since_ns: int | None, head_bytes: int
) -> tuple[JobFile, CorruptRecord | None]:
    """The job record judged, with the payload's first ``head_bytes`` if it verified, and a payload refusal."""
    assert g.job is not None
    job = g.job
    base = JobFile(g.job_rel, g.job_time, since_ns, job.content_type, None, None, job.not_before_ns, job.payload_length)
    try:
        payload = read_payload_verified(layout, job)
    except CorruptRecord as exc:
        return replace(base, problem=str(exc)), exc
    except SteadQError as exc:
        if exc.kind is not ErrorKind.NOT_FOUND:
            raise
        refusal = CorruptRecord(exc.message, QuarantineReason.ORPHAN_REFERENCED_PAYLOAD_MISSING, error_class="payload")
        return replace(base, problem=exc.message), refusal
    return replace(base, payload_head=payload[:head_bytes], payload_verified=True), None


def _finding_id(layout: QueueLayout, rel: str, reason: int, store_time_ns: int | None) -> str | None:
    """The qid of the finding about ``rel`` if one was recorded (one HEAD): findings are deterministic."""
    if store_time_ns is None:
        return None
    key = keys.quarantine_key_for(layout.queue_id, rel, reason, store_time_ns, layout.format.terminal_bucket_width_ns)
    qid = keys.parse_key(key).qid
    return qid.hex() if qid is not None and layout.exists(key) else None


def job_story(layout: QueueLayout, job_id: str, floor_ns: int, head_bytes: int) -> JobStory | None:
    """The job's whole story, or None if no object of it exists.

    Cost: :func:`read_graph`, one GET of a detached payload (verified, shown
    only then), and one HEAD for the quarantine finding of a job found
    corrupt.
    """
    g = read_graph(layout, parse_job_id(job_id))
    d = derive(layout, g, floor_ns)
    if d is None:
        return None
    objects = _objects(layout, g, floor_ns)
    current = objects[0] if objects else None
    file: JobFile | None = None
    payload_refusal: CorruptRecord | None = None
    if g.job is not None:
        file, payload_refusal = _job_file(layout, g, d.since_ns, head_bytes)
    if d.state in (State.READY.value, State.DELAYED.value, State.LEASED.value) and payload_refusal is not None:
        assert g.job is not None
        rel = g.job.payload_key or g.job_rel
        qid = _finding_id(layout, rel, payload_refusal.reason, g.job_time)
        return JobStory(job_id, QUARANTINE, rel, objects, None, file, payload_refusal.reason, qid)
    if d.state == QUARANTINE:
        qid = None if d.reason is None else _finding_id(layout, d.path, d.reason, d.since_ns)
        if file is None:  # the job record is what failed (or is missing): the problem is the story
            file = JobFile(d.path, changed_ns=d.since_ns, problem=str(d.details.get("problem")))
        return JobStory(job_id, QUARANTINE, d.path, objects, None, file, d.reason, qid)
    return JobStory(job_id, d.state, d.path, objects, current, file, d.reason)


def copy_job_payload(layout: QueueLayout, job_id: str, out: BinaryIO) -> int:
    """Write the job's payload to ``out`` only once it has verified (one GET of the record, one of a payload)."""
    raw = parse_job_id(job_id)
    shard = keys.shard_of(layout.queue_id, raw, layout.format.shard_count)
    record, _, problem = read_verified(layout, keys.job_key(shard, raw))
    if problem is not None:
        raise problem
    if not isinstance(record, JobRecord):
        raise SteadQError(f"not found: no job record of job {job_id}", ErrorKind.NOT_FOUND)
    data = read_payload_verified(layout, record)
    out.write(data)
    return len(data)
