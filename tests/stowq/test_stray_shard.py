"""A job record under a shard its id does not map to (namespace.md, Sharding), on the memory store.

The record is sealed for the stray key, so its key tag verifies: only the
id-to-shard rule tells it is no key of the job. Workers must not claim it
(a planted copy would otherwise give one job two claim chains) and fsck
must name it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from steadqd.s3 import keys
from steadqd.s3.records import JobRecord, QuarantineReason
from steadqd.s3.verify import read_record
from tests.stowq.recovery_world import LEASE_S, MINUTE, World, world


def _plant_under_other_shard(w: World, job_id: str) -> str:
    """A correctly tagged copy of the job's record under another shard; returns its key."""
    layout = w.q.layout
    raw = bytes.fromhex(job_id)
    real = keys.job_key(w.shard(job_id), raw)
    record = read_record(w.memory.get("q/" + real).body, layout.queue_id, real, required_feature_bits=1)
    assert isinstance(record, JobRecord)
    other = (w.shard(job_id) + 1) % layout.format.shard_count
    stray = keys.job_key(other, raw)
    w.put(stray, layout.encode(stray, record))
    return stray


def test_a_job_whose_only_record_is_under_another_shard_is_not_claimed() -> None:
    w = world()
    job_id = w.q.enqueue(b"p")
    stray = _plant_under_other_shard(w, job_id)
    w.delete(keys.job_key(w.shard(job_id), bytes.fromhex(job_id)))
    assert w.q.lease(duration=600) is None
    assert w.keys("claims/") == []
    assert stray in w.keys("jobs/")  # ignored, not deleted: fsck reports it


def test_a_copy_under_another_shard_does_not_let_the_job_be_claimed_twice() -> None:
    w = world()
    job_id = w.q.enqueue(b"p")
    _plant_under_other_shard(w, job_id)
    first = w.q.lease(duration=600)
    assert first is not None and first.job_id == job_id
    assert w.q.lease(duration=600) is None
    assert w.handle("w2").lease(duration=600) is None
    assert [k.split("/")[1] for k in w.keys("claims/")] == [f"{w.shard(job_id):04x}"]


@pytest.mark.parametrize("repair", [False, True])
def test_fsck_names_a_correctly_tagged_record_under_another_shard(repair: bool) -> None:
    w = world()
    job_id = w.q.enqueue(b"p")
    stray = _plant_under_other_shard(w, job_id)
    report = w.q.fsck(repair=repair)
    assert [(f.finding_type, f.path) for f in report.errors] == [("key_grammar", stray)]
    assert "shard" in report.errors[0].details and report.exit_code == 3
    if repair:
        [rel] = w.keys("quarantine/")
        record = read_record(w.memory.get("q/" + rel).body, w.q.layout.queue_id, rel, required_feature_bits=1)
        assert record.source_key == stray  # type: ignore[union-attr]
        assert record.reason == QuarantineReason.KEY_PARSE_FAILED  # type: ignore[union-attr]


def test_the_lease_sweep_does_not_settle_a_chain_planted_under_another_shard() -> None:
    """A lease entry of a stray chain is pruned unread: no dead record is made from planted objects."""
    w = world()
    job_id = w.q.enqueue(b"p", max_attempts=1)
    lease = w.q.lease(duration=LEASE_S)
    assert lease is not None
    layout = w.q.layout
    other = (lease.shard + 1) % layout.format.shard_count
    _plant_under_other_shard(w, job_id)
    for rel in w.keys("claims/") + w.keys("leases/"):  # the claim and its lease entry, under the other shard
        stray = str(replace(keys.parse_key(rel), shard=other))
        body = w.memory.get("q/" + rel).body
        if rel.startswith("claims/"):
            body = layout.encode(stray, read_record(body, layout.queue_id, rel, required_feature_bits=1))
        w.put(stray, body)
    w.advance(2 * MINUTE)
    w.q.recover(phases=("reap_leases",))
    assert w.keys("dead/") == [keys.dead_key(lease.shard, lease.job_id_bytes)]  # the real job's attempt ran out
    assert [k for k in w.keys("leases/") if keys.parse_key(k).shard == other] == []
