"""The S3 client and the certification, live against a real SeaweedFS (``weed server -s3`` on 127.0.0.1).

The first tests pin, with a plain botocore client, what SeaweedFS itself does
with each header the protocol relies on (docs/stowq.md's table quotes them),
so an upgrade that changes one fails here with the header named. The rest run
:class:`S3Store` and :func:`certify` against it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from steadqd.demo import seaweed as launcher
from steadqd.errors import AlreadyExists, ErrorKind, NotCommitted, NotFound, PreconditionFailed
from steadqd.s3.certify import certify
from steadqd.s3.store.base import SEAWEEDFS
from steadqd.s3.store.s3 import TRANSPORTS, S3Settings, S3Store
from tests.stowq import seaweed as seaweed_server
from tests.stowq.conftest import LIVE_BUCKET
from tests.stowq.live_s3 import Gateway, raw_bucket, status
from tests.stowq.seaweed import Seaweed


@pytest.fixture(scope="module")
def raw(seaweed: Seaweed) -> Iterator[Any]:
    with raw_bucket(seaweed, LIVE_BUCKET) as client:
        yield client


@pytest.fixture(scope="module")
def store(seaweed: Seaweed) -> Iterator[S3Store]:
    s = seaweed.store(LIVE_BUCKET)
    yield s
    s.close()


def test_seaweedfs_honours_if_none_match_star_on_put(raw: Any, live_prefix: str) -> None:
    key = live_prefix + "p1"
    assert status(lambda: raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"a", IfNoneMatch="*")) == 200
    assert status(lambda: raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"b", IfNoneMatch="*")) == 412


def test_seaweedfs_honours_if_match_on_put_and_delete_quoted_or_bare(raw: Any, live_prefix: str) -> None:
    key = live_prefix + "p2"
    etag = raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"v1")["ETag"]
    assert etag.startswith('"')
    assert status(lambda: raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"x", IfMatch='"0000"')) == 412
    assert status(lambda: raw.put_object(Bucket=LIVE_BUCKET, Key=key + "-absent", Body=b"x", IfMatch=etag)) == 412
    assert status(lambda: raw.delete_object(Bucket=LIVE_BUCKET, Key=key, IfMatch='"0000"')) == 412
    assert raw.get_object(Bucket=LIVE_BUCKET, Key=key)["Body"].read() == b"v1"  # the stale DELETE did nothing
    assert status(lambda: raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"v2", IfMatch=etag.strip('"'))) == 200


def test_seaweedfs_verifies_x_amz_checksum_sha256(raw: Any, live_prefix: str) -> None:
    key = live_prefix + "p7"
    wrong = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    right = base64.b64encode(hashlib.sha256(b"body").digest()).decode()
    assert status(lambda: raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"body", ChecksumSHA256=wrong)) == 400
    assert status(lambda: raw.head_object(Bucket=LIVE_BUCKET, Key=key)) == 404
    assert status(lambda: raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"body", ChecksumSHA256=right)) == 200


def test_seaweedfs_store_times_are_whole_seconds_on_head_and_list_and_listing_is_immediate(
    raw: Any, live_prefix: str
) -> None:
    key = live_prefix + "p6"
    raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"")
    listed = raw.list_objects_v2(Bucket=LIVE_BUCKET, Prefix=live_prefix)["Contents"]
    assert [o["Key"] for o in listed] == [key]  # list-after-write, at once
    head = raw.head_object(Bucket=LIVE_BUCKET, Key=key)["LastModified"]
    assert head.microsecond == 0 and listed[0]["LastModified"].microsecond == 0 and head == listed[0]["LastModified"]


def test_s3_store_primitives_on_seaweedfs(store: S3Store, live_prefix: str) -> None:
    key = live_prefix + "claims/0000/" + "a" * 32 + "/00000001"
    done = store.put_if_absent(key, b"claim")
    assert not done.etag.startswith('"') and done.etag == hashlib.md5(b"claim").hexdigest()
    with pytest.raises(AlreadyExists):
        store.put_if_absent(key, b"other")
    meta = store.head(key)
    assert meta.etag == done.etag and meta.size == 5 and meta.store_time_ns % SEAWEEDFS.granularity_ns == 0
    assert abs(meta.store_time_ns - time.time_ns()) < 600 * 10**9  # a store time, not zero or a default
    with pytest.raises(PreconditionFailed):
        store.put_if_match(key, b"x", "0" * 32)
    replaced = store.put_if_match(key, b"claim2", done.etag)
    assert store.get(key).body == b"claim2"
    assert store.get_if_none_match(key, replaced.etag) is None
    assert store.get_if_none_match(key, done.etag) is not None
    assert store.get(key, (1, 4)).body == b"lai" and store.get(key, (1, 4)).meta.size == 6
    for bad in ((0, 7), (9, 10), (3, 3)):
        with pytest.raises(NotFound):
            store.get(key, bad)
    store.delete(key)
    store.delete(key)
    with pytest.raises(NotFound):
        store.get(key)


def test_s3_store_pages_a_listing_with_exclusive_start_after(store: S3Store, live_prefix: str) -> None:
    keys = [f"{live_prefix}jobs/0000/{i:032x}" for i in range(7)]
    for key in keys:
        store.put_if_absent(key, b"")
    pages = []
    after = None
    while True:
        page = store.list_page(live_prefix, start_after=after, limit=3)
        pages.append([m.key for m in page.items])
        if page.next_start_after is None:
            break
        after = page.next_start_after
    assert pages == [keys[0:3], keys[3:6], keys[6:7]]
    assert [m.key for m in store.list_page(live_prefix, start_after=keys[2]).items] == keys[3:]


def test_a_missing_bucket_and_a_wrong_key_are_named(seaweed: Gateway, tmp_path: Any) -> None:
    missing = seaweed.store("steadq-no-such-bucket", create=False)
    with pytest.raises(NotFound, match="bucket steadq-no-such-bucket does not exist"):
        missing.list_page("")
    with pytest.raises(NotFound, match="bucket steadq-no-such-bucket"):
        missing.put_if_absent("k", b"")
    wrong = tmp_path / "wrong-credentials"
    wrong.write_text("[default]\naws_access_key_id = nobody\naws_secret_access_key = nothing\n")
    wrong.chmod(0o600)
    intruder = S3Store(
        S3Settings(LIVE_BUCKET, endpoint_url=seaweed.endpoint, credentials_file=str(wrong)), profile=SEAWEEDFS
    )
    with pytest.raises(NotCommitted) as info:
        intruder.put_if_absent("k", b"")
    assert info.value.kind is ErrorKind.PERMISSION_DENIED


def test_seaweedfs_is_certified(seaweed: Seaweed) -> None:
    """The conformance suite, live; a second client reads what the first writes."""
    store = seaweed.store("steadq-certify")
    peer = seaweed.store("steadq-certify", create=False)
    result = certify(store, peer=peer)
    assert result.certified, result.report()
    slash = [c for c in result.checks if c.title == "byte order across '/'"]
    assert not slash[0].passed and not slash[0].required  # directory-tree order (docs/stowq.md)
    assert result.measured["P7 mode"] == "the store verifies SHA-256"
    assert store.list_page("").items == ()  # it cleaned up after itself


def test_the_store_benchmark_runs_end_to_end(seaweed: Seaweed) -> None:
    """benchmarks/s3_store.py on a tiny budget: every row measured, the table rendered (no speed asserted)."""
    from benchmarks.s3_store import markdown, measure

    result = measure(seaweed, ops=3, seconds=5.0)
    assert {"put_if_absent (create)", "put_if_absent (losing: 412)", "head", "list (100 keys)"} <= set(result["rows"])
    assert all(row["ops"] >= 1 for row in result["rows"].values())
    assert "| head |" in markdown(result)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_standard_aws_environment_alone_reaches_the_store(
    seaweed: Seaweed, store: S3Store, monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    """No endpoint, region or key in the settings: AWS_ENDPOINT_URL, AWS_REGION and the key variables suffice.

    Over both transports: the direct one finds them where botocore's client does."""
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    for name, value in seaweed.environment().items():
        monkeypatch.setenv(name, value)
    from_env = S3Store(S3Settings(LIVE_BUCKET, transport=transport), profile=SEAWEEDFS)
    assert from_env.location == f"s3://{LIVE_BUCKET} at {seaweed.endpoint}"
    from_env.list_page("", limit=1)
    from_env.close()


