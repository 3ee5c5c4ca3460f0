"""StowQ/1 object keys: the grammar, shards, key tags, quarantine ids, index keys, tail hints.

Spec: ``keys.abnf`` (every shape and field width), ``namespace.md`` (layout,
planes, sharding, tail hints) and ``records.md`` (key tag, quarantine id);
``vectors/keys.json`` and the key corpus of ``vectors/corpus.json`` replay
the reference parser.

Why so strict: a key *is* a job's identity and a claim's fencing token, and
records are bound to their key by a tag over its exact bytes. Two spellings
of one key (``0A`` and ``0a``, ``7`` and ``00000007``) would be two different
objects to the store and a tag mismatch to the reference, so the parser
accepts only the canonical text and the builders can only produce it. Fixed
width, big-endian hex also makes the store's lexicographic LIST order the
numeric order, which is how the tail of a claim chain is found: the last key
listed under ``claims/<shard>/<job-id>/`` is the highest generation.

Keys here are relative to the queue's prefix; tags and quarantine ids are
computed over the relative key, so a queue can be moved under another prefix.
Pure code: no I/O. Bucket arithmetic comes from :mod:`steadqd.s3.timemath`.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from steadqd.constants import ID_BYTES, U16_MAX, U64_MAX
from steadqd.errors import InvalidInput, InvalidKey
from steadqd.s3.timemath import bucket_number, check_uint, expiry_ns
from steadqd.text import printable

__all__ = [
    "DIGEST_BYTES",
    "DOMAIN_KEY",
    "DOMAIN_QID",
    "DOMAIN_SHARD",
    "FORMAT_KEY",
    "KEY_TAG_BYTES",
    "BUCKET_DIGITS",
    "GENERATION_DIGITS",
    "MAX_GENERATION",
    "MAX_SHARD_COUNT",
    "SHARD_DIGITS",
    "NONCE_BYTES",
    "OUTPUTS_PREFIX",
    "CANCEL_REQUEST_PREFIX",
    "QID_BYTES",
    "TAIL_HINT_BYTES",
    "WATERMARK_KEY",
    "KeyKind",
    "ParsedKey",
    "Plane",
    "TermKind",
    "beacon_key",
    "bucket_prefix",
    "cancel_request_key",
    "chain_prefix",
    "chain_tail",
    "check_shard_count",
    "claim_key",
    "dead_key",
    "decode_tail_hint",
    "delay_index_key",
    "delay_index_key_for",
    "encode_tail_hint",
    "fail_key",
    "in_own_shard",
    "job_key",
    "key_tag",
    "lease_index_key",
    "lease_index_key_for",
    "parse_key",
    "payload_key",
    "quarantine_id",
    "quarantine_key",
    "quarantine_key_for",
    "receipt_key",
    "render",
    "shard_hash",
    "shard_of",
    "tail_key",
    "termidx_key",
    "termidx_key_for",
]

DOMAIN_SHARD = b"StowQ-1-shard\0"
DOMAIN_KEY = b"StowQ-1-key\0"
DOMAIN_QID = b"StowQ-1-qid\0"

KEY_TAG_BYTES = 8
DIGEST_BYTES = 32  # SHA-256, the payload digest in payloads/ keys
QID_BYTES = 16
NONCE_BYTES = 16
TAIL_HINT_BYTES = 8  # body of tails/<shard>/<job-id>: the tail generation, big-endian
SHARD_DIGITS = 4
GENERATION_DIGITS = 8
BUCKET_DIGITS = 16
MAX_SHARD_COUNT = 1 << (4 * SHARD_DIGITS)
MAX_GENERATION = (1 << (4 * GENERATION_DIGITS)) - 1  # a chain ends there: no claim key can go further

FORMAT_KEY = "meta/FORMAT"
WATERMARK_KEY = "meta/watermark"
OUTPUTS_PREFIX = "outputs/"  # application space: no protocol key lives there
# steadq cancel's requests to a job's holder (s3/cancel.py): application space, read by no reference tool
CANCEL_REQUEST_PREFIX = OUTPUTS_PREFIX + ".steadq-cancel/"


class Plane(enum.Enum):
    """Which kind of truth an object under a key carries (namespace.md, Two-plane rule)."""

    AUTHORITATIVE = "authoritative"  # the job's state: read by correctness
    ADVISORY = "advisory"  # indexes and hints: efficiency only, never proof
    PAYLOAD = "payload"  # detached payload bytes, content-addressed
    QUARANTINE = "quarantine"  # audit findings, never read by delivery
    META = "meta"  # FORMAT, watermark, clock beacons


class KeyKind(enum.Enum):
    """Every key shape of keys.abnf: (name used by the vectors, ABNF rule, plane)."""

    JOB = ("job", "job-key", Plane.AUTHORITATIVE)
    PAYLOAD = ("payload", "payload-key", Plane.PAYLOAD)
    CLAIM = ("claim", "claim-key", Plane.AUTHORITATIVE)
    FAIL = ("fail", "fail-key", Plane.AUTHORITATIVE)
    LEASE_INDEX = ("lease_index", "lease-index", Plane.ADVISORY)
    DELAY_INDEX = ("delay_index", "delay-index", Plane.ADVISORY)
    RECEIPT = ("receipt", "receipt-key", Plane.AUTHORITATIVE)
    DEAD = ("dead", "dead-key", Plane.AUTHORITATIVE)
    TERMIDX = ("termidx", "termidx-key", Plane.ADVISORY)
    TAIL = ("tail", "tail-key", Plane.ADVISORY)
    QUARANTINE = ("quarantine", "qkey", Plane.QUARANTINE)
    BEACON = ("beacon", "beacon-key", Plane.META)
    FORMAT = ("format", "format-key", Plane.META)
    WATERMARK = ("watermark", "watermark-key", Plane.META)

    @property
    def label(self) -> str:
        return self.value[0]

    @property
    def rule(self) -> str:
        return self.value[1]

    @property
    def plane(self) -> Plane:
        return self.value[2]


class TermKind(enum.Enum):
    """The terminal record a ``termidx/`` entry points at."""

    RECEIPT = "r"
    DEAD = "d"


@dataclass(frozen=True)
class ParsedKey:
    """A key's fields; those its shape does not have are None. ``str()`` gives the canonical key."""

    kind: KeyKind
    shard: int | None = None
    job_id: bytes | None = None
    generation: int | None = None
    bucket: int | None = None
    digest: bytes | None = None
    term: TermKind | None = None
    qid: bytes | None = None
    nonce: bytes | None = None

    def __str__(self) -> str:
        return render(self)


