"""Stateful property test: the real queue against the pure model (tests/model.py).

Hypothesis drives a real ``Queue`` (4 shards, on /tmp) and ``QueueModel``
side by side through random sequences of enqueue, lease, renew, ack, retry,
bury, stale-lease use, inspect and handle reopening. After every step the
tree is walked *independently of the library's read paths* (names parsed and
tag-authenticated straight from the directory entries) and must equal the
model job for job: state, generation, attempt, maximum_attempts and the
state's name field (token, reason, not-before). Because the handle is
reopened at random points and old lease objects keep working, the test also
shows that no queue state lives in process memory.

The scan order is pseudo-random, so the model is never asked *which* ready
job a lease returns, only told it and made to check that it was claimable.
"""

from __future__ import annotations

import copy
import io
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from steadqd import (
    AckResult,
    Lease,
    LeaseLost,
    NotCommitted,
    Queue,
    State,
)
from steadqd.constants import NS_PER_SECOND
from steadqd.fs import linux
from steadqd.fs import names as N

_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:  # tests/ has no __init__.py; make tests.model importable however pytest was started
    sys.path.insert(0, _REPO)

from tests.model import (  # noqa: E402
    ModelLease,
    ModelLeaseLost,
    Observed,
    QueueModel,
    Ready,
)

SHARDS = 4
LEASE_S = 600.0  # far beyond the test's runtime: no lease can expire mid-example
LONG_DELAY_S = 3600.0  # delayed jobs stay delayed for the whole run (nothing promotes them anyway)

# --------------------------------------------------------------------------- strategies

META_KEYS = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,15}", fullmatch=True)
META_VALUES = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.text(max_size=20),
    st.binary(max_size=20),
)
METADATA = st.dictionaries(META_KEYS, META_VALUES, max_size=4)
CONTENT_TYPES = st.one_of(
    st.sampled_from(["application/octet-stream", "text/plain; charset=utf-8", "application/json", " ", "~"]),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=40),
)
PAYLOADS = st.binary(max_size=300)


def typed(meta: dict[str, object]) -> list[tuple[str, str, object]]:
    """Metadata compared with value types: True == 1 in Python, but not on the wire."""
    return sorted((k, type(v).__name__, v) for k, v in meta.items())


# --------------------------------------------------------------------------- the independent tree walk


def _subdirs(path: str) -> list[str]:
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def walk_tree(root: str, queue_id: bytes, fmt_widths: tuple[int, int, int]) -> dict[str, Observed]:
    """Every job object under ready/, delayed/, dead/ and receipts/, by name alone.

    Fails on anything that is not a canonical, authenticating name in the
    right shard (and, for delayed objects, the right bucket), and on two
    objects of one job: the one-object-per-job invariant.
    """
    lease_w, delayed_w, _terminal_w = fmt_widths
    found: dict[str, Observed] = {}

    def record(jn: N.JobName, where: str) -> None:
        jid = jn.job_id.hex()
        assert jid not in found, f"two objects for job {jid}: {where} and {found[jid]}"
        detail: object = None
        if jn.state in (State.LEASED, State.RECEIPT):
            detail = jn.lease_token
        elif jn.state is State.DELAYED:
            detail = jn.not_before
        elif jn.state is State.DEAD:
            detail = jn.reason
        found[jid] = Observed(str(jn.state), jn.generation, jn.attempt, jn.max_attempts, detail)

    def check_shard(jn: N.JobName, shard: int, where: str) -> None:
        assert N.shard_of(queue_id, jn.job_id, SHARDS) == shard, f"{where} is in the wrong shard"

    for s in _subdirs(os.path.join(root, "ready")):
        shard = N.parse_shard_dir(s, SHARDS)
        assert shard is not None, f"stray entry ready/{s}"
        for name in sorted(os.listdir(os.path.join(root, "ready", s))):
            where = f"ready/{s}/{name}"
            jn = N.parse_ready_dir_entry(name)
            assert N.authenticate(queue_id, jn, shard=shard, lease_width_ns=lease_w), f"{where}: tag fails"
            check_shard(jn, shard, where)
            record(jn, where)

    for top, state in (("delayed", State.DELAYED), ("dead", State.DEAD), ("receipts", State.RECEIPT)):
        for b in _subdirs(os.path.join(root, top)):
            bucket = N.parse_bucket_dir(b)
            assert bucket is not None, f"stray entry {top}/{b}"
            for s in _subdirs(os.path.join(root, top, b)):
                shard = N.parse_shard_dir(s, SHARDS)
                assert shard is not None, f"stray entry {top}/{b}/{s}"
                for name in sorted(os.listdir(os.path.join(root, top, b, s))):
                    where = f"{top}/{b}/{s}/{name}"
                    jn = N.parse_name(state, name)
                    assert N.authenticate(queue_id, jn, shard=shard, bucket=bucket, lease_width_ns=lease_w), (
                        f"{where}: tag fails"
                    )
                    check_shard(jn, shard, where)
                    if state is State.DELAYED:
                        assert jn.not_before is not None
                        assert N.delayed_bucket(jn.not_before, delayed_w) == bucket, f"{where}: wrong bucket"
                    record(jn, where)
    return found


