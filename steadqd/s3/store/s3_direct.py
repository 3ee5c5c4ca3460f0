"""The S3 requests of :class:`~steadqd.s3.store.s3.S3Store` over kept sockets or urllib3, signed as botocore signs.

Why: a bucket worker is bound by botocore's CPU per request (docs/stowq.md,
"What a store operation costs"): the model-driven serialisation, event
dispatch, endpoint rules and response parsing cost more than the store's
answer. This client sends the seven requests the protocol makes through
urllib3 (the pool botocore itself sends with), signed as botocore's own
SigV4 signer signs (:mod:`steadqd.s3.store.sigv4`, tested against it),
and reads the answer's header block and the LIST XML itself.
urllib3 brings what users have: TLS with verification, proxies
(``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY``, as botocore reads them),
kept connections checked before reuse. Plain HTTP without a proxy (a
same-host store) skips it (:mod:`steadqd.s3.store.plain_http`: urllib3
was about three quarters of such a request's CPU), keeping the same
checks and the same split below.

Why it speaks botocore's dialect: :class:`S3Store` keeps the single home of
the retry policy and of the sorting of answers into outcome classes, written
against botocore's client calls and exceptions. So this client offers the
same calls with the same answer dictionaries, and raises the exception
botocore would have raised at the same point, which is the split the
protocol needs:

* the connection (to the store, or the proxy and its tunnel, TLS handshake
  included) could not be opened: ``EndpointConnectionError`` or
  ``ConnectTimeoutError``, i.e. nothing was sent, ``NotCommitted``. Our
  connection classes mark every failure of ``connect()`` as such, so the
  split does not rest on guessing from urllib3's exception types (its
  ``SSLError`` is raised for a handshake and for a record lost mid-answer
  alike);
* anything after that (a lost connection, a read timeout, an answer we
  cannot parse): ``ConnectionClosedError``, ``ReadTimeoutError`` or
  ``ResponseParserError``, i.e. ``OutcomeUnknown`` for a write;
* an HTTP error status: ``ClientError`` with the S3 error code; a region
  redirect (``x-amz-bucket-region`` on a 301, 307 or 400) is followed once,
  re-signed for that region, as botocore does.
"""

from __future__ import annotations

import http.client
import re
import ssl
import urllib.parse
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from http.client import HTTPException, responses
from typing import Any

import urllib3
import urllib3.connection
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ProxyConnectionError,
    ReadTimeoutError,
    SSLError,
)
from botocore.parsers import ResponseParserError
from botocore.utils import get_environ_proxies

from steadqd.errors import InvalidInput
from steadqd.s3.store.base import parse_last_modified
from steadqd.s3.store.plain_http import NeverSent as _NeverSent
from steadqd.s3.store.plain_http import PlainAnswer, PlainPool
from steadqd.s3.store.sigv4 import Signer
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


# What ``quote`` leaves as it is (its always-safe ASCII letters, digits and "_.-~", and "/" in a key): a
# string of only these is its own quoting, told by one match instead of quote's per-character Python.
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_.\-~]*")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.\-~/]*")


def _quote(value: str) -> str:
    return value if _PLAIN_VALUE.fullmatch(value) else urllib.parse.quote(value, safe=_UNRESERVED)


def _quote_key(key: str) -> str:
    return key if _PLAIN_KEY.fullmatch(key) else urllib.parse.quote(key, safe=_KEY_SAFE)


def _child(element: ElementTree.Element, name: str) -> str | None:
    found = element.find(_S3_NS + name)
    if found is None:
        found = element.find(name)  # some engines answer without the namespace
    return None if found is None else (found.text or "")


# Amazon S3's own endpoints name the region in the host: a region redirect moves to s3.<region>.amazonaws.com.
_AWS_S3_HOST = re.compile(r"s3(?:[.-][a-z0-9-]+)?\.amazonaws\.com")
_REGION = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
# The answers that carry x-amz-bucket-region when a bucket lives in another region than the request was signed for.
_REGION_REDIRECTS = frozenset({301, 307, 400})


