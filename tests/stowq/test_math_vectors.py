"""steadqd.s3.timemath, chain and retry against vectors/math.json, case by case.

A ``null`` in the vectors is a value the reference refuses to produce (a zero
width or a u64 overflow): here that is InvalidInput for the zero width and
StateExhausted for the overflow, never a number.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from steadqd.errors import InvalidInput, StateExhausted
from steadqd.s3 import chain, retry, timemath
from steadqd.s3.chain import AttemptsExhausted, ClaimPlan
from steadqd.s3.timemath import WatermarkWrite
from tests.stowq.vectors import cases, load

_REFUSED = "refused"


def _outcome(width_ns: int | None, compute: Callable[..., Any], *args: int) -> Any:
    """``compute(*args)``, or _REFUSED when it raises the error a null stands for."""
    try:
        return compute(*args)
    except InvalidInput:
        assert width_ns == 0, "InvalidInput for a non-zero width"
        return _REFUSED
    except StateExhausted:
        assert width_ns != 0, "StateExhausted for a zero width"
        return _REFUSED


def _want(value: Any) -> Any:
    return _REFUSED if value is None else value


def _policy(p: dict[str, Any]) -> retry.RetryPolicy:
    return retry.RetryPolicy(p["base_ms"], p["cap_ms"], p["use_jitter"], p["max_delay_ms"])


def test_floor_ceiling_and_eligibility_buckets() -> None:
    bad = []
    for c in cases("math", "bucket_number"):
        got = _outcome(c["width_ns"], timemath.bucket_number, c["timestamp_ns"], c["width_ns"])
        if got != _want(c["bucket"]):
            bad.append(("floor", c, got))
    for c in cases("math", "ceiling_bucket"):
        got = _outcome(c["width_ns"], timemath.ceiling_bucket, c["timestamp_ns"], c["width_ns"])
        if got != _want(c["bucket"]):
            bad.append(("ceiling", c, got))
    for c in cases("math", "eligibility"):
        got = _outcome(c["width_ns"], timemath.eligibility, c["requested_ns"], c["width_ns"])
        want = _REFUSED if c["bucket"] is None else (c["bucket"], c["eligible_ns"])
        if got != want:
            bad.append(("eligibility", c, got))
    assert not bad


def test_bucket_bounds() -> None:
    bad = []
    for c in cases("math", "bucket_bounds"):
        # Bounds of a zero-width bucket exist (0, 0) in the reference: no division happens.
        start = _outcome(None, timemath.bucket_start_ns, c["bucket"], c["width_ns"])
        end = _outcome(None, timemath.bucket_end_ns, c["bucket"], c["width_ns"])
        if (start, end) != (_want(c["start_ns"]), _want(c["end_ns"])):
            bad.append((c, start, end))
    assert not bad


def test_effective_floor_and_bounded_retry_deadlines() -> None:
    bad = []
    for c in cases("math", "effective_floor"):
        got = _outcome(c["width_ns"], timemath.effective_floor, c["floor_ns"], c["watermark_bucket"], c["width_ns"])
        if got != _want(c["effective_floor_ns"]):
            bad.append(("floor", c, got))
    for c in cases("math", "retry_not_before"):
        got = _outcome(None, timemath.retry_not_before, c["floor_ns"], c["delay_ns"])
        if got != _want(c["retry_not_before_ns"]):
            bad.append(("deadline", c, got))
    assert not bad


def test_retry_policy_validation() -> None:
    messages = {"zero_base": "base_ms must be > 0", "cap_too_small": "must be >= base_ms"}
    bad = []
    for c in cases("math", "retry_policy"):
        try:
            policy = _policy(c)
        except InvalidInput as err:
            if c["valid"] or messages[c["error"]] not in err.message:
                bad.append((c, err.message))
            continue
        if not c["valid"] or policy.effective_cap_ms != c["effective_cap_ms"]:
            bad.append((c, policy))
    assert not bad


def test_retry_delays_with_every_hash_draw() -> None:
    delays = cases("math", "retry_delay")
    with_rejections = [c for c in delays if any(not d["accepted"] for d in c.get("draws", ()))]
    assert len(with_rejections) == load("math")["counts"]["retry_delay_with_rejected_draws"]
    bad = []
    for c in delays:
        policy, qid, jid = _policy(c["policy"]), bytes.fromhex(c["queue_id"]), bytes.fromhex(c["job_id"])
        if retry.retry_delay_ms(policy, qid, jid, c["attempt"]) != c["delay_ms"]:
            bad.append((c, "delay"))
        if "ceiling_ms" in c and retry.ceiling_ms(policy, c["attempt"]) != c["ceiling_ms"]:
            bad.append((c, "ceiling"))
        if "draws" not in c:
            continue
        lower, span = retry.jitter_window(c["ceiling_ms"])
        threshold = retry.reject_threshold(span)
        if (lower, span, threshold) != (c["lower_ms"], c["span"], c["reject_threshold"]):
            bad.append((c, "window", lower, span, threshold))
        for draw in c["draws"]:
            sample = retry.jitter_sample(qid, jid, c["attempt"], draw["counter"])
            if (sample, f"{sample:016x}", sample >= threshold) != (
                draw["sample"],
                draw["sample_hex"],
                draw["accepted"],
            ):
                bad.append((c, "draw", draw))
        # Exactly the listed draws are made: the last one is the first accepted.
        assert [d["accepted"] for d in c["draws"]] == [False] * (len(c["draws"]) - 1) + [True]
        if c["draws"][-1]["sample"] % span != c["offset"]:
            bad.append((c, "offset"))
    assert not bad


def test_rejection_sampler() -> None:
    bad = []
    for c in cases("math", "sampler", expected=4):
        if "threshold" in c:
            if retry.reject_threshold(c["span"]) != c["threshold"]:
                bad.append(c)
            continue
        draws = [0] * 64 if c["draws"] == "64 draws of 0" else c["draws"]
        made: list[int] = []

        def draw(counter: int, draws: list[int] = draws, made: list[int] = made) -> int:
            made.append(counter)
            return draws[counter]

        if retry.sample_offset(c["span"], draw) != c["offset"] or made != list(range(len(draws))):
            bad.append((c, made))
    assert not bad


def test_lease_expiry() -> None:
    bad = []
    for c in cases("math", "lease_expiry", expected=11):
        if "tail_generation" in c:  # the empty chain
            if timemath.tail_is_expired(0, None, 0) is not c["expired"]:
                bad.append(c)
            continue
        args = (c["claim_store_time_ns"], c["lease_duration_ns"], c["skew_guard_ns"])
        expired = timemath.is_expired(c["floor_ns"], *args)
        tail_expired = timemath.tail_is_expired(c["floor_ns"], args[:2], c["skew_guard_ns"])
        if (timemath.expiry_ns(*args), expired, tail_expired) != (
            c["expiry_ns_saturating"],
            c["expired"],
            c["expired"],
        ):
            bad.append(c)
    assert not bad


def test_takeover_and_continuation_admissibility() -> None:
    bad = []
    for c in cases("math", "admissibility", expected=10):
        pred = c["predecessor"]
        if "basis" in c:
            b = c["basis"]
            got = timemath.takeover_admissible(
                b["prev_store_time_ns"],
                b["prev_duration_ns"],
                b["observed_watermark_ns"],
                predecessor_store_time_ns=pred["store_time_ns"],
                predecessor_lease_duration_ns=pred["lease_duration_ns"],
            )
        else:
            cont = c["continuation"]
            got = timemath.continuation_admissible(
                cont["worker_id"],
                bytes.fromhex(cont["prev_token"]),
                predecessor_worker_id=pred["worker_id"],
                predecessor_worker_token=bytes.fromhex(pred["worker_token"]),
            )
        if got is not c["admissible"]:
            bad.append(c)
    assert not bad


def test_attempt_accounting() -> None:
    bad = []
    for c in cases("math", "attempt_accounting", expected=8):
        plan = chain.next_claim(c["maximum_attempts"], c["tail_generation"], c["tail_attempt"])
        if c["takeover_written"]:
            want: object = ClaimPlan(**c["claim"])
        else:
            want = AttemptsExhausted(c["dead"]["generation"], c["dead"]["attempt"])
            assert want.reason == c["dead"]["reason"]
        renewal = c.get("renewal_would_be")
        if plan != want:
            bad.append((c, plan))
        elif renewal is not None and chain.renewal(c["tail_generation"], c["tail_attempt"]) != ClaimPlan(**renewal):
            bad.append((c, "renewal"))
        elif "renewal_would_be" in c and renewal is None and c["tail_generation"] != 0:
            bad.append((c, "renewal of a non-empty chain"))
    assert not bad


def test_a_job_may_allow_any_u64_number_of_attempts() -> None:
    # maximum_attempts is a u64 in the job record; only the attempt itself is 32-bit.
    assert chain.next_claim((1 << 64) - 1, 0, 0) == ClaimPlan(generation=1, attempt=1, continuation=False)


def test_watermark_advance() -> None:
    bad = []
    for c in cases("math", "watermark_advance", expected=8):
        stored = None if c["stored_watermark_bucket"] is None else (c["stored_watermark_bucket"], c["stored_sequence"])
        got = timemath.advance_watermark(c["fresh_floor_ns"], c["delayed_bucket_width_ns"], c["skew_guard_ns"], stored)
        advance = c["advance"]
        want_write = None if advance is None else WatermarkWrite(advance["write"])
        if (got.regression, got.floor_bucket, got.raised_floor_ns, got.write) != (
            c["regression"],
            c["floor_bucket"],
            c["raised_floor_ns"],
            want_write,
        ):
            bad.append((c, got))
        elif advance is not None and advance["write"] != "none":
            if (got.bucket, got.sequence) != (advance["highest_observed_wall_bucket"], advance["sequence"]):
                bad.append((c, got))
    assert not bad


def test_nack_deadlines() -> None:
    bad = []
    for c in cases("math", "nack_deadline", expected=5):
        got = retry.nack_deadline(
            _policy(c["policy"]),
            bytes.fromhex(c["queue_id"]),
            bytes.fromhex(c["job_id"]),
            c["attempt"],
            floor_ns=c["floor_ns"],
            delayed_width_ns=c["delayed_bucket_width_ns"],
        )
        if (got.delay_ms, got.retry_not_before_ns, got.delay_index_bucket) != (
            c["delay_ms"],
            c["retry_not_before_ns"],
            c["delay_index_bucket"],
        ):
            bad.append((c, got))
    assert not bad


def _u64_at(data: bytes, i: int) -> int:
    """The fuzz target's reading of its input: 8 bytes from offset i, wrapping around the input."""
    n = max(len(data), 1)
    return int.from_bytes(bytes(data[(i + k) % n] if data else 0 for k in range(8)), "big")


