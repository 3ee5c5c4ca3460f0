"""An idle worker on a bucket queue: LISTs per minute, counted at the store, and its wake latency after an enqueue.

    .venv/bin/python -m benchmarks.bucket_idle [--profile quick] [--out FILE.json]
    .venv/bin/python -m benchmarks run --sections bucket_idle

Starts one same-host SeaweedFS (``tests/stowq/seaweed.py``) and a queue with
the default FORMAT (16 shards). Three idle consumers are run for the same
time, each alone, every store call counted by :class:`CountingStore`:

* ``lease(wait=)``: the handle's own polling (a claim pass over every shard,
  pauses doubling from 50 ms to 2 s), what an idle consumer did before the watch;
* the ready watch (``steadqd.s3.watch``) at its default cap (2 s) and at 10 s;

Then the wake latency: a consumer that waits on the watch (idle at its cap)
and makes a claim pass when woken, as the worker daemon does; a producer
enqueues one job at a random moment, and the time from the enqueue's return
to the lease in hand is taken, with the doorbell (same host) and without it.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from steadqd.s3 import doorbell
from steadqd.s3.handle import BucketQueue
from steadqd.s3.watch import DEFAULT_POLL_MAX_S, BucketReadyWatch, idle_lists_per_minute

from .bucket_queue import CountingStore, run_alone, seaweed_section

__all__ = ["SIZES", "markdown", "section"]

BUCKET = "steadq-bench-idle"
SAFETY_RESCAN_S = 60.0  # the worker daemon's (daemon/worker/role.py SAFETY_RESCAN), for the stated bound
SIZES: dict[str, dict[str, Any]] = {
    # settle_s: how long a consumer idles before the enqueue (4 s: past the ramp of short pauses),
    # phase_s: the random time added, to land anywhere in the rotation (6 s: three pauses at 2 s).
    "smoke": {"idle_s": 1.0, "trials_bell": 1, "trials_poll": 1, "settle_s": 0.5, "phase_s": 0.5},
    "quick": {"idle_s": 20.0, "trials_bell": 5, "trials_poll": 5, "settle_s": 4.0, "phase_s": 6.0},
    "full": {"idle_s": 120.0, "trials_bell": 20, "trials_poll": 10, "settle_s": 4.0, "phase_s": 6.0},
}


def _lists(store: CountingStore) -> int:
    return sum(n for (op, _), n in store.calls.items() if op == "list")


def _idle_lease(q: BucketQueue, store: CountingStore, seconds: float) -> dict[str, Any]:
    before, t = _lists(store), time.monotonic()
    assert q.lease(wait=seconds, duration=30) is None
    spent = time.monotonic() - t
    return {"consumer": "lease(wait=) polling", "seconds": round(spent, 1), "lists": _lists(store) - before}


def _idle_watch(q: BucketQueue, store: CountingStore, seconds: float, cap: float) -> dict[str, Any]:
    watch = BucketReadyWatch(q.layout, poll_max_s=cap, doorbell=False)
    before, t = _lists(store), time.monotonic()
    try:
        watch.watch_missing()
        watch.wait(seconds)
    finally:
        watch.close()
    spent = time.monotonic() - t
    return {"consumer": f"ready watch, cap {cap:g} s", "seconds": round(spent, 1), "lists": _lists(store) - before}


def _per_minute(row: dict[str, Any]) -> dict[str, Any]:
    row["lists_per_minute"] = round(row["lists"] * 60 / row["seconds"], 1) if row["seconds"] else None
    return row


def _one_wake(
    q: BucketQueue, producer: BucketQueue, *, bell: bool, cap: float, settle: float, phase: float
) -> float | None:
    """One trial: seconds from the enqueue's return to the lease in hand (None if never woken)."""
    watch = BucketReadyWatch(q.layout, poll_max_s=cap, doorbell=bell)
    got, stop = threading.Event(), threading.Event()
    leased_at: list[float] = []

    def consume() -> None:
        while not stop.is_set():
            if watch.wait(0.5):
                lease = q.claim_once(duration=30)
                if lease is not None:
                    leased_at.append(time.monotonic())
                    q.ack(lease)
                    got.set()
                    return

    try:
        watch.watch_missing()
        thread = threading.Thread(target=consume)
        thread.start()
        # Idle at the cap (the ramp 0.25 + 0.5 + 1 + 2 s is over), at a random phase of the rotation.
        time.sleep(settle + random.uniform(0, phase))
        producer.enqueue(b"wake")
        enqueued = time.monotonic()
        got.wait(10 * cap + 30)
        stop.set()
        thread.join()
    finally:
        watch.close()
    return leased_at[0] - enqueued if leased_at else None


