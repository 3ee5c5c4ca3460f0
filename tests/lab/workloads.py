"""Workloads for the crash lab: a setup (not recorded) and a recorded run.

Every public call of a recorded run goes through :meth:`Driver.call`, which
takes the op index before the call and after it returned (the *commit mark*)
and the job states before and after (read with the independent tree walker,
outside the Linux layer, so it does not appear in the trace). The difference
is the call's effect; a call's effect is committed at every crash point at or
after its return mark.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

from steadqd import Lease, Queue
from steadqd.constants import NS_PER_SECOND, State
from steadqd.fs import linux, publish
from steadqd.fs.recovery import run_recovery
from tests.invariants import check_tree

from .gates import Expectation, JobState, JobView, after_recovery
from .recorder import Session


@dataclass(frozen=True)
class Call:
    """One recorded public call: ops [begin, end) are its own."""

    label: str
    begin: int
    end: int
    effects: dict[str, JobView | None]  # job -> what it is after the call (None: gone)


def expectation_at(calls: list[Call], initial: dict[str, JobView], payloads: dict[str, bytes], k: int) -> Expectation:
    """What recovery must produce after a crash at op index ``k`` (in whichever log the marks index)."""
    committed: dict[str, JobView | None] = dict(initial)
    inflight: Call | None = None
    for c in calls:
        if c.end <= k:
            committed.update(c.effects)
        elif c.begin < k:
            inflight = c
            break
        else:
            break
    known = set(initial).union(*(c.effects for c in calls))
    allowed: dict[str, frozenset[JobState]] = {}
    now = time.time_ns()
    for j in known:
        ok = set(after_recovery(committed.get(j), now))
        if inflight is not None and j in inflight.effects:
            ok |= after_recovery(inflight.effects[j], now)
        allowed[j] = frozenset(ok)
    return Expectation(allowed, {j for j in known if committed.get(j) is not None}, payloads)


def job_states(root: str) -> dict[str, JobView]:
    """Job id -> what it is now, from the independent checker (temps allowed mid-run)."""
    return {
        j: JobView(State(o.state), o.name.attempt, o.name.max_attempts, o.name.not_before)
        for j, o in check_tree(root, allow_temps=True).objects.items()
    }


@dataclass
class Driver:
    """What setup and run functions use: the queue, payload bookkeeping, commit marks."""

    q: Queue
    root: str
    session: Session | None = None
    payloads: dict[str, bytes] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    states: dict[str, JobView] = field(default_factory=dict)

    def call(self, label: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.session is None:
            return fn(*args, **kwargs)
        begin = self.session.index()
        result = fn(*args, **kwargs)
        end = self.session.index()
        after = job_states(self.root)
        effects = {j: after.get(j) for j in set(self.states) | set(after) if self.states.get(j) != after.get(j)}
        self.calls.append(Call(label, begin, end, effects))
        self.states = after
        return result

    def enqueue(self, payload: bytes, *, stream: bool = False, **kwargs: Any) -> str:
        job = self.call("enqueue", self.q.enqueue, io.BytesIO(payload) if stream else payload, **kwargs)
        self.payloads[job] = payload
        return job

    def enqueue_many(self, payloads: list[bytes], *, streamed: Collection[int] = (), **kwargs: Any) -> list[str]:
        """One enqueue_many call; the payloads at the ``streamed`` indices go in as file objects."""
        items = [io.BytesIO(p) if i in streamed else p for i, p in enumerate(payloads)]
        jobs: list[str] = self.call("enqueue_many", self.q.enqueue_many, items, **kwargs)
        self.payloads.update(zip(jobs, payloads, strict=True))
        return jobs

    def lease(self, duration: float = 30.0) -> Lease:
        lease = self.call("lease", self.q.lease, duration=duration)
        assert lease is not None, "workload expected a ready job"
        return lease

    def recover_rebooted(self) -> Any:
        """A recovery pass that sees every lease as expired (boottime far ahead)."""
        ctx = self.q._ctx
        now = linux.boottime_ns() + 3600 * NS_PER_SECOND

        def run() -> Any:
            with ctx.tree.operation():
                return run_recovery(ctx, budget_ops=100_000, budget_ms=60_000, now_boottime=now)

        return self.call("recover", run)


SHARDS = 4


@contextlib.contextmanager
def prepared(wl: Workload, root: str) -> Iterator[tuple[Driver, dict[str, Any]]]:
    """A fresh queue at ``root`` brought into ``wl``'s starting state (not recorded)."""
    q = Queue.init(root, shards=SHARDS, allow_unsupported_fs=True, **wl.init)
    if wl.deferred:
        q.close()
        q = Queue.open(root, deferred=True, allow_unsupported_fs=True)
    try:
        d = Driver(q, root)
        ctx = wl.setup(d)
        d.states = job_states(root)
        yield d, ctx
    finally:
        q.close()


