"""``steadqd worker|sweeper|promoter`` on a bucket queue (``queue: s3://...``), as processes, on the live SeaweedFS.

The daemons get only what a unit would give them: the YAML (``s3:`` names
the credentials file, never a secret) and ``AWS_ENDPOINT_URL``/``AWS_REGION``
in the environment; the user's own AWS files are hidden. What the test
checks is read back from the bucket (receipts, dead records) and from the
daemon's log lines, which are its journal entries.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from steadqd.constants import DeadReason
from steadqd.s3 import keys
from steadqd.s3.handle import BucketQueue
from steadqd.s3.layout import DEFAULT_FORMAT
from steadqd.s3.store.base import SECOND_NS
from steadqd.s3.views import inspect_job
from tests.daemon.conftest import STEADQD, Daemon, Env, job_spec, live_group_members, wait_for
from tests.stowq.conftest import LIVE_BUCKET
from tests.stowq.seaweed import Seaweed

DEADLINE = 60.0
STEADQ = str(Path(STEADQD).parent / "steadq")


class BucketEnv(Env):
    """A daemon test's world whose queue is a prefix of the live bucket."""

    def __init__(self, tmp: Path, url: str, seaweed: Seaweed, q: BucketQueue, bells: Path) -> None:
        super().__init__(tmp, url)
        self.url = url
        self.seaweed = seaweed
        self.q = q
        self.bells = bells

    def write_bucket_config(self, *, s3: dict[str, Any] | None = None, **worker: Any) -> Path:
        w: dict[str, Any] = {"command": self.command(), "concurrency": 1, "lease": "4s"}
        w.update(worker)
        section = {"credentials_file": str(self.seaweed.credentials_file), "store_profile": "seaweedfs"}
        section.update(s3 or {})
        doc = {"queue": self.url, "s3": section, "worker": w, "sweeper": {"interval": "1s"}}
        path = self.config_dir / f"{self.name}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def daemon_env(self) -> dict[str, str]:
        """The endpoint from the standard variable; the keys only from the named credentials file."""
        return {
            "AWS_ENDPOINT_URL": self.seaweed.endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(self.tmp / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(self.tmp / "no-aws-credentials"),
            "HOME": str(self.tmp),
            "STEADQ_DOORBELL_DIR": str(self.bells),
        }

    def start(self, role: str = "worker") -> Daemon:
        return Daemon(self, role, extra_env=self.daemon_env())

    def settled(self, job_id: str) -> str | None:
        """ "receipt", "dead" or None, read from the bucket."""
        raw = bytes.fromhex(job_id)
        shard = keys.shard_of(self.q.layout.queue_id, raw, self.q.layout.format.shard_count)
        if self.q.layout.exists(keys.receipt_key(shard, raw)):
            return "receipt"
        if self.q.layout.exists(keys.dead_key(shard, raw)):
            return "dead"
        return None


@pytest.fixture
def benv(seaweed: Seaweed, live_prefix: str, tmp_path: Path) -> Iterator[BucketEnv]:
    seaweed.store(LIVE_BUCKET).close()
    # One-second index buckets: a retried job's lease entry is news to the idle watch within a second.
    fmt = replace(DEFAULT_FORMAT, shard_count=2, lease_bucket_width_ns=SECOND_NS, delayed_bucket_width_ns=SECOND_NS)
    store = seaweed.store(LIVE_BUCKET, create=False)
    q = BucketQueue.init(store, live_prefix + "daemons", fmt=fmt, certify_store=False)
    bells = Path(tempfile.mkdtemp(prefix="bell-", dir="/tmp"))  # short: a socket path has at most 107 bytes
    bells.chmod(0o2770)
    try:
        yield BucketEnv(tmp_path, f"s3://{LIVE_BUCKET}/{live_prefix}daemons", seaweed, q, bells)
    finally:
        q.close()
        shutil.rmtree(bells, ignore_errors=True)


def _enqueue(benv: BucketEnv, payload: bytes, **options: Any) -> str:
    os.environ["STEADQ_DOORBELL_DIR"] = str(benv.bells)
    try:
        return benv.q.enqueue(payload, **options)
    finally:
        del os.environ["STEADQ_DOORBELL_DIR"]


def test_the_worker_settles_by_exit_status_on_a_bucket(benv: BucketEnv) -> None:
    benv.write_bucket_config(retry={"backoff_base": "0.1s", "backoff_max": "0.2s", "jitter": False})
    worker = benv.start()
    try:
        worker.ready()
        ok = _enqueue(benv, job_spec(print=["hello from the job"]))
        rejected = _enqueue(benv, job_spec(exit=100))
        flaky = _enqueue(benv, job_spec(exit={"1": 75, "default": 0}), max_attempts=3)
        wait_for(lambda: benv.settled(ok) == "receipt", DEADLINE, "the ack's receipt")
        wait_for(lambda: benv.settled(rejected) == "dead", DEADLINE, "the bury's dead record")
        wait_for(lambda: benv.settled(flaky) == "receipt", DEADLINE, "the retried job's receipt")
        log = worker.log()
        assert f"job {ok[:8]} finished: ack (exit 0" in log
        assert f"job {rejected[:8]} finished: bury (exit 100" in log
        assert f"job {rejected[:8]} buried: exit 100 (consumer_rejected)" in log
        assert f"job {flaky[:8]} finished: retry (exit 75" in log and f"job {flaky[:8]} retried: delayed" in log
        assert sorted(benv.results_of(flaky)) == [1, 2]  # the second attempt, by takeover after the nacked lease
        assert "hello from the job" in log
        assert "LEASE LOST" not in log and "internal error" not in log
        assert list(benv.bells.glob("*/*.sock"))  # the idle worker listens to the doorbell
    finally:
        worker.stop()
    assert worker.proc.returncode == 0
    assert list(benv.bells.glob("*/*.sock")) == []


def test_a_job_longer_than_its_lease_is_renewed_and_acked_once(benv: BucketEnv) -> None:
    benv.write_bucket_config(lease="4s", renew_every="1s")
    worker = benv.start()
    try:
        worker.ready()
        long = _enqueue(benv, job_spec(sleep=7))
        wait_for(lambda: benv.settled(long) is not None, DEADLINE, "the long job settled")
        assert benv.settled(long) == "receipt"
        # The line is logged once the ack took effect (worker/settle.py), so it may follow the receipt.
        wait_for(lambda: f"job {long[:8]} finished: ack" in worker.log(), DEADLINE, "the ack's log line")
        log = worker.log()
        assert "LEASE LOST" not in log and "lease was lost" not in log
        assert sorted(benv.results_of(long)) == [1]  # never taken over: the renewals kept it
    finally:
        worker.stop()


def test_sigterm_drains_the_running_job_then_exits_0(benv: BucketEnv) -> None:
    benv.write_bucket_config()
    worker = benv.start()
    try:
        worker.ready()
        # Held at a barrier the test completes once the worker drains: a job that slept 2 s could
        # be done before a slow SIGTERM, and the log then says nothing is running.
        job = _enqueue(benv, job_spec(barrier={"tag": "held", "n": 2, "timeout": DEADLINE}))
        benv.started(job, 1, timeout=DEADLINE)
        worker.signal(signal.SIGTERM)
        worker.wait_log("stopping: draining 1 running job", timeout=DEADLINE)
        (benv.results / "held-release.here").touch()  # the barrier's second arrival
        assert worker.wait(DEADLINE) == 0
        assert benv.settled(job) == "receipt"
        assert "stopping: draining 1 running job" in worker.log()
    finally:
        worker.stop()


def test_the_promoter_is_not_needed_on_a_bucket_and_exits_0(benv: BucketEnv) -> None:
    benv.write_bucket_config()
    promoter = benv.start("promoter")
    try:
        assert promoter.wait(DEADLINE) == 0
        log = promoter.log()
        assert "promoter not needed on a bucket queue" in log
        assert "stopped: nothing to run for this queue" in log
    finally:
        promoter.stop()


def test_steadqd_run_serves_a_bucket_with_worker_and_sweeper_and_no_promoter(benv: BucketEnv) -> None:
    benv.write_bucket_config()
    run = benv.start("run")
    try:
        run.wait_log(r"started .*STEADQ_ROLES='worker,sweeper'", timeout=DEADLINE)
        assert "promoter not needed on a bucket queue" in run.log()
        job = _enqueue(benv, job_spec())
        wait_for(lambda: benv.settled(job) == "receipt", DEADLINE, "the job acked by steadqd run")
        run.wait_log(r"sweeping every 1s", timeout=DEADLINE)
        run.signal(signal.SIGTERM)
        assert run.wait(DEADLINE) == 0
    finally:
        run.stop()


def test_the_sweeper_prunes_a_settled_jobs_lease_entry_on_a_bucket(benv: BucketEnv) -> None:
    job = _enqueue(benv, b"done")
    lease = benv.q.lease(duration=2.0)
    assert lease is not None and lease.job_id == job
    benv.q.ack(lease)
    entries = [k for k in benv.q.layout.store.list_page(benv.q.layout.key("leases/")).items]
    assert len(entries) == 1  # the acked claim's entry stays until a sweep prunes it
    benv.write_bucket_config()
    sweeper = benv.start("sweeper")
    try:
        sweeper.wait_log(r"sweeping every 1s", timeout=DEADLINE)
        wait_for(
            lambda: not benv.q.layout.store.list_page(benv.q.layout.key("leases/")).items,
            DEADLINE,
            "the sweeper to prune the lease entry",
        )
        sweeper.wait_log(r"recovery pass: .*index entries pruned 1", timeout=DEADLINE)
        sweeper.signal(signal.SIGTERM)
        assert sweeper.wait(DEADLINE) == 0
        assert "recover_failed" not in sweeper.log() and "cannot start" not in sweeper.log()
    finally:
        sweeper.stop()


def test_a_world_readable_credentials_file_stops_the_start_in_one_line_with_78(benv: BucketEnv) -> None:
    loose = benv.tmp / "loose.aws"
    shutil.copy(benv.seaweed.credentials_file, loose)
    loose.chmod(0o644)
    benv.write_bucket_config(s3={"credentials_file": str(loose)})
    worker = benv.start()
    try:
        assert worker.wait(DEADLINE) == 78
        lines = [line for line in worker.log().splitlines() if "cannot start" in line]
        assert len(lines) == 1, worker.log()
        assert f"s3.credentials_file {loose}" in lines[0] and "chmod 600" in lines[0]
    finally:
        worker.stop()


def _check_config(benv: BucketEnv, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **benv.daemon_env()}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run(
        [STEADQD, "--config-dir", str(benv.config_dir), "check-config", *args, benv.name],
        capture_output=True,
        text=True,
        env=env,
        timeout=DEADLINE,
    )


def test_check_config_open_certifies_the_store_and_names_bad_credentials(benv: BucketEnv) -> None:
    benv.write_bucket_config()
    done = _check_config(benv, "--open")
    assert done.returncode == 0, done.stderr
    assert f"ok ({benv.url}; checked as user" in done.stdout
    wrong = benv.tmp / "wrong.aws"
    wrong.write_text("[default]\naws_access_key_id = nobody\naws_secret_access_key = wrong\n")
    wrong.chmod(0o600)
    benv.write_bucket_config(s3={"credentials_file": str(wrong)})
    done = _check_config(benv, "--open")
    assert done.returncode == 78
    first = done.stderr.splitlines()[0]
    assert first.startswith(f"testq: queue {benv.url}: ") and "InvalidAccessKeyId" in first  # one line, named
    assert "Traceback" not in done.stderr


def test_slots_progress_and_on_bury_on_a_bucket(benv: BucketEnv) -> None:
    """Issue 32 #3, #4, #6 on a bucket queue: the job's slot and value, its progress published on
    this host under the bucket queue's id, and on_bury once for the buried job."""
    from steadqd import progress

    go = benv.tmp / "go"
    go.mkdir()
    pdir = benv.tmp / "progress"
    pdir.mkdir()
    script = (
        'echo "$STEADQ_SLOT=$STEADQ_SLOT_VALUE" > "$0/$STEADQ_JOB_ID.slot"; '
        'echo "33 on a bucket" > "$STEADQ_PROGRESS"; '
        'i=0; while [ ! -e "$0/$STEADQ_JOB_ID" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; exit 100'
    )
    told = benv.tmp / "told"
    benv.write_bucket_config(
        command=["/bin/sh", "-c", script, str(go)],
        concurrency=2,
        slots=["gpu-a", "gpu-b"],
        on_bury=["/bin/sh", "-c", 'echo "$STEADQ_JOB_ID $STEADQ_REASON $STEADQ_SLOT" >> "$0"', str(told)],
    )
    worker = Daemon(benv, "worker", extra_env={**benv.daemon_env(), "STEADQ_PROGRESS_DIR": str(pdir)})
    try:
        worker.ready()
        job = _enqueue(benv, b"")
        os.environ["STEADQ_PROGRESS_DIR"] = str(pdir)
        try:
            p = wait_for(lambda: progress.lookup(benv.q.queue_id, job), DEADLINE, "the job's progress")
        finally:
            del os.environ["STEADQ_PROGRESS_DIR"]
        assert p["percent"] == 33 and p["text"] == "on a bucket"
        slot = (go / f"{job}.slot").read_text().strip()
        assert slot in ("0=gpu-a", "1=gpu-b")
        (go / job).touch()
        wait_for(lambda: benv.settled(job) == "dead", DEADLINE, "the bury's dead record")
        wait_for(told.exists, DEADLINE, "on_bury")
        worker.wait_log(rf"on_bury for job {job[:8]} exited 0")
        assert told.read_text() == f"{job} consumer_rejected {slot.split('=')[0]}\n"
        assert not list(pdir.rglob(job))  # unpublished when the command ended
    finally:
        worker.stop()


def _steadq(benv: BucketEnv, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script as an operator on this host runs it: the AWS variables, the same doorbell base."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **benv.daemon_env(), **benv.seaweed.environment()}
    return subprocess.run([STEADQ, *args], capture_output=True, text=True, env=env, timeout=DEADLINE, check=False)


def test_steadq_cancel_under_steadqd_run_kills_a_running_job_at_the_ring_and_buries_a_ready_one(
    benv: BucketEnv,
) -> None:
    """Issue 32 #1 on a bucket: the running job's stop comes from the doorbell, not a renewal.

    The lease is 10 minutes, so the holder's first renewal (which would also find
    the request) comes 200 s after the claim, far past the deadline waited for here;
    what makes the worker look is the cancel's ring (s3/cancel.py)."""
    benv.write_bucket_config(lease="600s", kill_grace="1s")
    run = benv.start("run")
    try:
        run.wait_log(r"started .*STEADQ_ROLES='worker,sweeper'", timeout=DEADLINE)
        running = _enqueue(benv, job_spec(sleep=1000))
        pgid = benv.started(running, 1, timeout=DEADLINE)["pgid"]
        ready = _enqueue(benv, job_spec())  # concurrency 1: it waits, ready, behind the running one
        done = _steadq(benv, "cancel", benv.url, ready[:8])
        assert (done.returncode, done.stdout) == (0, f"{ready} cancelled (was ready)\n"), done.stderr
        done = _steadq(benv, "cancel", benv.url, running)
        assert done.returncode == 0 and f"{running} cancel requested (was running)" in done.stdout, done.stderr
        run.wait_log(rf"job {running[:8]} cancelled: stopping its command", timeout=DEADLINE)
        run.wait_log(rf"job {running[:8]} cancelled \(killed by SIG(TERM|KILL)", timeout=DEADLINE)
        wait_for(lambda: not live_group_members(pgid), DEADLINE, "the job's process group to be gone")
        for job in (running, ready):
            assert benv.settled(job) == "dead"
            (dead,) = [o for o in inspect_job(benv.q.layout, job, benv.q.wall_floor_ns()) if o.state == "dead"]
            assert int(dead.details["reason"]) == DeadReason.CANCELLED
            assert not benv.q.layout.exists(keys.cancel_request_key(bytes.fromhex(job)))  # no request left behind
        assert benv.results_of(running) == {} and benv.results_of(ready) == {}  # neither finished a run
        shown = _steadq(benv, "show", benv.url, running)
        assert shown.returncode == 0 and "cancelled" in shown.stdout, shown.stdout
        log = run.log()
        assert "finished" not in log and "LEASE LOST" not in log and "renewal" not in log
        run.signal(signal.SIGTERM)
        assert run.wait(DEADLINE) == 0
    finally:
        run.stop()
