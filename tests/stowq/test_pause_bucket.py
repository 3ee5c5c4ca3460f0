"""A worker daemon on a bucket queue (live SeaweedFS) and ``steadq pause``/``resume`` (issue 32 #2, #5).

The pause is an object every host reads (``meta/steadq-paused``); the worker
reads it before each claim pass, so once it is written no claim starts more
than a pass's recheck (0.5 s) later. ``resume`` rings this host's doorbell;
a worker elsewhere looks again within PAUSED_BUCKET_LOOK. A unique key is
refused while its job is anywhere in the bucket, through the command line.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from steadqd.errors import DuplicateJob
from tests.daemon.conftest import job_spec, wait_for
from tests.stowq.test_cli_bucket import aws_env, run
from tests.stowq.test_daemons_bucket import DEADLINE, BucketEnv, _enqueue, benv  # noqa: F401


def test_a_paused_bucket_queue_is_not_claimed_and_resume_drains_it(benv: BucketEnv) -> None:  # noqa: F811
    benv.write_bucket_config()
    worker = benv.start()
    try:
        worker.ready()
        first = _enqueue(benv, job_spec())
        wait_for(lambda: benv.settled(first) == "receipt", DEADLINE, "the first job's receipt")
        benv.q.pause("bucket maintenance")
        time.sleep(1.0)  # visible + 1 s: no claim may start from here on
        held = [_enqueue(benv, job_spec()) for _ in range(3)]
        worker.wait_log(r"queue paused since .*: bucket maintenance")
        time.sleep(3.0)
        assert [benv.settled(j) for j in held] == [None, None, None]
        assert not any(benv.results.glob(f"{held[0]}.*.start"))
        with pytest.raises(DuplicateJob):
            benv.q.enqueue(b"k", unique="nightly")
            benv.q.enqueue(b"k", unique="nightly")
        os.environ["STEADQ_DOORBELL_DIR"] = str(benv.bells)
        try:
            assert benv.q.resume() is not None
        finally:
            del os.environ["STEADQ_DOORBELL_DIR"]
        for j in held:
            wait_for(lambda j=j: benv.settled(j) == "receipt", DEADLINE, "a held job's receipt after resume")
        worker.wait_log(r"queue resumed; claiming again")
    finally:
        worker.stop()


def test_cli_put_unique_on_a_bucket_refuses_the_second_with_the_first_id(benv: BucketEnv, tmp_path: Path) -> None:  # noqa: F811
    env = aws_env(tmp_path, **benv.seaweed.environment())

    def put() -> subprocess.CompletedProcess[str]:
        return run(env, "put", benv.url, "--unique", "file-a", stdin=b"x")

    one, two = put(), put()
    assert one.returncode == 0, one
    jid = one.stdout.split("job_id: ")[1].split()[0]
    assert two.returncode == 1 and f"job_id: {jid}" in two.stdout, two
    assert run(env, "pause", benv.url, "--reason", "r").returncode == 0
    assert "paused: yes" in run(env, "stats", benv.url).stdout
    assert run(env, "resume", benv.url).returncode == 0
