"""The worker spawner (`steadqd worker QUEUE`) as a real subprocess on real queues.

Jobs are enqueued by this test process (another process than the worker)
and run by a small Python job script (conftest.JOB_SCRIPT) that records
what it saw. Assertions are about the tree (tests/invariants.check_tree),
the job's own records, the daemon's log lines and its notify messages;
the only timing assertions are coarse bounds against a 60 s safety rescan.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from steadqd import Queue
from steadqd.constants import State
from steadqd.daemon.config import WorkerConfig
from steadqd.daemon.environment import build_environment, meta_env_name, meta_env_value
from steadqd.daemon.worker.role import SAFETY_RESCAN
from steadqd.fs.ready_watch import is_ready_name
from tests.daemon.conftest import (
    DEADLINE,
    Env,
    job_spec,
    kill_group,
    live_group_members,
    payload_copies_removed,
    wait_for,
)
from tests.invariants import check_tree, live_tree

FAST_RETRY = {"backoff_base": "1ms", "backoff_max": "10ms", "jitter": False}


def _settled(env: Env, q: Queue, job_id: str, state: str) -> bool:
    """Run one recovery pass (promotes retried jobs: the promoter is another role) and look."""
    q.recover()
    return job_id in live_tree(env.queue_path).ids(state)


# --- pure helpers ---------------------------------------------------------------


def test_metadata_environment_mapping() -> None:
    assert meta_env_name("render.job-kind_2") == "STEADQ_META_RENDER_JOB_KIND_2"
    assert meta_env_value(True) == "true" and meta_env_value(False) == "false"
    assert meta_env_value(0) == "0" and meta_env_value(-12) == "-12"
    assert meta_env_value(b"\x00\xab") == "00ab"
    assert meta_env_value("a\nb $(x)") == "a\nb $(x)"
    assert meta_env_value("nul\0inside") is None


def test_build_environment_is_config_only() -> None:
    cfg = WorkerConfig(command=("x",), environment={"GREETING": "hi"}, pass_environment=("PATH", "MISSING"))
    lease = SimpleNamespace(
        job_id="ab" * 16,
        attempt=2,
        max_attempts=5,
        content_type="text/plain",
        metadata={"a.b": 1, "a-b": 2, "bad": "x\0y", "blob": b"\x01"},
        producer_id="p1",
    )
    env = build_environment(
        cfg, lease, queue_name="q", queue_path="/srv/q", parent_env={"PATH": "/bin", "SECRET": "1"}, payload_file="/t/p"
    )
    assert env == {
        "PATH": "/bin",
        "GREETING": "hi",
        "STEADQ_QUEUE": "q",
        "STEADQ_QUEUE_PATH": "/srv/q",
        "STEADQ_JOB_ID": "ab" * 16,
        "STEADQ_ATTEMPT": "2",
        "STEADQ_MAX_ATTEMPTS": "5",
        "STEADQ_CONTENT_TYPE": "text/plain",
        "STEADQ_PRODUCER_ID": "p1",
        "STEADQ_META_A_B": "2",  # "a-b" sorts before "a.b": the first wins
        "STEADQ_META_BLOB": "01",
        "STEADQ_PAYLOAD_FILE": "/t/p",
    }


def test_ready_names_are_told_from_leased_names(queue: Queue) -> None:
    queue.enqueue(b"x")
    ready = [n for s in os.listdir(f"{queue.path}/ready") for n in os.listdir(f"{queue.path}/ready/{s}")]
    assert len(ready) == 1 and is_ready_name(ready[0])
    assert queue.lease() is not None
    leased = [n for s in os.listdir(f"{queue.path}/ready") for n in os.listdir(f"{queue.path}/ready/{s}")]
    assert len(leased) == 1 and not is_ready_name(leased[0])
    assert not is_ready_name("stray.txt")


def test_ready_watch_wakes_for_ready_names_only(queue: Queue) -> None:
    watch = queue.ready_watch()
    try:
        assert watch.watch_missing() == []
        watch.recount()
        assert watch.ready_estimate == 0 and not watch.wait(0.05)
        queue.enqueue(b"x")
        news = watch.read()
        assert news.appeared and not news.overflowed and watch.ready_estimate == 1
        assert queue.lease() is not None  # the ready name leaves, a leased name appears
        assert not watch.read().appeared and watch.ready_estimate == 0
        queue.enqueue(b"y")
        assert watch.wait(5.0) and watch.ready_estimate == 1
    finally:
        watch.close()


def test_ready_watch_reads_a_burst_beyond_one_buffer_whole_and_in_order(queue: Queue) -> None:
    """Without a wait the watch reads the descriptor once (no FIONREAD first), up to READ_BYTES of whole
    events: a burst bigger than that comes in several reads, none lost, none cut."""
    watch = queue.ready_watch()
    try:
        assert watch.watch_missing() == []
        shard = f"{queue.path}/ready/{sorted(os.listdir(f'{queue.path}/ready'))[0]}"
        names = [f"stray-{i:05d}-" + "x" * 180 for i in range(600)]  # 600 events of ~212 bytes: 2 reads at least
        for n in names:
            os.close(os.open(f"{shard}/{n}", os.O_CREAT | os.O_WRONLY, 0o600))
        got: list[str] = []
        reads = 0
        while events := watch._events(0):
            reads += 1
            got += [name for _wd, _mask, _cookie, name in events]
        assert got == names and reads >= 2
        assert watch._events(0) == [] and not watch.read().appeared
        queue.enqueue(b"x")
        assert watch.read().appeared
    finally:
        watch.close()


# --- the daemon -------------------------------------------------------------------


def test_exit_statuses_settle_jobs_and_output_reaches_the_log(denv: Env, daemons) -> None:
    denv.write_config(concurrency=2, exit_status={"bury_reason": 300}, retry=FAST_RETRY)
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        ok = q.enqueue(job_spec(exit=0, print=["hello from ok"], stderr=["careful from ok"]))
        flaky = q.enqueue(job_spec(exit={"1": 75, "2": 0}))
        rejected = q.enqueue(job_spec(exit=100))
        exhausted = q.enqueue(job_spec(exit=3), max_attempts=1)
        d.ready()
        for job in (ok, flaky, rejected, exhausted):
            denv.result(job, 1)
        # 75 retried with backoff into delayed/; a recovery pass promotes it and attempt 2 acks
        wait_for(lambda: _settled(denv, q, flaky, "receipt"), DEADLINE, "flaky job acked on attempt 2")
        wait_for(lambda: len((t := live_tree(denv.queue_path)).receipts | t.dead) == 4, what="all settled")
    tree = check_tree(denv.queue_path)
    assert tree.receipts == {ok, flaky}
    assert tree.dead == {rejected, exhausted}
    assert tree.objects[rejected].name.reason == 300  # bury_reason from the config
    assert tree.objects[exhausted].name.reason == 4  # attempts exhausted
    assert not tree.ready and not tree.leased and not tree.delayed
    payload_copies_removed(denv)
    assert denv.results_of(flaky)[2]["env"]["STEADQ_ATTEMPT"] == "2"
    assert (
        denv.results_of(ok)[1]["payload"]
        == job_spec(exit=0, print=["hello from ok"], stderr=["careful from ok"]).decode()
    )
    # without journald: "<N>role[queue]: message KEY=value..." lines
    d.wait_log(rf"^<6>worker\[testq\]: hello from ok STEADQ_ATTEMPT=1 STEADQ_JOB_ID={ok} STEADQ_STREAM=stdout$")
    d.wait_log(rf"^<4>worker\[testq\]: careful from ok STEADQ_ATTEMPT=1 STEADQ_JOB_ID={ok} STEADQ_STREAM=stderr$")
    d.wait_log(
        rf"^<6>worker\[testq\]: job {ok[:8]} finished: ack \(exit 0, \d+\.\d s, attempt 1/3\) STEADQ_ATTEMPT=1 STEADQ_DURATION_MS=\d+ STEADQ_EXIT_STATUS=0 "
        rf"STEADQ_JOB_ID={ok} STEADQ_VERDICT=ack$"
    )
    d.wait_log(
        rf"job {flaky[:8]} finished: retry \(exit 75, .*STEADQ_EXIT_STATUS=75 STEADQ_JOB_ID={flaky} STEADQ_VERDICT=retry$"
    )
    d.wait_log(
        rf"job {rejected[:8]} finished: bury \(exit 100, .*STEADQ_EXIT_STATUS=100 STEADQ_JOB_ID={rejected} STEADQ_VERDICT=bury$"
    )
    d.wait_log(rf"job {exhausted[:8]} buried: no attempts left \(1/1, attempts_exhausted\) .*STEADQ_JOB_ID={exhausted}")
    d.wait_log(rf"job {rejected[:8]} buried: exit 100 \(reason 0x012c\) .*STEADQ_JOB_ID={rejected}")


def test_environment_metadata_and_payload_file_are_data(denv: Env, daemons, tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    denv.write_config(input="file", environment={"GREETING": "hello world"}, pass_environment=["PATH", "LANG"])
    meta: dict[str, bool | int | str | bytes] = {
        "evil": f"$(touch {pwned}); `touch {pwned}`",
        "quote": 'it\'s "quoted" \\',
        "multi.line": "first\nsecond",
        "num": -42,
        "flag": False,
        "raw": b"\x00\xff",
    }
    payload = job_spec(exit=0, print=["y" * 20000 + "END", "after the long line"])
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        job = q.enqueue(payload, metadata=meta, content_type="application/json", producer_id="tester-1", max_attempts=7)
        d.ready()
        res = denv.result(job, 1)
        wait_for(lambda: job in live_tree(denv.queue_path).receipts, what="ack")
    env = res["env"]
    assert env["STEADQ_META_EVIL"] == meta["evil"]
    assert env["STEADQ_META_QUOTE"] == meta["quote"]
    assert env["STEADQ_META_MULTI_LINE"] == "first\nsecond"
    assert env["STEADQ_META_NUM"] == "-42" and env["STEADQ_META_FLAG"] == "false" and env["STEADQ_META_RAW"] == "00ff"
    assert not pwned.exists()
    assert env["STEADQ_JOB_ID"] == job and env["STEADQ_ATTEMPT"] == "1" and env["STEADQ_MAX_ATTEMPTS"] == "7"
    assert env["STEADQ_CONTENT_TYPE"] == "application/json" and env["STEADQ_PRODUCER_ID"] == "tester-1"
    assert env["STEADQ_QUEUE"] == "testq" and env["STEADQ_QUEUE_PATH"] == denv.queue_path
    # nothing of the daemon's environment but what the config names (SECRET=1 is in the daemon's env)
    assert {k for k in env if not k.startswith("STEADQ_")} == {"PATH", "LANG", "GREETING"}
    assert env["GREETING"] == "hello world" and env["LANG"] == "C.UTF-8"
    # input: file -> a read-only verified copy, nothing on stdin, removed after the job
    pf = res["payload_file"]
    assert pf["mode"] == 0o400 and res["payload"] == payload.decode() and res["stdin"] == ""
    assert env["STEADQ_PAYLOAD_FILE"] == pf["path"]
    payload_copies_removed(denv)  # the settling thread removes the copy after it reported the verdict
    assert not os.path.exists(pf["path"]) and not os.path.exists(os.path.dirname(pf["path"]))
    # the job ran in its own session / process group
    assert res["pgid"] == res["pid"] == res["sid"] and res["pgid"] != d.pid
    # an over-long output line is cut at 16 KiB (and marked); the next line is intact
    d.wait_log(
        rf"^<6>worker\[testq\]: y{{16384}} STEADQ_ATTEMPT=1 STEADQ_JOB_ID={job} STEADQ_STREAM=stdout STEADQ_TRUNCATED=true$"
    )
    d.wait_log(rf"^<6>worker\[testq\]: after the long line STEADQ_ATTEMPT=1 STEADQ_JOB_ID={job} STEADQ_STREAM=stdout$")
    assert "END" not in d.log()


def test_worker_refuses_a_directory_that_is_not_a_queue(denv: Env, daemons) -> None:
    not_a_queue = denv.tmp / "empty"
    not_a_queue.mkdir()
    denv.write_config(queue=str(not_a_queue))
    d = daemons(denv)
    assert d.wait() not in (0, None)
    assert re.search(r"^<3>worker\[testq\]: cannot start: ", d.log(), re.M), d.log()
    assert "started" not in d.log()


def test_idle_worker_is_woken_by_inotify_not_by_polling(denv: Env, daemons) -> None:
    assert SAFETY_RESCAN >= 30  # the only periodic scan; far longer than the bound below
    denv.write_config()
    d = daemons(denv)
    d.ready()
    time.sleep(0.5)  # let the start-up scan finish

    def switches() -> int:
        status = Path(f"/proc/{d.pid}/status").read_text()
        found = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M)
        assert found is not None, status
        return int(found.group(1))

    def wakeups_in_5s() -> int:
        before = switches()
        time.sleep(5.0)
        return switches() - before

    # An idle worker sleeps in one select(): every wake-up is one voluntary context
    # switch. In 5 s only the service's 5 s status timer may fire (once, at most
    # twice); a polling loop of period <= 1.5 s would add 3 or more in every window.
    # A second window is measured only if the first was busy: on a slow machine the
    # start-up scan may not be over after the 0.5 s above.
    windows = [wakeups_in_5s()]
    if windows[0] > 3:
        windows.append(wakeups_in_5s())
    assert min(windows) <= 3, f"idle worker woke {windows} times in consecutive 5 s windows"
    with Queue.open(denv.queue_path) as q:
        t0 = time.monotonic()
        job = q.enqueue(job_spec(exit=0))
        denv.started(job, 1, timeout=SAFETY_RESCAN)
        waited = time.monotonic() - t0
    # Coarse: the job ran long before the safety rescan could have found it.
    assert waited < 10.0, f"job started only after {waited:.1f}s"
    wait_for(lambda: job in live_tree(denv.queue_path).receipts, what="ack")


def test_timeout_kills_the_process_group_and_retries(denv: Env, daemons) -> None:
    denv.write_config(timeout="1s", kill_grace="1s", retry=FAST_RETRY)
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        # attempt 1 ignores SIGTERM (so SIGKILL is needed) and has a grandchild;
        # attempt 2 exits at once but leaves its grandchild holding the output pipes
        job = q.enqueue(job_spec(sleep={"1": 1000}, ignore_term=True, grandchild=True))
        d.ready()
        first = denv.started(job, 1)
        d.wait_log(rf"job timed out after 1s; sending SIGTERM .*STEADQ_JOB_ID={job}")
        d.wait_log(rf"still running after the kill grace; sending SIGKILL .*STEADQ_JOB_ID={job}")
        d.wait_log(
            rf"job {job[:8]} finished: retry \(timed out, killed by SIGKILL, .*STEADQ_JOB_ID={job} STEADQ_SIGNAL=SIGKILL"
        )
        wait_for(lambda: not live_group_members(first["pgid"]), 10, "attempt 1's process group to die")
        # the retry went to delayed/ with backoff; recovery passes promote it (the promoter is another role)
        wait_for(lambda: q.recover() and (denv.results / f"{job}.2.start").exists(), DEADLINE, "attempt 2")
        second = denv.result(job, 2)
        wait_for(lambda: job in live_tree(denv.queue_path).receipts, DEADLINE, "attempt 2 acked")
    assert 1 not in denv.results_of(job)  # attempt 1 never finished
    # the leader of attempt 2 exited; its leftover grandchild was killed with the group
    wait_for(lambda: not live_group_members(second["pgid"]), 10, "attempt 2's leftovers to die")
    assert first["grandchild"] not in live_group_members(first["pgid"])


def test_sigterm_drains_running_jobs_and_takes_no_new_ones(denv: Env, daemons) -> None:
    denv.write_config(concurrency=1)
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        # The running job waits at a barrier the test completes once the worker drains: a job that
        # slept 2 s could end during a slow enqueue below, and the worker then lease the waiting one.
        running = q.enqueue(job_spec(barrier={"tag": "held", "n": 2, "timeout": DEADLINE}))
        d.ready()
        denv.started(running, 1)
        waiting = q.enqueue(job_spec(exit=0))
        d.signal(signal.SIGTERM)
        d.wait_log("stopping: draining")
        (denv.results / "held-release.here").touch()  # the barrier's second arrival
        assert d.wait() == 0
    tree = check_tree(denv.queue_path)
    assert tree.receipts == {running}  # finished during the drain and acked once
    assert tree.ready == {waiting} and not tree.leased  # never leased after STOPPING
    assert not (denv.results / f"{waiting}.1.start").exists()
    assert "stopping: draining" in d.log() and re.search(r"^<5>worker\[testq\]: stopped$", d.log(), re.M)


def test_second_sigterm_kills_running_jobs_and_hands_their_leases_back(denv: Env, daemons) -> None:
    denv.write_config(kill_grace="1s")
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        job = q.enqueue(job_spec(sleep=1000, grandchild=True))
        d.ready()
        pgid = denv.started(job, 1)["pgid"]
        d.signal(signal.SIGTERM)
        d.wait_log(r"stopping: draining")
        d.signal(signal.SIGTERM)  # systemd's stop timeout, or an impatient operator
        assert d.wait() == 0
    wait_for(lambda: not live_group_members(pgid), 10, "the job's process group to die")
    tree = check_tree(denv.queue_path)
    assert tree.ready == {job} and not tree.leased and not tree.receipts
    # the claim counted attempt 1 (spec semantics); the next claim will be attempt 2
    assert tree.objects[job].attempt == 1
    assert not list(denv.jobtmp.iterdir())
    d.wait_log(rf"job handed back on stop: ready \(its attempt is counted\) .*STEADQ_JOB_ID={job}")


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    return max(sum(1 for s, e in intervals if s <= t < e) for t, _ in intervals)


def test_sighup_applies_a_new_concurrency(denv: Env, daemons) -> None:
    denv.write_config(concurrency=1)
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        # under concurrency 1 two jobs that would like to meet never do
        pre = [q.enqueue(job_spec(barrier={"tag": "pre", "n": 2, "timeout": 1.0})) for _ in range(2)]
        d.ready()
        runs = [denv.result(j, 1) for j in pre]
        assert _max_overlap([(r["start"], r["end"]) for r in runs]) == 1
        denv.write_config(concurrency=3)
        d.signal(signal.SIGHUP)
        d.wait_log(r"worker configuration reloaded; running jobs keep their settings STEADQ_CONCURRENCY=3")
        d.wait_log(r"reloaded configuration")
        post = [q.enqueue(job_spec(barrier={"tag": "post", "n": 3, "timeout": DEADLINE})) for _ in range(3)]
        runs = [denv.result(j, 1, timeout=DEADLINE + 10) for j in post]
        assert _max_overlap([(r["start"], r["end"]) for r in runs]) == 3
        # a reload that moves the queue is refused; the worker keeps serving this one
        denv.write_config(queue=denv.queue_path + "-elsewhere", concurrency=3)
        d.signal(signal.SIGHUP)
        d.wait_log(r"reload refused, keeping the running configuration: `queue:` changed from ")
        after = q.enqueue(job_spec(exit=0))
        denv.result(after, 1)
        wait_for(lambda: live_tree(denv.queue_path).receipts >= {*pre, *post, after}, what="all acked")


def test_sigkilled_worker_leaves_a_lease_that_recovery_returns(denv: Env, daemons) -> None:
    denv.write_config(lease="2s", renew_every="500ms")
    d = daemons(denv)
    pgid = None
    try:
        with Queue.open(denv.queue_path) as q:
            job = q.enqueue(job_spec(sleep=1000))
            d.ready()
            pgid = denv.started(job, 1)["pgid"]
            # renewals keep the lease alive well past its 2 s duration
            time.sleep(3.0)
            q.recover()
            assert [i.state for i in q.inspect(job)] == [State.LEASED]
            d.proc.kill()
            d.wait()
            wait_for(
                lambda: q.recover() is not None and [i.state for i in q.inspect(job)] == [State.READY],
                DEADLINE,
                "recovery to return the expired lease",
            )
            info = q.inspect(job)[0]
            assert info.attempt == 1  # the claim counted the attempt; the next claim makes it 2
    finally:
        if pgid is not None:
            kill_group(pgid)  # the orphaned job command (own session) of the killed worker


def test_a_restarted_worker_removes_the_payload_copies_of_a_killed_one(denv: Env, daemons) -> None:
    """Payloads may be sensitive: the copy a SIGKILLed worker could not remove goes at the next start."""
    denv.write_config(lease="30s")
    d = daemons(denv)
    pgid = None
    try:
        with Queue.open(denv.queue_path) as q:
            job = q.enqueue(job_spec(sleep=1000))
        d.ready()
        pgid = denv.started(job, 1)["pgid"]
        left = sorted(denv.jobtmp.iterdir())
        assert len(left) == 1 and (left[0] / "payload").exists()
        d.proc.kill()
        d.wait()
        kill_group(pgid)  # the orphaned job command (own session) of the killed worker
        wait_for(lambda: not live_group_members(pgid), DEADLINE, "the orphaned job to exit")
        d2 = daemons(denv)
        d2.ready()
        d2.wait_log(r"removed 1 payload copies left by a worker that was killed")
        assert not left[0].exists()
    finally:
        if pgid is not None:
            kill_group(pgid)


def test_sd_notify_sequence(denv: Env, daemons, tmp_path: Path) -> None:
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(1.0)
    messages: list[str] = []

    def until(pred, what: str, start: int = 0) -> int:
        """Receive until a message at index >= start satisfies pred; returns its index."""
        deadline = time.monotonic() + DEADLINE
        while True:
            for i in range(start, len(messages)):
                if pred(messages[i].split("\n")):
                    return i
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} in {messages}\n{d.log()}")
            try:
                messages.append(sock.recv(4096).decode())
            except TimeoutError:
                pass

    try:
        denv.write_config()
        d = daemons(denv, extra_env={"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "1000000"})
        ready = until(lambda ls: "READY=1" in ls, "READY=1")
        until(lambda ls: "WATCHDOG=1" in ls, "WATCHDOG=1", ready)
        with Queue.open(denv.queue_path) as q:
            job = q.enqueue(job_spec(sleep=1.5))
            denv.started(job, 1)
            d.signal(signal.SIGHUP)  # a running job survives a reload
            reloading = until(lambda ls: "RELOADING=1" in ls, "RELOADING=1")
            ready2 = until(lambda ls: "READY=1" in ls, "READY=1 after the reload", reloading)
            wait_for(lambda: job in live_tree(denv.queue_path).receipts, what="ack across the reload")
        until(lambda ls: "WATCHDOG=1" in ls, "a watchdog ping after the reload", ready2)
        d.signal(signal.SIGTERM)
        until(lambda ls: "STOPPING=1" in ls, "STOPPING=1")
        assert d.wait() == 0
    finally:
        sock.close()
    lines = [m.split("\n") for m in messages]

    def first(pred, start: int = 0) -> int:
        return next(i for i in range(start, len(lines)) if pred(lines[i]))

    ready = first(lambda ls: "READY=1" in ls)
    assert any(s.startswith("STATUS=worker: 0 running") for s in lines[ready]), lines[ready]
    watchdog = first(lambda ls: "WATCHDOG=1" in ls)
    reloading = first(lambda ls: "RELOADING=1" in ls)
    assert any(re.fullmatch(r"MONOTONIC_USEC=\d+", s) for s in lines[reloading])
    ready2 = first(lambda ls: "READY=1" in ls, reloading)
    stopping = first(lambda ls: "STOPPING=1" in ls)
    assert ready < watchdog < reloading < ready2 < stopping
    assert sum(1 for ls in lines if "WATCHDOG=1" in ls) >= 2
    assert all("READY=1" not in ls for ls in lines[stopping:])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