# --- Fields and shapes ---


@dataclass(frozen=True)
class _Field:
    attr: str  # ParsedKey attribute
    name: str  # as keys.abnf and the reference's error classes spell it
    digits: int  # fixed width in lowercase hex digits
    integer: bool  # big-endian number (else raw bytes)


_SHARD = _Field("shard", "shard", SHARD_DIGITS, True)
_JOB = _Field("job_id", "job-id", 2 * ID_BYTES, False)
_GENERATION = _Field("generation", "generation", GENERATION_DIGITS, True)
_BUCKET = _Field("bucket", "bucket", BUCKET_DIGITS, True)
_DIGEST = _Field("digest", "digest", 2 * DIGEST_BYTES, False)
_QID = _Field("qid", "qid", 2 * QID_BYTES, False)
_NONCE = _Field("nonce", "nonce", 2 * NONCE_BYTES, False)
_TERM = _Field("term", "kind", 1, False)  # "r" / "d", not hex


@dataclass(frozen=True)
class _Shape:
    kind: KeyKind
    prefix: str  # everything before the first field
    fields: tuple[_Field, ...]
    last_joiner: str = "/"  # lease index: job-id "." generation

    @property
    def segments(self) -> int:
        return self.prefix.count("/") + len(self.fields) - (self.last_joiner != "/")

    @property
    def template(self) -> str:
        parts = [f"<{f.name}>" for f in self.fields]
        return self.prefix + "/".join(parts[:-1]) + (self.last_joiner if len(parts) > 1 else "") + parts[-1]


