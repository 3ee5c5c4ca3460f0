"""StowQ/1 records: the envelope, the eight record types, their digests, and strict decoding.

Spec: ``records.md`` (Framing, the record sections, Test vectors) and
``reasons.md``; ``vectors/records.json`` pins every encoding byte for byte
and ``vectors/rejects.json`` every refusal. A record is the canonical CBOR
array ``[magic, major, minor, queue_id, key_tag, record_type, fields]``
followed by a 32-byte byte string, the record digest: SHA-256 over
``"StowQ-1-<type>\\0"`` and every byte before it. The key tag binds the
record to its key and queue (``keys.key_tag``), so a record copied to another
key or queue fails on read.

Records are written once and read by many implementations, so the decoder
refuses every encoding but the canonical one, and it checks in the order the
reference decoder does (the reject vectors pin the first failing check):
framing and envelope shapes, magic, version, type, digest, binding, then the
fields map (key text, known key, strictly increasing canonical position,
value type, presence rules) and finally nothing after the map. No field is
looked at before the digest has been verified. The encoder accepts exactly
what the decoder returns, so a record that encodes always decodes to itself.

The checks a decoded record must still pass in its context (its key, its
queue's FORMAT, its payload) are in ``verify``; what a record means for the
protocol (admissibility, deadlines) is in ``timemath``. This module builds
records by the rules that decide their bytes: the payload digest, the inline
limit, the deterministic quarantine id. Pure code: no clocks, no I/O.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeAlias

from steadqd import cbor
from steadqd.constants import ID_BYTES, U64_MAX, DeadReason
from steadqd.errors import CorruptRecord, InvalidInput
from steadqd.s3 import keys
from steadqd.s3.keys import DIGEST_BYTES, KEY_TAG_BYTES, MAX_SHARD_COUNT, QID_BYTES
from steadqd.text import printable

__all__ = [
    "BASIS_WIRE",
    "DIGEST_TRAILER",
    "KNOWN_FEATURE_BITS",
    "MAGIC",
    "MAJOR",
    "MINOR",
    "RECORD_FIELDS_MAX",
    "INLINE_READ_MAX",
    "ClaimBasis",
    "ClaimRecord",
    "DeadReason",
    "DeadRecord",
    "FailRecord",
    "FeatureBit",
    "FormatRecord",
    "JobRecord",
    "QuarantineReason",
    "QuarantineRecord",
    "ReceiptRecord",
    "Record",
    "RecordType",
    "WatermarkRecord",
    "decode_record",
    "digest_domain",
    "encode_record",
    "new_job",
    "new_quarantine",
    "payload_digest",
    "record_limit",
    "record_type",
    "stores_inline",
    "wire_order",
]

MAGIC = 0x53544F5751312D00  # "STOWQ1-\0"
MAJOR = 1
MINOR = 0
TOKEN_BYTES = 16  # worker_token and prev_token: the writer's secret for outcome-unknown resolution
QUEUE_ID_BYTES = ID_BYTES

# The trailer: CBOR head 0x58 0x20 (a 32-byte byte string), then the digest.
DIGEST_HEAD = bytes((0x58, DIGEST_BYTES))
DIGEST_TRAILER = len(DIGEST_HEAD) + DIGEST_BYTES
_ENVELOPE_ITEMS = 7

# DeadReason (re-exported from steadqd.constants): StowQ/1's dead-letter registry is SteadQ/1's, code for code.


class RecordType(enum.IntEnum):
    """Record type numbers; the lowercase name is the digest domain's ``<type>``."""

    FORMAT = 1
    JOB = 2
    CLAIM = 3
    FAIL = 4
    RECEIPT = 5
    DEAD = 6
    WATERMARK = 7
    QUARANTINE = 8  # v1.1, gated by FeatureBit.QUARANTINE

    @property
    def label(self) -> str:
        return self.name.lower()


def digest_domain(record_type: RecordType) -> bytes:
    return b"StowQ-1-" + record_type.label.encode("ascii") + b"\0"


class FeatureBit(enum.IntFlag):
    """FORMAT ``required_feature_bits``: a reader refuses a queue demanding a bit it does not know."""

    QUARANTINE = 1  # quarantine records (type 8) may be written
    TAIL_HINTS = 2  # tails/ hints are maintained


# A plain int: ~ of an IntFlag complements within the known members only.
KNOWN_FEATURE_BITS = int(FeatureBit.QUARANTINE | FeatureBit.TAIL_HINTS)


