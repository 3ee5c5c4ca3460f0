"""The operator's tools on a bucket queue's dead letters and quarantine findings (``steadq admin``).

Why requeue makes a new job: in StowQ/1 the terminal record is the
tombstone (recovery.md), created once and never overwritten, so a dead job
cannot be given back its life, and the reference has no requeue. A
requeue here enqueues a *new* job with the dead job's verified payload,
content type and maximum attempts, and leaves the dead graph for retention
GC (or ``dead-remove``). The new id is derived from the dead one
(:func:`requeued_id`), so a requeue repeated after a crash or a lost answer
finds its own job instead of making a second; only once that job has
settled too does a further requeue of the same dead job make the next one.

Why removal deletes a whole graph in one fixed order: the terminal record
goes last (recovery.md, Retention and GC: advisory indexes, fails, claims,
payloads, the job record, then the receipt or dead record), so an
interrupted removal leaves a job that is still dead and can be removed
again, never one that a worker could claim. :func:`delete_terminal_graph`
is that order for one job, for retention GC to call as well.

Why removing a quarantine finding leaves the object alone: a finding is a
record *about* an object that never moved (nothing in a bucket is renamed);
deleting the finding is the resolution path recovery.md names, after the
operator has dealt with the object. A repair scan that finds the object
still bad records the same finding again.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from steadqd.constants import ID_BYTES
from steadqd.errors import CorruptRecord, ErrorKind, InvalidInput, NotCommitted, OutcomeUnknown, SteadQError
from steadqd.s3 import keys
from steadqd.s3.keys import KeyKind, TermKind
from steadqd.s3.layout import READ_TRIES, QueueLayout
from steadqd.s3.publish import enqueue
from steadqd.s3.records import ClaimRecord, FailRecord, QuarantineReason, QuarantineRecord
from steadqd.s3.timemath import bucket_number
from steadqd.s3.views import (
    Graph,
    iter_keys,
    parse_job_id,
    plane_prefix,
    read_graph,
    read_payload_verified,
    read_verified,
)

__all__ = [
    "QuarantinedObject",
    "REQUEUE_DOMAIN",
    "delete_terminal_graph",
    "export_dead",
    "export_quarantine",
    "inspect_quarantine",
    "list_quarantine",
    "remove_dead",
    "remove_quarantine",
    "requeue_dead",
    "requeued_id",
]

# steadqd's own derivation of a requeued job's id (StowQ/1 has no requeue): a domain like the format's.
REQUEUE_DOMAIN = b"steadqd-requeue\0"
# Requeues of one dead job that may each have settled in turn before a fresh id is refused.
_REQUEUE_GENERATIONS = 1000


def _not_found(what: str) -> SteadQError:
    return SteadQError(f"not found: {what}", ErrorKind.NOT_FOUND)


# =========================================================================== deleting a graph


def _delete(layout: QueueLayout, rel: str) -> None:
    """Delete ``rel``; a delete is idempotent, so one without a verdict is repeated."""
    last: SteadQError | None = None
    for _ in range(READ_TRIES):
        try:
            layout.store.delete(layout.key(rel))
            return
        except (NotCommitted, OutcomeUnknown) as exc:
            last = exc
    raise NotCommitted(
        f"{layout.key(rel)} could not be deleted ({last}); run the removal again: it resumes where it stopped"
    )


def _advisory_keys(layout: QueueLayout, g: Graph, term: TermKind, termidx_rel: str | None) -> list[str]:
    """The index entries and hint that may point at the graph (each claim and fail is read for its bucket)."""
    fmt = layout.format
    out = [keys.tail_key(g.shard, g.job_id)]
    if termidx_rel is not None:
        out.append(termidx_rel)
    else:
        # The entry is in the bucket of the settling worker's floor, at or a little before the record's time.
        settled = g.receipt_time if term is TermKind.RECEIPT else g.dead_time
        if settled is not None:
            bucket = bucket_number(settled, fmt.terminal_bucket_width_ns)
            for b in {bucket, max(bucket - 1, 0)}:
                out.append(keys.termidx_key(b, term, g.shard, g.job_id))
    if g.job is not None and g.job.not_before_ns is not None:
        out.append(keys.delay_index_key_for(g.job.not_before_ns, fmt.delayed_bucket_width_ns, g.shard, g.job_id))
    for generation, store_time in g.claims:
        claim, _, _ = read_verified(layout, keys.claim_key(g.shard, g.job_id, generation))
        if isinstance(claim, ClaimRecord):
            width = fmt.lease_bucket_width_ns
            out.append(
                keys.lease_index_key_for(store_time, claim.lease_duration_ns, width, g.shard, g.job_id, generation)
            )
    for generation in g.fails:
        fail, _, _ = read_verified(layout, keys.fail_key(g.shard, g.job_id, generation))
        if isinstance(fail, FailRecord):
            deadline = fail.retry_not_before_ns
            out.append(keys.delay_index_key(bucket_number(deadline, fmt.delayed_bucket_width_ns), g.shard, g.job_id))
    return list(dict.fromkeys(out))


def delete_terminal_graph(layout: QueueLayout, job_id: bytes, term: TermKind, *, termidx_rel: str | None = None) -> int:
    """Delete a settled job's every object, the terminal record last; returns how many keys were deleted.

    The order is recovery.md's: advisory entries (``tails/``, ``termidx/``,
    ``delayed/``, ``leases/``), ``fails/``, ``claims/``, ``payloads/``,
    ``jobs/``, then ``receipts/`` or ``dead/``. The caller has verified the
    terminal record (``term`` says which). ``termidx_rel`` is the entry GC
    is working from; without it the two buckets the entry can be in are
    tried. Cost: :func:`~steadqd.s3.views.read_graph`, a GET per claim and
    fail (their index buckets), a LIST of the payloads, a DELETE per key.
    Advisory entries it cannot name (a lease entry written with the floor
    for the claim's time) are pruned by the sweeps, which find no job.
    """
    if term is TermKind.RECEIPT:
        terminal = keys.receipt_key(keys.shard_of(layout.queue_id, job_id, layout.format.shard_count), job_id)
    else:
        terminal = keys.dead_key(keys.shard_of(layout.queue_id, job_id, layout.format.shard_count), job_id)
    g = read_graph(layout, job_id)
    doomed = _advisory_keys(layout, g, term, termidx_rel)
    doomed += [keys.fail_key(g.shard, job_id, generation) for generation in g.fails]
    doomed += [keys.claim_key(g.shard, job_id, generation) for generation, _ in g.claims]
    payloads = keys.payload_key(job_id, bytes(keys.DIGEST_BYTES)).rpartition("/")[0] + "/"
    doomed += [str(parsed) for parsed, _ in iter_keys(layout, payloads) if parsed.kind is KeyKind.PAYLOAD]
    doomed += [g.job_rel, terminal]
    for rel in doomed:
        _delete(layout, rel)
    return len(doomed)


# =========================================================================== dead letters


def _dead_graph(layout: QueueLayout, job_id: str) -> Graph:
    """The graph of a dead job, its dead record verified; NOT_FOUND when the job is not dead."""
    g = read_graph(layout, parse_job_id(job_id))
    dead_rel = keys.dead_key(g.shard, g.job_id)
    for rel, exc, _ in g.problems:
        if rel == dead_rel:
            raise CorruptRecord(f"{layout.key(rel)}: {exc}; see steadq show", exc.reason, error_class=exc.error_class)
    if g.dead is None:
        raise _not_found(f"no dead record for job {job_id}")
    return g


def remove_dead(layout: QueueLayout, job_id: str) -> int:
    """Delete a dead job's graph for good, the dead record last (:func:`delete_terminal_graph`)."""
    g = _dead_graph(layout, job_id)
    if g.receipt is not None:
        raise InvalidInput(
            f"job {job_id} has both a receipt and a dead record (a conflict the repair scan records); "
            "resolve it with steadq fsck --repair before removing either"
        )
    return delete_terminal_graph(layout, g.job_id, TermKind.DEAD)


def requeued_id(queue_id: bytes, dead_id: bytes, n: int) -> bytes:
    """The id of the ``n``-th job made from dead job ``dead_id`` (n from 1): the same for every operator."""
    data = REQUEUE_DOMAIN + queue_id + dead_id + n.to_bytes(4, "big")
    return hashlib.sha256(data).digest()[:ID_BYTES]


def _settled(layout: QueueLayout, job_id: bytes) -> bool:
    shard = keys.shard_of(layout.queue_id, job_id, layout.format.shard_count)
    return layout.exists(keys.receipt_key(shard, job_id)) or layout.exists(keys.dead_key(shard, job_id))


def requeue_dead(layout: QueueLayout, job_id: str, *, max_attempts_reset: bool = True) -> tuple[bytes, str]:
    """Enqueue a new job with the dead job's verified payload; returns (its id, its job key).

    A requeue repeated while the job it made is still unsettled returns that
    job (nothing is written). Cost: :func:`~steadqd.s3.views.read_graph`,
    a GET of a detached payload, then per id tried a HEAD of its job and
    HEADs of its terminal records, and the enqueue (1-2 PUTs).
    """
    if not max_attempts_reset:
        raise InvalidInput(
            "a bucket queue requeues a dead job as a new job, whose attempts always start afresh; "
            "max_attempts_reset=False cannot be honoured"
        )
    g = _dead_graph(layout, job_id)
    if g.job is None:
        why = "is missing" if not g.problems else f"fails verification ({g.problems[0][1]})"
        raise _not_found(f"job {job_id} is dead but its job record {g.job_rel} {why}: nothing to requeue")
    payload = read_payload_verified(layout, g.job)
    for n in range(1, _REQUEUE_GENERATIONS + 1):
        new_id = requeued_id(layout.queue_id, g.job_id, n)
        shard = keys.shard_of(layout.queue_id, new_id, layout.format.shard_count)
        if layout.exists(keys.job_key(shard, new_id)):
            if _settled(layout, new_id):
                continue  # that requeue ran its course: the next one gets the next id
            return new_id, keys.job_key(shard, new_id)
        done = enqueue(
            layout,
            payload,
            content_type=g.job.content_type,
            maximum_attempts=g.job.maximum_attempts,
            job_id=new_id,
        )
        return done.job_id, keys.job_key(done.shard, done.job_id)
    raise InvalidInput(f"job {job_id} was requeued {_REQUEUE_GENERATIONS} times already; enqueue its payload anew")


def _write_atomically(out_path: str, data: bytes) -> int:
    """``data`` at ``out_path`` through a temp, fsync and rename, so no partial output ever appears."""
    parent, base = os.path.split(os.path.abspath(os.fspath(out_path)))
    if not base:
        raise InvalidInput(f"output path {out_path!r} names a directory")
    tmp = os.path.join(parent, f".{base}.tmp.{os.urandom(8).hex()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(parent, base))
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise SteadQError(f"write {out_path}: {exc.strerror or exc}", ErrorKind.IO_FAILURE) from exc
    return len(data)


def export_dead(layout: QueueLayout, job_id: str, out_path: str, *, payload_only: bool = False) -> int:
    """Write the dead job's record (its stored bytes, verified) or only its verified payload to ``out_path``.

    The record is evidence: a StowQ/1 job record, bound to its key and
    queue, with an inline payload inside it. Cost: the dead job's
    :func:`~steadqd.s3.views.read_graph`, one more GET of the record or of
    a detached payload.
    """
    g = _dead_graph(layout, job_id)
    if g.job is None:
        raise _not_found(f"the job record of dead job {job_id} ({g.job_rel}) is missing or fails verification")
    if payload_only:
        return _write_atomically(out_path, read_payload_verified(layout, g.job))
    found = layout.get(g.job_rel)
    if found is None:
        raise _not_found(f"the job record of dead job {job_id} was deleted meanwhile")
    return _write_atomically(out_path, found[0])


# =========================================================================== quarantine findings


@dataclass(frozen=True)
class QuarantinedObject:
    """One finding: ``path`` is the object it is about (which stays where it is), ``size`` that object's.

    ``size`` is 0 when the object no longer exists; ``mtime_ns`` is the
    finding's store time; ``finding`` its own key.
    """

    quarantine_id: str
    reason: int
    path: str
    size: int
    mtime_ns: int | None = field(default=None, compare=False)
    finding: str = ""


def _size(layout: QueueLayout, rel: str) -> int:
    try:
        return layout.store.head(layout.key(rel)).size
    except SteadQError:
        return 0


def list_quarantine(layout: QueueLayout) -> Iterator[QuarantinedObject]:
    """Every finding, in key order (oldest bucket first). Cost: one LIST pass, a GET and a HEAD per finding.

    A finding that fails verification is listed as being about itself
    (envelope_corrupt), so that it can be looked at and removed.
    """
    for parsed, meta in iter_keys(layout, plane_prefix(KeyKind.QUARANTINE)):
        if parsed.kind is not KeyKind.QUARANTINE or parsed.qid is None:
            continue
        rel = str(parsed)
        qid = parsed.qid.hex()
        record, _, _ = read_verified(layout, rel)
        if not isinstance(record, QuarantineRecord):
            yield QuarantinedObject(qid, QuarantineReason.ENVELOPE_CORRUPT, rel, meta.size, meta.store_time_ns, rel)
            continue
        yield QuarantinedObject(qid, record.reason, record.source_key, _size(layout, record.source_key),
                                meta.store_time_ns, rel)  # fmt: skip


def _quarantine_id(quarantine_id: str) -> str:
    try:
        raw = bytes.fromhex(quarantine_id)
    except ValueError:
        raw = b""
    if len(raw) != keys.QID_BYTES or raw.hex() != quarantine_id:
        raise InvalidInput(f"quarantine id {quarantine_id!r} is not {2 * keys.QID_BYTES} lowercase hex digits")
    return quarantine_id


def inspect_quarantine(layout: QueueLayout, quarantine_id: str) -> QuarantinedObject:
    """The finding with this id; NOT_FOUND if none. Cost: as :func:`list_quarantine`, up to the finding."""
    wanted = _quarantine_id(quarantine_id)
    for found in list_quarantine(layout):
        if found.quarantine_id == wanted:
            return found
    raise _not_found(f"no quarantine finding {quarantine_id}")


def export_quarantine(layout: QueueLayout, quarantine_id: str, out_path: str) -> int:
    """Write the raw bytes of the object the finding is about to ``out_path`` (one more GET)."""
    found = inspect_quarantine(layout, quarantine_id)
    obj = layout.get(found.path)
    if obj is None:
        raise _not_found(
            f"{layout.key(found.path)}, the object of finding {quarantine_id}, no longer exists; "
            "remove the finding with admin quarantine-remove"
        )
    return _write_atomically(out_path, obj[0])


def remove_quarantine(layout: QueueLayout, quarantine_id: str) -> None:
    """Delete the finding (not the object it is about; see the module's docstring)."""
    found = inspect_quarantine(layout, quarantine_id)
    _delete(layout, found.finding)