Setup = Callable[[Driver], dict[str, Any]]
Run = Callable[[Driver, dict[str, Any]], None]


@dataclass(frozen=True)
class Workload:
    name: str
    setup: Setup
    run: Run
    init: dict[str, Any] = field(default_factory=dict)  # extra Queue.init arguments
    deferred: bool = False


def _nothing(d: Driver) -> dict[str, Any]:
    return {}


def _ready(n: int, **kw: Any) -> Setup:
    def setup(d: Driver) -> dict[str, Any]:
        return {"jobs": [d.enqueue(f"setup job {i}".encode() * (i + 1), **kw) for i in range(n)]}

    return setup


def _leased(n: int, max_attempts: int = 3, duration: float = 30.0) -> Setup:
    def setup(d: Driver) -> dict[str, Any]:
        for i in range(n):
            d.enqueue(f"leased job {i}".encode(), max_attempts=max_attempts)
        return {"leases": [d.lease(duration) for _ in range(n)]}

    return setup


# -- recorded runs ------------------------------------------------------------------------


def _one_shard_ids(d: Driver, n: int) -> list[str]:
    """``n`` job ids of shard 0: after the first job into the shard (the Python's path, which opens its
    directory), the next ones go through the C core where it is built (publish._enqueue_fast, settle._ack_fast)."""
    from steadqd.fs.names import shard_of

    fmt = d.q._ctx.fmt
    ids = (i.to_bytes(16, "big") for i in range(1, 1000))
    return [j.hex() for j in ids if shard_of(fmt.queue_id, j, fmt.shard_count) == 0][:n]


def run_enqueue(d: Driver, _: dict[str, Any]) -> None:
    first, second = _one_shard_ids(d, 2)
    d.enqueue(b"first job", job_id=first)
    d.enqueue(bytes(range(256)) * 12, job_id=second)
    d.enqueue(b"streamed " * 500, stream=True)  # placeholder header, payload, pwrite of the real header
    d.enqueue(b"", max_attempts=1)


def run_enqueue_delayed(d: Driver, _: dict[str, Any]) -> None:
    d.enqueue(b"in an hour", delay=3600)
    d.enqueue(b"in two hours", delay=7200)
    d.enqueue(b"also in an hour", delay=3600)


def run_enqueue_batch(d: Driver, _: dict[str, Any]) -> None:
    def batch() -> None:
        with d.q.batch():
            for i in range(6):
                d.payloads[d.q.enqueue(f"batched {i}".encode())] = f"batched {i}".encode()

    d.call("batch", batch)  # committed only when the batch's deferred barriers ran


@contextlib.contextmanager
def _group_size(n: int) -> Iterator[None]:
    """A small ENQUEUE_MANY_GROUP, so a short input spans several groups."""
    orig = publish.ENQUEUE_MANY_GROUP
    publish.ENQUEUE_MANY_GROUP = n
    try:
        yield
    finally:
        publish.ENQUEUE_MANY_GROUP = orig


def run_enqueue_many(d: Driver, _: dict[str, Any]) -> None:
    """Groups of files fsynced together, then linked: no job may be visible before
    its file is durable, and every job of a returned call survives."""
    d.enqueue_many([b"many a", bytes(range(256)) * 12, b"many streamed " * 300, b""], streamed={2})
    d.enqueue_many([b"many delayed 1", b"many delayed 2"], delay=3600)
    with _group_size(2):
        d.enqueue_many([f"grouped {i}".encode() * (i + 1) for i in range(5)])  # groups of 2, 2 and 1


