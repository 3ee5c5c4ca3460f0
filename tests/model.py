"""A pure in-memory model of one SteadQ/1 queue's observable behaviour.

The model is the oracle of the stateful property test
(``tests/integration/test_model.py``): it knows nothing about files,
syscalls or clocks, only the state machine of protocol.md ("Identity changes
per transition"). Keeping it free of I/O means a divergence between it and
the real queue is either a library bug or a misreading of the spec, never a
shared implementation mistake.

Rules encoded here (protocol.md):

* enqueue → ready (or delayed) with generation 0, attempt 0;
* claim → leased: generation + 1, attempt + 1, a fresh token;
* a ready job whose attempt ≥ maximum_attempts is never leased: the scan
  that meets it moves it to dead with reason 0x0004 (generation + 1);
* renew: generation + 1, same token and attempt;
* ack / retry / bury: generation + 1, attempt unchanged; retry of a lease
  whose attempt ≥ maximum_attempts buries with reason 0x0004 instead;
* a lease is usable only while its job is still leased under exactly that
  (token, generation); once the job moved on the lease is lost, except that
  acknowledging the very lease that produced the receipt again answers
  "already acked" (duplicate-ack probe).

What the model cannot predict it is *told*: which ready job a claim picked
(the scan order is pseudo-random), the token it drew, and the exact
not-before instant the queue stamped from its wall floor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ATTEMPTS_EXHAUSTED = 0x0004
"""Dead reason of a job that ran out of attempts (reasons.md)."""

MetaValue = bool | int | str | bytes


class ModelLeaseLost(Exception):
    """The model's verdict: the real queue must raise LeaseLost here."""


class ModelMisuse(AssertionError):
    """The test told the model something its own state rules out.

    Raised for facts reported by the real queue (e.g. "job X was leased")
    that contradict the model; an AssertionError so the property test fails.
    """


# --------------------------------------------------------------------------- states


@dataclass(frozen=True)
class Ready:
    """Claimable (unless its attempts are exhausted)."""


@dataclass(frozen=True)
class Leased:
    """Owned by the lease with this token."""

    token: bytes


@dataclass(frozen=True)
class Delayed:
    """Waiting until ``not_before`` (Unix ns, as stamped by the queue)."""

    not_before: int


@dataclass(frozen=True)
class Dead:
    """Dead-lettered with a u16 reason."""

    reason: int


@dataclass(frozen=True)
class Acked:
    """Acknowledged: a receipt that keeps the acknowledging lease's token."""

    token: bytes


JobState = Ready | Leased | Delayed | Dead | Acked

STATE_WORD: dict[type, str] = {Ready: "ready", Leased: "leased", Delayed: "delayed", Dead: "dead", Acked: "receipt"}
"""The state words of the on-disk grammar (``steadqd.State`` values)."""


@dataclass
class ModelJob:
    """Everything observable about one job: its immutable content and its identity."""

    job_id: str
    payload: bytes
    max_attempts: int
    content_type: str
    metadata: dict[str, MetaValue]
    state: JobState
    generation: int = 0
    attempt: int = 0


@dataclass(frozen=True)
class ModelLease:
    """What a lease object proves: the job's identity at the moment it was issued or renewed."""

    job_id: str
    generation: int
    attempt: int
    max_attempts: int
    token: bytes


@dataclass(frozen=True)
class Observed:
    """One job as seen in the tree; ``detail`` is the state-specific name field.

    ready → None, leased → token, delayed → not_before, dead → reason,
    receipt → token. Deadlines of leases are clock values and not modelled.
    """

    state: str
    generation: int
    attempt: int
    max_attempts: int
    detail: object


LeaseStanding = Literal["current", "acked_by_it", "lost"]