def leftover_files(root: str) -> list[str]:
    """Temp files anywhere, files under tmp/ or legacy leased/, and quarantined objects: all must be absent."""
    bad: list[str] = []
    for dirpath, _dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        top = rel.split(os.sep)[0]
        for f in files:
            if top in ("tmp", "quarantine", "leased") or f.endswith(".tmp") or f.startswith((".wm.", ".format.")):
                bad.append(os.path.join(rel, f))
    return bad


# --------------------------------------------------------------------------- the machine


@dataclass
class Held:
    """A lease object the test still holds, with the model's view of what it proves.

    Snapshots taken before a renew stay in the list as stale lease objects.
    """

    lease: Lease
    model: ModelLease


class QueueVsModel(RuleBasedStateMachine):
    """Real queue and model, step for step."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp: str | None = None
        self.q: Queue | None = None  # type: ignore[assignment]
        self.random_patch: mock._patch | None = None  # type: ignore[type-arg]
        self.model = QueueModel()
        self.held: list[Held] = []

    @initialize(seed=st.integers(0, 2**64 - 1))
    def create_queue(self, seed: int) -> None:
        """A fresh queue whose randomness (queue id, job ids, tokens, scan nonce) comes from ``seed``.

        Which ready job a claim takes depends on that randomness (shard of
        each job id, per-handle scan permutation), and the rules enabled next
        depend on which job it took; Hypothesis can only replay and shrink a
        failure if the same seed yields the same picks. Everything else
        (files, renames, fsyncs) is real.
        """
        rng = random.Random(seed)
        self.random_patch = mock.patch.object(linux, "getrandom", rng.randbytes)
        self.random_patch.start()
        self.tmp = tempfile.mkdtemp(prefix="steadq-model-", dir="/tmp")
        self.root = os.path.join(self.tmp, "q")
        self.q = Queue.init(self.root, shards=SHARDS)
        self.queue_id = bytes.fromhex(self.q.queue_id)
        fmt = self.q.format
        self.widths = (fmt.lease_width_ns, fmt.delayed_width_ns, fmt.terminal_width_ns)

    def teardown(self) -> None:
        try:
            if self.q is not None:
                self.q.close()
        finally:
            if self.random_patch is not None:
                self.random_patch.stop()
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers ------------------------------------------------------------

    def with_standing(self, standing: str) -> list[Held]:
        return [h for h in self.held if self.model.standing(h.model) == standing]

    def not_before_of(self, job_id: str) -> int:
        infos = self.q.inspect(job_id)
        assert len(infos) == 1 and infos[0].state is State.DELAYED, infos
        nb = infos[0].name.not_before
        assert nb is not None
        return nb

    def _enqueue(self, payload: bytes, max_attempts: int, content_type: str, metadata: dict, as_file: bool, **kw):
        body = io.BytesIO(payload) if as_file else payload
        return self.q.enqueue(body, max_attempts=max_attempts, content_type=content_type, metadata=metadata, **kw)

    # -- rules: producing ---------------------------------------------------

    @rule(
        payload=PAYLOADS,
        max_attempts=st.integers(1, 3),
        content_type=CONTENT_TYPES,
        metadata=METADATA,
        as_file=st.booleans(),
    )
    def enqueue(self, payload: bytes, max_attempts: int, content_type: str, metadata: dict, as_file: bool) -> None:
        job_id = self._enqueue(payload, max_attempts, content_type, metadata, as_file)
        self.model.enqueue(job_id, payload, max_attempts=max_attempts, content_type=content_type, metadata=metadata)

    @rule(
        payload=PAYLOADS,
        max_attempts=st.integers(1, 3),
        content_type=CONTENT_TYPES,
        metadata=METADATA,
        absolute=st.booleans(),
    )
    def enqueue_delayed(
        self, payload: bytes, max_attempts: int, content_type: str, metadata: dict, absolute: bool
    ) -> None:
        if absolute:
            nb = time.time_ns() + round(LONG_DELAY_S * NS_PER_SECOND)
            job_id = self._enqueue(payload, max_attempts, content_type, metadata, False, not_before_ns=nb)
            assert self.not_before_of(job_id) == nb, "an absolute not-before must be stored exactly"
        else:
            before = time.time_ns()
            job_id = self._enqueue(payload, max_attempts, content_type, metadata, False, delay=LONG_DELAY_S)
            nb = self.not_before_of(job_id)
            # The wall floor is max(realtime, watermark) ≥ the clock read before the call.
            assert nb >= before + round(LONG_DELAY_S * NS_PER_SECOND)
        self.model.enqueue(
            job_id, payload, max_attempts=max_attempts, content_type=content_type, metadata=metadata, not_before=nb
        )

    @precondition(lambda self: bool(self.model.ids(Ready) - self.model.exhausted_ready()))
    @rule(data=st.data())
    def foreign_exhausted_ready(self, data: st.DataObject) -> None:
        """Rename a ready job to an exhausted ready name, as another writer could leave it.

        The only way to reach exhausted_ready_cleanup: the library itself
        buries exhausted leases on retry instead of making them ready.
        """
        job_id = data.draw(st.sampled_from(sorted(self.model.ids(Ready) - self.model.exhausted_ready())))
        (info,) = self.q.inspect(job_id)
        assert info.state is State.READY
        shard = N.shard_of(self.queue_id, bytes.fromhex(job_id), SHARDS)
        jn = N.ready_name(bytes.fromhex(job_id), info.generation + 1, info.max_attempts, info.max_attempts)
        new = N.make_filename(self.queue_id, jn, shard=shard, lease_width_ns=self.widths[0])
        d = os.path.join(self.root, os.path.dirname(info.path))
        os.rename(os.path.join(self.root, info.path), os.path.join(d, new))
        self.model.external_exhaust(job_id)

    # -- rules: consuming ---------------------------------------------------

    @rule()
    def lease(self) -> None:
        claimable_before = self.model.claimable()
        exhausted_before = self.model.exhausted_ready()
        lease = self.q.lease(duration=LEASE_S)
        report = self.q.last_scan
        assert report is not None and not report.errors and not report.quarantined, report
        dead_lettered = {os.path.basename(p)[:32] for p in report.dead_lettered}
        assert dead_lettered <= exhausted_before, (dead_lettered, exhausted_before)
        for job_id in sorted(dead_lettered):
            self.model.cleanup_exhausted(job_id)
        if lease is None:
            assert not claimable_before, f"lease returned None while the model has ready jobs {claimable_before}"
            assert dead_lettered == exhausted_before, "a scan that found nothing must have visited every shard"
            return
        assert claimable_before, f"lease returned {lease.job_id} but the model has no claimable job"
        assert lease.job_id in claimable_before, f"leased {lease.job_id}, not one of the model's ready jobs"
        job = self.model.job(lease.job_id)
        expected_generation, expected_attempt = job.generation + 1, job.attempt + 1
        ml = self.model.claim(lease.job_id, lease.token)
        assert (lease.generation, lease.attempt, lease.max_attempts) == (
            expected_generation,
            expected_attempt,
            job.max_attempts,
        )
        assert (ml.generation, ml.attempt) == (lease.generation, lease.attempt)
        assert lease.payload() == job.payload
        assert lease.payload_length == len(job.payload)
        assert lease.content_type == job.content_type
        assert typed(lease.metadata) == typed(job.metadata)
        self.held.append(Held(lease, ml))

    @precondition(lambda self: bool(self.with_standing("current")))
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        h = data.draw(st.sampled_from(self.with_standing("current")))
        # The library renews in place; keep the pre-renew object as a stale lease.
        self.held.append(Held(copy.copy(h.lease), h.model))
        renewed = self.q.renew(h.lease, duration=LEASE_S)
        assert renewed is h.lease
        h.model = self.model.renew(h.model)
        assert (h.lease.generation, h.lease.attempt, h.lease.token) == (
            h.model.generation,
            h.model.attempt,
            h.model.token,
        )

    @precondition(lambda self: bool(self.with_standing("current")))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        h = data.draw(st.sampled_from(self.with_standing("current")))
        assert self.q.ack(h.lease) is AckResult.ACKED
        assert self.model.ack(h.model) == "acked"

    @precondition(lambda self: bool(self.with_standing("acked_by_it")))
    @rule(data=st.data())
    def ack_again(self, data: st.DataObject) -> None:
        h = data.draw(st.sampled_from(self.with_standing("acked_by_it")))
        assert self.q.ack(h.lease) is AckResult.ALREADY_ACKED
        assert self.model.ack(h.model) == "already_acked"

    @precondition(lambda self: bool(self.with_standing("current")))
    @rule(data=st.data())
    def retry_now(self, data: st.DataObject) -> None:
        h = data.draw(st.sampled_from(self.with_standing("current")))
        got = self.q.retry(h.lease)
        assert got == self.model.retry(h.model), got

    @precondition(lambda self: bool(self.with_standing("current")))
    @rule(data=st.data())
    def retry_later(self, data: st.DataObject) -> None:
        h = data.draw(st.sampled_from(self.with_standing("current")))
        before = time.time_ns()
        got = self.q.retry(h.lease, delay=LONG_DELAY_S)
        if self.model.retry_would_bury(h.model):
            assert got == self.model.retry(h.model) == "dead"
            return
        assert got == "delayed", got
        nb = self.not_before_of(h.lease.job_id)
        assert nb >= before + round(LONG_DELAY_S * NS_PER_SECOND)
        assert self.model.retry(h.model, not_before=nb) == "delayed"

    @precondition(lambda self: bool(self.with_standing("current")))
    @rule(data=st.data(), reason=st.integers(0, 0xFFFF))
    def bury(self, data: st.DataObject, reason: int) -> None:
        h = data.draw(st.sampled_from(self.with_standing("current")))
        self.q.bury(h.lease, reason)
        self.model.bury(h.model, reason)

    @precondition(lambda self: bool(self.with_standing("lost")))
    @rule(data=st.data(), op=st.sampled_from(["renew", "ack", "retry_now", "retry_later", "bury"]))
    def stale_lease(self, data: st.DataObject, op: str) -> None:
        """Every operation on a lease whose job moved on is LeaseLost, and changes nothing."""
        h = data.draw(st.sampled_from(self.with_standing("lost")))
        snapshot = copy.copy(h.lease)
        with pytest.raises(ModelLeaseLost):
            {
                "renew": lambda: self.model.renew(h.model),
                "ack": lambda: self.model.ack(h.model),
                "retry_now": lambda: self.model.retry(h.model),
                "retry_later": lambda: self.model.retry(h.model, not_before=0),
                "bury": lambda: self.model.bury(h.model, 1),
            }[op]()
        with pytest.raises(LeaseLost):
            {
                "renew": lambda: self.q.renew(h.lease, duration=LEASE_S),
                "ack": lambda: self.q.ack(h.lease),
                "retry_now": lambda: self.q.retry(h.lease),
                "retry_later": lambda: self.q.retry(h.lease, delay=LONG_DELAY_S),
                "bury": lambda: self.q.bury(h.lease, 1),
            }[op]()
        assert h.lease.__dict__ == snapshot.__dict__, "a failed operation must not alter the lease object"
        assert self.q.poisoned is None

    # -- rules: observing ---------------------------------------------------

    @precondition(lambda self: bool(self.model.jobs))
    @rule(data=st.data())
    def inspect(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.model.jobs)))
        infos = self.q.inspect(job_id)
        assert len(infos) == 1, infos
        info = infos[0]
        want = self.model.observe()[job_id]
        assert (str(info.state), info.generation, info.attempt, info.max_attempts) == (
            want.state,
            want.generation,
            want.attempt,
            want.max_attempts,
        )

    @rule(job=st.binary(min_size=16, max_size=16))
    def inspect_unknown(self, job: bytes) -> None:
        if job.hex() not in self.model.jobs:
            assert self.q.inspect(job.hex()) == []

    @rule()
    def reopen(self) -> None:
        """Close the handle and open a fresh one: old lease objects must keep working."""
        old = self.q
        old.close()
        self.q = Queue.open(self.root)
        assert self.q.queue_id == self.queue_id.hex()
        # The new handle very likely reuses the old one's descriptor numbers:
        # a closed handle must refuse to mutate rather than act through them.
        with pytest.raises(NotCommitted):
            old.enqueue(b"after close")
        with pytest.raises(NotCommitted):
            old.lease(duration=LEASE_S)

    # -- invariants ---------------------------------------------------------

    @invariant()
    def tree_equals_model(self) -> None:
        got = walk_tree(self.root, self.queue_id, self.widths)
        want = self.model.observe()
        if got != want:
            diff = {k: (got.get(k), want.get(k)) for k in sorted(set(got) | set(want)) if got.get(k) != want.get(k)}
            raise AssertionError(f"tree and model differ (tree, model): {diff}")

    @invariant()
    def nothing_left_over(self) -> None:
        assert leftover_files(self.root) == []
        assert self.q.poisoned is None


QueueVsModel.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestQueueVsModel = QueueVsModel.TestCase
