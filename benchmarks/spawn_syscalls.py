"""Syscalls per job of steadqd's spawner and of the spawner floor, counted by strace.

    .venv/bin/python -m benchmarks.spawn_syscalls [--dir SCRATCH] [--jobs 100,300]

Each side drains a queue of N1 and of N2 jobs (``true`` at concurrency 4) under
``strace -f -y``; (count of the N2 run - count of the N1 run) / (N2 - N1) is the
marginal count per job, free of start-up and shutdown. Calls are grouped by where
they happen: on the queue tree (a path of the queue in the line), on the
worker's payload copies in ``TMPDIR`` (steadqd only), elsewhere in the worker
process (any of its threads), and in the job's processes (every process that
called ``execve``: the helper and the command; also steadqd's guard, which is
not per job and so drops out of the difference). Counts below 0.05 a job are left out.
docs/performance.md ("Daemons") quotes a run of it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from . import daemons, floor

_LINE = re.compile(r"^(\d+)\s+(?:<\.\.\. (\w+) resumed>|(\w+)\()")
GROUPS = ("queue", "jobtmp", "worker", "job processes")


def classify(trace: str, qpath: str) -> collections.Counter[tuple[str, str]]:
    """(group, syscall) -> calls in one ``strace -f -y`` output file."""
    procs: dict[int, list[tuple[str, str]]] = collections.defaultdict(list)
    with open(trace, errors="replace") as f:
        main = -1
        for line in f:
            m = _LINE.match(line)
            if not m or m.group(2):  # a resumed call was counted where it started
                continue
            pid = int(m.group(1))
            main = pid if main < 0 else main
            procs[pid].append((m.group(3), line))
    execs = {pid for pid, calls in procs.items() if pid != main and any(n == "execve" for n, _ in calls)}
    out: collections.Counter[tuple[str, str]] = collections.Counter()
    for pid, calls in procs.items():
        for name, line in calls:
            if pid in execs:
                group = "job processes"
            elif qpath in line:
                group = "queue"
            elif "/jobtmp/" in line:
                group = "jobtmp"
            else:
                group = "worker"
            out[(group, name)] += 1
    return out


def drain(side: str, workdir: str, jobs: int, binary: str) -> collections.Counter[tuple[str, str]]:
    true = shutil.which("true") or "/bin/true"
    qpath, cfg = daemons._setup(workdir, "sq", [true], 4)
    daemons._enqueue_jobs(qpath, jobs)
    trace = os.path.join(workdir, "strace.txt")
    strace = ["strace", "-f", "-y", "-s", "0", "-o", trace]
    if side == "floor":
        subprocess.run([*strace, binary, qpath, "4", true], check=True, capture_output=True)
    else:
        env = daemons.daemon_env(workdir)
        argv = [*strace, *daemons._steadqd(), "--config-dir", cfg, "worker", "sq"]
        p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 300
            while len(daemons.receipt_ctimes(qpath)) < jobs and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1.0)  # the last settle's barriers and the copy's removal
        finally:
            # strace's child is the worker: stop it by its PID, then strace ends with it.
            kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
            for k in kids:
                os.kill(int(k), 15)
            p.wait(60)
    acked = len(daemons.receipt_ctimes(qpath))
    if acked != jobs:
        raise RuntimeError(f"{side}: {acked} of {jobs} jobs settled")
    return classify(trace, qpath)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.spawn_syscalls", description=__doc__.split("\n")[0])
    ap.add_argument("--dir", help="scratch directory (default: a new one in /var/tmp, removed afterwards)")
    ap.add_argument("--jobs", default="100,300", help="N1,N2: the two drains whose difference is counted")
    a = ap.parse_args(argv)
    n1, n2 = (int(x) for x in a.jobs.split(","))
    if shutil.which("strace") is None:
        print("strace is not installed", file=sys.stderr)
        return 2
    base = a.dir or tempfile.mkdtemp(prefix="steadqd-spawn-syscalls-", dir="/var/tmp")
    os.makedirs(base, exist_ok=True)
    try:
        binary, why = floor.build_spawn_floor(base)
        if binary is None:
            print(why, file=sys.stderr)
            return 2
        result: dict[str, dict[str, dict[str, float]]] = {}
        for side in ("steadqd", "floor"):
            counts = []
            for n in (n1, n2):
                d = os.path.join(base, f"{side}-{n}")
                os.makedirs(d)
                counts.append(drain(side, d, n, binary))
            lo, hi = counts
            groups: dict[str, dict[str, float]] = {g: {} for g in GROUPS}
            for key in set(lo) | set(hi):
                per_job = (hi[key] - lo[key]) / (n2 - n1)
                if abs(per_job) >= 0.05:
                    groups[key[0]][key[1]] = round(per_job, 2)
            result[side] = {g: dict(sorted(v.items(), key=lambda kv: -kv[1])) for g, v in groups.items() if v}
        for side, groups in result.items():
            print(side)
            for g, calls in groups.items():
                print(f"  {g}: {sum(calls.values()):.1f} a job: " + ", ".join(f"{k} {v}" for k, v in calls.items()))
        print(json.dumps(result))
    finally:
        if a.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