# An answer as urllib3 or the plain-HTTP pool gives it: status, headers, a body read on demand.
_Answer = urllib3.BaseHTTPResponse | PlainAnswer

# http.client's own bounds on an answer's header block: one line, and the number of lines.
_MAX_HEADER_LINE = 65536
_MAX_HEADERS = 100


class _Fields(http.client.HTTPMessage):
    """An answer's header fields, read by :class:`_Response` rather than by the ``email`` package.

    Why: ``http.client`` hands the header block to ``email``'s feed parser,
    and every later ``get`` walks the whole list lowering each name; that was
    a fifth of the client's Python per request. This is an ``HTTPMessage``
    (urllib3 checks the type) holding the same ``(name, value)`` list, with
    the first value of each lowercased name indexed, as ``get`` returns it.
    """

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        super().__init__()
        self._headers = fields  # email.message.Message's own list: items(), get_all() and the rest read it
        lowered = [(name.lower(), value) for name, value in fields]
        self._first = dict(reversed(lowered))
        # Each lowercased name's last value: the client's answer dictionary, as a dict built from urllib3's
        # header items would be (they are these fields: a value never holds the CRLF urllib3 would unfold).
        self.last = dict(lowered)

    def get(self, name: str, failobj: Any = None) -> Any:
        return self._first.get(name.lower(), failobj)

    def __getitem__(self, name: str) -> Any:
        return self._first.get(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._first

    def items(self) -> list[tuple[str, str]]:
        return list(self._headers)


def _read_fields(fp: Any) -> _Fields:
    """The header block up to its empty line, within ``http.client``'s bounds; a malformed line is refused.

    The store's answers are hostile input: a line longer than 64 KiB, more
    than 100 lines, a line that is no ``name: value`` (where ``email`` would
    take the rest of the block for a body and the headers after it would be
    lost) raise ``HTTPException``, which the client reports as a lost
    answer (outcome unknown for a write). An obsolete folded line (RFC 9112
    §5.2) continues the previous value after one space.
    """
    lines: list[bytes] = []
    for _ in range(_MAX_HEADERS + 1):
        line = fp.readline(_MAX_HEADER_LINE + 1)
        if len(line) > _MAX_HEADER_LINE:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            block = b"".join(lines).decode("iso-8859-1")
            found = _PLAIN_FIELD.findall(block)
            if len(found) == len(lines):  # every line a plain 'name: value' (all but odd answers): one pass
                return _Fields([(name, value.rstrip(" \t")) for name, value in found])
            return _Fields(_parse_lines(lines))
        lines.append(line)
    raise HTTPException(f"got more than {_MAX_HEADERS} headers")


def _parse_lines(lines: list[bytes]) -> list[tuple[str, str]]:
    """The fields of a header block line by line: folded lines joined, a line that is no field refused."""
    fields: list[tuple[str, str]] = []
    for line in lines:
        text = line.decode("iso-8859-1").rstrip("\r\n")
        if text[:1] in (" ", "\t"):
            if not fields:
                raise HTTPException(f"the answer's first header line is a continuation: {text[:80]!r}")
            name, value = fields[-1]
            more = text.strip(" \t")
            fields[-1] = (name, f"{value} {more}" if value else more)
            continue
        name, colon, value = text.partition(":")
        if not colon or not _FIELD_NAME.fullmatch(name):
            raise HTTPException(f"the answer has a header line that is no 'name: value': {text[:80]!r}")
        fields.append((name, value.strip(" \t")))
    return fields


# RFC 9110 §5.6.2: a field name is a token.
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_FIELD_NAME = re.compile(_TOKEN)
# A whole line 'name: value' with no CR but its line end's: anchored at a line's start and ending at its
# end, so a block is plain when there are as many matches as lines, and each match is what the line-by-line
# parser makes of that line once the value's trailing blanks are stripped. Possessive (Python 3.11): no
# backtracking, so a hostile 64 KiB line costs linear time.
_PLAIN_FIELD = re.compile(rf"^({_TOKEN}):[ \t]*+([^\r\n]*+)\r?\n", re.MULTILINE)


class _Response(http.client.HTTPResponse):
    """``http.client``'s response with the header block read by :func:`_read_fields`; the rest is its ``begin``.

    ``begin`` is the standard library's (Python 3.11-3.13 alike) but for
    the one line that parses the headers: the framing decisions (chunked,
    Content-Length, close, bodiless statuses, HEAD) are the same code, which
    a test checks against ``http.client`` on the same answers.
    """

    def begin(self) -> None:
        if self.headers is not None:
            return  # already started reading the response
        while True:  # read until an answer that is not 100 Continue, skipping the 100's header block
            version, status, reason = self._read_status()
            if status != http.client.CONTINUE:
                break
            _read_fields(self.fp)
        self.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise http.client.UnknownProtocol(version)
        self.headers = self.msg = _read_fields(self.fp)
        transfer = self.headers.get("transfer-encoding")
        self.chunked = bool(transfer) and transfer.lower() == "chunked"
        if self.chunked:
            self.chunk_left = None
        self.will_close = self._check_close()
        self.length = None
        length = self.headers.get("content-length")
        if length and not self.chunked:
            try:
                self.length = int(length)
            except ValueError:
                self.length = None
            else:
                if self.length < 0:
                    self.length = None
        if (
            status in (http.client.NO_CONTENT, http.client.NOT_MODIFIED)
            or 100 <= status < 200
            or self._method == "HEAD"
        ):
            self.length = 0
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True


class _Connection(urllib3.connection.HTTPConnection):
    response_class = _Response

    def connect(self) -> None:
        try:
            super().connect()
        except Exception as exc:
            raise _NeverSent(str(exc)) from exc


class _TLSConnection(urllib3.connection.HTTPSConnection):
    response_class = _Response

    def connect(self) -> None:
        try:
            super().connect()
        except Exception as exc:
            raise _NeverSent(str(exc)) from exc


class _Pool(urllib3.HTTPConnectionPool):
    ConnectionCls = _Connection


class _TLSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _TLSConnection


def _pool_manager(
    endpoint_url: str, *, timeout: urllib3.Timeout, ca_bundle: str | None, max_connections: int
) -> tuple[urllib3.PoolManager, str | None]:
    """urllib3's pools for the endpoint, through the proxy the environment names for it (as botocore reads it).

    TLS verifies the certificate and the host name against ``AWS_CA_BUNDLE``
    (or ``ca_bundle`` in the AWS config) when set, else the system's CAs.
    Returns the manager and the proxy used (for messages), if any.
    """
    scheme = urllib.parse.urlsplit(endpoint_url).scheme
    tls = ssl.create_default_context(cafile=ca_bundle) if scheme == "https" else None
    options: dict[str, Any] = {"num_pools": 4, "maxsize": max_connections, "timeout": timeout, "retries": False}
    proxy = get_environ_proxies(endpoint_url).get(scheme)
    manager: urllib3.PoolManager
    if proxy:
        parsed = urllib3.util.parse_url(proxy if "://" in proxy else f"http://{proxy}")
        headers = {}
        if parsed.auth:
            headers = urllib3.make_headers(proxy_basic_auth=urllib.parse.unquote(parsed.auth))
        manager = urllib3.ProxyManager(
            parsed._replace(auth=None).url, proxy_headers=headers, ssl_context=tls, **options
        )
    else:
        manager = urllib3.PoolManager(ssl_context=tls, **options)
    # botocore's own session swaps the pool classes the same way (for its connection classes).
    manager.pool_classes_by_scheme = {"http": _Pool, "https": _TLSPool}
    return manager, proxy or None


class DirectClient:
    """A botocore-compatible S3 client for one endpoint: the calls :class:`S3Store` makes, and no others.

    Thread-safe: urllib3's pools are; the signer and the credentials
    provider are shared and hold no per-request state; a region redirect
    replaces one immutable pair. The capitalised argument names are
    botocore's, so that :class:`S3Store` makes one call whichever client it
    holds.
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
        max_connections: int = 16,
    ) -> None:
        parts = urllib.parse.urlsplit(endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidInput(
                f"endpoint URL {redacted(endpoint_url)!r}: give http://HOST[:PORT] or https://HOST[:PORT]"
            )
        self.meta = _Meta(endpoint_url.rstrip("/"), region)
        self._scheme = parts.scheme
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._base_path = parts.path.rstrip("/")
        self._credentials = credentials
        self._signer = Signer()
        host = parts.hostname
        on_aws = host == "amazonaws.com" or host.endswith(".amazonaws.com")
        self._virtual = addressing_style == "virtual" or (addressing_style == "auto" and on_aws)
        self._aws_regional = _AWS_S3_HOST.fullmatch(host) is not None
        # (signing region, host): replaced whole when a region redirect is followed.
        self._where = (region, host)
        self._pools: dict[str, urllib3.HTTPConnectionPool] = {}
        self._manager, self._proxy = _pool_manager(
            endpoint_url,
            timeout=urllib3.Timeout(connect=connect_timeout_s, read=read_timeout_s),
            ca_bundle=ca_bundle,
            max_connections=max_connections,
        )
        # Plain HTTP without a proxy skips urllib3 (steadqd.s3.store.plain_http); one pool per host:port.
        self._plain = parts.scheme == "http" and self._proxy is None
        self._plain_pools: dict[str, PlainPool] = {}
        self._timeouts = (connect_timeout_s, read_timeout_s)
        self._max_connections = max_connections

    # -- the calls S3Store makes -------------------------------------------------------

    def put_object(
        self, *, Bucket: str, Key: str, Body: bytes, ChecksumSHA256: str, **condition: str
    ) -> dict[str, Any]:
        headers = {"x-amz-checksum-sha256": ChecksumSHA256, "Content-Type": "application/octet-stream"}
        if "IfNoneMatch" in condition:
            headers["If-None-Match"] = condition["IfNoneMatch"]
        if "IfMatch" in condition:
            headers["If-Match"] = condition["IfMatch"]
        status, answer, _ = self._whole(self._exchange("PUT", Bucket, Key, headers=headers, body=Body))
        return {"ETag": answer.get("etag"), "ResponseMetadata": {"HTTPStatusCode": status}}

    def get_object(self, *, Bucket: str, Key: str, **extra: str) -> dict[str, Any]:
        headers = {}
        if "Range" in extra:
            headers["Range"] = extra["Range"]
        if "IfNoneMatch" in extra:
            headers["If-None-Match"] = extra["IfNoneMatch"]
        response, answer = self._exchange("GET", Bucket, Key, headers=headers)
        return {**self._object_meta(answer), "ContentRange": answer.get("content-range"), "Body": _Body(self, response)}

    def head_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        _, answer, _ = self._whole(self._exchange("HEAD", Bucket, Key))
        return self._object_meta(answer)

    def delete_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        status, _, _ = self._whole(self._exchange("DELETE", Bucket, Key))
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
        _, _, body = self._whole(self._exchange("GET", Bucket, None, query=query))
        return _parse_listing(body)

    def create_bucket(self, *, Bucket: str, CreateBucketConfiguration: dict[str, str] | None = None) -> dict[str, Any]:
        body = b""
        if CreateBucketConfiguration is not None:
            constraint = CreateBucketConfiguration["LocationConstraint"]
            body = (
                '<CreateBucketConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                f"<LocationConstraint>{constraint}</LocationConstraint></CreateBucketConfiguration>"
            ).encode()
        self._whole(self._exchange("PUT", Bucket, None, body=body))
        return {}

    def close(self) -> None:
        self._pools = {}
        self._manager.clear()
        plain, self._plain_pools = self._plain_pools, {}
        for pool in plain.values():
            pool.close()

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

    def _target(self, host: str, bucket: str, key: str | None, query: list[tuple[str, str]]) -> tuple[str, str]:
        """The Host header and the request target (path and query), as signed and as sent."""
        if ":" in host:
            host = f"[{host}]"  # an IPv6 literal
        if self._port != (443 if self._scheme == "https" else 80):
            host = f"{host}:{self._port}"
        path = self._base_path
        if self._virtual:
            host = f"{bucket}.{host}"
        else:
            path += f"/{bucket}"
        path += "/" if key is None else "/" + _quote_key(key)
        if query:
            path += "?" + "&".join(f"{_quote(name)}={_quote(value)}" for name, value in query)
        return host, path

    def _sign(
        self, method: str, region: str, host: str, target: str, headers: dict[str, str], body: bytes
    ) -> dict[str, str]:
        credentials = self._credentials.get_frozen_credentials() if self._credentials is not None else None
        if credentials is None:
            raise NoCredentialsError()
        headers["Host"] = host
        return self._signer.sign(credentials, method, region, target, headers, body)

    def _whole(self, exchanged: tuple[_Answer, dict[str, str]]) -> tuple[int, dict[str, str], bytes]:
        """An :meth:`_exchange`'s status, headers and body, the body read to the end (which frees the connection)."""
        response, answer = exchanged
        data = _Body(self, response).read()
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
    ) -> tuple[_Answer, dict[str, str]]:
        """Send one request and read the answer's status and headers; the body is the caller's to read.

        An error status is raised here (its body, the engine's short XML,
        read whole), after following one region redirect: the store refused
        the request unprocessed, so sending it again, signed for the
        bucket's region, is safe for a write too (botocore does the same).
        """
        for redirects_left in (1, 0):
            region, host = self._where
            host, target = self._target(host, bucket, key, query or [])
            signed = self._sign(method, region, host, target, dict(headers or {}), body)
            response = self._urlopen(method, f"{self._scheme}://{host}{target}", body, signed)
            answer = _answer_fields(response)
            if response.status < 300:
                return response, answer
            data = _Body(self, response).read()
            moved = answer.get("x-amz-bucket-region")
            if redirects_left and response.status in _REGION_REDIRECTS and moved and moved != region:
                if self._move(moved):
                    continue
            raise _client_error(response.status, answer, data, method)
        raise AssertionError("unreachable: the second answer returns or raises")

    def _move(self, region: str) -> bool:
        """Sign for ``region`` from now on (and, on Amazon S3, send to its endpoint); False if it is no region name."""
        if len(region) > 40 or not _REGION.fullmatch(region):
            return False  # a host name is built from it: never one with a dot, a slash or a port
        host = f"s3.{region}.amazonaws.com" if self._aws_regional else self._where[1]
        self._where = (region, host)
        self.meta = _Meta(self.meta.endpoint_url, region)
        return True

    def _urlopen(self, method: str, url: str, body: bytes, headers: dict[str, str]) -> _Answer:
        """One request through urllib3 (or, plain HTTP without a proxy, :class:`PlainPool`), never retried or redirected.

        Without a proxy the host's pool is asked directly with the request
        target: the pool manager would parse the URL and look the pool up
        again for every request, a tenth of urllib3's own CPU per request.
        """
        if self._plain:
            return self._plain_request(method, url, body, headers)
        options: dict[str, Any] = {
            "body": body if method in ("PUT", "POST") else None,
            "headers": headers,
            "preload_content": False,
            "decode_content": False,
            "redirect": False,
            "retries": False,
        }
        try:
            if self._proxy is not None:
                return self._manager.urlopen(method, url, **options)
            authority, target = _authority_and_target(url)
            pool = self._pools.get(authority)
            if pool is None:
                parsed = urllib3.util.parse_url(url)
                pool = self._pools[authority] = self._manager.connection_from_host(
                    parsed.host, parsed.port, parsed.scheme
                )
            return pool.urlopen(method, target, assert_same_host=False, **options)
        except _NeverSent as exc:
            raise self._not_sent(exc) from exc.__cause__
        except (urllib3.exceptions.HTTPError, OSError, HTTPException) as exc:
            raise self._lost(exc) from exc

    def _plain_request(self, method: str, url: str, body: bytes, headers: dict[str, str]) -> PlainAnswer:
        authority, target = _authority_and_target(url)
        pool = self._plain_pools.get(authority)
        if pool is None:
            parsed = urllib3.util.parse_url(url)
            connect_s, read_s = self._timeouts
            made = PlainPool(
                (parsed.host or "").strip("[]"),
                parsed.port or 80,
                connect_timeout_s=connect_s,
                read_timeout_s=read_s,
                maxsize=self._max_connections,
                response_class=_Response,
            )
            # setdefault (atomic): two threads asking at once share one pool, none left unclosed by close().
            pool = self._plain_pools.setdefault(authority, made)
        try:
            return pool.request(method, target, headers, body)
        except _NeverSent as exc:
            raise self._not_sent(exc) from exc.__cause__
        except (OSError, HTTPException) as exc:
            raise self._lost(exc) from exc

    def _not_sent(self, exc: _NeverSent) -> Exception:
        """botocore's exception for a connection that never opened: each is a ``ConnectionError``, "nothing sent"."""
        cause, endpoint = exc.__cause__, self.meta.endpoint_url
        if self._proxy is not None:
            return ProxyConnectionError(proxy_url=redacted(self._proxy), error=str(exc))
        if isinstance(cause, (ssl.SSLError, ssl.CertificateError, urllib3.exceptions.SSLError)):
            return SSLError(endpoint_url=endpoint, error=str(exc))
        if isinstance(
            cause, urllib3.exceptions.NewConnectionError
        ):  # refused, unresolvable (a ConnectTimeoutError too)
            return EndpointConnectionError(endpoint_url=endpoint, error=str(exc))
        if isinstance(cause, (urllib3.exceptions.ConnectTimeoutError, TimeoutError)):
            return ConnectTimeoutError(endpoint_url=endpoint, error=str(exc))
        return EndpointConnectionError(endpoint_url=endpoint, error=str(exc))

    def _lost(self, exc: Exception) -> Exception:
        """botocore's exception for a failure after the request was handed to the socket: the outcome is unknown."""
        if isinstance(exc, (urllib3.exceptions.ReadTimeoutError, TimeoutError)):
            return ReadTimeoutError(endpoint_url=self.meta.endpoint_url, error=exc)
        return ConnectionClosedError(endpoint_url=self.meta.endpoint_url, error=exc)