def run_enqueue_many_batch(d: Driver, _: dict[str, Any]) -> None:
    def batch() -> None:
        with d.q.batch(), _group_size(3):
            for n in (4, 2):
                payloads = [f"batched many {n}.{i}".encode() for i in range(n)]
                d.payloads.update(zip(d.q.enqueue_many(payloads), payloads, strict=True))

    d.call("batch", batch)  # committed only when the batch's deferred barriers ran


def setup_named(d: Driver) -> dict[str, Any]:
    d.q._ctx.publication = "named"  # what ZFS (no O_TMPFILE link) gets: temp file + rename
    return {}


def run_enqueue_named(d: Driver, _: dict[str, Any]) -> None:
    d.enqueue(b"named temp")
    d.enqueue(b"named streamed " * 300, stream=True)
    d.enqueue(b"named delayed", delay=3600)


def run_enqueue_deferred(d: Driver, _: dict[str, Any]) -> None:
    """Group commit: nothing is committed until sync() returns."""

    def produce() -> None:
        for i in range(8):
            payload = f"deferred {i}".encode()
            d.payloads[d.q.enqueue(payload)] = payload
        d.q.sync()

    d.call("enqueue x8 + sync", produce)


def run_renew_deferred(d: Driver, s: dict[str, Any]) -> None:
    def renew_all() -> None:
        for lease in s["leases"]:
            d.q.renew(lease, 60.0)
            d.q.renew(lease, 90.0)
        d.q.sync()

    d.call("renew x6 + sync", renew_all)


def setup_settle_batch(d: Driver) -> dict[str, Any]:
    for i in range(6):
        d.enqueue(f"settled in a batch {i}".encode(), max_attempts=2)
    return {"leases": [d.lease() for _ in range(6)]}


def run_settle_batch(d: Driver, s: dict[str, Any]) -> None:
    """Every settlement in one batch: all barriers wait for the final sync."""
    a, b, c, e, f, g = s["leases"]

    def settle() -> None:
        with d.q.batch():
            d.q.ack(a)
            d.q.ack(b)
            d.q.retry(c, delay=0)
            d.q.retry(e, delay=3600)
            d.q.bury(f, 9)
            d.q.renew(g, 120.0)

    d.call("batch of settlements", settle)


def run_lease(d: Driver, _: dict[str, Any]) -> None:
    d.lease()
    d.lease()


def run_renew(d: Driver, s: dict[str, Any]) -> None:
    lease = s["leases"][0]
    d.call("renew", d.q.renew, lease, 60.0)
    d.call("renew", d.q.renew, lease, 120.0)


def setup_ack(d: Driver) -> dict[str, Any]:
    """Three leases of one shard: the first ack makes the receipt bucket (the Python's path), the
    next two find its shard directory open and go through the C core where it is built (settle._ack_fast),
    the second learning the directories' ids with fstat, the third knowing them."""
    same = _one_shard_ids(d, 3)
    for i, job in enumerate(same):
        d.enqueue(f"leased job {i}".encode(), job_id=job)
    return {"leases": [d.lease() for _ in same]}


def run_ack(d: Driver, s: dict[str, Any]) -> None:
    for lease in s["leases"]:
        d.call("ack", d.q.ack, lease)


def run_retry_now(d: Driver, s: dict[str, Any]) -> None:
    d.call("retry", d.q.retry, s["leases"][0], delay=0)


def setup_retry_later(d: Driver) -> dict[str, Any]:
    d.enqueue(b"retried later")
    first = d.lease()
    d.enqueue(b"last attempt", max_attempts=1)
    return {"leases": [first, d.lease()]}


def run_retry_later(d: Driver, s: dict[str, Any]) -> None:
    d.call("retry", d.q.retry, s["leases"][0], delay=3600)
    d.call("retry", d.q.retry, s["leases"][1])  # attempt 1 of 1: buried as exhausted


