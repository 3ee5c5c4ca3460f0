"""Binary records, digests, recovery cursor and transition tickets against spec/vectors.md."""

from __future__ import annotations

import hashlib
import json
import re
import struct
from typing import Any

import pytest

from steadqd.constants import (
    DOMAIN_ENVELOPE,
    DOMAIN_FORMAT,
    DOMAIN_RECEIPT,
    DOMAIN_WATERMARK,
    QuarantineReason,
)
from steadqd.errors import CorruptObject, ErrorKind, InvalidInput, QueueCorrupt, SteadQError, UnsupportedFormat
from steadqd.fs.json_records import (
    DeadLocation,
    DelayedLocation,
    EnqueueTicket,
    LeasedLocation,
    ReadyLocation,
    ReceiptLocation,
    TransitionTicket,
    reset_cursor_json,
    validate_cursor,
)
from steadqd.fs.records import (
    CompactReceipt,
    Extension,
    FormatRecord,
    JobHeader,
    Watermark,
    build_header,
    check_envelope,
    encode_extension,
    envelope_digest,
    is_compact_receipt,
    sha256,
    validate_queue_config,
)
from tests.prereq import spec_file
from tests.spec_vectors import CLAIM_TICKET_JSON

QUEUE_ID = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
JOB_ID = bytes.fromhex("f0e1d2c3b4a5968778695a4b3c2d1e0f")
TOKEN = bytes.fromhex("00112233445566778899aabbccddeeff")
CREATED = 1_700_000_000_000_000_000
TERMINAL_W = 3_600_000_000_000
ENVELOPE = bytes.fromhex("3824863bf5184c54b02246d36bef0f2513d421261636643097038039cfe497b7")
BOOT = "12345678-1234-1234-1234-123456789abc"


def dump(text: str) -> bytes:
    """Parse a vectors.md hex dump ("0000: hex   comment")."""
    out = b""
    for line in text.strip().splitlines():
        m = re.match(r"\s*[0-9a-f]{4}: ([0-9a-f]+)", line)
        assert m, line
        out += bytes.fromhex(m.group(1))
    return out


FORMAT_DUMP = dump(
    """
0000: 534451464d5431000001000100000000   magic SDQFMT1\\0, major 1, minor 1, flags 0
0010: 000102030405060708090a0b0c0d0e0f   queue_id
0020: 17979cfe362a00000000004000000000   created_at, shard_count 0x40, reserved
0030: 00000002540be40000000002540be400   lease width, delayed width
0040: 0000034630b8a000000000ffffffffff   terminal width, max_payload_length
0050: 01400000000000000000000000000000   digest alg 1, tag bits 0x40, reserved, required features
0060: 00000000000000000000000000000000   optional features, reserved
0070: 00000000000000000000000000000000   reserved
0080: cb40385ae2df36147854e581f5df166d   format_digest
0090: 6518bba4ab73a67f24b5d184843401b1
"""
)

JOB_DUMP = dump(
    """
0000: 5344514a4f423100000100010000000d   magic SDQJOB1\\0, major 1, minor 1, ext_len 13
0010: 000000000000000b0000000001000000   payload_length 11, flags 0, digest alg 1, reserved
0020: f0e1d2c3b4a5968778695a4b3c2d1e0f   job_id
0030: 000000030000000017979cfe362a0000   maximum_attempts 3, reserved, created_at
0040: b94d27b9934d3e08a52e52d7da7dabfa   payload_digest = SHA256("hello world")
0050: c484efe37a5380ee9088f7ace2efcde9
0060: 3824863bf5184c54b02246d36bef0f25   envelope_digest
0070: 13d421261636643097038039cfe497b7
0080: a1026a746578742f706c61696e68656c   extension || payload…
0090: 6c6f20776f726c64
"""
)

RECEIPT_DUMP = dump(
    """
0000: 534451524350540000010001f0e1d2c3   magic SDQRCPT\\0, major 1, minor 1, job_id…
0010: b4a5968778695a4b3c2d1e0f3824863b   …job_id, envelope_digest…
0020: f5184c54b02246d36bef0f2513d42126
0030: 1636643097038039cfe497b700000001   …envelope_digest, final_attempt 1
0040: 00112233445566778899aabbccddeeff   lease_token
0050: 17979c43f272c000000000000000000b   bucket start, payload length 11
0060: e386b4d0ed53737aa0dd61322948f33f   receipt_digest
0070: ed423b6f66b4f03306bb70d37ed70af4
"""
)

WATERMARK_DUMP_0 = dump(
    """
0000: 534451574d5231000001000100000000
0010: 000000000a21fe800000000000000000
0020: 08f478d66284c8c167077dc9f1a7193e
0030: 24da0800dee78e849f3bc16a69dc5eca
"""
)

WATERMARK_DUMP_1 = dump(
    """
0000: 534451574d5231000001000100000000
0010: 000000000a21fe830000000000000001
0020: a97ae9bcffd6d5ba7711a680a41608be
0030: 60fb44034eb3e237da39dc2eedcbbe05
"""
)

CURSOR_LINE = (
    b'{"schema":"steadq-recovery-cursor","version":1,"queue_id":"000102030405060708090a0b0c0d0e0f",'
    b'"cursor":{"phase":"reap_leases","reap_leases":null,"promote_delayed":null,"cleanup_temp":null,'
    b'"compact_receipts":null,"delete_receipts":null,"hierarchy_retries":[],"hierarchy_retry_frontiers":[],'
    b'"hierarchy_retry_overflow":[]}}'
)


def vector_format() -> FormatRecord:
    return FormatRecord(QUEUE_ID, CREATED, 64, 10**10, 10**10, TERMINAL_W, 2**40 - 1)


def flip_each_bit(data: bytes):
    for i in range(len(data)):
        for bit in range(8):
            yield i, data[:i] + bytes([data[i] ^ (1 << bit)]) + data[i + 1 :]


def patch(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new) :]


def redigest(data: bytes, domain: bytes, body_len: int) -> bytes:
    """Recompute a trailing digest so that a field change is tested by itself."""
    return data[:body_len] + sha256(domain + data[:body_len])


# ---------------------------------------------------------------------------
# Pinned digests
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "digest"),
    [
        (DOMAIN_FORMAT + bytes(128), "9707cc37ed7f1025a4c3b066c83051c6353c5aa3be9b6650940f03acf288961c"),
        (DOMAIN_RECEIPT + bytes(96), "544b0c70aa840523646a75befda7f513967631287f0ed4430993212840ae16c9"),
        (DOMAIN_WATERMARK + bytes(32), "58e096acae632c52bb6cc30d24c156eb7d45b7586475d987f13670e1193dbaca"),
        (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        (b"hello world", "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"),
    ],
)
def test_pinned_digests(data: bytes, digest: str) -> None:
    assert sha256(data).hex() == digest