_SHAPES = {
    s.kind: s
    for s in (
        _Shape(KeyKind.JOB, "jobs/", (_SHARD, _JOB)),
        _Shape(KeyKind.PAYLOAD, "payloads/", (_JOB, _DIGEST)),
        _Shape(KeyKind.CLAIM, "claims/", (_SHARD, _JOB, _GENERATION)),
        _Shape(KeyKind.FAIL, "fails/", (_SHARD, _JOB, _GENERATION)),
        _Shape(KeyKind.LEASE_INDEX, "leases/", (_BUCKET, _SHARD, _JOB, _GENERATION), last_joiner="."),
        _Shape(KeyKind.DELAY_INDEX, "delayed/", (_BUCKET, _SHARD, _JOB)),
        _Shape(KeyKind.RECEIPT, "receipts/", (_SHARD, _JOB)),
        _Shape(KeyKind.DEAD, "dead/", (_SHARD, _JOB)),
        _Shape(KeyKind.TERMIDX, "termidx/", (_BUCKET, _TERM, _SHARD, _JOB)),
        _Shape(KeyKind.TAIL, "tails/", (_SHARD, _JOB)),
        _Shape(KeyKind.QUARANTINE, "quarantine/", (_BUCKET, _QID)),
        _Shape(KeyKind.BEACON, "meta/clock/", (_NONCE,)),
    )
}
# First segment -> shape; "meta" is dispatched on its second segment.
_BY_FIRST = {s.prefix.split("/")[0]: s for s in _SHAPES.values() if not s.prefix.startswith("meta/")}
_FIXED = {FORMAT_KEY: KeyKind.FORMAT, WATERMARK_KEY: KeyKind.WATERMARK}
_HEX_DIGITS = re.compile("[0-9a-f]+")


def _encode_field(field: _Field, value: object) -> str:
    if field is _TERM:
        if not isinstance(value, TermKind):
            raise InvalidInput(f"termidx kind must be a TermKind, got {value!r}")
        return value.value
    if field.integer:
        return format(check_uint(field.name, value, (1 << (4 * field.digits)) - 1), f"0{field.digits}x")
    if not isinstance(value, bytes | bytearray) or 2 * len(value) != field.digits:
        raise InvalidInput(f"{field.name} must be {field.digits // 2} bytes, got {value!r}")
    return bytes(value).hex()


def _build(kind: KeyKind, *values: object) -> str:
    shape = _SHAPES[kind]
    text = [_encode_field(f, v) for f, v in zip(shape.fields, values, strict=True)]
    return shape.prefix + "/".join(text[:-1]) + (shape.last_joiner if len(text) > 1 else "") + text[-1]


def _refuse(key: str, error_class: str, why: str) -> InvalidKey:
    return InvalidKey(f"not a StowQ/1 key: '{printable(key)}': {why}", key=key, error_class=error_class)


def _decode_field(key: str, field: _Field, text: str) -> object:
    if field is _TERM:
        if text not in ("r", "d"):
            raise _refuse(key, "terminal_kind", f"termidx kind must be 'r' or 'd', got '{printable(text)}'")
        return TermKind(text)
    if len(text) != field.digits or not _HEX_DIGITS.fullmatch(text):
        raise _refuse(
            key,
            f"field:{field.name}",
            f"{field.name} must be {field.digits} lowercase hex digits, got '{printable(text)}'",
        )
    return int(text, 16) if field.integer else bytes.fromhex(text)


