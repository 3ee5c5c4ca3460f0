"""The S3 store's lean request path: what it took off botocore's per-request work must not change a request.

``S3Store`` switches off parameter validation, drops botocore handlers that
do nothing for its requests and keeps the resolved endpoint per operation
and bucket (benchmarks/s3_store.py measures the saving). These tests catch
every request at botocore's ``before-send`` (nothing reaches a network) and
check that each one still goes to the right URL, with its conditions and
its checksum, whatever key, prefix or bucket came before it.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from typing import Any

import botocore.handlers
import pytest
from botocore.awsrequest import AWSResponse

from steadqd.s3.store.s3 import _IDLE_HANDLERS, S3Settings, S3Store

ENDPOINT = "http://127.0.0.1:9"  # never contacted: every request is answered at before-send
_LIST = (
    b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>b</Name><IsTruncated>false</IsTruncated>'
    b"</ListBucketResult>"
)


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body

    def read(self, amt: int | None = None) -> bytes:
        body, self._body = self._body, b""
        return body

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "steadqtest")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "steadqtest-not-a-secret")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)


def _header(request: Any, name: str) -> str:
    value = request.headers[name]
    return value.decode() if isinstance(value, bytes) else str(value)


def _store(bucket: str, sent: list[Any]) -> S3Store:
    store = S3Store(S3Settings(bucket=bucket, endpoint_url=ENDPOINT, region="us-east-1", transport="botocore"))

    def answer(request: Any, **_: Any) -> AWSResponse:
        sent.append(request)
        headers = {"ETag": '"e1"', "Last-Modified": "Tue, 01 Dec 2026 14:00:00 GMT", "Content-Length": "3"}
        body = _LIST if "list-type=2" in request.url else b"abc"
        return AWSResponse(request.url, 200, headers, _Raw(body if request.method == "GET" else b""))

    store._client.meta.events.register_first("before-send.s3", answer)
    return store


def test_each_request_goes_to_its_own_key_after_the_endpoint_is_kept() -> None:
    sent: list[Any] = []
    store = _store("bucket-one", sent)
    store.head("jobs/0001/aa")
    store.head("claims/0002/bb/00000001")
    store.get("receipts/0003/cc")
    store.put_if_absent("leases/0000000000000001/0004/dd.00000001", b"")
    store.put_if_match("meta/watermark", b"wm", "e0")
    store.list_page("claims/0005/ee/", start_after="claims/0005/ee/00000001", limit=7)
    store.delete("meta/clock/ff")
    assert [(r.method, r.url) for r in sent] == [
        ("HEAD", f"{ENDPOINT}/bucket-one/jobs/0001/aa"),
        ("HEAD", f"{ENDPOINT}/bucket-one/claims/0002/bb/00000001"),
        ("GET", f"{ENDPOINT}/bucket-one/receipts/0003/cc"),
        ("PUT", f"{ENDPOINT}/bucket-one/leases/0000000000000001/0004/dd.00000001"),
        ("PUT", f"{ENDPOINT}/bucket-one/meta/watermark"),
        (
            "GET",
            f"{ENDPOINT}/bucket-one?list-type=2&prefix=claims%2F0005%2Fee%2F&max-keys=7"
            "&start-after=claims%2F0005%2Fee%2F00000001&encoding-type=url",
        ),
        ("DELETE", f"{ENDPOINT}/bucket-one/meta/clock/ff"),
    ]
    create, cas = sent[3], sent[4]
    assert _header(create, "If-None-Match") == "*" and "If-Match" not in create.headers
    assert _header(cas, "If-Match") == '"e0"'
    assert _header(create, "x-amz-checksum-sha256") == base64.b64encode(hashlib.sha256(b"").digest()).decode()
    assert "Expect" not in create.headers
    assert all("Authorization" in r.headers for r in sent)


def test_two_stores_keep_their_own_buckets() -> None:
    sent: list[Any] = []
    one, two = _store("bucket-one", sent), _store("bucket-two", sent)
    one.head("k")
    two.head("k")
    one.head("k")
    assert [r.url for r in sent] == [f"{ENDPOINT}/bucket-one/k", f"{ENDPOINT}/bucket-two/k", f"{ENDPOINT}/bucket-one/k"]


def test_the_idle_handlers_are_botocores_and_are_gone() -> None:
    """A botocore that renamed one would leave it registered: the set must still name real handlers."""
    builtin = {getattr(h, "__name__", "") for _e, h, *_ in botocore.handlers.BUILTIN_HANDLERS}
    assert _IDLE_HANDLERS <= builtin
    store = _store("bucket-one", [])
    emitter = store._client.meta.events
    for event in (
        "before-parameter-build.s3.PutObject",
        "before-parameter-build.s3.HeadObject",
        "before-call.s3.GetObject",
    ):
        left = {getattr(h, "__name__", "") for h in emitter._emitter._handlers.prefix_search(event)}
        assert not left & _IDLE_HANDLERS, f"{event}: {left & _IDLE_HANDLERS}"


def test_amazon_s3_keeps_botocores_endpoint_resolution() -> None:
    """botocore remembers a bucket's region redirect at endpoint resolution: on Amazon S3 it is not skipped."""
    aws = S3Store(S3Settings(bucket="bucket-one", region="eu-west-1", transport="botocore"))
    local = S3Store(S3Settings(bucket="bucket-one", endpoint_url=ENDPOINT, region="us-east-1", transport="botocore"))
    assert hasattr(aws._client._ruleset_resolver.construct_endpoint, "__self__")  # botocore's own method
    assert not hasattr(local._client._ruleset_resolver.construct_endpoint, "__self__")  # kept per operation


@pytest.mark.parametrize("operation", ["HeadObject", "GetObject", "PutObject", "DeleteObject"])
def test_the_header_parser_reads_what_botocores_reads(operation: str) -> None:
    """Same parsed answer as botocore's parser, for mixed-case headers, user metadata and every type."""
    from botocore.awsrequest import HeadersDict
    from botocore.parsers import RestXMLParser

    from steadqd.s3.store.base import parse_last_modified
    from steadqd.s3.store.s3 import _HeaderParser

    store = _store("bucket-one", [])
    shape = store._client.meta.service_model.operation_model(operation).output_shape
    headers = {
        "etag": '"e1"',
        "Last-Modified": "Tue, 01 Dec 2026 14:00:00 GMT",
        "CONTENT-LENGTH": "3",
        "Content-Range": "bytes 0-2/9",
        "x-amz-meta-Owner": "steadq",
        "x-amz-checksum-sha256": "abc=",
        "x-amz-version-id": "",
        "Content-Type": "application/octet-stream",
    }

    def parse(parser: Any) -> Any:
        body: Any = _Raw(b"abc") if operation == "GetObject" else b""
        response = {"headers": HeadersDict(headers), "status_code": 200, "body": body}
        return parser.parse(response, shape)

    ours, theirs = (
        parse(_HeaderParser(timestamp_parser=parse_last_modified)),
        parse(RestXMLParser(timestamp_parser=parse_last_modified)),
    )
    for answer in (ours, theirs):
        answer.pop("Body", None)
    assert ours == theirs and ours
