"""On a bucket queue, one handle claims for all of a worker's threads, and the threads run what it claimed.

Why not a handle per thread, as on a filesystem: on a bucket each handle has
its own floor (beacons, store-time reads, watermark reads), its own shard
listings, and races its sibling handles for the same jobs (a claim lost, a
receipt HEAD for a job a sibling acked), about a quarter more store
operations per job; and a thread claiming one job at a time waits for seven
round trips alone. One :class:`Feeder` thread claims with ``lease_many`` as
many jobs as threads are free (a bucket handle is safe to share: its claims
of a round are in flight together), and the threads read, run and settle on
the same handle.

What a claimed job is owed before a thread starts it: the worker registers it
at once with the renewing thread (``Worker._claimed``), so it is renewed like a
running job, and a stop gives back every claim no thread took. The feeder
claims no more jobs than there are free threads, so a claim waits only for a
thread to pick it up.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING

from steadqd.tasks.consumer import Consumer
from steadqd.tasks.journal import log

if TYPE_CHECKING:
    from steadqd.tasks.worker import Call, Worker, _Running


class Feeder:
    """The claiming thread's loop, the hand-off to the running threads, and the claims left at a stop."""

    def __init__(self, worker: Worker) -> None:
        self.w = worker
        self.consumer = Consumer(worker, shared=True)
        self._free = threading.Semaphore(worker.concurrency)  # threads not running (nor promised) a job
        self._handed: queue.SimpleQueue[_Running] = queue.SimpleQueue()

    def feed_loop(self) -> None:
        """Claim as many jobs as threads are free, until the stop; a claim made as the stop came goes back."""
        w = self.w
        while not w._stop.is_set():
            if not self._free.acquire(timeout=w.poll):
                continue
            n = 1
            while n < w.concurrency and self._free.acquire(blocking=False):
                n += 1
            leases = self.consumer.lease_many(n) if not w._stop.is_set() else []
            for lease in leases:
                running = w._claimed(lease)
                if w._stop.is_set():
                    self._give_back(running, "the worker is stopping")
                else:
                    self._handed.put(running)
            for _ in range(n - len(leases)):
                self._free.release()

    def run_loop(self, call: Call) -> None:
        """One running thread: take a claimed job, run and settle it on the shared handle, until the stop."""
        w = self.w
        while not w._stop.is_set():
            try:
                running = self._handed.get(timeout=w.poll)
            except queue.Empty:
                continue
            try:
                q = self.consumer.q
                assert q is not None  # a claim came from it, and it is closed only after every thread
                if w._stop.is_set():
                    self._give_back(running, "the worker is stopping")
                else:
                    w._one_job(q, running.lease, call, running)  # a shared handle is kept whatever it returns
            finally:
                self._free.release()

    def release_unstarted(self) -> None:
        """At the stop, once the feeder and the running threads have ended: give back every claim never started."""
        while True:
            try:
                running = self._handed.get_nowait()
            except queue.Empty:
                return
            self._give_back(running, "the worker stopped before running it")

    def _give_back(self, running: _Running, why: str) -> None:
        w, q = self.w, self.consumer.q
        with running.lock:
            running.settling = True  # no more renewals
            if running.job.lease_lost:
                pass  # lost to a renewal, or already handed back by a forced stop: not ours to give
            elif q is not None:
                w._give_back(q, running.lease, why)
            else:
                log.warning("job %s claimed but not started; no handle to give it back, its lease expires",
                            running.lease.job_id)  # fmt: skip
        w._forget(running)

    def close(self) -> None:
        self.consumer.close()
