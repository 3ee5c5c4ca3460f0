"""``steadq`` on a bucket queue: the console script against the live SeaweedFS, configured the AWS way.

The commands get the endpoint and the key only from ``AWS_*`` variables, with
the user's own AWS files hidden, so a test proves the queue URL plus the
standard settings are enough, and that nothing else is read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from steadqd.backend import init_queue, open_queue
from steadqd.errors import InvalidInput
from steadqd.s3 import keys
from steadqd.s3.open import parse_url
from tests.stowq.conftest import LIVE_BUCKET
from tests.stowq.seaweed import Seaweed

STEADQ = str(Path(sys.executable).parent / "steadq")
LEASE = "2"  # SeaweedFS keeps whole seconds: its shortest lease is G + skew guard = 2 s


def aws_env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    """This process's environment without any AWS setting, the user's AWS files hidden, then ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_CONFIG_FILE"] = str(tmp_path / "no-aws-config")
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "no-aws-credentials")
    env.update(overrides)
    return env


def run(env: dict[str, str], *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [STEADQ, *args], input=stdin.decode(), env=env, capture_output=True, text=True, timeout=120, check=False
    )
    return done


def ok(env: dict[str, str], *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    done = run(env, *args, stdin=stdin)
    assert done.returncode == 0, f"steadq {' '.join(args)}: exit {done.returncode}\n{done.stderr}"
    return done


def field(stdout: str, name: str) -> str:
    for line in stdout.splitlines():
        if line.startswith(f"{name}: "):
            return line.split(": ", 1)[1]
    raise AssertionError(f"no {name!r} in {stdout!r}")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("s3://", "names no bucket"),
        ("s3:///prefix", "names no bucket"),
        ("s3://key:secret@bucket/q", "never in the URL"),
        ("s3://bucket/a//b", "empty segment"),
        ("s3://bucket/a/../b", "'..' segment"),
        ("s3://bucket/q?region=x", "no '?'"),
        ("s3://Bad_Bucket/q", "not a valid S3 bucket name"),
    ],
)
def test_a_malformed_url_is_refused_naming_what_is_wrong(url: str, says: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=says):
        open_queue(url)
    done = run(aws_env(tmp_path, AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s"), "lease", url)
    assert done.returncode == 1 and says.split("'")[0].strip() in done.stderr


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"shared": True}, "shared is an option of filesystem queues"),
        ({"shards": 6}, "needs a power of two"),
        ({"terminal_width_ns": 0}, "give a positive number"),
        ({"store_profile": "minio"}, "store profile 'minio' is not a known store profile"),
    ],
)
def test_init_options_a_bucket_cannot_honour_are_refused(options: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidInput, match=says):
        init_queue("s3://render/farm", **options)


def test_the_url_parses_to_bucket_and_prefix() -> None:
    assert parse_url("s3://render/farm") == parse_url("s3://render/farm/")
    url = parse_url("s3://render/farm/night")
    assert (url.bucket, url.prefix, str(url)) == ("render", "farm/night/", "s3://render/farm/night")
    assert parse_url("s3://render").prefix == ""


def test_init_put_lease_ack_retry_bury_on_a_bucket(seaweed: Seaweed, live_prefix: str, tmp_path: Path) -> None:
    seaweed.store(LIVE_BUCKET).close()  # the bucket exists; the queue's prefix is new
    env = aws_env(tmp_path, **seaweed.environment())
    url = f"s3://{LIVE_BUCKET}/{live_prefix.rstrip('/')}"

    queue_id = ok(env, "init", "--parents", url, "--shards", "4").stdout.strip()
    assert len(queue_id) == 32
    again = run(env, "init", "--parents", url, "--shards", "8")
    assert again.returncode == 1 and "already holds a queue" in again.stderr

    put = ok(env, "put", url, "-", stdin=b"first job")
    job = field(put.stdout, "job_id")
    shard = keys.shard_of(bytes.fromhex(queue_id), bytes.fromhex(job), 4)
    assert field(put.stdout, "path") == f"{url}/{keys.job_key(shard, bytes.fromhex(job))}"

    handle = tmp_path / "h.json"
    leased = ok(env, "lease", url, "--handle-file", str(handle), "--duration-seconds", LEASE)
    assert field(leased.stdout, "job_id") == job
    assert field(leased.stdout, "generation") == "1" and field(leased.stdout, "attempt") == "1/3"
    assert json.loads(handle.read_text())["queue_id"] == queue_id
    assert "acked" in ok(env, "ack", url, "--handle-file", str(handle)).stderr
    assert "already acked" in ok(env, "ack", url, "--handle-file", str(handle)).stderr

    second = field(ok(env, "put", url, "-", stdin=b"second").stdout, "job_id")
    ok(env, "lease", url, "--handle-file", str(handle), "--duration-seconds", LEASE)
    assert "retried" in ok(env, "retry", url, "--handle-file", str(handle), "--after-seconds", "60").stderr
    held = run(env, "lease", url, "--handle-file", str(tmp_path / "none.json"), "--duration-seconds", LEASE)
    assert held.returncode == 1 and "no jobs available" in held.stderr  # backing off for 60 s

    third = field(ok(env, "put", url, "-", stdin=b"third").stdout, "job_id")
    taken = ok(env, "lease", url, "--handle-file", str(handle), "--duration-seconds", LEASE)
    assert field(taken.stdout, "job_id") == third
    assert "buried" in ok(env, "bury", url, "--handle-file", str(handle), "--reason", "1").stderr
    lost = run(env, "ack", url, "--handle-file", str(handle))
    assert lost.returncode == 1 and "lease lost" in lost.stderr  # buried: no ack over it

    store = seaweed.store(LIVE_BUCKET, create=False)
    try:
        listed = {m.key[len(live_prefix) :].split("/")[0] for m in store.list_page(live_prefix).items}
        receipts = [m.key for m in store.list_page(live_prefix + "receipts/").items]
        dead = [m.key for m in store.list_page(live_prefix + "dead/").items]
    finally:
        store.close()
    assert {"meta", "jobs", "claims", "receipts", "dead", "fails"} <= listed
    assert [k.rsplit("/", 1)[1] for k in receipts] == [job]
    assert [k.rsplit("/", 1)[1] for k in dead] == [third]
    assert second not in receipts + dead


