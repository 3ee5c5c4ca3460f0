"""``python -m benchmarks.promotion_lateness``: how late delayed jobs are promoted under ``steadqd run``.

Issue 16, point 3: the promoter used to wait for the end of each job's 10 s
delayed bucket, so ``steadq put --delay 2s`` ran up to 10 s late. Now each job
should become ready when its own not_before passes. This scenario runs the
real ``steadqd run`` (worker, sweeper, promoter in one process, default
settings and the default 10 s bucket width) and a producer in this process
that publishes ``--jobs`` delayed jobs at random moments with delays drawn
uniformly from ``--min-delay`` .. ``--max-delay``; then for every job:

* **promotion lateness**: the wall time at which its ready name appeared in
  ``ready/<shard>/`` (an inotify watch of this process on every shard, read
  by a thread that does nothing else) minus its not_before;
* **start lateness**: when its command's first instruction ran (the C stamp
  binary of ``benchmarks/daemons.py``, CLOCK_MONOTONIC mapped to the wall clock
  once) minus its not_before: what a user of ``--delay`` sees.

``--role promoter`` runs ``steadqd promoter`` alone instead (nothing starts the
jobs), to tell the promoter's own lateness from the time its loop spends on
the worker's work under ``run``. The load average is recorded: on a shared
machine it explains most of the tail.

Target (issue 16): promotion lateness p99 ≤ 100 ms. Nothing is asserted;
the result is one JSON document on stdout (and in ``--out``), quoted in
``docs/performance.md``. ``--code DIR`` runs ``steadqd`` with
``PYTHONPATH=DIR`` (a worktree of another commit) to measure the code before
a change on the same machine::

    .venv/bin/python -m benchmarks.promotion_lateness --jobs 300
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import threading
import time
from typing import Any

import inotify_simple

from steadqd import Queue

from .common import log, signals_unwind, summary_ms
from .daemons import Daemon, _yaml, build_stamp

_MOVED_TO = inotify_simple.flags.MOVED_TO


class ReadyWatcher:
    """Records the wall time at which each job id first gets a name in ``ready/``."""

    def __init__(self, qpath: str) -> None:
        self._ino = inotify_simple.INotify()
        ready = os.path.join(qpath, "ready")
        for shard in sorted(os.listdir(ready)):
            self._ino.add_watch(os.path.join(ready, shard), _MOVED_TO)
        self.seen: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for ev in self._ino.read(timeout=100):
                now = time.time_ns()
                self.seen.setdefault(ev.name[:32], now)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._ino.close()


def run(
    workdir: str, jobs: int, min_delay: float, max_delay: float, spread: float, code: str | None, role: str = "run"
) -> dict[str, Any]:
    qpath = os.path.join(workdir, "q")
    Queue.init(qpath, shards=64).close()
    stamps = os.path.join(workdir, "stamps")
    os.makedirs(stamps)
    command, kind = build_stamp(workdir)
    cfg = os.path.join(workdir, "cfg")
    os.makedirs(cfg)
    with open(os.path.join(cfg, "bench.yaml"), "w") as f:
        f.write(_yaml(qpath, [*command, stamps], concurrency=4))
    watcher = ReadyWatcher(qpath)
    daemon = Daemon(workdir, cfg, role, "bench", {"PYTHONPATH": code} if code else None)
    try:
        daemon.wait_started()
        rng = random.Random(16)
        not_before: dict[str, int] = {}
        with Queue.open(qpath) as q:
            for _ in range(jobs):
                time.sleep(rng.uniform(0, 2 * spread / jobs))
                job = q.enqueue(b"x", delay=rng.uniform(min_delay, max_delay))
                (info,) = q.inspect(job)
                not_before[job] = info.name.not_before
        deadline = time.monotonic() + max_delay + 30
        done = (lambda: len(os.listdir(stamps))) if role == "run" else (lambda: len(watcher.seen))
        while done() < jobs and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        rc = daemon.stop()
        watcher.close()
    wall_minus_mono = time.time_ns() - time.monotonic_ns()
    promotion = [watcher.seen[j] - nb for j, nb in not_before.items() if j in watcher.seen]
    start = []
    for j, nb in not_before.items():
        with contextlib.suppress(OSError, ValueError), open(os.path.join(stamps, j)) as f:
            start.append(int(f.read()) + wall_minus_mono - nb)
    return {
        "role": role,
        "load_average": os.getloadavg(),
        "jobs": jobs,
        "delays_s": [min_delay, max_delay],
        "delayed_bucket_width_s": 10,
        "job_command": kind,
        "promoted": len(promotion),
        "started": len(start),
        "early": sum(1 for v in promotion if v < 0),
        "promotion_lateness": summary_ms(promotion),
        "start_lateness": summary_ms(start),
        "daemon_exit": rc,
    }


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.promotion_lateness", description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--min-delay", type=float, default=0.2)
    ap.add_argument("--max-delay", type=float, default=12.0)
    ap.add_argument("--spread", type=float, default=30.0, help="seconds over which the jobs are published")
    ap.add_argument("--dir", default=None, help="scratch directory (default /var/tmp/steadqd-promo-<pid>)")
    ap.add_argument("--code", default=None, help="PYTHONPATH for steadqd (measure another commit)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument(
        "--role",
        choices=("run", "promoter"),
        default="run",
        help="promoter: the promoter alone (no worker in its loop)",
    )
    a = ap.parse_args()
    workdir = a.dir or f"/var/tmp/steadqd-promo-{os.getpid()}"
    os.makedirs(workdir)
    try:
        with signals_unwind():
            log(f"{a.jobs} jobs, delays {a.min_delay}..{a.max_delay} s, published over {a.spread} s")
            result = run(workdir, a.jobs, a.min_delay, a.max_delay, a.spread, a.code, a.role)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
