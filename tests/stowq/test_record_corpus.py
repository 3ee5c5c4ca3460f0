"""The reference's CBOR and record fuzz corpora (vectors/corpus.json) replayed through our decoders.

* ``cbor_decode``: 386 inputs to the generic canonical decoder; the 50 it
  accepts re-encode to exactly their input, the rest are refused with the
  reference's error class.
* ``record_roundtrip``: 101 inputs to the record decoder, all refused, each at
  the reference's first failing check.
* ``record_construction``: 7 records the construction target built from its
  seeds; each encodes to the recorded bytes and decodes back.
"""

from __future__ import annotations

from steadqd import cbor
from steadqd.errors import CorruptRecord
from steadqd.s3.records import decode_record, encode_record
from tests.stowq.vectors import cases, cbor_error_class, load, record_from_fields

QUEUE = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
TAG = bytes([7] * 8)


def test_cbor_corpus_accepts_exactly_the_recorded_inputs() -> None:
    corpus = cases("corpus", "cbor_decode")
    bad = []
    accepted = 0
    for case in corpus:
        data = bytes.fromhex(case["input_hex"])
        try:
            value = cbor.decode(data)
        except CorruptRecord as err:
            if case["accepted"] or err.error_class != cbor_error_class(case["reference_error"]):
                bad.append((case["file"], err.error_class, case.get("reference_error")))
            continue
        accepted += 1
        if not case["accepted"]:
            bad.append((case["file"], "accepted"))
        elif cbor.encode(value) != data:
            bad.append((case["file"], "re-encodes differently"))
    assert not bad
    assert accepted == load("corpus")["counts"]["cbor_decode_accepted"]


def test_record_corpus_is_refused_at_the_references_first_failing_check() -> None:
    bad = []
    for case in cases("corpus", "record_roundtrip"):
        assert not case["accepted"]
        try:
            record = decode_record(bytes.fromhex(case["input_hex"]), QUEUE, TAG)
        except CorruptRecord as err:
            expected = cbor_error_class(case["class"]) if case["class"].startswith("cbor:") else case["class"]
            if err.error_class != expected:
                bad.append((case["file"], err.error_class, case["class"]))
        else:
            bad.append((case["file"], "accepted", record))
    assert not bad
    assert load("corpus")["counts"]["record_roundtrip_accepted"] == 0


def test_constructed_records_encode_as_the_reference_built_them() -> None:
    for case in cases("corpus", "record_construction"):
        record = record_from_fields(case["record_type"], case["fields"])
        encoding = encode_record(record, QUEUE, TAG)
        assert encoding.hex() == case["encoding"], case["file"]
        assert decode_record(encoding, QUEUE, TAG) == record
