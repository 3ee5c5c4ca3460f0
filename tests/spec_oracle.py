"""SteadQ/1 as the shared spec states it: names, tags, shards, buckets and records, for the test oracle.

Why a second reading of the format: a checker built on the library's name
parser, tag and shard functions, record decoders and digest checks shares
their bugs, and goes blind when one of those checks is switched off. Every
function here is written from ``../shared/spec`` alone (each names the section
it follows) with hashlib, struct and re; nothing comes from ``steadqd``. The
constants are the spec's values, restated here on purpose.

Nothing here does I/O except through the reader :func:`verify_job` is given;
a broken rule raises :class:`SpecViolation` saying which.
"""

from __future__ import annotations

import enum
import hashlib
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

# records.md "Domain-separation strings" (the payload digest has none).
DOMAIN_FORMAT = b"SteadQ-1-format\0"
DOMAIN_ENVELOPE = b"SteadQ-1-envelope\0"
DOMAIN_RECEIPT = b"SteadQ-1-receipt\0"
DOMAIN_WATERMARK = b"SteadQ-1-wall-watermark\0"
DOMAIN_NAME = b"SteadQ-1-name\0"
DOMAIN_SHARD = b"SteadQ-1-shard\0"

# records.md: record sizes and limits.
FORMAT_SIZE = 160
HEADER_SIZE = 128
COMPACT_RECEIPT_SIZE = 128
WATERMARK_SIZE = 64
MAX_PAYLOAD_LENGTH = (1 << 40) - 1
MAX_EXTENSION_LENGTH = 65_536

# layout.md "Tree".
FORMAT_FILE = "FORMAT"
STATE_DIRS = ("control", "tmp", "ready", "leased", "delayed", "receipts", "dead", "quarantine")
CONTROL_LOCKS = ("maintenance.lock", "wall-watermark.lock", "recovery.lock")
WATERMARK_FILE = "wall-watermark"
RECOVERY_CURSOR_FILE = "recovery-cursor.json"


class SpecViolation(ValueError):
    """A name or record breaks a rule of the spec; the message says which."""


def _need(ok: bool, why: str) -> None:
    if not ok:
        raise SpecViolation(why)


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


class State(enum.StrEnum):
    """A job object's state, spelled as layout.md "Which state lives where" does."""

    READY = "ready"
    LEASED = "leased"
    DELAYED = "delayed"
    DEAD = "dead"
    RECEIPT = "receipt"


# --------------------------------------------------------------------------- names

_HEX = "[0-9a-f]"  # names.md: lowercase, fixed width; a class, never \d (which matches other digits)


def _field(letter: str, group: str, width: int) -> str:
    return rf"\.{letter}(?P<{group}>{_HEX}{{{width}}})"


_COMMON = rf"(?P<job>{_HEX}{{32}})" + _field("g", "gen", 16) + _field("a", "att", 8) + _field("m", "max", 8)
_STATE_FIELDS = {
    State.READY: "",
    State.LEASED: _field("o", "boot", 32) + _field("b", "bt", 16) + _field("w", "wall", 16) + _field("t", "token", 32),
    State.DELAYED: _field("d", "nb", 16),
    State.DEAD: _field("x", "reason", 4),
    State.RECEIPT: _field("t", "token", 32),
}
EXTENSION = {
    State.READY: ".sqj",
    State.LEASED: ".sqj",
    State.DELAYED: ".sqj",
    State.DEAD: ".sqj",
    State.RECEIPT: ".rct",
}
# filenames.abnf ready-name … receipt-name: one whole-name pattern per state.
_GRAMMAR = {
    s: re.compile(rf"(?P<base>{_COMMON}{_STATE_FIELDS[s]})\.k(?P<tag>{_HEX}{{16}}){re.escape(EXTENSION[s])}")
    for s in State
}
TEMP_NAME = re.compile(rf"{_HEX}{{16}}\.{_HEX}{{32}}\.tmp")  # filenames.abnf temp-name
_QUARANTINE_NAME = re.compile(rf"q(?P<id>{_HEX}{{32}})\.x(?P<reason>{_HEX}{{4}})\.raw")  # quarantine-name
# layout.md "Other hidden/internal names": the compaction temp beside receipts, and
# control/'s watermark and cursor temps (never swept, so a crash may leave them).
COMPACT_TEMP_NAME = re.compile(rf"\.compact-{_HEX}{{32}}\.tmp")
CONTROL_TEMP_NAME = re.compile(rf"\.wm\.(tmp|adv)\.{_HEX}{{32}}|\.recovery-cursor\.{_HEX}{{32}}\.tmp")
_SHARD_DIR = re.compile(f"{_HEX}{{4}}")
_BUCKET_DIR = re.compile(f"{_HEX}{{16}}")


