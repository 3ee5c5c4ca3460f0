"""Every refusal of the format code names the argument it refused, word for word.

The messages are what a caller (and the ``steadq`` command, which prints them)
sees; the mutation run (docs/testing.md, "Mutation testing") showed that no
test pinned which field a message names, so a swapped or mangled field name
went unnoticed. Each row calls one public function with one bad value and
expects the exact message.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from steadqd.backoff import RetryPolicy, delay_ns_from_ms, retry_deadline_ns, retry_delay_ms
from steadqd.constants import (
    DEFAULT_DELAYED_WIDTH_NS,
    DEFAULT_LEASE_WIDTH_NS,
    DEFAULT_TERMINAL_WIDTH_NS,
    JOB_EXT,
    U16_MAX,
    U32_MAX,
    U64_MAX,
    DeadReason,
    State,
)
from steadqd.errors import CorruptObject, InvalidInput, QueueCorrupt, StateExhausted, SteadQError
from steadqd.fs import names, scan_order
from steadqd.fs.cbor import Extension, decode_extension
from steadqd.fs.json_records import TransitionTicket, reset_cursor_json, validate_cursor
from steadqd.fs.records import (
    CompactReceipt,
    FormatRecord,
    JobHeader,
    Watermark,
    build_header,
    envelope_digest,
    validate_queue_config,
)
from tests.spec_vectors import CLAIM_TICKET_JSON

ID = bytes(16)
SHORT = b"\x01" * 15
POLICY = RetryPolicy(base_ms=100, cap_ms=1000, use_jitter=False)


def u64(what: str, value: object) -> str:
    return f"{what} must be an integer in 0..{U64_MAX}, got {value!r}"


def width(what: str, value: object) -> str:
    return f"{what} must be an integer in 1..{U64_MAX}, got {value!r}"


def id16(what: str, value: object, length: int = 16) -> str:
    return f"{what} must be {length} bytes, got {value!r}"


def receipt(**fields: Any) -> CompactReceipt:
    base: dict[str, Any] = {
        "job_id": ID,
        "envelope_digest": bytes(32),
        "final_attempt": 1,
        "lease_token": ID,
        "bucket_start_ns": 0,
        "payload_length": 0,
    }
    return CompactReceipt(**{**base, **fields})


def header(**fields: Any) -> JobHeader:
    base: dict[str, Any] = {
        "job_id": ID,
        "max_attempts": 1,
        "created_at_ns": 0,
        "extension_length": 0,
        "payload_length": 0,
        "payload_digest": bytes(32),
        "envelope_digest": bytes(32),
    }
    return JobHeader(**{**base, **fields})


def format_record(**fields: Any) -> FormatRecord:
    base: dict[str, Any] = {
        "queue_id": ID,
        "created_at_ns": 0,
        "shard_count": 4,
        "lease_width_ns": DEFAULT_LEASE_WIDTH_NS,
        "delayed_width_ns": DEFAULT_DELAYED_WIDTH_NS,
        "terminal_width_ns": DEFAULT_TERMINAL_WIDTH_NS,
        "max_payload_length": 1 << 20,
    }
    return FormatRecord(**{**base, **fields})


def patched(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new) :]


def flipped_last(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


READY_NAME = names.make_filename(ID, names.ready_name(ID, 0, 0, 1), shard=0, lease_width_ns=1)
BAD_TAG = READY_NAME[: -len(JOB_EXT) - 17] + "x" + READY_NAME[-len(JOB_EXT) - 16 :]


def grammar(name: object, why: str) -> str:
    return f"ready name {name!r} does not match the grammar: {why}"


def cbor(why: str) -> str:
    return f"extension CBOR: {why}"


CASES: list[tuple[str, Callable[[], object], type[SteadQError], str]] = [
    # backoff
    ("policy base_ms", lambda: RetryPolicy(base_ms=-1, cap_ms=1), InvalidInput, u64("base_ms", -1)),
    ("policy cap_ms", lambda: RetryPolicy(base_ms=1, cap_ms="1"), InvalidInput, u64("cap_ms", "1")),
    (
        "policy max_delay_ms",
        lambda: RetryPolicy(base_ms=1, cap_ms=1, max_delay_ms=1 << 64),
        InvalidInput,
        u64("max_delay_ms", 1 << 64),
    ),
    (
        "policy use_jitter",
        lambda: RetryPolicy(base_ms=1, cap_ms=1, use_jitter=1),  # type: ignore[arg-type]
        InvalidInput,
        "use_jitter must be a bool, got 1",
    ),
    ("policy base 0", lambda: RetryPolicy(base_ms=0, cap_ms=1), InvalidInput, "retry policy base_ms must be > 0"),
    (
        "policy cap below base",
        lambda: RetryPolicy(base_ms=10, cap_ms=20, max_delay_ms=5),
        InvalidInput,
        "retry policy cap (5 ms, min of cap_ms and max_delay_ms) must be >= base_ms (10 ms)",
    ),
    ("delay policy", lambda: retry_delay_ms(None, ID, ID, 1), InvalidInput, "policy must be a RetryPolicy, got None"),  # type: ignore[arg-type]
    ("delay queue_id", lambda: retry_delay_ms(POLICY, SHORT, ID, 1), InvalidInput, id16("queue_id", SHORT)),
    ("delay job_id", lambda: retry_delay_ms(POLICY, ID, SHORT, 1), InvalidInput, id16("job_id", SHORT)),
    (
        "delay attempt bool",
        lambda: retry_delay_ms(POLICY, ID, ID, True),
        InvalidInput,
        f"attempt must be an integer in 0..{U32_MAX}, got True",
    ),
    ("delay_ms", lambda: delay_ns_from_ms(-5), InvalidInput, u64("delay_ms", -5)),
    (
        "delay_ms overflow",
        lambda: delay_ns_from_ms(U64_MAX),
        InvalidInput,
        f"retry delay {U64_MAX} ms overflows u64 nanoseconds",
    ),
    ("deadline wall_floor_ns", lambda: retry_deadline_ns(-1, 0), InvalidInput, u64("wall_floor_ns", -1)),
    ("deadline delay_ns", lambda: retry_deadline_ns(0, -1), InvalidInput, u64("delay_ns", -1)),
    (
        "deadline past 2^63-1",
        lambda: retry_deadline_ns(1 << 63, 1),
        InvalidInput,
        f"retry deadline {(1 << 63) + 1} ns exceeds 2^63-1",
    ),
    # names: shards, buckets, scan order, temp names
    (
        "shard_count",
        lambda: names.shard_of(ID, ID, 3),
        InvalidInput,
        "shard_count must be a power of two in 1..4096, got 3",
    ),
    ("shard_of queue_id", lambda: names.shard_of(SHORT, ID, 4), InvalidInput, id16("queue_id", SHORT)),
    ("shard_of job_id", lambda: names.shard_of(ID, SHORT, 4), InvalidInput, id16("job_id", SHORT)),
    (
        "shard_of bytearray queue_id",
        lambda: names.shard_of(bytearray(15), ID, 4),
        InvalidInput,
        id16("queue_id", bytearray(15)),
    ),
    ("shard_dir", lambda: names.shard_dir(0x10000), InvalidInput, "shard must be an integer in 0..65535, got 65536"),
    ("bucket_dir", lambda: names.bucket_dir(-1), InvalidInput, u64("bucket", -1)),
    ("lease_bucket deadline", lambda: names.lease_bucket(-1, 1), InvalidInput, u64("boottime_deadline", -1)),
    ("lease_bucket width", lambda: names.lease_bucket(0, 0), InvalidInput, width("lease width", 0)),
    ("delayed_bucket not_before", lambda: names.delayed_bucket(-1, 1), InvalidInput, u64("not_before", -1)),
    ("delayed_bucket width", lambda: names.delayed_bucket(0, 0), InvalidInput, width("delayed width", 0)),
    ("terminal_bucket wall", lambda: names.terminal_bucket(-1, 1), InvalidInput, u64("wall_ns", -1)),
    ("terminal_bucket width", lambda: names.terminal_bucket(0, 0), InvalidInput, width("terminal width", 0)),
    ("watermark_bucket wall", lambda: names.watermark_bucket(-1, 1), InvalidInput, u64("wall_ns", -1)),
    ("watermark_bucket width", lambda: names.watermark_bucket(0, 0), InvalidInput, width("delayed width", 0)),
    ("width bool", lambda: names.terminal_bucket(0, True), InvalidInput, width("terminal width", True)),
    ("width u64 max + 1", lambda: names.terminal_bucket(0, 1 << 64), InvalidInput, width("terminal width", 1 << 64)),
    ("bucket_start bucket", lambda: names.bucket_start(-1, 1), InvalidInput, u64("bucket", -1)),
    ("bucket_start width", lambda: names.bucket_start(0, 0), InvalidInput, width("width", 0)),
    (
        "bucket_start overflow",
        lambda: names.bucket_start(1 << 32, 1 << 32),
        StateExhausted,
        f"bucket {1 << 32} × width {1 << 32} overflows u64",
    ),
    (
        "bucket_end overflow",
        lambda: names.bucket_end(U64_MAX, 1),
        StateExhausted,
        f"end of bucket {U64_MAX} (width 1) overflows u64",
    ),
    ("next_scan_round", lambda: scan_order.next_scan_round(-1), InvalidInput, u64("scan_round", -1)),
    ("scan queue_id", lambda: scan_order.scan_params(SHORT, ID, ID, 0, 4), InvalidInput, id16("queue_id", SHORT)),
    ("scan boot id", lambda: scan_order.scan_params(ID, SHORT, ID, 0, 4), InvalidInput, id16("boot id", SHORT)),
    ("scan nonce", lambda: scan_order.scan_params(ID, ID, SHORT, 0, 4), InvalidInput, id16("worker nonce", SHORT)),
    ("scan round", lambda: scan_order.scan_params(ID, ID, ID, 1 << 64, 4), InvalidInput, u64("scan_round", 1 << 64)),
    (
        "scan start_hint",
        lambda: list(scan_order.scan_order(ID, ID, ID, 0, 4, start_hint=4)),
        InvalidInput,
        "start_hint must be an integer in 0..3, got 4",
    ),
    ("compute_tag queue_id", lambda: names.compute_tag(SHORT, "x"), InvalidInput, id16("queue_id", SHORT)),
    ("compute_tag context", lambda: names.compute_tag(ID, "é"), InvalidInput, "tag context 'é' is not ASCII"),
    (
        "tag_context bucket",
        lambda: names.tag_context(names.dead_name(ID, 0, 0, 1, reason=1), shard=0, bucket=None, lease_width_ns=1),
        InvalidInput,
        "a dead tag context needs the directory bucket",
    ),
    (
        "compact temp",
        lambda: names.make_compact_temp_name(SHORT),
        InvalidInput,
        id16("compact random", SHORT),
    ),
    ("next_generation", lambda: names.next_generation(-1), InvalidInput, u64("generation", -1)),
    (
        "next_attempt",
        lambda: names.next_attempt(-1),
        InvalidInput,
        f"attempt must be an integer in 0..{U32_MAX}, got -1",
    ),
    # names: identities and the names built from them
    ("JobName generation", lambda: names.JobName(State.READY, ID, -1, 0, 1), InvalidInput, u64("generation", -1)),
    (
        "JobName max_attempts",
        lambda: names.JobName(State.READY, ID, 0, 0, -1),
        InvalidInput,
        f"max_attempts must be an integer in 0..{U32_MAX}, got -1",
    ),
    ("JobName tag", lambda: names.JobName(State.READY, ID, 0, 0, 1, tag=b"x"), InvalidInput, id16("tag", b"x", 8)),
    (
        "JobName field of another state",
        lambda: names.JobName(State.READY, ID, 0, 0, 1, not_before=5),
        InvalidInput,
        "ready name has no not_before (got 5)",
    ),
    ("ready_name job_id", lambda: names.ready_name(SHORT, 0, 0, 1), InvalidInput, id16("job_id", SHORT)),
    ("job_hex", lambda: names.job_hex(SHORT), InvalidInput, id16("job_id", SHORT)),
    ("temp name", lambda: names.make_temp_name(0, SHORT), InvalidInput, id16("temp random", SHORT)),
    ("quarantine name", lambda: names.make_quarantine_name(SHORT, 1), InvalidInput, id16("quarantine id", SHORT)),
    (
        "boot_raw",
        lambda: names.boot_raw("nope"),
        InvalidInput,
        "invalid boot id 'nope': expected canonical 8-4-4-4-12 lowercase hex",
    ),
    (
        "next_attempt at u32 max",
        lambda: names.next_attempt(U32_MAX),
        StateExhausted,
        f"attempt {U32_MAX} cannot be incremented (u32 overflow)",
    ),
    (
        "next_generation at u64 max",
        lambda: names.next_generation(U64_MAX),
        StateExhausted,
        f"generation {U64_MAX} cannot be incremented (u64 overflow)",
    ),
    # names: parsing
    (
        "parse non-ASCII",
        lambda: names.parse_name(State.READY, "é"),
        CorruptObject,
        grammar("é", "not ASCII, or contains NUL"),
    ),
    (
        "parse extension",
        lambda: names.parse_name(State.READY, READY_NAME[: -len(JOB_EXT)] + ".tmp"),
        CorruptObject,
        grammar(READY_NAME[: -len(JOB_EXT)] + ".tmp", f"extension is not {JOB_EXT}"),
    ),
    (
        "parse tag",
        lambda: names.parse_name(State.READY, BAD_TAG),
        CorruptObject,
        grammar(BAD_TAG, f"component {BAD_TAG.split('.')[-2]!r} is not 'k' + 16 lowercase hex digits"),
    ),
    # records: every encoder names its field
    (
        "header extension_length",
        lambda: header(extension_length=-1).encode(),
        InvalidInput,
        "extension_length: must be an integer in 0..65536, got -1",
    ),
    (
        "header envelope_digest",
        lambda: header(envelope_digest=b"").encode(),
        InvalidInput,
        "envelope_digest: must be 32 bytes",
    ),
    (
        "envelope_digest header size",
        lambda: envelope_digest(bytes(127), b""),
        InvalidInput,
        "envelope_digest: header must be 128 bytes, got 127",
    ),
    (
        "build_header extension",
        lambda: build_header(
            job_id=ID,
            max_attempts=1,
            created_at_ns=0,
            extension=bytes(65_537),
            payload_length=0,
            payload_digest=bytes(32),
        ),
        InvalidInput,
        "extension: 65537 bytes, limit 65536",
    ),
    ("receipt job_id", lambda: receipt(job_id=SHORT).encode(), InvalidInput, "job_id: must be 16 bytes"),
    (
        "receipt envelope_digest",
        lambda: receipt(envelope_digest=SHORT).encode(),
        InvalidInput,
        "envelope_digest: must be 32 bytes",
    ),
    (
        "receipt final_attempt",
        lambda: receipt(final_attempt=-1).encode(),
        InvalidInput,
        f"final_attempt: must be an integer in 0..{U32_MAX}, got -1",
    ),
    ("receipt lease_token", lambda: receipt(lease_token=SHORT).encode(), InvalidInput, "lease_token: must be 16 bytes"),
    (
        "receipt bucket_start_ns",
        lambda: receipt(bucket_start_ns=-1).encode(),
        InvalidInput,
        f"bucket_start_ns: must be an integer in 0..{U64_MAX}, got -1",
    ),
    (
        "receipt payload_length",
        lambda: receipt(payload_length=-1).encode(),
        InvalidInput,
        f"payload_length: must be an integer in 0..{U64_MAX}, got -1",
    ),
    (
        "receipt minor",
        lambda: receipt(minor=-1).encode(),
        InvalidInput,
        f"minor: must be an integer in 0..{U16_MAX}, got -1",
    ),
    (
        "watermark bucket",
        lambda: Watermark(-1, 0).encode(),
        InvalidInput,
        f"bucket: must be an integer in 0..{U64_MAX}, got -1",
    ),
    (
        "watermark sequence",
        lambda: Watermark(0, -1).encode(),
        InvalidInput,
        f"sequence: must be an integer in 0..{U64_MAX}, got -1",
    ),
    (
        "watermark minor",
        lambda: Watermark(0, 0, -1).encode(),
        InvalidInput,
        f"minor: must be an integer in 0..{U16_MAX}, got -1",
    ),
    (
        "watermark digest",
        lambda: Watermark.decode(flipped_last(Watermark(1, 1).encode())),
        QueueCorrupt,
        "wall watermark: digest mismatch",
    ),
    (
        "FORMAT created_at_ns",
        lambda: format_record(created_at_ns=-1).encode(),
        InvalidInput,
        f"created_at_ns: must be an integer in 0..{U64_MAX}, got -1",
    ),
    (
        "FORMAT magic",
        lambda: FormatRecord.decode(b"X" + format_record().encode()[1:]),
        QueueCorrupt,
        "FORMAT: bad magic",
    ),
    (
        "receipt retention",
        lambda: validate_queue_config(
            4,
            DEFAULT_LEASE_WIDTH_NS,
            DEFAULT_DELAYED_WIDTH_NS,
            DEFAULT_TERMINAL_WIDTH_NS,
            1 << 20,
            receipt_retention_ns=-1,
        ),
        InvalidInput,
        "receipt_retention_ns: must be a u64, got -1",
    ),
    (
        "header reserved",
        lambda: JobHeader.decode(patched(header().encode(), 29, b"\x01")),
        CorruptObject,
        "job header: nonzero reserved bytes",
    ),
    (
        "header max_attempts 0",
        lambda: JobHeader.decode(patched(header().encode(), 48, bytes(4))),
        CorruptObject,
        "job header: maximum_attempts is 0",
    ),
    # the extension's CBOR, decoded
    (
        "cbor top level",
        lambda: decode_extension(b"\x01"),
        CorruptObject,
        cbor("top level: expected a map, got major type 0"),
    ),
    (
        "cbor top-level map length",
        lambda: decode_extension(b"\xa5\x00"),
        CorruptObject,
        cbor("top level: declared map length 5 exceeds half of the 1 remaining bytes"),
    ),
    (
        "cbor content_type text",
        lambda: decode_extension(b"\xa1\x02\x62\xff\xfe"),
        CorruptObject,
        cbor("content_type: text is not valid UTF-8"),
    ),
    (
        "cbor trace_context",
        lambda: decode_extension(b"\xa2\x02\x61x\x05\x43a"),
        CorruptObject,
        cbor("trace_context: declares 3 bytes but only 1 remain"),
    ),
    (
        "cbor metadata map length",
        lambda: decode_extension(b"\xa2\x02\x61x\x03\xa5\x00"),
        CorruptObject,
        cbor("metadata: declared map length 5 exceeds half of the 1 remaining bytes"),
    ),
    (
        "cbor metadata key",
        lambda: decode_extension(b"\xa2\x02\x61x\x03\xa1\x65\x61"),
        CorruptObject,
        cbor("metadata key: declares 5 bytes but only 1 remain"),
    ),
    (
        "cbor metadata value text",
        lambda: decode_extension(b"\xa2\x02\x61x\x03\xa1\x61k\x62\xff\xfe"),
        CorruptObject,
        cbor("metadata value for 'k': text is not valid UTF-8"),
    ),
    (
        "Extension metadata",
        lambda: Extension(content_type="x", metadata=[1]),  # type: ignore[arg-type]
        InvalidInput,
        "metadata: must be a mapping of text keys to values",
    ),
]


@pytest.mark.parametrize(("call", "error", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_message_names_what_was_refused(call: Callable[[], object], error: type[SteadQError], message: str) -> None:
    with pytest.raises(error) as info:
        call()
    assert type(info.value) is error
    assert info.value.message == message


def _sealed_receipt(mangle: Callable[[bytearray], None]) -> bytes:
    data = bytearray(receipt().encode())
    mangle(data)
    return bytes(data)


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda d: d.__setitem__(0, 0), "compact receipt: bad magic"),
        (
            lambda d: d.__setitem__(slice(10, 12), b"\0\0"),
            "compact receipt: minor version 0 (legacy unverified record)",
        ),
        (lambda d: d.__setitem__(-1, d[-1] ^ 1), "compact receipt: digest mismatch"),
    ],
    ids=["magic", "minor 0", "digest"],
)
def test_a_corrupt_compact_receipt_says_what_is_wrong(mangle: Callable[[bytearray], None], message: str) -> None:
    with pytest.raises(SteadQError) as info:
        CompactReceipt.decode(_sealed_receipt(mangle))
    assert info.value.message == message


def test_a_quarantine_name_keeps_all_four_digits_of_its_reason() -> None:
    name = names.make_quarantine_name(ID, 0x1234)
    assert names.parse_quarantine_name(name) == (ID, 0x1234)


def test_a_dead_reason_is_stored_as_a_plain_int() -> None:
    """An IntEnum reason would change the name's repr and equality with parsed names."""
    name = names.dead_name(ID, 0, 0, 1, reason=DeadReason.ATTEMPTS_EXHAUSTED)
    assert type(name.reason) is int and name.reason == 4