def _parse_meta(key: str, parts: list[str]) -> ParsedKey:
    if key in _FIXED:
        return ParsedKey(_FIXED[key])
    if len(parts) >= 2 and parts[1] == "clock":
        return _parse_shape(key, parts, _SHAPES[KeyKind.BEACON])
    raise _refuse(key, "unknown_prefix", f"meta/ holds only {FORMAT_KEY}, {WATERMARK_KEY} and meta/clock/<nonce>")


def _parse_shape(key: str, parts: list[str], shape: _Shape) -> ParsedKey:
    if len(parts) != shape.segments:
        raise _refuse(
            key,
            "segment_count",
            f"{shape.kind.label} keys have {shape.segments} '/'-separated segments ({shape.template}), "
            f"this one has {len(parts)}",
        )
    texts = parts[shape.prefix.count("/") :]
    if shape.last_joiner != "/":
        job, dot, generation = texts[-1].partition(shape.last_joiner)
        if not dot:
            raise _refuse(
                key, "field:lease suffix", f"the last segment must be <job-id>.<generation> ({shape.template})"
            )
        texts = texts[:-1] + [job, generation]
    values: dict[str, Any] = {f.attr: _decode_field(key, f, t) for f, t in zip(shape.fields, texts, strict=True)}
    return ParsedKey(shape.kind, **values)


def parse_key(key: str | bytes) -> ParsedKey:
    """The fields of a relative key, or InvalidKey naming the first rule it breaks.

    Bytes that are not UTF-8 are never a key (every key is ASCII); they are
    refused with the class their lossily decoded text would get, which is what
    the reference's fuzz target reports.
    """
    text = key.decode("utf-8", errors="replace") if isinstance(key, bytes | bytearray) else key
    if not isinstance(text, str):
        raise InvalidInput(f"a key must be str or bytes, got {key!r}")
    parts = text.split("/")
    if parts[0] == "meta":
        return _parse_meta(text, parts)
    shape = _BY_FIRST.get(parts[0])
    if shape is None:
        known = ", ".join(sorted(f"{p}/" for p in [*_BY_FIRST, "meta"]))
        raise _refuse(
            text, "unknown_prefix", f"unknown prefix '{printable(parts[0])}' (StowQ/1 keys start with {known})"
        )
    return _parse_shape(text, parts, shape)


def render(parsed: ParsedKey) -> str:
    """The canonical text of a parsed key (parse_key's inverse)."""
    if parsed.kind in (KeyKind.FORMAT, KeyKind.WATERMARK):
        return FORMAT_KEY if parsed.kind is KeyKind.FORMAT else WATERMARK_KEY
    return _build(parsed.kind, *(getattr(parsed, f.attr) for f in _SHAPES[parsed.kind].fields))


# --- Builders, one per shape (argument order is the key's field order) ---


def job_key(shard: int, job_id: bytes) -> str:
    return _build(KeyKind.JOB, shard, job_id)


def payload_key(job_id: bytes, digest: bytes) -> str:
    return _build(KeyKind.PAYLOAD, job_id, digest)


def cancel_request_key(job_id: bytes) -> str:
    """Where ``steadq cancel`` asks a job's holder to bury it (s3/cancel.py); GC deletes it with the graph."""
    return CANCEL_REQUEST_PREFIX + job_id.hex()


def claim_key(shard: int, job_id: bytes, generation: int) -> str:
    return _build(KeyKind.CLAIM, shard, job_id, generation)


def fail_key(shard: int, job_id: bytes, generation: int) -> str:
    return _build(KeyKind.FAIL, shard, job_id, generation)


def lease_index_key(bucket: int, shard: int, job_id: bytes, generation: int) -> str:
    return _build(KeyKind.LEASE_INDEX, bucket, shard, job_id, generation)


def delay_index_key(bucket: int, shard: int, job_id: bytes) -> str:
    return _build(KeyKind.DELAY_INDEX, bucket, shard, job_id)


