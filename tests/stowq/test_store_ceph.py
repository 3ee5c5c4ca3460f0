"""The S3 client and the certification, live against Ceph RGW 16.2 (a single-node cluster, ``tests/stowq/ceph.py``).

The first tests pin, with a plain botocore client, what RGW itself does with
each header the protocol relies on; each quirk is a field of the CEPH_RGW
profile (docs/stowq.md, "Engines"), so an upgrade that changes one fails here
with the header named. The S3 client's own tests are the SeaweedFS suite's,
run unchanged against RGW; then :func:`certify`.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from steadqd.s3.certify import certify
from steadqd.s3.store.s3 import S3Store
from tests.stowq import test_store_seaweedfs as engine_neutral
from tests.stowq.ceph import Ceph
from tests.stowq.conftest import LIVE_BUCKET
from tests.stowq.live_s3 import raw_bucket, status

pytestmark = pytest.mark.ceph


@pytest.fixture(scope="module")
def raw(ceph: Ceph) -> Iterator[Any]:
    with raw_bucket(ceph, LIVE_BUCKET) as client:
        yield client


@pytest.fixture(scope="module")
def store(ceph: Ceph) -> Iterator[S3Store]:
    s = ceph.store(LIVE_BUCKET)
    yield s
    s.close()


def test_rgw_honours_if_none_match_star_on_put(raw: Any, live_prefix: str) -> None:
    engine_neutral.test_seaweedfs_honours_if_none_match_star_on_put(raw, live_prefix)


def test_rgw_if_match_wants_the_bare_etag_and_takes_any_value_that_starts_with_it(raw: Any, live_prefix: str) -> None:
    """CEPH_RGW.if_match_quoted=False and if_match_prefix=True: RGW strncmps the header over the ETag's length."""
    key = live_prefix + "p2"
    quoted = raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"v1")["ETag"]
    bare = quoted.strip('"')
    assert quoted.startswith('"') and len(bare) == 32
    assert status(lambda: raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"x", IfMatch=quoted)) == 412
    assert status(lambda: raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"x", IfMatch="0" * 32)) == 412
    assert status(lambda: raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"x", IfMatch=bare[:5])) == 412
    assert status(lambda: raw.put_object(Bucket=LIVE_BUCKET, Key=key + "-absent", Body=b"x", IfMatch=bare)) == 412
    assert status(lambda: raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"v1", IfMatch=bare + "0")) == 200
    assert status(lambda: raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"v2", IfMatch=bare)) == 200


def test_rgw_ignores_if_match_on_delete(raw: Any, live_prefix: str) -> None:
    """The protocol never conditions a delete (GC deletes verified-terminal graphs only), so nothing rests on it."""
    key = live_prefix + "del"
    raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"v1")
    assert status(lambda: raw.delete_object(Bucket=LIVE_BUCKET, Key=key, IfMatch="0" * 32)) == 204
    assert status(lambda: raw.head_object(Bucket=LIVE_BUCKET, Key=key)) == 404


def test_rgw_does_not_check_x_amz_checksum_sha256(raw: Any, live_prefix: str) -> None:
    """CEPH_RGW.verifies_checksum=False: P7 is met by read-back (every record carries its digest)."""
    key = live_prefix + "p7"
    wrong = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    assert status(lambda: raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"body", ChecksumSHA256=wrong)) == 200
    assert raw.get_object(Bucket=LIVE_BUCKET, Key=key)["Body"].read() == b"body"


def _cas_race(raw: Any, key: str, current: str, width: int = 8) -> list[int]:
    """The statuses of ``width`` CASes of ``key`` from version ``current``, released together."""
    barrier = threading.Barrier(width)
    statuses: list[int] = []

    def racer(i: int) -> None:
        barrier.wait()
        body = f"racer {i}".encode()
        statuses.append(status(lambda: raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=body, IfMatch=current)))

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(width)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def test_rgw_answers_some_losers_of_a_cas_race_with_500_and_never_lets_two_win(raw: Any, live_prefix: str) -> None:
    """CEPH_RGW.cas_race_unknown=True: a loser is 412, or 500 when its write was cancelled under it (ECANCELED)."""
    seen: collections.Counter[int] = collections.Counter()
    for r in range(5):
        key = f"{live_prefix}race/{r}"
        current = raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"start")["ETag"].strip('"')
        statuses = _cas_race(raw, key, current)
        assert statuses.count(200) == 1 and set(statuses) <= {200, 412, 500}, statuses
        assert raw.get_object(Bucket=LIVE_BUCKET, Key=key)["Body"].read().startswith(b"racer ")
        seen.update(statuses)
    assert seen[200] == 5


def test_rgw_store_times_are_whole_seconds_on_head_and_milliseconds_in_list(raw: Any, live_prefix: str) -> None:
    """Quantised to G = 1 s the two surfaces agree; LIST lists at once, and in byte order across '/'."""
    key = live_prefix + "p6"
    raw.put_object(Bucket=LIVE_BUCKET, Key=key, Body=b"")
    listed = raw.list_objects_v2(Bucket=LIVE_BUCKET, Prefix=live_prefix)["Contents"]
    assert [o["Key"] for o in listed] == [key]
    head = raw.head_object(Bucket=LIVE_BUCKET, Key=key)["LastModified"]
    assert head.microsecond == 0 and head == listed[0]["LastModified"].replace(microsecond=0)
    for name in ("x/a/b", "x/a-c", "x/a.d"):
        raw.put_object(Bucket=LIVE_BUCKET, Key=live_prefix + name, Body=b"")
    order = [o["Key"] for o in raw.list_objects_v2(Bucket=LIVE_BUCKET, Prefix=live_prefix + "x/")["Contents"]]
    assert order == sorted(order)


# The S3 client's tests, engine-neutral, against RGW.


def test_s3_store_primitives_on_rgw(store: S3Store, live_prefix: str) -> None:
    engine_neutral.test_s3_store_primitives_on_seaweedfs(store, live_prefix)


def test_s3_store_pages_a_listing_with_exclusive_start_after_on_rgw(store: S3Store, live_prefix: str) -> None:
    engine_neutral.test_s3_store_pages_a_listing_with_exclusive_start_after(store, live_prefix)


def test_a_missing_bucket_and_a_wrong_key_are_named_on_rgw(ceph: Ceph, tmp_path: Path) -> None:
    engine_neutral.test_a_missing_bucket_and_a_wrong_key_are_named(ceph, tmp_path)


def test_rgw_is_certified(ceph: Ceph) -> None:
    """The conformance suite, live, with the CEPH_RGW profile; a second client reads what the first writes."""
    store = ceph.store("steadq-certify")
    peer = ceph.store("steadq-certify", create=False)
    try:
        result = certify(store, peer=peer)
        assert result.certified, result.report()
        assert all(c.passed for c in result.checks), result.report()  # byte order holds across '/' too
        assert result.measured["P7 mode"] == "read-back (the store does not verify SHA-256)"
        assert store.list_page("").items == ()  # it cleaned up after itself
    finally:
        store.close()
        peer.close()
