"""The ready watch of a bucket queue: an idle worker polls with backoff, and a doorbell wakes it early.

Why polling, and why this shape: a bucket sends no events, and the claim
pass (``BucketQueue.claim_once``) LISTs every shard, so polling with claim
passes costs ``shard_count`` LISTs a look (16 with the default FORMAT, about
960 a minute at one look a second). This watch looks instead with *one*
LIST per tick, never more, and wakes the worker (whose next lease makes the
claim pass) only when that LIST shows something that may have become
claimable. The ticks go round three listings:

* ``jobs/``, a page at a time (all shards in one LIST while the queue holds
  fewer than 1,000 job objects): a job key not listed before is news;
* ``delayed/`` and ``leases/``, the advisory indexes, from a cursor: an
  entry whose bucket has started (a delayed job may be due, a lease may have
  expired) is news once when its bucket starts and once when it has ended,
  after which the cursor passes it. Buckets are judged by this host's clock:
  a watch only wakes, the claim decides by store time, so a wrong clock
  costs a wasted look or a later one, never a wrong delivery.

The tick interval starts at ``poll_first_s`` after news and doubles up to
``poll_max_s``, so an idle worker makes at most ``60 / poll_max_s`` LISTs a
minute (30 at the default 2 s), whatever the shard count. The worker's
safety rescan (one claim pass a minute, ``shard_count`` LISTs) comes on
top; docs/stowq.md states the sum. What no listing shows (an index entry
lost, a lease expiring inside its bucket) waits for the bucket's end or
the safety rescan.

The doorbell (``steadqd.s3.doorbell``) makes the same-host case immediate:
a ring wakes the worker at once. A ring costs its sender nothing (a
datagram, no store credentials) and each wake costs the worker a claim pass
(``shard_count`` LISTs), so rings are coalesced and bounded: one is heard at
once, and any that come within ``ring_interval_s`` (``s3.doorbell_interval``,
1 s by default) after it are heard together, once, when it has passed. So
rings add at most one claim pass per interval, idle or busy, however many
come; they leave the poll schedule alone. ``steadq cancel`` rings too: a
rung worker also checks the cancel requests of the jobs it runs (one HEAD
each, so at most ``concurrency`` HEADs per interval; s3/cancel.py).

The polling runs in a thread of its own, so a slow store never stalls the
worker's event loop (its renewals and job output); ``fileno()`` is an
eventfd the thread makes readable when it has news.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from steadqd.errors import InvalidInput, InvalidKey, SteadQError
from steadqd.s3 import keys
from steadqd.s3.doorbell import Doorbell
from steadqd.s3.keys import KeyKind
from steadqd.s3.layout import QueueLayout
from steadqd.s3.timemath import bucket_end_ns, bucket_start_ns

__all__ = [
    "BucketReadyWatch",
    "DEFAULT_POLL_FIRST_S",
    "DEFAULT_POLL_MAX_S",
    "DEFAULT_RING_INTERVAL_S",
    "ReadyNewsOf",
    "check_poll_max",
    "check_ring_interval",
    "idle_lists_per_minute",
]

DEFAULT_POLL_FIRST_S = 0.25
DEFAULT_POLL_MAX_S = 2.0
POLL_MAX_LIMIT_S = 3600.0
DEFAULT_RING_INTERVAL_S = 1.0  # the shortest time between two wakes the doorbell causes
RING_INTERVAL_MIN_S = 0.05
_PAGE = 1000
_SOURCES = ("jobs", "delayed", "leases")
_SEEN_CAP = 1_000_000  # job keys remembered between two rounds of jobs/ (about 100 MB at the cap)


def idle_lists_per_minute(poll_max_s: float, shard_count: int, safety_rescan_s: float = 60.0) -> float:
    """The bound docs/stowq.md states: the watch's ticks plus the worker's safety rescan (a claim pass)."""
    return 60.0 / poll_max_s + shard_count * 60.0 / safety_rescan_s


def check_poll_max(seconds: float) -> float:
    """The poll cap, refused unless a sane number of seconds (it is a YAML setting)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0.05 <= seconds <= POLL_MAX_LIMIT_S:
        raise InvalidInput(f"idle poll cap {seconds!r}: give a number of seconds from 0.05 to {POLL_MAX_LIMIT_S:g}")
    return float(seconds)


def check_ring_interval(seconds: float) -> float:
    """The doorbell's interval, refused unless a sane number of seconds (it is a YAML setting)."""
    ok = isinstance(seconds, int | float) and not isinstance(seconds, bool)
    if not ok or not RING_INTERVAL_MIN_S <= seconds <= POLL_MAX_LIMIT_S:
        raise InvalidInput(
            f"doorbell ring interval {seconds!r}: give a number of seconds from {RING_INTERVAL_MIN_S:g} "
            f"to {POLL_MAX_LIMIT_S:g}"
        )
    return float(seconds)


