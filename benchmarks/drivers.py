"""The loops that drive a backend: one process, or P producers + C consumers.

Both count a job as done when its ack returned (the consumer's durable
commit), and carry a unique number at the start of every payload so that
lost and duplicate deliveries are detected rather than assumed away.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import time
from typing import Any

from .backends import Backend, Rq, Spec, open_backend
from .common import Rate, bounded, payload_of

__all__ = ["bounded", "single_lifecycle", "split_phases", "run_mp"]

_MP = mp.get_context("fork")  # children re-open their own handles; fork keeps startup cheap


def single_lifecycle(b: Backend, size: int, jobs: int, seconds: float) -> Rate:
    """put, get, read payload, ack — one job at a time, one process."""
    if isinstance(b, Rq):
        return _rq_single(b, size, jobs, seconds)

    def step(i: int) -> None:
        b.put(payload_of(size, i))
        h = b.get()
        if h is None:
            raise RuntimeError(f"{b.name}: job {i} not available right after put")
        data = b.payload(h)
        if len(data) != size:
            raise RuntimeError(f"{b.name}: payload of {len(data)} bytes, expected {size}")
        b.ack(h)

    return bounded(jobs, seconds, step)


def _rq_single(b: Rq, size: int, jobs: int, seconds: float) -> Rate:
    """rq: enqueue one job, run a burst worker on it (what "one job at a time" means for rq)."""
    start = time.perf_counter()
    n = 0
    while n < jobs and time.perf_counter() - start < seconds:
        b.put(payload_of(size, n))
        if len(b.drain()) != 1:
            raise RuntimeError("rq: the burst worker did not run exactly the one job")
        n += 1
    return Rate(n, time.perf_counter() - start)


def split_phases(b: Backend, size: int, jobs: int, seconds: float) -> dict[str, Any]:
    """Enqueue-only rate, then lease+ack-only rate over what was enqueued."""
    produced = bounded(jobs, seconds, lambda i: b.put(payload_of(size, i)))
    if isinstance(b, Rq):
        start = time.perf_counter()
        seen = b.drain()
        consumed = Rate(len(seen), time.perf_counter() - start)
    else:

        def take(i: int) -> None:
            h = b.get()
            if h is None:
                raise RuntimeError(f"{b.name}: queue empty after {i} of {produced.jobs} jobs")
            b.payload(h)
            b.ack(h)

        consumed = bounded(produced.jobs, 1e9, take)
    return {"enqueue_only": produced.to_json(), "lease_ack_only": consumed.to_json()}


# ------------------------------------------------------------------ multi-process


def _producer(
    spec: Spec, idx: int, n: int, base: int, size: int, seconds: float, barrier: Any, done: Any, results: Any
) -> None:
    b = open_backend(spec)
    barrier.wait()
    t0 = time.monotonic()
    count = 0
    try:
        for i in range(n):
            b.put(payload_of(size, base + i))
            count += 1
            if time.monotonic() - t0 > seconds:
                break
    finally:
        with done.get_lock():
            done.value += 1
        results.put(("p", idx, count, time.monotonic()))
        b.close()


def _consumer(spec: Spec, idx: int, producers: int, seconds: float, barrier: Any, done: Any, results: Any) -> None:
    b = open_backend(spec)
    barrier.wait()
    t0 = time.monotonic()
    ids: list[int] = []
    last = t0
    empties = 0
    error = None
    try:
        while time.monotonic() - t0 < seconds * 3:
            if isinstance(b, Rq):
                got = b.drain()
                if got:
                    ids.extend(got)
                    last = time.monotonic()
                    empties = 0
                    continue
                h = None
            else:
                h = b.get()
            if h is None:
                if done.value >= producers:
                    empties += 1  # two empty looks after every producer finished: drained
                    if empties >= 2:
                        break
                elif b.name != "steadqd":
                    # steadqd's lease(wait=) sleeps on inotify; the peers have no
                    # cross-process wake-up, so they poll (0.5 ms keeps the tail short).
                    time.sleep(0.0005)
                continue
            empties = 0
            data = b.payload(h)
            b.ack(h)
            ids.append(int(data[:10]))
            last = time.monotonic()
    except Exception as e:  # noqa: BLE001 - reported to the parent, not lost
        error = f"{type(e).__name__}: {e}"
    finally:
        results.put(("c", idx, ids, last, error))
        b.close()


def run_mp(spec: Spec, producers: int, consumers: int, jobs: int, size: int, seconds: float) -> dict[str, Any]:
    """P producers and C consumers on one queue; rate = unique acked jobs / (last ack - start)."""
    barrier = _MP.Barrier(producers + consumers + 1)
    done = _MP.Value("i", 0)
    results = _MP.Queue()
    per = max(1, jobs // producers)
    procs = [
        _MP.Process(target=_producer, args=(spec, i, per, i * per, size, seconds, barrier, done, results), daemon=True)
        for i in range(producers)
    ]
    procs += [
        _MP.Process(target=_consumer, args=(spec, i, producers, seconds, barrier, done, results), daemon=True)
        for i in range(consumers)
    ]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=60)
    except Exception as e:  # noqa: BLE001
        for p in procs:
            if p.is_alive():
                p.kill()
        return {"skipped": f"processes did not start: {e}"}
    t0 = time.monotonic()
    produced = 0
    ids: list[int] = []
    last = t0
    errors: list[str] = []
    deadline = t0 + seconds * 3 + 60
    got = 0
    while got < len(procs) and time.monotonic() < deadline:
        try:
            msg = results.get(timeout=1)
        except queue_mod.Empty:
            if not any(p.is_alive() for p in procs) and results.empty():
                break
            continue
        got += 1
        if msg[0] == "p":
            produced += msg[2]
        else:
            ids.extend(msg[2])
            last = max(last, msg[3])
            if msg[4]:
                errors.append(msg[4])
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():  # our own child, stuck: end it by its handle
            p.kill()
            p.join()
    unique = len(set(ids))
    out = Rate(unique, last - t0).to_json()
    out.update(
        producers=producers,
        consumers=consumers,
        produced=produced,
        acked=len(ids),
        duplicates=len(ids) - unique,
        lost=produced - unique,
    )
    if errors:
        out["errors"] = errors[:3]
    return out


def cpu_count() -> int:
    return os.cpu_count() or 1
