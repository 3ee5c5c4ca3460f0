"""Properties of the StowQ/1 record codec and the canonical CBOR layer beyond the vectors (Hypothesis).

The rules the reference's fuzz targets assert, over inputs nobody chose:

* every record the encoder accepts decodes to itself, and its body is
  canonical CBOR that the generic decoder re-encodes to the same bytes;
* a changed byte anywhere in a stored record is refused;
* anything refused is refused with CorruptRecord and nothing else;
* a digest-valid record built from an arbitrary fields map is either refused
  or decodes to a record that re-encodes to exactly the input bytes, so no
  second encoding of a record is ever accepted.
"""

from __future__ import annotations

import hashlib
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from steadqd import cbor
from steadqd.constants import U64_MAX
from steadqd.errors import CorruptRecord
from steadqd.s3 import records
from steadqd.s3.records import (
    ClaimBasis,
    ClaimRecord,
    DeadRecord,
    FailRecord,
    FormatRecord,
    JobRecord,
    QuarantineRecord,
    ReceiptRecord,
    RecordType,
    WatermarkRecord,
    decode_record,
    encode_record,
)

QUEUE = bytes(range(16))
TAG = bytes([7] * 8)

u64 = st.integers(0, U64_MAX)
id16 = st.binary(min_size=16, max_size=16)
digest = st.binary(min_size=32, max_size=32)
text = st.text(max_size=40)
maybe_u64 = st.none() | u64


@st.composite
def jobs(draw: st.DrawFn) -> JobRecord:
    inline = draw(st.booleans())
    return JobRecord(
        job_id=draw(id16),
        maximum_attempts=draw(u64),
        content_type=draw(text),
        created_store_time_ns=draw(u64),
        payload_digest=draw(digest),
        payload_length=draw(u64),
        not_before_ns=draw(maybe_u64),
        payload_inline=draw(st.binary(max_size=64)) if inline else None,
        payload_key=None if inline else draw(text),
    )


@st.composite
def claims(draw: st.DrawFn) -> ClaimRecord:
    continuation = draw(st.booleans())
    return ClaimRecord(
        job_id=draw(id16),
        generation=draw(u64),
        attempt=draw(u64),
        worker_id=draw(text),
        worker_token=draw(id16),
        lease_duration_ns=draw(u64),
        continuation=continuation,
        basis=None if continuation else ClaimBasis(draw(u64), draw(u64), draw(u64)),
        prev_token=draw(id16) if continuation else None,
    )


any_record = st.one_of(
    st.builds(FormatRecord, st.integers(0, 65536), u64, u64, u64, u64, u64),
    jobs(),
    claims(),
    st.builds(FailRecord, id16, u64, u64, u64, u64),
    st.builds(ReceiptRecord, id16, u64, u64, text, id16, digest, st.lists(digest, max_size=3).map(tuple)),
    st.builds(DeadRecord, id16, u64, u64, u64),
    st.builds(WatermarkRecord, u64, u64),
    st.builds(QuarantineRecord, id16, text, u64, u64, maybe_u64),
)


@given(any_record)
def test_every_encodable_record_decodes_to_itself(record: records.Record) -> None:
    data = encode_record(record, QUEUE, TAG)
    assert decode_record(data, QUEUE, TAG) == record
    assert encode_record(record, QUEUE, TAG) == data
    body = data[: -records.DIGEST_TRAILER]
    assert cbor.encode(cbor.decode(body)) == body


@given(any_record, st.data())
def test_a_changed_byte_is_refused(record: records.Record, data: st.DataObject) -> None:
    stored = bytearray(encode_record(record, QUEUE, TAG))
    position = data.draw(st.integers(0, len(stored) - 1))
    stored[position] ^= data.draw(st.integers(1, 255))
    try:
        decode_record(bytes(stored), QUEUE, TAG)
    except CorruptRecord:
        return
    raise AssertionError(f"byte {position} changed and the record still decoded")


@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_refused_with_corrupt_record_only(data: bytes) -> None:
    try:
        decode_record(data, QUEUE, TAG)
    except CorruptRecord:
        pass
    try:
        value = cbor.decode(data)
    except CorruptRecord:
        return
    assert cbor.encode(value) == data


def _map(entries: dict[str, Any]) -> cbor.CborMap:
    return cbor.CborMap(tuple(entries.items()))


# Values of every StowQ type, nested, to stand in for the fields of a record.
_leaves = st.one_of(u64, st.booleans(), st.binary(max_size=40), text)
_names = st.sampled_from(sorted({name for s in records.SCHEMAS.values() for name in s.names} | {"basis", "extra"}))
_values = st.recursive(
    _leaves, lambda inner: st.lists(inner, max_size=3).map(tuple) | st.dictionaries(_names, inner, max_size=4).map(_map)
)


def _sealed(rt: RecordType, pairs: list[tuple[Any, Any]]) -> bytes:
    """A record of type ``rt`` whose fields map holds ``pairs`` in this order, with a valid digest."""
    fields = cbor.encode_head(cbor.MAP, len(pairs)) + b"".join(cbor.encode(k) + cbor.encode(v) for k, v in pairs)
    head = cbor.encode((records.MAGIC, records.MAJOR, records.MINOR, QUEUE, TAG, int(rt), cbor.CborMap(())))
    body = head[:-1] + fields  # the empty map's one byte replaced by the fields, in the order given
    return body + records.DIGEST_HEAD + hashlib.sha256(records.digest_domain(rt) + body).digest()


def _accepted_only_in_its_one_encoding(data: bytes) -> None:
    try:
        record = decode_record(data, QUEUE, TAG)
    except CorruptRecord:
        return
    assert encode_record(record, QUEUE, TAG) == data


@given(st.sampled_from(RecordType), st.dictionaries(_names, _values, max_size=10), st.booleans())
def test_a_digest_valid_body_of_arbitrary_fields_decodes_only_in_its_one_encoding(
    rt: RecordType, entries: dict[str, Any], reverse: bool
) -> None:
    pairs = list(entries.items())
    _accepted_only_in_its_one_encoding(_sealed(rt, pairs[::-1] if reverse else pairs))


@given(any_record, st.data())
def test_a_digest_valid_record_with_one_field_changed_decodes_only_in_its_one_encoding(
    record: records.Record, data: st.DataObject
) -> None:
    stored = encode_record(record, QUEUE, TAG)
    envelope = cbor.decode(stored[: -records.DIGEST_TRAILER])
    assert isinstance(envelope, tuple) and isinstance(envelope[6], cbor.CborMap)
    pairs = list(envelope[6].pairs)
    assert _sealed(records.record_type(record), pairs) == stored  # so a refusal below is the change's doing
    i = data.draw(st.integers(0, len(pairs) - 1))
    change = data.draw(st.sampled_from(["swap", "drop", "duplicate", "retype"]))
    if change == "swap" and len(pairs) > 1:
        j = (i + 1) % len(pairs)
        pairs[i], pairs[j] = pairs[j], pairs[i]
    elif change == "drop":
        del pairs[i]
    elif change == "duplicate":
        pairs.insert(i, pairs[i])
    else:
        pairs[i] = (pairs[i][0], data.draw(_values))
    _accepted_only_in_its_one_encoding(_sealed(records.record_type(record), pairs))
