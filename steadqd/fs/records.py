"""Fixed binary records and digests of SteadQ/1 (the JSON side documents are in json_records).

Everything here is pure (bytes in, bytes out) so that the byte layouts can be
checked against ``spec/vectors.md`` without a filesystem. Each decoder
follows the reference's check order and maps failures to the error kind the
reference reports at that point (records.md), because the kind decides the
CLI exit code and whether an object is quarantined.
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass

from steadqd.constants import (
    COMPACT_RECEIPT_SIZE,
    DIGEST_SHA256,
    DOMAIN_ENVELOPE,
    DOMAIN_FORMAT,
    DOMAIN_RECEIPT,
    DOMAIN_WATERMARK,
    FORMAT_MAGIC,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    FORMAT_SIZE,
    HEADER_SIZE,
    ID_BYTES,
    JOB_MAGIC,
    MAX_EXTENSION_LENGTH,
    MAX_PAYLOAD_LENGTH,
    MAX_RETENTION_PROBE_BUCKETS,
    MAX_SHARDS,
    MAX_TERMINAL_WIDTH_NS,
    MIN_TERMINAL_WIDTH_NS,
    NAME_TAG_BITS,
    RECEIPT_MAGIC,
    U16_MAX,
    U32_MAX,
    U64_MAX,
    WATERMARK_MAGIC,
    WATERMARK_SIZE,
    QuarantineReason,
)
from steadqd.errors import CorruptObject, InvalidInput, QueueCorrupt, UnsupportedFormat
from steadqd.fs.cbor import Extension, MetadataValue, decode_extension, encode_extension

__all__ = [
    "CompactReceipt",
    "Extension",
    "FormatRecord",
    "JobHeader",
    "MetadataValue",
    "Watermark",
    "build_header",
    "check_envelope",
    "decode_extension",
    "encode_extension",
    "envelope_digest",
    "is_compact_receipt",
    "sha256",
    "validate_queue_config",
    "BOOT_ID_RE",
    "DIGEST_BYTES",
    "is_uint",
    "need_bytes",
]

DIGEST_BYTES = 32
_ZERO_DIGEST = bytes(DIGEST_BYTES)
BOOT_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def sha256(data: bytes) -> bytes:
    """Plain SHA-256; every SteadQ digest is this over a domain string and fields."""
    return hashlib.sha256(data).digest()


def is_uint(value: object, maximum: int) -> bool:
    # bool is an int subclass; a JSON `true` or a Python True is never a number here.
    return type(value) is int and 0 <= value <= maximum


def need_bytes(value: object, size: int, field: str) -> None:
    if not isinstance(value, bytes) or len(value) != size:
        raise InvalidInput(f"{field}: must be {size} bytes")


def _need_uint(value: object, maximum: int, field: str) -> None:
    if not is_uint(value, maximum):
        raise InvalidInput(f"{field}: must be an integer in 0..{maximum}, got {value!r}")


# ==========================================================================
# FORMAT record
# ==========================================================================

# magic, major, minor, flags, queue_id, created_at, shard_count, reserved(4),
# lease width, delayed width, terminal width, max payload, digest alg,
# tag bits, reserved(6), required features, optional features, reserved(24)
_FORMAT_BODY = struct.Struct(">8sHHI16sQI4sQQQQBB6sQQ24s")
assert _FORMAT_BODY.size == FORMAT_SIZE - DIGEST_BYTES


def _queue_config_problem(
    shard_count: int, lease_width_ns: int, delayed_width_ns: int, terminal_width_ns: int, max_payload_length: int
) -> str | None:
    """The FORMAT field constraints shared by init (InvalidInput) and open (QueueCorrupt)."""
    if not is_uint(shard_count, MAX_SHARDS) or shard_count == 0 or shard_count & (shard_count - 1):
        return f"shard_count: must be a power of two in 1..{MAX_SHARDS}, got {shard_count!r}"
    if not is_uint(lease_width_ns, U64_MAX) or lease_width_ns == 0:
        return f"lease_bucket_width_ns: must be a nonzero u64, got {lease_width_ns!r}"
    if not is_uint(delayed_width_ns, U64_MAX) or delayed_width_ns == 0:
        return f"delayed_bucket_width_ns: must be a nonzero u64, got {delayed_width_ns!r}"
    if (
        not is_uint(terminal_width_ns, U64_MAX)
        or not MIN_TERMINAL_WIDTH_NS <= terminal_width_ns <= MAX_TERMINAL_WIDTH_NS
    ):
        return (
            f"terminal_bucket_width_ns: must be in {MIN_TERMINAL_WIDTH_NS}..{MAX_TERMINAL_WIDTH_NS}, "
            f"got {terminal_width_ns!r}"
        )
    if terminal_width_ns % delayed_width_ns:
        return (
            f"terminal_bucket_width_ns: {terminal_width_ns} is not a multiple of "
            f"delayed_bucket_width_ns {delayed_width_ns}"
        )
    if not is_uint(max_payload_length, MAX_PAYLOAD_LENGTH):
        return f"max_payload_length: must be in 0..{MAX_PAYLOAD_LENGTH}, got {max_payload_length!r}"
    return None


def validate_queue_config(
    shard_count: int,
    lease_width_ns: int,
    delayed_width_ns: int,
    terminal_width_ns: int,
    max_payload_length: int,
    *,
    receipt_retention_ns: int | None = None,
) -> None:
    """Refuse a configuration before init touches the disk.

    With ``receipt_retention_ns`` it also applies open's duplicate-ack probe
    bound, so init can refuse a terminal width that the reference would
    create but then refuse to open (open-questions.md E44).
    """
    problem = _queue_config_problem(
        shard_count, lease_width_ns, delayed_width_ns, terminal_width_ns, max_payload_length
    )
    if problem is not None:
        raise InvalidInput(problem)
    if receipt_retention_ns is not None:
        if not is_uint(receipt_retention_ns, U64_MAX):
            raise InvalidInput(f"receipt_retention_ns: must be a u64, got {receipt_retention_ns!r}")
        buckets = -(-receipt_retention_ns // terminal_width_ns) + 2
        if buckets > MAX_RETENTION_PROBE_BUCKETS:
            raise InvalidInput(
                f"terminal_bucket_width_ns: receipt retention {receipt_retention_ns} ns needs {buckets} buckets, "
                f"exceeding the duplicate-ack probe bound {MAX_RETENTION_PROBE_BUCKETS}"
            )


@dataclass(frozen=True)
class FormatRecord:
    """The immutable queue configuration stored in ``<root>/FORMAT``."""

    queue_id: bytes
    created_at_ns: int
    shard_count: int
    lease_width_ns: int
    delayed_width_ns: int
    terminal_width_ns: int
    max_payload_length: int
    minor: int = FORMAT_MINOR

    def encode(self) -> bytes:
        """160 bytes; refuses to produce a record that ``decode`` would reject."""
        need_bytes(self.queue_id, ID_BYTES, "queue_id")
        _need_uint(self.created_at_ns, U64_MAX, "created_at_ns")
        _need_uint(self.minor, U16_MAX, "minor")
        validate_queue_config(
            self.shard_count,
            self.lease_width_ns,
            self.delayed_width_ns,
            self.terminal_width_ns,
            self.max_payload_length,
        )
        body = _FORMAT_BODY.pack(
            FORMAT_MAGIC, FORMAT_MAJOR, self.minor, 0, self.queue_id, self.created_at_ns, self.shard_count,
            bytes(4), self.lease_width_ns, self.delayed_width_ns, self.terminal_width_ns, self.max_payload_length,
            DIGEST_SHA256, NAME_TAG_BITS, bytes(6), 0, 0, bytes(24),
        )  # fmt: skip
        return body + sha256(DOMAIN_FORMAT + body)

    @classmethod
    def decode(cls, data: bytes) -> FormatRecord:
        """Reference order: length, magic, major (→ UnsupportedFormat), then the rest (→ QueueCorrupt)."""
        if len(data) != FORMAT_SIZE:
            raise QueueCorrupt(f"FORMAT: size {len(data)}, expected {FORMAT_SIZE}")
        data = bytes(data)
        (magic, major, minor, flags, queue_id, created, shards, res44, lease_w, delayed_w, terminal_w, max_payload,
         digest_alg, tag_bits, res82, required, optional, res104) = _FORMAT_BODY.unpack_from(data)  # fmt: skip
        if magic != FORMAT_MAGIC:
            raise QueueCorrupt("FORMAT: bad magic")
        if major != FORMAT_MAJOR:
            raise UnsupportedFormat(f"FORMAT: unsupported format major version {major}")
        if flags != 0:
            raise QueueCorrupt(f"FORMAT: nonzero flags 0x{flags:08x}")
        if res44 != bytes(4):
            raise QueueCorrupt("FORMAT: nonzero reserved bytes 44..48")
        if digest_alg != DIGEST_SHA256:
            raise QueueCorrupt(f"FORMAT: unsupported digest algorithm {digest_alg}")
        if tag_bits != NAME_TAG_BITS:
            raise QueueCorrupt(f"FORMAT: unsupported name tag bits {tag_bits}")
        if res82 != bytes(6) or res104 != bytes(24):
            raise QueueCorrupt("FORMAT: nonzero reserved bytes")
        if required or optional:
            raise QueueCorrupt(f"FORMAT: unsupported feature bits (required 0x{required:x}, optional 0x{optional:x})")
        if sha256(DOMAIN_FORMAT + data[:128]) != data[128:]:
            raise QueueCorrupt("FORMAT: digest mismatch")
        problem = _queue_config_problem(shards, lease_w, delayed_w, terminal_w, max_payload)
        if problem is not None:
            raise QueueCorrupt(f"FORMAT: {problem}")
        return cls(queue_id, created, shards, lease_w, delayed_w, terminal_w, max_payload, minor)


# ==========================================================================
# Job envelope fixed header
# ==========================================================================

# magic, major, minor, ext_len, payload_len, flags, digest alg, reserved(3),
# job_id, max_attempts, reserved(4), created_at, payload digest, envelope digest
_HEADER = struct.Struct(">8sHHIQIB3s16sI4sQ32s32s")
# The header's reserved fields as they must read (decode) and are written (encode): made once, not per
# header (bytes(n) builds a new object each call, ~300 instructions; every enqueue encodes, every read decodes).
_ZERO3 = bytes(3)
_ZERO4 = bytes(4)
assert _HEADER.size == HEADER_SIZE
_ENVELOPE_DIGEST_OFFSET = 96


# Frozen dataclasses here get their fields as one new dict, set through object.__setattr__:
# a dict made from an instance's inline values (``self.__dict__`` then item stores) keeps
# them outside its entries, where CPython 3.11's cached attribute read cannot find them, so
# every later read of a field took the slow path (~350 instructions instead of ~100).
_SET_FIELDS = object.__setattr__


def _header_corrupt(message: str) -> CorruptObject:
    return CorruptObject(f"job header: {message}", QuarantineReason.ENVELOPE_CORRUPT)


@dataclass(frozen=True, init=False)
class JobHeader:
    """The 128-byte header of a job file; never rewritten after publication.

    The constructor sets the frozen fields as one dict (``_SET_FIELDS``, every enqueue
    builds one): the generated one would set each through ``object.__setattr__``.
    """

    job_id: bytes
    max_attempts: int
    created_at_ns: int
    extension_length: int
    payload_length: int
    payload_digest: bytes
    envelope_digest: bytes
    minor: int = FORMAT_MINOR

    def __init__(
        self,
        job_id: bytes,
        max_attempts: int,
        created_at_ns: int,
        extension_length: int,
        payload_length: int,
        payload_digest: bytes,
        envelope_digest: bytes,
        minor: int = FORMAT_MINOR,
    ) -> None:
        _SET_FIELDS(
            self,
            "__dict__",
            {
                "job_id": job_id,
                "max_attempts": max_attempts,
                "created_at_ns": created_at_ns,
                "extension_length": extension_length,
                "payload_length": payload_length,
                "payload_digest": payload_digest,
                "envelope_digest": envelope_digest,
                "minor": minor,
            },
        )

    def encode(self) -> bytes:
        """128 bytes including the stored envelope digest (use build_header to compute it)."""
        cached = self.__dict__.get("_encoded")
        if cached is not None:  # set by build_header, which checked the fields encoding the draft
            return cached
        return _encode_header(
            self.job_id, self.max_attempts, self.created_at_ns, self.extension_length, self.payload_length,
            self.payload_digest, self.envelope_digest, self.minor,
        )  # fmt: skip

    @classmethod
    def decode(cls, data: bytes) -> JobHeader:
        """Structural checks only; the envelope digest is checked by check_envelope.

        The minor version is carried but not checked, as in the reference.
        """
        if len(data) != HEADER_SIZE:
            raise _header_corrupt(f"size {len(data)}, expected {HEADER_SIZE}")
        (magic, major, minor, ext_len, payload_len, flags, digest_alg, res29, job_id, max_attempts, res52,
         created, payload_digest, env_digest) = _HEADER.unpack_from(data)  # fmt: skip
        if magic != JOB_MAGIC:
            raise _header_corrupt("bad magic")
        if major != FORMAT_MAJOR:
            raise _header_corrupt(f"unsupported major version {major}")
        if flags != 0:
            raise _header_corrupt(f"nonzero flags 0x{flags:08x}")
        if digest_alg != DIGEST_SHA256:
            raise _header_corrupt(f"unsupported digest algorithm {digest_alg}")
        if res29 != _ZERO3 or res52 != _ZERO4:
            raise _header_corrupt("nonzero reserved bytes")
        if max_attempts == 0:
            raise _header_corrupt("maximum_attempts is 0")
        if payload_len > MAX_PAYLOAD_LENGTH:
            raise _header_corrupt(f"payload_length {payload_len} exceeds {MAX_PAYLOAD_LENGTH}")
        if ext_len > MAX_EXTENSION_LENGTH:
            raise _header_corrupt(f"extension_header_length {ext_len} exceeds {MAX_EXTENSION_LENGTH}")
        # Reads of a job decode a header: the frozen instance's fields as one dict
        # (_SET_FIELDS), where the generated __init__ would set them one by one.
        header = object.__new__(cls)
        _SET_FIELDS(
            header,
            "__dict__",
            {
                "job_id": job_id,
                "max_attempts": max_attempts,
                "created_at_ns": created,
                "extension_length": ext_len,
                "payload_length": payload_len,
                "payload_digest": payload_digest,
                "envelope_digest": env_digest,
                "minor": minor,
            },
        )
        return header

    @property
    def file_size(self) -> int:
        """The only valid size of the whole job file; anything else is corruption."""
        return HEADER_SIZE + self.extension_length + self.payload_length


def _encode_header(
    job_id: bytes,
    max_attempts: int,
    created_at_ns: int,
    extension_length: int,
    payload_length: int,
    payload_digest: bytes,
    envelope_digest: bytes,
    minor: int,
) -> bytes:
    """:meth:`JobHeader.encode` of these fields, checked (build_header encodes its draft
    from the fields, without making a JobHeader for it)."""
    if not (  # the common case in one test (every enqueue encodes a draft); the checks below name the fault
        type(job_id) is bytes
        and len(job_id) == ID_BYTES
        and type(max_attempts) is int
        and 0 < max_attempts <= U32_MAX
        and type(created_at_ns) is int
        and 0 <= created_at_ns <= U64_MAX
        and type(extension_length) is int
        and 0 <= extension_length <= MAX_EXTENSION_LENGTH
        and type(payload_length) is int
        and 0 <= payload_length <= MAX_PAYLOAD_LENGTH
        and type(payload_digest) is bytes
        and len(payload_digest) == DIGEST_BYTES
        and type(envelope_digest) is bytes
        and len(envelope_digest) == DIGEST_BYTES
        and type(minor) is int
        and 0 <= minor <= U16_MAX
    ):
        need_bytes(job_id, ID_BYTES, "job_id")
        if not is_uint(max_attempts, U32_MAX) or max_attempts == 0:
            raise InvalidInput(f"maximum_attempts: must be in 1..{U32_MAX}, got {max_attempts!r}")
        _need_uint(created_at_ns, U64_MAX, "created_at_ns")
        _need_uint(extension_length, MAX_EXTENSION_LENGTH, "extension_length")
        _need_uint(payload_length, MAX_PAYLOAD_LENGTH, "payload_length")
        need_bytes(payload_digest, DIGEST_BYTES, "payload_digest")
        need_bytes(envelope_digest, DIGEST_BYTES, "envelope_digest")
        _need_uint(minor, U16_MAX, "minor")
    return _HEADER.pack(
        JOB_MAGIC, FORMAT_MAJOR, minor, extension_length, payload_length, 0, DIGEST_SHA256,
        _ZERO3, job_id, max_attempts, _ZERO4, created_at_ns, payload_digest, envelope_digest,
    )  # fmt: skip


def envelope_digest(header128: bytes, extension: bytes) -> bytes:
    """Digest over the header as stored (minor included) with its digest field zeroed.

    Taking the raw header bytes rather than a JobHeader keeps the digest
    faithful to whatever another writer stored (e.g. minor 0).
    """
    if len(header128) != HEADER_SIZE:
        raise InvalidInput(f"envelope_digest: header must be {HEADER_SIZE} bytes, got {len(header128)}")
    h = _ENVELOPE_HASHER.copy()  # a copy of the domain-fed state is cheaper than a new one
    h.update(header128[:_ENVELOPE_DIGEST_OFFSET])
    h.update(_ZERO_DIGEST)
    h.update(extension)
    return h.digest()


_ENVELOPE_HASHER = hashlib.sha256(DOMAIN_ENVELOPE)


def build_header(
    *,
    job_id: bytes,
    max_attempts: int,
    created_at_ns: int,
    extension: bytes,
    payload_length: int,
    payload_digest: bytes,
    minor: int = FORMAT_MINOR,
) -> JobHeader:
    """Assemble a header for enqueue, computing the envelope digest over ``extension``."""
    if len(extension) > MAX_EXTENSION_LENGTH:
        raise InvalidInput(f"extension: {len(extension)} bytes, limit {MAX_EXTENSION_LENGTH}")
    draft = _encode_header(
        job_id, max_attempts, created_at_ns, len(extension), payload_length, payload_digest, _ZERO_DIGEST, minor
    )
    digest = envelope_digest(draft, extension)
    header = JobHeader(
        job_id, max_attempts, created_at_ns, len(extension), payload_length, payload_digest, digest, minor
    )
    # The stored digest is the header's last field: the draft with it filled in is
    # the encoding, whose other fields the draft's encode has just checked.
    header.__dict__["_encoded"] = draft[:_ENVELOPE_DIGEST_OFFSET] + digest
    return header


def check_envelope(header: JobHeader, header_bytes: bytes, extension: bytes) -> None:
    """Raise CorruptObject(ENVELOPE_CORRUPT) unless the stored envelope digest matches."""
    if len(extension) != header.extension_length:
        raise _header_corrupt(f"extension is {len(extension)} bytes, header says {header.extension_length}")
    if envelope_digest(header_bytes, extension) != header.envelope_digest:
        raise _header_corrupt("envelope digest mismatch")


# ==========================================================================
# Compact receipt
# ==========================================================================

# magic, major, minor, job_id, envelope digest, final attempt, lease token,
# bucket start, payload length
_RECEIPT_BODY = struct.Struct(">8sHH16s32sI16sQQ")
assert _RECEIPT_BODY.size == COMPACT_RECEIPT_SIZE - DIGEST_BYTES


def _receipt_corrupt(message: str) -> CorruptObject:
    return CorruptObject(f"compact receipt: {message}", QuarantineReason.ENVELOPE_CORRUPT)


def is_compact_receipt(prefix: bytes, size: int) -> bool:
    """Receipt kind by the reference's rule: exactly 128 bytes starting with the magic."""
    return size == COMPACT_RECEIPT_SIZE and bytes(prefix[: len(RECEIPT_MAGIC)]) == RECEIPT_MAGIC


