"""An expired lease is news to an idle watch even when a sweeper pruned its index entry first.

Found by the multi-host test: a sweeper prunes a ``leases/`` entry as soon as
its bucket is fully due (its end plus the skew guard, by store time), and
the watch reports a bucket's end a margin later, at its next ``leases/``
tick. When the sweeper came first, the watch had nothing left to report,
and the expired lease waited for the worker's once-a-minute rescan.
"""

from __future__ import annotations

from steadqd.s3.keys import parse_key
from tests.stowq.test_watch import PREFIX, _Queue


def test_the_end_of_a_started_lease_bucket_is_news_after_the_sweeper_pruned_it() -> None:
    queue = _Queue()
    now = [0]
    watch = queue.watch(doorbell=False, now_ns=lambda: now[0])
    try:
        queue.q.enqueue(b"held")
        lease = queue.q.claim_once(duration=30)
        assert lease is not None
        entry = next(k for k in queue.memory.keys(PREFIX + "leases/"))
        bucket = parse_key(entry[len(PREFIX) :]).bucket
        assert bucket is not None
        width, guard = queue.q.layout.format.lease_bucket_width_ns, queue.q.layout.skew_guard_ns
        leases = watch._indexes["leases"]
        now[0] = bucket * width + guard
        assert watch._look_index(leases) is True  # the bucket started: the lease may have expired
        queue.memory.delete(entry)  # what the sweeper's pass does once the bucket is fully due
        now[0] = (bucket + 1) * width + guard + watch._margin_ns
        assert watch._look_index(leases) is True  # ended: expired for certain, entry or not
        assert watch._look_index(leases) is False  # said once
    finally:
        watch.close()
