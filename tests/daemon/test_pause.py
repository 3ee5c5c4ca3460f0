"""A worker daemon and ``steadq pause`` (issue 32 #2): no claim once the pause is visible + 1 s.

The burst: jobs keep arriving while the worker runs four at a time; the
pause lands in the middle. One second after it is visible, the ready count
is taken; from then on it may only grow (producers go on), never shrink by
a claim. Running jobs finish. After ``resume`` (inotify on control/ wakes
the worker: no polling) everything drains. Under ``steadqd run`` the pause
stops the worker's claims only: its sweeper and promoter go on.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from steadqd.fs.handle import Queue
from tests.daemon.conftest import Daemon, Env, job_spec, wait_for
from tests.daemon.test_sweeper_promoter import WIDTH_1S, spawn, wait_until, write_config  # noqa: F401
from tests.invariants import live_tree


def _counts(path: str) -> tuple[int, int]:
    with Queue.open(path) as q:
        s = q.stats()
        return s["ready"].objects, s["leased"].objects


def test_pause_during_a_burst_stops_claims_and_resume_drains(denv: Env, daemons) -> None:  # type: ignore[no-untyped-def]
    denv.write_config(concurrency=4)
    worker: Daemon = daemons(denv)
    worker.ready()
    stop = threading.Event()
    ids: list[str] = []

    def produce() -> None:
        with Queue.open(denv.queue_path) as q:
            for _ in range(400):
                if stop.is_set():
                    return
                ids.append(q.enqueue(job_spec(sleep=0.2)))
                time.sleep(0.02)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_for(lambda: len(list(denv.results.glob("*.start"))) >= 4, what="the burst to be running")
        with Queue.open(denv.queue_path) as q:
            q.pause("burst test")
        visible = time.monotonic()
        worker.wait_log(r"queue paused since .*: burst test; running jobs finish")
        time.sleep(max(0.0, visible + 1.0 - time.monotonic()))
        ready_then, _ = _counts(denv.queue_path)
        started_then = len(list(denv.results.glob("*.start")))
        # running jobs finish; then nothing is claimed, while producers keep enqueueing
        wait_for(lambda: _counts(denv.queue_path)[1] == 0, what="the running jobs to finish")
        time.sleep(2.0)
        ready_now, leased_now = _counts(denv.queue_path)
        assert leased_now == 0
        assert ready_now >= ready_then, (ready_then, ready_now)
        assert len(list(denv.results.glob("*.start"))) == started_then
        assert "paused since" in worker.log()
    finally:
        stop.set()
        producer.join(30)
    with Queue.open(denv.queue_path) as q:
        assert q.resume() is not None
    worker.wait_log(r"queue resumed; claiming again")
    wait_for(lambda: all(denv.results_of(j) for j in ids), 120, "every job to run after the resume")


def test_steadqd_run_paused_claims_nothing_while_sweeper_and_promoter_go_on(tmp_path: Path, spawn) -> None:  # noqa: F811
    """``steadqd run`` (worker, sweeper and promoter in one process) and ``steadq pause``: the pause
    stops only the claims. While paused, a delayed job falls due and is promoted, a lease taken by hand
    (the library's ``lease`` ignores the pause: an operator may still take a job) expires and is reaped;
    none of the jobs is run. After ``resume`` every one runs exactly once."""
    qpath = str(tmp_path / "q")
    out = tmp_path / "out"
    out.mkdir()
    cfg = tmp_path / "cfg"
    write_config(
        cfg,
        "t",
        f"""queue: {qpath}
worker:
  command: ["/bin/sh", "-c", "cat >> {out}/$STEADQ_JOB_ID"]
  concurrency: 2
  lease: 30s
sweeper:
  interval: 1s
promoter:
  max_sleep: 60s
""",
    )
    with Queue.init(qpath, shards=4, delayed_width_ns=WIDTH_1S) as q:
        d = spawn(cfg, "run", "t")
        assert "worker,sweeper,promoter" in d.wait_for("started")
        before = q.enqueue(b"before the pause")
        wait_until(lambda: (out / before).exists(), 30, "the first job to run")
        q.pause("run test")
        visible = time.monotonic()
        reaped = q.enqueue(b"leased by hand, never settled")
        held = q.lease(duration=1.0)
        assert held is not None and held.job_id == reaped
        plain = q.enqueue(b"plain")
        delayed = q.enqueue(b"delayed", delay=2.0)
        d.wait_for("queue paused since")
        d.wait_for("STEADQ_PROMOTED=1", 30)
        d.wait_for("STEADQ_REAPED=1", 30)
        wait_until(
            lambda: {plain, delayed, reaped} <= (lambda t: t.ready | t.delayed)(live_tree(qpath)),
            30,
            "the promoted and the reaped job back in the queue",
        )
        time.sleep(max(0.0, visible + 2.0 - time.monotonic()))
        tree = live_tree(qpath)
        assert delayed in tree.ready and not tree.leased, tree.objects
        assert not any((out / j).exists() for j in (plain, delayed, reaped)), "a job ran while paused"
        assert q.resume() is not None
        d.wait_for("queue resumed; claiming again")
        wait_until(
            lambda: live_tree(qpath).receipts == {before, plain, delayed, reaped},
            30,
            "every job to run after the resume",
            step=0.1,
        )
        assert d.stop() == 0, d.output()
    for job_id, payload in (
        (before, b"before the pause"),
        (plain, b"plain"),
        (delayed, b"delayed"),
        (reaped, b"leased by hand, never settled"),
    ):
        assert (out / job_id).read_bytes() == payload, job_id  # each command ran exactly once (it appends)
    assert "Traceback" not in d.output(), d.output()
