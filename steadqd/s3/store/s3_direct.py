"""The S3 requests of :class:`~steadqd.s3.store.s3.S3Store` over our own keep-alive connections.

Why: a bucket worker is bound by botocore's CPU per request (docs/stowq.md,
"What a store operation costs"): the model-driven serialisation, event
dispatch, endpoint rules and response parsing cost more than the store's
answer. This client sends the seven requests the protocol makes with
``http.client``, one persistent connection per thread, signed by botocore's
own SigV4 signer (its canonicalisation and crypto stay maintained upstream).

Why it speaks botocore's dialect: :class:`S3Store` keeps the single home of
the retry policy and of the sorting of answers into outcome classes, written
against botocore's client calls and exceptions. So this client offers the
same calls with the same answer dictionaries, and raises the exception
botocore would have raised at the same point, which is the split the
protocol needs:

* the connection could not be opened (refused, unresolvable, connect
  timeout): ``EndpointConnectionError`` or ``ConnectTimeoutError``, i.e.
  nothing was sent, ``NotCommitted``;
* anything after the first byte of the request was handed to the socket
  (a lost connection, a read timeout, an answer we cannot parse):
  ``ConnectionClosedError``, ``ReadTimeoutError`` or ``ResponseParserError``,
  i.e. ``OutcomeUnknown`` for a write;
* an HTTP error status: ``ClientError`` with the S3 error code.

A kept connection the server has already closed is found before it is
reused (it is readable while idle) and replaced by a new one, so a request
is never written into a connection known to be dead.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from typing import Any

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from botocore.parsers import ResponseParserError

from steadqd.errors import InvalidInput
from steadqd.s3.store.base import parse_last_modified
from steadqd.text import redacted

__all__ = ["DirectClient"]

_UNRESERVED = "-_.~"
# S3 spells object keys in a URL path with '/' kept and everything else but the unreserved set escaped.
_KEY_SAFE = "/~"
_S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


@dataclass(frozen=True, slots=True)
class _Meta:
    """The two facts of a botocore client's ``meta`` that :class:`S3Store` reads."""

    endpoint_url: str
    region_name: str


def _quote(value: str) -> str:
    return urllib.parse.quote(value, safe=_UNRESERVED)


def _child(element: ElementTree.Element, name: str) -> str | None:
    found = element.find(_S3_NS + name)
    if found is None:
        found = element.find(name)  # some engines answer without the namespace
    return None if found is None else (found.text or "")


