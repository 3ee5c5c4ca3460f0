"""StowQ/1 attempt accounting: which claim follows the tail of a job's claim chain.

Spec: ``records.md`` (Renewal, retry, bury); ``vectors/math.json``
(attempt_accounting) replays the reference's answers.

A claim chain mixes two kinds of link. A takeover (a first claim, or a claim
after an expiry or a nack) is a new attempt; a renewal is a continuation of
the same attempt by the same worker. So the generation counts every link and
the attempt only the takeovers, and ``maximum_attempts`` limits the attempts:
a long job renewed a thousand times has spent one. The generation is also the
key's 8-hex-digit field, which is where a chain ends (:data:`keys.MAX_GENERATION`).
Pure code: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from steadqd.constants import U32_MAX, U64_MAX, DeadReason
from steadqd.errors import InvalidInput, StateExhausted
from steadqd.s3.keys import MAX_GENERATION
from steadqd.s3.timemath import check_uint

__all__ = ["AttemptsExhausted", "ClaimPlan", "next_claim", "renewal"]


@dataclass(frozen=True)
class ClaimPlan:
    """The next claim to write: its generation (the fencing token), attempt and type."""

    generation: int
    attempt: int
    continuation: bool


@dataclass(frozen=True)
class AttemptsExhausted:
    """No takeover may be written: the job is buried, with this dead reason, at the tail's numbers."""

    generation: int
    attempt: int
    reason: DeadReason = DeadReason.ATTEMPTS_EXHAUSTED


def _next_generation(tail_generation: int) -> int:
    generation = check_uint("tail generation", tail_generation, MAX_GENERATION) + 1
    if generation > MAX_GENERATION:
        raise StateExhausted(f"the claim chain is full: generation {tail_generation} is the last a claim key can hold")
    return generation


def next_claim(maximum_attempts: int, tail_generation: int, tail_attempt: int) -> ClaimPlan | AttemptsExhausted:
    """What a takeover after the tail claim (generation 0: no chain yet) writes.

    A takeover at ``tail_attempt == maximum_attempts`` is not written; the
    actor buries the job instead, so a job never runs more than
    ``maximum_attempts`` times however often its workers die.
    """
    check_uint("maximum_attempts", maximum_attempts, U64_MAX)
    check_uint("tail attempt", tail_attempt, U32_MAX)
    if tail_attempt >= maximum_attempts:
        tail = check_uint("tail generation", tail_generation, MAX_GENERATION)
        return AttemptsExhausted(generation=tail, attempt=tail_attempt)
    if tail_attempt == U32_MAX:
        raise StateExhausted(f"attempt would pass 2^32-1 (the tail's attempt is {tail_attempt})")
    return ClaimPlan(generation=_next_generation(tail_generation), attempt=tail_attempt + 1, continuation=False)


def renewal(tail_generation: int, tail_attempt: int) -> ClaimPlan:
    """The continuation claim that renews the tail: next generation, same attempt."""
    if check_uint("tail generation", tail_generation, MAX_GENERATION) == 0:
        raise InvalidInput("there is no claim to renew: the claim chain is empty (tail generation 0)")
    return ClaimPlan(
        generation=_next_generation(tail_generation),
        attempt=check_uint("tail attempt", tail_attempt, U32_MAX),
        continuation=True,
    )
