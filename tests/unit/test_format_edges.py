"""The format code at the exact edges of its ranges, and on its slow paths.

Written for the mutants the mutation run (docs/testing.md, "Mutation testing")
found alive: a ``>`` turned ``>=`` at a u64 or length limit, a fast path
whose fallback was never taken. Each test sits exactly on the edge, so the
off-by-one version of the check fails it.
"""

from __future__ import annotations

import hashlib

import pytest

from steadqd.backoff import RetryPolicy, retry_delay_ms
from steadqd.constants import MAX_EXTENSION_LENGTH, U64_MAX
from steadqd.errors import InvalidInput
from steadqd.fs import names, scan_order
from steadqd.fs.cbor import Extension, decode_extension, encode_extension
from steadqd.fs.records import JobHeader, build_header

QID = bytes.fromhex("00112233445566778899aabbccddeeff")
JOB = bytes.fromhex("0f0e0d0c0b0a09080706050403020100")


class Four(int):
    """An int that is not exactly ``int``: takes the checked path of ``shard_of``."""


def test_doubling_is_exact_up_to_attempt_64() -> None:
    """base << 63 still fits in a u64; only from attempt 65 on does the guard saturate."""
    policy = RetryPolicy(base_ms=1, cap_ms=U64_MAX, use_jitter=False)
    assert retry_delay_ms(policy, QID, JOB, 64) == 1 << 63
    assert retry_delay_ms(policy, QID, JOB, 65) == U64_MAX


def test_an_extension_of_exactly_the_maximum_length_is_accepted() -> None:
    extension = bytes(MAX_EXTENSION_LENGTH)
    header = build_header(
        job_id=JOB,
        max_attempts=1,
        created_at_ns=0,
        extension=extension,
        payload_length=0,
        payload_digest=hashlib.sha256(b"").digest(),
    )
    assert JobHeader.decode(header.encode()).extension_length == MAX_EXTENSION_LENGTH


def test_buckets_reach_exactly_u64_max() -> None:
    assert names.bucket_start(U64_MAX, 1) == U64_MAX
    assert names.bucket_end(U64_MAX - 1, 1) == U64_MAX
    assert names.terminal_bucket(U64_MAX, U64_MAX) == 1  # a width of exactly u64 max is valid


def test_the_last_shard_directory() -> None:
    assert names.shard_dir(0xFFFF) == "ffff"


def test_the_scan_round_spans_the_whole_u64() -> None:
    """The round is packed unsigned: the last round before wrap-around is a valid round."""
    start, stride = scan_order.scan_params(QID, JOB, QID, U64_MAX, 4096)
    assert 0 <= start < 4096 and stride % 2 == 1
    assert scan_order.next_scan_round(U64_MAX) == 0


@pytest.mark.parametrize(
    ("queue_id", "job_id", "shard_count"),
    [(bytearray(QID), JOB, 64), (QID, bytearray(JOB), 64), (QID, JOB, Four(64))],
    ids=["bytearray queue_id", "bytearray job_id", "int subclass shard_count"],
)
def test_the_checked_path_of_shard_of_gives_the_memoised_answer(queue_id, job_id, shard_count) -> None:
    assert names.shard_of(queue_id, job_id, shard_count) == names.shard_of(QID, JOB, 64)


def test_the_checked_path_of_shard_of_still_checks() -> None:
    with pytest.raises(InvalidInput):
        names.shard_of(QID, JOB, Four(3))


def test_initial_not_before_may_be_exactly_u64_max() -> None:
    ext = Extension(content_type="application/octet-stream", initial_not_before=U64_MAX)
    assert decode_extension(encode_extension(ext)).initial_not_before == U64_MAX