class QuarantineReason(enum.IntEnum):
    """StowQ/1's quarantine registry (reasons.md); 0x0100-0xffff is implementation detail.

    Codes 0x0001-0x0007 mean what SteadQ/1's do (``steadqd.constants``), which
    is why the shared CBOR layer can report envelope_corrupt for both.
    """

    ENVELOPE_CORRUPT = 0x0001
    PAYLOAD_CORRUPT = 0x0002
    KEY_PARSE_FAILED = 0x0003
    KEY_TAG_FAILED = 0x0004
    KEY_RECORD_MISMATCH = 0x0005
    UNSUPPORTED_REQUIRED_FEATURE = 0x0006
    DUPLICATE_STATE_CONFLICT = 0x0007
    INADMISSIBLE_CLAIM = 0x0010
    OUTPUT_DIGEST_CONFLICT = 0x0011
    STORE_TIME_REGRESSION = 0x0012
    RECEIPT_EVIDENCE_MISMATCH = 0x0013
    ORPHAN_REFERENCED_PAYLOAD_MISSING = 0x0014
    MISSING_GENERATION = 0x0015


# --------------------------------------------------------------------------
# The record types. Field names are the wire names; field order is the
# reference's, which is the order it reports a missing field in.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class FormatRecord:
    """``meta/FORMAT``, written once at init. The queue id travels in the envelope."""

    shard_count: int
    lease_bucket_width_ns: int
    delayed_bucket_width_ns: int
    terminal_bucket_width_ns: int
    inline_limit: int
    required_feature_bits: int


@dataclass(frozen=True)
class JobRecord:
    """``jobs/<shard>/<job-id>``: exactly one of ``payload_inline`` and ``payload_key`` is set."""

    job_id: bytes
    maximum_attempts: int
    content_type: str
    created_store_time_ns: int  # informative only; 0 when the writer did not fill it
    payload_digest: bytes
    payload_length: int
    not_before_ns: int | None = None
    payload_inline: bytes | None = None
    payload_key: str | None = None


@dataclass(frozen=True)
class ClaimBasis:
    """A takeover's evidence that generation g-1 had expired: its store time and lease, and the floor seen."""

    prev_store_time_ns: int
    prev_duration_ns: int
    observed_watermark_ns: int


@dataclass(frozen=True)
class ClaimRecord:
    """``claims/<shard>/<job-id>/<g>``: a takeover carries ``basis``, a continuation ``prev_token``."""

    job_id: bytes
    generation: int
    attempt: int
    worker_id: str
    worker_token: bytes
    lease_duration_ns: int
    continuation: bool
    basis: ClaimBasis | None = None
    prev_token: bytes | None = None


@dataclass(frozen=True)
class FailRecord:
    """``fails/<shard>/<job-id>/<g>``: a nack of generation g, with its retry deadline."""

    job_id: bytes
    generation: int
    reason: int
    attempt: int
    retry_not_before_ns: int


@dataclass(frozen=True)
class ReceiptRecord:
    """``receipts/<shard>/<job-id>``: the first ack wins; an empty ``output_digests`` is left off the wire."""

    job_id: bytes
    generation: int
    attempt: int
    worker_id: str
    worker_token: bytes
    payload_digest: bytes
    output_digests: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class DeadRecord:
    """``dead/<shard>/<job-id>``: buried, with a dead-letter reason (``DeadReason``)."""

    job_id: bytes
    generation: int
    attempt: int
    reason: int


@dataclass(frozen=True)
class WatermarkRecord:
    """``meta/watermark``, the one object that is overwritten (compare-and-swap)."""

    highest_observed_wall_bucket: int
    sequence: int


@dataclass(frozen=True)
class QuarantineRecord:
    """``quarantine/<bucket>/<qid>``: an audit finding; deterministic so auditors converge byte for byte."""

    qid: bytes
    source_key: str  # relative key of the offending object
    reason: int  # QuarantineReason
    observed_store_ns: int  # the source object's store time, not the finding's
    detail: int | None = None


Record: TypeAlias = (
    FormatRecord
    | JobRecord
    | ClaimRecord
    | FailRecord
    | ReceiptRecord
    | DeadRecord
    | WatermarkRecord
    | QuarantineRecord
)

# --------------------------------------------------------------------------
# Field schemas
# --------------------------------------------------------------------------