@pytest.mark.parametrize(
    ("minor", "digest"),
    [
        (1, "80ab8359194ffd2442d2bc3afdaebdc6089afb00bd04a772c2097b03723da561"),
        (0, "58490679fad0f92ecbea9ab1de222052f31e815331855c88bbfe5ac01503d88c"),
    ],
)
def test_pinned_envelope_digests(minor: int, digest: str) -> None:
    header = build_header(
        job_id=b"\xab" * 16,
        max_attempts=3,
        created_at_ns=0,
        extension=b"",
        payload_length=5,
        payload_digest=sha256(b"hello"),
        minor=minor,
    )
    assert header.envelope_digest.hex() == digest
    raw = header.encode()
    assert envelope_digest(raw, b"").hex() == digest
    # A minor-0 header is accepted and its digest covers the stored minor bytes.
    decoded = JobHeader.decode(raw)
    assert decoded.minor == minor
    check_envelope(decoded, raw, b"")


def test_spec_digest_file_empty_payload() -> None:
    m = re.search(r"SHA-256: ([0-9a-f]{64})", spec_file("reference/test-vectors/format/digests.txt").read_text())
    assert m and sha256(b"").hex() == m.group(1)


# ---------------------------------------------------------------------------
# FORMAT
# ---------------------------------------------------------------------------


def test_format_vector() -> None:
    assert len(FORMAT_DUMP) == 160
    assert vector_format().encode() == FORMAT_DUMP
    assert FormatRecord.decode(FORMAT_DUMP) == vector_format()
    assert FORMAT_DUMP[128:] == sha256(DOMAIN_FORMAT + FORMAT_DUMP[:128])


@pytest.mark.parametrize("size", [0, 128, 159, 161, 320])
def test_format_wrong_size(size: int) -> None:
    data = (FORMAT_DUMP * 2)[:size]
    with pytest.raises(QueueCorrupt, match="size"):
        FormatRecord.decode(data)


def test_format_bad_magic_wins_over_major() -> None:
    data = patch(patch(FORMAT_DUMP, 0, b"SDQFMT2\0"), 8, b"\x00\x02")
    with pytest.raises(QueueCorrupt, match="magic") as info:
        FormatRecord.decode(data)
    assert info.value.kind is ErrorKind.QUEUE_CORRUPT


@pytest.mark.parametrize("major", [0, 2, 0xFFFF])
def test_format_major_is_unsupported_even_with_bad_digest(major: int) -> None:
    data = patch(FORMAT_DUMP, 8, struct.pack(">H", major))
    with pytest.raises(UnsupportedFormat) as info:
        FormatRecord.decode(data)
    assert info.value.kind is ErrorKind.UNSUPPORTED_FORMAT and info.value.exit_code == 64
    with pytest.raises(UnsupportedFormat):
        FormatRecord.decode(redigest(data, DOMAIN_FORMAT, 128))


@pytest.mark.parametrize("minor", [0, 2, 0xFFFF])
def test_format_minor_not_checked(minor: int) -> None:
    data = redigest(patch(FORMAT_DUMP, 10, struct.pack(">H", minor)), DOMAIN_FORMAT, 128)
    assert FormatRecord.decode(data).minor == minor
    rec = FormatRecord(QUEUE_ID, CREATED, 64, 10**10, 10**10, TERMINAL_W, 2**40 - 1, minor=minor)
    assert rec.encode() == data


@pytest.mark.parametrize(
    ("offset", "new", "pattern"),
    [
        (12, b"\x00\x00\x00\x01", "flags"),
        (44, b"\x00\x00\x00\x01", "reserved"),
        (80, b"\x02", "digest algorithm"),
        (81, b"\x20", "tag bits"),
        (82, b"\x01", "reserved"),
        (87, b"\x80", "reserved"),
        (88, b"\x00" * 7 + b"\x01", "feature"),
        (96, b"\x80" + b"\x00" * 7, "feature"),
        (104, b"\x01", "reserved"),
        (127, b"\x01", "reserved"),
        (40, struct.pack(">I", 0), "shard_count"),
        (40, struct.pack(">I", 3), "shard_count"),
        (40, struct.pack(">I", 8192), "shard_count"),
        (48, struct.pack(">Q", 0), "lease_bucket_width_ns"),
        (56, struct.pack(">Q", 0), "delayed_bucket_width_ns"),
        (64, struct.pack(">Q", 59 * 10**9), "terminal_bucket_width_ns"),
        (64, struct.pack(">Q", 86_401 * 10**9), "terminal_bucket_width_ns"),
        (56, struct.pack(">Q", 7 * 10**9), "multiple"),
        (72, struct.pack(">Q", 2**40), "max_payload_length"),
    ],
)
def test_format_field_checks(offset: int, new: bytes, pattern: str) -> None:
    data = redigest(patch(FORMAT_DUMP, offset, new), DOMAIN_FORMAT, 128)
    with pytest.raises(QueueCorrupt, match=pattern) as info:
        FormatRecord.decode(data)
    assert type(info.value) is QueueCorrupt


def test_format_digest_mismatch() -> None:
    with pytest.raises(QueueCorrupt, match="digest"):
        FormatRecord.decode(patch(FORMAT_DUMP, 159, b"\x00"))


def test_format_every_bit_flip_rejected() -> None:
    for i, data in flip_each_bit(FORMAT_DUMP):
        expected = UnsupportedFormat if 8 <= i < 10 else QueueCorrupt
        with pytest.raises(expected):
            FormatRecord.decode(data)