def cursor_with(**top: Any) -> bytes:
    doc = json.loads(reset_cursor_json(ID))
    doc.update(top)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[]", "cursor file: expected an object"),
        (cursor_with(queue_id="00" * 15), "queue_id: expected 32 lowercase hex digits"),
        (cursor_with(queue_id="11" * 16), "queue_id does not match the queue"),
        (cursor_with(cursor={"phase": "nap"}), "cursor.phase: unknown phase 'nap'"),
        (
            cursor_with(cursor={"phase": "reap_leases", "hierarchy_retries": [5]}),
            "cursor.hierarchy_retries[0]: expected an object",
        ),
    ],
    ids=["not an object", "queue_id hex", "queue_id mismatch", "phase", "hierarchy entry"],
)
def test_a_bad_recovery_cursor_says_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(QueueCorrupt) as info:
        validate_cursor(data, ID)
    assert info.value.message == f"recovery cursor: {message}"


def test_a_valid_cursor_comes_back_whole() -> None:
    doc = validate_cursor(reset_cursor_json(ID), ID)
    assert (doc["schema"], doc["version"], doc["queue_id"]) == ("steadq-recovery-cursor", 1, ID.hex())
    assert doc["cursor"]["phase"] == "reap_leases"


def test_reset_cursor_names_a_bad_queue_id() -> None:
    with pytest.raises(InvalidInput) as info:
        reset_cursor_json(SHORT)
    assert info.value.message == "queue_id: must be 16 bytes"