def _authority_and_target(url: str) -> tuple[str, str]:
    """``http://host:port/b/k?q`` -> ``("host:port", "/b/k?q")``: the pool's key and the request target."""
    authority, slash, target = url.partition("://")[2].partition("/")
    return authority, slash + target


def _answer_fields(response: _Answer) -> dict[str, str]:
    """The answer's headers by lowercased name (the last value of a repeated one).

    Read from the header block :class:`_Response` parsed, where it can be
    (urllib3 keeps it as ``_original_response``, as requests reads it): a
    dictionary made while parsing, rather than walking urllib3's copy.
    """
    if isinstance(response, PlainAnswer):
        fields = response.msg  # always a _Fields: the plain pool reads with _Response
    else:
        fields = getattr(getattr(response, "_original_response", None), "msg", None)
        if not isinstance(fields, _Fields):
            return {name.lower(): value for name, value in response.headers.items()}
    last: dict[str, str] = fields.last
    return last


class _Body:
    """An answer's body, read on demand: a bounded reader takes only the bytes it wants.

    A connection goes back to the pool for the next request only once its
    answer was read to the end; one closed with bytes still unread is
    closed, since they would otherwise be taken for the next answer.
    """

    def __init__(self, client: DirectClient, response: _Answer) -> None:
        self._client = client
        self._response = response

    def read(self, amt: int | None = None) -> bytes:
        try:
            data = self._response.read() if amt is None else self._response.read(amt)
        except (urllib3.exceptions.HTTPError, OSError, HTTPException) as exc:
            self._response.close()
            self._response.release_conn()
            raise self._client._lost(exc) from exc
        if amt is None:
            self.close()
        return data

    def close(self) -> None:
        if not self._response.closed:
            self._response.close()  # bytes left unread: the connection cannot carry another answer
        self._response.release_conn()


def _client_error(status: int, answer: dict[str, str], data: bytes, method: str) -> ClientError:
    """The error answer as botocore reports it: the S3 code from the XML body, else the status (HEAD has no body)."""
    code = answer.get("x-amz-error-code") or str(status)
    message = responses.get(status, "")
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