def create(env: dict[str, str], url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new queue at ``url``, made by the library without certifying (the CLI's init test certifies)."""
    for name, value in env.items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    q = init_queue(url, shards=1, certify_store=False)
    try:
        return q.queue_id
    finally:
        q.close()


def live_queue(
    seaweed: Seaweed, live_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, str], str]:
    """(environment, URL) of a new queue in the live bucket, which is made if this is the session's first test."""
    seaweed.store(LIVE_BUCKET).close()
    env = aws_env(tmp_path, **seaweed.environment())
    url = f"s3://{LIVE_BUCKET}/{live_prefix}q"
    create(env, url, monkeypatch)
    return env, url


def test_a_handle_of_another_queue_is_refused(
    seaweed: Seaweed, live_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seaweed.store(LIVE_BUCKET).close()
    env = aws_env(tmp_path, **seaweed.environment())
    one, two = (f"s3://{LIVE_BUCKET}/{live_prefix}{name}" for name in ("one", "two"))
    create(env, one, monkeypatch)
    other = create(env, two, monkeypatch)
    ok(env, "put", two, "-", stdin=b"x")
    handle = tmp_path / "h.json"
    ok(env, "lease", two, "--handle-file", str(handle), "--duration-seconds", LEASE)
    done = run(env, "ack", one, "--handle-file", str(handle))
    assert done.returncode == 1 and f"belongs to queue {other}" in done.stderr
    forged = json.loads(handle.read_text()) | {"worker_token": "00" * 16}
    handle.write_text(json.dumps(forged))
    done = run(env, "ack", two, "--handle-file", str(handle))
    assert done.returncode == 1 and "worker_token is not the one" in done.stderr


def test_opening_fails_with_the_cause_and_the_fix(seaweed: Seaweed, live_prefix: str, tmp_path: Path) -> None:
    good = seaweed.environment()
    url = f"s3://{LIVE_BUCKET}/{live_prefix}q"

    missing = run(aws_env(tmp_path, **good), "lease", f"s3://steadq-no-such-bucket/{live_prefix}q")
    assert missing.returncode == 1
    assert "bucket steadq-no-such-bucket does not exist" in missing.stderr and "aws s3 mb" in missing.stderr

    wrong = run(aws_env(tmp_path, **(good | {"AWS_SECRET_ACCESS_KEY": "wrong"})), "lease", url)
    assert wrong.returncode == 5 and "refused the credentials" in wrong.stderr
    assert "AWS_SECRET_ACCESS_KEY" in wrong.stderr

    nobody = run(aws_env(tmp_path, **(good | {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"})), "lease", url)
    assert nobody.returncode == 6 and "cannot reach the object store at http://127.0.0.1:9" in nobody.stderr

    keyless = {k: v for k, v in good.items() if not k.startswith("AWS_ACCESS") and not k.startswith("AWS_SECRET")}
    none = run(aws_env(tmp_path, **keyless), "lease", url)
    assert none.returncode == 1 and "no AWS credentials found" in none.stderr

    seaweed.store(LIVE_BUCKET).close()
    absent = run(aws_env(tmp_path, **good), "lease", url)
    assert absent.returncode == 1 and "is not a queue" in absent.stderr and "init" in absent.stderr


def test_work_runs_a_command_on_a_bucket_job(
    seaweed: Seaweed, live_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, url = live_queue(seaweed, live_prefix, tmp_path, monkeypatch)
    job = field(ok(env, "put", url, "-", stdin=b"payload for the child").stdout, "job_id")
    out = tmp_path / "child-read"
    ok(env, "work", url, "--once", "--lease", "4s", "--", "sh", "-c", f'cat > {out}; echo "$STEADQ_JOB_ID" >> {out}')
    assert out.read_text() == f"payload for the child{job}\n"
    q = open_queue(url)
    try:
        assert q.lease(duration=2.0) is None  # acked
    finally:
        q.close()