class Kind(enum.Enum):
    """A field's wire type."""

    UINT = "unsigned integer"
    BOOL = "bool"
    TEXT = "text"
    BYTES = "byte string"  # any length; ``Field.width`` fixes it where the schema does
    BASIS = "claim basis map"
    DIGESTS = "array of digests"  # of DIGEST_BYTES each, non-empty


@dataclass(frozen=True)
class Field:
    name: str
    kind: Kind
    width: int | None = None  # for BYTES: the only length allowed


@dataclass(frozen=True)
class Schema:
    """One record type: its fields in canonical wire order, and the order missing fields are reported in."""

    record_type: RecordType
    cls: type[Any]
    wire: tuple[Field, ...]
    optional: frozenset[str]
    missing_order: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.wire)


def _schema(
    record_type: RecordType,
    cls: type[Any],
    wire: tuple[Field, ...],
    optional: tuple[str, ...] = (),
    missing_order: tuple[str, ...] | None = None,
) -> Schema:
    if {f.name for f in fields(cls)} != {f.name for f in wire}:
        raise AssertionError(f"{cls.__name__}: the wire table and the dataclass name different fields")
    order = missing_order or tuple(f.name for f in fields(cls))
    return Schema(record_type, cls, wire, frozenset(optional), tuple(n for n in order if n not in optional))


def _u(name: str) -> Field:
    return Field(name, Kind.UINT)


def _fixed(name: str, width: int) -> Field:
    return Field(name, Kind.BYTES, width)


_JOB_ID = _fixed("job_id", ID_BYTES)
_FORMAT_WIRE = (
    _u("shard_count"),
    _u("inline_limit"),
    _u("lease_bucket_width_ns"),
    _u("required_feature_bits"),
    _u("delayed_bucket_width_ns"),
    _u("terminal_bucket_width_ns"),
)
SCHEMAS: dict[RecordType, Schema] = {
    s.record_type: s
    for s in (
        # The reference reports a missing FORMAT field in wire order, the others in field order.
        _schema(RecordType.FORMAT, FormatRecord, _FORMAT_WIRE, missing_order=tuple(f.name for f in _FORMAT_WIRE)),
        _schema(
            RecordType.JOB,
            JobRecord,
            (
                _JOB_ID,
                Field("payload_key", Kind.TEXT),
                Field("content_type", Kind.TEXT),
                _u("not_before_ns"),
                _fixed("payload_digest", DIGEST_BYTES),
                Field("payload_inline", Kind.BYTES),
                _u("payload_length"),
                _u("maximum_attempts"),
                _u("created_store_time_ns"),
            ),
            optional=("not_before_ns", "payload_inline", "payload_key"),
        ),
        _schema(
            RecordType.CLAIM,
            ClaimRecord,
            (
                Field("basis", Kind.BASIS),
                _JOB_ID,
                _u("attempt"),
                Field("worker_id", Kind.TEXT),
                _u("generation"),
                _fixed("prev_token", TOKEN_BYTES),
                Field("continuation", Kind.BOOL),
                _fixed("worker_token", TOKEN_BYTES),
                _u("lease_duration_ns"),
            ),
            optional=("basis", "prev_token"),
        ),
        _schema(
            RecordType.FAIL,
            FailRecord,
            (_JOB_ID, _u("reason"), _u("attempt"), _u("generation"), _u("retry_not_before_ns")),
        ),
        _schema(
            RecordType.RECEIPT,
            ReceiptRecord,
            (
                _JOB_ID,
                _u("attempt"),
                Field("worker_id", Kind.TEXT),
                _u("generation"),
                _fixed("worker_token", TOKEN_BYTES),
                Field("output_digests", Kind.DIGESTS),
                _fixed("payload_digest", DIGEST_BYTES),
            ),
            optional=("output_digests",),
        ),
        _schema(RecordType.DEAD, DeadRecord, (_JOB_ID, _u("reason"), _u("attempt"), _u("generation"))),
        _schema(RecordType.WATERMARK, WatermarkRecord, (_u("sequence"), _u("highest_observed_wall_bucket"))),
        _schema(
            RecordType.QUARANTINE,
            QuarantineRecord,
            (
                _fixed("qid", QID_BYTES),
                _u("detail"),
                _u("reason"),
                Field("source_key", Kind.TEXT),
                _u("observed_store_ns"),
            ),
            optional=("detail",),
        ),
    )
}
BASIS_WIRE = ("prev_duration_ns", "prev_store_time_ns", "observed_watermark_ns")
_TYPE_OF: dict[type[Any], RecordType] = {s.cls: t for t, s in SCHEMAS.items()}


