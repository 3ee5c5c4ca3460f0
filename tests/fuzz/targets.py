"""The parser contracts checked by both the hypothesis tests and the atheris harnesses.

Each ``check_*`` function feeds one input to one parser and asserts the
contract from issue 10: the parser returns a value or raises its documented
error type, never anything else (IndexError, TypeError, RecursionError,
UnicodeDecodeError, struct.error...), and a decoded value re-encodes to the
same bytes where an encoder exists (canonical forms: two encodings of one
value must never both be accepted, since names and records are hashed or
compared bytewise). An undocumented exception simply propagates, which is
what both hypothesis and atheris report as a failure/crash.

``FAMILIES`` groups the checks the way the atheris harnesses do (one harness
per family, the first input byte picks the parser) and ``seeds()`` yields the
valid vectors the committed corpus is built from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

from steadqd.daemon.config import parse_config
from steadqd.durations import parse_duration
from steadqd.errors import ConfigError, CorruptObject, InvalidInput, QueueCorrupt, SteadQError, UnsupportedFormat
from steadqd.fs import names
from steadqd.fs.cbor import Extension, decode_extension, encode_extension
from steadqd.fs.json_records import TransitionTicket, reset_cursor_json, validate_cursor
from steadqd.fs.lease import Lease
from steadqd.fs.records import CompactReceipt, FormatRecord, JobHeader, Watermark
from tests.spec_vectors import CLAIM_TICKET_JSON as _TICKET_SEED

QUEUE_ID = bytes(range(16))


def _text(data: bytes) -> str:
    """Bytes -> str keeping every byte (undecodable ones become lone surrogates)."""
    return data.decode("utf-8", "surrogateescape")


# --------------------------------------------------------------------------- names


def check_parse_name(data: bytes) -> None:
    """Every state's grammar, as bytes and as text; an accepted name re-formats identically."""
    for form in (data, _text(data)):
        for state in names.State:
            try:
                jn = names.parse_name(state, form)
            except CorruptObject:
                continue
            text = form.decode("ascii") if isinstance(form, bytes) else form
            assert names.format_name(jn, jn.tag) == text, (state, form)
        try:
            jn = names.parse_ready_dir_entry(form)
        except CorruptObject:
            continue
        assert jn.state in (names.State.READY, names.State.LEASED)


def check_small_names(data: bytes) -> None:
    """Temp, quarantine, job id and boot id names: canonical or refused, never a crash."""
    for form in (data, _text(data)):
        text = form.decode("ascii") if isinstance(form, bytes) and form.isascii() else None
        parsed = names.parse_temp_name(form)
        if parsed is not None:
            assert names.make_temp_name(*parsed) == (text if isinstance(form, bytes) else form)
        q = names.parse_quarantine_name(form)
        if q is not None:
            assert names.make_quarantine_name(*q) == (text if isinstance(form, bytes) else form)
        names.is_compact_temp_name(form)
    s = _text(data)
    try:
        assert names.job_hex(names.parse_job_id(s)) == s
    except InvalidInput:
        pass
    for form in (data, s):
        try:
            raw = names.boot_raw(form)
        except InvalidInput:
            continue
        assert names.boot_dashed(raw) == (form.decode("ascii") if isinstance(form, bytes) else form)


# --------------------------------------------------------------------------- binary records


def check_format_record(data: bytes) -> None:
    try:
        rec = FormatRecord.decode(data)
    except (QueueCorrupt, UnsupportedFormat):
        return
    assert rec.encode() == data


def check_job_header(data: bytes) -> None:
    try:
        hdr = JobHeader.decode(data)
    except CorruptObject:
        return
    assert hdr.encode() == data


def check_compact_receipt(data: bytes) -> None:
    try:
        rec = CompactReceipt.decode(data)
    except CorruptObject:
        return
    assert rec.encode() == data


def check_watermark(data: bytes) -> None:
    try:
        wm = Watermark.decode(data)
    except QueueCorrupt:
        return
    assert wm.encode() == data


def check_extension(data: bytes) -> None:
    try:
        ext = decode_extension(data)
    except CorruptObject:
        return
    encoded = encode_extension(ext)
    if encoded != data:
        assert ext.metadata is None and encoded == _without_empty_metadata(data, encoded), data.hex()


