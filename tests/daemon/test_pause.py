"""A worker daemon and ``steadq pause`` (issue 32 #2): no claim once the pause is visible + 1 s.

The burst: jobs keep arriving while the worker runs four at a time; the
pause lands in the middle. One second after it is visible, the ready count
is taken; from then on it may only grow (producers go on), never shrink by
a claim. Running jobs finish. After ``resume`` (inotify on control/ wakes
the worker: no polling) everything drains.
"""

from __future__ import annotations

import threading
import time

from steadqd.fs.handle import Queue
from tests.daemon.conftest import Daemon, Env, job_spec, wait_for


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
