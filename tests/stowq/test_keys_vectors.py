"""steadqd.s3.keys against vectors/keys.json: every key shape, reject, shard, tag, qid, index key and hint."""

from __future__ import annotations

from typing import Any

import pytest

from steadqd.errors import InvalidInput, InvalidKey
from steadqd.s3 import keys
from steadqd.s3.keys import KeyKind, ParsedKey, TermKind
from tests.stowq.vectors import cases, load, queue_id

QUEUE_ID = queue_id("keys")
JOB = bytes.fromhex("101112131415161718191a1b1c1d1e1f")

# vectors' field name -> ParsedKey attribute
_ATTR = {
    "shard": "shard",
    "job_id": "job_id",
    "generation": "generation",
    "bucket": "bucket",
    "digest": "digest",
    "kind": "term",
    "qid": "qid",
    "nonce": "nonce",
}


def _plain(value: object) -> object:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, TermKind):
        return value.value
    return value


def _fields(parsed: ParsedKey) -> dict[str, object]:
    return {name: _plain(getattr(parsed, attr)) for name, attr in _ATTR.items() if getattr(parsed, attr) is not None}


_BUILDERS: dict[KeyKind, Any] = {
    KeyKind.JOB: lambda f: keys.job_key(f["shard"], f["job_id"]),
    KeyKind.PAYLOAD: lambda f: keys.payload_key(f["job_id"], f["digest"]),
    KeyKind.CLAIM: lambda f: keys.claim_key(f["shard"], f["job_id"], f["generation"]),
    KeyKind.FAIL: lambda f: keys.fail_key(f["shard"], f["job_id"], f["generation"]),
    KeyKind.LEASE_INDEX: lambda f: keys.lease_index_key(f["bucket"], f["shard"], f["job_id"], f["generation"]),
    KeyKind.DELAY_INDEX: lambda f: keys.delay_index_key(f["bucket"], f["shard"], f["job_id"]),
    KeyKind.RECEIPT: lambda f: keys.receipt_key(f["shard"], f["job_id"]),
    KeyKind.DEAD: lambda f: keys.dead_key(f["shard"], f["job_id"]),
    KeyKind.TERMIDX: lambda f: keys.termidx_key(f["bucket"], TermKind(f["kind"]), f["shard"], f["job_id"]),
    KeyKind.TAIL: lambda f: keys.tail_key(f["shard"], f["job_id"]),
    KeyKind.QUARANTINE: lambda f: keys.quarantine_key(f["bucket"], f["qid"]),
    KeyKind.BEACON: lambda f: keys.beacon_key(f["nonce"]),
    KeyKind.FORMAT: lambda f: keys.FORMAT_KEY,
    KeyKind.WATERMARK: lambda f: keys.WATERMARK_KEY,
}


def _builder_args(fields: dict[str, Any]) -> dict[str, Any]:
    hex_fields = ("job_id", "digest", "qid", "nonce")
    return {k: bytes.fromhex(v) if k in hex_fields else v for k, v in fields.items()}


def test_valid_keys_parse_to_their_fields_and_rebuild_byte_for_byte() -> None:
    valid = cases("keys", "valid_keys")
    bad = []
    for case in valid:
        parsed = keys.parse_key(case["key"])
        got = (parsed.kind.label, parsed.kind.rule, parsed.kind.plane.value, _fields(parsed))
        want = (case["kind"], case["abnf_rule"], case["plane"], case["fields"])
        built = _BUILDERS[parsed.kind](_builder_args(case["fields"]))
        if got != want or str(parsed) != case["key"] or built != case["key"]:
            bad.append((case["key"], got, str(parsed), built))
        if keys.key_tag(QUEUE_ID, case["key"]).hex() != case["key_tag"]:
            bad.append((case["key"], "key tag"))
    assert not bad
    # Every shape of keys.abnf is among them.
    assert {c["abnf_rule"] for c in valid} == {k.rule for k in KeyKind}


def test_invalid_keys_are_refused_with_the_reference_error_class() -> None:
    bad = []
    for case in cases("keys", "invalid_keys"):
        try:
            parsed = keys.parse_key(case["key"])
        except InvalidKey as err:
            if err.error_class != case["reference_error"] or err.key != case["key"]:
                bad.append((case["key"], case["why"], err.error_class, case["reference_error"]))
        else:
            bad.append((case["key"], case["why"], "accepted as", parsed))
    assert not bad