@dataclass(frozen=True)
class Name:
    """The fields a job object's filename carries (names.md "Field encodings")."""

    state: State
    job_id: bytes
    generation: int
    attempt: int
    max_attempts: int
    tag: bytes
    base: str = field(repr=False)  # everything before ".k": the text the tag covers
    boot_id: bytes | None = None
    boottime_deadline: int | None = None
    wall_deadline: int | None = None
    lease_token: bytes | None = None
    not_before: int | None = None
    reason: int | None = None

    @property
    def job_hex(self) -> str:
        return self.job_id.hex()


def parse_name(state: State, filename: str) -> Name | None:
    """The name under ``state``'s grammar, or None (names.md "Parser rules").

    The whole-name match enforces every rule at once: ASCII, the extension, the
    component count, each prefix letter and width, lowercase hex.
    """
    m = _GRAMMAR[state].fullmatch(filename)
    if m is None:
        return None
    g = m.groupdict()

    def num(key: str) -> int | None:
        return None if g.get(key) is None else int(g[key], 16)

    def raw(key: str) -> bytes | None:
        return None if g.get(key) is None else bytes.fromhex(g[key])

    return Name(
        state=state,
        job_id=bytes.fromhex(g["job"]),
        generation=int(g["gen"], 16),
        attempt=int(g["att"], 16),
        max_attempts=int(g["max"], 16),
        tag=bytes.fromhex(g["tag"]),
        base=g["base"],
        boot_id=raw("boot"),
        boottime_deadline=num("bt"),
        wall_deadline=num("wall"),
        lease_token=raw("token"),
        not_before=num("nb"),
        reason=num("reason"),
    )


def parse_ready_entry(filename: str) -> Name | None:
    """An entry of ``ready/<S>/``: a ready name, else a leased one (names.md "Parser rules")."""
    return parse_name(State.READY, filename) or parse_name(State.LEASED, filename)


def parse_quarantine_name(filename: str) -> tuple[bytes, int] | None:
    """(quarantine id, reason) of ``q<32 hex>.x<4 hex>.raw`` (names.md "Other random names")."""
    m = _QUARANTINE_NAME.fullmatch(filename)
    return None if m is None else (bytes.fromhex(m["id"]), int(m["reason"], 16))


def parse_shard_dir(dirname: str, shard_count: int) -> int | None:
    """Shard of a 4-hex directory below ``shard_count`` (layout.md "Which state lives where")."""
    if _SHARD_DIR.fullmatch(dirname) is None or int(dirname, 16) >= shard_count:
        return None
    return int(dirname, 16)


def parse_bucket_dir(dirname: str) -> int | None:
    """Bucket of a 16-hex directory (layout.md "Which state lives where")."""
    return int(dirname, 16) if _BUCKET_DIR.fullmatch(dirname) else None


def boot_dashed(raw: bytes) -> str:
    """The 8-4-4-4-12 form of a boot id, as paths and tag contexts spell it (clocks.md "Boot id")."""
    h = raw.hex()
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


# --------------------------------------------------------------------------- buckets, tags, shards


def lease_bucket(boottime_deadline: int, lease_width_ns: int) -> int:
    """clocks.md "Bucket arithmetic": floor(boottime deadline / lease width)."""
    return boottime_deadline // lease_width_ns