@dataclass(frozen=True, slots=True)
class ReadyNewsOf:
    """What one ``read()`` found (``steadqd.backend.ReadyNews``)."""

    appeared: bool
    overflowed: bool = False
    left: tuple[str, ...] = ()  # a bucket sends no events of leases leaving
    rung: bool = False  # the doorbell rang: a holder checks its jobs' cancel requests (s3/cancel.py)


class _Cursor:
    """Where an index listing resumes, and the bucket whose start was already news."""

    def __init__(self, prefix: str, width_ns: int, guard_ns: int) -> None:
        self.prefix = prefix
        self.width_ns = width_ns
        self.guard_ns = guard_ns  # a lease is claimable a skew guard after its expiry
        self.after: str | None = None
        self.started: int | None = None
        # The started bucket's end is owed as news even if its entries are gone by then: a sweeper
        # prunes a fully due bucket (its end plus the guard, by store time) before the margin here.
        self.end_owed: int | None = None

    def judge(self, rels: list[str], now_ns: int, margin_ns: int) -> bool:
        """News in one page of the index (entries in key order, so bucket order)."""
        news = False
        owed = self.end_owed
        if owed is not None and bucket_end_ns(owed, self.width_ns) + self.guard_ns + margin_ns <= now_ns:
            news = True
            self.end_owed = None
        for rel in rels:
            try:
                parsed = keys.parse_key(rel)
            except InvalidKey:
                self.after = rel  # not an index key: the repair scan's business
                continue
            bucket = parsed.bucket
            if bucket is None:
                self.after = rel
                continue
            end = bucket_end_ns(bucket, self.width_ns) + self.guard_ns
            if end + margin_ns <= now_ns:
                news = True
                self.after = rel
                continue
            if bucket_start_ns(bucket, self.width_ns) + self.guard_ns <= now_ns and self.started != bucket:
                self.started = self.end_owed = bucket
                news = True
            break
        return news


