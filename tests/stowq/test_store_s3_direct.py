"""The direct transport (``S3Settings(transport="direct")``, the default): urllib3's pools, SigV4 as botocore signs.

The scripted-server tests of tests/stowq/test_store_s3.py run over both
transports, and TLS, proxies, addressing and region redirects are in
test_store_s3_http.py; here are kept connections the server closed, the XML
it parses itself, and the live SeaweedFS tests of
tests/stowq/test_store_seaweedfs.py run again with it, certification included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import http.server
import io
import threading
import urllib.parse
from collections.abc import Iterator
from http.client import HTTPException
from pathlib import Path

import pytest
from botocore.parsers import ResponseParserError
from hypothesis import given
from hypothesis import strategies as st

from steadqd.errors import AlreadyExists, InvalidInput, NotFound, OutcomeUnknown
from steadqd.s3.store.base import SEAWEEDFS
from steadqd.s3.store.s3 import S3Settings, S3Store
from steadqd.s3.store.s3_direct import (
    _MAX_HEADER_LINE,
    _MAX_HEADERS,
    DirectClient,
    _client_error,
    _parse_lines,
    _parse_listing,
    _quote,
    _quote_key,
    _read_fields,
    _Response,
)
from tests.stowq import test_store_seaweedfs as live
from tests.stowq.conftest import LIVE_BUCKET
from tests.stowq.seaweed import Seaweed
from tests.stowq.test_store_s3 import credentials  # noqa: F401 (a fixture)


def _direct(seaweed: Seaweed, bucket: str, *, create: bool = True) -> S3Store:
    store = S3Store(dataclasses.replace(seaweed.settings(bucket), transport="direct"), profile=SEAWEEDFS)
    if create:
        store.create_bucket()
    return store


@pytest.fixture(scope="module")
def direct(seaweed: Seaweed) -> Iterator[S3Store]:
    store = _direct(seaweed, LIVE_BUCKET)
    yield store
    store.close()


def test_the_direct_store_is_the_direct_client(direct: S3Store) -> None:
    assert isinstance(direct._client, DirectClient)


def test_primitives_over_the_direct_transport(direct: S3Store, live_prefix: str) -> None:
    live.test_s3_store_primitives_on_seaweedfs(direct, live_prefix)


def test_listing_pages_over_the_direct_transport(direct: S3Store, live_prefix: str) -> None:
    live.test_s3_store_pages_a_listing_with_exclusive_start_after(direct, live_prefix)


def test_keys_and_prefixes_that_need_escaping_are_signed_as_sent(direct: S3Store, live_prefix: str) -> None:
    """The signature covers the escaped path and query: a key botocore would escape must round-trip."""
    keys = [live_prefix + name for name in ("a b", "a+b=c&d", "a~b%41", "é/ü", "x?y#z")]
    for key in keys:
        direct.put_if_absent(key, key.encode())
        assert direct.get(key).body == key.encode()
    listed = direct.list_page(live_prefix).items
    assert sorted(m.key for m in listed) == sorted(keys)
    assert [m.key for m in direct.list_page(live_prefix + "a+b").items] == [live_prefix + "a+b=c&d"]
    for key in keys:
        direct.delete(key)


def test_a_missing_bucket_is_named_over_the_direct_transport(seaweed: Seaweed) -> None:
    missing = _direct(seaweed, "steadq-no-such-bucket", create=False)
    with pytest.raises(NotFound, match="bucket steadq-no-such-bucket does not exist"):
        missing.list_page("")
    with pytest.raises(NotFound, match="bucket steadq-no-such-bucket does not exist"):
        missing.put_if_absent("k", b"")
    with pytest.raises(NotFound):
        missing.head("k")  # no body to name the bucket, as with botocore: the status alone says absent


def test_seaweedfs_is_certified_over_the_direct_transport(seaweed: Seaweed) -> None:
    store = _direct(seaweed, "steadq-certify-direct")
    peer = _direct(seaweed, "steadq-certify-direct", create=False)
    result = live.certify(store, peer=peer)
    assert result.certified, result.report()
    assert result.measured["P7 mode"] == "the store verifies SHA-256"


def test_steadq_s3_transport_picks_the_transport_of_every_queue_opened(
    seaweed: Seaweed, direct: S3Store, monkeypatch: pytest.MonkeyPatch, live_prefix: str
) -> None:
    """The variable is read where the profile's is, for every command and daemon (``direct`` made the bucket)."""
    from steadqd.s3.open import TRANSPORT_VARIABLE, init_bucket_queue

    for name, value in seaweed.environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(TRANSPORT_VARIABLE, "curl")
    with pytest.raises(InvalidInput, match="STEADQ_S3_TRANSPORT 'curl' is not an S3 transport; give one of botocore"):
        init_bucket_queue(f"s3://{LIVE_BUCKET}/{live_prefix}", store_profile="seaweedfs")
    monkeypatch.setenv(TRANSPORT_VARIABLE, "direct")
    backend = init_bucket_queue(f"s3://{LIVE_BUCKET}/{live_prefix}", store_profile="seaweedfs")
    try:
        store = backend.layout.store
        assert isinstance(store, S3Store) and isinstance(store._client, DirectClient)
    finally:
        backend.close()


