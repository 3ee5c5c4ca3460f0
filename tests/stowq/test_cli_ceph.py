"""``steadq`` on a Ceph RGW bucket, configured the AWS way: a short run of what the SeaweedFS CLI suite covers.

Without ``STEADQ_STORE_PROFILE`` the CLI opens a bucket with the generic S3
profile, so ``steadq init`` refuses RGW naming the primitive the generic
profile gets wrong and the setting that fixes it; with
``STEADQ_STORE_PROFILE=ceph-rgw`` every command speaks RGW's dialect.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.stowq.ceph import Ceph
from tests.stowq.conftest import LIVE_BUCKET
from tests.stowq.test_cli_bucket import LEASE, aws_env, field, ok, run

pytestmark = pytest.mark.ceph


def test_init_refuses_rgw_under_the_generic_profile_naming_the_primitive(
    ceph: Ceph, live_prefix: str, tmp_path: Path
) -> None:
    ceph.store(LIVE_BUCKET).close()
    env = aws_env(tmp_path, **ceph.environment())
    refused = run(env, "init", "--parents", f"s3://{LIVE_BUCKET}/{live_prefix.rstrip('/')}")
    assert refused.returncode == 64, refused.stderr
    assert "cannot hold a StowQ/1 queue" in refused.stderr
    assert "P2 compare-and-swap" in refused.stderr and "P7 checksum" in refused.stderr  # quoted If-Match; no SHA-256
    assert "STEADQ_STORE_PROFILE" in refused.stderr and "ceph-rgw" in refused.stderr


def test_init_put_lease_ack_bury_on_an_rgw_queue(ceph: Ceph, live_prefix: str, tmp_path: Path) -> None:
    ceph.store(LIVE_BUCKET).close()
    env = aws_env(tmp_path, **ceph.environment(), STEADQ_STORE_PROFILE="ceph-rgw")
    url = f"s3://{LIVE_BUCKET}/{live_prefix.rstrip('/')}"
    ok(env, "init", "--shards", "2", url)  # certifies RGW under its own profile

    job = field(ok(env, "put", url, "-", stdin=b"first job").stdout, "job_id")
    handle = tmp_path / "h.json"
    leased = ok(env, "lease", url, "--handle-file", str(handle), "--duration-seconds", LEASE)
    assert field(leased.stdout, "job_id") == job and field(leased.stdout, "generation") == "1"
    assert "acked" in ok(env, "ack", url, "--handle-file", str(handle)).stderr
    assert "already acked" in ok(env, "ack", url, "--handle-file", str(handle)).stderr

    third = field(ok(env, "put", url, "-", stdin=b"third").stdout, "job_id")
    taken = ok(env, "lease", url, "--handle-file", str(handle), "--duration-seconds", LEASE)
    assert field(taken.stdout, "job_id") == third
    assert "buried" in ok(env, "bury", url, "--handle-file", str(handle), "--reason", "1").stderr

    store = ceph.store(LIVE_BUCKET, create=False)
    try:
        receipts = [m.key.rsplit("/", 1)[1] for m in store.list_page(live_prefix + "receipts/").items]
        dead = [m.key.rsplit("/", 1)[1] for m in store.list_page(live_prefix + "dead/").items]
    finally:
        store.close()
    assert receipts == [job] and dead == [third]


def test_init_names_a_missing_bucket_or_refused_credentials_as_open_does(
    ceph: Ceph, live_prefix: str, tmp_path: Path
) -> None:
    """Certification's probes fail first on such a store; the refusal keeps their cause, so the opener can name it."""
    good = ceph.environment()
    missing = run(aws_env(tmp_path, **good), "init", "--parents", f"s3://steadq-no-such-bucket/{live_prefix}q")
    assert missing.returncode == 1, missing.stderr
    assert "bucket steadq-no-such-bucket does not exist" in missing.stderr and "aws s3 mb" in missing.stderr
    assert "cannot hold a StowQ/1 queue" not in missing.stderr

    ceph.store(LIVE_BUCKET).close()
    wrong = run(
        aws_env(tmp_path, **(good | {"AWS_SECRET_ACCESS_KEY": "wrong"})),
        "init",
        "--parents",
        f"s3://{LIVE_BUCKET}/{live_prefix}q",
    )
    assert wrong.returncode == 5 and "refused the credentials" in wrong.stderr, wrong.stderr
