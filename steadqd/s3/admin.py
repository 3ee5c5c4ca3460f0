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
again, never one that a worker could claim: retention GC's own
``delete_job_graph`` does it.

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

from steadqd.constants import ID_BYTES
from steadqd.durable_file import export_durably
from steadqd.errors import CorruptRecord, ErrorKind, InvalidInput, NotCommitted, OutcomeUnknown, SteadQError
from steadqd.s3 import keys
from steadqd.s3.keys import KeyKind, TermKind
from steadqd.s3.layout import Oversized, QueueLayout
from steadqd.s3.publish import enqueue
from steadqd.s3.records import QuarantineReason, QuarantineRecord
from steadqd.s3.recovery.gc import delete_job_graph
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
from steadqd.view_records import QuarantinedObject, quarantined_by_id

__all__ = [
    "QuarantinedObject",
    "REQUEUE_DOMAIN",
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


def _termidx_candidates(layout: QueueLayout, g: Graph) -> list[str]:
    """The keys the dead job's ``termidx/`` entry can have: the bucket of the burying worker's floor,
    which is at or a little before the dead record's store time."""
    if g.dead_time is None:
        return []
    width = layout.format.terminal_bucket_width_ns
    bucket = bucket_number(g.dead_time, width)
    return [keys.termidx_key(b, TermKind.DEAD, g.shard, g.job_id) for b in dict.fromkeys((bucket, max(bucket - 1, 0)))]


# =========================================================================== dead letters


def _dead_graph(layout: QueueLayout, job_id: str) -> Graph:
    """The graph of a dead job: NOT_FOUND when the job is not dead, refused when it is not only dead.

    The one definition of a dead job (``census.stats`` counts them by the
    same keys): a dead record under its job's own shard (the only key
    ``read_graph`` reads), no receipt beside it, and the record verifies.
    The job record may be gone: a removal that stopped after deleting it
    leaves a dead job, which a removal finishes.
    """
    g = read_graph(layout, parse_job_id(job_id))
    dead_rel = keys.dead_key(g.shard, g.job_id)
    for rel, exc, _ in g.problems:
        if rel == dead_rel:
            raise CorruptRecord(f"{layout.key(rel)}: {exc}; see steadq show", exc.reason, error_class=exc.error_class)
    if g.dead is None:
        raise _not_found(f"no dead record for job {job_id}")
    if g.receipt_time is not None:
        raise InvalidInput(
            f"job {job_id} has both a receipt and a dead record (a conflict the repair scan records); "
            "resolve it with steadq fsck --repair before requeueing or removing it"
        )
    return g


def remove_dead(layout: QueueLayout, job_id: str) -> None:
    """Delete a dead job's graph for good, in GC's order with the dead record last (``gc.delete_job_graph``).

    Its ``termidx/`` entry goes first (GC deletes the entry it works from;
    here there is none). Cost: :func:`~steadqd.s3.views.read_graph`, then
    GC's reads of the chain and a DELETE per key.
    """
    g = _dead_graph(layout, job_id)
    try:
        for rel in _termidx_candidates(layout, g):
            layout.store.delete(layout.key(rel))
        delete_job_graph(layout, g.shard, g.job_id, TermKind.DEAD)
    except (NotCommitted, OutcomeUnknown) as exc:
        raise NotCommitted(
            f"removing dead job {job_id} stopped ({exc}); run the removal again: it resumes where it stopped "
            "and the job stays dead meanwhile"
        ) from exc


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
    a GET of a detached payload, then per id tried HEADs of its terminal
    records and of its job, and the enqueue (1-2 PUTs).
    """
    if not max_attempts_reset:
        raise InvalidInput(
            "a bucket queue requeues a dead job as a new job, whose attempts always start afresh; "
            "max_attempts_reset=False cannot be honoured"
        )
    g = _dead_graph(layout, job_id)
    if g.job is None:
        # Not NOT_FOUND: the dead job is there (a bulk requeue would report it "gone since it was listed").
        why = "is missing" if not g.problems else f"fails verification ({g.problems[0][1]})"
        raise InvalidInput(
            f"job {job_id} is dead but its job record {g.job_rel} {why}: nothing to requeue; "
            "remove it with steadq admin dead-remove"
        )
    payload = read_payload_verified(layout, g.job)
    for n in range(1, _REQUEUE_GENERATIONS + 1):
        new_id = requeued_id(layout.queue_id, g.job_id, n)
        shard = keys.shard_of(layout.queue_id, new_id, layout.format.shard_count)
        if _settled(layout, new_id):
            continue  # that requeue ran its course (its graph may be half collected): the next id
        if layout.exists(keys.job_key(shard, new_id)):
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
    """``data`` at ``out_path`` as ``durable_file.export_durably`` writes every export, so none is ever partial."""
    parent, base = os.path.split(os.path.abspath(os.fspath(out_path)))
    if not base:
        raise InvalidInput(f"output path {out_path!r} names a directory")
    try:
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return export_durably(dir_fd, base, (data,))
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise SteadQError(f"write {out_path}: {exc.strerror or exc}", ErrorKind.IO_FAILURE) from exc


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
    return quarantined_by_id(
        list_quarantine(layout), wanted, lambda: _not_found(f"no quarantine finding {quarantine_id}")
    )


def export_quarantine(layout: QueueLayout, quarantine_id: str, out_path: str) -> int:
    """Write the raw bytes of the object the finding is about to ``out_path`` (one more GET)."""
    found = inspect_quarantine(layout, quarantine_id)
    try:
        obj = layout.get(found.path)
    except Oversized as exc:
        raise InvalidInput(f"{exc.message}; not exported: copy it with an S3 client if you need its bytes") from exc
    if obj is None:
        raise _not_found(
            f"{layout.key(found.path)}, the object of finding {quarantine_id}, no longer exists; "
            "remove the finding with admin quarantine-remove"
        )
    return _write_atomically(out_path, obj[0])


def remove_quarantine(layout: QueueLayout, quarantine_id: str) -> None:
    """Delete the finding (not the object it is about; see the module's docstring)."""
    found = inspect_quarantine(layout, quarantine_id)
    layout.store.delete(layout.key(found.finding))
