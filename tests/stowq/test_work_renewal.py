"""``steadq work`` on a bucket queue keeps the lease its renewals return.

Found by the multi-host test: a bucket lease is immutable, and a renewal
returns the next generation's lease instead of updating the old one (the
filesystem backend updates its lease in place). ``work`` kept renewing and
acking the lease it started with, so a job that outlived half its lease
was refused at ack (generation 2 exists, so generation 1 may not settle),
stayed unacknowledged, and ran again on whichever worker took it next.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from steadqd.backend import open_queue
from steadqd.s3.backend import BucketBackend
from tests.stowq.seaweed import Seaweed
from tests.stowq.test_cli_bucket import field, live_queue, ok

pytestmark = pytest.mark.slow


def test_a_job_that_outlives_half_its_lease_is_acked_once(
    seaweed: Seaweed, live_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, url = live_queue(seaweed, live_prefix, tmp_path, monkeypatch)
    job = field(ok(env, "put", url, "-", stdin=b"slow").stdout, "job_id")
    runs = tmp_path / "runs"
    # A 2 s lease is renewed after 1 s and again after 2 s; the command ends after 2.5 s.
    command = f'cat > /dev/null; sleep 2.5; echo "$STEADQ_JOB_ID $STEADQ_ATTEMPT" >> {runs}'
    ok(env, "work", url, "--once", "--lease", "2s", "--", "sh", "-c", command)
    assert runs.read_text() == f"{job} 1\n"
    q = open_queue(url)
    try:
        assert isinstance(q, BucketBackend), q  # the receipt is read from the bucket's own keys
        store = q.layout.store
        receipt = store.get(q.layout.key(q.job_key(job).replace("jobs/", "receipts/", 1)))
        assert receipt.meta.size > 0  # acked by the one run
        assert q.lease(duration=2.0) is None
    finally:
        q.close()