@dataclass(frozen=True)
class CompactReceipt:
    """The 128-byte record that replaces a full receipt after compaction."""

    job_id: bytes
    envelope_digest: bytes
    final_attempt: int
    lease_token: bytes
    bucket_start_ns: int
    payload_length: int
    minor: int = FORMAT_MINOR

    def encode(self) -> bytes:
        need_bytes(self.job_id, ID_BYTES, "job_id")
        need_bytes(self.envelope_digest, DIGEST_BYTES, "envelope_digest")
        _need_uint(self.final_attempt, U32_MAX, "final_attempt")
        need_bytes(self.lease_token, ID_BYTES, "lease_token")
        _need_uint(self.bucket_start_ns, U64_MAX, "bucket_start_ns")
        _need_uint(self.payload_length, U64_MAX, "payload_length")
        _need_uint(self.minor, U16_MAX, "minor")
        body = _RECEIPT_BODY.pack(
            RECEIPT_MAGIC, FORMAT_MAJOR, self.minor, self.job_id, self.envelope_digest, self.final_attempt,
            self.lease_token, self.bucket_start_ns, self.payload_length,
        )  # fmt: skip
        return body + sha256(DOMAIN_RECEIPT + body)

    @classmethod
    def decode(cls, data: bytes) -> CompactReceipt:
        """Minor 0 is rejected: those are legacy records whose fields were never verified."""
        if len(data) != COMPACT_RECEIPT_SIZE:
            raise _receipt_corrupt(f"size {len(data)}, expected {COMPACT_RECEIPT_SIZE}")
        data = bytes(data)
        magic, major, minor, job_id, env, attempt, token, bucket_start, payload_len = _RECEIPT_BODY.unpack_from(data)
        if magic != RECEIPT_MAGIC:
            raise _receipt_corrupt("bad magic")
        if major != FORMAT_MAJOR:
            raise _receipt_corrupt(f"unsupported major version {major}")
        if minor < 1:
            raise _receipt_corrupt("minor version 0 (legacy unverified record)")
        if sha256(DOMAIN_RECEIPT + data[:96]) != data[96:]:
            raise _receipt_corrupt("digest mismatch")
        return cls(job_id, env, attempt, token, bucket_start, payload_len, minor)


