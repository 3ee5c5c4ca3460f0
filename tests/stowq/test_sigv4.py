"""The direct transport's SigV4 signer signs exactly what botocore's S3SigV4Auth signs.

Why a differential test: the store checks a signature byte for byte, and
botocore's signer is the definition our requests were signed by before; so
generated requests (keys that need escaping, queries, conditional headers,
session tokens, bodies, regions) are signed by both at one fixed time and
every header compared, the Authorization included.
"""

from __future__ import annotations

import datetime
import urllib.parse
from unittest import mock

import botocore.auth
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import example, given, settings
from hypothesis import strategies as st

from steadqd.s3.store.sigv4 import Signer, signing_key

_WHEN = datetime.datetime(2026, 12, 6, 21, 30, 5, tzinfo=datetime.UTC)
_STAMP = "20261206T213005Z"


def _botocore(
    credentials: Credentials, method: str, region: str, host: str, target: str, headers: dict[str, str], body: bytes
) -> dict[str, str]:
    request = AWSRequest(method=method, url=f"http://{host}{target}", headers=dict(headers), data=body)
    with mock.patch.object(botocore.auth, "get_current_datetime", return_value=_WHEN):
        S3SigV4Auth(credentials.get_frozen_credentials(), "s3", region).add_auth(request)
    return dict(request.headers.items())


def _target(bucket: str, key: str | None, query: list[tuple[str, str]]) -> str:
    """As the direct client builds it (path-style; the key escaped but for '/' and '~')."""
    path = f"/{bucket}/" + ("" if key is None else urllib.parse.quote(key, safe="/~"))
    if query:
        path += "?" + "&".join(
            f"{urllib.parse.quote(n, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}" for n, v in query
        )
    return path


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(
    method=st.sampled_from(["GET", "HEAD", "PUT", "DELETE"]),
    region=st.sampled_from(["us-east-1", "eu-west-3", "ap-southeast-2"]),
    key=st.none() | _TEXT,
    query=st.lists(st.tuples(st.sampled_from(["prefix", "start-after", "max-keys", "list-type"]), _TEXT), max_size=4),
    conditions=st.dictionaries(
        st.sampled_from(["If-None-Match", "If-Match", "Range", "x-amz-checksum-sha256", "Content-Type"]),
        st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=30),
    ),
    token=st.none() | st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=60),
    body=st.binary(max_size=64),
)
@example(  # SigV4 trims a header value and folds its runs of spaces into one
    method="PUT",
    region="us-east-1",
    key="a b/~c",
    query=[],
    conditions={"Content-Type": " text/plain;  charset=x ", "If-Match": '"e1"'},
    token=None,
    body=b"x",
)
def test_every_header_is_the_one_botocore_signs(
    method: str,
    region: str,
    key: str | None,
    query: list[tuple[str, str]],
    conditions: dict[str, str],
    token: str | None,
    body: bytes,
) -> None:
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    host = "127.0.0.1:8333"
    target = _target("bucket-1", key, query)
    headers = {**conditions, "Host": host}
    ours = Signer().sign(credentials.get_frozen_credentials(), method, region, target, headers, body, amz_date=_STAMP)
    assert ours == _botocore(credentials, method, region, host, target, headers, body)


def test_the_derived_key_is_cached_per_secret_day_and_region() -> None:
    """A key made for one day, region or secret is never used for another (a rotated secret signs with the new one)."""
    signer = Signer()
    old = Credentials("AK", "old-secret").get_frozen_credentials()
    new = Credentials("AK", "new-secret").get_frozen_credentials()
    host, target = "h:1", "/b/k"
    for credentials, region, stamp in [
        (old, "us-east-1", _STAMP),
        (old, "us-east-1", "20261207T000001Z"),
        (old, "eu-west-3", "20261207T000001Z"),
        (new, "eu-west-3", "20261207T000002Z"),
        (old, "eu-west-3", "20261207T000003Z"),
    ]:
        ours = signer.sign(credentials, "GET", region, target, {"Host": host}, b"", amz_date=stamp)
        when = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
        request = AWSRequest(method="GET", url=f"http://{host}{target}", headers={"Host": host})
        with mock.patch.object(botocore.auth, "get_current_datetime", return_value=when):
            S3SigV4Auth(credentials, "s3", region).add_auth(request)
        assert ours["Authorization"] == request.headers["Authorization"]
        assert signer._key == (
            credentials.secret_key,
            stamp[:8],
            region,
            signing_key(credentials.secret_key, stamp[:8], region),
        )


def test_the_timestamp_is_the_current_second() -> None:
    signed = Signer().sign(
        Credentials("AK", "SK").get_frozen_credentials(), "GET", "us-east-1", "/b/", {"Host": "h"}, b""
    )
    sent = datetime.datetime.strptime(signed["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
    assert abs((datetime.datetime.now(datetime.UTC) - sent).total_seconds()) < 5
