"""A claim says which machine and process wrote it, so a person reading a bucket can tell owners apart.

The multi-host test found every claim signed "steadqd": with workers on
several hosts, ``steadq inspect`` and an ``aws s3 cp`` of a claim could
not say whose lease it was.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from steadqd.s3.handle import BucketQueue
from steadqd.s3.layout import default_worker_id
from steadqd.s3.store.memory import MemoryStore

PREFIX = "farm/"


def test_the_default_worker_id_is_host_and_pid() -> None:
    assert default_worker_id() == f"steadqd@{socket.gethostname()}/{os.getpid()}"
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "from steadqd.s3.layout import default_worker_id as d; import os; print(d(), os.getpid())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    name, pid = child.stdout.split()
    assert name == f"steadqd@{socket.gethostname()}/{pid}" != default_worker_id()


def test_claims_carry_it_and_a_renewal_from_another_handle_keeps_the_leases_own() -> None:
    store = MemoryStore()
    q = BucketQueue.init(store, PREFIX, certify_store=False, floor_staleness_s=0)
    q.enqueue(b"frame 1")
    lease = q.lease(duration=30)
    assert lease is not None and lease.worker_id == default_worker_id()
    other = BucketQueue.open(store, PREFIX, worker_id="render-2", certify_store=False, floor_staleness_s=0)
    renewed = other.renew(lease, duration=30)
    assert renewed.worker_id == default_worker_id() and renewed.generation == lease.generation + 1