# ==========================================================================
# Wall watermark
# ==========================================================================

_WATERMARK_BODY = struct.Struct(">8sHHIQQ")
assert _WATERMARK_BODY.size == WATERMARK_SIZE - DIGEST_BYTES


@dataclass(frozen=True)
class Watermark:
    """Highest wall bucket ever observed; the floor that survives clock rollbacks."""

    bucket: int
    sequence: int
    minor: int = FORMAT_MINOR

    def encode(self) -> bytes:
        _need_uint(self.bucket, U64_MAX, "bucket")
        _need_uint(self.sequence, U64_MAX, "sequence")
        _need_uint(self.minor, U16_MAX, "minor")
        body = _WATERMARK_BODY.pack(WATERMARK_MAGIC, FORMAT_MAJOR, self.minor, 0, self.bucket, self.sequence)
        return body + sha256(DOMAIN_WATERMARK + body)

    @classmethod
    def decode(cls, data: bytes) -> Watermark:
        """Every failure is QueueCorrupt: without a trusted floor no wall-time decision is safe."""
        if len(data) < WATERMARK_SIZE:
            raise QueueCorrupt(f"wall watermark truncated ({len(data)} bytes)")
        if len(data) > WATERMARK_SIZE:
            raise QueueCorrupt(f"wall watermark too large ({len(data)} bytes)")
        data = bytes(data)
        magic, major, minor, reserved, bucket, sequence = _WATERMARK_BODY.unpack_from(data)
        if magic != WATERMARK_MAGIC:
            raise QueueCorrupt("wall watermark: bad magic")
        if major != FORMAT_MAJOR:
            raise QueueCorrupt(f"wall watermark: unsupported major version {major}")
        if reserved != 0:
            raise QueueCorrupt("wall watermark: nonzero reserved bytes")
        if sha256(DOMAIN_WATERMARK + data[:32]) != data[32:]:
            raise QueueCorrupt("wall watermark: digest mismatch")
        return cls(bucket, sequence, minor)
