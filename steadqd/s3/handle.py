"""``BucketQueue``: one open bucket queue, with the method names and meanings of ``steadqd.backend.Backend``.

Why a facade over the transition modules: the daemons and the command line
talk to every queue through one contract, so a bucket queue answers the
same calls (enqueue, lease, renew, ack, retry, bury, read_payload) with the
same outcome classes: ``NotCommitted`` when provably nothing happened,
``OutcomeUnknown`` (with the key to read) when even resolution failed,
``LeaseLost`` when the lease's generation is no longer the job's. The
handle keeps only caches that are safe to lose: the floor (a lower bound of
store time, re-established after ``floor_staleness_s``), and which jobs it
has seen settled (settled is forever, so a scan skips them; entries expire
after ``TERMINAL_MEMO_S`` because a collected id may be enqueued again).

What a bucket queue does not carry, it refuses rather than drops: StowQ/1
job records have no metadata map, producer id or trace context.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

from steadqd.backoff import RetryPolicy
from steadqd.constants import ID_BYTES, AckResult, DeadReason
from steadqd.errors import (
    EnqueueIncomplete,
    InvalidInput,
    InvalidKey,
    LeaseLost,
    NotCommitted,
    OutcomeUnknown,
    SteadQError,
)
from steadqd.queue_control import PauseState, new_pause
from steadqd.s3 import keys
from steadqd.s3.claim import Miss, claim_job
from steadqd.s3.clock import FloorClock
from steadqd.s3.control import clear_pause, read_pause, write_pause
from steadqd.s3.doorbell import ring
from steadqd.s3.keys import KeyKind
from steadqd.s3.layout import QueueLayout, init_layout, open_layout
from steadqd.s3.lease import Lease, renew
from steadqd.s3.publish import Enqueued, enqueue
from steadqd.s3.quarantine import flag
from steadqd.s3.records import QuarantineReason
from steadqd.s3.settle import ack, bury, read_payload, retry
from steadqd.s3.store.base import ObjectMeta, ObjectStore
from steadqd.s3.unique import enqueue_unique

__all__ = ["BATCH_MAX", "BATCH_THREADS", "BucketQueue", "TERMINAL_MEMO_S", "seconds_ns"]

TERMINAL_MEMO_S = 60.0
_TERMINAL_MEMO_CAP = 100_000
_HANDLE_OPTIONS = ("floor_staleness_s", "monotonic", "sleep", "first_shard", "batch_threads")
# lease_many: at most this many jobs a round, and this many claims in flight
# at once by default. A claim is seven sequential round trips that mostly
# wait on the store, so a few threads overlap them.
BATCH_MAX = 1000
BATCH_THREADS = 8
# An idle lease(wait=...) lists every shard, then sleeps this long, doubling up to the cap.
_POLL_FIRST_S = 0.05
_POLL_CAP_S = 2.0


def seconds_ns(what: str, seconds: float) -> int:
    """A duration in seconds as whole nanoseconds, refused unless finite and not negative."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds <= 2**62 / 1e9:
        raise InvalidInput(f"{what} {seconds!r}: give a finite number of seconds, 0 or more")
    return round(seconds * 1_000_000_000)


def _payload_bytes(payload: Any) -> bytes:
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload)
    if hasattr(payload, "read"):
        data = payload.read()
        if isinstance(data, bytes):
            return data
    raise InvalidInput(f"a payload must be bytes or a binary file object, not {type(payload).__name__}")