def run_bury(d: Driver, s: dict[str, Any]) -> None:
    d.call("bury", d.q.bury, s["leases"][0], 7)


def setup_promotion(d: Driver) -> dict[str, Any]:
    for i in range(2):
        d.enqueue(f"due soon {i}".encode(), delay=0.02)
    time.sleep(0.06)  # the 10 ms delayed width makes both due by now
    return {}


def run_promotion(d: Driver, _: dict[str, Any]) -> None:
    d.call("recover", d.q.recover, 100_000, 60_000)


def setup_reaping(d: Driver) -> dict[str, Any]:
    d.enqueue(b"reaped to ready")
    d.enqueue(b"reaped to dead", max_attempts=1)
    return {"leases": [d.lease(), d.lease()]}


def run_reaping(d: Driver, _: dict[str, Any]) -> None:
    d.recover_rebooted()


def setup_compaction(d: Driver) -> dict[str, Any]:
    for i in range(2):
        d.enqueue(f"acked {i}".encode() * 40)
    for _ in range(2):
        d.q.ack(d.lease())
    return {}


def run_compaction(d: Driver, _: dict[str, Any]) -> None:
    d.call("recover", d.q.recover, 100_000, 60_000)


def setup_mix(d: Driver) -> dict[str, Any]:
    d.enqueue(b"old ready")
    consumer = Queue.open(d.root, allow_unsupported_fs=True)
    return {"expiring": d.lease(duration=30.0), "consumer": consumer}


def run_mix(d: Driver, s: dict[str, Any]) -> None:
    """Every transition, interleaved, by a producer and a consumer handle."""
    c: Queue = s["consumer"]
    try:
        d.enqueue(b"mix a")
        d.enqueue(b"mix delayed", delay=3600)
        a = d.call("lease", c.lease)
        d.enqueue(b"mix b", max_attempts=1)
        d.call("renew", c.renew, a, 90.0)
        b = d.call("lease", c.lease)
        d.call("ack", c.ack, a)
        d.call("retry", c.retry, b, delay=0)  # attempt 1 of 1: buried as exhausted
        d.enqueue(b"mix c")
        x = d.call("lease", c.lease)
        d.call("retry", c.retry, x, delay=0)
        x = d.call("lease", c.lease)
        d.call("bury", c.bury, x, 3)
        d.enqueue(b"mix d " * 100, stream=True)
        e = d.call("lease", c.lease)
        d.call("retry", c.retry, e, delay=1800)
        d.enqueue(b"mix e")
        d.recover_rebooted()  # reaps the setup lease and compacts the receipt
        f = d.call("lease", c.lease)
        d.call("ack", c.ack, f)
    finally:
        c.close()


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("enqueue", _nothing, run_enqueue),
        Workload("enqueue_delayed", _nothing, run_enqueue_delayed),
        Workload("enqueue_batch", _nothing, run_enqueue_batch),
        Workload("enqueue_named", setup_named, run_enqueue_named),
        Workload("enqueue_deferred", _nothing, run_enqueue_deferred, deferred=True),
        Workload("enqueue_many", _nothing, run_enqueue_many),
        Workload("enqueue_many_batch", _nothing, run_enqueue_many_batch),
        Workload("enqueue_many_named", setup_named, run_enqueue_many),  # one at a time through named temps
        Workload("lease", _ready(2), run_lease),
        Workload("renew", _leased(1), run_renew),
        Workload("renew_deferred", _leased(3), run_renew_deferred, deferred=True),
        Workload("ack", setup_ack, run_ack),
        Workload("settle_batch", setup_settle_batch, run_settle_batch),
        Workload("retry_now", _leased(1), run_retry_now),
        Workload("retry_later", setup_retry_later, run_retry_later),
        Workload("bury", _leased(1), run_bury),
        Workload("promotion", setup_promotion, run_promotion, init={"delayed_width_ns": 10_000_000}),
        Workload("reaping", setup_reaping, run_reaping),
        Workload("compaction", setup_compaction, run_compaction),
        Workload("mix", setup_mix, run_mix),
        Workload("mix_shared", setup_mix, run_mix, init={"shared": True}),  # fchmod on every new file and dir
    )
}
