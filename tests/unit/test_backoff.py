"""Retry backoff against spec/vectors.md and clocks.md "Retry backoff"."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steadqd.backoff import RetryPolicy, delay_ns_from_ms, retry_deadline_ns, retry_delay_ms
from steadqd.errors import InvalidInput

QID = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
JOB = bytes.fromhex("f0e1d2c3b4a5968778695a4b3c2d1e0f")


@pytest.mark.parametrize(
    ("attempt", "plain", "jittered"),
    [(1, 1000, 945), (2, 2000, 1727), (3, 4000, 3147), (4, 8000, 6173), (5, 16000, 15375), (10, 300000, 159955)],
)
def test_vector_table(attempt: int, plain: int, jittered: int) -> None:
    assert retry_delay_ms(RetryPolicy(1000, 300_000, use_jitter=False), QID, JOB, attempt) == plain
    assert retry_delay_ms(RetryPolicy(1000, 300_000), QID, JOB, attempt) == jittered


def test_no_jitter_pinned() -> None:
    p = RetryPolicy(base_ms=1000, cap_ms=300_000, use_jitter=False)
    assert [retry_delay_ms(p, QID, JOB, a) for a in (1, 2, 3, 9, 10)] == [1000, 2000, 4000, 256000, 300000]


def test_huge_base_first_sample_rejected() -> None:
    p = RetryPolicy(base_ms=2**62, cap_ms=2**63)
    job = bytes.fromhex("0b050201") + bytes(12)
    assert retry_delay_ms(p, bytes(16), job, 2) == 6775448086808226869


def test_attempt_zero_and_saturation() -> None:
    p = RetryPolicy(1000, 300_000, use_jitter=False)
    assert retry_delay_ms(p, QID, JOB, 0) == 0
    assert retry_delay_ms(RetryPolicy(1000, 300_000), QID, JOB, 0) == 0
    big = RetryPolicy(3, 2**64 - 1, use_jitter=False)
    assert retry_delay_ms(big, QID, JOB, 64) == 2**64 - 1  # 3 * 2^63 saturates
    assert retry_delay_ms(big, QID, JOB, 65) == 2**64 - 1
    assert retry_delay_ms(big, QID, JOB, 2**32 - 1) == 2**64 - 1
    jit = retry_delay_ms(RetryPolicy(3, 2**64 - 1), QID, JOB, 2**32 - 1)
    assert 2**63 <= jit <= 2**64 - 1


def test_max_delay_caps() -> None:
    p = RetryPolicy(1000, 300_000, use_jitter=False, max_delay_ms=5000)
    assert p.effective_cap_ms == 5000
    assert retry_delay_ms(p, QID, JOB, 10) == 5000
    assert RetryPolicy(1000, 3000, max_delay_ms=10_000).effective_cap_ms == 3000


def test_ceiling_one() -> None:
    # ceiling 1: lower 1, span 1, threshold 0 -> always 1
    assert retry_delay_ms(RetryPolicy(1, 1), QID, JOB, 5) == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_ms": 0, "cap_ms": 10},
        {"base_ms": 10, "cap_ms": 9},
        {"base_ms": 10, "cap_ms": 100, "max_delay_ms": 9},
        {"base_ms": -1, "cap_ms": 100},
        {"base_ms": 1, "cap_ms": 2**64},
        {"base_ms": 1.5, "cap_ms": 100},
        {"base_ms": True, "cap_ms": 100},
        {"base_ms": 1, "cap_ms": 100, "use_jitter": 1},
    ],
)
def test_policy_validation(kwargs: dict) -> None:
    with pytest.raises(InvalidInput):
        RetryPolicy(**kwargs)


def test_argument_validation() -> None:
    p = RetryPolicy(1000, 300_000)
    for qid, job, att in ((QID[:15], JOB, 1), (QID, JOB + b"\0", 1), (QID, JOB, -1), (QID, JOB, 2**32)):
        with pytest.raises(InvalidInput):
            retry_delay_ms(p, qid, job, att)


@settings(max_examples=200, deadline=None)
@given(
    base=st.integers(1, 2**40),
    extra=st.integers(0, 2**40),
    attempt=st.integers(1, 80),
    job=st.binary(min_size=16, max_size=16),
)
def test_jitter_bounds(base: int, extra: int, attempt: int, job: bytes) -> None:
    plain = retry_delay_ms(RetryPolicy(base, base + extra, use_jitter=False), QID, job, attempt)
    jittered = retry_delay_ms(RetryPolicy(base, base + extra), QID, job, attempt)
    assert (plain + 1) // 2 <= jittered <= plain


def test_deadline_helpers() -> None:
    assert delay_ns_from_ms(945) == 945_000_000
    with pytest.raises(InvalidInput):
        delay_ns_from_ms(2**64 - 1)
    assert retry_deadline_ns(1_700_000_000_000_000_000, 0) is None
    assert retry_deadline_ns(1_700_000_000_000_000_000, 945_000_000) == 1_700_000_000_945_000_000
    assert retry_deadline_ns(2**63 - 2, 1) == 2**63 - 1
    with pytest.raises(InvalidInput):
        retry_deadline_ns(2**63 - 1, 1)