def test_format_boundaries_accepted() -> None:
    for shards in (1, 2, 4096):
        rec = FormatRecord(QUEUE_ID, 0, shards, 1, 60 * 10**9, 60 * 10**9, 0)
        assert FormatRecord.decode(rec.encode()) == rec
    rec = FormatRecord(QUEUE_ID, 2**64 - 1, 64, 2**64 - 1, 86_400 * 10**9, 86_400 * 10**9, 2**40 - 1)
    assert FormatRecord.decode(rec.encode()) == rec


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0, 1, 1, 60 * 10**9, 0), "shard_count"),
        ((48, 1, 1, 60 * 10**9, 0), "shard_count"),
        ((8192, 1, 1, 60 * 10**9, 0), "shard_count"),
        ((True, 1, 1, 60 * 10**9, 0), "shard_count"),
        ((64, 0, 1, 60 * 10**9, 0), "lease_bucket_width_ns"),
        ((64, 2**64, 1, 60 * 10**9, 0), "lease_bucket_width_ns"),
        ((64, 1, 0, 60 * 10**9, 0), "delayed_bucket_width_ns"),
        ((64, 1, 1, 60 * 10**9 - 1, 0), "terminal_bucket_width_ns"),
        ((64, 1, 1, 86_400 * 10**9 + 1, 0), "terminal_bucket_width_ns"),
        ((64, 1, 7 * 10**9, 60 * 10**9, 0), "terminal_bucket_width_ns"),
        ((64, 1, 1, 60 * 10**9, 2**40), "max_payload_length"),
        ((64, 1, 1, 60 * 10**9, -1), "max_payload_length"),
    ],
)
def test_validate_queue_config(args: tuple[int, ...], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        validate_queue_config(*args)
    assert str(info.value).startswith(field)
    with pytest.raises(InvalidInput):
        FormatRecord(QUEUE_ID, 0, *args).encode()


def test_validate_queue_config_retention_bound() -> None:
    week = 7 * 24 * 3600 * 10**9
    validate_queue_config(64, 10**10, 10**10, TERMINAL_W, 0, receipt_retention_ns=week)
    # ceil(week / 150 s) + 2 = 4034 fits; ceil(week / 140 s) + 2 = 4322 does not (open-questions E44).
    validate_queue_config(64, 10**10, 10**10, 150 * 10**9, 0, receipt_retention_ns=week)
    with pytest.raises(InvalidInput, match="probe bound"):
        validate_queue_config(64, 10**10, 10**10, 140 * 10**9, 0, receipt_retention_ns=week)
    validate_queue_config(64, 10**10, 10**10, 140 * 10**9, 0)


def test_format_encode_rejects_bad_identity() -> None:
    with pytest.raises(InvalidInput, match="queue_id"):
        FormatRecord(b"short", CREATED, 64, 10**10, 10**10, TERMINAL_W, 0).encode()
    with pytest.raises(InvalidInput, match="created_at_ns"):
        FormatRecord(QUEUE_ID, -1, 64, 10**10, 10**10, TERMINAL_W, 0).encode()


# ---------------------------------------------------------------------------
# Job envelope
# ---------------------------------------------------------------------------


def vector_header() -> JobHeader:
    ext = encode_extension(Extension("text/plain"))
    return build_header(
        job_id=JOB_ID,
        max_attempts=3,
        created_at_ns=CREATED,
        extension=ext,
        payload_length=11,
        payload_digest=sha256(b"hello world"),
    )


def test_job_file_vector() -> None:
    assert len(JOB_DUMP) == 152
    ext = encode_extension(Extension("text/plain"))
    assert ext.hex() == "a1026a746578742f706c61696e"
    header = vector_header()
    assert header.envelope_digest == ENVELOPE
    assert header.encode() + ext + b"hello world" == JOB_DUMP
    assert header.file_size == 152
    assert (
        sha256(DOMAIN_ENVELOPE + JOB_DUMP[:96] + bytes(32) + ext).hex()
        == "3824863bf5184c54b02246d36bef0f2513d421261636643097038039cfe497b7"
    )
    decoded = JobHeader.decode(JOB_DUMP[:128])
    assert decoded == header
    check_envelope(decoded, JOB_DUMP[:128], JOB_DUMP[128:141])
    assert envelope_digest(JOB_DUMP[:128], ext) == ENVELOPE


def test_envelope_digest_ignores_stored_digest_bytes() -> None:
    raw = JOB_DUMP[:128]
    assert envelope_digest(patch(raw, 96, b"\xff" * 32), JOB_DUMP[128:141]) == ENVELOPE


def hdr_corrupt(data: bytes, pattern: str) -> None:
    with pytest.raises(CorruptObject, match=pattern) as info:
        JobHeader.decode(data)
    assert info.value.reason == QuarantineReason.ENVELOPE_CORRUPT
    assert info.value.kind is ErrorKind.QUEUE_CORRUPT


@pytest.mark.parametrize("size", [0, 127, 129, 152])
def test_header_wrong_size(size: int) -> None:
    hdr_corrupt(JOB_DUMP[:size] + bytes(max(0, size - 152)), "size")


@pytest.mark.parametrize(
    ("offset", "new", "pattern"),
    [
        (0, b"SDQJOB2\0", "magic"),
        (8, b"\x00\x02", "major"),
        (8, b"\x00\x00", "major"),
        (24, b"\x00\x00\x00\x01", "flags"),
        (28, b"\x02", "digest algorithm"),
        (29, b"\x01", "reserved"),
        (31, b"\x80", "reserved"),
        (52, b"\x01", "reserved"),
        (55, b"\x01", "reserved"),
        (48, b"\x00\x00\x00\x00", "maximum_attempts"),
        (16, struct.pack(">Q", 2**40), "payload_length"),
        (12, struct.pack(">I", 65_537), "extension_header_length"),
    ],
)
def test_header_field_checks(offset: int, new: bytes, pattern: str) -> None:
    hdr_corrupt(patch(JOB_DUMP[:128], offset, new), pattern)


def test_header_limits_accepted() -> None:
    raw = patch(patch(JOB_DUMP[:128], 16, struct.pack(">Q", 2**40 - 1)), 12, struct.pack(">I", 65_536))
    decoded = JobHeader.decode(raw)
    assert decoded.payload_length == 2**40 - 1 and decoded.extension_length == 65_536
    assert JobHeader.decode(patch(JOB_DUMP[:128], 10, b"\x00\x07")).minor == 7  # minor unchecked by decode


def test_header_every_bit_flip_detected() -> None:
    ext = JOB_DUMP[128:141]
    for _, raw in flip_each_bit(JOB_DUMP[:128]):
        with pytest.raises(CorruptObject) as info:
            check_envelope(JobHeader.decode(raw), raw, ext)
        assert info.value.reason == QuarantineReason.ENVELOPE_CORRUPT


def test_extension_every_bit_flip_detected() -> None:
    raw, ext = JOB_DUMP[:128], JOB_DUMP[128:141]
    header = JobHeader.decode(raw)
    for _, bad in flip_each_bit(ext):
        with pytest.raises(CorruptObject, match="envelope digest mismatch"):
            check_envelope(header, raw, bad)


def test_check_envelope_extension_length() -> None:
    raw = JOB_DUMP[:128]
    with pytest.raises(CorruptObject, match="extension is 12 bytes"):
        check_envelope(JobHeader.decode(raw), raw, JOB_DUMP[128:140])


def test_payload_not_in_envelope_digest() -> None:
    a = build_header(job_id=JOB_ID, max_attempts=1, created_at_ns=0, extension=b"", payload_length=1,
                     payload_digest=b"\x00" * 32)  # fmt: skip
    b = build_header(job_id=JOB_ID, max_attempts=1, created_at_ns=0, extension=b"", payload_length=1,
                     payload_digest=b"\x01" * 32)  # fmt: skip
    assert a.envelope_digest != b.envelope_digest  # payload digest is inside the header...
    assert envelope_digest(a.encode(), b"") == a.envelope_digest  # ...but payload bytes are not


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"job_id": b"x" * 15}, "job_id"),
        ({"max_attempts": 0}, "maximum_attempts"),
        ({"max_attempts": 2**32}, "maximum_attempts"),
        ({"created_at_ns": -1}, "created_at_ns"),
        ({"payload_length": 2**40}, "payload_length"),
        ({"payload_digest": b"x"}, "payload_digest"),
        ({"extension": b"x" * 65_537}, "extension"),
        ({"minor": 65_536}, "minor"),
    ],
)
def test_build_header_rejects(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = dict(
        job_id=JOB_ID, max_attempts=3, created_at_ns=CREATED, extension=b"", payload_length=0, payload_digest=bytes(32)
    )
    args.update(kwargs)
    with pytest.raises(InvalidInput) as info:
        build_header(**args)
    assert str(info.value).startswith(field)


# ---------------------------------------------------------------------------
# Compact receipt
# ---------------------------------------------------------------------------


def vector_receipt() -> CompactReceipt:
    return CompactReceipt(JOB_ID, ENVELOPE, 1, TOKEN, 472_222 * TERMINAL_W, 11)


def test_compact_receipt_vector() -> None:
    assert 472_222 * TERMINAL_W == 1_699_999_200_000_000_000
    assert vector_receipt().encode() == RECEIPT_DUMP
    assert CompactReceipt.decode(RECEIPT_DUMP) == vector_receipt()
    assert is_compact_receipt(RECEIPT_DUMP, 128)
    assert is_compact_receipt(RECEIPT_DUMP[:8], 128)


def test_is_compact_receipt() -> None:
    assert not is_compact_receipt(RECEIPT_DUMP, 129)
    assert not is_compact_receipt(RECEIPT_DUMP, 127)
    assert not is_compact_receipt(JOB_DUMP[:128], 128)
    assert not is_compact_receipt(b"SDQRCPT", 128)


def rcpt_corrupt(data: bytes, pattern: str) -> None:
    with pytest.raises(CorruptObject, match=pattern) as info:
        CompactReceipt.decode(data)
    assert info.value.reason == QuarantineReason.ENVELOPE_CORRUPT


@pytest.mark.parametrize("size", [0, 96, 127, 129])
def test_compact_receipt_wrong_size(size: int) -> None:
    rcpt_corrupt((RECEIPT_DUMP * 2)[:size], "size")


@pytest.mark.parametrize(
    ("offset", "new", "pattern"),
    [
        (0, b"SDQRCPX\0", "magic"),
        (8, b"\x00\x02", "major"),
        (10, b"\x00\x00", "minor version 0"),
    ],
)
def test_compact_receipt_field_checks(offset: int, new: bytes, pattern: str) -> None:
    rcpt_corrupt(redigest(patch(RECEIPT_DUMP, offset, new), DOMAIN_RECEIPT, 96), pattern)


def test_compact_receipt_newer_minor_accepted() -> None:
    data = redigest(patch(RECEIPT_DUMP, 10, b"\x00\x05"), DOMAIN_RECEIPT, 96)
    assert CompactReceipt.decode(data).minor == 5


def test_compact_receipt_every_bit_flip_rejected() -> None:
    for _, data in flip_each_bit(RECEIPT_DUMP):
        with pytest.raises(CorruptObject):
            CompactReceipt.decode(data)


# ---------------------------------------------------------------------------
# Wall watermark
# ---------------------------------------------------------------------------


def test_watermark_vectors() -> None:
    assert 1_700_000_000_000_000_000 // 10**10 == 170_000_000
    assert Watermark(170_000_000, 0).encode() == WATERMARK_DUMP_0
    assert Watermark(170_000_003, 1).encode() == WATERMARK_DUMP_1
    assert Watermark.decode(WATERMARK_DUMP_0) == Watermark(170_000_000, 0)
    assert Watermark.decode(WATERMARK_DUMP_1) == Watermark(170_000_003, 1)


def test_watermark_sizes() -> None:
    with pytest.raises(QueueCorrupt, match="truncated"):
        Watermark.decode(WATERMARK_DUMP_0[:63])
    with pytest.raises(QueueCorrupt, match="truncated"):
        Watermark.decode(b"")
    with pytest.raises(QueueCorrupt, match="too large"):
        Watermark.decode(WATERMARK_DUMP_0 + b"\x00")


@pytest.mark.parametrize(
    ("offset", "new", "pattern"),
    [
        (0, b"SDQWMR2\0", "magic"),
        (8, b"\x00\x02", "major"),
        (12, b"\x00\x00\x00\x01", "reserved"),
        (15, b"\x80", "reserved"),
    ],
)
def test_watermark_field_checks(offset: int, new: bytes, pattern: str) -> None:
    with pytest.raises(QueueCorrupt, match=pattern):
        Watermark.decode(redigest(patch(WATERMARK_DUMP_0, offset, new), DOMAIN_WATERMARK, 32))


@pytest.mark.parametrize("minor", [0, 9])
def test_watermark_minor_not_checked(minor: int) -> None:
    data = redigest(patch(WATERMARK_DUMP_1, 10, struct.pack(">H", minor)), DOMAIN_WATERMARK, 32)
    assert Watermark.decode(data) == Watermark(170_000_003, 1, minor)


def test_watermark_every_bit_flip_rejected() -> None:
    for _, data in flip_each_bit(WATERMARK_DUMP_1):
        with pytest.raises(QueueCorrupt):
            Watermark.decode(data)


def test_watermark_encode_rejects_overflow() -> None:
    with pytest.raises(InvalidInput, match="sequence"):
        Watermark(0, 2**64).encode()


# ---------------------------------------------------------------------------
# Recovery cursor
# ---------------------------------------------------------------------------


def test_reset_cursor_vector() -> None:
    line = reset_cursor_json(QUEUE_ID)
    assert line == CURSOR_LINE
    assert len(line) == 319 and not line.endswith(b"\n")
    assert json.loads(line) == json.loads(CURSOR_LINE)
    doc = validate_cursor(line, QUEUE_ID)
    assert doc["cursor"]["phase"] == "reap_leases"
    assert doc["cursor"]["hierarchy_retries"] == []


@pytest.mark.parametrize("phase", ["promote_delayed", "cleanup_temp", "compact_receipts", "delete_receipts"])
def test_reset_cursor_other_phases(phase: str) -> None:
    line = reset_cursor_json(QUEUE_ID, phase)
    assert line == CURSOR_LINE.replace(b'"phase":"reap_leases"', f'"phase":"{phase}"'.encode())
    assert validate_cursor(line, QUEUE_ID)["cursor"]["phase"] == phase


def test_reset_cursor_rejects_bad_args() -> None:
    with pytest.raises(InvalidInput):
        reset_cursor_json(QUEUE_ID, "nope")
    with pytest.raises(InvalidInput):
        reset_cursor_json(b"x")


def cursor_doc(**cursor: Any) -> dict[str, Any]:
    doc = json.loads(CURSOR_LINE)
    doc["cursor"].update(cursor)
    return doc


def enc(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def comp(s: str | bytes) -> list[int]:
    return list(s.encode() if isinstance(s, str) else s)


VALID_REAP = {
    "first": comp(BOOT),
    "second": comp("0000000000000067"),
    "third": comp("000a"),
    "resume_after": comp("x.sqj"),
}
VALID_PROMOTE = {"first": comp("000000000a21fe8b"), "second": comp("000a"), "resume_after": comp("y.sqj")}


def test_cursor_with_positions_and_retries() -> None:
    doc = cursor_doc(
        phase="compact_receipts",
        reap_leases=VALID_REAP,
        promote_delayed=VALID_PROMOTE,
        cleanup_temp={"first": comp(BOOT), "second": comp("0001"), "resume_after": comp(b"\xff\x80")},
        hierarchy_retries=[
            {"phase": "reap_leases", "kind": "open", "components": [BOOT]},
            {"phase": "reap_leases", "kind": "open", "components": [BOOT, "0000000000000067"]},
            {"phase": "reap_leases", "kind": "enumerate", "components": [BOOT]},
            {"phase": "promote_delayed", "components": ["000000000a21fe8b", "000a"]},
            {"phase": "cleanup_temp", "kind": "open", "components": [BOOT, "0003"]},
        ],
        hierarchy_retry_frontiers=[
            {"phase": "reap_leases", "kind": "open", "components": [BOOT, "0000000000000067", "000a"]},
            {"phase": "delete_receipts", "kind": "enumerate", "components": ["0000000000000001"]},
        ],
        hierarchy_retry_overflow=["promote_delayed", "delete_receipts"],
    )
    out = validate_cursor(enc(doc), QUEUE_ID)
    cur = out["cursor"]
    assert cur["reap_leases"]["third"] == b"000a"
    assert cur["cleanup_temp"]["resume_after"] == b"\xff\x80"
    assert cur["hierarchy_retries"][3]["kind"] == "open"  # default
    assert cur["compact_receipts"] is None


def test_cursor_defaults_when_optional_fields_absent() -> None:
    doc = {
        "schema": "steadq-recovery-cursor",
        "version": 1,
        "queue_id": QUEUE_ID.hex(),
        "cursor": {"phase": "cleanup_temp"},
    }
    cur = validate_cursor(enc(doc), QUEUE_ID)["cursor"]
    assert cur["reap_leases"] is None and cur["hierarchy_retry_overflow"] == []


def bad_cursor(data: bytes, pattern: str | None = None) -> None:
    with pytest.raises(QueueCorrupt, match=pattern) as info:
        validate_cursor(data, QUEUE_ID)
    assert type(info.value) is QueueCorrupt
    assert str(info.value).startswith("recovery cursor")


def test_cursor_size_limits() -> None:
    bad_cursor(b"", "size")
    bad_cursor(CURSOR_LINE + b" " * (16_385 - len(CURSOR_LINE)), "size")
    validate_cursor(CURSOR_LINE + b" " * (16_384 - len(CURSOR_LINE)), QUEUE_ID)


def test_cursor_wrong_queue_id() -> None:
    with pytest.raises(QueueCorrupt, match="queue_id"):
        validate_cursor(CURSOR_LINE, bytes(16))


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        (b"\xff" + CURSOR_LINE, "UTF-8"),
        (b"\xef\xbb\xbf" + CURSOR_LINE, "malformed"),
        (CURSOR_LINE + b"x", "malformed"),
        (CURSOR_LINE[:-1], "malformed"),
        (b"[]", "object"),
        (b"null", "object"),
        (CURSOR_LINE.replace(b'"version":1', b'"version":NaN'), "NaN"),
        (CURSOR_LINE.replace(b'"version":1', b'"version":1.0'), "version"),
        (CURSOR_LINE.replace(b'"version":1', b'"version":true'), "version"),
        (CURSOR_LINE.replace(b'"version":1', b'"version":2'), "version"),
        (CURSOR_LINE.replace(b'"version":1', b'"version":"1"'), "version"),
        (CURSOR_LINE.replace(b"steadq-recovery-cursor", b"steadq-recovery-cursor2"), "schema"),
        (CURSOR_LINE.replace(b"000102030405060708090a0b0c0d0e0f", b"000102030405060708090A0B0C0D0E0F"), "queue_id"),
        (CURSOR_LINE.replace(b'"version":1', b'"version":1,"extra":1'), "unknown field 'extra'"),
        (CURSOR_LINE.replace(b'"version":1', b'"version":1,"version":1'), "duplicate"),
        (CURSOR_LINE.replace(b'"phase":"reap_leases",', b'"phase":"reap_leases","x":null,'), "unknown field 'x'"),
        (CURSOR_LINE.replace(b'"phase":"reap_leases",', b""), "missing field 'phase'"),
        (CURSOR_LINE.replace(b'"phase":"reap_leases"', b'"phase":"Reap_leases"'), "phase"),
        (CURSOR_LINE.replace(b'"phase":"reap_leases"', b'"phase":null'), "phase"),
        (CURSOR_LINE.replace(b'"hierarchy_retries":[]', b'"hierarchy_retries":{}'), "array"),
        (CURSOR_LINE.replace(b'"hierarchy_retries":[]', b'"hierarchy_retries":null'), "array"),
        (CURSOR_LINE.replace(b',"cursor":{', b',"cursor":{"phase":"reap_leases"},"c":{'), "unknown field 'c'"),
    ],
)
def test_cursor_malformed_documents(data: bytes, pattern: str) -> None:
    bad_cursor(data, pattern)


