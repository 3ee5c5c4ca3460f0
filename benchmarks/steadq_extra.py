"""steadqd-only measurements: batched mode, scaling with queue depth, the profile.

Scaling trees are written directly (valid job files, no fsync), the way
tests/integration/test_inspect.py builds its 100k-job queue: going through
``enqueue`` would spend minutes on fsyncs that say nothing about how a scan
behaves in a deep queue.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import shutil
import subprocess
import sys
import time
from collections import Counter
from typing import Any

from steadqd import Queue
from steadqd.fs import linux
from tests.fabricate import write_ready_jobs

from .common import Rate, payload_of, summary_ms


def batched(path: str, size: int, batch: int, batches: int, seconds: float, *, many: bool = True) -> dict[str, Any]:
    """Deferred mode: a batch of ``batch`` enqueues, then a batch of ``batch`` lease+ack, one barrier set each.

    With ``many`` the enqueues are one ``enqueue_many`` call (one group of file
    fsyncs); without, ``batch`` separate ``enqueue()`` calls (a file fsync each).
    """
    q = Queue.open(path, deferred=True)
    try:
        payload = payload_of(size)
        start = time.perf_counter()
        done = 0
        enq_time = 0.0
        for _ in range(batches):
            t = time.perf_counter()
            with q.batch():
                if many:
                    q.enqueue_many([payload] * batch)
                else:
                    for _ in range(batch):
                        q.enqueue(payload)
            enq_time += time.perf_counter() - t
            with q.batch():
                for _ in range(batch):
                    lease = q.lease()
                    if lease is None:
                        raise RuntimeError("batched: a job enqueued in this run is missing")
                    lease.payload()
                    q.ack(lease)
            done += batch
            if time.perf_counter() - start > seconds:
                break
        total = time.perf_counter() - start
    finally:
        q.close()
    return {
        "batch_size": batch,
        "enqueue": f"q.enqueue_many([payload] * {batch})" if many else f"{batch} x q.enqueue(payload)",
        "lifecycle": Rate(done, total).to_json(),
        "enqueue_only": Rate(done, enq_time).to_json(),
    }


def syscalls_per_job(path: str, size: int) -> dict[str, dict[str, int]]:
    """Syscalls of one warm strict lifecycle, per phase (from steadqd.fs.linux.trace)."""
    q = Queue.open(path)
    try:
        payload = payload_of(size)
        for _ in range(3):  # warm the directory cache
            q.enqueue(payload)
            lease = q.lease()
            assert lease is not None
            lease.payload()
            q.ack(lease)
        out: dict[str, dict[str, int]] = {}
        with linux.trace() as ev:
            q.enqueue(payload)
        out["enqueue"] = dict(Counter(e.op for e in ev))
        with linux.trace() as ev:
            lease = q.lease()
        out["lease"] = dict(Counter(e.op for e in ev))
        assert lease is not None
        with linux.trace() as ev:
            lease.payload()
        out["payload"] = dict(Counter(e.op for e in ev))
        with linux.trace() as ev:
            q.ack(lease)
        out["ack"] = dict(Counter(e.op for e in ev))
        return out
    finally:
        q.close()


def profile_lifecycle(path: str, size: int, jobs: int) -> dict[str, Any]:
    """cProfile of ``jobs`` strict lifecycles; the top functions by own time and by cumulative time."""
    q = Queue.open(path)
    payload = payload_of(size)
    prof = cProfile.Profile()
    try:
        start = time.perf_counter()
        prof.enable()
        for _ in range(jobs):
            q.enqueue(payload)
            lease = q.lease()
            assert lease is not None
            lease.payload()
            q.ack(lease)
        prof.disable()
        wall = time.perf_counter() - start
    finally:
        q.close()
    st = pstats.Stats(prof)
    total = st.total_tt  # type: ignore[attr-defined]

    def rows(key: str, n: int) -> list[dict[str, Any]]:
        items = []
        for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
            short = file.split("/steadqd/")[-1] if "/steadqd/" in file else os.path.basename(file)
            items.append(
                {
                    "function": f"{short}:{line}({func})",
                    "calls_per_job": round(nc / jobs, 2),
                    "own_us_per_job": round(tt / jobs * 1e6, 1),
                    "cum_us_per_job": round(ct / jobs * 1e6, 1),
                    "own_share": round(tt / total, 4) if total else 0.0,
                }
            )
        items.sort(key=lambda r: r[key], reverse=True)
        return items[:n]

    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    return {
        "jobs": jobs,
        "wall_s": round(wall, 4),
        "profiled_us_per_job": round(total / jobs * 1e6, 1),
        "top_own": rows("own_us_per_job", 20),
        "top_cumulative": rows("cum_us_per_job", 25),
        "text": buf.getvalue(),
    }


# ------------------------------------------------------------------ scaling


def scaling_point(root: str, n: int, leases: int) -> dict[str, Any]:
    """Lease latency and stats time with ``n`` ready jobs (the tree is removed afterwards)."""
    from steadqd.fs import views as insp

    path = os.path.join(root, f"scale-{n}")
    shutil.rmtree(path, ignore_errors=True)
    out: dict[str, Any] = {"ready_jobs": n}
    # Two passes of leases (each acked) must not drain the queue.
    leases = max(1, min(leases, (n - 5) // 2 - 1))
    try:
        q = Queue.init(path, shards=64)
        try:
            t = time.perf_counter()
            write_ready_jobs(q, n, payload_of(100))
            out["generate_s"] = round(time.perf_counter() - t, 2)
            os.sync()  # settle writeback so it does not land inside the measurement
            # Each lease is classified by whether it listed a whole shard directory
            # (linux.list_dir). Since the claim scan reads shards a chunk at a time
            # from a per-handle cursor (claim.py), none should.
            samples: list[int] = []
            listed: list[int] = []
            steady: list[int] = []
            for _ in range(leases):
                with linux.trace() as ev:
                    t0 = time.perf_counter_ns()
                    lease = q.lease()
                    dt = time.perf_counter_ns() - t0
                samples.append(dt)
                (listed if any(e.op == "listdir" for e in ev) else steady).append(dt)
                if lease is None:
                    raise RuntimeError(f"scaling: queue of {n} jobs reported empty")
                q.ack(lease)
            out["lease"] = summary_ms(samples)
            out["lease_listing"] = summary_ms(listed) if listed else {"n": 0}
            out["lease_no_listing"] = summary_ms(steady) if steady else {"n": 0}
            # The same with the claim's directory fsync deferred to the end of a batch:
            # isolates the scan/verify cost, which is what depth could change, from
            # the fsync, which is the disk's (and its other tenants').
            scan: list[int] = []
            with q.batch():
                for _ in range(leases):
                    t0 = time.perf_counter_ns()
                    lease = q.lease()
                    scan.append(time.perf_counter_ns() - t0)
                    if lease is None:
                        raise RuntimeError(f"scaling: queue of {n} jobs reported empty")
                    q.ack(lease)
            out["lease_without_fsync"] = summary_ms(scan)
            # A fresh handle's first lease: what a one-shot `steadq lease` pays.
            cold: list[int] = []
            for _ in range(5):
                with Queue.open(path) as fresh:
                    t0 = time.perf_counter_ns()
                    lease = fresh.lease()
                    cold.append(time.perf_counter_ns() - t0)
                    if lease is None:
                        raise RuntimeError(f"scaling: queue of {n} jobs reported empty")
                    fresh.retry(lease)  # back to ready: the counts below stay those of the two passes
            out["lease_fresh_handle"] = summary_ms(cold)
        finally:
            q.close()
        t = time.perf_counter()
        with Queue.open(path) as opened:
            s = insp.stats(opened._ctx)  # noqa: SLF001
        out["stats_inprocess_s"] = round(time.perf_counter() - t, 4)
        steadq = os.path.join(os.path.dirname(sys.executable), "steadq")
        argv = (
            [steadq, "stats", path]
            if os.path.exists(steadq)
            else [sys.executable, "-m", "steadqd.cli.main", "stats", path]
        )
        t = time.perf_counter()
        r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        out["stats_cli_s"] = round(time.perf_counter() - t, 4)
        out["stats_cli_ok"] = r.returncode == 0
        out["stats_ready_objects"] = s["ready"].objects
    finally:
        t = time.perf_counter()
        shutil.rmtree(path, ignore_errors=True)
        out["cleanup_s"] = round(time.perf_counter() - t, 2)
    return out