def _without_empty_metadata(data: bytes, encoded: bytes) -> bytes | None:
    """``data`` less one top-level ``03 a0`` entry (metadata: an empty map), if that gives ``encoded``.

    The one accepted second encoding (records.md: the reference accepts a present-but-empty metadata
    map on decode although it never writes one; so does steadqd, so that a job both read the same
    way): it means no metadata, which encodes without key 3. Any other difference fails the check.
    """
    if not data or not 0xA1 <= data[0] <= 0xA5:  # a top-level map of 1..5 entries (keys 1..5)
        return None
    at = data.find(b"\x03\xa0", 1)
    while at != -1:
        candidate = bytes([data[0] - 1]) + data[1:at] + data[at + 2 :]
        if candidate == encoded:
            return candidate
        at = data.find(b"\x03\xa0", at + 1)
    return None


# --------------------------------------------------------------------------- JSON documents


def check_cursor(data: bytes) -> None:
    try:
        doc = validate_cursor(data, QUEUE_ID)
    except QueueCorrupt:
        return
    assert isinstance(doc, dict)


def check_ticket(data: bytes) -> None:
    """Bytes and text forms; an accepted ticket survives its own serialisation unchanged."""
    for form in (data, _text(data)):
        try:
            ticket = TransitionTicket.from_json(form)
        except SteadQError as exc:
            assert type(exc) is SteadQError, type(exc)
            continue
        again = TransitionTicket.from_json(ticket.to_json())
        assert again.to_json() == ticket.to_json()
        assert again == ticket


_HANDLE_FIELDS = (
    "queue_id", "job_id", "generation", "attempt", "maximum_attempts", "token", "boot_id",
    "expires_boottime_ns", "expires_wall_ns", "expected_dev", "expected_inode", "exact_source_path",
    "envelope_digest", "content_type", "payload_length", "payload_digest",
)  # fmt: skip


def check_handle(data: bytes) -> None:
    """A handle is accepted only if re-serialising it reproduces every field it was read from."""
    text = _text(data)
    try:
        lease, queue_id = Lease.from_handle(text)
    except InvalidInput:
        return
    out = json.loads(lease.to_handle("/q"))
    src = json.loads(text)
    for key in _HANDLE_FIELDS:
        if key == "queue_id" and queue_id is None:
            continue
        assert out[key] == src[key], (key, src[key], out[key])
    if queue_id is not None:
        again, qid = Lease.from_handle(lease.to_handle("/q"))
        assert again.to_handle("/q") == lease.to_handle("/q") and qid == queue_id


# --------------------------------------------------------------------------- text formats


def check_config(data: bytes) -> None:
    try:
        settings = parse_config(_text(data), path="fuzz.yaml", name="fuzz")
    except ConfigError:
        return
    assert settings.queue.startswith("/")


def check_duration(data: bytes) -> None:
    try:
        seconds = parse_duration(_text(data))
    except ValueError:
        return
    assert seconds >= 0 and seconds != float("inf")


Check = Callable[[bytes], None]

FAMILIES: dict[str, tuple[Check, ...]] = {
    "names": (check_parse_name, check_small_names),
    "records": (check_format_record, check_job_header, check_compact_receipt, check_watermark),
    "cbor": (check_extension,),
    "json": (check_handle, check_ticket, check_cursor),
    "config": (check_config, check_duration),
}


def dispatch(family: str, data: bytes) -> None:
    """atheris entry: byte 0 picks the parser of the family, the rest is its input."""
    checks = FAMILIES[family]
    if not data:
        return
    checks[data[0] % len(checks)](data[1:])


# --------------------------------------------------------------------------- seeds