def test_cursor_missing_top_fields() -> None:
    for key in ("schema", "version", "queue_id", "cursor"):
        doc = json.loads(CURSOR_LINE)
        del doc[key]
        bad_cursor(enc(doc), f"missing field '{key}'")


@pytest.mark.parametrize(
    ("phase", "position", "pattern"),
    [
        ("reap_leases", {k: v for k, v in VALID_REAP.items() if k != "third"}, "missing field 'third'"),
        ("promote_delayed", {**VALID_PROMOTE, "third": comp("000a")}, "unknown field 'third'"),
        ("promote_delayed", {**VALID_PROMOTE, "first": []}, "1..255"),
        ("promote_delayed", {**VALID_PROMOTE, "first": [97] * 256}, "1..255"),
        ("promote_delayed", {**VALID_PROMOTE, "first": comp(".")}, "not a valid directory entry"),
        ("promote_delayed", {**VALID_PROMOTE, "first": comp("..")}, "not a valid directory entry"),
        ("promote_delayed", {**VALID_PROMOTE, "first": comp("a/b")}, "not a valid directory entry"),
        ("promote_delayed", {**VALID_PROMOTE, "first": [97, 0]}, "not a valid directory entry"),
        ("promote_delayed", {**VALID_PROMOTE, "first": [97, 256]}, "byte value"),
        ("promote_delayed", {**VALID_PROMOTE, "first": [97, -1]}, "byte value"),
        ("promote_delayed", {**VALID_PROMOTE, "first": [True]}, "byte value"),
        ("promote_delayed", {**VALID_PROMOTE, "first": [97.0]}, "byte value"),
        ("promote_delayed", {**VALID_PROMOTE, "first": "000a"}, "array"),
        ("compact_receipts", [], "object"),
        ("delete_receipts", {}, "missing field"),
    ],
)
def test_cursor_bad_positions(phase: str, position: Any, pattern: str) -> None:
    bad_cursor(enc(cursor_doc(**{phase: position})), pattern)