def test_refusal_names_the_rule_and_escapes_the_key() -> None:
    with pytest.raises(InvalidKey, match=r"job-id must be 32 lowercase hex digits, got 'XYZ'") as info:
        keys.parse_key("jobs/0001/XYZ")
    assert info.value.error_class == "field:job-id"
    with pytest.raises(InvalidKey, match=r"'jobs/0001\\n") as info:
        keys.parse_key("jobs/0001\n/x")
    assert "\n" not in info.value.message
    with pytest.raises(
        InvalidKey, match=r"claim keys have 4 '/'-separated segments \(claims/<shard>/<job-id>/<generation>\)"
    ):
        keys.parse_key("claims/0001/" + JOB.hex())
    with pytest.raises(InvalidKey, match=r"unknown prefix 'outputs'"):
        keys.parse_key("outputs/result-1")


def test_shard_derivation_for_every_count() -> None:
    bad = []
    for case in cases("keys", "shard_cases"):
        qid, jid = bytes.fromhex(case["queue_id"]), bytes.fromhex(case["job_id"])
        if f"{keys.shard_hash(qid, jid):04x}" != case["hash_first_two_bytes"]:
            bad.append((case, "hash"))
        for count, shard in case["shard_by_count"].items():
            if keys.shard_of(qid, jid, int(count)) != shard:
                bad.append((case["job_id"], count, shard))
        if keys.job_key(keys.shard_of(qid, jid, 256), jid) != case["job_key_at_256"]:
            bad.append((case, "job key"))
    assert not bad


@pytest.mark.parametrize("count", [0, 3, 6, 65537, 1 << 17, -1, True, 2.0])
def test_shard_count_must_be_a_power_of_two_up_to_65536(count: object) -> None:
    with pytest.raises(InvalidInput, match="shard_count must be a power of two in 1..65536"):
        keys.shard_of(QUEUE_ID, JOB, count)  # type: ignore[arg-type]


def test_key_tags() -> None:
    bad = [
        c
        for c in cases("keys", "key_tag_cases")
        if keys.key_tag(bytes.fromhex(c["queue_id"]), c["key"]).hex() != c["key_tag"]
    ]
    assert not bad


def test_quarantine_ids_buckets_and_keys() -> None:
    bad = []
    for case in cases("keys", "qid_cases"):
        qid = bytes.fromhex(case["queue_id"])
        got_qid = keys.quarantine_id(qid, case["source_key"], case["reason"])
        got_key = keys.quarantine_key_for(
            qid, case["source_key"], case["reason"], case["observed_store_ns"], case["terminal_bucket_width_ns"]
        )
        parsed = keys.parse_key(got_key)
        got = (got_qid.hex(), parsed.bucket, got_key, keys.key_tag(qid, got_key).hex())
        want = (case["qid"], case["bucket"], case["quarantine_key"], case["key_tag"])
        if got != want:
            bad.append((case["source_key"], case["reason_name"], got, want))
    assert not bad


def _derive(case: dict[str, Any]) -> str:
    shard = keys.parse_key(case["key"]).shard
    assert shard is not None
    if case["index"] == "lease":
        generation = keys.parse_key(case["key"]).generation
        assert generation is not None
        return keys.lease_index_key_for(
            case["claim_store_time_ns"],
            case["lease_duration_ns"],
            case["lease_bucket_width_ns"],
            shard,
            JOB,
            generation,
        )
    if case["index"] == "delayed":
        return keys.delay_index_key_for(case["not_before_ns"], case["delayed_bucket_width_ns"], shard, JOB)
    assert case["index"] == "termidx"
    term = TermKind(case["kind"])
    return keys.termidx_key_for(case["floor_ns"], case["terminal_bucket_width_ns"], term, shard, JOB)


def test_index_keys_derived_from_store_times() -> None:
    derivations = cases("keys", "index_key_derivations", expected=14)
    assert {c["index"] for c in derivations} == {"lease", "delayed", "termidx"}
    bad = [
        (c, _derive(c)) for c in derivations if _derive(c) != c["key"] or keys.parse_key(c["key"]).bucket != c["bucket"]
    ]
    assert not bad


