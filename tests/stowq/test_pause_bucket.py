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
import sys
import time
from pathlib import Path

import pytest

from steadqd.backend import init_queue
from steadqd.errors import DuplicateJob
from steadqd.queue_control import unique_job_id
from tests.daemon.conftest import job_spec, wait_for
from tests.stowq.conftest import LIVE_BUCKET
from tests.stowq.seaweed import Seaweed
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


# A producer process: opens the queue, says "ready", waits for the parent's "go" on stdin (the barrier),
# then enqueues with the unique key and says "made <id>" or "refused <id>".
_PRODUCER = """
import sys
from steadqd.backend import open_queue
from steadqd.errors import DuplicateJob
url, key, body = sys.argv[1:4]
q = open_queue(url, certify_store=False)
print("ready", flush=True)
assert sys.stdin.readline() == "go\\n"
try:
    print("made", q.enqueue(body.encode(), unique=key), flush=True)
except DuplicateJob as e:
    print("refused", e.job_id, flush=True)
q.close()
"""


def test_two_producer_processes_of_one_key_on_a_live_bucket_make_one_job(
    seaweed: Seaweed, live_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32 #5: two processes, released together through a pipe, enqueue one key with different
    payloads; the job record's put-if-absent admits one, the other is refused naming the same id.
    Five rounds, each a new key; the bucket then holds exactly one job record per key."""
    seaweed.store(LIVE_BUCKET).close()
    env = aws_env(tmp_path, **seaweed.environment())
    for name, value in seaweed.environment().items():
        monkeypatch.setenv(name, value)
    url = f"s3://{LIVE_BUCKET}/{live_prefix}race"
    q = init_queue(url, shards=4, certify_store=False)
    made: list[str] = []
    try:
        for round_ in range(5):
            key = f"nightly-{round_}"
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", _PRODUCER, url, key, f"from producer {n}"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                )
                for n in range(2)
            ]
            try:
                for p in procs:
                    assert p.stdout is not None and p.stdout.readline() == "ready\n", p.communicate(timeout=60)
                for p in procs:  # both are blocked on their pipe: one write each releases them together
                    assert p.stdin is not None
                    p.stdin.write("go\n")
                    p.stdin.flush()
                outs = [p.communicate(timeout=120) for p in procs]
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
            assert [p.returncode for p in procs] == [0, 0], outs
            said = sorted(tuple(out.split()) for out, _ in outs)
            jid = unique_job_id(q.queue_id, key)
            assert said == [("made", jid), ("refused", jid)], outs
            made.append(jid)
        store = seaweed.store(LIVE_BUCKET)
        try:
            page = store.list_page(f"{live_prefix}race/jobs/")
        finally:
            store.close()
        listed = sorted(m.key.rsplit("/", 1)[-1] for m in page.items)
        assert listed == sorted(made), listed
        leased = []
        while (lease := q.lease(duration=30.0)) is not None:
            leased.append(lease.job_id)
        assert sorted(leased) == sorted(made)  # one deliverable job per key, no more
    finally:
        q.close()
