"""Operator views of a bucket queue on the memory store: each state derived from the job's graph, and their costs.

The store's clock is moved by the test, so leases expire and delays pass
without waiting; the fault injector's trace counts what each view asks of
the store.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from steadqd.backend import open_queue
from steadqd.cli.show_cmd import story_lines
from steadqd.cli.view_cmd import format_stats_prometheus
from steadqd.constants import DeadReason
from steadqd.errors import CorruptRecord, ErrorKind, InvalidInput, SteadQError
from steadqd.s3 import keys
from steadqd.s3.backend import BucketBackend
from steadqd.s3.layout import DEFAULT_FORMAT, init_layout
from steadqd.s3.records import DeadRecord, JobRecord, QuarantineReason
from steadqd.s3.store.faults import FaultyStore
from steadqd.s3.store.memory import ManualClock, MemoryStore
from steadqd.s3.verify import read_record
from steadqd.s3.views import STATS_STATES
from tests.stowq.seaweed import Seaweed
from tests.stowq.test_cli_bucket import live_queue, ok, run

SECOND = 1_000_000_000
PREFIX = "farm/"
LEASE_S = 5.0


class _Queue:
    def __init__(self) -> None:
        self.clock = ManualClock(step_ns=1000)
        self.memory = MemoryStore(clock=self.clock)
        self.store = FaultyStore(self.memory)
        layout = init_layout(self.store, PREFIX, worker_id="render-1", certify_store=False)
        self.q = BucketBackend(layout, url="s3://mem/farm", floor_staleness_s=0)

    def rels(self, plane: str) -> list[str]:
        return [k[len(PREFIX) :] for k in self.memory.keys(PREFIX + plane)]

    def overwrite(self, rel: str, body: bytes) -> None:
        self.memory.delete(PREFIX + rel)
        self.memory.put_if_absent(PREFIX + rel, body)

    def flip(self, rel: str, at: int = 40) -> None:
        body = bytearray(self.memory.snapshot()[PREFIX + rel])
        body[at] ^= 0xFF
        self.overwrite(rel, bytes(body))

    def record(self, rel: str) -> object:
        body = self.memory.snapshot()[PREFIX + rel]
        return read_record(
            body, self.q.layout.queue_id, rel, required_feature_bits=DEFAULT_FORMAT.required_feature_bits
        )

    def counts(self) -> dict[str, int]:
        return {k: v.objects for k, v in self.q.stats().items() if v.objects}

    def state(self, job_id: str) -> str:
        story = self.q.job_story(job_id)
        assert story is not None
        return story.state


@pytest.fixture
def b() -> Iterator[_Queue]:
    yield _Queue()


def test_a_job_never_claimed_is_ready_with_its_payload_verified(b: _Queue) -> None:
    job = b.q.enqueue(b'{"frame": 1}', content_type="application/json", max_attempts=4)
    assert b.counts() == {"ready": 1}
    (obj,) = b.q.inspect_detailed(job)
    assert (obj.state, obj.generation, obj.attempt, obj.max_attempts) == ("ready", 0, 0, 4)
    assert obj.path == b.q.job_key(job)
    story = b.q.job_story(job)
    assert story is not None and story.state == "ready" and story.current == obj
    assert story.file is not None and story.file.payload_verified and story.file.payload_head == b'{"frame": 1}'
    assert story.file.content_type == "application/json" and story.file.metadata is None
    (entry,) = b.q.list_jobs({"ready"})
    assert (entry.job_id, entry.state, entry.deadline_ns, entry.max_attempts) == (job, "ready", None, 4)
    out = io.BytesIO()
    assert b.q.copy_job_payload(job, out) == 12 and out.getvalue() == b'{"frame": 1}'


def test_a_job_with_not_before_ahead_of_the_floor_is_delayed_until_it_passes(b: _Queue) -> None:
    job = b.q.enqueue(b"later", delay=30)
    assert b.counts() == {"delayed": 1}
    (obj,) = b.q.inspect_detailed(job)
    assert obj.state == "delayed" and obj.details["cause"] == "not_before"
    due = obj.details["not_before_ns"]
    assert isinstance(due, int) and due >= b.q.wall_floor_ns() + 30 * SECOND - SECOND
    (entry,) = b.q.list_jobs({"delayed"})
    assert entry.deadline_ns == due
    b.clock.advance(DEFAULT_FORMAT.delayed_bucket_width_ns + 31 * SECOND)
    assert b.counts() == {"ready": 1} and b.state(job) == "ready"


def test_a_held_claim_is_leased_showing_owner_and_expiry_but_not_the_token(b: _Queue) -> None:
    job = b.q.enqueue(b"work")
    lease = b.q.lease(duration=LEASE_S)
    assert lease is not None
    assert b.counts() == {"leased": 1}
    assert {k: v.objects for k, v in b.q.entry_stats().items() if v.objects} == {"ready": 1}
    (obj,) = b.q.inspect_detailed(job)
    assert (obj.state, obj.generation, obj.attempt) == ("leased", 1, 1)
    assert obj.path == f"claims/{lease.shard:04x}/{job}/00000001"
    d = obj.details
    assert d["worker_id"] == "render-1" and d["token_prefix"] == lease.worker_token[:4].hex()
    assert lease.worker_token.hex() not in repr(d)
    assert d["wall_deadline_ns"] == lease.expires_ns
    (entry,) = b.q.list_jobs({"leased", "ready"})
    assert entry.state == "leased" and entry.deadline_ns == lease.expires_ns


def test_an_expired_claim_is_ready_again_and_a_nack_is_delayed_until_deadline_and_expiry(b: _Queue) -> None:
    job = b.q.enqueue(b"work")
    lease = b.q.lease(duration=LEASE_S)
    assert lease is not None
    b.clock.advance(lease.lease_duration_ns + 2 * SECOND)
    assert b.state(job) == "ready" and b.counts() == {"ready": 1}
    again = b.q.lease(duration=LEASE_S)
    assert again is not None and again.generation == 2
    b.q.retry(again, delay=60)
    (obj,) = b.q.inspect_detailed(job)
    assert obj.state == "delayed" and obj.details["cause"] == "retry" and obj.generation == 2
    assert b.counts() == {"delayed": 1}
    b.clock.advance(61 * SECOND)
    assert b.state(job) == "ready" and b.counts() == {"ready": 1}


def test_done_and_dead_jobs_show_their_terminal_record(b: _Queue) -> None:
    done, dead = b.q.enqueue(b"ok"), b.q.enqueue(b"bad")
    for _ in range(2):
        lease = b.q.lease(duration=LEASE_S)
        assert lease is not None
        if lease.job_id == done:
            b.q.ack(lease)
        else:
            b.q.bury(lease, reason=DeadReason.CONSUMER_REJECTED)
    assert b.counts() == {"receipts": 1, "dead": 1}
    (receipt,) = b.q.inspect_detailed(done)
    assert receipt.state == "receipt" and receipt.path.startswith("receipts/") and receipt.generation == 1
    (dead_obj,) = b.q.inspect_detailed(dead)
    assert dead_obj.state == "dead" and dead_obj.details["reason"] == DeadReason.CONSUMER_REJECTED
    story = b.q.job_story(dead)
    assert story is not None and story.reason == DeadReason.CONSUMER_REJECTED and story.file is not None
    assert story.file.payload_verified  # the graph keeps the payload until GC
    assert [e.job_id for e in b.q.list_jobs({"dead"})] == [dead]
    assert [e.job_id for e in b.q.list_jobs({"receipt"})] == [done]
    assert list(b.q.list_jobs({"ready", "leased", "delayed"})) == []


def test_a_corrupt_job_record_is_quarantined_in_every_view_and_its_payload_never_shown(b: _Queue) -> None:
    job = b.q.enqueue(b"secret-ish")
    rel = b.q.job_key(job)
    b.flip(rel)
    story = b.q.job_story(job)
    assert story is not None and story.state == "quarantine" and story.path == rel
    assert story.reason == QuarantineReason.ENVELOPE_CORRUPT and story.quarantine_id is None  # no finding yet
    assert story.current is None and story.file is not None and not story.file.payload_verified
    assert story.file.problem is not None and story.file.payload_head == b""
    shown = story_lines(story, None)
    assert shown[0] == f"job {job}: quarantine: envelope_corrupt (0x0001)"
    assert any(line.startswith("  problem:") for line in shown) and not any("acknowledged" in x for x in shown)
    assert b.q.inspect_detailed(job) == [] and list(b.q.list_jobs({"ready", "delayed", "leased", "dead"})) == []
    with pytest.raises(CorruptRecord):
        b.q.copy_job_payload(job, io.BytesIO())
    assert b.q.lease() is None  # the claim path records the finding
    assert b.counts() == {"quarantine": 1}
    story = b.q.job_story(job)
    assert story is not None and story.quarantine_id is not None
    (finding,) = b.q.list_quarantine()
    assert finding.quarantine_id == story.quarantine_id and finding.path == rel


def test_a_corrupt_detached_payload_makes_the_job_quarantined_and_nothing_is_written_out(b: _Queue) -> None:
    size = DEFAULT_FORMAT.inline_limit + 1
    job = b.q.enqueue(b"y" * size)
    record = b.record(b.q.job_key(job))
    assert isinstance(record, JobRecord) and record.payload_key is not None
    b.overwrite(record.payload_key, b"z" * size)
    story = b.q.job_story(job)
    assert story is not None and story.state == "quarantine" and story.path == record.payload_key
    assert story.reason == QuarantineReason.PAYLOAD_CORRUPT
    assert story.file is not None and not story.file.payload_verified and story.file.payload_head == b""
    assert story.file.problem is not None and "payload" in story.file.problem
    out = io.BytesIO()
    with pytest.raises(CorruptRecord, match="payload"):
        b.q.copy_job_payload(job, out)
    assert out.getvalue() == b""


def test_a_missing_job_and_a_bad_id(b: _Queue) -> None:
    assert b.q.job_story("0" * 32) is None and b.q.inspect_detailed("0" * 32) == []
    with pytest.raises(SteadQError, match="not found"):
        b.q.copy_job_payload("0" * 32, io.BytesIO())
    with pytest.raises(InvalidInput, match="32 lowercase hex"):
        b.q.inspect_detailed("XYZ")


def test_views_write_nothing_but_clock_beacons(b: _Queue) -> None:
    job = b.q.enqueue(b"a")
    b.flip(b.q.job_key(job))
    b.q.enqueue(b"b", delay=10)
    before = {k: v for k, v in b.memory.snapshot().items() if "/meta/clock/" not in f"/{k}"}
    b.q.stats()
    b.q.entry_stats()
    list(b.q.list_jobs({"ready", "leased", "delayed", "dead", "receipt"}))
    b.q.job_story(job)
    after = {k: v for k, v in b.memory.snapshot().items() if "/meta/clock/" not in f"/{k}"}
    assert after == before


def _ops(b: _Queue, fn: object) -> dict[str, int]:
    start = len(b.store.trace)
    assert callable(fn)
    fn()
    counts: dict[str, int] = {}
    for call in b.store.trace[start:]:
        if "/meta/" not in f"/{call.key}":  # the floor's beacon and watermark
            counts[call.op] = counts.get(call.op, 0) + 1
    return counts


def test_inspect_and_show_cost_what_their_docstrings_say(b: _Queue) -> None:
    job = b.q.enqueue(b"x")
    lease = b.q.lease(duration=LEASE_S)
    assert lease is not None
    b.q.retry(lease, delay=1)
    assert _ops(b, lambda: b.q.inspect_detailed(job)) == {"get": 5, "list": 2}
    # show: the same graph, plus a HEAD for the finding only when the job is found corrupt
    assert _ops(b, lambda: b.q.job_story(job)) == {"get": 5, "list": 2}


def test_stats_lists_each_plane_once_and_reads_no_record_of_a_ready_job(b: _Queue) -> None:
    for i in range(30):
        b.q.enqueue(b"%d" % i)
    ops = _ops(b, b.q.stats)
    assert ops == {"list": 7}  # jobs, claims, fails, receipts, dead, delayed, quarantine; one page each
    assert b.counts() == {"ready": 30}
    assert set(b.q.stats()) == set(STATS_STATES)


# -- the command line on a live bucket, beside a filesystem queue given the same jobs ----------


def _populate(url: str) -> dict[str, str]:
    """One job in each state a view shows (ready, delayed, leased, done, dead), made through the library."""
    q = open_queue(url)
    try:
        jobs = {name: q.enqueue(name.encode()) for name in ("done", "dead", "leased")}
        for _ in range(3):
            lease = q.lease(duration=600)
            assert lease is not None
            if lease.job_id == jobs["done"]:
                q.ack(lease)
            elif lease.job_id == jobs["dead"]:
                q.bury(lease, reason=DeadReason.CONSUMER_REJECTED)
        jobs["ready"] = q.enqueue(b'{"frame": 7}', content_type="application/json")
        jobs["delayed"] = q.enqueue(b"later", delay=3600)
        return jobs
    finally:
        q.close()


# What ``ls --json`` and ``inspect --json`` give for each object, as on a filesystem queue (cli.md).
LS_KEYS = {"state", "job_id", "generation", "attempt", "max_attempts", "age_seconds", "deadline_ns", "path"}
INSPECT_KEYS = {"state", "generation", "attempt", "max_attempts", "path", "details"}


def test_stats_ls_inspect_show_on_a_live_bucket_have_the_filesystem_shapes(
    seaweed: Seaweed, live_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, url = live_queue(seaweed, live_prefix, tmp_path, monkeypatch)
    jobs = _populate(url)

    stats = json.loads(ok(env, "--json", "stats", url).stdout)
    assert {k: v["objects"] for k, v in stats.items()} == {
        "dead": 1, "delayed": 1, "quarantine": 0, "ready": 2, "receipts": 1, "running": 1,
    }  # fmt: skip
    assert all(set(v) == {"objects", "oldest_age_seconds"} for v in stats.values())
    frame = ok(env, "watch", url, "--count", "1", "--interval", "0").stdout
    assert "throughput: (measuring)" in frame
    rows = {
        x.split()[0]: int(x.split()[1]) for x in frame.splitlines()[3:] if len(x.split()) > 1 and x.split()[1].isdigit()
    }
    assert rows["running"] == 1 and rows["ready"] == 1 and "leased" not in rows, frame
    plain = ok(env, "stats", url).stdout.splitlines()
    assert plain[0].startswith("dead: 1 (oldest ") and plain[2] == "quarantine: 0" and plain[3].startswith("ready: 2")
    assert plain[-1].startswith("running: 1 (oldest ")

    refused = run(env, "ls", url, "--meta", "task")  # issue 33 #8: a StowQ/1 job record has no metadata
    assert refused.returncode == 1 and refused.stdout == "", refused
    assert refused.stderr.strip() == (
        "ls --meta/--filter: the jobs of a bucket queue carry no metadata (a StowQ/1 job record has none)"
    )

    listed = json.loads(ok(env, "--json", "ls", url, "all").stdout)
    assert {d["job_id"]: d["state"] for d in listed} == {j: s.replace("done", "receipt") for s, j in jobs.items()}
    by_state = {d["state"]: d for d in listed}
    assert all(set(d) == LS_KEYS for s, d in by_state.items() if s != "dead")
    assert set(by_state["dead"]) == LS_KEYS | {"reason", "reason_name"}
    assert by_state["dead"]["reason_name"] == "consumer_rejected"
    assert by_state["leased"]["deadline_ns"] > time.time_ns() and by_state["leased"]["path"].startswith("claims/")
    assert by_state["delayed"]["deadline_ns"] > time.time_ns() + 3000 * SECOND

    (leased,) = json.loads(ok(env, "--json", "inspect", url, jobs["leased"]).stdout)
    assert set(leased) == INSPECT_KEYS and (leased["state"], leased["generation"], leased["attempt"]) == (
        "leased",
        1,
        1,
    )
    assert set(leased["details"]) >= {"worker_id", "token_prefix", "wall_deadline_ns"}

    story = json.loads(ok(env, "--json", "show", url, jobs["ready"], "--no-journal").stdout)
    assert story["state"] == "ready" and story["payload_verified"] and story["payload_head_text"] == '{"frame": 7}'
    assert story["metadata"] == {} and story["producer_id"] is None and story["content_type"] == "application/json"
    text = ok(env, "show", url, jobs["leased"], "--no-journal").stdout
    assert "lease until:" in text and "payload:       6 bytes, verified" in text
    assert ok(env, "show", url, jobs["ready"], "--payload").stdout == '{"frame": 7}'


def test_claims_without_a_job_record_are_quarantined_under_the_repair_scans_finding(b: _Queue) -> None:
    job = b.q.enqueue(b"x")
    assert b.q.lease(duration=LEASE_S) is not None
    b.memory.delete(PREFIX + b.q.job_key(job))
    story = b.q.job_story(job)
    assert story is not None and story.state == "quarantine" and story.path == b.q.job_key(job)
    assert story.reason == QuarantineReason.KEY_RECORD_MISMATCH and story.quarantine_id is None
    b.q.fsck(repair=True)
    story = b.q.job_story(job)
    assert story is not None and story.quarantine_id in {f.quarantine_id for f in b.q.list_quarantine()}


# -- one definition of a dead job: stats, ls, requeue and purge agree (issue 30) -------------------


def _id_in(b: _Queue, shard: int | None = None, not_shard: int | None = None) -> bytes:
    """A fresh job id that maps to ``shard`` (or to any shard but ``not_shard``)."""
    count = b.q.layout.format.shard_count
    for _ in range(10_000):
        raw = os.urandom(16)
        home = keys.shard_of(b.q.layout.queue_id, raw, count)
        if (shard is None or home == shard) and home != not_shard:
            return raw
    raise AssertionError("no such job id in 10,000 tries")


def plant_in_dead(b: _Queue, dead_job: str) -> dict[str, str]:
    """Plant, beside the dead job ``dead_job``, what a writer to the bucket can put under ``dead/`` that is not a
    dead job of the queue: a key of no grammar, and a correctly sealed copy of its dead record under a shard its
    id does not map to. Returns {what: relative key}."""
    raw = bytes.fromhex(dead_job)
    count = b.q.layout.format.shard_count
    home = keys.shard_of(b.q.layout.queue_id, raw, count)
    record = b.record(keys.dead_key(home, raw))
    assert isinstance(record, DeadRecord)
    wrong_shard = keys.dead_key((home + 1) % count, raw)
    planted = {"garbage": f"dead/{home:04x}/not-a-job.txt", "wrong shard": wrong_shard}
    b.memory.put_if_absent(PREFIX + planted["garbage"], b"garbage")
    b.memory.put_if_absent(PREFIX + wrong_shard, b.q.layout.encode(wrong_shard, record))
    return planted


def _bury(b: _Queue, n: int) -> list[str]:
    jobs = [b.q.enqueue(b"poison %d" % i) for i in range(n)]
    for _ in jobs:
        lease = b.q.lease(duration=LEASE_S)
        assert lease is not None
        b.q.bury(lease, reason=DeadReason.CONSUMER_REJECTED)
    return sorted(jobs)


def test_stats_counts_as_dead_only_what_ls_requeue_and_purge_select_and_the_rest_as_stray(b: _Queue) -> None:
    """Issue 30: stats counted a dead key by its name alone, ls by its verified record. A garbage key and a
    correctly sealed dead record under the wrong shard are no dead job: stats now counts them as strays."""
    (job,) = _bury(b, 1)
    planted = plant_in_dead(b, job)
    counts = b.counts()
    assert (counts.get("dead"), counts.get("stray")) == (1, 2), counts
    entry = {k: v.objects for k, v in b.q.entry_stats().items()}
    assert (entry["dead"], entry["stray"]) == (1, 2)
    assert "steadq_stray_objects 2" in format_stats_prometheus(b.q.entry_stats()).splitlines()
    assert [e.job_id for e in b.q.list_jobs({"dead"})] == [job]
    b.q.remove_dead(job)
    assert set(planted.values()) <= set(b.rels("dead/"))  # looked at, never touched
    counts = b.counts()
    assert (counts.get("dead"), counts.get("stray")) == (None, 2), counts


def test_a_dead_record_that_fails_verification_is_dead_to_stats_until_its_finding_then_quarantine(b: _Queue) -> None:
    """The listing cannot check a record's key tag: stats counts an own-shard dead key whose record is bound to
    another key as dead (docs/stowq.md says so), ls and the admin commands do not select it, and once fsck
    --repair has recorded its finding stats counts it under quarantine, no longer as dead."""
    (job,) = _bury(b, 1)
    raw = bytes.fromhex(job)
    body = b.memory.snapshot()[PREFIX + keys.dead_key(keys.shard_of(b.q.layout.queue_id, raw, 16), raw)]
    other = _id_in(b)
    rel = keys.dead_key(keys.shard_of(b.q.layout.queue_id, other, 16), other)
    b.memory.put_if_absent(PREFIX + rel, body)  # job's dead record under another job's key: the key tag fails
    assert b.counts() == {"dead": 2}
    assert [e.job_id for e in b.q.list_jobs({"dead"})] == [job]
    with pytest.raises(CorruptRecord):
        b.q.requeue_dead(other.hex())
    b.q.fsck(repair=True)
    assert b.counts() == {"dead": 1, "quarantine": 1}
    (finding,) = b.q.list_quarantine()
    assert finding.path == rel


def test_a_dead_record_beside_a_receipt_that_fails_verification_is_no_dead_job(b: _Queue) -> None:
    """A receipt key decides, as in stats (which cannot read it): a corrupt receipt does not let the dead record
    beside it make the job dead in ls, requeue or purge; the job is quarantine (show tells)."""
    (job,) = _bury(b, 1)
    raw = bytes.fromhex(job)
    shard = keys.shard_of(b.q.layout.queue_id, raw, 16)
    b.memory.put_if_absent(PREFIX + keys.receipt_key(shard, raw), b"not a receipt")
    assert b.counts() == {"receipts": 1}
    assert list(b.q.list_jobs({"dead", "receipt"})) == []
    assert b.state(job) == "quarantine"
    for act in (b.q.requeue_dead, b.q.remove_dead):
        with pytest.raises(InvalidInput, match="receipt"):
            act(job)


def test_a_dead_job_whose_job_record_is_gone_is_dead_everywhere_and_purge_finishes_it(b: _Queue) -> None:
    """A removal stopped after the job record went leaves a dead record alone: still a dead job for every view;
    requeue names why it cannot (not "gone"), and removal finishes the graph."""
    (job,) = _bury(b, 1)
    raw = bytes.fromhex(job)
    b.memory.delete(PREFIX + keys.job_key(keys.shard_of(b.q.layout.queue_id, raw, 16), raw))
    assert b.counts() == {"dead": 1}
    assert [e.job_id for e in b.q.list_jobs({"dead"})] == [job]
    with pytest.raises(SteadQError, match="job record") as e:
        b.q.requeue_dead(job)
    assert e.value.kind is not ErrorKind.NOT_FOUND  # bulk requeue would say "gone since it was listed"
    b.q.remove_dead(job)
    assert b.counts() == {}


def test_a_finding_about_a_key_under_another_shard_does_not_hide_the_job(b: _Queue) -> None:
    """fsck --repair records a finding about a stray key under the wrong shard; stats took the finding's job id
    for the real job's and stopped counting it, while ls listed it ready."""
    job = b.q.enqueue(b"real")
    raw = bytes.fromhex(job)
    home = keys.shard_of(b.q.layout.queue_id, raw, 16)
    record = b.record(keys.job_key(home, raw))
    stray = keys.job_key((home + 1) % 16, raw)
    b.memory.put_if_absent(PREFIX + stray, b.q.layout.encode(stray, record))  # type: ignore[arg-type]
    assert b.counts() == {"ready": 1, "stray": 1}
    b.q.fsck(repair=True)
    assert [f.path for f in b.q.list_quarantine()] == [stray]
    assert [e.job_id for e in b.q.list_jobs({"ready"})] == [job]
    assert b.counts() == {"ready": 1, "quarantine": 1}  # the stray is counted by its finding now


def test_a_job_a_finding_names_is_in_quarantine_for_ls_as_for_stats(b: _Queue) -> None:
    """A worker found the detached payload corrupt and recorded the finding: stats counted the job under
    quarantine (by its finding) while ls still listed it leased, and ready once the lease ran out."""
    size = DEFAULT_FORMAT.inline_limit + 1
    job = b.q.enqueue(b"y" * size)
    record = b.record(b.q.job_key(job))
    assert isinstance(record, JobRecord) and record.payload_key is not None
    b.overwrite(record.payload_key, b"z" * size)
    lease = b.q.lease(duration=LEASE_S)
    assert lease is not None
    with pytest.raises(CorruptRecord):
        b.q.read_payload(lease)
    assert b.counts() == {"quarantine": 1} and b.state(job) == "quarantine"
    assert list(b.q.list_jobs({"ready", "leased", "delayed", "dead", "receipt"})) == []
    b.clock.advance(int(LEASE_S * SECOND) + 10 * SECOND)
    assert b.counts() == {"quarantine": 1}
    assert list(b.q.list_jobs({"ready", "leased", "delayed"})) == []
