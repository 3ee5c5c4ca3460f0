"""The default transport's HTTP: TLS, proxies, addressing, region redirects and lost connections.

Each case runs the real client against a scripted server on 127.0.0.1 that
records what reached it: a forward proxy sees the absolute URL a request
was sent to (so virtual-hosted names need no DNS), a CONNECT proxy counts
its tunnels, a TLS server is trusted only through a CA bundle made here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import re
import select
import shutil
import socket
import ssl
import struct
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from steadqd.errors import AlreadyExists, NotCommitted, NotFound, OutcomeUnknown
from steadqd.s3.store.s3 import S3Settings, S3Store
from steadqd.s3.store.s3_direct import DirectClient
from tests.stowq.test_store_s3 import credentials  # noqa: F401 (a fixture)

PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY", "all_proxy")
_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/([^/]+)/s3/aws4_request")


@dataclass
class Seen:
    """One request as it reached the server: the request line's target, the Host header, the signing region."""

    method: str
    target: str
    host: str
    region: str


@dataclass
class Script:
    """What a scripted server answers, and what it saw; ``answer`` maps a request to (status, headers)."""

    answer: Callable[[Seen], tuple[int, dict[str, str]]]
    seen: list[Seen] = field(default_factory=list)
    tunnels: list[str] = field(default_factory=list)


@pytest.fixture(autouse=True)
def _no_proxy_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)


def _handler(script: Script) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            scope = _SCOPE.search(self.headers.get("Authorization", ""))
            seen = Seen(self.command, self.path, self.headers.get("Host", ""), scope.group(1) if scope else "")
            script.seen.append(seen)
            status, headers = script.answer(seen)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_PUT = do_HEAD = do_DELETE = _answer

        def do_CONNECT(self) -> None:
            """A tunnel, to 127.0.0.1 only: the bytes are piped both ways until either side closes."""
            host, _, port = self.path.rpartition(":")
            script.tunnels.append(self.path)
            if host != "127.0.0.1":
                self.send_error(403)
                return
            upstream = socket.create_connection((host, int(port)), timeout=5)
            self.send_response(200, "Connection established")
            self.end_headers()
            self.wfile.flush()
            ends = [self.connection, upstream]
            for _ in range(10_000):  # bounded: a test exchanges a handful of packets
                readable, _, _ = select.select(ends, [], [], 5)
                if not readable:
                    break
                chunk = b""
                for end in readable:
                    chunk = end.recv(65536)
                    if not chunk:
                        break
                    (upstream if end is self.connection else self.connection).sendall(chunk)
                if not chunk:
                    break
            upstream.close()
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def serving(script: Script, tls: ssl.SSLContext | None = None) -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(script))
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _taken(_: Seen) -> tuple[int, dict[str, str]]:
    return 412, {}


def _store(endpoint: str, credentials: Path, **options: Any) -> S3Store:  # noqa: F811
    settings = S3Settings("b-ok", endpoint_url=endpoint, credentials_file=str(credentials), read_timeout_s=1.0)
    return S3Store(dataclasses.replace(settings, **options))


def test_the_default_transport_is_the_direct_client_plain_http_without_urllib3(credentials: Path) -> None:  # noqa: F811
    store = _store("http://127.0.0.1:9", credentials)
    assert isinstance(store._client, DirectClient) and store._client._plain
    store.close()
    tls = _store("https://127.0.0.1:9", credentials)
    assert isinstance(tls._client, DirectClient) and not tls._client._plain  # TLS stays on urllib3
    tls.close()


# -- TLS --------------------------------------------------------------------------------


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA made for this test, and a server certificate it signed for 127.0.0.1 (not for "localhost")."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (Debian: openssl), so no test certificate can be made")
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key, request = directory / "server.pem", directory / "server.key", directory / "server.csr"
    extensions = directory / "ext.cnf"
    extensions.write_text("subjectAltName=IP:127.0.0.1\n")
    commands = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=steadqd test CA"]
        + ["-keyout", str(ca_key), "-out", str(ca)],
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(request)],
        ["x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-days", "1"]
        + ["-extfile", str(extensions), "-out", str(cert)],
    ]
    for command in commands:
        subprocess.run(["openssl", *command], check=True, capture_output=True)
    return ca, cert, key


