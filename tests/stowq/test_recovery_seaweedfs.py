"""Recovery, the repair scan and GC live against SeaweedFS, through the library and through ``steadq``.

The queue has one-second buckets (SeaweedFS's granularity, the narrowest a
FORMAT may have here), so a lease bucket is due a few seconds after it
expires instead of a minute; the whole test waits about ten seconds.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from steadqd.s3 import keys
from steadqd.s3.backend import BucketBackend
from steadqd.s3.layout import DEFAULT_FORMAT, init_layout, open_layout
from steadqd.s3.store.base import SECOND_NS
from tests.stowq.conftest import LIVE_BUCKET
from tests.stowq.seaweed import Seaweed
from tests.stowq.test_cli_bucket import live_queue, ok, run

LEASE_S = 2
FAST = replace(
    DEFAULT_FORMAT,
    shard_count=2,
    lease_bucket_width_ns=SECOND_NS,
    delayed_bucket_width_ns=SECOND_NS,
    terminal_bucket_width_ns=SECOND_NS,
)


def _until(check: object, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("the store time did not move on")
        time.sleep(0.5)


def test_sweep_gc_and_repair_on_seaweedfs(seaweed: Seaweed, live_prefix: str) -> None:
    store = seaweed.store(LIVE_BUCKET)
    try:
        layout = init_layout(store, live_prefix, fmt=FAST, worker_id="w1", certify_store=False)
        q = BucketBackend(layout, url=f"s3://{LIVE_BUCKET}/{live_prefix}", receipt_retention=1.0, floor_staleness_s=0)

        def planes(plane: str) -> list[str]:
            return [m.key[len(live_prefix) :] for m in store.list_page(live_prefix + plane).items]

        done = q.enqueue(b"done")
        lost = q.enqueue(b"its worker died")
        first = q.lease(duration=LEASE_S)
        second = q.lease(duration=LEASE_S)
        assert first is not None and second is not None
        acked, died = (first, second) if first.job_id == done else (second, first)
        q.ack(acked)
        assert died.job_id == lost and len(planes("leases/")) == 2

        reports = []

        def swept() -> bool:
            reports.append(q.recover())
            return not planes("leases/")

        _until(swept)
        assert sum(r.leases_reaped for r in reports) == 1 and not any(r.errors for r in reports)
        again = q.lease(duration=LEASE_S)
        assert again is not None and again.job_id == lost and again.generation == 2
        q.ack(again)
        _until(lambda: q.recover().receipts_deleted == 0 and not planes("receipts/"))
        assert planes("jobs/") == planes("claims/") == planes("termidx/") == []

        kept = q.enqueue(b"kept", delay=3600)
        [entry] = planes("delayed/")
        store.delete(live_prefix + entry)
        report = q.fsck(repair=True)
        assert report.indexes_regenerated == 1 and planes("delayed/") == [entry]
        assert report.exit_code == 0 and kept in entry
    finally:
        store.close()


def test_steadq_recover_and_fsck_on_a_bucket(
    seaweed: Seaweed, live_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, url = live_queue(seaweed, live_prefix, tmp_path, monkeypatch)
    ok(env, "put", url, "-", stdin=b"a job")

    recovered = ok(env, "recover", url, "--json")
    assert "reaped:0" in recovered.stderr and '"errors": []' in recovered.stdout
    assert "ops:" in ok(env, "recover", url, "--budget-ops", "0").stderr

    clean = ok(env, "fsck", url)
    assert "objects: " in clean.stderr and clean.stdout == ""

    store = seaweed.store(LIVE_BUCKET)
    try:
        layout = open_layout(store, f"{live_prefix}q/", certify_store=False)
        junk_id = os.urandom(16)
        stray = keys.job_key(keys.shard_of(layout.queue_id, junk_id, layout.format.shard_count), junk_id)
        store.put_if_absent(f"{live_prefix}q/{stray}", b"not a record")
    finally:
        store.close()
    found = run(env, "fsck", url)
    assert found.returncode == 3, found.stderr
    assert f"ERROR {stray}: record_corrupt" in found.stdout
    repaired = run(env, "fsck", url, "--repair")
    assert repaired.returncode == 3 and "quarantined: 1" in repaired.stderr
