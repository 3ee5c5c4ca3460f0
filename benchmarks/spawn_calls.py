"""Python calls per job of steadqd's worker, by thread and function, counted by cProfile.

    .venv/bin/python -m benchmarks.spawn_calls [--dir SCRATCH] [--jobs 100,500] [--top 25] [--json]

The worker drains a queue of N1 and of N2 jobs (``true`` at concurrency 4, as
``benchmarks.daemons spawner``) with a ``cProfile.Profile`` in each of its
Python threads (the loop, ``steadqd-prepare``: claims and copies,
``steadqd-settle``: acks); (calls of the N2 run - calls of the N1 run) /
(N2 - N1) is the marginal count per job, free of start-up and shutdown.
Calls are counts, not times: on a loaded machine they still move a little
with how many jobs one loop pass or one batch takes, never with the clock's
noise. Functions below 0.05 calls a job are left out.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from . import daemons

# Run as the worker's ``python -c``: a profiler in the main thread from the start and in every thread
# started later (its ``run`` wrapped), all dumped at exit as {thread name: {function: calls}}.
BOOT = """
import atexit, cProfile, json, os, pstats, sys, threading
profs = [("loop", cProfile.Profile())]
_run = threading.Thread.run
def run(self):
    p = cProfile.Profile()
    profs.append((self.name, p))
    p.enable()
    try:
        _run(self)
    finally:
        p.disable()
threading.Thread.run = run
def dump():
    out = {}
    for name, p in profs:
        p.disable()
        calls = out.setdefault(name, {})
        for (file, line, fn), (cc, nc, tt, ct, callers) in pstats.Stats(p).stats.items():
            key = f"{os.path.basename(file)}:{line}({fn})" if file != "~" else fn
            calls[key] = calls.get(key, 0) + nc
    with open(os.environ["STEADQ_PROFILE_OUT"], "w") as f:
        json.dump(out, f)
atexit.register(dump)
profs[0][1].enable()
from steadqd.daemon.main import daemon_main
sys.exit(daemon_main())
"""


def drain(workdir: str, jobs: int) -> dict[str, dict[str, int]]:
    """Calls by thread and function in one worker that drained ``jobs`` jobs and was stopped (SIGTERM)."""
    true = shutil.which("true") or "/bin/true"
    os.makedirs(workdir, exist_ok=True)
    qpath, cfg = daemons._setup(workdir, "sq", [true], 4)
    daemons._enqueue_jobs(qpath, jobs)
    out = os.path.join(workdir, "calls.json")
    env = {**daemons.daemon_env(workdir), "STEADQ_PROFILE_OUT": out}
    argv = [sys.executable, "-c", BOOT, "--config-dir", cfg, "worker", "sq"]
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while len(daemons.receipt_ctimes(qpath)) < jobs and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # the last settle's barriers and the copy's removal
    finally:
        p.terminate()
        p.wait(60)
    acked = len(daemons.receipt_ctimes(qpath))
    if acked != jobs:
        raise RuntimeError(f"{acked} of {jobs} jobs settled")
    with open(out) as f:
        raw: dict[str, dict[str, int]] = json.load(f)
    return raw


def per_job(lo: dict[str, dict[str, int]], hi: dict[str, dict[str, int]], n: int) -> dict[str, dict[str, float]]:
    """{thread: {function: calls a job}} from two drains ``n`` jobs apart, sorted by calls."""
    out: dict[str, dict[str, float]] = {}
    for thread in sorted(set(lo) | set(hi)):
        a, b = lo.get(thread, {}), hi.get(thread, {})
        calls = {k: round((b.get(k, 0) - a.get(k, 0)) / n, 2) for k in set(a) | set(b)}
        out[thread] = dict(sorted(((k, v) for k, v in calls.items() if abs(v) >= 0.05), key=lambda kv: -kv[1]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.spawn_calls", description=__doc__.split("\n")[0])
    ap.add_argument("--dir", help="scratch directory (default: a new one in /var/tmp, removed afterwards)")
    ap.add_argument("--jobs", default="100,500", help="N1,N2: the two drains whose difference is counted")
    ap.add_argument("--top", type=int, default=25, help="functions shown per thread")
    ap.add_argument("--json", action="store_true", help="also print every function's count as JSON")
    a = ap.parse_args(argv)
    n1, n2 = (int(x) for x in a.jobs.split(","))
    base = a.dir or tempfile.mkdtemp(prefix="steadqd-spawn-calls-", dir="/var/tmp")
    os.makedirs(base, exist_ok=True)
    try:
        counts = []
        for n in (n1, n2):
            d = os.path.join(base, f"calls-{n}")
            os.makedirs(d)
            counts.append(drain(d, n))
        result = per_job(counts[0], counts[1], n2 - n1)
        for thread, calls in result.items():
            print(f"{thread}: {sum(calls.values()):.1f} calls a job")
            for k, v in collections.Counter(calls).most_common(a.top):
                print(f"  {v:8.2f}  {k}")
        if a.json:
            print(json.dumps(result))
    finally:
        if a.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
