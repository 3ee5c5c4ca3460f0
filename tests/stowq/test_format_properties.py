"""Properties of the StowQ/1 keys and arithmetic beyond the vectors' fixed cases (Hypothesis).

The vectors pin known inputs; these check the rules the reference's fuzz
targets assert, over inputs nobody chose: a key parses back to what built it,
anything else is refused with InvalidKey and nothing else, shards nest, and the
bucket and retry arithmetic keeps its bounds.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from steadqd.constants import U64_MAX
from steadqd.errors import InvalidKey, StateExhausted
from steadqd.s3 import keys, retry, timemath
from steadqd.s3.keys import KeyKind, TermKind

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
u64 = st.integers(0, U64_MAX)
id16 = st.binary(min_size=16, max_size=16)
digest = st.binary(min_size=32, max_size=32)
term = st.sampled_from(TermKind)

# Every shape: its builder, a strategy for the builder's arguments, and the
# ParsedKey attributes they become, all in the key's field order.
SHAPES: dict[KeyKind, tuple[Any, st.SearchStrategy[tuple[Any, ...]], tuple[str, ...]]] = {
    KeyKind.JOB: (keys.job_key, st.tuples(u16, id16), ("shard", "job_id")),
    KeyKind.PAYLOAD: (keys.payload_key, st.tuples(id16, digest), ("job_id", "digest")),
    KeyKind.CLAIM: (keys.claim_key, st.tuples(u16, id16, u32), ("shard", "job_id", "generation")),
    KeyKind.FAIL: (keys.fail_key, st.tuples(u16, id16, u32), ("shard", "job_id", "generation")),
    KeyKind.LEASE_INDEX: (
        keys.lease_index_key,
        st.tuples(u64, u16, id16, u32),
        ("bucket", "shard", "job_id", "generation"),
    ),
    KeyKind.DELAY_INDEX: (keys.delay_index_key, st.tuples(u64, u16, id16), ("bucket", "shard", "job_id")),
    KeyKind.RECEIPT: (keys.receipt_key, st.tuples(u16, id16), ("shard", "job_id")),
    KeyKind.DEAD: (keys.dead_key, st.tuples(u16, id16), ("shard", "job_id")),
    KeyKind.TERMIDX: (keys.termidx_key, st.tuples(u64, term, u16, id16), ("bucket", "term", "shard", "job_id")),
    KeyKind.TAIL: (keys.tail_key, st.tuples(u16, id16), ("shard", "job_id")),
    KeyKind.QUARANTINE: (keys.quarantine_key, st.tuples(u64, id16), ("bucket", "qid")),
    KeyKind.BEACON: (keys.beacon_key, st.tuples(id16), ("nonce",)),
}


@st.composite
def built_keys(draw: st.DrawFn) -> tuple[KeyKind, tuple[Any, ...], str]:
    kind = draw(st.sampled_from(sorted(SHAPES, key=lambda k: k.label)))
    build, arguments, _ = SHAPES[kind]
    args = draw(arguments)
    return kind, args, build(*args)


@given(built_keys())
def test_every_built_key_parses_back_to_its_fields(built: tuple[KeyKind, tuple[Any, ...], str]) -> None:
    kind, args, key = built
    parsed = keys.parse_key(key)
    assert (parsed.kind, tuple(getattr(parsed, attr) for attr in SHAPES[kind][2])) == (kind, args)
    assert str(parsed) == key
    assert key.isascii() and key == key.lower()
    # Fields the shape does not have stay None.
    assert sum(value is not None for value in vars(parsed).values()) == 1 + len(args)


def _mutations() -> st.SearchStrategy[str]:
    """Keys with one edit: a character replaced, inserted or deleted somewhere."""

    @st.composite
    def edit(draw: st.DrawFn) -> str:
        _, _, key = draw(built_keys())
        at = draw(st.integers(0, len(key)))
        char = draw(st.sampled_from("0123456789abcdefABCDEF/.rdxz\x00\u00e9"))
        op = draw(st.sampled_from(("replace", "insert", "delete")))
        if op == "insert":
            return key[:at] + char + key[at:]
        if op == "delete":
            return key[:at] + key[at + 1 :]
        return key[:at] + char + key[at + 1 :]

    return edit()


@given(st.one_of(_mutations(), st.text(max_size=120), st.sampled_from([keys.FORMAT_KEY, keys.WATERMARK_KEY])))
def test_any_text_is_a_canonical_key_or_refused_with_invalid_key(text: str) -> None:
    try:
        parsed = keys.parse_key(text)
    except InvalidKey as err:
        assert err.key == text and err.error_class
        return
    assert str(parsed) == text  # accepted means canonical: it re-encodes to itself
    assert keys.parse_key(text.encode()) == parsed


@given(st.binary(max_size=120))
def test_any_bytes_are_a_key_or_refused_with_invalid_key(data: bytes) -> None:
    try:
        parsed = keys.parse_key(data)
    except InvalidKey:
        return
    assert str(parsed).encode() == data


@given(id16, id16, st.integers(0, 15))
def test_shards_nest_as_the_shard_count_doubles(queue_id: bytes, job_id: bytes, bits: int) -> None:
    small, large = keys.shard_of(queue_id, job_id, 1 << bits), keys.shard_of(queue_id, job_id, 1 << (bits + 1))
    assert 0 <= small < 1 << bits
    assert large & ((1 << bits) - 1) == small


@given(u64, st.integers(1, U64_MAX))
def test_bucket_arithmetic_keeps_the_fuzz_targets_bounds(timestamp: int, width: int) -> None:
    floor = timemath.bucket_number(timestamp, width)
    ceiling = timemath.ceiling_bucket(timestamp, width)
    assert floor == timestamp // width and ceiling - floor in (0, 1)
    try:
        bucket, start = timemath.eligibility(timestamp, width)
    except StateExhausted:
        assert ceiling * width > U64_MAX
    else:
        assert bucket == ceiling and start >= timestamp and timemath.bucket_number(start, width) == bucket


@given(id16, id16, st.integers(0, 200), st.integers(1, 10**6), st.integers(0, 10**7), st.booleans())
def test_a_jittered_delay_stays_in_the_upper_half_of_its_ceiling(
    queue_id: bytes, job_id: bytes, attempt: int, base: int, extra: int, jitter: bool
) -> None:
    policy = retry.RetryPolicy(base, base + extra, jitter)
    ceiling = retry.ceiling_ms(policy, attempt)
    delay = retry.retry_delay_ms(policy, queue_id, job_id, attempt)
    assert delay == retry.retry_delay_ms(policy, queue_id, job_id, attempt)
    if attempt == 0:
        assert delay == 0
    elif not jitter:
        assert delay == ceiling
    else:
        assert -(-ceiling // 2) <= delay <= ceiling