def test_a_stopped_server_leaves_no_grpc_socket_in_tmp(tmp_path: Path) -> None:
    """weed puts one socket per gRPC port in /tmp (no flag moves them) and never removes them: every
    server the suite or a demo started left three or four behind. The launcher's stop removes its own."""
    weed = launcher.weed_binary()
    assert weed is not None  # the session's seaweed fixture would have skipped the module otherwise
    with seaweed_server.running(tmp_path, weed) as server:
        sockets = launcher.grpc_sockets(server.server.ports)
        present = [p for p in sockets if os.path.exists(p)]
        assert present, f"none of {sockets} exists: weed's naming changed, and stop() would remove nothing"
        assert all(stat.S_ISSOCK(os.lstat(p).st_mode) for p in present)
    assert [p for p in sockets if os.path.lexists(p)] == []


def test_the_servers_local_sockets_live_in_its_own_directory_not_in_tmp(seaweed: Seaweed) -> None:
    """weed's default, /tmp/seaweedfs-<role>-<port>.sock, litters the machine's /tmp with every server and
    makes two gateways on one port in separate network namespaces fight over one path (CI: "bind: address
    already in use", a multihost gateway exited)."""
    for name in ("s3.sock", "filer.sock"):
        assert stat.S_ISSOCK(os.stat(seaweed.root / name).st_mode), name
    port = urlsplit(seaweed.endpoint).port
    assert not os.path.exists(f"/tmp/seaweedfs-s3-{port}.sock")


def test_the_servers_log_files_live_in_its_own_directory_not_in_tmp(seaweed: Seaweed) -> None:
    """weed's glog writes weed.INFO, weed.WARNING and their dated files to /tmp by default: every server the
    suite or the demo starts would leave them in the machine's /tmp. -logdir puts them beside its data."""
    assert list(seaweed.root.glob("weed.*INFO*")), sorted(p.name for p in seaweed.root.iterdir())
