"""The demo's producer, a separate process: ``python -m steadqd.demo.producer QUEUE JOBS``.

It enqueues the way a user's programs would: the first CLI_JOBS through
``steadq put`` (one process each, like a shell script), the rest through the
library in one batch (every job file is fsynced, the directory fsyncs are
shared by the batch). The demo shows what it prints.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections import Counter
from typing import Any

from steadqd.backend import open_queue
from steadqd.demo.children import tool, typed
from steadqd.demo.plan import DELAY_SECONDS, job_delay, job_kind, payload

CLI_JOBS = 5  # jobs the producer enqueues with `steadq put`, before its library batch


def main(argv: list[str] | None = None) -> int:
    """Enqueue the demo's jobs into ``argv[0]``, ``argv[1]`` of them."""
    args = sys.argv[1:] if argv is None else argv
    try:
        return produce(args[0], int(args[1]))
    except KeyboardInterrupt:  # ^C in the demo's terminal: the demo reports it
        return 130


def produce(path: str, jobs: int) -> int:
    steadq = tool("steadq", "steadqd.cli.main")
    bucket = path.startswith("s3://")  # StowQ/1 job records have no metadata or producer id
    first = min(CLI_JOBS, jobs)
    for i in range(first):
        cmd = [*steadq, "put", path, "--content-type", "application/json"]
        if not bucket:
            cmd += ["--meta", f"kind={job_kind(i)}", "--meta", f"frame={i}", "--producer-id", "demo-shell"]
        if job_delay(i):
            cmd += ["--delay", f"{job_delay(i):g}s"]
        r = subprocess.run(cmd, input=payload(i), capture_output=True, check=False)
        if r.returncode != 0:
            print(
                f"producer: `steadq put` failed ({r.returncode}): {r.stderr.decode(errors='replace').strip()}",
                flush=True,
            )
            return 1
        job_id = r.stdout.decode().split()[1]
        print(f"producer: $ {typed(cmd)} <<< '{payload(i).decode()}'  -> job_id {job_id[:12]}", flush=True)
        time.sleep(0.2)  # let the daemon pick each one up as it arrives (inotify, no polling)
    if jobs <= first:
        return 0
    time.sleep(0.5)
    t0 = time.monotonic()
    kinds: Counter[str] = Counter()
    with contextlib.closing(open_queue(path)) as q, q.batch():
        for i in range(first, jobs):
            kind = job_kind(i)
            described: dict[str, Any] = {}
            if not bucket:
                described = {"metadata": {"kind": kind, "frame": i}, "producer_id": "demo-library"}
            q.enqueue(payload(i), max_attempts=3, content_type="application/json", delay=job_delay(i), **described)
            kinds[kind] += 1
            if job_delay(i):
                kinds[f"delayed {DELAY_SECONDS:g}s"] += 1
    took = time.monotonic() - t0
    summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    print(
        f"producer: enqueued {jobs - first} jobs with the library in one batch in {took:.2f}s ({summary})", flush=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