def test_a_ticket_that_is_not_an_object() -> None:
    with pytest.raises(SteadQError) as info:
        TransitionTicket.from_json("[]")
    assert info.value.message == "invalid transition ticket: ticket: expected an object"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"job_id": SHORT}, "job_id: must be 16 bytes"),
        ({"operation": "steal"}, "unknown operation 'steal'"),
        ({"attempt": -1}, f"attempt: must be an integer in 0..{U32_MAX}"),
    ],
    ids=["job_id", "operation", "attempt"],
)
def test_a_ticket_read_back_names_its_bad_field(change: dict[str, Any], message: str) -> None:
    ticket = dataclasses.replace(TransitionTicket.from_json(CLAIM_TICKET_JSON), **change)
    with pytest.raises(SteadQError) as info:
        ticket.validate()
    assert info.value.message == f"invalid transition ticket: {message}"


@pytest.mark.parametrize(
    ("destination", "message"),
    [
        (5, "destination_derivation: expected an object"),
        (
            {"state": "receipt", "terminal_bucket": -1},
            f"destination_derivation.terminal_bucket: expected an integer in 0..{U64_MAX}",
        ),
    ],
    ids=["not an object", "receipt bucket"],
)
def test_a_ticket_names_its_bad_destination(destination: object, message: str) -> None:
    doc = json.loads(CLAIM_TICKET_JSON)
    doc["destination_derivation"] = destination
    with pytest.raises(SteadQError) as info:
        TransitionTicket.from_json(json.dumps(doc))
    assert info.value.message == f"invalid transition ticket: {message}"