def test_bucket_arithmetic_fuzz_seeds() -> None:
    bad = []
    for c in cases("math", "fuzz_seeds_bucket_arithmetic", expected=7):
        data = bytes.fromhex(c["seed_hex"])
        ts, width, third = _u64_at(data, 0), max(_u64_at(data, 8), 1), _u64_at(data, 16)
        assert (ts, width, third) == (c["timestamp_ns"], c["width_ns"], c["third_u64"])
        elig = c["eligibility"]
        want = (
            c["bucket"],
            c["ceiling_bucket"],
            _REFUSED if elig["bucket"] is None else (elig["bucket"], elig["eligible_ns"]),
            _want(c["bucket_start_ns_of_third"]),
            _want(c["bucket_end_ns_of_third"]),
            _want(c["effective_floor_ns"]),
            _want(c["retry_not_before_ts_plus_width"]),
        )
        got = (
            timemath.bucket_number(ts, width),
            timemath.ceiling_bucket(ts, width),
            _outcome(width, timemath.eligibility, ts, width),
            _outcome(width, timemath.bucket_start_ns, third, width),
            _outcome(width, timemath.bucket_end_ns, third, width),
            _outcome(width, timemath.effective_floor, ts, third, width),
            _outcome(width, timemath.retry_not_before, ts, width),
        )
        if got != want:
            bad.append((c, got))
    assert not bad


