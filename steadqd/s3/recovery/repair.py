"""The StowQ/1 repair scan (recovery.md, Repair scan), which the recovery pass runs a step at a time and ``fsck`` whole.

Why a scan at all: every advisory index entry is written after its
authoritative object and best-effort, so a crash between the two loses the
entry, and nothing but a listing of the authoritative planes can find that
out. The scan walks, shard by shard, ``jobs/<s>/``, ``claims/<s>/``,
``receipts/<s>/`` and ``dead/<s>/``, and

* regenerates the entries that still have work to do: the ``delayed/`` entry
  of a job or a nack whose deadline is ahead, the ``leases/`` entry of a
  chain's tail whose lease has not expired (an expired one would only be
  pruned by the next sweep), and the ``termidx/`` entry of each terminal
  record (looked for in its store time's bucket and the one before, where the
  settling floor put it);
* flags what must never be delivered or trusted: a key outside the grammar
  (0x0003), a record failing its digest, envelope or key tag (0x0001,
  0x0004) or contradicting its key (0x0005), a payload that is missing
  (0x0014) or, with ``deep``, does not match its digest (0x0002), a gap in a
  claim chain (0x0015), a claim whose evidence does not prove its
  predecessor's expiry or custody (0x0010), a chain without its job
  (0x0005), a receipt and a dead record of one job (0x0007, the check-then-act
  window of the errata). With feature bit 1 each finding is written as its
  deterministic quarantine record (``quarantine.flag``), so two auditors, this
  one and the reference, converge on the same bytes; the source keys and
  store times follow the reference's conventions. On a v1 queue the findings
  are only reported.

**The cursor** is ``meta/steadq-repair-cursor``, compare-and-swapped after
each step: the cycle count, the shard and plane being scanned, the last key
whose work is done, and the floor at which the last full cycle ended. The
reference defines no cursor object (its scan returns the next shard to its
caller) and none of its key shapes, so this key is steadqd's own, outside
``keys.abnf``: the reference reads only ``meta/FORMAT``, ``meta/watermark``
and ``meta/clock/``, and never lists ``meta/``. Its body is canonical CBOR, a
map (``cycle``, ``shard``, ``plane``, ``after``, ``completed_ns``) tagged
``format: steadq-repair-cursor/1``; one that does not decode is replaced by
a fresh one. The cursor only saves effort: every regeneration is a
put-if-absent and every finding deterministic, so a step repeated after a
lost CAS, or run by two repairers at once, does the same work twice and
changes nothing more.

Bounds: a step lists at most ``max_pages`` pages (and whatever its budget
allows), and stops between two keys: a claim chain is handled whole. The
recovery pass starts a new cycle at most once per ``REPAIR_INTERVAL_NS`` of
store time (the scan is the rare one of recovery.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import cast

from steadqd.cbor import CborMap, decode, encode
from steadqd.errors import (
    AlreadyExists,
    CorruptRecord,
    InvalidInput,
    InvalidKey,
    NotCommitted,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    StateExhausted,
)
from steadqd.fsck_report import Finding
from steadqd.s3 import keys
from steadqd.s3.keys import KeyKind, TermKind
from steadqd.s3.layout import Oversized, QueueLayout
from steadqd.s3.quarantine import flag
from steadqd.s3.records import (
    RECORD_FIELDS_MAX,
    ClaimRecord,
    FailRecord,
    FeatureBit,
    JobRecord,
    QuarantineReason,
    Record,
)
from steadqd.s3.recovery.sweep import Budget, checkpoint
from steadqd.s3.store.base import LIST_PAGE_MAX, ObjectMeta
from steadqd.s3.timemath import bucket_number, is_expired
from steadqd.s3.verify import read_record, verify_payload
from steadqd.text import printable

__all__ = [
    "CURSOR_FORMAT",
    "Cursor",
    "Finding",
    "PLANES",
    "REPAIR_CURSOR_KEY",
    "REPAIR_INTERVAL_NS",
    "StepResult",
    "Scan",
    "decode_cursor",
    "encode_cursor",
    "read_cursor",
    "read_listed",
    "repair_step",
    "scan_shard",
]

log = logging.getLogger("steadqd.s3")

REPAIR_CURSOR_KEY = "meta/steadq-repair-cursor"
CURSOR_FORMAT = "steadq-repair-cursor/1"
# The planes of one shard, in scan order; "claims" is handled a whole chain at a time.
PLANES = ("jobs", "claims", "receipts", "dead")
_PLANE_KIND = {"jobs": KeyKind.JOB, "claims": KeyKind.CLAIM, "receipts": KeyKind.RECEIPT, "dead": KeyKind.DEAD}
REPAIR_INTERVAL_NS = 3600 * 1_000_000_000
_SCAN_PAGE = min(250, LIST_PAGE_MAX)


class PagesSpent(Exception):
    """A step listed as many pages as it may; raised before the next LIST."""


@dataclass(frozen=True)
class Cursor:
    """Where the repair scan is: ``plane`` of ``shard`` in cycle ``cycle``, done up to ``after`` (relative)."""

    cycle: int = 0
    shard: int = 0
    plane: str = PLANES[0]
    after: str = ""
    completed_ns: int = 0  # the floor when the last full cycle ended (0: never)

    @property
    def at_start(self) -> bool:
        return self.shard == 0 and self.plane == PLANES[0] and not self.after


def encode_cursor(cursor: Cursor) -> bytes:
    pairs: tuple[tuple[str, int | str], ...] = (
        ("format", CURSOR_FORMAT),
        ("cycle", cursor.cycle),
        ("shard", cursor.shard),
        ("plane", cursor.plane),
        ("after", cursor.after),
        ("completed_ns", cursor.completed_ns),
    )
    return encode(CborMap(pairs))


def decode_cursor(data: bytes, shard_count: int) -> Cursor:
    """The cursor in ``data``; InvalidInput naming what is wrong when it is not one (it is then replaced)."""
    try:
        value = decode(data)
    except CorruptRecord as exc:
        raise InvalidInput(f"{REPAIR_CURSOR_KEY} is not canonical CBOR ({exc.error_class})") from None
    if not isinstance(value, CborMap):
        raise InvalidInput(f"{REPAIR_CURSOR_KEY} is not a CBOR map")
    fields = dict(value.pairs)
    if fields.get("format") != CURSOR_FORMAT or len(fields) != 6:
        raise InvalidInput(f"{REPAIR_CURSOR_KEY} is not a {CURSOR_FORMAT} map")
    ints = [fields.get(n) for n in ("cycle", "shard", "completed_ns")]
    if any(not isinstance(v, int) or isinstance(v, bool) for v in ints):
        raise InvalidInput(f"{REPAIR_CURSOR_KEY}: cycle, shard and completed_ns must be unsigned integers")
    plane, after = fields.get("plane"), fields.get("after")
    if plane not in PLANES or not isinstance(after, str) or cast(int, ints[1]) >= shard_count:
        raise InvalidInput(f"{REPAIR_CURSOR_KEY}: its plane, position or shard is not one of this queue's")
    return Cursor(cast(int, ints[0]), cast(int, ints[1]), plane, after, cast(int, ints[2]))


def read_cursor(layout: QueueLayout) -> tuple[Cursor, str | None]:
    """The stored cursor and its ETag (None: no cursor yet); an unreadable one reads as a fresh cursor."""
    try:
        obj = layout.store.get(layout.key(REPAIR_CURSOR_KEY), max_bytes=RECORD_FIELDS_MAX)  # a longer one is garbage
    except NotFound:
        return Cursor(), None
    try:
        return decode_cursor(obj.body, layout.format.shard_count), obj.meta.etag
    except InvalidInput as exc:
        log.warning("The repair cursor of %s is replaced: %s", printable(layout.location), exc, extra=_fields(layout))
        return Cursor(), obj.meta.etag


def _save_cursor(layout: QueueLayout, cursor: Cursor, etag: str | None) -> str | None:
    """CAS the cursor forward; losing to another repairer is fine (its position stands). Returns the new ETag."""
    key = layout.key(REPAIR_CURSOR_KEY)
    body = encode_cursor(cursor)
    try:
        if etag is None:
            return layout.store.put_if_absent(key, body).etag
        return layout.store.put_if_match(key, body, etag).etag
    except (AlreadyExists, PreconditionFailed, NotCommitted, OutcomeUnknown):
        return None


def _fields(layout: QueueLayout, job_id: bytes | None = None) -> dict[str, str]:
    out = {"STEADQ_QUEUE": layout.queue_id.hex()}
    if job_id is not None:
        out["STEADQ_JOB_ID"] = job_id.hex()
    return out


@dataclass
class Scan:
    """What a scan knows and found. ``write``: regenerate entries and record findings; else report only."""

    layout: QueueLayout
    floor_ns: int
    write: bool = True
    deep: bool = False
    pages_left: int | None = None
    budget: Budget | None = None
    findings: list[Finding] = field(default_factory=list)
    regenerated: int = 0
    quarantined: int = 0
    verified: int = 0
    payloads_verified: int = 0
    scanned: int = 0
    _seen: set[tuple[str, int]] = field(default_factory=set)

    def pages(self, prefix_rel: str, after: str | None) -> Iterator[tuple[str, ObjectMeta]]:
        """Every key under the prefix, from ``after``, page by page, each page charged to ``pages_left``."""
        start = after or None
        while True:
            if self.pages_left is not None:
                if self.pages_left <= 0:
                    raise PagesSpent
                self.pages_left -= 1
            page = self.layout.list_page(prefix_rel, start_after=start, limit=_SCAN_PAGE)
            for meta in page.items:
                start = self.layout.relative(meta.key)
                yield start, meta
            if page.next_start_after is None:
                return
            start = self.layout.relative(page.next_start_after)

    def finding(
        self,
        source: str,
        reason: int,
        finding_type: str,
        details: str,
        observed_ns: int,
        *,
        detail: int | None = None,
        job_id: bytes | None = None,
    ) -> None:
        """Report a finding about ``source`` (relative) and, when writing on a bit-1 queue, record it once."""
        if (source, reason) in self._seen:
            return
        self._seen.add((source, reason))
        self.findings.append(Finding("ERROR", source, finding_type, details, reason))
        layout = self.layout
        if not self.write or not layout.feature(FeatureBit.QUARANTINE):
            return
        qrel = keys.quarantine_key_for(
            layout.queue_id, source, reason, observed_ns, layout.format.terminal_bucket_width_ns
        )
        if layout.exists(qrel):
            return  # recorded before: a finding that recurs is not re-recorded (recovery.md)
        if flag(layout, source, reason, observed_ns, detail=detail, job_id=job_id, why=details) is not None:
            self.quarantined += 1
            self.findings.append(Finding("WARN", source, "quarantined", f"finding recorded at {qrel}", reason))

    def ensure_index(self, rel: str, why: str) -> None:
        """Make sure the advisory entry ``rel`` exists (write), or report it missing (report only)."""
        layout = self.layout
        if not self.write:
            if not layout.exists(rel):
                self.findings.append(Finding("WARN", rel, "index_missing", why))
            return
        try:
            layout.store.put_if_absent(layout.key(rel), b"")
        except AlreadyExists:
            return
        except (NotCommitted, OutcomeUnknown):
            return  # best effort, as its writer's: the next cycle tries again
        self.regenerated += 1
        self.findings.append(Finding("WARN", rel, "index_regenerated", why))


def read_listed(scan: Scan, rel: str, meta: ObjectMeta, job_id: bytes | None) -> Record | None:
    """The checked record at ``rel`` (None: gone since it was listed, or flagged as corrupt)."""
    layout = scan.layout
    try:
        found = layout.get(rel)
        if found is None:
            return None
        record = read_record(found[0], layout.queue_id, rel, required_feature_bits=layout.format.required_feature_bits)
    except CorruptRecord as exc:  # Oversized too: refused from its size, never read whole
        scan.finding(rel, exc.reason, "record_corrupt", exc.error_class, meta.store_time_ns, job_id=job_id)
        return None
    scan.verified += 1
    return record


def _parsed(scan: Scan, rel: str, meta: ObjectMeta, kind: KeyKind, shard: int) -> keys.ParsedKey | None:
    try:
        parsed = keys.parse_key(rel)
    except InvalidKey as exc:
        scan.finding(rel, QuarantineReason.KEY_PARSE_FAILED, "key_grammar", exc.error_class, meta.store_time_ns)
        return None
    if parsed.kind is not kind or parsed.shard != shard:
        scan.finding(
            rel, QuarantineReason.KEY_PARSE_FAILED, "key_grammar", "not a key of this plane", meta.store_time_ns
        )
        return None
    queue_id, count = scan.layout.queue_id, scan.layout.format.shard_count
    if parsed.job_id is not None and not keys.in_own_shard(queue_id, count, shard, parsed.job_id):
        home = replace(parsed, shard=keys.shard_of(queue_id, parsed.job_id, count))
        why = f"under a shard its job id does not map to: no key of the job, whose key would be {home}"
        scan.finding(rel, QuarantineReason.KEY_PARSE_FAILED, "key_grammar", why, meta.store_time_ns)
        return None
    return parsed


def _delay_entry(scan: Scan, shard: int, job_id: bytes, due_ns: int, what: str) -> None:
    if due_ns > scan.floor_ns:
        width = scan.layout.format.delayed_bucket_width_ns
        scan.ensure_index(keys.delay_index_key_for(due_ns, width, shard, job_id), what)


def _job(scan: Scan, shard: int, rel: str, meta: ObjectMeta) -> None:
    parsed = _parsed(scan, rel, meta, KeyKind.JOB, shard)
    if parsed is None:
        return
    job_id = cast(bytes, parsed.job_id)
    job = cast(JobRecord | None, read_listed(scan, rel, meta, job_id))
    if job is None:
        return
    layout = scan.layout
    if job.payload_inline is not None:
        try:
            verify_payload(job, job.payload_inline)
            if scan.deep:
                scan.payloads_verified += 1
        except CorruptRecord as exc:
            scan.finding(rel, exc.reason, "payload_corrupt", exc.error_class, meta.store_time_ns, job_id=job_id)
    elif job.payload_key is not None:
        missing = False
        if scan.deep:
            try:
                found = layout.get(job.payload_key, limit=job.payload_length, payload=True)
                missing = found is None
            except Oversized as exc:  # longer than the job says: refused by its size, never read whole
                scan.finding(
                    job.payload_key, exc.reason, "payload_corrupt", exc.error_class, meta.store_time_ns, job_id=job_id
                )
                found = None
            if found is not None:
                try:
                    verify_payload(job, found[0])
                    scan.payloads_verified += 1
                except CorruptRecord as exc:
                    scan.finding(
                        job.payload_key,
                        exc.reason,
                        "payload_corrupt",
                        exc.error_class,
                        meta.store_time_ns,
                        job_id=job_id,
                    )
        else:
            missing = not layout.exists(job.payload_key)
        if missing:
            scan.finding(
                job.payload_key,
                QuarantineReason.ORPHAN_REFERENCED_PAYLOAD_MISSING,
                "payload_missing",
                f"named by {rel}",
                meta.store_time_ns,
                job_id=job_id,
            )
    if job.not_before_ns is not None:
        _delay_entry(scan, shard, job_id, job.not_before_ns, f"{rel} is due at {job.not_before_ns} ns")


def _inadmissible(scan: Scan, rel: str, generation: int, observed_ns: int, job_id: bytes, why: str) -> None:
    scan.finding(
        rel,
        QuarantineReason.INADMISSIBLE_CLAIM,
        "inadmissible_claim",
        why,
        observed_ns,
        detail=generation,
        job_id=job_id,
    )


def _chain(scan: Scan, shard: int, job_id: bytes, links: list[tuple[int, str, ObjectMeta]]) -> None:
    """One job's claim chain: density, each link's record and evidence, its job, its tail's lease entry."""
    layout = scan.layout
    first = links[0][0]
    if first != 1:
        # As the reference writes it: a head gap names the first present link, with its own store time.
        scan.finding(
            links[0][1],
            QuarantineReason.MISSING_GENERATION,
            "chain_gap",
            f"the chain starts at generation {first}",
            links[0][2].store_time_ns,
            detail=first,
            job_id=job_id,
        )
    for (g0, _, m0), (g1, _, _) in zip(links, links[1:], strict=False):
        if g1 != g0 + 1:
            missing = g0 + 1
            scan.finding(
                keys.claim_key(shard, job_id, missing),
                QuarantineReason.MISSING_GENERATION,
                "chain_gap",
                f"generation {missing} is missing before {g1}",
                m0.store_time_ns,
                detail=missing,
                job_id=job_id,
            )
    records = [cast(ClaimRecord | None, read_listed(scan, rel, meta, job_id)) for _, rel, meta in links]
    for i in range(1, len(links)):
        rec, prev = records[i], records[i - 1]
        if rec is None or prev is None:
            continue
        generation, rel, meta = links[i]
        if rec.continuation:
            if rec.worker_id != prev.worker_id or rec.prev_token != prev.worker_token:
                _inadmissible(scan, rel, generation, meta.store_time_ns, job_id, "a continuation without custody")
            continue
        basis = rec.basis
        prev_time = links[i - 1][2].store_time_ns
        if (
            basis is None
            or basis.prev_store_time_ns != prev_time
            or basis.prev_duration_ns != prev.lease_duration_ns
            or basis.prev_store_time_ns + basis.prev_duration_ns > basis.observed_watermark_ns
        ):
            _inadmissible(scan, rel, generation, meta.store_time_ns, job_id, "a takeover whose basis proves no expiry")
    tail_generation, tail_rel, tail_meta = links[-1]
    job_rel = keys.job_key(shard, job_id)
    if not layout.exists(job_rel):
        scan.finding(
            job_rel,
            QuarantineReason.KEY_RECORD_MISMATCH,
            "claims_without_job",
            f"{len(links)} claims, no job record",
            tail_meta.store_time_ns,
            job_id=job_id,
        )
        return
    tail = records[-1]
    if tail is None:
        return
    if layout.exists(keys.receipt_key(shard, job_id)) or layout.exists(keys.dead_key(shard, job_id)):
        return  # settled: no lease or retry left to index
    tail_time = tail_meta.store_time_ns
    fmt = layout.format
    if not is_expired(scan.floor_ns, tail_time, tail.lease_duration_ns, layout.skew_guard_ns):
        entry = keys.lease_index_key_for(
            tail_time, tail.lease_duration_ns, fmt.lease_bucket_width_ns, shard, job_id, tail_generation
        )
        scan.ensure_index(entry, f"{tail_rel} holds its lease")
    fail_rel = keys.fail_key(shard, job_id, tail_generation)
    try:
        found = layout.get(fail_rel)
    except Oversized as exc:
        scan.finding(fail_rel, exc.reason, "record_corrupt", exc.error_class, exc.meta.store_time_ns, job_id=job_id)
        found = None
    if found is not None:
        fail = read_listed(scan, fail_rel, found[1], job_id)
        if isinstance(fail, FailRecord):
            _delay_entry(scan, shard, job_id, fail.retry_not_before_ns, f"{fail_rel} retries later")