def wire_order(rt: RecordType) -> tuple[str, ...]:
    """Every field name of a record type in canonical order (shorter names first, then bytewise)."""
    return SCHEMAS[rt].names


def record_type(record: Record) -> RecordType:
    rt = _TYPE_OF.get(type(record))
    if rt is None:
        raise InvalidInput(f"not a StowQ/1 record: {type(record).__name__}")
    return rt


# --------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------


def _bad(record_type: RecordType, name: str, problem: str) -> InvalidInput:
    return InvalidInput(f"{record_type.label} record: {name} {problem}")


def _uint(rt: RecordType, name: str, value: object) -> bytes:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U64_MAX:
        raise _bad(rt, name, f"must be an integer in 0..2^64-1, got {value!r}")
    return cbor.encode_head(cbor.UINT, value)


def _bytes(rt: RecordType, name: str, value: object, width: int | None) -> bytes:
    if not isinstance(value, bytes | bytearray):
        raise _bad(rt, name, f"must be bytes, got {type(value).__name__}")
    if width is not None and len(value) != width:
        raise _bad(rt, name, f"must be {width} bytes, got {len(value)}")
    return cbor.encode_head(cbor.BYTES, len(value)) + bytes(value)


def _text(rt: RecordType, name: str, value: object) -> bytes:
    if not isinstance(value, str):
        raise _bad(rt, name, f"must be text, got {type(value).__name__}")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _bad(rt, name, f"is not valid Unicode text ({exc.reason})") from None
    return cbor.encode_head(cbor.TEXT, len(raw)) + raw


def _key(name: str) -> bytes:
    return cbor.encode_head(cbor.TEXT, len(name)) + name.encode("ascii")


def _encode_value(rt: RecordType, field: Field, value: Any) -> bytes:
    name = field.name
    if field.kind is Kind.UINT:
        if rt is RecordType.FORMAT and name == "shard_count" and isinstance(value, int) and value > MAX_SHARD_COUNT:
            raise _bad(rt, name, f"must be at most {MAX_SHARD_COUNT} (the shard field is 4 hex digits), got {value}")
        return _uint(rt, name, value)
    if field.kind is Kind.BOOL:
        if not isinstance(value, bool):
            raise _bad(rt, name, f"must be a bool, got {value!r}")
        return bytes((cbor.TRUE if value else cbor.FALSE,))
    if field.kind is Kind.TEXT:
        return _text(rt, name, value)
    if field.kind is Kind.BYTES:
        return _bytes(rt, name, value, field.width)
    if field.kind is Kind.BASIS:
        if not isinstance(value, ClaimBasis):
            raise _bad(rt, name, f"must be a ClaimBasis, got {type(value).__name__}")
        out = cbor.encode_head(cbor.MAP, len(BASIS_WIRE))
        for part in BASIS_WIRE:
            out += _key(part) + _uint(rt, f"basis.{part}", getattr(value, part))
        return out
    if not isinstance(value, tuple | list):
        raise _bad(rt, name, f"must be a tuple of {DIGEST_BYTES}-byte digests, got {type(value).__name__}")
    return cbor.encode_head(cbor.ARRAY, len(value)) + b"".join(
        _bytes(rt, f"{name}[{i}]", d, DIGEST_BYTES) for i, d in enumerate(value)
    )


def _present(name: str, value: Any) -> bool:
    # An empty output_digests is the absent field: the reader refuses [].
    return value is not None and not (name == "output_digests" and len(value) == 0)


def _check_presence(record: Record) -> None:
    """The rules the decoder applies after reading the map, applied before writing it."""
    if isinstance(record, JobRecord) and (record.payload_inline is None) == (record.payload_key is None):
        raise _bad(RecordType.JOB, "payload_inline", "and payload_key: exactly one must be set")
    if isinstance(record, ClaimRecord):
        evidence = "prev_token" if record.continuation else "basis"
        if not _claim_evidence_ok(record.continuation, record.basis is not None, record.prev_token is not None):
            raise _bad(RecordType.CLAIM, evidence, "must be the only evidence a claim carries (basis xor prev_token)")


