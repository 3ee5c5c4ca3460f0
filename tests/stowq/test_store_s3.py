"""The S3 client's settings and its sorting of transport answers, against scripted local HTTP servers.

Why scripted servers: whether a failure is ``NotCommitted`` or
``OutcomeUnknown`` depends on whether the request left, which only a server
that misbehaves on purpose can show. Each server here listens on 127.0.0.1
only and answers a fixed status (or nothing at all).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import (
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)
from botocore.parsers import ResponseParserError

from steadqd.errors import AlreadyExists, ErrorKind, InvalidInput, NotCommitted, OutcomeUnknown, PreconditionFailed
from steadqd.s3.store.base import PendingWrite, parse_last_modified
from steadqd.s3.store.s3 import (
    _CREDENTIAL_SOURCES,
    TRANSPORTS,
    S3Settings,
    S3Store,
    _session,
    _store_time_ns,
)

HEADERS: list[dict[str, str]] = []  # every request's headers, newest last
KEY_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Who sends the requests: every sorting of answers below must hold for botocore's client and ours alike."""
    return str(request.param)


@pytest.fixture
def credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A credentials file, and an environment that offers nothing else (no real AWS settings leak in)."""
    for name in KEY_ENV + ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    path = tmp_path / "credentials"
    path.write_text("[default]\naws_access_key_id = test\naws_secret_access_key = test-secret\n")
    path.chmod(0o600)
    return path


class _Scripted(http.server.BaseHTTPRequestHandler):
    status = 503
    silent = False
    requests: list[str]
    headers_seen: list[dict[str, str]]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.requests.append(self.command)
        self.headers_seen.append(dict(self.headers))
        if self.silent:
            threading.Event().wait(3)  # hold the request past the client's read timeout
            return
        body = f"<Error><Code>Scripted{self.status}</Code><Message>scripted</Message></Error>".encode()
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def scripted(status: int = 503, *, silent: bool = False) -> Iterator[tuple[str, list[str]]]:
    requests: list[str] = []
    handler = type(
        "Handler", (_Scripted,), {"status": status, "silent": silent, "requests": requests, "headers_seen": HEADERS}
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()


def _store(endpoint: str, credentials: Path, transport: str = "botocore", **options: Any) -> S3Store:
    settings = S3Settings(
        "test-bucket",
        endpoint_url=endpoint,
        credentials_file=str(credentials),
        read_timeout_s=0.5,
        transport=transport,
        **options,
    )
    return S3Store(settings)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bucket": "Upper"}, "not a valid S3 bucket name"),
        ({"bucket": "a"}, "not a valid S3 bucket name"),
        ({"bucket": "a..b"}, "not a valid S3 bucket name"),
        ({"bucket": "ok-bucket", "addressing_style": "dns"}, "addressing_style"),
        ({"bucket": "ok-bucket", "attempts": 0}, "at least one attempt"),
        ({"bucket": "ok-bucket", "read_timeout_s": 0}, "positive"),
        ({"bucket": "ok-bucket", "transport": "curl"}, "transport 'curl': give one of botocore, direct"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(options: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        S3Settings(**options)  # type: ignore[arg-type]


def test_a_credentials_file_must_exist_be_a_file_and_be_private(credentials: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no-such-file"):
        _store("http://127.0.0.1:9", tmp_path / "no-such-file")
    with pytest.raises(InvalidInput, match="not a regular file"):
        _store("http://127.0.0.1:9", tmp_path)
    credentials.chmod(0o644)
    with pytest.raises(InvalidInput, match=f"chmod o-r {credentials}"):
        _store("http://127.0.0.1:9", credentials)


def test_no_credentials_is_a_clear_refusal(credentials: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("")
    empty.chmod(0o600)
    with pytest.raises(InvalidInput, match="no AWS credentials found.*AWS_ACCESS_KEY_ID"):
        _store("http://127.0.0.1:9", empty)


def test_only_the_environment_and_the_shared_files_are_asked_for_credentials(credentials: Path) -> None:
    session = _session(S3Settings("ok-bucket"))
    assert tuple(p.METHOD for p in session.get_component("credential_provider").providers) == _CREDENTIAL_SOURCES


def test_credentials_from_the_environment(credentials: Path, monkeypatch: pytest.MonkeyPatch, transport: str) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from-env-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    store = S3Store(S3Settings("ok-bucket", transport=transport))
    assert store.location == "s3://ok-bucket at http://127.0.0.1:9" and "secret" not in store.location
    store.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_refused_connection_is_not_committed_for_writes_and_reads(credentials: Path, transport: str) -> None:
    store = _store(f"http://127.0.0.1:{_closed_port()}", credentials, transport, attempts=2)
    with pytest.raises(NotCommitted, match="could not connect"):
        store.put_if_absent("k", b"x")
    with pytest.raises(NotCommitted):
        store.get("k")


def test_a_5xx_to_a_write_is_outcome_unknown_after_one_request(credentials: Path, transport: str) -> None:
    with scripted(503) as (endpoint, requests):
        store = _store(endpoint, credentials, transport, attempts=3)
        with pytest.raises(OutcomeUnknown, match="HTTP 503") as info:
            store.put_if_absent("q/claims/0000/j/00000001", b"claim")
        assert requests == ["PUT"]  # never re-sent: a second attempt's 412 would hide a win
        assert info.value.ticket == PendingWrite(
            "put_if_absent", "q/claims/0000/j/00000001", hashlib.sha256(b"claim").digest()
        )
        assert info.value.exit_code == 2


def test_a_5xx_to_a_read_is_retried_within_the_bound_then_not_committed(credentials: Path, transport: str) -> None:
    with scripted(500) as (endpoint, requests):
        store = _store(endpoint, credentials, transport, attempts=3)
        with pytest.raises(NotCommitted, match="HTTP 500"):
            store.head("k")
        assert requests == ["HEAD"] * 3


def test_a_silent_server_makes_a_write_unknown_and_a_read_not_committed(credentials: Path, transport: str) -> None:
    with scripted(silent=True) as (endpoint, requests):
        store = _store(endpoint, credentials, transport, attempts=1)
        with pytest.raises(OutcomeUnknown) as info:
            store.put_if_match("q/meta/watermark", b"wm", "abc")
        assert info.value.ticket.op == "put_if_match" and info.value.ticket.if_match == "abc"
        with pytest.raises(NotCommitted):
            store.get("q/meta/watermark")
        assert requests == ["PUT", "GET"]


@pytest.mark.parametrize(
    ("status", "error", "kind"),
    [
        (409, NotCommitted, ErrorKind.NOT_COMMITTED),
        (403, NotCommitted, ErrorKind.PERMISSION_DENIED),
        (412, PreconditionFailed, ErrorKind.NOT_COMMITTED),
        (400, NotCommitted, ErrorKind.NOT_COMMITTED),
    ],
)
def test_refusals_are_not_committed_with_their_kind(
    credentials: Path, transport: str, status: int, error: type[Exception], kind: ErrorKind
) -> None:
    with scripted(status) as (endpoint, requests):
        store = _store(endpoint, credentials, transport, attempts=2)
        with pytest.raises(error) as info:
            store.put_if_match("k", b"x", "abc")
        assert getattr(info.value, "kind", None) is kind
        assert len(requests) == (2 if status == 409 else 1)  # only a conflict is worth one more try


def test_if_match_carries_the_etag_as_the_profile_wants(credentials: Path) -> None:
    from steadqd.s3.store.base import CEPH_RGW, S3_GENERIC

    quoted = S3Store(S3Settings("b-ok", endpoint_url="http://127.0.0.1:9", credentials_file=str(credentials)))
    bare = S3Store(
        S3Settings("b-ok", endpoint_url="http://127.0.0.1:9", credentials_file=str(credentials)), profile=CEPH_RGW
    )
    assert quoted.profile is S3_GENERIC
    assert quoted._if_match("abc") == '"abc"' and bare._if_match("abc") == "abc"
    assert os.environ.get("AWS_ACCESS_KEY_ID") is None


def test_a_put_sends_its_sha256_and_no_100_continue_round_trip(credentials: Path, transport: str) -> None:
    with scripted(412) as (endpoint, _):
        store = _store(endpoint, credentials, transport, attempts=1)
        with pytest.raises(AlreadyExists):
            store.put_if_absent("k", b"body")
    sent = {k.lower(): v for k, v in HEADERS[-1].items()}
    assert sent["if-none-match"] == "*" and "expect" not in sent
    assert sent["x-amz-checksum-sha256"] == base64.b64encode(hashlib.sha256(b"body").digest()).decode()


@pytest.mark.parametrize(
    "text",
    ["2026-12-01T13:06:36Z", "2026-12-01T13:06:36.000Z", "Tue, 01 Dec 2026 13:06:36 GMT", "1796130396"],
)
def test_both_timestamp_forms_s3_sends_give_the_same_store_time(text: str) -> None:
    """LIST's ISO 8601 and a header's RFC 1123 must land on one nanosecond count (P6: one time per object)."""
    assert _store_time_ns(parse_last_modified(text), 10**9) == 1_796_130_396 * 10**9


@pytest.mark.parametrize(
    ("raised", "outcome", "tries"),
    [
        (lambda: EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), NotCommitted, 3),
        (lambda: ConnectTimeoutError(endpoint_url="http://127.0.0.1:9"), NotCommitted, 3),
        (lambda: NoCredentialsError(), NotCommitted, 1),
        (lambda: ParamValidationError(report="Key is required"), NotCommitted, 1),
        (lambda: ReadTimeoutError(endpoint_url="http://127.0.0.1:9"), OutcomeUnknown, 1),
        (lambda: ConnectionClosedError(endpoint_url="http://127.0.0.1:9"), OutcomeUnknown, 1),
        (lambda: ResponseParserError("unparseable answer"), OutcomeUnknown, 1),
    ],
)
def test_a_failed_write_is_not_committed_only_when_it_provably_never_left(
    credentials: Path, raised: Any, outcome: type[Exception], tries: int
) -> None:
    """Only failures raised before sending are NotCommitted; anything after, even an unparseable answer, is unknown."""
    store = _store("http://127.0.0.1:9", credentials, attempts=3)
    calls: list[int] = []

    def request() -> dict[str, Any]:
        calls.append(1)
        raise raised()

    with pytest.raises(outcome):
        store._write(PendingWrite("put_if_absent", "k", hashlib.sha256(b"").digest()), request)
    assert len(calls) == tries