def _terminal(scan: Scan, shard: int, rel: str, meta: ObjectMeta, term: TermKind) -> None:
    kind = KeyKind.RECEIPT if term is TermKind.RECEIPT else KeyKind.DEAD
    parsed = _parsed(scan, rel, meta, kind, shard)
    if parsed is None:
        return
    job_id = cast(bytes, parsed.job_id)
    if read_listed(scan, rel, meta, job_id) is None:
        return
    layout = scan.layout
    if term is TermKind.RECEIPT and layout.exists(keys.dead_key(shard, job_id)):
        scan.finding(
            rel,
            QuarantineReason.DUPLICATE_STATE_CONFLICT,
            "duplicate_state_conflict",
            "the job has a receipt and a dead record",
            meta.store_time_ns,
            job_id=job_id,
        )
    width = layout.format.terminal_bucket_width_ns
    bucket = bucket_number(meta.store_time_ns, width)
    here = keys.termidx_key(bucket, term, shard, job_id)
    # The writer indexed the settling floor, a lower bound of this store time: this bucket or the one before.
    if bucket and layout.exists(keys.termidx_key(bucket - 1, term, shard, job_id)):
        return
    scan.ensure_index(here, f"{rel} settled in terminal bucket {bucket}")


def scan_shard(scan: Scan, shard: int, plane: str = PLANES[0], after: str = "") -> Iterator[tuple[str, str]]:
    """Scan one shard from (``plane``, ``after``); yields the position after each key's (or chain's) work.

    A position is (plane, last key done); (next plane, "") when a plane is finished.
    """
    start = PLANES.index(plane)
    for i, name in enumerate(PLANES[start:], start):
        prefix = keys.job_key(shard, bytes(16)).rpartition("/")[0].replace("jobs/", name + "/", 1) + "/"
        position = after if name == plane else ""
        if name == "claims":
            yield from _claims(scan, shard, prefix, position)
        else:
            for rel, meta in scan.pages(prefix, position):
                checkpoint(scan.budget)
                scan.scanned += 1
                if name == "jobs":
                    _job(scan, shard, rel, meta)
                else:
                    _terminal(scan, shard, rel, meta, TermKind.RECEIPT if name == "receipts" else TermKind.DEAD)
                yield name, rel
        if i + 1 < len(PLANES):
            yield PLANES[i + 1], ""  # this plane is done: resume at the start of the next


