"""The Python worker API: a handler per job, with the lease work done for you.

Users of huey and rq write a function and expect the queue to call it. Here::

    from steadqd import task, Bury

    @task("/var/lib/steadq/thumbs")
    def thumbnail(path: str, size: int = 256) -> None:
        if not path.endswith(".jpg"):
            raise Bury(f"not a JPEG: {path}")      # dead-lettered, never retried
        make_thumbnail(path, size)                  # an exception retries with backoff

    thumbnail.enqueue("/srv/in/a.jpg", size=128)    # producer side: a JSON job
    thumbnail.schedule(args=("/srv/in/b.jpg",), delay=30)
    thumbnail.work(concurrency=4)                   # consumer side: until SIGTERM

or, without the decorator, ``work(queue, handler)`` with ``handler(job: Job)``;
``await work_async(queue, handler)`` takes a coroutine function.

What it does for each job, in the order the queue's guarantees need:

* lease (``lease`` seconds), then read the payload *verified*: a corrupt job
  is quarantined by the queue and never reaches the handler;
* renew in the background every ``renew_every`` (default a third of the
  lease) from a handle of its own, so a long handler never loses its lease
  to recovery and a slow payload read never delays another job's renewal;
* the handler returns: ack. It raises :class:`Bury`: dead-letter with the
  application's reason code. It raises :class:`Retry`: give the job back
  after its delay. Any other exception: give it back with the exponential
  backoff (``retry``), and dead-letter when the attempts are used up;
* a lease lost meanwhile (the handler outran its renewals, the machine
  slept) is never settled: the job's new owner decides, and it is logged.

Stopping: SIGTERM or SIGINT (or :meth:`Worker.stop`) stops leasing and lets
running handlers finish (the drain); a second signal, or ``drain_timeout``,
hands the running jobs' leases back at once (a handler thread cannot be
killed; it runs on, and its late result is dropped: the lease is no longer
its own). Leases, not threads, are the unit of safety: whatever happens to
this process, a job is run again only after its lease expired or was handed back.

Pausing: ``steadq pause`` (``Backend.pause``) is read before every lease
(one open on a filesystem, one GET on a bucket; the lease's scan costs
more), so no claim starts after the pause is visible, and running handlers
finish and settle as usual. A paused consumer waits for news: a filesystem
queue's ready watch hears the pause record go (inotify on ``control/``), so
the resume is taken up at once; a bucket sends no event, so its consumers
read the pause again every ``PAUSED_BUCKET_LOOK`` seconds, as the worker
daemon does (a resume on this host also rings the doorbell).

The worker opens its own handles (one per thread, one for renewals) with
:func:`steadqd.backend.open_queue`, so the same API drives any backend.
"""

from steadqd.tasks.decorator import Task, task
from steadqd.tasks.job import BadPayload, Bury, Job, Retry, WorkStats
from steadqd.tasks.worker import Worker, work, work_async

__all__ = ["BadPayload", "Bury", "Job", "Retry", "Task", "WorkStats", "Worker", "task", "work", "work_async"]
