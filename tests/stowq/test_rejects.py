"""vectors/rejects.json: everything a StowQ/1 reader must refuse, and where it refuses it.

* 845 encodings the record decoder refuses: ours refuses each at the same
  first failing check as the reference (its error class) and gives it the
  quarantine reason the reference's repair scan would record. The class is
  only a hint in the spec; holding ours to it pins the order of checks.
* 13 FORMAT records that decode but must not open a queue.
* 9 structurally valid records the protocol layer must still refuse: a record
  under the wrong key, a payload that does not match its digest, a quarantine
  record in a v1 queue, inadmissible claims.
* 56 generic canonical-CBOR cases, accepted or refused as the reference does.
"""

from __future__ import annotations

import collections
import hashlib
from typing import Any

import pytest

from steadqd import cbor
from steadqd.errors import CorruptRecord, ErrorKind
from steadqd.s3 import keys, records, timemath, verify
from steadqd.s3.records import ClaimRecord, JobRecord, QuarantineReason, decode_record
from tests.stowq.vectors import cases, cbor_error_class, load, record_from_fields


def _expected_class(vector_class: str) -> str:
    return cbor_error_class(vector_class) if vector_class.startswith("cbor:") else vector_class


def _decode(case: dict[str, Any]) -> records.Record:
    where = case["decode_with"]
    return decode_record(
        bytes.fromhex(case["encoding"]), bytes.fromhex(where["queue_id"]), bytes.fromhex(where["key_tag"])
    )


def test_every_reject_is_refused_at_the_references_first_failing_check() -> None:
    bad = []
    seen: collections.Counter[str] = collections.Counter()
    for case in cases("rejects", "record_decode_rejects"):
        seen[case["class"]] += 1
        try:
            record = _decode(case)
        except CorruptRecord as err:
            got = (err.error_class, err.reason, err.payload)
            if got != (_expected_class(case["class"]), case["quarantine_reason_in_reference"], False):
                bad.append((case["name"], case["class"], got, err.message))
        else:
            bad.append((case["name"], "accepted", record))
    assert not bad
    assert dict(seen) == load("rejects")["counts"]["by_class"]


def test_every_reject_is_refused_when_read_from_its_key() -> None:
    # read_record derives the tag from the key, as a reader that listed the key does. The
    # cases that hand the decoder some other tag test the binding check itself.
    other_tag = 0
    for case in cases("rejects", "record_decode_rejects"):
        where = case["decode_with"]
        queue_id = bytes.fromhex(where["queue_id"])
        if keys.key_tag(queue_id, where["key"]).hex() != where["key_tag"]:
            assert case["class"] == "binding", case["name"]
            other_tag += 1
            continue
        with pytest.raises(CorruptRecord) as info:
            verify.read_record(bytes.fromhex(case["encoding"]), queue_id, where["key"], required_feature_bits=3)
        assert info.value.error_class == _expected_class(case["class"]), case["name"]
    assert 0 < other_tag < load("rejects")["counts"]["by_class"]["binding"]


def test_every_reject_names_what_is_wrong() -> None:
    # A message is a sentence about the record, never a bare class name.
    for case in cases("rejects", "record_decode_rejects"):
        with pytest.raises(CorruptRecord) as info:
            _decode(case)
        assert info.value.message.startswith(("StowQ/1 record: ", "CBOR: ")), case["name"]
        assert info.value.kind is ErrorKind.QUEUE_CORRUPT


def test_formats_that_decode_but_must_not_open() -> None:
    for case in cases("rejects", "format_validate_rejects"):
        assert case["decodes"]
        record = _decode(case)
        assert record == record_from_fields(1, case["fields"])
        with pytest.raises(CorruptRecord) as info:
            verify.validate_format(record)
        assert info.value.error_class == case["class"], case["name"]
        if case["class"] == "field:required_feature_bits":
            # Not corrupt: a newer writer's queue, which this version must not touch.
            assert info.value.kind is ErrorKind.UNSUPPORTED_FORMAT
            assert info.value.reason == QuarantineReason.UNSUPPORTED_REQUIRED_FEATURE
            assert "newer version" in info.value.message
        else:
            assert info.value.kind is ErrorKind.QUEUE_CORRUPT


def _semantic(stage: str) -> list[dict[str, Any]]:
    return [case for case in cases("rejects", "semantic_rejects") if case["stage"] == stage]


def test_semantic_rejects_cover_four_stages() -> None:
    stages = collections.Counter(case["stage"] for case in cases("rejects", "semantic_rejects"))
    assert stages == {"key_record_consistency": 3, "delivery": 2, "feature_gate": 1, "audit": 3}
    for case in cases("rejects", "semantic_rejects"):
        where = case["decode_with"]
        assert keys.key_tag(bytes.fromhex(where["queue_id"]), case["key"]).hex() == where["key_tag"]