def test_tail_hint_bodies() -> None:
    bad = []
    for case in cases("keys", "tail_hint_bodies", expected=8):
        body = keys.encode_tail_hint(case["generation"])
        if body.hex() != case["body_hex"] or keys.decode_tail_hint(body) != case["generation"]:
            bad.append(case)
    assert not bad


@pytest.mark.parametrize("body", [b"", bytes(7), bytes(9), "0000000000000001"])
def test_a_tail_hint_that_is_not_8_bytes_means_list_the_chain(body: Any) -> None:
    assert keys.decode_tail_hint(body) is None


def test_list_order_is_numeric_order() -> None:
    ordering = cases("keys", "ordering_cases", expected=3)
    for case in ordering:
        listed = case["sorted_keys"]
        # The store lists in the byte order of the keys: that order is the vectors' order.
        assert sorted(listed, key=lambda k: k.encode()) == listed, case["name"]
        parsed = [keys.parse_key(k) for k in listed]
        assert all(k.startswith(case["prefix"]) for k in listed)
        if "generations" in case:
            assert [p.generation for p in parsed] == case["generations"]
        if "buckets" in case:
            assert [p.bucket for p in parsed] == case["buckets"]
        if "tail_generation" in case:
            assert keys.chain_tail(listed) == case["tail_generation"]


def test_list_prefixes() -> None:
    assert keys.chain_prefix(KeyKind.CLAIM, 1, JOB) == "claims/0001/101112131415161718191a1b1c1d1e1f/"
    assert keys.claim_key(1, JOB, 9).startswith(keys.chain_prefix(KeyKind.CLAIM, 1, JOB))
    assert keys.chain_prefix(KeyKind.FAIL, 0xFFFF, JOB) == "fails/ffff/101112131415161718191a1b1c1d1e1f/"
    assert keys.bucket_prefix(KeyKind.LEASE_INDEX, 42) == "leases/000000000000002a/"
    assert keys.bucket_prefix(KeyKind.TERMIDX, 0) == "termidx/0000000000000000/"
    with pytest.raises(InvalidInput, match="job keys have no bucket"):
        keys.bucket_prefix(KeyKind.JOB, 1)
    with pytest.raises(InvalidInput, match="only claim and fail keys form a chain"):
        keys.chain_prefix(KeyKind.RECEIPT, 1, JOB)
    with pytest.raises(InvalidInput, match="ends with a fail key"):
        keys.chain_tail([keys.fail_key(1, JOB, 3)])


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: keys.claim_key(1, JOB, 1 << 32), r"generation must be an integer in 0..4294967295"),
        (lambda: keys.job_key(1 << 16, JOB), r"shard must be an integer in 0..65535"),
        (lambda: keys.job_key(-1, JOB), r"shard must be an integer in 0..65535"),
        (lambda: keys.job_key(1, JOB[:15]), r"job-id must be 16 bytes"),
        (lambda: keys.lease_index_key(1 << 64, 1, JOB, 1), r"bucket must be an integer in 0..18446744073709551615"),
        (lambda: keys.payload_key(JOB, bytes(31)), r"digest must be 32 bytes"),
        (lambda: keys.termidx_key(1, "r", 1, JOB), r"termidx kind must be a TermKind"),  # type: ignore[arg-type]
        (lambda: keys.key_tag(JOB[:8], "meta/FORMAT"), r"queue_id must be 16 bytes"),
        (lambda: keys.quarantine_id(QUEUE_ID, "jobs/x", 1 << 16), r"quarantine reason must be an integer in 0..65535"),
    ],
)
def test_builders_refuse_what_no_key_can_hold(build: Any, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        build()


def test_reference_unit_test_pins() -> None:
    pins = load("keys")["reference_unit_test_pins"]
    assert f"{keys.shard_hash(QUEUE_ID, JOB):04x}" == pins["shard_raw_q_j"]
    assert keys.shard_of(QUEUE_ID, JOB, 256) == pins["shard_q_j_256"]
    assert keys.key_tag(QUEUE_ID, keys.FORMAT_KEY).hex() == pins["key_tag_q_meta_format"]