def _claim_evidence_ok(continuation: Any, has_basis: bool, has_prev_token: bool) -> bool:
    # A takeover proves the predecessor expired; a continuation proves custody.
    return has_basis != has_prev_token and bool(continuation) == has_prev_token


def _check_id(what: str, value: object, width: int) -> bytes:
    if not isinstance(value, bytes | bytearray) or len(value) != width:
        raise InvalidInput(f"{what} must be {width} bytes, got {value!r}")
    return bytes(value)


def encode_record(record: Record, queue_id: bytes, key_tag: bytes) -> bytes:
    """The stored bytes of ``record`` for the key whose tag is ``key_tag`` (``keys.key_tag``).

    Raises InvalidInput naming the field when the record could not be read
    back (a value out of range, a wrong width, a presence rule broken).
    """
    rt = record_type(record)
    schema = SCHEMAS[rt]
    _check_presence(record)
    entries = [
        _key(field.name) + _encode_value(rt, field, getattr(record, field.name))
        for field in schema.wire
        if _present(field.name, getattr(record, field.name))
    ]
    body = b"".join(
        (
            cbor.encode_head(cbor.ARRAY, _ENVELOPE_ITEMS),
            cbor.encode_head(cbor.UINT, MAGIC),
            cbor.encode_head(cbor.UINT, MAJOR),
            cbor.encode_head(cbor.UINT, MINOR),
            _bytes(rt, "queue_id", _check_id("queue_id", queue_id, QUEUE_ID_BYTES), None),
            _bytes(rt, "key_tag", _check_id("key_tag", key_tag, KEY_TAG_BYTES), None),
            cbor.encode_head(cbor.UINT, rt),
            cbor.encode_head(cbor.MAP, len(entries)),
            *entries,
        )
    )
    return body + DIGEST_HEAD + hashlib.sha256(digest_domain(rt) + body).digest()


# --------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------


# An unknown field name comes from the stored bytes: at most this much of it goes into a message.
_SHOWN = 64


def _corrupt(error_class: str, message: str, reason: int = QuarantineReason.ENVELOPE_CORRUPT) -> CorruptRecord:
    return CorruptRecord(f"StowQ/1 record: {message}", reason, error_class=error_class)


class _Fields:
    """The record decoder's cursor: the shared canonical reader plus the reference's field-type errors."""

    def __init__(self, body: bytes, rt: RecordType | None = None) -> None:
        self.r = cbor.Reader(body)
        self.rt = rt

    def where(self, name: str) -> str:
        return f"{self.rt.label if self.rt else 'envelope'} field {name}"

    def typed_head(self, major: int, error_class: str, name: str, expected: str) -> int:
        got, arg = self.r.head()
        if got != major:
            raise _corrupt(error_class, f"{self.where(name)} must be {expected} (major type {got} found)")
        return arg

    def uint(self, name: str) -> int:
        return self.typed_head(cbor.UINT, "field:uint", name, "an unsigned integer")

    def boolean(self, name: str) -> bool:
        got, arg = self.r.head()
        if got == cbor.SIMPLE and arg in (cbor.SIMPLE_FALSE, cbor.SIMPLE_TRUE):
            return arg == cbor.SIMPLE_TRUE
        raise _corrupt("field:bool", f"{self.where(name)} must be true or false")

    def raw_bytes(self, name: str, width: int | None = None) -> bytes:
        n = self.typed_head(cbor.BYTES, "field:bytes", name, "a byte string")
        value = self.r.take(n)
        if width is not None and len(value) != width:
            raise _corrupt("field:byte width", f"{self.where(name)} is {len(value)} bytes, {width} expected")
        return value

    def text(self, name: str) -> str:
        n = self.typed_head(cbor.TEXT, "field:text", name, "text")
        return self.r.text(n)

    def fields_map(
        self, table: tuple[str, ...], not_a_map: str, read: Callable[[str], None], where: str | None = None
    ) -> None:
        """Read a map whose keys must be in ``table``, strictly in table (canonical) order."""
        got, count = self.r.head()
        if got != cbor.MAP:
            label = where or (self.rt.label if self.rt else "record")
            raise _corrupt(not_a_map, f"the {label} fields are not a map (major type {got})")
        previous = -1
        for _ in range(count):
            name = self.text("name")
            try:
                position = table.index(name)
            except ValueError:
                label = where or (self.rt.label if self.rt else "record")
                shown = printable(name[:_SHOWN]) + ("..." if len(name) > _SHOWN else "")
                raise _corrupt("unknown_field", f"unknown {label} field '{shown}'") from None
            if position == previous:
                raise _corrupt(cbor.DUPLICATE_MAP_KEY, f"{self.where(name)} appears twice")
            if position < previous:
                raise _corrupt(cbor.UNSORTED_MAP_KEYS, f"{self.where(name)} comes after {table[previous]!r}")
            previous = position
            read(name)


