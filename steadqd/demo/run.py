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

``--s3`` runs the same demo on a bucket queue (``s3://demo/queue``, StowQ/1)
on an embedded SeaweedFS (``steadqd.demo.seaweed``: one ``weed server`` on
127.0.0.1, its data under ``var/demo-s3/seaweedfs``, stopped when the demo
ends). The daemon, the producer and ``steadq`` find it through the standard
``AWS_*`` variables, as they would any S3 store. What a bucket queue cannot
store is left out (job metadata, a producer id), and the lease is 5 s: a
nacked job is taken again once its lease has expired (docs/stowq.md).

The demo checks its own result: it exits 0 only when every job it enqueued
was acknowledged or buried as its kind says and the daemon stopped cleanly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue as queue_mod
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TextIO

from steadqd.backend import Backend, init_queue, open_queue
from steadqd.demo import seaweed
from steadqd.errors import ErrorKind, SteadQError

QUEUE_NAME = "demo"
SHARDS = 16  # of a queue the demo creates (one it reuses keeps its own)
DELAY_SECONDS = 2.0
CLI_JOBS = 5  # jobs the producer enqueues with `steadq put`, before its library batch
BURY_REASON = 0x0100  # the first application reason code: "the job itself is bad"
SETTLE_TIMEOUT = 120.0  # s; the demo gives up (exit 1) if the jobs have not settled by then
START_TIMEOUT = 30.0  # s; for the daemon's "started" line
STOP_TIMEOUT = 30.0  # s; for the drain after SIGTERM
BUCKET_URL = "s3://demo/queue"  # the --s3 demo's queue, in the embedded SeaweedFS
BUCKET_LEASE = "5s"  # a nacked job returns after its lease: a short one keeps the flaky jobs' retry quick
BUCKET_COUNT_INTERVAL = 1.0  # s between the counts of a bucket queue (each is a LIST of every plane)
BUCKET_SETTLE_TIMEOUT = 240.0  # s; every job is several store round trips, and flaky ones wait out a lease
# AWS settings of the caller's environment that would point the demo's clients elsewhere.
_FOREIGN_AWS = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION")


# --- the plan: which job is what ------------------------------------------------


def job_kind(i: int) -> str:
    """Kind of the i-th demo job: every 37th (from 7) is poison, every 11th (from 3) flaky.

    The two residue classes never meet below 407 jobs, so the counts are easy
    to check: ``plain + flaky`` jobs end acknowledged, ``poison`` ones buried.
    """
    if i % 37 == 7:
        return "poison"
    if i % 11 == 3:
        return "flaky"
    return "plain"


def job_delay(i: int) -> float:
    """Every 50th job (from 25) waits in delayed/ for DELAY_SECONDS before it may run."""
    return DELAY_SECONDS if i % 50 == 25 else 0.0


def plan_counts(jobs: int) -> Counter[str]:
    """How many jobs of each kind (and how many delayed) a run of ``jobs`` enqueues."""
    c: Counter[str] = Counter(job_kind(i) for i in range(jobs))
    c["delayed"] = sum(1 for i in range(jobs) if job_delay(i))
    return c


def payload(i: int) -> bytes:
    return json.dumps({"frame": i, "kind": job_kind(i)}, sort_keys=True).encode()


# --- tools next to this interpreter --------------------------------------------------


def _tool(name: str, module: str) -> list[str]:
    """The console script installed next to this Python, else ``python -m module``."""
    exe = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.isfile(exe) and os.access(exe, os.X_OK):
        return [exe]
    return [sys.executable, "-m", module]


def _shown(argv: list[str]) -> str:
    """A command line as a person would type it (relative paths where shorter)."""
    out = []
    for a in argv:
        if os.path.isabs(a):
            rel = os.path.relpath(a)
            a = rel if len(rel) < len(a) and not rel.startswith("../..") else a
        out.append(a)
    return " ".join(out)


# --- the producer (a separate process) ---------------------------------------------


def _produce(argv: list[str]) -> int:
    """``python -m steadqd.demo.run _produce QUEUE JOBS``: enqueue the demo's jobs.

    The first CLI_JOBS go through ``steadq put`` (one process each, like a
    shell script would), the rest through the library in one batch: every job
    file is fsynced, the directory fsyncs are shared by the batch.
    """
    try:
        return _produce_jobs(argv[0], int(argv[1]))
    except KeyboardInterrupt:  # ^C in the demo's terminal: the demo reports it
        return 130


def _produce_jobs(path: str, jobs: int) -> int:
    steadq = _tool("steadq", "steadqd.cli.main")
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
        print(f"producer: $ {_shown(cmd)} <<< '{payload(i).decode()}'  -> job_id {job_id[:12]}", flush=True)
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
                kinds["delayed 2s"] += 1
    took = time.monotonic() - t0
    summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    print(
        f"producer: enqueued {jobs - first} jobs with the library in one batch in {took:.2f}s ({summary})", flush=True
    )
    return 0


# --- reading the daemon's log ------------------------------------------------------

_LINE = re.compile(r"^<(?P<prio>\d)>(?P<role>[\w-]+)\[(?P<queue>[^\]]*)\]: (?P<rest>.*)$")
_FIELD = re.compile(r"\s(STEADQ_[A-Z0-9_]+)=('(?:[^'\\]|\\.)*'|\S+)")
# The worker's sentences about a job (daemon/worker/settle.py): "job 3d1f6a0c finished: ack (...)" and its follow-ups.
_FINISHED = re.compile(r"job \S+ finished: (\w+)")
_RETRIED = re.compile(r"job \S+ retried: ")
_BURIED = re.compile(r"job \S+ buried: ")


@dataclass
class LogLine:
    """One daemon stderr line, parsed (``<N>role[queue]: message KEY=value ...``)."""

    raw: str
    priority: int = 6
    message: str = ""
    fields: dict[str, str] = field(default_factory=dict)
    prefix: str = ""  # "<6>run[demo]:"; empty for unprefixed output

    @classmethod
    def parse(cls, raw: str) -> LogLine:
        m = _LINE.match(raw)
        if m is None:  # a traceback or other unprefixed output
            return cls(raw, 3, raw)
        rest = m["rest"]
        fields = {k: v.strip("'") for k, v in _FIELD.findall(" " + rest)}
        first = _FIELD.search(" " + rest)
        message = rest if first is None else (" " + rest)[: first.start()].strip()
        return cls(raw, int(m["prio"]), message, fields, f"<{m['prio']}>{m['role']}[{m['queue']}]:")

    def short(self) -> str:
        """The line as shown on screen: STEADQ_ prefixes dropped, job ids cut to 12 hex digits.

        ``daemon.log`` keeps the lines verbatim; this only keeps a terminal
        line readable (a job id is 32 hex digits, and 12 identify it here).
        """
        if not self.prefix:
            return self.raw
        parts = [self.prefix, self.message]
        for k, v in sorted(self.fields.items()):
            if k == "STEADQ_PATH":
                continue
            if k == "STEADQ_JOB_ID" and len(v) > 12:
                v = v[:12] + "…"
            parts.append(f"{k.removeprefix('STEADQ_')}={v}")
        return " ".join(parts)


@dataclass
class Tally:
    """What the daemon's log says happened (cross-checked against the tree)."""

    finished: Counter[str] = field(default_factory=Counter)
    retried: int = 0
    buried: int = 0
    promoted: int = 0
    lines: int = 0
    errors: int = 0
    recovery_passes: int = 0
    shown_finishes: int = 0
    shown_outputs: int = 0
    shown_complaints: int = 0

    def feed(self, line: LogLine) -> bool:
        """Count ``line``; return True if the demo should show it."""
        self.lines += 1
        msg = line.message
        if m := _FINISHED.match(msg):
            self.finished[m[1]] += 1
            if line.fields.get("STEADQ_VERDICT") == "ack" and self.shown_finishes < 3:
                self.shown_finishes += 1
                return True
            return False
        stream = line.fields.get("STEADQ_STREAM")
        if stream == "stdout":  # a job's own output, forwarded with its fields
            if self.shown_outputs < 3:
                self.shown_outputs += 1
                return True
            return False
        if stream == "stderr":
            if self.shown_complaints < 3:
                self.shown_complaints += 1
                return True
            return False
        if msg.startswith("recovery pass"):  # the sweeper; the first pass compacts old receipts
            self.recovery_passes += 1
            return self.recovery_passes == 1 or any(
                line.fields.get(f"STEADQ_{k}", "0") != "0" for k in ("REAPED", "TO_DEAD", "QUARANTINED", "TEMP_DELETED")
            )
        if _RETRIED.match(msg):
            self.retried += 1
            return True
        if _BURIED.match(msg):
            self.buried += 1
            return True
        if msg.startswith("promoted "):
            self.promoted += int(line.fields.get("STEADQ_PROMOTED", "0"))
            return True
        if line.priority <= 3:
            self.errors += 1
            return True
        # Notices: started, recovery passes, stopping, stopped. Job output on
        # stderr (flaky/poison explaining themselves) and "job started" are in
        # daemon.log but would drown the rest.
        return line.priority <= 5


def _pump(stream: TextIO, tag: str, out: queue_mod.Queue[tuple[str, str | None]], keep: TextIO | None) -> None:
    """Thread: forward lines of a child's pipe to the main loop (None at EOF)."""
    for raw in stream:
        raw = raw.rstrip("\n")
        if keep is not None:
            keep.write(raw + "\n")
            keep.flush()
        out.put((tag, raw))
    out.put((tag, None))


def _start_pumped(
    argv: list[str], tag: str, out: queue_mod.Queue[tuple[str, str | None]], keep: TextIO | None, *, stderr_only: bool
) -> subprocess.Popen[str]:
    """A child whose lines reach the main loop through :func:`_pump`.

    ``stderr_only``: its stdout is discarded (the daemon logs on stderr);
    otherwise both streams are read as one (the producer's report)."""
    child = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL if stderr_only else subprocess.PIPE,
        stderr=subprocess.PIPE if stderr_only else subprocess.STDOUT,
        text=True,
        errors="replace",
        env=_daemon_env(),
    )
    stream = child.stderr if stderr_only else child.stdout
    assert stream is not None
    threading.Thread(target=_pump, args=(stream, tag, out, keep), daemon=True).start()
    return child