def _claims(scan: Scan, shard: int, prefix: str, after: str) -> Iterator[tuple[str, str]]:
    """The claims plane a chain at a time: the position is the last key of the last chain handled."""
    links: list[tuple[int, str, ObjectMeta]] = []
    job: bytes | None = None
    for rel, meta in scan.pages(prefix, after):
        scan.scanned += 1
        parsed = _parsed(scan, rel, meta, KeyKind.CLAIM, shard)
        if parsed is None:
            continue
        if job is not None and parsed.job_id != job:
            checkpoint(scan.budget)
            _chain(scan, shard, job, links)
            yield "claims", links[-1][1]
            links = []
        job = parsed.job_id
        links.append((cast(int, parsed.generation), rel, meta))
    if job is not None and links:
        checkpoint(scan.budget)
        _chain(scan, shard, job, links)
        yield "claims", links[-1][1]


@dataclass
class StepResult:
    """What one repair step did: its scan, whether it ran at all, and whether the cycle is complete."""

    scan: Scan
    ran: bool
    cycle_done: bool = False
    error: Exception | None = None


def repair_step(
    layout: QueueLayout,
    cursor_layout: QueueLayout,
    floor_ns: int,
    *,
    max_pages: int,
    only_if_due: bool = True,
    budget: Budget | None = None,
) -> StepResult:
    """Go on with the repair scan from the stored cursor for at most ``max_pages`` pages, then CAS the cursor.

    ``cursor_layout`` reads and writes the cursor; the recovery pass gives it
    the unbudgeted layout, so that the position reached is saved even when
    the budget ran out on the work itself (one operation past the budget).
    With ``only_if_due`` a new cycle starts only ``REPAIR_INTERVAL_NS`` after
    the last one ended. Budget exhaustion (``sweep.Exhausted``) propagates
    after the cursor is saved.
    """
    cursor, etag = read_cursor(cursor_layout)
    scan = Scan(layout, floor_ns, write=True, pages_left=max_pages, budget=budget)
    if only_if_due and cursor.at_start and cursor.completed_ns and cursor.completed_ns + REPAIR_INTERVAL_NS > floor_ns:
        return StepResult(scan, ran=False)
    position = cursor
    result = StepResult(scan, ran=True)
    try:
        for shard in range(cursor.shard, layout.format.shard_count):
            plane, after = (position.plane, position.after) if shard == position.shard else (PLANES[0], "")
            for done_plane, rel in scan_shard(scan, shard, plane, after):
                position = replace(position, shard=shard, plane=done_plane, after=rel)
            if shard + 1 < layout.format.shard_count:
                position = replace(position, shard=shard + 1, plane=PLANES[0], after="")
        position = Cursor(cycle=cursor.cycle + 1, completed_ns=floor_ns)
        result.cycle_done = True
    except PagesSpent:
        pass
    except (NotCommitted, OutcomeUnknown, StateExhausted) as exc:
        result.error = exc
    finally:
        if position != cursor:
            _save_cursor(cursor_layout, position, etag)
    return result