def delayed_bucket(not_before: int, delayed_width_ns: int) -> int:
    """clocks.md "Bucket arithmetic": ceil(not_before / delayed width), so promotion is never early."""
    return -(-not_before // delayed_width_ns)


def bucket_start(bucket: int, width: int) -> int:
    """clocks.md "Bucket arithmetic": start = bucket × width."""
    return bucket * width


# names.md "Context per state": the first word; receipts use the plural, like their directory.
_TAG_WORD = {
    State.READY: "ready",
    State.LEASED: "leased",
    State.DELAYED: "delayed",
    State.DEAD: "dead",
    State.RECEIPT: "receipts",
}


def tag_context(name: Name, *, shard: int, bucket: int | None, lease_width_ns: int) -> str:
    """names.md "Context per state": ``<state>/<boot-or-dash>/<bucket-or-dash>/<shard>/<base>``.

    A leased name's boot and bucket come from its own fields (the dashed boot id,
    the lease bucket of its boottime deadline) wherever it lies; delayed, dead and
    receipt names take ``bucket``, the directory they were found in.
    """
    boot, bkt = "-", "-"
    if name.state is State.LEASED:
        assert name.boot_id is not None and name.boottime_deadline is not None
        boot = boot_dashed(name.boot_id)
        bkt = f"{lease_bucket(name.boottime_deadline, lease_width_ns):016x}"
    elif name.state is not State.READY:
        assert bucket is not None, f"a {name.state} context needs its bucket directory"
        bkt = f"{bucket:016x}"
    return f"{_TAG_WORD[name.state]}/{boot}/{bkt}/{shard:04x}/{name.base}"


def name_tag(queue_id: bytes, context: str) -> bytes:
    """names.md "Name tag": the first 8 bytes of SHA256(domain || queue_id || context)."""
    return sha256(DOMAIN_NAME + queue_id + context.encode("ascii"))[:8]


def shard_of(queue_id: bytes, job_id: bytes, shard_count: int) -> int:
    """names.md "Shard": the low log2(shard_count) bits of the hash's first big-endian u32."""
    return int.from_bytes(sha256(DOMAIN_SHARD + queue_id + job_id)[:4], "big") & (shard_count - 1)


# --------------------------------------------------------------------------- FORMAT

# records.md "FORMAT record": magic, major, minor, flags, queue_id, created_at, shard_count,
# reserved(4), lease/delayed/terminal widths, max payload, digest alg, tag bits, reserved(6),
# required/optional features, reserved(24), digest.
_FORMAT = struct.Struct(">8sHHI16sQI4sQQQQBB6sQQ24s32s")


@dataclass(frozen=True)
class Format:
    """The queue's configuration as ``<root>/FORMAT`` stores it."""

    queue_id: bytes
    created_at_ns: int
    shard_count: int
    lease_width_ns: int
    delayed_width_ns: int
    terminal_width_ns: int
    max_payload_length: int
    minor: int


def decode_format(data: bytes) -> Format:
    """records.md "FORMAT record", decode rules 1–4 in the reference's order (the minor is not checked)."""
    _need(len(data) == FORMAT_SIZE, f"FORMAT is {len(data)} bytes, not {FORMAT_SIZE}")
    (magic, major, minor, flags, queue_id, created, shards, res1, lease_w, delayed_w, terminal_w, max_payload,
     alg, tag_bits, res2, required, optional, res3, digest) = _FORMAT.unpack(data)  # fmt: skip
    _need(magic == b"SDQFMT1\0", "FORMAT magic")
    _need(major == 1, f"FORMAT major version {major} is unsupported")
    _need(flags == 0 and res1 == bytes(4) and res2 == bytes(6) and res3 == bytes(24), "FORMAT flags or reserved bytes")
    _need(alg == 1 and tag_bits == 64, "FORMAT digest algorithm or name tag bits")
    _need(required == 0 and optional == 0, "FORMAT feature bits")
    _need(digest == sha256(DOMAIN_FORMAT + data[:128]), "FORMAT digest mismatch")
    _need(1 <= shards <= 4096 and shards & (shards - 1) == 0, f"shard_count {shards} is not a power of two in 1..4096")
    _need(lease_w != 0 and delayed_w != 0, "a lease or delayed bucket width is 0")
    _need(60 * 10**9 <= terminal_w <= 86_400 * 10**9, f"terminal width {terminal_w} outside 60 s … 86 400 s")
    _need(terminal_w % delayed_w == 0, "terminal width is not a multiple of the delayed width")
    _need(max_payload <= MAX_PAYLOAD_LENGTH, f"max_payload_length {max_payload} exceeds 2^40 − 1")
    return Format(queue_id, created, shards, lease_w, delayed_w, terminal_w, max_payload, minor)


# --------------------------------------------------------------------------- job envelope

# records.md "Fixed header": magic, major, minor, ext len, payload len, flags, digest alg,
# reserved(3), job_id, max attempts, reserved(4), created_at, payload digest, envelope digest.
_HEADER = struct.Struct(">8sHHIQIB3s16sI4sQ32s32s")


@dataclass(frozen=True)
class JobHeader:
    """The fixed 128-byte header of a job file."""

    minor: int
    extension_length: int
    payload_length: int
    job_id: bytes
    max_attempts: int
    created_at_ns: int
    payload_digest: bytes
    envelope_digest: bytes


def decode_header(data: bytes) -> JobHeader:
    """records.md "Header decode rules" (the minor is carried, not checked)."""
    _need(len(data) == HEADER_SIZE, f"header is {len(data)} bytes, not {HEADER_SIZE}")
    (magic, major, minor, ext_len, payload_len, flags, alg, res1, job_id, max_att, res2, created, payload_digest,
     env_digest) = _HEADER.unpack(data)  # fmt: skip
    _need(magic == b"SDQJOB1\0", "job header magic")
    _need(major == 1, f"job header major version {major}")
    _need(flags == 0 and alg == 1, "job header flags or digest algorithm")
    _need(res1 == bytes(3) and res2 == bytes(4), "job header reserved bytes")
    _need(max_att != 0, "maximum_attempts is 0")
    _need(payload_len <= MAX_PAYLOAD_LENGTH, f"payload length {payload_len} exceeds 2^40 − 1")
    _need(ext_len <= MAX_EXTENSION_LENGTH, f"extension length {ext_len} exceeds {MAX_EXTENSION_LENGTH}")
    return JobHeader(minor, ext_len, payload_len, job_id, max_att, created, payload_digest, env_digest)


def envelope_digest(header: bytes, extension: bytes) -> bytes:
    """records.md "Fixed header": SHA256(domain || header[0..96] || 32 zero bytes || extension)."""
    return sha256(DOMAIN_ENVELOPE + header[:96] + bytes(32) + extension)


PAYLOAD_CHUNK = 1 << 20


def verify_job(read: Callable[[int, int], bytes], size: int, max_payload: int) -> tuple[JobHeader, bytes]:
    """records.md "Full verification of a job file": (header, extension) of an intact job.

    ``read(offset, length)`` returns the file's bytes (fewer at its end). The
    payload is hashed here, chunk by chunk, against the header's digest: no
    library check is trusted to have done it.
    """
    raw = read(0, HEADER_SIZE)
    _need(len(raw) == HEADER_SIZE, f"file is {len(raw)} bytes, shorter than the header")
    header = decode_header(raw)
    _need(header.payload_length <= max_payload, f"payload length {header.payload_length} exceeds the queue maximum")
    expected = HEADER_SIZE + header.extension_length + header.payload_length
    _need(size == expected, f"file is {size} bytes, header says {expected}")
    digest = hashlib.sha256()
    offset, remaining = HEADER_SIZE + header.extension_length, header.payload_length
    while remaining:
        chunk = read(offset, min(PAYLOAD_CHUNK, remaining))
        _need(bool(chunk), "payload ends early")
        digest.update(chunk)
        offset, remaining = offset + len(chunk), remaining - len(chunk)
    _need(digest.digest() == header.payload_digest, "payload digest mismatch")
    extension = read(HEADER_SIZE, header.extension_length) if header.extension_length else b""
    _need(len(extension) == header.extension_length, "short read of the extension")
    _need(envelope_digest(raw, extension) == header.envelope_digest, "envelope digest mismatch")
    return header, extension


# --------------------------------------------------------------------------- compact receipt

# records.md "Compact receipt": magic, major, minor, job_id, envelope digest, final attempt,
# lease token, bucket start, original payload length, receipt digest.
_COMPACT = struct.Struct(">8sHH16s32sI16sQQ32s")
_COMPACT_MAGIC = b"SDQRCPT\0"


@dataclass(frozen=True)
class CompactReceipt:
    """The 128-byte record that replaces a full receipt."""

    job_id: bytes
    envelope_digest: bytes
    final_attempt: int
    lease_token: bytes
    bucket_start_ns: int
    payload_length: int


def is_compact_receipt(prefix: bytes, size: int) -> bool:
    """records.md "Compact receipt": compact iff exactly 128 bytes starting with the magic."""
    return size == COMPACT_RECEIPT_SIZE and prefix.startswith(_COMPACT_MAGIC)


def decode_compact_receipt(data: bytes) -> CompactReceipt:
    """records.md "Compact receipt" decode: length, magic, major 1 and minor ≥ 1, digest."""
    _need(len(data) == COMPACT_RECEIPT_SIZE, f"compact receipt is {len(data)} bytes")
    magic, major, minor, job_id, env, attempt, token, start, length, digest = _COMPACT.unpack(data)
    _need(magic == _COMPACT_MAGIC, "compact receipt magic")
    _need(major == 1 and minor >= 1, f"compact receipt version {major}.{minor} (minor 0 is unverified legacy)")
    _need(digest == sha256(DOMAIN_RECEIPT + data[:96]), "compact receipt digest mismatch")
    return CompactReceipt(job_id, env, attempt, token, start, length)


# --------------------------------------------------------------------------- wall watermark

_WATERMARK = struct.Struct(">8sHHIQQ32s")  # records.md "Wall watermark record"


@dataclass(frozen=True)
class Watermark:
    """``control/wall-watermark``: the highest wall bucket any handle used."""

    bucket: int
    sequence: int


def decode_watermark(data: bytes) -> Watermark:
    """records.md "Wall watermark record": 64 bytes, magic, major 1, reserved zero, digest (minor unchecked)."""
    _need(len(data) == WATERMARK_SIZE, f"watermark is {len(data)} bytes, not {WATERMARK_SIZE}")
    magic, major, _minor, reserved, bucket, sequence, digest = _WATERMARK.unpack(data)
    _need(magic == b"SDQWMR1\0", "watermark magic")
    _need(major == 1 and reserved == 0, "watermark major version or reserved bytes")
    _need(digest == sha256(DOMAIN_WATERMARK + data[:32]), "watermark digest mismatch")
    return Watermark(bucket, sequence)
