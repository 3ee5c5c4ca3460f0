"""``steadqd demo --s3``: the same demo on a bucket queue, in an embedded SeaweedFS.

The queue is ``s3://demo/queue`` (StowQ/1) on one ``weed server`` on
127.0.0.1 (``steadqd.demo.seaweed``), its data under ``var/demo-s3/seaweedfs``.
The daemon, the producer and ``steadq`` find it through the standard
``AWS_*`` variables, as they would any S3 store, so the demo sets them in
its own environment for the run and puts the caller's back afterwards. A
bucket's commands work only while its server runs, so the demo runs two of
them itself before it stops the server.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator

from steadqd.demo import seaweed
from steadqd.demo.children import child_env, tool, typed

BUCKET_URL = "s3://demo/queue"  # the --s3 demo's queue, in the embedded SeaweedFS
BUCKET_LEASE = "5s"  # a nacked job returns after its lease: a short one keeps the flaky jobs' retry quick
BUCKET_COUNT_INTERVAL = 1.0  # s between the counts of a bucket queue (each is a LIST of every plane)
BUCKET_SETTLE_TIMEOUT = 240.0  # s; every job is several store round trips, and flaky ones wait out a lease
# AWS settings of the caller's environment that would point the demo's clients elsewhere.
_FOREIGN_AWS = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION")


@contextlib.contextmanager
def pointed_at(server: seaweed.Seaweed) -> Iterator[None]:
    """This process's environment (which the demo's children inherit) names ``server``; stop it afterwards."""
    saved = dict(os.environ)
    try:
        for name in _FOREIGN_AWS:
            os.environ.pop(name, None)
        os.environ.update(server.environment())
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()


def epilogue(say: Callable[[str], None], queue_path: str, shown_base: str, problems: list[str]) -> int:
    """The same commands work on the bucket, but only while its server runs: run two of them now.

    A command that fails is added to ``problems``; the demo's exit status follows them.
    """
    steadq = tool("steadq", "steadqd.cli.main")
    say("\nlook inside (steadq on the bucket, with the AWS_* variables the demo set):")
    for args in (["stats", queue_path], ["ls", queue_path, "dead"]):
        say(f"  $ {typed([*steadq, *args])}")
        r = subprocess.run([*steadq, *args], capture_output=True, text=True, errors="replace", check=False,
                           env=child_env())  # fmt: skip
        for line in (r.stdout + r.stderr).splitlines():
            say(f"    {line}")
        if r.returncode != 0:
            problems.append(f"`steadq {' '.join(args)}` exited {r.returncode}")
            say(f"PROBLEM: `steadq {' '.join(args)}` exited {r.returncode}")
    say(
        f"the bucket is kept in {shown_base}/seaweedfs: run the demo with --s3 again to add another "
        f"batch to the same queue; rm -rf {shown_base} to start over"
    )
    return 0 if not problems else 1