def receipt_key(shard: int, job_id: bytes) -> str:
    return _build(KeyKind.RECEIPT, shard, job_id)


def dead_key(shard: int, job_id: bytes) -> str:
    return _build(KeyKind.DEAD, shard, job_id)


def termidx_key(bucket: int, term: TermKind, shard: int, job_id: bytes) -> str:
    return _build(KeyKind.TERMIDX, bucket, term, shard, job_id)


def tail_key(shard: int, job_id: bytes) -> str:
    return _build(KeyKind.TAIL, shard, job_id)


def quarantine_key(bucket: int, qid: bytes) -> str:
    return _build(KeyKind.QUARANTINE, bucket, qid)


def beacon_key(nonce: bytes) -> str:
    return _build(KeyKind.BEACON, nonce)


_BUCKETED = (KeyKind.LEASE_INDEX, KeyKind.DELAY_INDEX, KeyKind.TERMIDX, KeyKind.QUARANTINE)


def bucket_prefix(kind: KeyKind, bucket: int) -> str:
    """The LIST prefix of one bucket of a bucketed plane, e.g. ``leases/<bucket>/``."""
    if kind not in _BUCKETED:
        raise InvalidInput(f"{kind.label} keys have no bucket; bucketed kinds: {', '.join(k.label for k in _BUCKETED)}")
    return _SHAPES[kind].prefix + _encode_field(_BUCKET, bucket) + "/"


def chain_prefix(kind: KeyKind, shard: int, job_id: bytes) -> str:
    """The LIST prefix of one job's claim or fail chain: ``claims/<shard>/<job-id>/``."""
    if kind not in (KeyKind.CLAIM, KeyKind.FAIL):
        raise InvalidInput(f"only claim and fail keys form a chain, not {kind.label} keys")
    return _SHAPES[kind].prefix + _encode_field(_SHARD, shard) + "/" + _encode_field(_JOB, job_id) + "/"


def chain_tail(listing: Sequence[str]) -> int:
    """The tail generation of a claim chain from its listing in store order (0 when empty).

    Store order is the lexicographic order of the keys' bytes, and generations
    are fixed-width hex, so the last key listed is the highest generation.
    """
    if not listing:
        return 0
    last = parse_key(listing[-1])
    if last.kind is not KeyKind.CLAIM or last.generation is None:
        raise InvalidInput(f"a claim chain listing ends with a {last.kind.label} key: '{printable(listing[-1])}'")
    return last.generation


# --- Hash-derived values ---


def _check_id(what: str, value: bytes) -> bytes:
    if not isinstance(value, bytes | bytearray) or len(value) != ID_BYTES:
        raise InvalidInput(f"{what} must be {ID_BYTES} bytes, got {value!r}")
    return bytes(value)


def check_shard_count(shard_count: int) -> int:
    """``shard_count`` if it is a power of two in 1..65536 (the FORMAT rule); else InvalidInput."""
    if (
        not isinstance(shard_count, int)
        or isinstance(shard_count, bool)
        or not 1 <= shard_count <= MAX_SHARD_COUNT
        or shard_count & (shard_count - 1)
    ):
        raise InvalidInput(f"shard_count must be a power of two in 1..{MAX_SHARD_COUNT}, got {shard_count!r}")
    return shard_count


def shard_hash(queue_id: bytes, job_id: bytes) -> int:
    """The first two bytes, big-endian, of the domain-separated shard hash."""
    digest = hashlib.sha256(DOMAIN_SHARD + _check_id("queue_id", queue_id) + _check_id("job_id", job_id)).digest()
    return int.from_bytes(digest[:2], "big")


def shard_of(queue_id: bytes, job_id: bytes, shard_count: int) -> int:
    """A job's shard: the low log2(shard_count) bits of :func:`shard_hash`."""
    return shard_hash(queue_id, job_id) & (check_shard_count(shard_count) - 1)


