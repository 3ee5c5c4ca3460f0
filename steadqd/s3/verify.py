"""The checks a StowQ/1 record still has to pass after it has decoded.

``records.decode_record`` proves a record is well formed, unaltered and bound
to its key and queue. Whether it may be *used* depends on its context, which
the decoder does not see: the FORMAT of the queue it was read from, the key
(whose fields the record must repeat), the payload it promises. Each check
raises :class:`steadqd.errors.CorruptRecord` with the quarantine reason a
repair scan records for it (``vectors/rejects.json``, ``semantic_rejects`` and
``format_validate_rejects``). Admissibility of a claim is arithmetic on its
basis and its predecessor, in ``timemath``. Pure code: no clocks, no I/O.
"""

from __future__ import annotations

from typing import cast

from steadqd.errors import CorruptRecord, ErrorKind, InvalidInput
from steadqd.s3 import keys
from steadqd.s3.keys import KeyKind, ParsedKey
from steadqd.s3.records import (
    KNOWN_FEATURE_BITS,
    FeatureBit,
    FormatRecord,
    JobRecord,
    QuarantineReason,
    QuarantineRecord,
    Record,
    RecordType,
    decode_record,
    payload_digest,
    record_type,
)

__all__ = [
    "RECORD_AT",
    "check_feature_gate",
    "check_key_binding",
    "read_format",
    "read_record",
    "validate_format",
    "verify_payload",
]

# The record type each authoritative or meta key holds; other keys hold no record.
RECORD_AT: dict[KeyKind, RecordType] = {
    KeyKind.FORMAT: RecordType.FORMAT,
    KeyKind.JOB: RecordType.JOB,
    KeyKind.CLAIM: RecordType.CLAIM,
    KeyKind.FAIL: RecordType.FAIL,
    KeyKind.RECEIPT: RecordType.RECEIPT,
    KeyKind.DEAD: RecordType.DEAD,
    KeyKind.WATERMARK: RecordType.WATERMARK,
    KeyKind.QUARANTINE: RecordType.QUARANTINE,
}


def _format_corrupt(error_class: str, problem: str) -> CorruptRecord:
    return CorruptRecord(f"meta/FORMAT: {problem}", QuarantineReason.ENVELOPE_CORRUPT, error_class=error_class)


def validate_format(record: FormatRecord) -> FormatRecord:
    """Refuse a FORMAT that decodes but must not open a queue.

    An unknown required feature bit is UNSUPPORTED_FORMAT: the queue is fine,
    this version cannot honour it. A bad shard count or a zero bucket width is
    a corrupt FORMAT, since no valid writer produces one.
    """
    try:
        keys.check_shard_count(record.shard_count)
    except InvalidInput as err:
        raise _format_corrupt("field:shard_count", err.message) from None
    if 0 in (record.lease_bucket_width_ns, record.delayed_bucket_width_ns, record.terminal_bucket_width_ns):
        raise _format_corrupt("field:bucket width", "a bucket width is 0, and every width divides store time")
    unknown = record.required_feature_bits & ~KNOWN_FEATURE_BITS
    if unknown:
        raise CorruptRecord(
            f"meta/FORMAT requires feature bits 0x{unknown:x} that this steadqd does not know "
            f"(known: 0x{KNOWN_FEATURE_BITS:x}); open the queue with a newer version",
            QuarantineReason.UNSUPPORTED_REQUIRED_FEATURE,
            error_class="field:required_feature_bits",
            kind=ErrorKind.UNSUPPORTED_FORMAT,
        )
    return record


def check_feature_gate(record: Record, required_feature_bits: int) -> None:
    """A quarantine record under a queue whose FORMAT lacks bit 1 came from a writer of another version.

    It cannot be quarantined in turn (that queue takes no quarantine
    records), so it is reported with unsupported_required_feature.
    """
    if isinstance(record, QuarantineRecord) and not required_feature_bits & FeatureBit.QUARANTINE:
        raise CorruptRecord(
            "StowQ/1 record: a quarantine record (type 8) in a queue whose FORMAT does not require "
            "feature bit 1, so a writer of another version put it there",
            QuarantineReason.UNSUPPORTED_REQUIRED_FEATURE,
            error_class="feature_gate",
        )


def check_key_binding(record: Record, key: ParsedKey) -> None:
    """Refuse a record whose type or identity differs from the key it was read from.

    The key tag proves the writer meant this key; this proves the record says
    what the key says (the reference checks only the tag).
    """
    rt = record_type(record)
    problem = None
    if RECORD_AT.get(key.kind) is not rt:
        problem = f"a {rt.label} record under a {key.kind.label} key"
    else:
        # A fail key's generation is the claim it nacks, so every generation field is comparable.
        for name in ("job_id", "generation", "qid"):
            in_key, in_record = getattr(key, name), getattr(record, name, None)
            if in_key is not None and in_record is not None and in_key != in_record:
                shown = (in_record.hex(), in_key.hex()) if isinstance(in_key, bytes) else (in_record, in_key)
                problem = f"{name} {shown[0]} in the record, {shown[1]} in the key"
                break
    if problem is not None:
        raise CorruptRecord(
            f"StowQ/1 record at {key}: {problem}", QuarantineReason.KEY_RECORD_MISMATCH, error_class="key_record"
        )


def verify_payload(job: JobRecord, payload: bytes) -> bytes:
    """``payload`` if its length and SHA-256 are the job's; a payload that is not is never delivered.

    Inline payloads are checked too, although the record digest covers them
    (the reference does not): a writer that computed payload_digest wrongly
    must not get its job run.
    """
    problem = None
    if len(payload) != job.payload_length:
        problem = ("payload_length", f"is {len(payload)} bytes, the job record says {job.payload_length}")
    elif payload_digest(payload) != job.payload_digest:
        problem = ("payload_digest", "does not hash to the job record's payload_digest")
    if problem is not None:
        raise CorruptRecord(
            f"payload of job {job.job_id.hex()} {problem[1]}",
            QuarantineReason.PAYLOAD_CORRUPT,
            error_class=problem[0],
            payload=True,
        )
    return payload


def read_format(data: bytes, queue_id: bytes) -> FormatRecord:
    """The FORMAT of a queue from the bytes of its ``meta/FORMAT``, refused unless it may be opened."""
    record = read_record(data, queue_id, keys.FORMAT_KEY, required_feature_bits=0)
    return validate_format(cast(FormatRecord, record))  # check_key_binding allows nothing else at meta/FORMAT


def read_record(data: bytes, queue_id: bytes, key: str | ParsedKey, *, required_feature_bits: int) -> Record:
    """The record stored at ``key`` (relative to the queue's prefix), with every check that needs only the key.

    Decodes with the key's own tag, then refuses a record that contradicts the
    key or that its queue's FORMAT (``required_feature_bits``) does not allow.
    A key that is no key shape raises InvalidKey.
    """
    parsed = key if isinstance(key, ParsedKey) else keys.parse_key(key)
    record = decode_record(data, queue_id, keys.key_tag(queue_id, str(parsed)))
    check_key_binding(record, parsed)
    check_feature_gate(record, required_feature_bits)
    return record
