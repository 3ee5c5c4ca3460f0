"""`steadqd demo`: a queue under ./var/, a few hundred jobs, real worker processes.

It shows the whole life of jobs on a real queue directory: producers enqueue
(some delayed), several worker processes lease with inotify wake-ups, most
jobs succeed and are acknowledged, some fail once and are retried with
backoff, a few are poison and get buried. Everything printed is read back
from the tree at the end: the tree is the only state.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import sys
import time
from collections import Counter

from .backoff import RetryPolicy
from .constants import DEAD_DIR, DELAYED_DIR, QUARANTINE_DIR, READY_DIR, RECEIPTS_DIR, TMP_DIR
from .errors import SteadQError
from .queue import Queue

# A job whose payload asks for it fails once (retried) or always (buried).
_FLAKY = b"flaky"
_POISON = b"poison"


def _work(payload: bytes, attempt: int) -> str:
    """The demo's "transcode": hash the payload a few times; fail on request."""
    if payload.startswith(_POISON):
        return "bury"
    if payload.startswith(_FLAKY) and attempt == 1:
        return "retry"
    digest = payload
    for _ in range(200):
        digest = hashlib.sha256(digest).digest()
    return "ack"


def _worker(path: str, worker_no: int, idle_exit: float, results: mp.Queue) -> None:
    done: Counter[str] = Counter()
    policy = RetryPolicy(base_ms=200, cap_ms=2000)
    with Queue.open(path) as q:
        while True:
            lease = q.lease(wait=idle_exit, duration=30)
            if lease is None:
                break
            verdict = _work(lease.payload(), lease.attempt)
            if verdict == "ack":
                q.ack(lease)
            elif verdict == "retry":
                q.retry(lease, policy=policy)
            else:
                q.bury(lease, reason=0x0100)
            done[verdict] += 1
    results.put((worker_no, dict(done)))


def _count(path: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in (READY_DIR, DELAYED_DIR, RECEIPTS_DIR, DEAD_DIR, QUARANTINE_DIR, TMP_DIR):
        n = 0
        for _dirpath, _dirs, files in os.walk(os.path.join(path, state)):
            n += len(files)
        counts[state] = n
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="steadqd demo", description=__doc__.splitlines()[0])
    ap.add_argument("--path", default=os.path.join("var", "demo-queue"), help="queue directory (default ./var/demo-queue)")
    ap.add_argument("--jobs", type=int, default=300, help="jobs to enqueue (default 300)")
    ap.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    ap.add_argument("--allow-unsupported-fs", action="store_true", help="allow tmpfs/overlayfs (not crash-safe)")
    args = ap.parse_args(argv)
    path = args.path
    try:
        if os.path.exists(os.path.join(path, "FORMAT")):
            q = Queue.open(path, allow_unsupported_fs=args.allow_unsupported_fs)
            print(f"opened existing queue {path} (id {q.queue_id})")
        else:
            q = Queue.init(path, shards=16, delayed_width_ns=1_000_000_000, terminal_width_ns=3_600_000_000_000,
                           allow_unsupported_fs=args.allow_unsupported_fs)
            print(f"created queue {path} (id {q.queue_id}, {q.shard_count} shards, publication via {q.publication_mode})")
    except SteadQError as e:
        print(f"demo: {e}", file=sys.stderr)
        return e.exit_code
    before = _count(path)
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(path, i, 3.0, results)) for i in range(args.workers)]
    for w in workers:
        w.start()
    print(f"started {args.workers} worker processes; enqueuing {args.jobs} jobs")
    t0 = time.monotonic()
    kinds: Counter[str] = Counter()
    with q:
        with q.batch():  # one barrier for the whole batch of producers' writes
            for i in range(args.jobs):
                if i % 37 == 0:
                    body, kind = _POISON + b" %d" % i, "poison"
                elif i % 11 == 0:
                    body, kind = _FLAKY + b" %d" % i, "flaky"
                else:
                    body, kind = b"frame %06d" % i, "plain"
                delay = 1.0 if i % 50 == 25 else 0.0
                q.enqueue(body, content_type="text/plain", metadata={"frame": i, "kind": kind}, delay=delay, max_attempts=3)
                kinds[kind + (" (delayed 1s)" if delay else "")] += 1
        print(f"enqueued {args.jobs} jobs in {time.monotonic() - t0:.2f}s: " + ", ".join(f"{v} {k}" for k, v in sorted(kinds.items())))
        # Delayed and backed-off jobs become ready when promoted; until the
        # promoter daemon exists, this process runs recovery passes itself.
        promoted = 0
        while any(w.is_alive() for w in workers):
            promoted += q.recover(budget_ops=10_000, budget_ms=200).delayed_promoted
            time.sleep(0.2)
    totals: Counter[str] = Counter()
    for _ in workers:
        worker_no, done = results.get(timeout=10)
        totals.update(done)
        print(f"  worker {worker_no}: " + ", ".join(f"{k} {v}" for k, v in sorted(done.items())))
    for w in workers:
        w.join()
    elapsed = time.monotonic() - t0
    after = _count(path)
    print(f"processed in {elapsed:.2f}s: {totals['ack']} acked, {totals['retry']} retried, "
          f"{totals['bury']} buried; {promoted} delayed jobs promoted by recovery")
    print("tree now holds: " + ", ".join(f"{k}/ {after[k] - before.get(k, 0):+d}" for k in after))
    print(f"look inside: ls {path}/receipts/*/* | head; ls {path}/dead/*/*")
    return 0


if __name__ == "__main__":
    sys.exit(main())