# --- the tree -------------------------------------------------------------------------


def _counts(q: Backend) -> dict[str, int]:
    """Objects per state, classified by name (colocated leases count as leased)."""
    return {k: v.objects for k, v in q.stats().items()}


# --- the demo ---------------------------------------------------------------------------


def _pending(counts: dict[str, int]) -> int:
    """Jobs not yet settled: ready, leased or delayed."""
    return counts["ready"] + counts["leased"] + counts["delayed"]


def _write_config(etc: str, queue_path: str, concurrency: int, lease: str = "30s") -> str:
    """The demo's ``demo.yaml``: the same schema as /etc/steadq/queues/*.yaml."""
    os.makedirs(etc, exist_ok=True)
    path = os.path.join(etc, f"{QUEUE_NAME}.yaml")
    text = f"""\
# Written by `steadqd demo` (rewritten on every run). The same schema as
# /etc/steadq/queues/<name>.yaml: see docs/configuration.md.
queue: {json.dumps(queue_path)}

worker:
  command: {json.dumps([sys.executable, "-m", "steadqd.demo.job"])}
  concurrency: {concurrency}
  lease: {lease}
  timeout: 20s
  input: stdin
  pass_environment: [PATH, LANG, LC_ALL, TZ, PYTHONPATH]
  exit_status:
    ack: [0]        # done
    retry: [75]     # EX_TEMPFAIL: flaky jobs on their first attempt
    bury: [100]     # poison jobs
    other: retry
    bury_reason: {BURY_REASON}
  retry:
    backoff_base: 200ms
    backoff_max: 2s
    jitter: true

sweeper:
  interval: 30s

promoter:
  max_sleep: 5s
"""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def _daemon_env() -> dict[str, str]:
    """Our environment minus what would tie the child to *our* service manager."""
    env = dict(os.environ)
    for k in (
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
        "JOURNAL_STREAM",
        "LISTEN_FDS",
        "LISTEN_PID",
        "STEADQ_CONFIG_DIR",
    ):
        env.pop(k, None)
    return env