def test_cursor_component_limits_inclusive() -> None:
    pos = {**VALID_PROMOTE, "first": [255] * 255, "second": [1], "resume_after": comp("...")}
    assert validate_cursor(enc(cursor_doc(promote_delayed=pos)), QUEUE_ID)["cursor"]["promote_delayed"]["first"] == (
        b"\xff" * 255
    )


def entry(phase: str, *components: str, kind: str | None = "open") -> dict[str, Any]:
    e: dict[str, Any] = {"phase": phase, "components": list(components)}
    if kind is not None:
        e["kind"] = kind
    return e


@pytest.mark.parametrize(
    ("retries", "pattern"),
    [
        ([entry("reap_leases")], "1..3"),
        ([entry("reap_leases", BOOT, "0000000000000067", "000a", "x")], "1..3"),
        ([entry("promote_delayed", "000000000a21fe8b", "000a", "x")], "1..2"),
        ([entry("cleanup_temp", BOOT, "0000", "x")], "1..2"),
        ([entry("reap_leases", BOOT.upper())], "components\\[0\\]"),
        ([entry("reap_leases", BOOT.replace("-", ""))], "components\\[0\\]"),
        ([entry("reap_leases", BOOT, "67")], "components\\[1\\]"),
        ([entry("reap_leases", BOOT, "000000000000006G")], "components\\[1\\]"),
        ([entry("reap_leases", BOOT, "0000000000000067", "0A")], "components\\[2\\]"),
        ([entry("promote_delayed", BOOT)], "components\\[0\\]"),
        ([entry("cleanup_temp", "000000000a21fe8b")], "components\\[0\\]"),
        ([entry("compact_receipts", "000000000a21fe8b", "000a0")], "components\\[1\\]"),
        ([entry("delete_receipts", "000000000a21fe8b", 10)], "components\\[1\\]"),  # type: ignore[arg-type]
        ([entry("delete_receipts", "000000000a21fe8b", kind="close")], "kind"),
        ([entry("delete_receipts", "000000000a21fe8b", kind=None) | {"kind": None}], "kind"),
        ([entry("nope", "000000000a21fe8b")], "unknown phase"),
        ([entry("delete_receipts", "000000000a21fe8b") | {"x": 1}], "unknown field 'x'"),
        ([{"phase": "delete_receipts", "kind": "open"}], "missing field 'components'"),
        ([entry("promote_delayed", "0000000000000002"), entry("promote_delayed", "0000000000000001")], "ascending"),
        ([entry("promote_delayed", "0000000000000001")] * 2, "ascending"),
        ([entry("promote_delayed", "0000000000000001", kind="enumerate"), entry("promote_delayed", "0000000000000001")],
         "ascending"),
        ([entry("promote_delayed", "0000000000000001"), entry("reap_leases", BOOT)], "ascending"),
        ([entry("promote_delayed", "0000000000000001", "0000"), entry("promote_delayed", "0000000000000001")],
         "ascending"),
        ([entry("promote_delayed", f"{i:016x}") for i in range(65)], "65 entries, limit 64"),
    ],
)  # fmt: skip
def test_cursor_bad_hierarchy_retries(retries: list[Any], pattern: str) -> None:
    bad_cursor(enc(cursor_doc(hierarchy_retries=retries)), pattern)