def in_own_shard(queue_id: bytes, shard_count: int, shard: int, job_id: bytes) -> bool:
    """Whether a key of ``job_id`` under ``shard`` sits where the id maps to (namespace.md, Sharding).

    Why: the shard is a function of the id, so a key under another shard is
    no key of that job even when the record there verifies for that key.
    Readers ignore such a key (a claim there would start a second chain for
    the job) and the repair scan names it.
    """
    return shard_of(queue_id, job_id, shard_count) == shard


def key_tag(queue_id: bytes, key: str) -> bytes:
    """The 8 bytes that bind a record to its relative key and its queue (checked on every read)."""
    if not isinstance(key, str):
        raise InvalidInput(f"key must be a str, got {key!r}")
    return hashlib.sha256(DOMAIN_KEY + _check_id("queue_id", queue_id) + key.encode("utf-8")).digest()[:KEY_TAG_BYTES]


def quarantine_id(queue_id: bytes, source_key: str, reason: int) -> bytes:
    """The deterministic id of a finding, so independent auditors write byte-identical records.

    ``source_key`` is the relative key of the offending object (any text: a
    key that failed to parse is the typical source); ``reason`` is a
    quarantine registry code, hashed as 8 big-endian bytes like the reference.
    """
    if not isinstance(source_key, str):
        raise InvalidInput(f"source_key must be a str, got {source_key!r}")
    data = (
        DOMAIN_QID
        + _check_id("queue_id", queue_id)
        + source_key.encode("utf-8")
        + check_uint("quarantine reason", reason, U16_MAX).to_bytes(8, "big")
    )
    return hashlib.sha256(data).digest()[:QID_BYTES]


# --- Keys derived from times (the bucket rules live beside the key shape they fill) ---


def quarantine_key_for(
    queue_id: bytes, source_key: str, reason: int, observed_store_ns: int, terminal_width_ns: int
) -> str:
    """``quarantine/<floor(observed / terminal width)>/<qid>`` for a finding about ``source_key``."""
    bucket = bucket_number(observed_store_ns, terminal_width_ns)
    return quarantine_key(bucket, quarantine_id(queue_id, source_key, reason))


def lease_index_key_for(
    claim_store_time_ns: int, lease_duration_ns: int, lease_width_ns: int, shard: int, job_id: bytes, generation: int
) -> str:
    """The lease index entry of a claim, in the bucket its (saturating) expiry falls in."""
    bucket = bucket_number(expiry_ns(claim_store_time_ns, lease_duration_ns), lease_width_ns)
    return lease_index_key(bucket, shard, job_id, generation)


def delay_index_key_for(not_before_ns: int, delayed_width_ns: int, shard: int, job_id: bytes) -> str:
    """The delayed index entry of a job due at ``not_before_ns``, in that time's floor bucket."""
    return delay_index_key(bucket_number(not_before_ns, delayed_width_ns), shard, job_id)


def termidx_key_for(floor_ns: int, terminal_width_ns: int, term: TermKind, shard: int, job_id: bytes) -> str:
    """The terminal index entry written after an ack or bury, in the settling floor's bucket."""
    return termidx_key(bucket_number(floor_ns, terminal_width_ns), term, shard, job_id)


# --- Tail hints (feature bit 2) ---


def encode_tail_hint(generation: int) -> bytes:
    """The body of ``tails/<shard>/<job-id>``: the tail generation as 8 big-endian bytes."""
    return check_uint("tail generation", generation, U64_MAX).to_bytes(TAIL_HINT_BYTES, "big")


def decode_tail_hint(body: bytes) -> int | None:
    """The generation a tail hint names, or None for a body that is not a hint.

    A hint is advisory: None (like a generation no claim key can hold) means
    fall back to listing the chain, never an error.
    """
    if not isinstance(body, bytes | bytearray) or len(body) != TAIL_HINT_BYTES:
        return None
    return int.from_bytes(body, "big")
