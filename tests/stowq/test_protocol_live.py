"""The StowQ/1 protocol live on every engine the tests start: SeaweedFS and Ceph RGW, the same tests for both.

The lifecycle (enqueue, lease, renew, ack, bury, takeover) is the SeaweedFS
suite's, run unchanged on RGW; the transitions it leaves out (retry with a
delay, quarantine of a corrupt record, resolution of an unknown outcome by
reading the key) run here against each engine. A few jobs each: both keep
whole seconds, so a lease is at least 2 s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from steadqd.constants import AckResult
from steadqd.s3.handle import BucketQueue
from steadqd.s3.layout import DEFAULT_FORMAT
from steadqd.s3.lease import Lease
from steadqd.s3.records import QuarantineRecord
from steadqd.s3.store.faults import Fault, FaultKind, FaultyStore
from steadqd.s3.store.s3 import S3Store
from steadqd.s3.verify import read_record
from tests import workers
from tests.stowq import test_protocol_seaweedfs as on_seaweedfs
from tests.stowq.ceph import Ceph
from tests.stowq.conftest import LIVE_BUCKET

# Its store fixture asks for the session's `seaweed` or `ceph` by name at run time, which the rule in
# tests/conftest.py cannot see: it joins their xdist group explicitly.
pytestmark = pytest.mark.xdist_group(workers.LIVE_S3_GROUP)

LEASE_S = on_seaweedfs.LEASE_S
WAIT_S = 15.0


@pytest.fixture(params=["seaweed", pytest.param("ceph", marks=pytest.mark.ceph)])
def engine_store(request: pytest.FixtureRequest) -> Iterator[S3Store]:
    """A client of the live bucket on one engine, with that engine's profile."""
    store = request.getfixturevalue(request.param).store(LIVE_BUCKET)
    yield store
    store.close()


@pytest.mark.ceph
def test_the_lifecycle_on_rgw(ceph: Ceph, live_prefix: str) -> None:
    on_seaweedfs.test_the_lifecycle_on_seaweedfs(ceph, live_prefix)


def _lease_within(q: BucketQueue, seconds: float) -> Lease | None:
    deadline = time.monotonic() + seconds
    while (lease := q.lease(duration=LEASE_S)) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    return lease


def test_retry_comes_back_after_its_delay_and_not_before(engine_store: S3Store, live_prefix: str) -> None:
    q = BucketQueue.init(engine_store, live_prefix, worker_id="w1", certify_store=False)
    job = q.enqueue(b"flaky")
    first = q.lease(duration=LEASE_S)
    assert first is not None and first.attempt == 1
    assert q.retry(first, delay=0) == "delayed"
    again = _lease_within(q, WAIT_S)  # once the retry deadline and the first lease have both passed
    assert again is not None and again.job_id == job and (again.generation, again.attempt) == (2, 2)
    assert q.retry(again, delay=60) == "delayed"
    time.sleep(LEASE_S + 1.5)  # the lease has expired; the retry deadline has not
    assert q.lease(duration=LEASE_S) is None


def test_a_corrupt_job_record_is_quarantined_and_never_delivered(engine_store: S3Store, live_prefix: str) -> None:
    q = BucketQueue.init(engine_store, live_prefix, worker_id="w1", certify_store=False)
    key = live_prefix + q.job_key(q.enqueue(b"good"))
    body = bytearray(engine_store.get(key).body)
    body[40] ^= 0xFF
    engine_store.delete(key)
    engine_store.put_if_absent(key, bytes(body))
    assert q.lease(duration=LEASE_S) is None
    (finding,) = engine_store.list_page(live_prefix + "quarantine/").items
    rel = finding.key[len(live_prefix) :]
    bits = DEFAULT_FORMAT.required_feature_bits
    record = read_record(engine_store.get(finding.key).body, q.layout.queue_id, rel, required_feature_bits=bits)
    assert isinstance(record, QuarantineRecord) and record.source_key == key[len(live_prefix) :]
    assert q.lease(duration=LEASE_S) is None
    assert len(engine_store.list_page(live_prefix + "quarantine/").items) == 1  # the same finding, not a second


def test_unknown_outcomes_are_resolved_by_reading_the_key(engine_store: S3Store, live_prefix: str) -> None:
    """A claim whose answer was lost after it landed, and a receipt lost before: each read back from the engine."""
    q = BucketQueue.init(engine_store, live_prefix, worker_id="w1", certify_store=False)
    q.enqueue(b"p")
    faulty = FaultyStore(engine_store)
    worker = BucketQueue.open(faulty, live_prefix, worker_id="w2", certify_store=False)
    landed = Fault(FaultKind.TIMEOUT, op="put_if_absent", key_prefix=live_prefix + "claims/", applied=True)
    with faulty.armed(landed) as (fired,):
        lease = worker.lease(duration=LEASE_S)
    assert fired.fired == 1 and lease is not None and lease.generation == 1
    assert len(engine_store.list_page(live_prefix + "claims/").items) == 1
    lost = Fault(FaultKind.CONNECTION_LOST, op="put_if_absent", key_prefix=live_prefix + "receipts/")
    with faulty.armed(lost) as (fired,):
        assert worker.ack(lease) is AckResult.ACKED  # found absent by reading, sent again
    assert fired.fired == 1 and len(engine_store.list_page(live_prefix + "receipts/").items) == 1
    assert worker.ack(lease) is AckResult.ALREADY_ACKED
