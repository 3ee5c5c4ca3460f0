"""vectors/records.json replayed through steadqd.s3.records: every record encodes byte for byte and decodes back.

Each of the 110 records is built from its ``fields``, encoded under its queue
id and key tag, and compared with the reference's bytes, digest and object
checksum; the bytes decode to the same record. The file's tables (wire order,
field schema), payload-digest cases, FORMAT checks and derivations are
checked against the module's own tables, so a schema drift fails here.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import re
from typing import Any

import pytest

from steadqd import cbor
from steadqd.constants import QuarantineReason as SteadQReason
from steadqd.errors import CorruptRecord, InvalidInput
from steadqd.s3 import keys, records, verify
from steadqd.s3.records import (
    ClaimBasis,
    ClaimRecord,
    FormatRecord,
    JobRecord,
    QuarantineRecord,
    ReceiptRecord,
    RecordType,
    decode_record,
    encode_record,
)
from steadqd.s3.retry import RetryPolicy, nack_deadline
from tests.stowq.vectors import cases, load, record_from_fields

QUEUE = bytes(range(16))
TAG = bytes([7] * 8)


def _records() -> list[dict[str, Any]]:
    return cases("records", "records")


def test_every_record_encodes_byte_for_byte_and_decodes_to_itself() -> None:
    bad = []
    for case in _records():
        queue_id, tag = bytes.fromhex(case["queue_id"]), bytes.fromhex(case["key_tag"])
        record = record_from_fields(case["record_type"], case["fields"])
        encoding = bytes.fromhex(case["encoding"])
        if encode_record(record, queue_id, tag) != encoding:
            bad.append((case["name"], "encoding"))
        elif decode_record(encoding, queue_id, tag) != record:
            bad.append((case["name"], "decoding"))
    assert not bad
    by_type = collections.Counter(case["type_name"] for case in _records())
    assert by_type == load("records")["counts"]["by_type"]


def test_every_record_has_its_digest_checksum_and_key_tag() -> None:
    for case in _records():
        encoding = bytes.fromhex(case["encoding"])
        rt = RecordType(case["record_type"])
        assert rt.label == case["type_name"]
        assert records.digest_domain(rt) == case["digest_domain"].encode()
        assert len(encoding) == case["encoding_length"]
        body, head, digest = encoding[:-34], encoding[-34:-32], encoding[-32:]
        assert head == b"\x58\x20" and digest.hex() == case["record_digest"], case["name"]
        assert hashlib.sha256(records.digest_domain(rt) + body).digest() == digest
        object_sha = hashlib.sha256(encoding).digest()
        assert object_sha.hex() == case["object_sha256"]
        assert base64.b64encode(object_sha).decode() == case["object_sha256_base64"]
        if case["key_tag_is_derived_from_key"]:
            assert keys.key_tag(bytes.fromhex(case["queue_id"]), case["key"]).hex() == case["key_tag"], case["name"]


def test_every_record_at_its_own_key_reads_back_with_every_check() -> None:
    at_keys = [case for case in _records() if case["key_tag_is_derived_from_key"]]
    assert len(at_keys) == 85
    for case in at_keys:
        queue_id, encoding = bytes.fromhex(case["queue_id"]), bytes.fromhex(case["encoding"])
        record = record_from_fields(case["record_type"], case["fields"])
        assert verify.read_record(encoding, queue_id, case["key"], required_feature_bits=3) == record
        assert verify.read_record(encoding, queue_id, keys.parse_key(case["key"]), required_feature_bits=3) == record
        if case["type_name"] == "format":
            assert verify.read_format(encoding, queue_id) == record
        else:
            with pytest.raises(CorruptRecord) as info:
                verify.read_format(encoding, queue_id)  # bound to its own key, not to meta/FORMAT
            assert info.value.error_class == "binding"


def test_the_wire_order_of_every_record_is_canonical() -> None:
    for case in _records():
        envelope = cbor.decode(bytes.fromhex(case["encoding"])[:-34])
        assert isinstance(envelope, tuple) and isinstance(envelope[6], cbor.CborMap)
        on_wire = [key for key, _ in envelope[6].pairs]
        assert on_wire == case["field_order_on_wire"], case["name"]
        table = records.wire_order(RecordType(case["record_type"]))
        assert on_wire == [name for name in table if name in on_wire]


def test_the_wire_order_tables_and_field_schemas_are_the_modules() -> None:
    doc = load("records")
    for label, order in doc["wire_order_tables"].items():
        if label == "claim.basis":
            assert records.BASIS_WIRE == tuple(order)
            continue
        assert list(records.wire_order(RecordType[label.upper()])) == order
    for label, schema in doc["field_schema"].items():
        ours = records.SCHEMAS[RecordType[label.upper()]]
        assert ours.optional == set(schema["optional"]), label
        assert set(ours.names) - ours.optional == set(schema["required"]), label
    # Canonical order is shorter keys first, then bytewise: the tables must be sorted that way.
    for rt, schema in records.SCHEMAS.items():
        encoded = [cbor.encode(name) for name in schema.names]
        assert encoded == sorted(encoded), rt


def test_the_published_vectors_of_records_md_are_among_them() -> None:
    published = {case["name"]: case for case in _records() if case["name"].startswith("spec/")}
    assert set(published) == {"spec/job", "spec/claim", "spec/quarantine"}
    job = JobRecord(
        job_id=bytes.fromhex("101112131415161718191a1b1c1d1e1f"),
        maximum_attempts=3,
        content_type="text/plain",
        created_store_time_ns=0,
        payload_digest=hashlib.sha256(b"hello stowq").digest(),
        payload_length=11,
        payload_inline=b"hello stowq",
    )
    assert encode_record(job, QUEUE, TAG).hex() == published["spec/job"]["encoding"]
    claim = ClaimRecord(
        job_id=job.job_id,
        generation=1,
        attempt=1,
        worker_id="w1",
        worker_token=b"\x42" * 16,
        lease_duration_ns=60_000_000_000,
        continuation=False,
        basis=ClaimBasis(0, 0, 0),
    )
    assert encode_record(claim, QUEUE, TAG).hex() == published["spec/claim"]["encoding"]


def test_every_format_vector_opens() -> None:
    formats = [case for case in _records() if case["type_name"] == "format"]
    assert formats and all(case["format_validate_ok"] for case in formats)
    for case in formats:
        record = record_from_fields(1, case["fields"])
        assert verify.validate_format(record) is record


def test_inline_payloads_verify_exactly_when_the_vector_says_so() -> None:
    checked = [case for case in _records() if "payload_check" in case]
    assert len(checked) == 20
    for case in checked:
        job = record_from_fields(2, case["fields"])
        check = case["payload_check"]
        assert hashlib.sha256(job.payload_inline).hexdigest() == check["inline_sha256"]
        if check["matches_payload_digest"] and check["inline_length_matches"]:
            assert verify.verify_payload(job, job.payload_inline) == job.payload_inline
        else:
            with pytest.raises(CorruptRecord) as info:
                verify.verify_payload(job, job.payload_inline)
            assert info.value.payload and info.value.reason == records.QuarantineReason.PAYLOAD_CORRUPT


def _payload(description: str, payload_hex: str | None) -> bytes:
    if payload_hex is not None:
        return bytes.fromhex(payload_hex)
    if m := re.fullmatch(r"(\d+) bytes of 0x([0-9a-f]{2})", description):
        return bytes([int(m.group(2), 16)]) * int(m.group(1))
    if m := re.fullmatch(r"(\d+) bytes counting", description):
        return bytes(i % 256 for i in range(int(m.group(1))))
    raise AssertionError(f"payload description {description!r} is not one this test knows")


def test_payload_digest_and_the_inline_limit() -> None:
    job_id = bytes.fromhex("101112131415161718191a1b1c1d1e1f")
    for case in cases("records", "payload_digest_cases", expected=6):
        payload = _payload(case["payload"], case.get("payload_hex"))
        assert len(payload) == case["payload_length"]
        assert records.payload_digest(payload).hex() == case["payload_digest"], case["payload"]
        assert records.stores_inline(len(payload), case["inline_limit"]) is case["inline"]
        job = records.new_job(
            job_id, payload, content_type="application/octet-stream", maximum_attempts=3, inline_limit=4096
        )
        assert verify.verify_payload(job, payload) == payload
        if case["inline"]:
            assert (job.payload_inline, job.payload_key) == (payload, None)
        else:
            assert (job.payload_inline, job.payload_key) == (None, case["payload_key_if_detached"])
        assert decode_record(encode_record(job, QUEUE, TAG), QUEUE, TAG) == job


def test_fail_records_carry_the_retry_deadline_the_math_derives() -> None:
    derived = [case for case in _records() if "derivation" in case]
    assert len(derived) == 4
    for case in derived:
        how, fields = case["derivation"], case["fields"]
        deadline = nack_deadline(
            RetryPolicy(**how["policy"]),
            bytes.fromhex(case["queue_id"]),
            bytes.fromhex(fields["job_id"]),
            fields["attempt"],
            floor_ns=how["floor_ns"],
            delayed_width_ns=300_000_000_000,
        )
        assert (deadline.delay_ms, deadline.retry_not_before_ns) == (how["delay_ms"], fields["retry_not_before_ns"])


def test_quarantine_records_are_what_every_auditor_would_write() -> None:
    findings = [case for case in _records() if "terminal_bucket_width_ns" in case]
    assert len(findings) == 13
    for case in findings:
        queue_id, f = bytes.fromhex(case["queue_id"]), case["fields"]
        record = records.new_quarantine(queue_id, f["source_key"], f["reason"], f["observed_store_ns"], f.get("detail"))
        assert record == record_from_fields(8, f), case["name"]
        key = keys.quarantine_key_for(
            queue_id, f["source_key"], f["reason"], f["observed_store_ns"], case["terminal_bucket_width_ns"]
        )
        assert key == case["key"]
        assert encode_record(record, queue_id, keys.key_tag(queue_id, key)).hex() == case["encoding"]


def test_the_stowq_and_steadq_registries_agree_where_they_overlap() -> None:
    # The shared CBOR layer reports envelope_corrupt with SteadQ/1's constant.
    for code in range(0x0001, 0x0008):
        assert records.QuarantineReason(code).value == SteadQReason(code).value
    assert records.QuarantineReason.ENVELOPE_CORRUPT == SteadQReason.ENVELOPE_CORRUPT


# --- The encoder refuses what the decoder would refuse, naming the field ---

_JOB = JobRecord(
    job_id=bytes(16),
    maximum_attempts=1,
    content_type="t",
    created_store_time_ns=0,
    payload_digest=bytes(32),
    payload_length=0,
    payload_inline=b"",
)


@pytest.mark.parametrize(
    ("record", "names"),
    [
        (JobRecord(**{**_JOB.__dict__, "job_id": bytes(15)}), "job_id must be 16 bytes, got 15"),
        (JobRecord(**{**_JOB.__dict__, "maximum_attempts": -1}), "maximum_attempts must be an integer"),
        (JobRecord(**{**_JOB.__dict__, "payload_length": 1 << 64}), "payload_length must be an integer"),
        (JobRecord(**{**_JOB.__dict__, "maximum_attempts": True}), "maximum_attempts must be an integer"),
        (JobRecord(**{**_JOB.__dict__, "payload_key": "payloads/x"}), "exactly one must be set"),
        (JobRecord(**{**_JOB.__dict__, "payload_inline": None}), "exactly one must be set"),
        (JobRecord(**{**_JOB.__dict__, "content_type": "\ud800"}), "content_type is not valid Unicode"),
        (FormatRecord(65537, 1, 1, 1, 0, 0), "shard_count must be at most 65536"),
        (
            ClaimRecord(bytes(16), 1, 1, "w", bytes(16), 1, continuation=True, basis=ClaimBasis(0, 0, 0)),
            "basis xor prev_token",
        ),
        (ClaimRecord(bytes(16), 1, 1, "w", bytes(16), 1, continuation=False), "basis xor prev_token"),
        (ClaimRecord(bytes(16), 2, 1, "w", bytes(16), 1, continuation=True, prev_token=bytes(8)), "prev_token"),
        (ReceiptRecord(bytes(16), 1, 1, "w", bytes(16), bytes(32), (bytes(31),)), "output_digests[0] must be 32"),
        (QuarantineRecord(bytes(16), "k", 1, -5), "observed_store_ns must be an integer"),
    ],
)
def test_the_encoder_refuses_a_record_it_could_not_read_back(record: records.Record, names: str) -> None:
    with pytest.raises(InvalidInput, match=re.escape(names)):
        encode_record(record, QUEUE, TAG)


def test_the_encoder_refuses_a_bad_queue_id_or_key_tag() -> None:
    with pytest.raises(InvalidInput, match="queue_id must be 16 bytes"):
        encode_record(_JOB, bytes(15), TAG)
    with pytest.raises(InvalidInput, match="key_tag must be 8 bytes"):
        encode_record(_JOB, QUEUE, bytes(9))


def test_an_empty_output_list_is_left_off_the_wire() -> None:
    receipt = ReceiptRecord(bytes(16), 1, 1, "w", bytes(16), bytes(32))
    assert b"output_digests" not in encode_record(receipt, QUEUE, TAG)
    assert decode_record(encode_record(receipt, QUEUE, TAG), QUEUE, TAG) == receipt
    with_outputs = ReceiptRecord(bytes(16), 1, 1, "w", bytes(16), bytes(32), (bytes(32), b"\1" * 32))
    assert decode_record(encode_record(with_outputs, QUEUE, TAG), QUEUE, TAG) == with_outputs


def test_a_record_is_refused_under_another_key_or_queue() -> None:
    data = encode_record(_JOB, QUEUE, TAG)
    for queue_id, tag in ((QUEUE, bytes(8)), (bytes(16), TAG)):
        with pytest.raises(CorruptRecord) as info:
            decode_record(data, queue_id, tag)
        assert (info.value.error_class, info.value.reason) == ("binding", records.QuarantineReason.KEY_TAG_FAILED)