class BucketReadyWatch:
    """Polls a bucket queue with backoff and listens to its doorbell; see the module docstring."""

    def __init__(
        self,
        layout: QueueLayout,
        *,
        poll_first_s: float = DEFAULT_POLL_FIRST_S,
        poll_max_s: float = DEFAULT_POLL_MAX_S,
        doorbell: bool = True,
        ring_interval_s: float = DEFAULT_RING_INTERVAL_S,
        now_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._layout = layout
        self._ring_interval = check_ring_interval(ring_interval_s)
        self._first = min(float(poll_first_s), check_poll_max(poll_max_s))
        self._max = check_poll_max(poll_max_s)
        self.pause = self._first
        self._now_ns = now_ns
        self._use_doorbell = doorbell
        self._bell: Doorbell | None = None
        self.doorbell_problem: str | None = None
        fmt = layout.format
        margin = layout.skew_guard_ns + 1_000_000_000
        self._margin_ns = margin
        self._indexes = {
            "delayed": _Cursor("delayed/", fmt.delayed_bucket_width_ns, 0),
            "leases": _Cursor("leases/", fmt.lease_bucket_width_ns, layout.skew_guard_ns),
        }
        self._turn = 0
        self._jobs_after: str | None = None
        self._seen: set[str] = set()
        self._round: set[str] = set()
        self.lists = 0  # LIST requests made by ticks, for the bound's tests and the benchmark
        self.rings = 0
        self.errors = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._news = False
        self._rung = False
        self._event = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._stop_r, self._stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._hold_until = 0.0  # monotonic: no tick before this (see hold)

    # Read by steadqd.tasks: the index cursors report delayed jobs and leases as they come
    # due, so a quiet wait needs no claim pass (which would LIST every shard).
    reports_due_jobs = True

    # -- ReadyWatch ------------------------------------------------------------------

    @property
    def ready_estimate(self) -> None:
        """None: counting ready jobs on a bucket would read every job's chain."""
        return None

    def fileno(self) -> int:
        return self._event

    def watch_missing(self) -> list[str]:
        """Start polling (and listening to the doorbell) the first time; nothing can be left unwatched."""
        if self._thread is None and not self._closed:
            if self._use_doorbell:
                self._bell, self.doorbell_problem = Doorbell.bind(self._layout.queue_id.hex())
            self._thread = threading.Thread(target=self._run, name="steadq-bucket-watch", daemon=True)
            self._thread.start()
        return []

    def recount(self) -> None:
        """Nothing to count (see ``ready_estimate``)."""

    def read(self) -> ReadyNewsOf:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._event)
        with self._lock:
            news, self._news = self._news, False
            rung, self._rung = self._rung, False
        return ReadyNewsOf(appeared=news, rung=rung)

    def wait(self, seconds: float) -> bool:
        self.watch_missing()
        readable, _, _ = select.select([self._event], [], [], max(0.0, seconds))
        return bool(readable) and self.read().appeared

    def hold(self, seconds: float) -> None:
        """Make no LIST for ``seconds`` from now (0: from now on, again): its caller is claiming on its own.

        Why: a worker that keeps finding jobs claims round after round and
        never waits on the watch, whose ticks (a ``jobs/`` page of up to
        1,000 keys among them) would only be read after it next finds
        nothing. The caller renews the hold after each round that claimed,
        and ends it after one that found nothing; a tick the hold put off
        comes when it ends, at worst ``seconds`` after the worker went idle,
        and what it lists is judged as ever (an index bucket that started
        meanwhile is news then). Rings are heard as ever.
        """
        with self._lock:
            self._hold_until = time.monotonic() + seconds if seconds > 0 else 0.0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        if self._thread is not None:
            self._thread.join()
        if self._bell is not None:
            self._bell.close()
            self._bell = None
        for fd in (self._event, self._stop_r, self._stop_w):
            os.close(fd)

    # -- one look --------------------------------------------------------------------

    def tick(self) -> bool:
        """One LIST of the next listing in turn; True when it shows news. Sets the next ``pause``."""
        source = _SOURCES[self._turn % len(_SOURCES)]
        self._turn += 1
        try:
            news = self._look_jobs() if source == "jobs" else self._look_index(self._indexes[source])
        except SteadQError as e:  # a store that does not answer: polling goes on, at the cap
            self.errors += 1
            self.last_error = f"{source}/: {e}"
            self.pause = self._max
            return False
        self.pause = self._first if news else min(self.pause * 2, self._max)
        return news

    def _list(self, prefix: str, after: str | None) -> tuple[list[str], str | None]:
        self.lists += 1
        page = self._layout.list_page(prefix, start_after=after, limit=_PAGE)
        rels = [self._layout.relative(meta.key) for meta in page.items]
        more = None if page.next_start_after is None else self._layout.relative(page.next_start_after)
        return rels, more

    def _look_jobs(self) -> bool:
        rels, more = self._list("jobs/", self._jobs_after)
        news = False
        for rel in rels:
            known = rel in self._seen or rel in self._round
            if not known:
                try:
                    if keys.parse_key(rel).kind is not KeyKind.JOB:
                        continue
                except InvalidKey:
                    continue  # not a job key: the repair scan's business
                news = True
            if len(self._round) < _SEEN_CAP:
                self._round.add(rel)  # listed in this round: remembered into the next
        self._jobs_after = more
        if more is None:  # a round is complete: what it did not list is gone (collected)
            self._seen, self._round = self._round, set()
        return news

    def _look_index(self, cursor: _Cursor) -> bool:
        rels, _ = self._list(cursor.prefix, cursor.after)
        return cursor.judge(rels, self._now_ns(), self._margin_ns)

    def ring(self) -> None:
        """A ring heard (the thread calls it at most once per ring interval): news at once.

        It leaves the poll schedule alone, so rings cannot make the watch LIST more often. A ring may
        be a same-host ``steadq cancel``: the news says ``rung`` and the worker checks the requests of
        the jobs it runs (one HEAD each), so a cancel reaches it within the interval."""
        self.rings += 1
        self._signal(rung=True)

    def _signal(self, *, rung: bool = False) -> None:
        with self._lock:
            self._news = True
            self._rung = self._rung or rung
        with contextlib.suppress(OSError):
            os.eventfd_write(self._event, 1)

    # -- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        bell = self._bell.fileno() if self._bell is not None else None
        due = time.monotonic()  # the next tick
        heard = -self._ring_interval  # when a ring was last heard (monotonic)
        pending = False  # a ring came within the interval: heard once the interval has passed
        while True:
            now = time.monotonic()
            timeout = due - now
            fds = [self._stop_r]
            if pending:
                timeout = min(timeout, heard + self._ring_interval - now)
            elif bell is not None:
                fds.append(bell)  # while one is pending, more rings wait in the socket: they add nothing
            readable, _, _ = select.select(fds, [], [], max(0.0, timeout))
            if self._stop_r in readable:
                return
            if bell is not None and bell in readable:
                pending = True
            now = time.monotonic()
            if pending and now >= heard + self._ring_interval:
                assert self._bell is not None
                self._bell.drain()  # every ring that came meanwhile is this one
                pending = False
                heard = now
                self.ring()
            if now >= due:
                with self._lock:
                    held = self._hold_until
                if now < held:
                    due = held  # put off, not skipped: the tick comes when the hold ends (or is renewed then)
                    continue
                if self.tick():
                    self._signal()
                due = time.monotonic() + self.pause