def _envelope_uint(f: _Fields, what: str) -> int:
    got, arg = f.r.head()
    if got != cbor.UINT:
        raise _corrupt("envelope", f"the envelope's {what} is not an unsigned integer")
    return arg


def _envelope_bytes(f: _Fields, what: str) -> bytes:
    got, n = f.r.head()
    if got != cbor.BYTES:
        raise _corrupt("envelope", f"the envelope's {what} is not a byte string")
    return f.r.take(n)


def _read_basis(f: _Fields) -> ClaimBasis:
    values: dict[str, int] = {}

    def read(name: str) -> None:
        values[name] = f.uint(f"basis.{name}")

    f.fields_map(BASIS_WIRE, "field:basis", read, where="claim basis")
    for name in BASIS_WIRE:
        if name not in values:
            raise _corrupt("missing_field", f"claim field basis lacks {name}")
    return ClaimBasis(**values)


def _read_digests(f: _Fields, name: str) -> tuple[bytes, ...]:
    got, count = f.r.head()
    if got != cbor.ARRAY:
        raise _corrupt("field:output_digests", f"{f.where(name)} must be an array")
    if count == 0:
        raise _corrupt("field:output_digests", f"{f.where(name)} is empty; an empty list is left off the record")
    # The declared count is untrusted: items are read until the body runs out.
    return tuple(f.raw_bytes(f"{name}[{i}]", DIGEST_BYTES) for i in range(count))


def _read_value(f: _Fields, rt: RecordType, field: Field) -> object:
    name = field.name
    if field.kind is Kind.UINT:
        value = f.uint(name)
        if rt is RecordType.FORMAT and name == "shard_count" and value > MAX_SHARD_COUNT:
            raise _corrupt("field:shard_count", f"format field shard_count {value} exceeds {MAX_SHARD_COUNT}")
        return value
    if field.kind is Kind.BOOL:
        return f.boolean(name)
    if field.kind is Kind.TEXT:
        return f.text(name)
    if field.kind is Kind.BYTES:
        return f.raw_bytes(name, field.width)
    if field.kind is Kind.BASIS:
        return _read_basis(f)
    return _read_digests(f, name)


def _read_fields(f: _Fields, schema: Schema) -> Record:
    values: dict[str, object] = {}
    by_name = {field.name: field for field in schema.wire}

    def read(name: str) -> None:
        values[name] = _read_value(f, schema.record_type, by_name[name])

    f.fields_map(schema.names, "envelope", read)
    rt = schema.record_type
    if rt is RecordType.JOB and ("payload_inline" in values) == ("payload_key" in values):
        raise _corrupt(
            "field:payload inline xor key", "job record must carry exactly one of payload_inline, payload_key"
        )
    if rt is RecordType.CLAIM:
        if "continuation" not in values:
            raise _corrupt("missing_field", "claim record lacks continuation")
        if not _claim_evidence_ok(values["continuation"], "basis" in values, "prev_token" in values):
            raise _corrupt(
                "field:basis xor prev_token",
                "claim record must carry basis if a takeover, prev_token if a continuation, never both",
            )
    for name in schema.missing_order:
        if name not in values:
            raise _corrupt("missing_field", f"{rt.label} record lacks {name}")
    record: Record = schema.cls(**values)
    return record


