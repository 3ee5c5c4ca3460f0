"""``python -m benchmarks.recovery_backlog``: how long an expired lease waits behind a receipt backlog.

Issue 15, point 8: with a large backlog of uncompacted receipts, recovery
passes spent their whole budget in compaction and expired leases waited
until the cycle came round to reaping (one-shot ``steadq recover`` runs never
got there). This scenario builds the backlog (receipts written directly,
``tests/fabricate_receipts.py``), lets recovery start on it, and then measures
two things with a lease that really expires (claimed for 1 s, never renewed):

* **one-shot**: how many default ``steadq recover`` processes run before the
  job is back in ``ready/``, and how long each took;
* **sweeper**: a real ``steadqd sweeper`` (default settings) works on the
  backlog; the time from the lease's boottime deadline until its job is back
  in ``ready/``, polled every 2 ms, for several leases one after another.

Run it as root on a fresh journaled ext4 on a loop device (the default,
``benchmarks/loopdisk.py``; 1,000,000 receipts need ``-i 4096`` and about
4.5 GiB of the sparse image)::

    sudo .venv/bin/python -m benchmarks.recovery_backlog --receipts 1000000
    .venv/bin/python -m benchmarks.recovery_backlog --fs host --dir /var/tmp/x --receipts 20000

``--code DIR`` runs the ``steadq``/``steadqd`` processes with
``PYTHONPATH=DIR`` (a worktree of another commit), to measure the code
before a change on the same disk. The result is one JSON document on stdout
(and in ``--out``). Nothing is asserted: the figures go to
``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

from steadqd import Queue
from steadqd.fs import linux, names
from tests.fabricate_receipts import write_receipts

from . import loopdisk
from .common import disk_facts, log, signals_unwind
from .daemons import Daemon

POLL_S = 0.002
LEASE_S = 1.0
# The default image and inode ratio suffice below this many receipts.
FULL_SCALE_FROM = 200_000


def _env(code: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = code
    return env


def _steadq() -> str:
    return os.path.join(os.path.dirname(sys.executable), "steadq")


def recover_once(qpath: str, code: str | None) -> dict[str, Any]:
    """One default ``steadq recover --json`` process: its report and wall time."""
    t = time.monotonic()
    r = subprocess.run([_steadq(), "recover", "--json", qpath], capture_output=True, text=True, env=_env(code))
    took = time.monotonic() - t
    try:
        report = json.loads(r.stdout)
    except ValueError:
        report = {"exit": r.returncode, "stderr": r.stderr[-500:]}
    keys = ("leases_reaped", "receipts_compacted", "operations_attempted", "budget_exhausted")
    return {"seconds": round(took, 3), **{k: report.get(k) for k in keys}, "exit": r.returncode}


def _ready_again(q: Queue, job: str) -> bool:
    """The job's ready name is in its shard (a colocated lease lives there too)."""
    shard = names.shard_of(q.format.queue_id, bytes.fromhex(job), q.format.shard_count)
    d = os.path.join(q.path, "ready", names.shard_dir(shard))
    return any(n.startswith(job) and names.looks_ready(n) for n in os.listdir(d))


def _expiring_lease(q: Queue) -> tuple[str, int]:
    """A fresh job claimed for LEASE_S and never renewed: (job id, boottime deadline)."""
    job = q.enqueue(b"expires")
    lease = q.lease(duration=LEASE_S)
    assert lease is not None and lease.job_id == job, "the backlog queue must hold no other ready job"
    return job, lease.boottime_deadline_ns


def _take_back(q: Queue, job: str) -> None:
    """Acknowledge the job once it is ready again, so the next lease is a fresh one."""
    lease = q.lease()
    assert lease is not None and lease.job_id == job, "the backlog queue must hold no other ready job"
    q.ack(lease)


def _cursor_phase(qpath: str) -> str | None:
    try:
        with open(os.path.join(qpath, "control", "recovery-cursor.json")) as f:
            return str(json.load(f)["cursor"]["phase"])
    except (OSError, ValueError, KeyError):
        return None


def one_shot(q: Queue, max_runs: int, code: str | None) -> dict[str, Any]:
    """Default ``steadq recover`` runs until an expired lease is back in ready/."""
    warmup = recover_once(q.path, code)  # recovery is now part-way through the backlog
    job, deadline = _expiring_lease(q)
    while linux.boottime_ns() <= deadline:
        time.sleep(0.05)
    runs: list[dict[str, Any]] = []
    while len(runs) < max_runs and not _ready_again(q, job):
        runs.append(recover_once(q.path, code))
    back = _ready_again(q, job)
    if back:
        _take_back(q, job)
    return {
        "warmup_run": warmup,
        "cursor_phase_before": _cursor_phase(q.path),
        "runs_until_ready": len(runs) if back else None,
        "gave_up_after_runs": None if back else max_runs,
        "runs": runs,
    }


