"""The sweeper and promoter roles as real ``steadqd`` subprocesses on real queues.

What matters here is what an operator relies on: an expired lease comes back
without anyone asking, receipts get compacted, a delayed job is promoted when
it is due (never before its not_before) and the promoter wakes for a newly
delayed job through inotify rather than sleeping out ``max_sleep``; SIGTERM
stops cleanly (exit 0), SIGHUP applies a new configuration and a broken one
is refused while the daemon keeps running; sd_notify messages arrive in the
right order on a socket the test owns.

Time bounds are generous and only separate "woken by the event/timer it
should have used" from "waited out a much longer timeout" (60 s max_sleep,
3600 s interval); they never measure speed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from steadqd import LeaseLost, Queue
from steadqd.constants import State
from steadqd.daemon.journal import ErrorDigest, Log
from steadqd.errors import InvalidInput
from steadqd.fs.recovery import run_recovery
from tests.invariants import check_tree, live_tree

REPO = Path(__file__).resolve().parents[2]
STEADQD = str(REPO / ".venv" / "bin" / "steadqd")
WIDTH_1S = 10**9  # delayed bucket width for tests: promotion happens within a second of not_before
STOP_TIMEOUT = 20.0


# -- helpers (kept here: this module must not depend on another suite's conftest) --


def write_config(config_dir: Path, name: str, text: str) -> Path:
    config_dir.mkdir(parents=True, exist_ok=True)
    path = config_dir / f"{name}.yaml"
    path.write_text(text)
    return path


def daemon_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test's environment without anything that would redirect logs or notifications."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JOURNAL_STREAM", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "STEADQ_CONFIG_DIR")
    }
    env.update(extra or {})
    return env


class Daemon:
    """A ``steadqd`` subprocess whose stderr log lines are collected as they come."""

    def __init__(self, config_dir: Path, command: str, queue: str, env: dict[str, str] | None = None) -> None:
        self.argv = [STEADQD, "--config-dir", str(config_dir), command, queue]
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=daemon_env(env),
            cwd=str(REPO),
        )
        self.lines: list[str] = []
        self._terminated = False
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def count(self, text: str) -> int:
        with self._cond:
            return sum(text in line for line in self.lines)

    def wait_for(self, text: str, timeout: float = 15.0, *, occurrence: int = 1) -> str:
        """The ``occurrence``-th log line containing ``text``; fails with the whole log otherwise."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [line for line in self.lines if text in line]
                if len(found) >= occurrence:
                    return found[occurrence - 1]
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    break
                self._cond.wait(min(left, 0.2))
        raise AssertionError(f"no log line with {text!r} (#{occurrence}); exit={self.proc.poll()}\n{self.output()}")

    def signal(self, signum: int) -> None:
        if signum == signal.SIGTERM:
            self._terminated = True
        self.proc.send_signal(signum)

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM (once: a second one during interpreter shutdown would kill
        the process by the default action) and the exit status."""
        if not self._terminated and self.proc.poll() is None:
            self.signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)


@pytest.fixture
def spawn() -> Iterator[Callable[..., Daemon]]:
    """Starts daemons and makes sure none outlives its test."""
    started: list[Daemon] = []

    def start(config_dir: Path, command: str, queue: str, env: dict[str, str] | None = None) -> Daemon:
        d = Daemon(config_dir, command, queue, env)
        started.append(d)
        return d

    yield start
    for d in started:
        d.kill()


def wait_until(predicate: Callable[[], object], timeout: float, what: str, step: float = 0.05) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def state_of(qpath: str, job_id: str) -> State | None:
    return None if (s := live_tree(qpath).state_of(job_id)) is None else State(s)


def not_before_of(q: Queue, job_id: str) -> int:
    (info,) = q.inspect(job_id)
    assert info.state is State.DELAYED, info
    assert info.name.not_before is not None
    return info.name.not_before


def ready_file_ctime(qpath: str, job_id: str) -> int:
    """When the job's ready name came into being: the promotion rename sets the inode's ctime."""
    obj = live_tree(qpath).get(job_id)
    assert obj is not None and obj.state == State.READY, obj
    return os.stat(os.path.join(qpath, obj.path)).st_ctime_ns


# Kernel file timestamps come from the coarse clock (one tick behind at most);
# promoting a whole bucket too early would be >= 1 s off.
CTIME_SLACK_NS = 50_000_000


@pytest.fixture
def qpath(make_queue: Callable[..., Queue], queue_path: str) -> str:
    """A queue with 1 s delayed buckets and no handle open: the daemons under test open their own."""
    make_queue(delayed_width_ns=WIDTH_1S).close()
    return queue_path


# -- sweeper ---------------------------------------------------------------------


def test_sweeper_reaps_expired_lease_and_compacts_receipts(tmp_path: Path, qpath: str, spawn) -> None:
    with Queue.open(qpath) as q:
        lost_id = q.enqueue(b"worker crashed holding this")
        done_id = q.enqueue(b"acknowledged")
        first = q.lease(duration=30.0)
        second = q.lease(duration=30.0)
        assert first is not None and second is not None
        done, held = (first, second) if first.job_id == done_id else (second, first)
        assert q.ack(done).name == "ACKED"
        # The crashed worker's lease: renewed to the 1 s minimum, never again.
        q.renew(held, duration=1.0)
        before = check_tree(qpath)
        assert before.state_of(lost_id) == State.LEASED
        assert before.state_of(done_id) == State.RECEIPT and not before.get(done_id).compact

        cfg = tmp_path / "cfg"
        write_config(cfg, "t", f"queue: {qpath}\nsweeper:\n  interval: 1s\n")
        d = spawn(cfg, "sweeper", "t")
        d.wait_for("started")
        wait_until(lambda: state_of(qpath, lost_id) is State.READY, 15, "the expired lease to be reaped")
        wait_until(lambda: live_tree(qpath).get(done_id).compact, 15, "the receipt to be compacted")
        d.wait_for("STEADQ_REAPED=1")
        # issue 33 #9: the reaped job is named, so its story in the journal (and `show`) is complete
        d.wait_for(f"recovery: job {lost_id[:8]} reaped: its lease expired STEADQ_JOB_ID={lost_id}")
        d.wait_for("STEADQ_COMPACTED=1")
        after = live_tree(qpath)
        # Reaped back to ready with the same attempt and a later generation: no attempt lost.
        reaped = after.get(lost_id)
        assert reaped.attempt == held.attempt and reaped.generation > held.generation
        # The holder's lease is gone: it cannot ack a job that is back in ready.
        with pytest.raises(LeaseLost):
            q.ack(held)
        # An idle queue logs nothing more: a pass that changes nothing is silent.
        changes = d.count("recovery pass")
        time.sleep(2.5)  # at least two more 1 s passes
        assert d.count("recovery pass") == changes, d.output()
        assert d.stop() == 0, d.output()
        d.wait_for("stopped")
    assert "Traceback" not in d.output(), d.output()
    check_tree(qpath)  # stopped between passes: no compaction temp left behind


def test_sweeper_notify_ready_status_reloading_stopping(tmp_path: Path, qpath: str, spawn) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"steadq-test-{os.getpid()}-{time.monotonic_ns()}"
    sock.bind("\0" + name)
    sock.settimeout(0.5)
    messages: list[str] = []

    def receive_until(pred: Callable[[str], bool], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = sock.recv(4096).decode()
            except TimeoutError:
                continue
            messages.append(msg)
            if pred(msg):
                return msg
        raise AssertionError(f"notification not received; got {messages}")

    try:
        cfg = tmp_path / "cfg"
        write_config(cfg, "t", f"queue: {qpath}\nsweeper:\n  interval: 1s\n")
        d = spawn(cfg, "sweeper", "t", {"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "500000"})
        ready = receive_until(lambda m: "READY=1" in m, 15)
        assert "STATUS=sweeper: " in ready, ready
        receive_until(lambda m: m == "WATCHDOG=1", 5)
        # The periodic STATUS line tells a person what the last pass did.
        status = receive_until(lambda m: m.startswith("STATUS=sweeper: last pass "), 15)
        assert "ago: nothing to do" in status, status
        d.signal(signal.SIGHUP)
        reloading = receive_until(lambda m: "RELOADING=1" in m, 10)
        assert "MONOTONIC_USEC=" in reloading, reloading
        receive_until(lambda m: "READY=1" in m, 10)
        d.wait_for("reloaded configuration")
        d.signal(signal.SIGTERM)
        stopping = receive_until(lambda m: "STOPPING=1" in m, 10)
        assert "STATUS=" in stopping
        assert d.stop() == 0, d.output()
    finally:
        sock.close()
    kinds = [m.split("=")[0] for m in messages if m != "WATCHDOG=1" and not m.startswith("STATUS=")]
    assert kinds == ["READY", "RELOADING", "READY", "STOPPING"], messages


def test_sweeper_reload_applies_new_interval_and_refuses_broken_config(tmp_path: Path, qpath: str, spawn) -> None:
    cfg = tmp_path / "cfg"
    path = write_config(cfg, "t", f"queue: {qpath}\nsweeper:\n  interval: 1h\n")
    d = spawn(cfg, "sweeper", "t")
    d.wait_for("started")
    with Queue.open(qpath) as q:
        a = q.enqueue(b"a")
        lease_a = q.lease(duration=1.0)
        assert lease_a is not None and lease_a.job_id == a
        time.sleep(1.2)  # expired, but the next pass is an hour away
        assert state_of(qpath, a) is State.LEASED
        write_config(cfg, "t", f"queue: {qpath}\nsweeper:\n  interval: 1s\n  receipt_retention: 2h\n")
        d.signal(signal.SIGHUP)
        d.wait_for("reloaded configuration")
        wait_until(lambda: state_of(qpath, a) is State.READY, 15, "a pass on the new 1 s interval")

        # A broken file is refused; the old configuration (1 s passes) keeps running.
        path.write_text(f"queue: {qpath}\nsweeper:\n  intervall: 1s\n")
        d.signal(signal.SIGHUP)
        line = d.wait_for("reload refused")
        assert "t.yaml" in line and "sweeper.intervall" in line, line
        assert d.proc.poll() is None
        b = q.enqueue(b"b")
        lease_b = q.lease(duration=1.0)
        assert lease_b is not None and lease_b.job_id in (a, b)
        wait_until(lambda: state_of(qpath, lease_b.job_id) is State.READY, 15, "sweeping after a refused reload")
    assert d.stop() == 0, d.output()


# -- promoter --------------------------------------------------------------------


def promoter_config(cfg: Path, qpath: str, max_sleep: str = "60s") -> None:
    write_config(cfg, "t", f"queue: {qpath}\npromoter:\n  max_sleep: {max_sleep}\n")


def test_promoter_promotes_when_due_and_not_before(tmp_path: Path, qpath: str, spawn) -> None:
    cfg = tmp_path / "cfg"
    promoter_config(cfg, qpath)
    d = spawn(cfg, "promoter", "t")
    d.wait_for("started")
    with Queue.open(qpath) as q:
        soon = q.enqueue(b"in two seconds", delay=2.0)
        later = q.enqueue(b"in an hour", delay=3600.0)
        nb = not_before_of(q, soon)
        due = -(-nb // WIDTH_1S) * WIDTH_1S  # the bucket's eligibility instant
        seen_delayed_at = 0
        while True:
            wall = q.wall_floor_ns()
            st = state_of(qpath, soon)
            if st is State.READY:
                break
            assert st is State.DELAYED, st
            seen_delayed_at = wall
            assert wall - due < 10 * 10**9, f"not promoted 10 s after due\n{d.output()}"
            time.sleep(0.05)
        # Never before its not_before (it no longer waits for its bucket's instant, issue 16).
        promoted_at = ready_file_ctime(qpath, soon)
        assert promoted_at >= nb - CTIME_SLACK_NS, (promoted_at, nb)
        assert seen_delayed_at > 0  # it really was delayed for a while
        assert state_of(qpath, later) is State.DELAYED
        d.wait_for("STEADQ_PROMOTED=1")
        ts = live_tree(qpath)
        assert ts.ready == {soon} and ts.delayed == {later}
    assert d.stop() == 0, d.output()
    d.wait_for("stopped")


def test_promoter_wakes_for_new_bucket_via_inotify(tmp_path: Path, qpath: str, spawn) -> None:
    """Idle with max_sleep 60 s (and a job an hour away): a new 1 s job must not wait 60 s."""
    cfg = tmp_path / "cfg"
    promoter_config(cfg, qpath, "60s")
    with Queue.open(qpath) as q:
        far = q.enqueue(b"far", delay=3600.0)
        d = spawn(cfg, "promoter", "t")
        d.wait_for("started")
        t0 = time.monotonic()
        job = q.enqueue(b"soon", delay=1.0)
        nb = not_before_of(q, job)
        wait_until(lambda: state_of(qpath, job) is State.READY, 10, "the promoter to re-arm on inotify")
        assert time.monotonic() - t0 < 10
        assert ready_file_ctime(qpath, job) >= nb - CTIME_SLACK_NS
        assert state_of(qpath, far) is State.DELAYED
    assert d.stop() == 0, d.output()


def test_promoter_wakes_for_job_in_existing_empty_bucket(tmp_path: Path, qpath: str, spawn) -> None:
    """The bucket directory already exists (so no event on delayed/): the shard watch must fire."""
    cfg = tmp_path / "cfg"
    promoter_config(cfg, qpath, "60s")
    with Queue.open(qpath) as q:
        q.enqueue(b"far", delay=3600.0)
        # Make an empty bucket a few seconds ahead: publish into it, then remove the job.
        _, rel = q.enqueue_detailed(b"placeholder", delay=6.0)
        bucket_dir = os.path.dirname(os.path.dirname(os.path.join(qpath, rel)))
        os.unlink(os.path.join(qpath, rel))
        bucket = int(os.path.basename(bucket_dir), 16)
        d = spawn(cfg, "promoter", "t")
        d.wait_for("started")
        nb = bucket * WIDTH_1S - WIDTH_1S // 2  # inside that bucket
        if nb - q.wall_floor_ns() < WIDTH_1S // 2:
            pytest.fail("machine too slow: the prepared bucket is already (almost) due")
        t0 = time.monotonic()
        job, rel2 = q.enqueue_detailed(b"same bucket", not_before_ns=nb)
        assert os.path.dirname(os.path.dirname(os.path.join(qpath, rel2))) == bucket_dir
        wait_until(lambda: state_of(qpath, job) is State.READY, 20, "promotion through the shard watch")
        assert time.monotonic() - t0 < 20  # well short of max_sleep (60 s)
        assert ready_file_ctime(qpath, job) >= nb - CTIME_SLACK_NS
    assert d.stop() == 0, d.output()


def test_promoter_reload_and_broken_reload(tmp_path: Path, qpath: str, spawn) -> None:
    cfg = tmp_path / "cfg"
    promoter_config(cfg, qpath, "60s")
    d = spawn(cfg, "promoter", "t")
    d.wait_for("started")
    promoter_config(cfg, qpath, "30s")
    d.signal(signal.SIGHUP)
    d.wait_for("reloaded configuration")
    (cfg / "t.yaml").write_text(f"queue: {qpath}\npromoter:\n  max_sleep: forever\n")
    d.signal(signal.SIGHUP)
    line = d.wait_for("reload refused")
    assert "promoter.max_sleep" in line, line
    assert d.proc.poll() is None
    # Still promoting with the kept configuration.
    with Queue.open(qpath) as q:
        job = q.enqueue(b"x", delay=1.0)
        wait_until(lambda: state_of(qpath, job) is State.READY, 10, "promotion after a refused reload")
    assert d.stop() == 0, d.output()
    d.wait_for("stopped")


# -- check-config ----------------------------------------------------------------


def test_check_config_reports_good_and_bad_files(tmp_path: Path, qpath: str) -> None:
    cfg = tmp_path / "cfg"
    write_config(cfg, "good", f"queue: {qpath}\nsweeper:\n  interval: 10s\n")
    write_config(cfg, "bad", f"queue: {qpath}\nsweeper:\n  interval: 10s\n  budget_ops: 0\n")
    r = subprocess.run(
        [STEADQD, "--config-dir", str(cfg), "check-config"],
        capture_output=True,
        text=True,
        timeout=60,
        env=daemon_env(),
        cwd=str(REPO),
    )
    assert r.returncode == 78, (r.stdout, r.stderr)
    assert f"good: ok ({qpath})" in r.stdout
    bad = [line for line in r.stderr.splitlines() if line.startswith("bad:")]
    assert len(bad) == 1, r.stderr
    assert "bad.yaml" in bad[0] and ":4" in bad[0] and "sweeper.budget_ops" in bad[0], bad[0]


# -- in-process pieces: restricted recovery pass, error digest ---------------------


def test_promote_only_pass_leaves_leases_and_cursor_alone(qpath: str) -> None:
    with Queue.open(qpath) as q:
        q.enqueue(b"leased")
        lease = q.lease(duration=1.0)
        assert lease is not None
        job = q.enqueue(b"delayed", delay=0.05)
        nb = not_before_of(q, job)
        wait_until(lambda: q.wall_floor_ns() >= -(-nb // WIDTH_1S) * WIDTH_1S, 5, "the bucket to be due")
        cursor = Path(qpath, "control", "recovery-cursor.json")
        existed = cursor.exists()
        far = 10**18  # every current-boot lease looks expired
        with pytest.raises(InvalidInput):
            run_recovery(q._ctx, phases=("promote",))
        report = run_recovery(q._ctx, budget_ops=100, budget_ms=1000, now_boottime=far, phases=("promote_delayed",))
        assert report.errors == [], report.errors
        assert (report.delayed_promoted, report.leases_reaped) == (1, 0)
        assert cursor.exists() == existed and report.next_phase is None
        assert state_of(qpath, lease.job_id) is State.LEASED
        full = run_recovery(q._ctx, budget_ops=100, budget_ms=1000, now_boottime=far)
        assert full.leases_reaped == 1 and full.delayed_promoted == 0


def test_error_digest_rate_limits_per_code() -> None:
    import io

    out = io.StringIO()
    now = [0.0]
    digest = ErrorDigest(Log("sweeper", "t", journal=False, stream=out), "recovery", window=600, clock=lambda: now[0])
    digest.record([("recovery_lock", "busy")])
    digest.record([("recovery_lock", "busy"), ("directory", "cannot list")])
    now[0] = 300.0
    digest.record([("recovery_lock", "busy")])
    assert out.getvalue().count("recovery_lock") == 2  # message + field of the first report only
    now[0] = 601.0
    digest.record([("recovery_lock", "busy")])
    lines = out.getvalue().splitlines()
    assert [line.startswith("<4>") for line in lines] == [True, True, True]
    assert "STEADQ_ERROR=directory" in lines[1]
    assert "3 occurrences" in lines[2] and "STEADQ_COUNT=3" in lines[2], lines


def test_sweeper_reopens_a_poisoned_handle(qpath: str) -> None:
    """After an indeterminate failure the handle refuses everything; the role must not stop sweeping."""
    import io

    from steadqd.daemon.config import parse_config
    from steadqd.daemon.service import Loop
    from steadqd.daemon.sweeper import SweeperRole

    settings = parse_config(f"queue: {qpath}\nsweeper:\n  interval: 1h\n", path="t.yaml", name="t")
    out = io.StringIO()
    loop = Loop()
    role = SweeperRole(settings, Log("sweeper", "t", journal=False, stream=out))
    try:
        role.start(loop)
        first = role.queue
        assert first is not None
        first._ctx.poison("simulated OutcomeUnknown")
        with Queue.open(qpath) as q:
            job = q.enqueue(b"x")
            lease = q.lease(duration=1.0)
            assert lease is not None and lease.job_id == job
            wait_until(lambda: linux_boottime() > lease.boottime_deadline_ns, 5, "the lease to expire")
        loop.run_once(0.5)  # the start pass
        assert role.queue is not None and role.queue is not first and role.queue.poisoned is None
        assert role.passes == 1 and role.last_report is not None and role.last_report.leases_reaped == 1
        assert "poisoned" in out.getvalue()
    finally:
        role.close()
        loop.close()


def linux_boottime() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)