def _job_name_seeds() -> list[str]:
    job = bytes.fromhex("f0e1d2c3b4a5968778695a4b3c2d1e0f")
    boot = names.boot_raw("12345678-1234-1234-1234-123456789abc")
    tok = bytes.fromhex("00112233445566778899aabbccddeeff")
    tag = bytes.fromhex("02d0612ad4b6cfc9")
    made = [
        names.ready_name(job, 0, 0, 3),
        names.leased_name(job, 1, 1, 3, boot_id=boot, boottime_deadline=1030000000000, wall_deadline=1700000035000000000, lease_token=tok),
        names.delayed_name(job, 2, 1, 3, not_before=0x17979D157EA0E801),
        names.dead_name(job, 2, 1, 3, reason=1),
        names.receipt_name(job, 3, 1, 3, lease_token=tok),
    ]  # fmt: skip
    return [names.format_name(n, tag) for n in made]


def seeds() -> Iterator[tuple[str, int, bytes]]:
    """(family, parser index, valid input) for every parser: the corpus and the mutation base."""
    for name in _job_name_seeds():
        yield "names", 0, name.encode()
    yield "names", 1, names.make_temp_name(1_000_000_000_000, bytes(range(16))).encode()
    yield "names", 1, names.make_quarantine_name(bytes.fromhex("ffeeddccbbaa99887766554433221100"), 2).encode()
    yield "names", 1, b"12345678-1234-1234-1234-123456789abc"
    yield "names", 1, b"f0e1d2c3b4a5968778695a4b3c2d1e0f"

    fmt = FormatRecord(QUEUE_ID, 1_700_000_000_000_000_000, 64, 10**9, 10**9, 3600 * 10**9, 1 << 30)
    yield "records", 0, fmt.encode()
    digest = bytes(range(32))
    yield "records", 1, JobHeader(bytes(range(16)), 3, 1_700_000_000_000_000_000, 12, 11, digest, digest).encode()
    yield "records", 2, CompactReceipt(bytes(range(16)), digest, 1, bytes(16), 1_700_000_000_000_000_000, 11).encode()
    yield "records", 3, Watermark(1_700_000, 7).encode()

    for hexed in (
        "a1026a746578742f706c61696e",
        "a2011b179a18a8e3e40000026178",
        "a202617803a264646f6e65f466616374697665f5",
        "a5011b17979d157ea0e801026a746578742f706c61696e03a4616e2464626c6f6242010265636f756e7419012c"
        "656f776e6572667465616d2d61046270310542aabb",
    ):
        yield "cbor", 0, bytes.fromhex(hexed)
    yield "cbor", 0, encode_extension(Extension("application/json", metadata={"k": "v", "i": -(2**63)}))

    yield "json", 0, _HANDLE_SEED.encode()
    yield "json", 1, _TICKET_SEED.encode()
    yield "json", 2, reset_cursor_json(QUEUE_ID)
    yield "json", 2, reset_cursor_json(QUEUE_ID, "cleanup_temp")

    yield "config", 0, _CONFIG_SEED.encode()
    for d in ("90s", "1d12h", "250ms", "1.5h", "30"):
        yield "config", 1, d.encode()


_HANDLE_SEED = json.dumps(
    {
        "queue_root": "/path/as/given",
        "queue_id": "000102030405060708090a0b0c0d0e0f",
        "job_id": "f0e1d2c3b4a5968778695a4b3c2d1e0f",
        "generation": 1,
        "attempt": 1,
        "maximum_attempts": 3,
        "token": "00112233445566778899aabbccddeeff",
        "boot_id": "12345678-1234-1234-1234-123456789abc",
        "expires_boottime_ns": 1030000000000,
        "expires_wall_ns": 1700000035000000000,
        "expected_dev": 2049,
        "expected_inode": 131077,
        "exact_source_path": "ready/000a/f0e1d2c3b4a5968778695a4b3c2d1e0f.g0000000000000001.a00000001.m00000003"
        ".o12345678123412341234123456789abc.b000000efd0c8bc00.w17979d065c539e00.t00112233445566778899aabbccddeeff"
        ".keafd49285a49db42.sqj",
        "envelope_digest": "3824863bf5184c54b02246d36bef0f2513d421261636643097038039cfe497b7",
        "content_type": "text/plain",
        "payload_length": 11,
        "payload_digest": "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9",
    },
    indent=2,
)

# The shipped example exercises every section of the schema.
_CONFIG_SEED = (Path(__file__).resolve().parents[2] / "etc/steadq/queues/example.yaml").read_text(encoding="utf-8")