def decode_record(data: bytes, queue_id: bytes, key_tag: bytes) -> Record:
    """Verify and decode a stored record read from the key whose tag is ``key_tag``.

    Raises CorruptRecord: ``error_class`` names the first failed check (the
    classes of ``rejects.json``), ``reason`` the quarantine reason the object
    earns (key_tag_failed for a record bound to another key or queue,
    envelope_corrupt for everything else).
    """
    data = bytes(data)
    if len(data) < DIGEST_TRAILER or data[-DIGEST_TRAILER:-DIGEST_BYTES] != DIGEST_HEAD:
        raise _corrupt("envelope", f"{len(data)} bytes do not end with the 34-byte record digest")
    body, digest = data[:-DIGEST_TRAILER], data[-DIGEST_BYTES:]
    f = _Fields(body)
    got, count = f.r.head()
    if got != cbor.ARRAY or count != _ENVELOPE_ITEMS:
        raise _corrupt("envelope", "the record is not a 7-item array")
    magic = _envelope_uint(f, "magic")
    major = _envelope_uint(f, "major version")
    minor = _envelope_uint(f, "minor version")
    stored_queue_id = _envelope_bytes(f, "queue_id")
    stored_tag = _envelope_bytes(f, "key_tag")
    type_number = _envelope_uint(f, "record type")
    if magic != MAGIC:
        raise _corrupt("magic", f"magic 0x{magic:x} is not StowQ/1's 0x{MAGIC:x}")
    if (major, minor) != (MAJOR, MINOR):
        raise _corrupt("version", f"version {major}.{minor} is not {MAJOR}.{MINOR}")
    try:
        rt = RecordType(type_number)
    except ValueError:
        raise _corrupt("record_type", f"record type {type_number} is not one of 1..8") from None
    if hashlib.sha256(digest_domain(rt) + body).digest() != digest:
        raise _corrupt("digest", f"the {rt.label} record's digest does not match its bytes")
    if stored_queue_id != bytes(queue_id) or stored_tag != bytes(key_tag):
        what = "queue" if stored_queue_id != bytes(queue_id) else "key"
        raise _corrupt("binding", f"the {rt.label} record is bound to another {what}", QuarantineReason.KEY_TAG_FAILED)
    f.rt = rt
    record = _read_fields(f, SCHEMAS[rt])
    if not f.r.done:
        raise _corrupt(cbor.TRAILING_BYTES, f"{f.r.remaining} bytes follow the {rt.label} fields")
    return record


# --------------------------------------------------------------------------
# Building records by the rules (the checks of decoded records are in verify.py)
# --------------------------------------------------------------------------


def payload_digest(payload: bytes) -> bytes:
    return hashlib.sha256(payload).digest()


# The most bytes a record may take besides an inline payload. records.md sets no maximum, but no
# record grows without bound except through ``payload_inline``: the others are 115-336 B (docs/stowq.md,
# "Records"), a receipt 210 B plus 34 B per output, short text fields (content type, worker id). So
# 64 KiB is ample for every valid record, and a reader fetches no more than this: any object under
# the prefix may be another tenant's, and one of gigabytes must not be read whole to be refused.
RECORD_FIELDS_MAX = 64 * 1024
# The most inline payload a reader fetches, whatever the FORMAT's inline_limit (which may be 2^64-1):
# beyond it a queue's jobs carry their payloads as separate objects.
INLINE_READ_MAX = 16 * 1024 * 1024


def record_limit(inline_limit: int) -> int:
    """The largest record of a queue with this FORMAT ``inline_limit``: what a reader fetches and a writer may write."""
    return RECORD_FIELDS_MAX + min(inline_limit, INLINE_READ_MAX)


def stores_inline(payload_length: int, inline_limit: int) -> bool:
    """A payload goes into the job record iff it is at most the FORMAT's inline_limit bytes."""
    return payload_length <= inline_limit


def new_job(
    job_id: bytes,
    payload: bytes,
    *,
    content_type: str,
    maximum_attempts: int,
    inline_limit: int,
    not_before_ns: int | None = None,
) -> JobRecord:
    """The job record for ``payload``: inline within the limit, else a ``payloads/`` reference.

    A detached payload must be stored under ``payload_key`` before the record.
    """
    digest = payload_digest(payload)
    inline = stores_inline(len(payload), inline_limit)
    return JobRecord(
        job_id=job_id,
        maximum_attempts=maximum_attempts,
        content_type=content_type,
        created_store_time_ns=0,
        payload_digest=digest,
        payload_length=len(payload),
        not_before_ns=not_before_ns,
        payload_inline=bytes(payload) if inline else None,
        payload_key=None if inline else keys.payload_key(job_id, digest),
    )


def new_quarantine(
    queue_id: bytes, source_key: str, reason: int, observed_store_ns: int, detail: int | None = None
) -> QuarantineRecord:
    """The finding about ``source_key``; the same inputs give the same bytes for every auditor."""
    return QuarantineRecord(
        qid=keys.quarantine_id(queue_id, source_key, reason),
        source_key=source_key,
        reason=reason,
        observed_store_ns=observed_store_ns,
        detail=detail,
    )