def test_cursor_hierarchy_retry_limit_inclusive() -> None:
    retries = [entry("promote_delayed", f"{i:016x}") for i in range(64)]
    assert (
        len(validate_cursor(enc(cursor_doc(hierarchy_retries=retries)), QUEUE_ID)["cursor"]["hierarchy_retries"]) == 64
    )


@pytest.mark.parametrize(
    ("field", "value", "pattern"),
    [
        ("hierarchy_retry_frontiers", [entry("cleanup_temp", BOOT), entry("cleanup_temp", BOOT, "0001")], "ascending"),
        ("hierarchy_retry_frontiers", [entry("cleanup_temp", BOOT), entry("reap_leases", BOOT)], "ascending"),
        ("hierarchy_retry_frontiers", [entry("cleanup_temp", "0001")], "components"),
        ("hierarchy_retry_frontiers", [entry("reap_leases", BOOT)] * 6, "limit 5"),
        ("hierarchy_retry_overflow", ["delete_receipts", "reap_leases"], "ascending"),
        ("hierarchy_retry_overflow", ["reap_leases", "reap_leases"], "ascending"),
        ("hierarchy_retry_overflow", ["nope"], "unknown phase"),
        ("hierarchy_retry_overflow", [1], "unknown phase"),
    ],
)
def test_cursor_bad_frontiers_and_overflow(field: str, value: list[Any], pattern: str) -> None:
    bad_cursor(enc(cursor_doc(**{field: value})), pattern)


def test_cursor_deep_nesting_is_corrupt_not_crash() -> None:
    bad_cursor(b"[" * 8000 + b"]" * 8000)


# ---------------------------------------------------------------------------
# Transition tickets
# ---------------------------------------------------------------------------

LEASED = LeasedLocation(BOOT, 1_030_000_000_000, 1_700_000_035_000_000_000)


def claim_ticket(**changes: Any) -> TransitionTicket:
    fields: dict[str, Any] = dict(
        queue_id=QUEUE_ID,
        operation="claim",
        phase="linearized",
        job_id=JOB_ID,
        generation=0,
        attempt=0,
        maximum_attempts=3,
        lease_token=TOKEN,
        envelope_digest=ENVELOPE,
        payload_length=11,
        source=ReadyLocation(),
        destination=LEASED,
    )
    fields.update(changes)
    return TransitionTicket(**fields)