class DirectClient:
    """A botocore-compatible S3 client for one endpoint: the calls :class:`S3Store` makes, and no others.

    Thread-safe: each thread has its own connection; the signer and the
    credentials provider are shared and hold no per-request state. The
    capitalised argument names are botocore's, so that :class:`S3Store`
    makes one call whichever client it holds.
    """

    def __init__(
        self,
        *,
        endpoint_url: str,
        region: str,
        credentials: Any,
        addressing_style: str,
        connect_timeout_s: float,
        read_timeout_s: float,
        ca_bundle: str | None = None,
    ) -> None:
        parts = urllib.parse.urlsplit(endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidInput(
                f"endpoint URL {redacted(endpoint_url)!r}: give http://HOST[:PORT] or https://HOST[:PORT]"
            )
        proxy = urllib.request.getproxies().get(parts.scheme)
        if proxy and not urllib.request.proxy_bypass(parts.hostname):
            raise InvalidInput(
                f"{parts.scheme}_proxy is set ({proxy}) and the direct S3 transport does not go through proxies: "
                f"add {parts.hostname} to no_proxy, or use the botocore transport (STEADQ_S3_TRANSPORT=botocore)"
            )
        # AWS_CA_BUNDLE (or ca_bundle in the AWS config) as botocore honours it; else the system's CAs.
        self._tls = ssl.create_default_context(cafile=ca_bundle) if parts.scheme == "https" else None
        self.meta = _Meta(endpoint_url.rstrip("/"), region)
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._base_path = parts.path.rstrip("/")
        self._credentials = credentials
        self._region = region
        on_aws = self._host == "amazonaws.com" or self._host.endswith(".amazonaws.com")
        self._virtual = addressing_style == "virtual" or (addressing_style == "auto" and on_aws)
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()

    # -- the calls S3Store makes -------------------------------------------------------

    def put_object(
        self, *, Bucket: str, Key: str, Body: bytes, ChecksumSHA256: str, **condition: str
    ) -> dict[str, Any]:
        headers = {"x-amz-checksum-sha256": ChecksumSHA256, "Content-Type": "application/octet-stream"}
        if "IfNoneMatch" in condition:
            headers["If-None-Match"] = condition["IfNoneMatch"]
        if "IfMatch" in condition:
            headers["If-Match"] = condition["IfMatch"]
        status, answer, _ = self._send("PUT", Bucket, Key, headers=headers, body=Body)
        return {"ETag": answer.get("etag"), "ResponseMetadata": {"HTTPStatusCode": status}}

    def get_object(self, *, Bucket: str, Key: str, **extra: str) -> dict[str, Any]:
        headers = {}
        if "Range" in extra:
            headers["Range"] = extra["Range"]
        if "IfNoneMatch" in extra:
            headers["If-None-Match"] = extra["IfNoneMatch"]
        connection, response, answer = self._exchange("GET", Bucket, Key, headers=headers)
        body = _Body(self, connection, response)
        return {**self._object_meta(answer), "ContentRange": answer.get("content-range"), "Body": body}

    def head_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        _, answer, _ = self._send("HEAD", Bucket, Key)
        return self._object_meta(answer)

    def delete_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        status, _, _ = self._send("DELETE", Bucket, Key)
        return {"ResponseMetadata": {"HTTPStatusCode": status}}

    def list_objects_v2(
        self,
        *,
        Bucket: str,
        Prefix: str,
        MaxKeys: int,
        StartAfter: str | None = None,
    ) -> dict[str, Any]:
        query = [("list-type", "2"), ("max-keys", str(MaxKeys)), ("prefix", Prefix)]
        if StartAfter is not None:
            query.append(("start-after", StartAfter))
        _, _, body = self._send("GET", Bucket, None, query=query)
        return _parse_listing(body)

    def create_bucket(self, *, Bucket: str, CreateBucketConfiguration: dict[str, str] | None = None) -> dict[str, Any]:
        body = b""
        if CreateBucketConfiguration is not None:
            constraint = CreateBucketConfiguration["LocationConstraint"]
            body = (
                '<CreateBucketConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                f"<LocationConstraint>{constraint}</LocationConstraint></CreateBucketConfiguration>"
            ).encode()
        self._send("PUT", Bucket, None, body=body)
        return {}

    def close(self) -> None:
        with self._lock:
            connections, self._open = self._open, set()
        for connection in connections:
            connection.close()

    # -- one request ---------------------------------------------------------------------

    def _object_meta(self, answer: dict[str, str]) -> dict[str, Any]:
        modified = answer.get("last-modified")
        try:
            return {
                "ETag": answer.get("etag"),
                "LastModified": None if modified is None else parse_last_modified(modified),
                "ContentLength": int(answer.get("content-length") or 0),
            }
        except ValueError as exc:  # sorted as an answer that did not parse, like botocore's
            raise ResponseParserError(f"unreadable Last-Modified or Content-Length: {exc}") from exc

    def _target(self, bucket: str, key: str | None, query: list[tuple[str, str]]) -> tuple[str, str]:
        """The Host header and the request target (path and query), as signed and as sent."""
        default = self._port == (443 if self._scheme == "https" else 80)
        host = self._host if default else f"{self._host}:{self._port}"
        path = self._base_path
        if self._virtual:
            host = f"{bucket}.{host}"
        else:
            path += f"/{bucket}"
        path += "/" if key is None else "/" + urllib.parse.quote(key, safe=_KEY_SAFE)
        if query:
            path += "?" + "&".join(f"{_quote(name)}={_quote(value)}" for name, value in query)
        return host, path

    def _sign(self, method: str, host: str, target: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
        credentials = self._credentials.get_frozen_credentials() if self._credentials is not None else None
        if credentials is None:
            raise NoCredentialsError()
        request = AWSRequest(method=method, url=f"{self._scheme}://{host}{target}", headers=headers, data=body)
        request.headers["Host"] = host
        S3SigV4Auth(credentials, "s3", self._region).add_auth(request)
        return dict(request.headers.items())

    def _send(
        self,
        method: str,
        bucket: str,
        key: str | None,
        *,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
        query: list[tuple[str, str]] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        connection, response, answer = self._exchange(method, bucket, key, headers=headers, body=body, query=query)
        data = _Body(self, connection, response).read()
        return response.status, answer, data

    def _exchange(
        self,
        method: str,
        bucket: str,
        key: str | None,
        *,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
        query: list[tuple[str, str]] | None = None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, dict[str, str]]:
        """Send one request and read the answer's status and headers; the body is the caller's to read.

        An error status is raised here (its body, the engine's short XML, read whole).
        """
        host, target = self._target(bucket, key, query or [])
        signed = self._sign(method, host, target, dict(headers or {}), body)
        connection = self._connection()
        try:
            connection.request(method, target, body=body if method in ("PUT", "POST") else None, headers=signed)
            response = connection.getresponse()
        except TimeoutError as exc:
            self._discard(connection)
            raise ReadTimeoutError(endpoint_url=self.meta.endpoint_url, error=exc) from exc
        except (OSError, http.client.HTTPException) as exc:
            self._discard(connection)
            raise ConnectionClosedError(endpoint_url=self.meta.endpoint_url, error=exc) from exc
        answer = {name.lower(): value for name, value in response.getheaders()}
        if response.status >= 300:
            data = _Body(self, connection, response).read()
            raise _client_error(response.status, answer, data, method)
        return connection, response, answer

    # -- connections -----------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        """This thread's open connection, or a new one; opening failures are "nothing was sent"."""
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is not None and not _idle_and_open(connection):
            self._discard(connection)
            connection = None
        if connection is not None:
            return connection
        if self._tls is not None:
            connection = http.client.HTTPSConnection(
                self._host, self._port, timeout=self._connect_timeout_s, context=self._tls
            )
        else:
            connection = http.client.HTTPConnection(self._host, self._port, timeout=self._connect_timeout_s)
        try:
            connection.connect()
        except TimeoutError as exc:
            connection.close()
            raise ConnectTimeoutError(endpoint_url=self.meta.endpoint_url, error=exc) from exc
        except OSError as exc:
            connection.close()
            raise EndpointConnectionError(endpoint_url=self.meta.endpoint_url, error=exc) from exc
        assert connection.sock is not None
        connection.sock.settimeout(self._read_timeout_s)
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._local.connection = connection
        with self._lock:
            self._open.add(connection)
        return connection

    def _discard(self, connection: http.client.HTTPConnection) -> None:
        connection.close()
        if getattr(self._local, "connection", None) is connection:
            self._local.connection = None
        with self._lock:
            self._open.discard(connection)


class _Body:
    """An answer's body, read on demand: a bounded reader takes only the bytes it wants.

    A connection is kept for the next request only once its answer was read
    to the end; one closed with bytes still unread is dropped, since they
    would otherwise be taken for the next answer.
    """

    def __init__(self, client: DirectClient, connection: http.client.HTTPConnection, response: Any) -> None:
        self._client = client
        self._connection = connection
        self._response = response

    def read(self, amt: int | None = None) -> bytes:
        try:
            data: bytes = self._response.read() if amt is None else self._response.read(amt)
        except TimeoutError as exc:
            self._client._discard(self._connection)
            raise ReadTimeoutError(endpoint_url=self._client.meta.endpoint_url, error=exc) from exc
        except (OSError, http.client.HTTPException) as exc:
            self._client._discard(self._connection)
            raise ConnectionClosedError(endpoint_url=self._client.meta.endpoint_url, error=exc) from exc
        if amt is None:
            self.close()
        return data

    def close(self) -> None:
        if not self._response.isclosed() or self._response.will_close:
            self._client._discard(self._connection)


def _idle_and_open(connection: http.client.HTTPConnection) -> bool:
    """An idle kept connection is readable only if the server closed it (or sent what nobody asked for)."""
    sock = connection.sock
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _client_error(status: int, answer: dict[str, str], data: bytes, method: str) -> ClientError:
    """The error answer as botocore reports it: the S3 code from the XML body, else the status (HEAD has no body)."""
    code = answer.get("x-amz-error-code") or str(status)
    message = http.client.responses.get(status, "")
    try:
        root = ElementTree.fromstring(data) if data else None
    except ElementTree.ParseError:
        root = None  # a proxy's HTML page: the status alone sorts it
    if root is not None:
        code = _child(root, "Code") or code
        message = _child(root, "Message") or message
    response = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, method)


def _parse_listing(data: bytes) -> dict[str, Any]:
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as exc:
        raise ResponseParserError(f"the LIST answer is not XML: {exc}") from exc
    entries = root.findall(_S3_NS + "Contents") or root.findall("Contents")
    contents = [_entry(entry) for entry in entries]
    return {"Contents": contents, "IsTruncated": (_child(root, "IsTruncated") or "").lower() == "true"}


def _entry(entry: ElementTree.Element) -> dict[str, Any]:
    key = _child(entry, "Key")
    if key is None:
        raise ResponseParserError("a LIST entry has no Key")
    modified = _child(entry, "LastModified")
    try:
        return {
            "Key": key,
            "ETag": _child(entry, "ETag"),
            "Size": int(_child(entry, "Size") or 0),
            "LastModified": None if not modified else parse_last_modified(modified),
        }
    except ValueError as exc:
        raise ResponseParserError(f"a LIST entry for {key!r} has an unreadable Size or LastModified: {exc}") from exc