def sweeper(q: Queue, work: str, args: argparse.Namespace) -> dict[str, Any]:
    """A real sweeper on the backlog; lease deadline → ready again, per lease."""
    leases, max_wait, code = args.leases, args.max_wait, args.code
    cfg = os.path.join(work, "cfg")
    os.makedirs(cfg, exist_ok=True)
    with open(os.path.join(cfg, "backlog.yaml"), "w") as f:
        f.write(f"queue: {json.dumps(q.path)}\n")
        if args.sweeper_interval is not None:  # a backlog that runs out leaves the sweeper on its interval
            f.write(f"sweeper:\n  interval: {args.sweeper_interval}s\n")
    if code:
        os.environ["PYTHONPATH"] = code  # Daemon passes it on
    d = Daemon(work, cfg, "sweeper", "backlog")
    latencies: list[float | None] = []
    try:
        d.wait_started()
        time.sleep(2.0)  # mid-backlog: the sweeper is running budget-exhausted passes back to back
        for _ in range(leases):
            job, deadline = _expiring_lease(q)
            while True:
                now = linux.boottime_ns()
                if now > deadline and _ready_again(q, job):
                    latencies.append(round((now - deadline) / 1e9, 3))
                    _take_back(q, job)
                    break
                if now - deadline > max_wait * 1e9:
                    latencies.append(None)
                    break
                time.sleep(POLL_S)
    finally:
        d.stop()
        if code:
            os.environ.pop("PYTHONPATH", None)
    measured = [x for x in latencies if x is not None]
    return {
        "latencies_s": latencies,
        "max_s": max(measured) if len(measured) == len(latencies) else None,
        "median_s": statistics.median(measured) if measured else None,
        "gave_up_after_s": max_wait if len(measured) < len(latencies) else None,
        "cursor_phase_after": _cursor_phase(q.path),
        "sweeper_log_tail": d.log_text()[-1500:],
    }


def run(work: str, args: argparse.Namespace) -> dict[str, Any]:
    qpath = os.path.join(work, "q")
    out: dict[str, Any] = {"receipts": args.receipts, "disk": disk_facts(work, probe=False)}
    with Queue.init(qpath) as q:
        t = time.monotonic()
        write_receipts(q, args.receipts)
        os.sync()
        out["fabricate_s"] = round(time.monotonic() - t, 1)
        log(f"{args.receipts} full receipts written in {out['fabricate_s']} s")
        out["one_shot"] = one_shot(q, args.max_runs, args.code)
        log(f"one-shot: {out['one_shot']['runs_until_ready']} runs until ready")
        out["sweeper"] = sweeper(q, work, args)
        log(f"sweeper: latencies {out['sweeper']['latencies_s']} s")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.recovery_backlog", description=__doc__.split("\n")[0])
    ap.add_argument("--receipts", type=int, default=1_000_000)
    ap.add_argument("--fs", choices=loopdisk.FS_CHOICES, default="ext4")
    ap.add_argument("--dir", help="scratch directory (default /var/tmp/steadqd-backlog-<pid>, removed afterwards)")
    ap.add_argument("--leases", type=int, default=5, help="leases measured one after another under the sweeper")
    ap.add_argument("--max-runs", type=int, default=10, help="one-shot runs before giving up")
    ap.add_argument("--max-wait", type=float, default=60.0, help="seconds to wait for one lease under the sweeper")
    ap.add_argument("--sweeper-interval", type=float, help="sweeper.interval in seconds (default: the default)")
    ap.add_argument("--code", help="PYTHONPATH for the steadq/steadqd processes (measure another commit)")
    ap.add_argument("--out", help="also write the JSON result here")
    a = ap.parse_args(argv)
    base = a.dir or f"/var/tmp/steadqd-backlog-{os.getpid()}"
    created = not os.path.exists(base)
    os.makedirs(base, exist_ok=True)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(signals_unwind())
            work = base
            if a.fs != "host":
                work, setup = stack.enter_context(
                    loopdisk.loop_filesystem(a.fs, base, full_scale=a.receipts >= FULL_SCALE_FROM)
                )
                log(f"loop filesystem: {setup.to_json()}")
            result = run(work, a)
    except loopdisk.LoopDiskError as e:
        print(f"python -m benchmarks.recovery_backlog: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        if created and not loopdisk.mounts_under(base):
            shutil.rmtree(base, ignore_errors=True)
    text = json.dumps(result, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