def test_claim_ticket_vector() -> None:
    ticket = claim_ticket()
    assert ticket.to_json() == CLAIM_TICKET_JSON
    parsed = TransitionTicket.from_json(CLAIM_TICKET_JSON)
    assert parsed == ticket
    assert TransitionTicket.from_json(CLAIM_TICKET_JSON.encode()) == ticket
    assert parsed.destination_identity() == (1, 1)


def test_ticket_from_dicts_equals_dataclasses() -> None:
    as_dicts = claim_ticket(source={"state": "ready"}, destination=LEASED.to_dict())
    assert as_dicts == claim_ticket()
    assert isinstance(as_dicts.destination, LeasedLocation)
    with pytest.raises(SteadQError) as info:
        claim_ticket(source={"state": "delayed", "not_before_ns": 1})
    assert info.value.kind is ErrorKind.INVALID_TICKET


def test_vector_ticket_with_renew_rejected() -> None:
    text = CLAIM_TICKET_JSON.replace('"operation": "claim"', '"operation": "renew"')
    with pytest.raises(SteadQError, match="operation does not permit the ticket source and destination") as info:
        TransitionTicket.from_json(text)
    assert info.value.kind is ErrorKind.INVALID_TICKET and info.value.exit_code == 1


@pytest.mark.parametrize(
    ("operation", "source", "destination", "identity"),
    [
        ("claim", ReadyLocation(), LEASED, (6, 2)),
        ("renew", LEASED, LEASED, (6, 1)),
        ("acknowledge", LEASED, ReceiptLocation(472_222), (6, 1)),
        ("retry_now", LEASED, ReadyLocation(), (6, 1)),
        ("retry_later", LEASED, DelayedLocation(1_700_000_100_000_000_001), (6, 1)),
        ("bury", LEASED, DeadLocation(472_222, 1), (6, 1)),
        ("bury", LEASED, DeadLocation(0, 0xFFFF), (6, 1)),
    ],
)
def test_ticket_operations_roundtrip(operation: str, source: Any, destination: Any, identity: tuple[int, int]) -> None:
    for phase in ("linearized", "destination_directory_durable", "source_directory_durable"):
        ticket = claim_ticket(operation=operation, phase=phase, source=source, destination=destination,
                              generation=5, attempt=1)  # fmt: skip
        text = ticket.to_json()
        assert not text.endswith("\n")
        assert list(json.loads(text)) == [
            "schema", "version", "queue_id", "operation", "phase", "source_identity", "source",
            "destination_derivation",
        ]  # fmt: skip
        assert TransitionTicket.from_json(text) == ticket
        assert ticket.destination_identity() == identity


def test_ticket_json_field_order_of_destinations() -> None:
    text = claim_ticket(operation="bury", source=LEASED, destination=DeadLocation(7, 3), attempt=1).to_json()
    assert text.endswith(
        '"destination_derivation": {\n    "state": "dead",\n    "terminal_bucket": 7,\n    "reason": 3\n  }\n}'
    )
    text = claim_ticket(operation="retry_later", source=LEASED, destination=DelayedLocation(9), attempt=1).to_json()
    assert '"destination_derivation": {\n    "state": "delayed",\n    "not_before_ns": 9\n  }' in text
    text = claim_ticket(operation="acknowledge", source=LEASED, destination=ReceiptLocation(8), attempt=1).to_json()
    assert '"destination_derivation": {\n    "state": "receipt",\n    "terminal_bucket": 8\n  }' in text


OPS = {
    "claim": ("ready", "leased"),
    "renew": ("leased", "leased"),
    "acknowledge": ("leased", "receipt"),
    "retry_now": ("leased", "ready"),
    "retry_later": ("leased", "delayed"),
    "bury": ("leased", "dead"),
}
DESTS = {
    "ready": ReadyLocation(),
    "leased": LEASED,
    "delayed": DelayedLocation(1),
    "receipt": ReceiptLocation(1),
    "dead": DeadLocation(1, 1),
}


def test_ticket_every_illegal_state_combination_rejected() -> None:
    for op, allowed in OPS.items():
        for src in ("ready", "leased"):
            for dst, dst_loc in DESTS.items():
                if (src, dst) == allowed:
                    continue
                ticket = claim_ticket(operation=op, source=DESTS[src], destination=dst_loc, attempt=1)
                with pytest.raises(SteadQError, match="operation does not permit") as info:
                    TransitionTicket.from_json(ticket.to_json())
                assert info.value.kind is ErrorKind.INVALID_TICKET


def mutate(path: list[str], value: Any = None, *, delete: bool = False) -> str:
    doc = json.loads(CLAIM_TICKET_JSON)
    target = doc
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(doc, indent=2)


def bad_ticket(text: str | bytes, pattern: str | None = None) -> None:
    with pytest.raises(SteadQError, match=pattern) as info:
        TransitionTicket.from_json(text)
    assert info.value.kind is ErrorKind.INVALID_TICKET
    assert str(info.value).startswith("invalid transition ticket: ")


@pytest.mark.parametrize(
    ("path", "value", "pattern"),
    [
        (["schema"], "steadq-transition-ticket-v2", "schema"),
        (["version"], 1, "version"),
        (["version"], 3, "version"),
        (["version"], "2", "version"),
        (["version"], 2.0, "version"),
        (["queue_id"], QUEUE_ID.hex().upper(), "queue_id"),
        (["queue_id"], QUEUE_ID.hex()[:-1], "queue_id"),
        (["queue_id"], QUEUE_ID.hex() + "0", "queue_id"),
        (["queue_id"], 5, "queue_id"),
        (["operation"], "ack", "operation"),
        (["operation"], None, "operation"),
        (["phase"], "durable", "phase"),
        (["source_identity", "job_id"], "F0E1D2C3B4A5968778695A4B3C2D1E0F", "job_id"),
        (["source_identity", "job_id"], " f0e1d2c3b4a5968778695a4b3c2d1e0", "job_id"),
        (["source_identity", "lease_token"], TOKEN.hex()[:30], "lease_token"),
        (["source_identity", "envelope_digest"], ENVELOPE.hex()[:32], "envelope_digest"),
        (["source_identity", "envelope_digest"], ENVELOPE.hex().upper(), "envelope_digest"),
        (["source_identity", "generation"], -1, "generation"),
        (["source_identity", "generation"], 2**64, "generation"),
        (["source_identity", "generation"], 1.0, "generation"),
        (["source_identity", "generation"], True, "generation"),
        (["source_identity", "generation"], "0", "generation"),
        (["source_identity", "attempt"], 2**32, "attempt"),
        (["source_identity", "maximum_attempts"], 2**32, "maximum_attempts"),
        (["source_identity", "maximum_attempts"], 0, "maximum_attempts is 0"),
        (["source_identity", "payload_length"], -1, "payload_length"),
        (["source_identity", "attempt"], 3, "destination attempt 4 exceeds maximum_attempts 3"),
        (["source_identity", "attempt"], 4, "attempt 4 exceeds maximum_attempts 3"),
        (["source_identity", "generation"], 2**64 - 1, "overflow"),
        (["source", "state"], "leased", "source: missing field 'boot_id'"),
        (["source", "state"], "delayed", "unknown state"),
        (["source", "state"], "nope", "unknown state"),
        (["source"], "ready", "object"),
        (["destination_derivation", "state"], "ready", "unknown field 'boot_id'"),
        (["destination_derivation", "boot_id"], BOOT.upper(), "boot_id"),
        (["destination_derivation", "boot_id"], BOOT.replace("-", ""), "boot_id"),
        (["destination_derivation", "boot_id"], BOOT + "\n", "boot_id"),
        (["destination_derivation", "boot_id"], "{" + BOOT + "}", "boot_id"),
        (["destination_derivation", "boottime_deadline_ns"], -5, "boottime_deadline_ns"),
        (["destination_derivation", "wall_deadline_ns"], 2**64, "wall_deadline_ns"),
        (["destination_derivation", "wall_deadline_ns"], None, "wall_deadline_ns"),
    ],
)
def test_ticket_field_validation(path: list[str], value: Any, pattern: str) -> None:
    bad_ticket(mutate(path, value), pattern)