@pytest.mark.parametrize(
    ("compute", "error", "message"),
    [
        (
            lambda: timemath.bucket_number(-1, 10),
            InvalidInput,
            r"timestamp_ns must be an integer in 0..18446744073709551615",
        ),
        (lambda: timemath.bucket_number(True, 10), InvalidInput, r"timestamp_ns must be an integer"),
        (lambda: timemath.bucket_number(5, 0), InvalidInput, r"bucket width_ns must be at least 1 ns"),
        (lambda: timemath.bucket_start_ns(1 << 63, 2), StateExhausted, r"start of bucket 9223372036854775808"),
        (
            lambda: chain.next_claim(3, 1 << 32, 0),
            InvalidInput,
            r"tail generation must be an integer in 0..4294967295",
        ),
        (lambda: chain.next_claim(3, (1 << 32) - 1, 0), StateExhausted, r"generation 4294967295 is the last"),
        (lambda: chain.next_claim((1 << 64) - 1, 7, (1 << 32) - 1), StateExhausted, r"attempt would pass 2\^32-1"),
        (lambda: chain.renewal(0, 0), InvalidInput, r"the claim chain is empty"),
        (lambda: timemath.advance_watermark(10, 10, 0, (0, (1 << 64) - 1)), StateExhausted, r"watermark sequence"),
        (lambda: retry.jitter_sample(bytes(15), bytes(16), 1, 0), InvalidInput, r"queue_id must be 16 bytes"),
        (lambda: retry.retry_delay_ms(None, bytes(16), bytes(16), 1), InvalidInput, r"policy must be a RetryPolicy"),  # type: ignore[arg-type]
    ],
)
def test_refusals_name_the_value(compute: Callable[[], object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        compute()