class Demo:
    def __init__(self, base: str, jobs: int, concurrency: int, out: TextIO, *, s3: bool = False) -> None:
        self.base = os.path.abspath(base)
        self.shown_base = os.path.relpath(self.base) if not os.path.relpath(self.base).startswith("..") else self.base
        self.s3 = s3
        self.queue_path = BUCKET_URL if s3 else os.path.join(self.base, "queue")
        self.queue_shown = BUCKET_URL if s3 else os.path.join(self.shown_base, "queue")
        self.count_interval = BUCKET_COUNT_INTERVAL if s3 else 0.0
        self.settle_timeout = BUCKET_SETTLE_TIMEOUT if s3 else SETTLE_TIMEOUT
        self.etc = os.path.join(self.base, "etc")
        self.jobs = jobs
        self.concurrency = concurrency
        self.out = out
        self.events: queue_mod.Queue[tuple[str, str | None]] = queue_mod.Queue()
        self.tally = Tally()
        self.daemon: subprocess.Popen[str] | None = None
        self.producer: subprocess.Popen[str] | None = None
        self.daemon_eof = False
        self.t0 = time.monotonic()

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    # -- setup ---------------------------------------------------------------

    def open_or_create_queue(self) -> tuple[Backend, bool]:
        os.makedirs(self.base, exist_ok=True)
        if self.s3:
            try:
                return open_queue(self.queue_path), False
            except SteadQError as e:
                if e.kind is not ErrorKind.NOT_FOUND:  # no bucket yet, or no queue in it: create one
                    raise
            return init_queue(self.queue_path, shards=SHARDS, delayed_width_ns=1_000_000_000,
                              terminal_width_ns=3_600_000_000_000), True  # fmt: skip
        if os.path.exists(os.path.join(self.queue_path, "FORMAT")):
            return open_queue(self.queue_path), False
        q = init_queue(
            self.queue_path,
            shards=SHARDS,
            delayed_width_ns=1_000_000_000,
            terminal_width_ns=3_600_000_000_000,
            shared=False,
        )
        return q, True

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
        saved = dict(os.environ)
        try:
            for name in _FOREIGN_AWS:
                os.environ.pop(name, None)
            os.environ.update(server.environment())  # the daemon and the producer inherit them
            self.say(f"  S3 endpoint {server.endpoint}; the demo's processes get it through AWS_ENDPOINT_URL")
            return self._run_on_queue()
        finally:
            os.environ.clear()
            os.environ.update(saved)
            server.stop()

    def _run_on_queue(self) -> int:
        try:
            q, created = self.open_or_create_queue()
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
        before = _counts(q)
        if not created:
            self.say(
                "  it holds: "
                + ", ".join(
                    f"{before[k]} {k}" for k in ("ready", "leased", "delayed", "receipts", "dead", "quarantine")
                )
            )
            if _pending(before):
                self.say(
                    f"  {_pending(before)} unfinished jobs of an interrupted run will be run too (a leased one "
                    "only once its 30 s lease has expired and the sweeper has returned it)"
                )
        lease = BUCKET_LEASE if self.s3 else "30s"
        config = _write_config(self.etc, self.queue_path, self.concurrency, lease)
        self.say(
            f"wrote {os.path.join(self.shown_base, 'etc', os.path.basename(config))}: "
            f"worker command `python -m steadqd.demo.job`, concurrency {self.concurrency}, lease {lease}, "
            "exit 0 = ack, 75 = retry (200ms..2s backoff), 100 = bury"
        )
        log_path = os.path.join(self.base, "daemon.log")
        argv = [*_tool("steadqd", "steadqd.daemon.main"), "--config-dir", self.etc, "run", QUEUE_NAME]
        self.say(f"\nstarting the daemon: {_shown(argv)}")
        self.say(
            f"  (a selection of its log lines follows, shortened: STEADQ_ prefixes dropped, job ids cut;\n"
            f"   every line, verbatim, is in {os.path.join(self.shown_base, 'daemon.log')})"
        )
        with open(log_path, "a", encoding="utf-8") as keep:
            keep.write(f"--- steadqd demo {time.strftime('%Y-%m-%d %H:%M:%S')}: {self.jobs} jobs\n")
            self.daemon = _start_pumped(argv, "daemon", self.events, keep, stderr_only=True)
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
        self.producer = _start_pumped(
            [sys.executable, "-m", "steadqd.demo.run", "_produce", self.queue_path, str(self.jobs)],
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
                now_counts = _counts(q)
                next_count = time.monotonic() + self.count_interval
            done = (now_counts["receipts"] - before["receipts"]) + (now_counts["dead"] - before["dead"])
            settled = produced == 0 and done >= self.jobs and not _pending(now_counts)
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
        after = _counts(q)
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
        problems = []
        leftover = _pending(before)
        if leftover:  # jobs of an interrupted run: their kinds are unknown, only the total can be checked
            if acked + buried != self.jobs + leftover:
                problems.append(f"expected {self.jobs} + {leftover} jobs settled, the tree has {acked + buried}")
        else:
            if acked != want_acked:
                problems.append(f"expected {want_acked} acked (plain + flaky), the tree has {acked}")
            if buried != expected["poison"]:
                problems.append(f"expected {expected['poison']} buried (poison), the tree has {buried}")
            if self.tally.retried != expected["flaky"]:
                problems.append(f"expected {expected['flaky']} retries (flaky), the log shows {self.tally.retried}")
        if quarantined:
            problems.append(f"{quarantined} objects were quarantined")
        if code != 0:
            problems.append(f"the daemon exited with status {code}")
        if not settled:
            problems.append("the jobs did not settle")
        if _pending(after):
            problems.append(f"left over: {after['ready']} ready, {after['leased']} leased, {after['delayed']} delayed")
        for p in problems:
            self.say(f"PROBLEM: {p}")
        if not problems and not leftover:
            self.say(
                f"checked: {want_acked} = {expected['plain']} plain + {expected['flaky']} flaky acked, "
                f"{expected['poison']} poison buried, {expected['flaky']} retried once, nothing left over"
            )
        self.say(f"the queue now holds {after['receipts']} receipts and {after['dead']} dead jobs in total")
        if self.s3:
            return self._bucket_epilogue(problems)
        steadq = _shown(_tool("steadq", "steadqd.cli.main"))
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
        return 0 if not problems else 1

    def _bucket_epilogue(self, problems: list[str]) -> int:
        """The same commands work on the bucket, but only while its server runs: run two of them now."""
        steadq = _tool("steadq", "steadqd.cli.main")
        self.say("\nlook inside (steadq on the bucket, with the AWS_* variables the demo set):")
        for args in (["stats", self.queue_path], ["ls", self.queue_path, "dead"]):
            self.say(f"  $ {_shown([*steadq, *args])}")
            r = subprocess.run([*steadq, *args], capture_output=True, text=True, errors="replace", check=False,
                               env=_daemon_env())  # fmt: skip
            for line in (r.stdout + r.stderr).splitlines():
                self.say(f"    {line}")
            if r.returncode != 0:
                problems.append(f"`steadq {' '.join(args)}` exited {r.returncode}")
                self.say(f"PROBLEM: `steadq {' '.join(args)}` exited {r.returncode}")
        self.say(
            f"the bucket is kept in {self.shown_base}/seaweedfs: run the demo with --s3 again to add another "
            f"batch to the same queue; rm -rf {self.shown_base} to start over"
        )
        return 0 if not problems else 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["_produce"]:
        return _produce(args[1:])
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