def test_tls_is_verified_against_aws_ca_bundle_and_a_refused_certificate_sends_nothing(
    credentials: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ca, cert, key = _certificates(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    script = Script(_taken)
    with serving(script, tls) as port:
        untrusted = _store(f"https://127.0.0.1:{port}", credentials, attempts=2)
        with pytest.raises(NotCommitted, match="could not connect.*SSL validation failed.*CERTIFICATE_VERIFY_FAILED"):
            untrusted.put_if_absent("k", b"x")
        monkeypatch.setenv("AWS_CA_BUNDLE", str(ca))
        wrong_name = _store(f"https://localhost:{port}", credentials, attempts=1)
        with pytest.raises(NotCommitted, match="could not connect.*SSL validation failed"):
            wrong_name.put_if_absent("k", b"x")
        assert script.seen == []  # neither request reached the server
        trusting = _store(f"https://127.0.0.1:{port}", credentials)
        with pytest.raises(AlreadyExists):
            trusting.put_if_absent("k", b"x")
        with pytest.raises(AlreadyExists):
            trusting.put_if_absent("k", b"x")  # over the same TLS connection
        assert [s.method for s in script.seen] == ["PUT", "PUT"]
        for store in (untrusted, wrong_name, trusting):
            store.close()


# -- proxies and addressing ------------------------------------------------------------


def test_http_proxy_carries_path_style_requests_and_no_proxy_bypasses_it(
    credentials: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = Script(_taken)
    with serving(script) as port:
        monkeypatch.setenv("HTTP_PROXY", f"http://user:p%40ss@127.0.0.1:{port}")
        store = _store("http://store.invalid:9000", credentials)
        with pytest.raises(AlreadyExists):
            store.put_if_absent("jobs/a b", b"x")
        assert [(s.target, s.host) for s in script.seen] == [
            ("http://store.invalid:9000/b-ok/jobs/a%20b", "store.invalid:9000")
        ]
        store.close()
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,.invalid")
        bypassing = _store("http://store.invalid:9000", credentials, attempts=1)
        with pytest.raises(NotCommitted, match="could not connect"):  # store.invalid does not resolve
            bypassing.put_if_absent("k", b"x")
        assert len(script.seen) == 1
        bypassing.close()


def test_virtual_hosted_addressing_names_the_bucket_in_the_host(
    credentials: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = Script(lambda seen: (404, {}) if seen.method == "HEAD" else (412, {}))
    with serving(script) as port:
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{port}")
        store = _store("http://store.invalid:9000", credentials, addressing_style="virtual")
        with pytest.raises(AlreadyExists):
            store.put_if_absent("jobs/1", b"x")
        with pytest.raises(NotFound):
            store.head("jobs/2")
        assert [(s.target, s.host) for s in script.seen] == [
            ("http://b-ok.store.invalid:9000/jobs/1", "b-ok.store.invalid:9000"),
            ("http://b-ok.store.invalid:9000/jobs/2", "b-ok.store.invalid:9000"),
        ]
        store.close()


def test_https_proxy_tunnels_to_the_store_with_connect(
    credentials: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ca, cert, key = _certificates(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    store_script, proxy_script = Script(_taken), Script(_taken)
    with serving(store_script, tls) as store_port, serving(proxy_script) as proxy_port:
        monkeypatch.setenv("AWS_CA_BUNDLE", str(ca))
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy_port}")
        store = _store(f"https://127.0.0.1:{store_port}", credentials)
        for _ in range(2):
            with pytest.raises(AlreadyExists):
                store.put_if_absent("k", b"x")
        assert proxy_script.tunnels == [f"127.0.0.1:{store_port}"]  # one tunnel, kept alive
        assert proxy_script.seen == [] and [s.method for s in store_script.seen] == ["PUT", "PUT"]
        store.close()


def test_a_proxy_that_cannot_be_reached_or_refuses_the_tunnel_is_nothing_sent(
    credentials: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A write is retried and ends NotCommitted: it never reached the store."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed = unused.getsockname()[1]
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{closed}")
    store = _store("https://store.invalid", credentials, attempts=2)
    with pytest.raises(NotCommitted, match=f"could not connect.*proxy URL.*127.0.0.1:{closed}"):
        store.put_if_absent("k", b"x")
    store.close()
    script = Script(_taken)
    with serving(script) as port:
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
        store = _store("https://store.invalid", credentials, attempts=2)
        with pytest.raises(NotCommitted, match="could not connect"):
            store.put_if_absent("k", b"x")
        assert script.tunnels == ["store.invalid:443", "store.invalid:443"]  # refused twice, nothing else sent
        store.close()


# -- region redirects --------------------------------------------------------------------


def _bucket_in(region: str) -> Callable[[Seen], tuple[int, dict[str, str]]]:
    def answer(seen: Seen) -> tuple[int, dict[str, str]]:
        if seen.region != region:
            return 301, {"x-amz-bucket-region": region}
        return (200, {"ETag": '"0cc175b9c0f1b6a831c399e269772661"'}) if seen.method == "PUT" else (404, {})

    return answer


def test_a_region_redirect_is_followed_once_re_signed_and_remembered(credentials: Path) -> None:  # noqa: F811
    script = Script(_bucket_in("eu-west-1"))
    with serving(script) as port:
        store = _store(f"http://127.0.0.1:{port}", credentials, region="us-east-1", attempts=1)
        assert store.put_if_absent("k", b"a").etag == "0cc175b9c0f1b6a831c399e269772661"
        with pytest.raises(NotFound):
            store.head("other")  # a HEAD's 301 has no body: the header alone moves it
        assert [(s.method, s.region) for s in script.seen] == [
            ("PUT", "us-east-1"),
            ("PUT", "eu-west-1"),
            ("HEAD", "eu-west-1"),
        ]
        store.close()


def test_on_amazon_s3_a_region_redirect_moves_to_that_regions_endpoint(
    credentials: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = Script(_bucket_in("ap-south-2"))
    with serving(script) as port:
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{port}")
        store = _store("http://s3.us-east-1.amazonaws.com", credentials, region="us-east-1", attempts=1)
        store.put_if_absent("k", b"a")
        assert [(s.target, s.region) for s in script.seen] == [
            ("http://s3.us-east-1.amazonaws.com/b-ok/k", "us-east-1"),
            ("http://s3.ap-south-2.amazonaws.com/b-ok/k", "ap-south-2"),
        ]
        store.close()


@pytest.mark.parametrize("region", ["evil.example:80", "eu-west-1/../x", "a" * 41])
def test_a_region_that_is_no_region_name_is_not_followed(credentials: Path, region: str) -> None:  # noqa: F811
    script = Script(lambda seen: (301, {"x-amz-bucket-region": region}))
    with serving(script) as port:
        store = _store(f"http://127.0.0.1:{port}", credentials, attempts=1)
        with pytest.raises(NotCommitted, match="refused with HTTP 301"):
            store.put_if_absent("k", b"a")
        assert len(script.seen) == 1
        store.close()


def test_a_redirect_loop_is_followed_once_then_reported(credentials: Path) -> None:  # noqa: F811
    regions = iter(["eu-west-1", "eu-west-2", "eu-west-3"])
    script = Script(lambda seen: (301, {"x-amz-bucket-region": next(regions)}))
    with serving(script) as port:
        store = _store(f"http://127.0.0.1:{port}", credentials, attempts=1)
        with pytest.raises(NotCommitted, match="refused with HTTP 301"):
            store.put_if_absent("k", b"a")
        assert [s.region for s in script.seen] == ["us-east-1", "eu-west-1"]
        store.close()


# -- the connection lost after the request left ----------------------------------------


class _Resetting(http.server.BaseHTTPRequestHandler):
    """Reads the whole request, then resets the connection without a word: the write may have happened."""

    received: list[str]

    def _reset(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.received.append(self.command)
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    do_GET = do_PUT = _reset

    def log_message(self, *args: object) -> None:
        pass


def test_a_connection_reset_after_the_request_left_is_outcome_unknown_for_a_write(
    credentials: Path,  # noqa: F811
) -> None:
    received: list[str] = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_Resetting,), {"received": received}))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        store = _store(f"http://127.0.0.1:{server.server_address[1]}", credentials, attempts=3)
        with pytest.raises(OutcomeUnknown) as unknown:
            store.put_if_absent("k", b"x")
        assert unknown.value.ticket.key == "k"  # type: ignore[attr-defined]
        assert received == ["PUT"]  # sent once, never repeated
        with pytest.raises(NotCommitted):
            store.get("k")
        assert received == ["PUT", "GET", "GET", "GET"]  # a read is retried within the bound
        store.close()
    finally:
        server.shutdown()
        server.server_close()
