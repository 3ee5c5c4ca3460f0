"""`steadqd demo`: the real daemon on a demo queue, fed by a separate producer.

What it does, in order (everything lives under ``./var/demo/`` by default):

1. creates a queue (``queue/``, 16 shards, 1-second delayed buckets so that
   retries come back quickly) and a configuration directory (``etc/demo.yaml``)
   whose worker command is ``python -m steadqd.demo.job``; a second run
   reuses the queue and reports what *this* run added;
2. starts ``steadqd --config-dir var/demo/etc run demo`` as a subprocess: the
   real product (worker spawner, sweeper and promoter in one foreground
   process), whose ``<N>``-prefixed log lines on stderr the demo reads, keeps
   in ``daemon.log`` and shows a selection of;
3. starts a *separate* producer process that enqueues a handful of jobs with
   ``steadq put`` (as a shell script would) and the rest with the library in
   one batch: most jobs succeed, some are flaky (fail once, are retried with
   backoff, then succeed), some are poison (buried), a few are delayed;
4. prints one status line a second, read from the tree (the tree is the only
   state), until nothing is ready, leased or delayed any more;
5. stops the daemon with SIGTERM (a drain) and prints a summary and where to
   look next.

``--s3`` runs the same demo on a bucket queue (``s3://demo/queue``, StowQ/1,
``steadqd.demo.bucket``) on an embedded SeaweedFS (``steadqd.demo.seaweed``: one ``weed server`` on
127.0.0.1, its data under ``var/demo-s3/seaweedfs``, stopped when the demo
ends). The daemon, the producer and ``steadq`` find it through the standard
``AWS_*`` variables, as they would any S3 store. What a bucket queue cannot
store is left out (job metadata, a producer id), and the lease is 5 s: a
nacked job is taken again once its lease has expired (docs/stowq.md).

The demo checks its own result (``steadqd.demo.check``): it exits 0 only when
every job it enqueued was acknowledged or buried as its kind says and the
daemon stopped cleanly.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue as queue_mod
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import TextIO

from steadqd.backend import Backend
from steadqd.demo import bucket, seaweed
from steadqd.demo.check import counts, pending, problems
from steadqd.demo.children import Events, start_pumped, tool, typed
from steadqd.demo.daemon_log import LogLine, Tally
from steadqd.demo.plan import DELAY_SECONDS, plan_counts
from steadqd.demo.queue_setup import QUEUE_NAME, SHARDS, open_or_create, write_config
from steadqd.errors import SteadQError

SETTLE_TIMEOUT = 120.0  # s; the demo gives up (exit 1) if the jobs have not settled by then
START_TIMEOUT = 30.0  # s; for the daemon's "started" line
STOP_TIMEOUT = 30.0  # s; for the drain after SIGTERM


class Demo:
    def __init__(self, base: str, jobs: int, concurrency: int, out: TextIO, *, s3: bool = False) -> None:
        self.base = os.path.abspath(base)
        self.shown_base = os.path.relpath(self.base) if not os.path.relpath(self.base).startswith("..") else self.base
        self.s3 = s3
        self.queue_path = bucket.BUCKET_URL if s3 else os.path.join(self.base, "queue")
        self.queue_shown = bucket.BUCKET_URL if s3 else os.path.join(self.shown_base, "queue")
        self.count_interval = bucket.BUCKET_COUNT_INTERVAL if s3 else 0.0
        self.settle_timeout = bucket.BUCKET_SETTLE_TIMEOUT if s3 else SETTLE_TIMEOUT
        self.etc = os.path.join(self.base, "etc")
        self.jobs = jobs
        self.concurrency = concurrency
        self.out = out
        self.events: Events = queue_mod.Queue()
        self.tally = Tally()
        self.daemon: subprocess.Popen[str] | None = None
        self.producer: subprocess.Popen[str] | None = None
        self.daemon_eof = False
        self.t0 = time.monotonic()

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    # -- child output ------------------------------------------------------------

    def drain_events(self, wait: float) -> None:
        """Show what the daemon and the producer printed in the last ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            timeout = deadline - time.monotonic()
            try:
                tag, raw = self.events.get(timeout=max(0.0, timeout)) if timeout > 0 else self.events.get_nowait()
            except queue_mod.Empty:
                return
            if raw is None:
                if tag == "daemon":
                    self.daemon_eof = True
                continue
            if tag == "producer":
                self.say(f"  {raw}")
                continue
            line = LogLine.parse(raw)
            if self.tally.feed(line):
                self.say(f"  daemon| {line.short()}")

    def wait_started(self) -> bool:
        assert self.daemon is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                tag, raw = self.events.get(timeout=0.2)
            except queue_mod.Empty:
                if self.daemon.poll() is not None:
                    break
                continue
            if raw is None:
                self.daemon_eof = self.daemon_eof or tag == "daemon"
                continue
            line = LogLine.parse(raw)
            self.tally.feed(line)
            self.say(f"  daemon| {line.short()}")
            if line.message == "started":
                return True
        return False

    # -- stopping -------------------------------------------------------------------

    def stop_daemon(self) -> int | None:
        """SIGTERM (drain), then a second SIGTERM (hand back), then SIGKILL."""
        d = self.daemon
        if d is None:
            return None
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
            try:
                d.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.say("demo: the daemon did not finish draining; sending a second SIGTERM")
                d.send_signal(signal.SIGTERM)
                try:
                    d.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    d.kill()
                    d.wait()
        end = time.monotonic() + 5.0
        while not self.daemon_eof and time.monotonic() < end:
            self.drain_events(0.1)
        return d.returncode

    def cleanup(self) -> None:
        """Never leave a child behind (an exception or ^C in the middle of the demo)."""
        for p in (self.producer, self.daemon):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()

    # -- the run ----------------------------------------------------------------------

    def run(self) -> int:
        if not self.s3:
            return self._run_on_queue()
        root = os.path.join(self.base, "seaweedfs")
        self.say(f"starting SeaweedFS (weed server on 127.0.0.1, telemetry off), data in {self.shown_base}/seaweedfs")
        try:
            server = seaweed.start(root)
        except (seaweed.SeaweedMissing, RuntimeError, OSError) as e:
            self.say(f"demo: cannot start SeaweedFS: {e}")
            return 1
        with bucket.pointed_at(server):  # the daemon and the producer inherit its AWS_* variables
            self.say(f"  S3 endpoint {server.endpoint}; the demo's processes get it through AWS_ENDPOINT_URL")
            return self._run_on_queue()

    def _run_on_queue(self) -> int:
        try:
            q, created = open_or_create(self.base, self.queue_path, s3=self.s3)
        except SteadQError as e:
            self.say(f"demo: cannot create the queue in {self.queue_path}: {e}")
            return e.exit_code
        with contextlib.closing(q):
            return self._run(q, created)

    def _run(self, q: Backend, created: bool) -> int:
        qshown = self.queue_shown
        if created:
            self.say(f"created queue {qshown} (id {q.queue_id}, {SHARDS} shards, 1 s delayed buckets)")
        else:
            self.say(f"reusing queue {qshown} (id {q.queue_id}); the numbers below are what this run adds")
        before = counts(q)
        if not created:
            self.say(
                "  it holds: "
                + ", ".join(
                    f"{before[k]} {k}" for k in ("ready", "leased", "delayed", "receipts", "dead", "quarantine")
                )
            )
            if pending(before):
                self.say(
                    f"  {pending(before)} unfinished jobs of an interrupted run will be run too (a leased one "
                    "only once its 30 s lease has expired and the sweeper has returned it)"
                )
        lease = bucket.BUCKET_LEASE if self.s3 else "30s"
        config = write_config(self.etc, self.queue_path, self.concurrency, lease)
        self.say(
            f"wrote {os.path.join(self.shown_base, 'etc', os.path.basename(config))}: "
            f"worker command `python -m steadqd.demo.job`, concurrency {self.concurrency}, lease {lease}, "
            "exit 0 = ack, 75 = retry (200ms..2s backoff), 100 = bury"
        )
        log_path = os.path.join(self.base, "daemon.log")
        argv = [*tool("steadqd", "steadqd.daemon.main"), "--config-dir", self.etc, "run", QUEUE_NAME]
        self.say(f"\nstarting the daemon: {typed(argv)}")
        self.say(
            f"  (a selection of its log lines follows, shortened: STEADQ_ prefixes dropped, job ids cut;\n"
            f"   every line, verbatim, is in {os.path.join(self.shown_base, 'daemon.log')})"
        )
        with open(log_path, "a", encoding="utf-8") as keep:
            keep.write(f"--- steadqd demo {time.strftime('%Y-%m-%d %H:%M:%S')}: {self.jobs} jobs\n")
            self.daemon = start_pumped(argv, "daemon", self.events, keep, stderr_only=True)
            try:
                return self._drive(q, before)
            except KeyboardInterrupt:
                # A terminal's ^C reaches the whole process group: the daemon got
                # SIGINT too and is draining already. A SIGTERM now would be its
                # *second* stop signal (a forced stop), so give it a moment first.
                self.say("\ninterrupted: the daemon drains (running jobs finish, no new ones start)")
                try:
                    self.daemon.wait(3.0)
                except subprocess.TimeoutExpired:
                    pass
                self.stop_daemon()
                return 130
            finally:
                self.cleanup()

    def _drive(self, q: Backend, before: dict[str, int]) -> int:
        assert self.daemon is not None
        if not self.wait_started():
            code = self.daemon.poll()
            self.say(f"demo: the daemon did not start (exit status {code}); see the lines above")
            self.stop_daemon()
            return 1
        expected = plan_counts(self.jobs)
        self.say(
            f"\nproducing {self.jobs} jobs from a separate process: {expected['plain']} plain, "
            f"{expected['flaky']} flaky (fail once), {expected['poison']} poison, "
            f"{expected['delayed']} of them delayed {DELAY_SECONDS:g}s"
        )
        self.t0 = time.monotonic()
        self.producer = start_pumped(
            [sys.executable, "-m", "steadqd.demo.producer", self.queue_path, str(self.jobs)],
            "producer",
            self.events,
            None,
            stderr_only=False,
        )

        settled = False
        next_status = time.monotonic() + 1.0
        next_count = 0.0
        deadline = self.t0 + self.settle_timeout
        now_counts = before
        while time.monotonic() < deadline:
            self.drain_events(0.25)
            if self.daemon.poll() is not None:
                self.drain_events(0.2)
                self.say(f"demo: the daemon exited early with status {self.daemon.returncode}")
                return 1
            produced = self.producer.poll()
            if produced not in (None, 0):
                self.drain_events(0.2)
                self.say(f"demo: the producer failed with status {produced}")
                self.stop_daemon()
                return 1
            if time.monotonic() >= next_count:
                now_counts = counts(q)
                next_count = time.monotonic() + self.count_interval
            done = (now_counts["receipts"] - before["receipts"]) + (now_counts["dead"] - before["dead"])
            settled = produced == 0 and done >= self.jobs and not pending(now_counts)
            if settled or time.monotonic() >= next_status:
                next_status = time.monotonic() + 1.0
                self.say(self._status(now_counts, before))
            if settled:
                break
        self.drain_events(0.0)
        if not settled:
            self.say(f"demo: the jobs did not settle within {self.settle_timeout:g}s")
        elapsed = time.monotonic() - self.t0
        self.say("\nall jobs settled: stopping the daemon with SIGTERM (drain: no new leases, running jobs finish)")
        code = self.stop_daemon()
        after = counts(q)
        return self._summary(before, after, expected, elapsed, code, settled)

    def _status(self, now: dict[str, int], before: dict[str, int]) -> str:
        t = time.monotonic() - self.t0
        acked = now["receipts"] - before["receipts"]
        buried = now["dead"] - before["dead"]
        return (
            f"[{t:5.1f}s] ready {now['ready']:4d}  running {now['leased']:2d}  delayed {now['delayed']:3d}"
            f"  | acked {acked:4d}  retried {self.tally.retried:3d}  buried {buried:3d}"
            + (
                f"  quarantined {now['quarantine'] - before['quarantine']}"
                if now["quarantine"] != before["quarantine"]
                else ""
            )
        )

    def _summary(
        self,
        before: dict[str, int],
        after: dict[str, int],
        expected: Counter[str],
        elapsed: float,
        code: int | None,
        settled: bool,
    ) -> int:
        acked = after["receipts"] - before["receipts"]
        buried = after["dead"] - before["dead"]
        quarantined = after["quarantine"] - before["quarantine"]
        rate = (acked + buried) / elapsed if elapsed > 0 else 0.0
        self.say(f"daemon exited with status {code} after {self.tally.lines} log lines")
        self.say("")
        self.say(
            f"summary: {acked} acked, {self.tally.retried} retried, {buried} buried, {quarantined} quarantined "
            f"in {elapsed:.1f}s ({rate:.1f} jobs/s)"
        )
        want_acked = expected["plain"] + expected["flaky"]
        found = problems(self.jobs, expected, before, after, self.tally.retried, code, settled=settled)
        for p in found:
            self.say(f"PROBLEM: {p}")
        if not found and not pending(before):
            self.say(
                f"checked: {want_acked} = {expected['plain']} plain + {expected['flaky']} flaky acked, "
                f"{expected['poison']} poison buried, {expected['flaky']} retried once, nothing left over"
            )
        self.say(f"the queue now holds {after['receipts']} receipts and {after['dead']} dead jobs in total")
        if self.s3:
            return bucket.epilogue(self.say, self.queue_path, self.shown_base, found)
        steadq = typed(tool("steadq", "steadqd.cli.main"))
        qpath = self.queue_shown
        self.say("\nlook inside:")
        self.say(f"  {steadq} stats {qpath}")
        self.say(f"  {steadq} ls {qpath} all                  # every job, with attempts and ages")
        self.say(f"  {steadq} admin dead-list {qpath}         # the buried poison jobs")
        self.say(f"  {steadq} admin requeue {qpath} JOB_ID    # give one another chance")
        self.say(f"  {steadq} fsck {qpath} --deep")
        self.say(
            f"  grep JOB_ID {os.path.join(self.shown_base, 'daemon.log')}      # one job's story in the daemon's log"
        )
        self.say(f"  cat {os.path.join(self.shown_base, 'etc', QUEUE_NAME + '.yaml')}")
        self.say("run it again to add another batch to the same queue; rm -rf " + self.shown_base + " to start over")
        return 0 if not found else 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(
        prog="steadqd demo",
        description=(__doc__ or "").splitlines()[0],
        epilog="Everything the demo creates is under --path; rm -rf it to start over.",
    )
    ap.add_argument(
        "--path",
        default=None,
        help="directory for the demo's queue, config and log (default ./var/demo, with --s3 ./var/demo-s3)",
    )
    ap.add_argument(
        "--s3",
        action="store_true",
        help="the same demo on a bucket queue, in an embedded SeaweedFS on 127.0.0.1 (the demo extra)",
    )
    ap.add_argument("--jobs", type=int, default=300, help="jobs to enqueue (default 300)")
    ap.add_argument(
        "--concurrency",
        "--workers",
        dest="concurrency",
        type=int,
        default=3,
        help="jobs the worker runs at once (default 3)",
    )
    ns = ap.parse_args(args)
    if not 1 <= ns.jobs <= 100_000:
        ap.error("--jobs must be between 1 and 100000")
    if not 1 <= ns.concurrency <= 64:
        ap.error("--concurrency must be between 1 and 64")
    path = ns.path or os.path.join("var", "demo-s3" if ns.s3 else "demo")
    return Demo(path, ns.jobs, ns.concurrency, sys.stdout, s3=ns.s3).run()


if __name__ == "__main__":
    sys.exit(main())