@dataclass
class QueueModel:
    """The whole queue: job id → job. No I/O, no clocks, no randomness."""

    jobs: dict[str, ModelJob] = field(default_factory=dict)

    # -- queries ------------------------------------------------------------

    def ids(self, state: type) -> set[str]:
        """Ids of the jobs currently in ``state`` (one of the state classes)."""
        return {j.job_id for j in self.jobs.values() if isinstance(j.state, state)}

    def claimable(self) -> set[str]:
        """Ready jobs a claim may lease (attempts left)."""
        return {j.job_id for j in self.jobs.values() if isinstance(j.state, Ready) and j.attempt < j.max_attempts}

    def exhausted_ready(self) -> set[str]:
        """Ready jobs a claim must dead-letter instead of leasing."""
        return {j.job_id for j in self.jobs.values() if isinstance(j.state, Ready) and j.attempt >= j.max_attempts}

    def job(self, job_id: str) -> ModelJob:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise ModelMisuse(f"unknown job {job_id}") from None

    def standing(self, lease: ModelLease) -> LeaseStanding:
        """Whether ``lease`` still owns its job, produced its receipt, or is lost."""
        job = self.job(lease.job_id)
        st = job.state
        if isinstance(st, Leased) and st.token == lease.token and job.generation == lease.generation:
            return "current"
        if isinstance(st, Acked) and st.token == lease.token and job.generation == lease.generation + 1:
            return "acked_by_it"
        return "lost"

    def observe(self) -> dict[str, Observed]:
        """The tree as the model expects a directory walk to find it."""
        out: dict[str, Observed] = {}
        for j in self.jobs.values():
            st = j.state
            detail: object = None
            if isinstance(st, Leased | Acked):
                detail = st.token
            elif isinstance(st, Delayed):
                detail = st.not_before
            elif isinstance(st, Dead):
                detail = st.reason
            out[j.job_id] = Observed(STATE_WORD[type(st)], j.generation, j.attempt, j.max_attempts, detail)
        return out

    # -- transitions --------------------------------------------------------

    def enqueue(
        self,
        job_id: str,
        payload: bytes,
        *,
        max_attempts: int,
        content_type: str,
        metadata: dict[str, MetaValue],
        not_before: int | None = None,
    ) -> None:
        """enqueue_immediate / enqueue_delayed: generation 0, attempt 0."""
        if job_id in self.jobs:
            raise ModelMisuse(f"job id {job_id} issued twice")
        if max_attempts < 1:
            raise ModelMisuse("maximum_attempts must be ≥ 1")
        state: JobState = Ready() if not_before is None else Delayed(not_before)
        self.jobs[job_id] = ModelJob(job_id, payload, max_attempts, content_type, dict(metadata), state)

    def claim(self, job_id: str, token: bytes) -> ModelLease:
        """The queue reports it leased ``job_id`` with ``token``: it must have been claimable."""
        if job_id not in self.claimable():
            raise ModelMisuse(f"job {job_id} was leased but the model has it as {self.job(job_id).state!r}")
        if any(isinstance(j.state, Leased | Acked) and j.state.token == token for j in self.jobs.values()):
            raise ModelMisuse(f"lease token {token.hex()} issued twice")
        job = self.jobs[job_id]
        job.generation += 1
        job.attempt += 1
        job.state = Leased(token)
        return self._lease_of(job)

    def cleanup_exhausted(self, job_id: str) -> None:
        """exhausted_ready_cleanup: ready → dead(0x0004), generation + 1, attempt unchanged."""
        if job_id not in self.exhausted_ready():
            raise ModelMisuse(f"job {job_id} was dead-lettered by a scan but is not exhausted-ready in the model")
        job = self.jobs[job_id]
        job.generation += 1
        job.state = Dead(ATTEMPTS_EXHAUSTED)

    def renew(self, lease: ModelLease) -> ModelLease:
        """renew: generation + 1, same token; returns the renewed lease."""
        job = self._current(lease)
        job.generation += 1
        return self._lease_of(job)

    def ack(self, lease: ModelLease) -> Literal["acked", "already_acked"]:
        """acknowledge: leased → receipt, generation + 1; a repeat of the same lease is idempotent."""
        if self.standing(lease) == "acked_by_it":
            return "already_acked"
        job = self._current(lease)
        job.generation += 1
        job.state = Acked(lease.token)
        return "acked"

    def retry(self, lease: ModelLease, *, not_before: int | None = None) -> Literal["ready", "delayed", "dead"]:
        """retry_now (``not_before`` None) or retry_later; exhausted leases are buried (0x0004).

        For retry_later the caller supplies the instant the queue stamped,
        since it derives from the queue's wall floor.
        """
        job = self._current(lease)
        job.generation += 1
        if job.attempt >= job.max_attempts:
            job.state = Dead(ATTEMPTS_EXHAUSTED)
            return "dead"
        if not_before is None:
            job.state = Ready()
            return "ready"
        job.state = Delayed(not_before)
        return "delayed"

    def retry_would_bury(self, lease: ModelLease) -> bool:
        """True if a retry of this (current) lease must dead-letter instead."""
        return lease.attempt >= lease.max_attempts

    def bury(self, lease: ModelLease, reason: int) -> None:
        """bury: leased → dead(reason), generation + 1."""
        if not 0 <= reason <= 0xFFFF:
            raise ModelMisuse(f"bury reason {reason} is not a u16")
        job = self._current(lease)
        job.generation += 1
        job.state = Dead(reason)

    def external_exhaust(self, job_id: str) -> None:
        """A foreign writer leaves ``job_id`` ready with no attempts left (generation + 1).

        Not a transition of the library's API: it models an object such as
        another implementation could leave behind, so that the scan's
        exhausted_ready_cleanup is exercised.
        """
        job = self.job(job_id)
        if not isinstance(job.state, Ready):
            raise ModelMisuse(f"job {job_id} is not ready")
        job.generation += 1
        job.attempt = job.max_attempts

    # -- helpers ------------------------------------------------------------

    def _current(self, lease: ModelLease) -> ModelJob:
        if self.standing(lease) != "current":
            raise ModelLeaseLost(f"lease of {lease.job_id} (g{lease.generation}) no longer owns the job")
        return self.jobs[lease.job_id]

    @staticmethod
    def _lease_of(job: ModelJob) -> ModelLease:
        assert isinstance(job.state, Leased)
        return ModelLease(job.job_id, job.generation, job.attempt, job.max_attempts, job.state.token)