class _OneAnswerPerConnection(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1 without ``Connection: close``, yet the server hangs up after each answer (as idle timeouts do)."""

    protocol_version = "HTTP/1.1"
    connections: list[int]
    hung_up: threading.Event

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(412)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.close_connection = True

    def setup(self) -> None:
        super().setup()
        self.connections.append(1)

    def finish(self) -> None:
        super().finish()
        self.request.close()
        self.hung_up.set()

    def log_message(self, *args: object) -> None:
        pass


def test_a_kept_connection_the_server_closed_is_replaced_not_written_into(credentials: Path) -> None:  # noqa: F811
    """Writing into a dead connection would make a clean 412 an OutcomeUnknown; it is found idle and replaced."""
    hung_up = threading.Event()
    connections: list[int] = []
    handler = type("Handler", (_OneAnswerPerConnection,), {"connections": connections, "hung_up": hung_up})
    with _answered_by(handler, credentials) as store:
        for _ in range(3):
            hung_up.clear()
            with pytest.raises(AlreadyExists):
                store.put_if_absent("k", b"x")
            assert hung_up.wait(5)
        assert len(connections) == 3


@contextlib.contextmanager
def _answered_by(handler: type[http.server.BaseHTTPRequestHandler], creds: Path) -> Iterator[S3Store]:
    """A direct-transport store (one attempt) whose endpoint is a local server answering with ``handler``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        settings = S3Settings(
            "test-bucket", endpoint_url=endpoint, credentials_file=str(creds), attempts=1, transport="direct"
        )
        store = S3Store(settings)
        yield store
        store.close()
    finally:
        server.shutdown()
        server.server_close()


def test_error_answers_are_read_as_botocore_reads_them() -> None:
    xml = b"<Error><Code>NoSuchBucket</Code><Message>gone</Message></Error>"
    assert _client_error(404, {}, xml, "GET").response["Error"] == {"Code": "NoSuchBucket", "Message": "gone"}
    assert _client_error(404, {}, b"", "HEAD").response["Error"]["Code"] == "404"
    assert _client_error(502, {}, b"<html>bad gateway", "PUT").response["ResponseMetadata"]["HTTPStatusCode"] == 502


def test_a_listing_is_parsed_with_or_without_the_s3_namespace() -> None:
    entry = "<Contents><Key>q/a</Key><ETag>&quot;e1&quot;</ETag><Size>3</Size><LastModified>2026-12-01T13:06:36.000Z</LastModified></Contents>"
    for opening in ('<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">', "<ListBucketResult>"):
        parsed = _parse_listing(f"{opening}<IsTruncated>true</IsTruncated>{entry}</ListBucketResult>".encode())
        assert parsed["IsTruncated"] is True
        assert [(c["Key"], c["ETag"], c["Size"]) for c in parsed["Contents"]] == [("q/a", '"e1"', 3)]
        assert parsed["Contents"][0]["LastModified"].year == 2026
    with pytest.raises(ResponseParserError, match="unreadable Size or LastModified"):
        _parse_listing(b"<ListBucketResult><Contents><Key>k</Key><Size>big</Size></Contents></ListBucketResult>")


class _Canned:
    """A socket whose answer is fixed bytes: what ``http.client``'s response reads through ``makefile``."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self._data))  # type: ignore[arg-type]


def _framing(cls: type[http.client.HTTPResponse], raw: bytes, method: str) -> tuple[object, ...]:
    response = cls(_Canned(raw), method=method)  # type: ignore[arg-type]
    response.begin()
    framing = (response.status, response.reason, response.version, response.chunked, response.length)
    return framing + (response.will_close, response.msg.items(), response.getheader("etag"), response.read())


_ANSWERS = [
    b'HTTP/1.1 200 OK\r\nEtag: "e1"\r\nContent-Length: 5\r\nLast-Modified: Sun, 06 Dec 2026 21:00:00 GMT\r\n\r\nhello',
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",  # the same, asked with HEAD: no body is read
    b'HTTP/1.1 100 Continue\r\nX-A: 1\r\n\r\nHTTP/1.1 200 OK\r\nETag: "e2"\r\nContent-Length: 0\r\n\r\n',
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 3\r\n\r\nxyz",
    b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close",
    b"HTTP/1.1 204 No Content\r\nX-Amz-Request-Id: 7\r\n\r\n",
    b'HTTP/1.1 304 Not Modified\r\nETag: "e3"\r\n\r\n',
    b"HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: many\r\nConnection: keep-alive\r\n\r\n",
    b'HTTP/1.1 200 OK\r\netag: "first"\r\nETag: "second"\r\nContent-Length: 0\r\nkeep-alive: timeout=5\r\n\r\n',
    b"HTTP/1.1 301 Moved Permanently\r\nX-Amz-Bucket-Region: eu-west-3\r\nContent-Length: 0\r\n\r\n",
]


@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("raw", _ANSWERS)
def test_answers_are_framed_as_http_client_frames_them(raw: bytes, method: str) -> None:
    """The framing of an answer (length, chunked, close, status) is http.client's own, from the faster header read."""
    assert _framing(_Response, raw, method) == _framing(http.client.HTTPResponse, raw, method)


@pytest.mark.parametrize(
    ("block", "refused"),
    [
        (b"X-Bad\r\n", "no 'name: value'"),  # email would take the rest for a body
        (b"Bad Name: v\r\n", "no 'name: value'"),
        (b": empty name\r\n", "no 'name: value'"),
        (b"\r\r\n", "no 'name: value'"),
        (b" folded first\r\n", "continuation"),
        (b"".join(b"X-%d: v\r\n" % i for i in range(101)), "more than 100 headers"),
        (b"X-Long: " + b"a" * 70000 + b"\r\n", "header line"),
    ],
)
def test_a_hostile_header_block_is_refused_as_a_lost_answer(block: bytes, refused: str) -> None:
    """The store's answers are hostile input: every bound http.client keeps, and no line that is not a header."""
    raw = b"HTTP/1.1 200 OK\r\n" + block + b"Content-Length: 0\r\n\r\n"
    response = _Response(_Canned(raw), method="GET")  # type: ignore[arg-type]
    with pytest.raises(HTTPException, match=refused):
        response.begin()
    assert http.client.HTTPResponse  # the stock parser's bounds are the same two numbers
    assert (_MAX_HEADERS, _MAX_HEADER_LINE) == (http.client._MAXHEADERS, http.client._MAXLINE)  # type: ignore[attr-defined]


def test_a_folded_header_continues_its_value() -> None:
    raw = b"HTTP/1.1 200 OK\r\nX-Note: one\r\n  two\r\n\tthree\r\nContent-Length: 0\r\n\r\n"
    response = _Response(_Canned(raw), method="GET")  # type: ignore[arg-type]
    response.begin()
    assert response.getheader("x-note") == "one two three"
    assert "X-NOTE" in response.msg and response.msg["content-length"] == "0"


_HEADER_BYTES = st.sampled_from([b"A", b"x", b"-", b":", b" ", b"\t", b"\r", b"\n", b"\x0b", b"\x85", b"\xe9"])
_BLANKS = st.lists(st.sampled_from([b" ", b"\t"]), max_size=3).map(b"".join)
# Mostly lines that are fields (a token, blanks around the value), some anything at all.
_HEADER_LINE = st.one_of(
    st.tuples(
        st.text("Ax-", min_size=1, max_size=4).map(str.encode),
        _BLANKS,
        st.lists(_HEADER_BYTES.filter(lambda b: b not in (b"\r", b"\n")), max_size=6).map(b"".join),
        _BLANKS,
    ).map(lambda p: p[0] + b":" + p[1] + p[2] + p[3]),
    st.lists(_HEADER_BYTES, max_size=14).map(b"".join),
)


@given(st.lists(_HEADER_LINE, max_size=6), st.sampled_from([b"\r\n", b"\n"]))
def test_a_header_block_read_in_one_pass_is_read_as_line_by_line(lines: list[bytes], end: bytes) -> None:
    """The one-pass reading of a plain header block (a regular expression over the whole block) gives the
    fields the line-by-line reading gives, and refuses what it refuses; the answer's dictionary keeps each
    lowercased name's last value, as one built from urllib3's header items does."""
    raw = b"".join(line + end for line in lines) + end

    def read(one_pass: bool) -> tuple[str, object]:
        fp = io.BufferedReader(io.BytesIO(raw))  # type: ignore[arg-type]
        try:
            if one_pass:
                return "fields", _read_fields(fp).items()
            kept: list[bytes] = []
            while (line := fp.readline(_MAX_HEADER_LINE + 1)) not in (b"\r\n", b"\n", b""):
                kept.append(line)
            return "fields", _parse_lines(kept)
        except HTTPException as exc:
            return "refused", str(exc)

    assert read(True) == read(False)
    if read(True)[0] == "fields":
        fields = _read_fields(io.BufferedReader(io.BytesIO(raw)))  # type: ignore[arg-type]
        assert fields.last == {name.lower(): value for name, value in fields.items()}


class _MalformedHeader(http.server.BaseHTTPRequestHandler):
    """Answers a write with a header line that is no header (a hostile or broken store)."""

    protocol_version = "HTTP/1.1"

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.wfile.write(b'HTTP/1.1 200 OK\r\nETag: "e"\r\nnot a header\r\nContent-Length: 0\r\n\r\n')
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


def test_a_write_answered_with_a_malformed_header_is_outcome_unknown(credentials: Path) -> None:  # noqa: F811
    """The request was sent, so a refused answer cannot mean "not written": the key must be read again."""
    with _answered_by(_MalformedHeader, credentials) as store, pytest.raises(OutcomeUnknown, match="re-read the key"):
        store.put_if_absent("k", b"x")


# Keys as the protocol builds them, and anything else: what a key or a query value is quoted to is quote's answer.
_QUOTABLE = st.one_of(st.text(), st.text("abcXYZ019_.-~/ %+=&?#é\x00", max_size=40))


@given(_QUOTABLE)
def test_keys_and_query_values_are_quoted_as_quote_quotes_them(text: str) -> None:
    assert _quote_key(text) == urllib.parse.quote(text, safe="/~")
    assert _quote(text) == urllib.parse.quote(text, safe="-_.~")
