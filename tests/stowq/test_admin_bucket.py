"""``steadq admin`` on a bucket queue, on the memory store: requeue as a new job, removal in GC order, findings."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from steadqd.backend import open_queue
from steadqd.constants import DeadReason
from steadqd.errors import NotCommitted, SteadQError
from steadqd.s3 import admin, keys
from steadqd.s3.keys import KeyKind, parse_key
from steadqd.s3.layout import DEFAULT_FORMAT
from steadqd.s3.records import QuarantineReason
from steadqd.s3.store.faults import Fault, FaultKind
from steadqd.s3.verify import read_record
from tests.stowq.conftest import LIVE_BUCKET
from tests.stowq.seaweed import Seaweed
from tests.stowq.test_cli_bucket import field, live_queue, ok, run
from tests.stowq.test_views_bucket import LEASE_S, PREFIX, SECOND, _Queue


@pytest.fixture
def b() -> Iterator[_Queue]:
    yield _Queue()


def _dead_job(b: _Queue, payload: bytes = b"poison", **options: object) -> str:
    job = b.q.enqueue(payload, content_type="text/plain", max_attempts=2, **options)  # type: ignore[arg-type]
    lease = b.q.lease(duration=LEASE_S)
    assert lease is not None and lease.job_id == job
    b.q.bury(lease, reason=DeadReason.CONSUMER_REJECTED)
    return job


def test_requeue_makes_a_new_job_with_the_verified_payload_and_leaves_the_dead_graph(b: _Queue) -> None:
    dead = _dead_job(b)
    url = b.q.requeue_dead(dead)
    new_id = url.rsplit("/", 1)[1]
    assert url == f"s3://mem/farm/{b.q.job_key(new_id)}" and new_id != dead
    assert new_id == admin.requeued_id(b.q.layout.queue_id, bytes.fromhex(dead), 1).hex()
    assert b.state(dead) == "dead"  # the tombstone stays, for GC
    story = b.q.job_story(new_id)
    assert story is not None and story.state == "ready" and story.file is not None
    assert story.file.payload_head == b"poison" and story.file.content_type == "text/plain"
    assert story.current is not None and story.current.max_attempts == 2
    # repeated (a lost answer, an operator running it twice): the same pending job, nothing written
    writes = b.store.count("put_if_absent")
    assert b.q.requeue_dead(dead) == url and b.store.count("put_if_absent") == writes
    # once that job has settled, a further requeue makes the next one
    lease = b.q.lease(duration=LEASE_S)
    assert lease is not None and lease.job_id == new_id
    b.q.ack(lease)
    b.memory.delete(PREFIX + b.q.job_key(new_id))  # GC collected its job record, not yet its receipt
    third = b.q.requeue_dead(dead).rsplit("/", 1)[1]
    assert third == admin.requeued_id(b.q.layout.queue_id, bytes.fromhex(dead), 2).hex()


def test_requeue_refuses_a_job_that_is_not_dead_and_one_whose_payload_fails(b: _Queue) -> None:
    live = b.q.enqueue(b"x", delay=600)  # not leased by the burial below
    with pytest.raises(SteadQError, match="no dead record") as e:
        b.q.requeue_dead(live)
    assert e.value.exit_code == 1
    size = DEFAULT_FORMAT.inline_limit + 1
    dead = _dead_job(b, b"y" * size)
    payload_key = b.rels(f"payloads/{dead}/")[0]
    b.overwrite(payload_key, b"z" * size)
    with pytest.raises(SteadQError, match="payload"):
        b.q.requeue_dead(dead)
    assert len(b.rels("jobs/")) == 2  # nothing enqueued


def test_remove_dead_deletes_the_graph_in_gc_order_with_the_dead_record_last(b: _Queue) -> None:
    size = DEFAULT_FORMAT.inline_limit + 1
    dead = b.q.enqueue(b"y" * size, max_attempts=3, delay=1)
    b.clock.advance(DEFAULT_FORMAT.delayed_bucket_width_ns + 2 * SECOND)
    lease = b.q.lease(duration=LEASE_S)
    assert lease is not None
    b.q.retry(lease, delay=0)
    b.clock.advance(lease.lease_duration_ns + 2 * SECOND)
    lease = b.q.lease(duration=LEASE_S)
    assert lease is not None and lease.generation == 2
    b.q.bury(lease, reason=7)
    other = b.q.enqueue(b"keep me")
    start = len(b.store.trace)
    b.q.remove_dead(dead)
    deleted = [c.key[len(PREFIX) :] for c in b.store.trace[start:] if c.op == "delete"]
    # A cancel request the job may have (outputs/, outside the StowQ/1 grammar) goes too, before the tombstone.
    request = keys.cancel_request_key(bytes.fromhex(dead))
    assert request in deleted and deleted.index(request) < len(deleted) - 1
    kinds = [parse_key(k).kind for k in deleted if k != request]
    order = [KeyKind.TAIL, KeyKind.TERMIDX, KeyKind.DELAY_INDEX, KeyKind.LEASE_INDEX, KeyKind.FAIL, KeyKind.CLAIM,
             KeyKind.PAYLOAD, KeyKind.JOB, KeyKind.DEAD]  # fmt: skip
    assert sorted(set(kinds), key=order.index) == [k for k in dict.fromkeys(kinds)]  # each group in that order
    assert kinds[-1] is KeyKind.DEAD and KeyKind.PAYLOAD in kinds
    left = [k for k in b.memory.keys(PREFIX) if dead in k]
    assert left == [], left
    assert b.q.job_story(dead) is None and b.state(other) == "ready"
    with pytest.raises(SteadQError, match="no dead record"):
        b.q.remove_dead(dead)


def test_an_interrupted_removal_leaves_a_dead_job_and_runs_again_to_the_end(b: _Queue) -> None:
    dead = _dead_job(b)
    with b.store.armed(Fault(FaultKind.BEFORE_SEND, op="delete", key_prefix=f"{PREFIX}jobs/", times=None)):
        with pytest.raises(NotCommitted, match="run the removal again"):
            b.q.remove_dead(dead)
    assert b.state(dead) == "dead" and b.q.lease() is None  # never claimable on the way
    b.q.remove_dead(dead)
    assert [k for k in b.memory.keys(PREFIX) if dead in k] == []


def test_export_dead_writes_the_record_or_the_verified_payload_atomically(b: _Queue, tmp_path: Path) -> None:
    dead = _dead_job(b, b"the payload")
    out = tmp_path / "dead.rec"
    n = b.q.export_dead(dead, str(out))
    assert out.read_bytes() == b.memory.snapshot()[PREFIX + b.q.job_key(dead)] and n == out.stat().st_size
    assert b.q.export_dead(dead, str(tmp_path / "p"), payload_only=True) == 11
    assert (tmp_path / "p").read_bytes() == b"the payload"
    assert sorted(os.listdir(tmp_path)) == ["dead.rec", "p"]  # no temporaries left
    with pytest.raises(SteadQError, match="not found"):
        b.q.export_dead(b.q.enqueue(b"alive"), str(tmp_path / "x"))


def test_quarantine_findings_are_listed_inspected_exported_and_removed(b: _Queue, tmp_path: Path) -> None:
    job = b.q.enqueue(b"soon corrupt")
    rel = b.q.job_key(job)
    b.flip(rel)
    assert list(b.q.list_quarantine()) == []
    assert b.q.lease() is None  # the claim path writes the finding
    (found,) = b.q.list_quarantine()
    assert found.path == rel and found.reason == QuarantineReason.ENVELOPE_CORRUPT
    assert found.size == len(b.memory.snapshot()[PREFIX + rel]) and found.mtime_ns is not None
    assert b.q.inspect_quarantine(found.quarantine_id) == found
    assert b.q.export_quarantine(found.quarantine_id, str(tmp_path / "q")) == found.size
    assert (tmp_path / "q").read_bytes() == b.memory.snapshot()[PREFIX + rel]
    b.q.remove_quarantine(found.quarantine_id)
    assert list(b.q.list_quarantine()) == [] and rel in b.rels("jobs/")  # the object itself stays
    with pytest.raises(SteadQError, match="not found"):
        b.q.inspect_quarantine(found.quarantine_id)


# -- the command line on a live bucket ----------------------------------------------------------


def test_admin_commands_on_a_live_bucket(
    seaweed: Seaweed, live_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, url = live_queue(seaweed, live_prefix, tmp_path, monkeypatch)
    q = open_queue(url)
    try:
        dead = [q.enqueue(b"poison %d" % i) for i in range(2)]
        for _ in dead:
            lease = q.lease(duration=600)
            assert lease is not None
            q.bury(lease, reason=DeadReason.CONSUMER_REJECTED)
        bad = q.enqueue(b"to be corrupted")
        rel = q.job_key(bad)  # type: ignore[attr-defined]
    finally:
        q.close()
    store = seaweed.store(LIVE_BUCKET, create=False)
    try:
        body = bytearray(store.get(f"{live_prefix}q/{rel}").body)
        body[40] ^= 0xFF
        store.delete(f"{live_prefix}q/{rel}")
        store.put_if_absent(f"{live_prefix}q/{rel}", bytes(body))
    finally:
        store.close()

    nothing = run(env, "lease", url, "--handle-file", str(tmp_path / "h"), "--duration-seconds", "600")
    assert nothing.returncode == 1  # the only live job is corrupt: the scan records its finding
    listed = json.loads(ok(env, "--json", "admin", "dead-list", url).stdout)
    assert sorted(d["job_id"] for d in listed) == sorted(dead)
    assert all(d["path"].startswith("dead/") and d["reason"] == DeadReason.CONSUMER_REJECTED for d in listed)
    (obj,) = json.loads(ok(env, "--json", "admin", "dead-inspect", url, dead[0]).stdout)
    assert obj["reason_name"] == "consumer_rejected" and obj["state"] == "dead"
    requeued = ok(env, "admin", "requeue", url, dead[0])
    new_id = field(requeued.stdout, "requeued_as")
    assert field(requeued.stdout, "job_id") == dead[0] and field(requeued.stdout, "path").endswith(new_id)
    assert json.loads(ok(env, "--json", "show", url, new_id, "--no-journal").stdout)["payload_head_text"] == "poison 0"
    again = json.loads(ok(env, "--json", "admin", "requeue", url, "--all").stdout)  # the bulk form, repeated
    assert again["requeued"] == 2 and {o["to"].rsplit("/", 1)[1] for o in again["objects"]} >= {new_id}
    dry = json.loads(ok(env, "--json", "admin", "purge", url, "dead", "--dry-run").stdout)
    assert dry["selected"] == 2 and dry["dry_run"]
    assert "removed" in ok(env, "admin", "dead-remove", url, dead[1]).stderr
    assert run(env, "admin", "dead-inspect", url, dead[1]).stdout.strip() == ""

    (finding,) = json.loads(ok(env, "--json", "admin", "quarantine-list", url).stdout)
    assert finding["path"] == rel and finding["reason"] == QuarantineReason.ENVELOPE_CORRUPT
    assert "removed" in ok(env, "admin", "quarantine-remove", url, finding["quarantine_id"]).stderr
    assert json.loads(ok(env, "--json", "admin", "quarantine-list", url).stdout) == []


def test_stats_ls_requeue_and_purge_agree_on_what_a_dead_job_is_on_a_live_bucket(
    seaweed: Seaweed, live_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30 on a bucket: with a key of no grammar and a correctly sealed dead record under the wrong shard
    planted in dead/ beside one dead job, stats said 2 dead jobs (by key names) while ls, requeue and purge
    selected 1. Every view now says 1, stats counts the two others as strays, and purge leaves them alone."""
    env, url = live_queue(seaweed, live_prefix, tmp_path, monkeypatch)
    q = open_queue(url)
    try:
        job = q.enqueue(b"poison")
        lease = q.lease(duration=600)
        assert lease is not None
        q.bury(lease, reason=DeadReason.CONSUMER_REJECTED)
        layout = q.layout  # type: ignore[attr-defined]
    finally:
        q.close()
    raw = bytes.fromhex(job)
    home = keys.shard_of(layout.queue_id, raw, layout.format.shard_count)
    real = keys.dead_key(home, raw)
    wrong_shard = keys.dead_key(home + 1, raw)  # the live queue has one shard: 0001 is no shard of it
    garbage = f"dead/{home:04x}/not-a-job.txt"
    store = seaweed.store(LIVE_BUCKET, create=False)
    try:
        record = read_record(store.get(f"{live_prefix}q/{real}").body, layout.queue_id, real,
                             required_feature_bits=DEFAULT_FORMAT.required_feature_bits)  # fmt: skip
        store.put_if_absent(f"{live_prefix}q/{wrong_shard}", layout.encode(wrong_shard, record))
        store.put_if_absent(f"{live_prefix}q/{garbage}", b"garbage")
    finally:
        store.close()

    doc = json.loads(ok(env, "--json", "stats", url).stdout)
    assert (doc["dead"]["objects"], doc["stray"]["objects"]) == (1, 2), doc
    assert "steadq_stray_objects 2" in ok(env, "stats", url, "--prometheus").stdout.splitlines()
    assert "stray: 2" in ok(env, "stats", url).stdout
    assert [d["job_id"] for d in json.loads(ok(env, "--json", "ls", url, "dead").stdout)] == [job]
    assert [d["job_id"] for d in json.loads(ok(env, "--json", "admin", "dead-list", url).stdout)] == [job]
    for args in (("requeue", url, "--all"), ("purge", url, "dead")):
        dry = ok(env, "admin", *args, "--dry-run")
        assert [line.split()[2] for line in dry.stdout.splitlines()] == [job], dry
        assert "1 of 1 dead jobs selected" in dry.stderr
    purged = ok(env, "admin", "purge", url, "dead")
    assert purged.stdout.split()[1] == job, purged
    doc = json.loads(ok(env, "--json", "stats", url).stdout)
    assert (doc["dead"]["objects"], doc["stray"]["objects"]) == (0, 2), doc