@pytest.mark.parametrize(
    "path",
    [
        ["schema"], ["version"], ["queue_id"], ["operation"], ["phase"], ["source_identity"], ["source"],
        ["destination_derivation"], ["source_identity", "job_id"], ["source_identity", "payload_length"],
        ["source", "state"], ["destination_derivation", "boot_id"], ["destination_derivation", "wall_deadline_ns"],
    ],
)  # fmt: skip
def test_ticket_missing_fields(path: list[str]) -> None:
    bad_ticket(mutate(path, delete=True))


@pytest.mark.parametrize(
    "path",
    [["extra"], ["source_identity", "extra"], ["source", "boot_id"], ["destination_derivation", "extra"]],
)
def test_ticket_unknown_fields(path: list[str]) -> None:
    bad_ticket(mutate(path, "x"), "unknown field")


def test_ticket_malformed_json() -> None:
    bad_ticket("", "malformed")
    bad_ticket("[]", "object")
    bad_ticket(CLAIM_TICKET_JSON + "x", "malformed")
    bad_ticket(CLAIM_TICKET_JSON.replace('"version": 2', '"version": 2, "version": 2'), "duplicate")
    bad_ticket(CLAIM_TICKET_JSON.replace('"payload_length": 11', '"payload_length": NaN'), "NaN")
    bad_ticket(CLAIM_TICKET_JSON.replace('"payload_length": 11', '"payload_length": Infinity'), "Infinity")
    bad_ticket(b"\xff" + CLAIM_TICKET_JSON.encode(), "UTF-8")
    # Surrounding whitespace is fine (serde_json accepts it, so do we).
    assert TransitionTicket.from_json("\n " + CLAIM_TICKET_JSON + "\n") == claim_ticket()


@pytest.mark.parametrize(
    ("destination", "pattern"),
    [
        ({"state": "dead", "terminal_bucket": 1, "reason": 65_536}, "reason"),
        ({"state": "dead", "terminal_bucket": 1}, "missing field 'reason'"),
        ({"state": "receipt", "terminal_bucket": 1, "reason": 1}, "unknown field 'reason'"),
        ({"state": "delayed", "not_before_ns": -1}, "not_before_ns"),
        ({"state": "ready", "not_before_ns": 1}, "unknown field"),
    ],
)
def test_ticket_destination_shapes(destination: dict[str, Any], pattern: str) -> None:
    doc = json.loads(CLAIM_TICKET_JSON)
    doc["operation"] = {"dead": "bury", "receipt": "acknowledge", "delayed": "retry_later", "ready": "retry_now"}[
        destination["state"]
    ]
    doc["source"] = LEASED.to_dict()
    doc["source_identity"]["attempt"] = 1
    doc["destination_derivation"] = destination
    bad_ticket(json.dumps(doc, indent=2), pattern)


def test_ticket_identity_limits() -> None:
    # claim needs attempt + 1 <= maximum; other operations keep the attempt.
    ok = claim_ticket(attempt=2, maximum_attempts=3)
    assert TransitionTicket.from_json(ok.to_json()) == ok
    renew = claim_ticket(operation="renew", source=LEASED, attempt=3, generation=2**64 - 2)
    assert TransitionTicket.from_json(renew.to_json()).destination_identity() == (2**64 - 1, 3)
    bad_ticket(claim_ticket(operation="renew", source=LEASED, attempt=3, generation=2**64 - 1).to_json(), "overflow")
    top = claim_ticket(attempt=2**32 - 1, maximum_attempts=2**32 - 1)
    bad_ticket(top.to_json(), "overflow")
    retry = claim_ticket(operation="retry_now", source=LEASED, destination=ReadyLocation(), attempt=0)
    assert TransitionTicket.from_json(retry.to_json()) == retry  # attempt 0 is <= max


def test_ticket_validate_on_hand_built_values() -> None:
    with pytest.raises(SteadQError, match="queue_id"):
        claim_ticket(queue_id=b"x").validate()
    with pytest.raises(SteadQError, match="boot_id"):
        claim_ticket(destination=LeasedLocation("nope", 0, 0)).validate()
    with pytest.raises(SteadQError, match="reason"):
        claim_ticket(operation="bury", source=LEASED, destination=DeadLocation(1, 70_000), attempt=1).validate()
    claim_ticket().validate()


def test_enqueue_ticket() -> None:
    t = EnqueueTicket(JOB_ID, ENVELOPE, "ready", "ready/000a/x.sqj")
    assert t.state == "ready" and t.path.endswith(".sqj")
    with pytest.raises(AttributeError):
        t.state = "delayed"  # type: ignore[misc]


def test_sha256_helper_matches_hashlib() -> None:
    assert sha256(b"abc") == hashlib.sha256(b"abc").digest()


@pytest.mark.parametrize("minor", [0, 1])
def test_a_built_header_encodes_as_its_fields_do(minor: int) -> None:
    """build_header keeps the encoding it made; it must be what the fields encode to afresh."""
    ext = encode_extension(Extension(content_type="text/plain"))
    header = build_header(job_id=JOB_ID, max_attempts=7, created_at_ns=123, extension=ext, payload_length=5,
                          payload_digest=sha256(b"hello"), minor=minor)  # fmt: skip
    fresh = JobHeader(JOB_ID, 7, 123, len(ext), 5, sha256(b"hello"), header.envelope_digest, minor)
    assert header.encode() == fresh.encode()
    assert JobHeader.decode(header.encode()) == header
    check_envelope(header, header.encode(), ext)