def _wake(
    q: BucketQueue, producer: BucketQueue, *, bell: bool, trials: int, cap: float, settle: float, phase: float
) -> dict[str, Any]:
    """Enqueue → lease in hand, as a worker waiting on the watch sees it."""
    found = [_one_wake(q, producer, bell=bell, cap=cap, settle=settle, phase=phase) for _ in range(trials)]
    samples = [x for x in found if x is not None]
    return {
        "doorbell": bell,
        "trials": trials,
        "woken": len(samples),
        "median_ms": round(statistics.median(samples) * 1000, 1) if samples else None,
        "max_ms": round(max(samples) * 1000, 1) if samples else None,
        "min_ms": round(min(samples) * 1000, 1) if samples else None,
    }


def section(profile: str, base: str) -> dict[str, Any]:
    return seaweed_section(profile, base, SIZES, "bucket-idle-", _measure_with_doorbells)


def _measure_with_doorbells(root: Path, weed: str, size: dict[str, Any], out: dict[str, Any]) -> None:
    bells = Path(tempfile.mkdtemp(prefix="bell-", dir="/tmp"))  # a socket path has at most 107 bytes
    old = os.environ.get(doorbell.DOORBELL_DIR_ENV)
    os.environ[doorbell.DOORBELL_DIR_ENV] = str(bells)
    try:
        _measure(root, weed, size, out)
    finally:
        if old is None:
            os.environ.pop(doorbell.DOORBELL_DIR_ENV, None)
        else:
            os.environ[doorbell.DOORBELL_DIR_ENV] = old
        shutil.rmtree(bells, ignore_errors=True)


def _measure(root: Path, weed: str, size: dict[str, Any], out: dict[str, Any]) -> None:
    from tests.stowq.seaweed import running

    with running(root, weed) as server:
        server.store(BUCKET).close()
        prefix = f"idle-{os.getpid()}/"
        counted = CountingStore(server.store(BUCKET, create=False), "")
        q = BucketQueue.init(counted, prefix, certify_store=False)
        producer = BucketQueue.open(server.store(BUCKET, create=False), prefix, certify_store=False)
        try:
            shards = q.layout.format.shard_count
            seconds = size["idle_s"]
            out["shards"] = shards
            out["idle"] = [
                _per_minute(_idle_lease(q, counted, seconds)),
                _per_minute(_idle_watch(q, counted, seconds, DEFAULT_POLL_MAX_S)),
                _per_minute(_idle_watch(q, counted, seconds, 10.0)),
            ]
            out["bound"] = {
                f"cap {cap:g} s": idle_lists_per_minute(cap, shards, SAFETY_RESCAN_S)
                for cap in (DEFAULT_POLL_MAX_S, 10.0)
            }
            idle = {"cap": DEFAULT_POLL_MAX_S, "settle": size["settle_s"], "phase": size["phase_s"]}
            out["wake"] = [
                _wake(q, producer, bell=True, trials=size["trials_bell"], **idle),
                _wake(q, producer, bell=False, trials=size["trials_poll"], **idle),
            ]
        finally:
            producer.close()
            q.close()
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]


def markdown(r: dict[str, Any]) -> list[str]:
    if "idle" not in r:
        return [f"Idle bucket worker: {r.get('skipped') or r.get('error') or 'not run'}\n"]
    lines = [
        f"## An idle worker on a bucket queue ({r['engine']}, {r['shards']} shards)\n",
        "| idle consumer | seconds | LISTs | LISTs per minute |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {x['consumer']} | {x['seconds']} | {x['lists']} | {x['lists_per_minute']} |" for x in r["idle"]]
    bound = ", ".join(f"{k}: {v:g}" for k, v in r["bound"].items())
    lines += [
        "",
        f"Stated bound with the worker's safety rescan (one claim pass a minute): {bound} LISTs a minute.",
        "",
    ]
    lines += ["| wake after an enqueue | woken | median ms | min ms | max ms |", "|---|---:|---:|---:|---:|"]
    for w in r["wake"]:
        how = "doorbell (same host)" if w["doorbell"] else "polling only (cap 2 s)"
        lines.append(f"| {how} | {w['woken']}/{w['trials']} | {w['median_ms']} | {w['min_ms']} | {w['max_ms']} |")
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    return run_alone("bucket_idle", __doc__, argv, SIZES, section, markdown, "idle")


if __name__ == "__main__":
    sys.exit(main())