def test_a_record_that_contradicts_its_key_is_refused() -> None:
    for case in _semantic("key_record_consistency"):
        record = _decode(case)
        key = keys.parse_key(case["key"])
        with pytest.raises(CorruptRecord) as info:
            verify.check_key_binding(record, key)
        assert info.value.reason == case["quarantine_reason"] == QuarantineReason.KEY_RECORD_MISMATCH
        assert case["key"] in info.value.message
        queue_id = bytes.fromhex(case["decode_with"]["queue_id"])
        with pytest.raises(CorruptRecord, match="in the key|key$"):
            verify.read_record(bytes.fromhex(case["encoding"]), queue_id, case["key"], required_feature_bits=3)


def test_a_record_that_agrees_with_its_key_passes() -> None:
    # The three keys above, each with the record it should hold, pass.
    good = [c for c in cases("records", "records") if c["key"] and c["type_name"] in ("fail", "receipt", "job")]
    assert {c["type_name"] for c in good} == {"fail", "receipt", "job"}
    for case in good:
        record = record_from_fields(case["record_type"], case["fields"])
        verify.check_key_binding(record, keys.parse_key(case["key"]))


def test_a_payload_that_does_not_match_its_job_is_never_delivered() -> None:
    for case in _semantic("delivery"):
        job = _decode(case)
        assert isinstance(job, JobRecord) and job.payload_inline is not None
        with pytest.raises(CorruptRecord) as info:
            verify.verify_payload(job, job.payload_inline)
        assert info.value.payload and info.value.kind is ErrorKind.PAYLOAD_CORRUPT
        assert info.value.reason == case["quarantine_reason"] == QuarantineReason.PAYLOAD_CORRUPT


def test_a_quarantine_record_in_a_v1_queue_is_a_finding() -> None:
    (case,) = _semantic("feature_gate")
    record = _decode(case)
    with pytest.raises(CorruptRecord) as info:
        verify.check_feature_gate(record, case["format_required_feature_bits"])
    assert info.value.error_class == "feature_gate"
    verify.check_feature_gate(record, records.FeatureBit.QUARANTINE)
    queue_id, stored = bytes.fromhex(case["decode_with"]["queue_id"]), bytes.fromhex(case["encoding"])
    with pytest.raises(CorruptRecord, match="feature bit 1"):
        verify.read_record(stored, queue_id, case["key"], required_feature_bits=0)
    assert verify.read_record(stored, queue_id, case["key"], required_feature_bits=1) == record


def test_inadmissible_claims_are_found_by_the_audit() -> None:
    for case in _semantic("audit"):
        claim, before = _decode(case), case["predecessor"]
        assert isinstance(claim, ClaimRecord) and case["quarantine_reason"] == QuarantineReason.INADMISSIBLE_CLAIM
        if claim.continuation:
            assert claim.prev_token is not None
            admissible = timemath.continuation_admissible(
                claim.worker_id,
                claim.prev_token,
                predecessor_worker_id=before["worker_id"],
                predecessor_worker_token=bytes.fromhex(before["worker_token"]),
            )
        else:
            assert claim.basis is not None
            admissible = timemath.takeover_admissible(
                claim.basis.prev_store_time_ns,
                claim.basis.prev_duration_ns,
                claim.basis.observed_watermark_ns,
                predecessor_store_time_ns=before["store_time_ns"],
                predecessor_lease_duration_ns=before["lease_duration_ns"],
            )
        assert not admissible, case["name"]


def test_generic_canonical_cbor_cases() -> None:
    bad = []
    for case in cases("rejects", "cbor_value_cases"):
        data = bytes.fromhex(case["input"])
        try:
            value = cbor.decode(data)
        except CorruptRecord as err:
            if case["accepted"] or err.error_class != cbor_error_class(case["reference_error"]):
                bad.append((case["name"], err.error_class, case["reference_error"]))
            continue
        if not case["accepted"]:
            bad.append((case["name"], "accepted", value))
        elif case["reencodes_identically"] and cbor.encode(value) != data:
            bad.append((case["name"], "re-encodes differently", cbor.encode(value).hex()))
    assert not bad


def test_an_unknown_field_name_from_the_store_is_escaped_and_cut_short_in_the_message() -> None:
    queue_id, tag = bytes(16), bytes(8)
    name = "\x1b[31m" + "x" * 100
    body = cbor.encode((records.MAGIC, records.MAJOR, records.MINOR, queue_id, tag, 6, cbor.CborMap(((name, 1),))))
    data = body + records.DIGEST_HEAD + hashlib.sha256(records.digest_domain(records.RecordType.DEAD) + body).digest()
    with pytest.raises(CorruptRecord) as info:
        decode_record(data, queue_id, tag)
    assert info.value.error_class == "unknown_field"
    assert "\x1b" not in info.value.message and "\\x1b[31m" in info.value.message
    assert "x" * 50 + "..." in info.value.message and "x" * 100 not in info.value.message