class BucketQueue:
    """A StowQ/1 queue on one object store; build it with :meth:`init` or :meth:`open`."""

    def __init__(
        self,
        layout: QueueLayout,
        *,
        floor_staleness_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        first_shard: int | None = None,
        batch_threads: int = BATCH_THREADS,
    ) -> None:
        if isinstance(batch_threads, bool) or not isinstance(batch_threads, int) or not 1 <= batch_threads <= 64:
            raise InvalidInput(f"batch_threads {batch_threads!r}: give a whole number from 1 to 64")
        self._layout = layout
        self._clock = FloorClock(layout, staleness_s=floor_staleness_s, monotonic=monotonic)
        self._monotonic = monotonic
        self._sleep = sleep
        self._terminal: dict[tuple[int, bytes], float] = {}
        self._lock = threading.Lock()
        # Workers start their scans at different shards so that they rarely race for the same job.
        start = int.from_bytes(os.urandom(2), "big") if first_shard is None else first_shard
        self._next_shard = start % layout.format.shard_count
        # Likewise inside a shard: each listing is tried from a random point, so that workers
        # listing the same shard do not all race for its first job (unless first_shard pins the order).
        self._spread = first_shard is None
        # And they walk the shards with strides of their own (any odd stride visits every shard of a
        # power-of-two count once a pass), so that a worker does not trail another from shard to shard.
        self._stride = 1 | int.from_bytes(os.urandom(2), "big") if self._spread else 1
        self._candidates: deque[tuple[int, bytes]] = deque()
        # Jobs found not ready at the floor in _held_at. Readiness follows from the floor and objects that are
        # only ever added (a claim, a nack, a settle never make a job ready sooner), so under the same
        # floor the answer cannot change: re-reading such a job (four requests) is skipped until the floor moves.
        self._held: set[tuple[int, bytes]] = set()
        self._held_at = -1
        self._others_settle = False
        self._batch_threads = batch_threads
        self._pool: ThreadPoolExecutor | None = None
        self._floor_lock = threading.Lock()

    @classmethod
    def init(cls, store: ObjectStore, prefix: str = "", **options: Any) -> BucketQueue:
        handle = {k: options.pop(k) for k in _HANDLE_OPTIONS if k in options}
        return cls(init_layout(store, prefix, **options), **handle)

    @classmethod
    def open(cls, store: ObjectStore, prefix: str = "", **options: Any) -> BucketQueue:
        handle = {k: options.pop(k) for k in _HANDLE_OPTIONS if k in options}
        return cls(open_layout(store, prefix, **options), **handle)

    # -- identity --------------------------------------------------------------------

    @property
    def layout(self) -> QueueLayout:
        return self._layout

    @property
    def path(self) -> str:
        return self._layout.location

    @property
    def queue_id(self) -> str:
        return self._layout.queue_id.hex()

    @property
    def poisoned(self) -> str | None:
        """Never: every unknown outcome is resolved by reading its key, so the handle stays usable."""
        return None

    def wall_floor_ns(self) -> int:
        return self._floor()

    # -- producing -------------------------------------------------------------------

    def enqueue(
        self,
        payload: Any,
        *,
        max_attempts: int = 3,
        content_type: str = "application/octet-stream",
        metadata: Mapping[str, bool | int | str | bytes] | None = None,
        producer_id: str | None = None,
        trace_context: bytes | None = None,
        delay: float = 0.0,
        not_before_ns: int | None = None,
        job_id: str | None = None,
        unique: str | None = None,
    ) -> str:
        """Publish one job; with ``job_id`` (32 hex) a repeated enqueue of the same job is idempotent.

        With ``unique`` the id is the key's (steadqd.s3.unique) and a second enqueue of the key while its
        job is in the queue is DuplicateJob naming it."""
        if unique is not None and job_id is not None:
            raise InvalidInput("give either job_id or unique, not both: a unique job's id is derived from its key")
        for name, value in (("metadata", metadata), ("producer_id", producer_id), ("trace_context", trace_context)):
            if value:
                raise InvalidInput(
                    f"{name} cannot be stored in a bucket queue (StowQ/1 job records have no such field)"
                )
        if delay and not_before_ns is not None:
            raise InvalidInput("give either delay or not_before_ns, not both")
        due = not_before_ns
        if delay:
            due = self._floor() + seconds_ns("delay", delay)
        raw_id = None
        if job_id is not None:
            try:
                raw_id = bytes.fromhex(job_id)
            except ValueError:
                raise InvalidInput(f"job_id {job_id!r} is not 32 hex digits") from None
        body = _payload_bytes(payload)

        def publish(chosen: bytes | None) -> Enqueued:
            return enqueue(
                self._layout,
                body,
                content_type=content_type,
                maximum_attempts=max_attempts,
                job_id=chosen,
                not_before_ns=due,
            )

        done = publish(raw_id) if unique is None else enqueue_unique(self._layout, unique, publish)
        if due is None:
            ring(self.queue_id)  # best effort, never raises: a waiting worker on this host looks now
        return done.job_id.hex()

    def enqueue_many(self, payloads: Iterable[Any], **options: Any) -> list[str]:
        """One job per payload, in order; a failure after the first is EnqueueIncomplete naming those published."""
        published: list[str] = []
        for payload in payloads:
            try:
                published.append(self.enqueue(payload, **options))
            except (NotCommitted, OutcomeUnknown) as exc:
                if not published:
                    raise
                raise EnqueueIncomplete(published, exc) from exc
        return published

    # -- consuming -------------------------------------------------------------------

    def _floor(self) -> int:
        """The handle's floor; the threads that find it stale together wait for one of them to renew it.

        A batch's jobs are acked concurrently, and each would otherwise make
        its own beacon, store-time read and watermark read when the floor is due.
        """
        with self._floor_lock:
            return self._clock.floor()

    def _lease_ns(self, duration: float) -> int:
        ns = seconds_ns("lease duration", duration)
        minimum = self._layout.store.profile.granularity_ns + self._layout.skew_guard_ns
        if ns < minimum:
            raise InvalidInput(
                f"lease duration {duration!r} s is shorter than this store allows ({minimum} ns: its time "
                "granularity plus the skew guard, time.md); give a longer lease"
            )
        return ns

    def _settled(self, shard: int, job_id: bytes) -> bool:
        with self._lock:
            seen = self._terminal.get((shard, job_id))
            return seen is not None and self._monotonic() - seen < TERMINAL_MEMO_S

    def _remember_settled(self, shard: int, job_id: bytes) -> None:
        with self._lock:
            if len(self._terminal) >= _TERMINAL_MEMO_CAP:
                self._terminal.clear()
            self._terminal[(shard, job_id)] = self._monotonic()

    def _listed(self, kind: KeyKind, prefix: str) -> Iterator[tuple[bytes, ObjectMeta]]:
        """The job ids of the ``kind`` keys listed under ``prefix``, with their listing entries, every page."""
        after: str | None = None
        while True:
            page = self._layout.list_page(prefix, start_after=after)
            for meta in page.items:
                try:
                    parsed = keys.parse_key(self._layout.relative(meta.key))
                except InvalidKey:
                    continue  # not a key of the grammar: the repair scan's business, never a delivery
                if parsed.kind is kind and parsed.job_id is not None:
                    yield parsed.job_id, meta
            if page.next_start_after is None:
                return
            after = self._layout.relative(page.next_start_after)

    def _list_shard(self, shard: int) -> list[bytes]:
        """The job ids listed in one shard that this handle has not seen settled.

        Once another participant has been seen settling jobs (a candidate
        came back terminal), the shard's receipts are listed too: one LIST
        instead of a HEAD for every job some other worker already acked.
        """
        ids = [
            j
            for j, meta in self._listed(KeyKind.JOB, _shard_prefix(keys.job_key, shard))
            if not self._settled(shard, j) and self._fits(shard, j, meta)
        ]
        if self._others_settle and ids:
            done = {j for j, _ in self._listed(KeyKind.RECEIPT, _shard_prefix(keys.receipt_key, shard))}
            ids = [j for j in ids if j not in done]
        return ids

    def _fits(self, shard: int, job_id: bytes, meta: ObjectMeta) -> bool:
        """Whether a listed job object may be a job record; one too big is flagged from its listed size.

        So an oversized object under ``jobs/`` is never fetched at all, by
        this worker or by the next one started: the listing says its size.
        """
        layout = self._layout
        if meta.size <= layout.record_limit:
            return True
        rel = layout.relative(meta.key)
        flag(
            layout,
            rel,
            QuarantineReason.ENVELOPE_CORRUPT,
            meta.store_time_ns,
            job_id=job_id,
            why=layout.oversized(rel, meta.size, layout.record_limit),
        )
        self._remember_settled(shard, job_id)
        return False

    def _try_outcome(self, shard: int, job_id: bytes, floor_ns: int, lease_ns: int) -> Lease | Miss | SteadQError:
        """:meth:`_try` on this thread, the store's failure as a value (as :func:`_outcome` for the pool's)."""
        try:
            return self._try(shard, job_id, floor_ns, lease_ns)
        except SteadQError as exc:
            return exc

    def _try(self, shard: int, job_id: bytes, floor_ns: int, lease_ns: int) -> Lease | Miss:
        got = claim_job(self._layout, shard, job_id, floor_ns=floor_ns, lease_duration_ns=lease_ns)
        if got is Miss.TERMINAL:
            self._others_settle = True
        if got in (Miss.TERMINAL, Miss.UNUSABLE):
            self._remember_settled(shard, job_id)  # an unusable job is quarantined: skipped like a settled one
        elif got is Miss.NOT_READY:
            with self._lock:
                if self._held_at == floor_ns and len(self._held) < _TERMINAL_MEMO_CAP:
                    self._held.add((shard, job_id))
        return got

    def claim_once(self, duration: float = 30.0) -> Lease | None:
        """Claim one ready job, or None after one pass over every shard found nothing."""
        got = self._claim_round(1, self._lease_ns(duration))
        return got[0] if got else None

    def _claim_round(self, n: int, lease_ns: int) -> list[Lease]:
        """Up to ``n`` claims from the candidates, then from one pass over the shards, under one floor.

        The ids of a shard's listing are kept as candidates for the next
        calls, so a busy worker lists a shard once per pass, not once per
        job; a candidate proves nothing (the claim re-reads every object).
        Shards are listed until there are as many candidates as claims
        still wanted (or every shard was listed), and the candidates are then
        tried in a wave of at most that many.
        """
        floor_ns = self._floor()
        with self._lock:
            if floor_ns != self._held_at:
                self._held, self._held_at = set(), floor_ns
            held = self._held
        claims: list[Lease] = []
        count = self._layout.format.shard_count
        listed = 0
        while len(claims) < n:
            if len(self._candidates) < n - len(claims) and listed < count:
                shard = self._next_shard
                self._next_shard = (shard + self._stride) % count
                listed += 1
                ids = self._list_shard(shard)
                if self._spread and len(ids) > 1:
                    start = int.from_bytes(os.urandom(4), "big") % len(ids)
                    ids = ids[start:] + ids[:start]
                self._candidates.extend((shard, job_id) for job_id in ids if (shard, job_id) not in held)
                continue
            if not self._candidates:
                break
            wave = [self._candidates.popleft() for _ in range(min(n - len(claims), len(self._candidates)))]
            if self._probe(wave, floor_ns, lease_ns, claims):
                break
        return claims

    def _probe(self, wave: list[tuple[int, bytes]], floor_ns: int, lease_ns: int, claims: list[Lease]) -> bool:
        """Try every candidate of ``wave``, adding the claims won to ``claims``; True if the round must stop.

        A claim that fails (NotCommitted, OutcomeUnknown, a store fault) never
        costs its wave-mates theirs: every claim won is returned and the
        round stops there. With nothing won, the first failure is raised;
        the failed candidate is listed again by a later pass. A race lost
        means another worker is taking jobs from that shard right now, so
        the shard's other candidates are left to it for this pass.
        """
        outcomes: list[Lease | Miss | SteadQError] = []
        if len(wave) == 1 or self._batch_threads == 1:
            for shard, job_id in wave:
                outcomes.append(self._try_outcome(shard, job_id, floor_ns, lease_ns))
                if isinstance(outcomes[-1], SteadQError):
                    break
        else:
            # The first claim runs on this thread, which would otherwise only wait: one hand-off to the
            # pool and back fewer a wave.
            pool = self._executor()
            futures = [pool.submit(self._try, shard, job_id, floor_ns, lease_ns) for shard, job_id in wave[1:]]
            outcomes.append(self._try_outcome(wave[0][0], wave[0][1], floor_ns, lease_ns))
            outcomes += [_outcome(future) for future in futures]
        claims.extend(o for o in outcomes if isinstance(o, Lease))
        # Not strict: trying in turn stops at the first failure, so outcomes may be shorter than the wave.
        contended = {shard for (shard, _), o in zip(wave, outcomes, strict=False) if o is Miss.LOST}
        if contended:
            self._candidates = deque(c for c in self._candidates if c[0] not in contended)
        failures = [o for o in outcomes if isinstance(o, SteadQError)]
        if failures and not claims:
            raise failures[0]
        return bool(failures)

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._batch_threads, thread_name_prefix="steadq-claim")
            return self._pool

    def _poll(self, n: int, duration: float, wait: float) -> list[Lease]:
        lease_ns = self._lease_ns(duration)
        deadline = self._monotonic() + seconds_ns("wait", max(0.0, wait)) / 1e9
        pause = _POLL_FIRST_S
        while True:
            got = self._claim_round(n, lease_ns)
            left = deadline - self._monotonic()
            if got or left <= 0:
                return got
            self._sleep(min(pause, left))
            pause = min(pause * 2, _POLL_CAP_S)

    def lease(self, wait: float = 0.0, duration: float = 30.0) -> Lease | None:
        """Claim one job for ``duration`` s; with ``wait`` > 0, poll with backoff until one is ready."""
        got = self._poll(1, duration, wait)
        return got[0] if got else None

    def lease_many(self, n: int, duration: float = 30.0, *, wait: float = 0.0) -> list[Lease]:
        """Claim up to ``n`` ready jobs in one round; an empty list when none was ready (after ``wait``).

        Why a batch: one floor and the shard listings serve every claim of the
        round, and the claims of a wave are in flight together (over
        ``batch_threads`` threads), so a worker waits for the store once a
        wave instead of once a job. Each claim is the one claim of
        :func:`steadqd.s3.claim.claim_job`, with its own generation, lease
        and fencing: StowQ/1 has no atomic batches. A holder renews only the
        job it runs, so ``n`` jobs should fit in one lease: the rest of the
        batch ages out and is taken over by the ordinary rules.
        """
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= BATCH_MAX:
            raise InvalidInput(f"lease_many: n {n!r} must be a whole number from 1 to {BATCH_MAX}")
        return self._poll(n, duration, wait)

    # -- pausing (steadqd.s3.control) ---------------------------------------------------

    def pause_state(self) -> PauseState | None:
        """The queue's pause, read from the store now (one GET); None if it is not paused."""
        return read_pause(self._layout)

    def pause(self, reason: str = "") -> PauseState:
        """Pause the queue for every host (workers stop claiming at their next pass; producers go on)."""
        state = new_pause(reason, self._floor())
        write_pause(self._layout, state)
        return state

    def resume(self) -> PauseState | None:
        """Remove the pause; returns the pause that was in force (None if there was none)."""
        was = read_pause(self._layout)
        if not clear_pause(self._layout):
            return None
        ring(self.queue_id)  # best effort: a paused worker on this host looks now (others: PAUSED_BUCKET_LOOK)
        return was

    def renew(self, lease: Lease, duration: float = 30.0) -> Lease:
        return renew(self._layout, lease, floor_ns=self._floor(), lease_duration_ns=self._lease_ns(duration))

    def ack(self, lease: Lease) -> AckResult:
        result = ack(self._layout, lease, floor_ns=self._floor())
        self._remember_settled(lease.shard, lease.job_id_bytes)
        return result

    def retry(self, lease: Lease, delay: float | None = None, *, policy: RetryPolicy | None = None) -> str:
        """Give the job back; returns "delayed", or "dead" when no attempt was left.

        As in the reference, the job is taken again once its retry deadline
        has passed *and* this lease has expired: the takeover's basis proves an expiry.
        """
        delay_ns = None if delay is None else seconds_ns("retry delay", delay)
        return retry(self._layout, lease, floor_ns=self._floor(), delay_ns=delay_ns, policy=policy)

    def bury(self, lease: Lease, reason: int = DeadReason.CONSUMER_REJECTED) -> None:
        if not 0 <= reason <= 0xFFFF:
            raise InvalidInput(f"dead reason {reason} is not a u16 code (reasons.md)")
        bury(self._layout, lease, floor_ns=self._floor(), reason=reason)
        self._remember_settled(lease.shard, lease.job_id_bytes)

    def read_payload(self, lease: Lease) -> bytes:
        if not isinstance(lease, Lease):
            raise LeaseLost(f"{lease!r} is not a lease of a bucket queue")
        return read_payload(self._layout, lease.job, lease.job_store_time_ns)

    def copy_payload(self, lease: Lease, out: BinaryIO) -> int:
        data = self.read_payload(lease)
        out.write(data)
        return len(data)

    def job_key(self, job_id: str) -> str:
        raw = bytes.fromhex(job_id)
        return keys.job_key(keys.shard_of(self._layout.queue_id, raw, self._layout.format.shard_count), raw)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self._layout.store.close()


def _shard_prefix(key_of: Callable[[int, bytes], str], shard: int) -> str:
    """``jobs/<shard>/``, ``receipts/<shard>/``: the listing prefix of one shard of a plane."""
    return key_of(shard, bytes(ID_BYTES)).rpartition("/")[0] + "/"


def _outcome(future: Future[Lease | Miss]) -> Lease | Miss | SteadQError:
    """A claim's result, or the store's failure as a value (anything else is a bug and is raised)."""
    try:
        return future.result()
    except SteadQError as exc:
        return exc
