"""The S3 implementation of :class:`~steadqd.s3.store.base.ObjectStore`, over botocore.

Why botocore and not boto3: boto3's client is botocore's with a session
wrapper, and its resource layer adds objects per call and nothing the
protocol needs; ``benchmarks/s3_store.py`` measures the per-operation cost
(docs/stowq.md quotes it).

Why retries are ours: botocore's retry handler would re-send a conditional
PUT after a timeout, and the second attempt's 412 would then report a write
we won as one we lost. So botocore makes exactly one attempt, and this
module retries only what is safe to repeat: reads, and writes that provably
never left (the connection was refused or never opened). A write that left
and got no verdict is ``OutcomeUnknown`` with a :class:`PendingWrite`
ticket, and the protocol resolves it by reading the key.

Settings come from the standard AWS places only, never from a queue's YAML:
``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``), ``AWS_REGION``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, the shared
credentials and config files, or a credentials file the caller names. The
instance-metadata, container, SSO and process credential providers are
switched off: each would reach for a host the operator did not name.
"""

from __future__ import annotations

import base64
import calendar
import functools
import os
import pwd
import random
import re
import stat
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

try:
    import botocore.handlers
    import botocore.loaders
    import botocore.parsers
    import botocore.session
    import botocore.utils
    from botocore.config import Config
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        NoCredentialsError,
        ParamValidationError,
        PartialCredentialsError,
    )
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.parsers import ResponseParserError
except ModuleNotFoundError as missing:  # an extra, not a dependency (pyproject.toml)
    raise ModuleNotFoundError(
        "queues on an object store need botocore 1.36 or later: pip install 'steadqd[s3]'", name=missing.name
    ) from missing

from steadqd.errors import (
    AlreadyExists,
    ChecksumMismatch,
    ErrorKind,
    InvalidInput,
    NotCommitted,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    SteadQError,
    StoreProfileViolation,
)
from steadqd.s3.store.base import (
    LIST_PAGE_MAX,
    S3_GENERIC,
    Committed,
    ListPage,
    ObjectMeta,
    PendingWrite,
    StoredObject,
    StoreProfile,
    check_if_match,
    check_list_limit,
    check_max_bytes,
    check_sha256,
    parse_last_modified,
    quantize,
)
from steadqd.text import redacted

__all__ = ["S3Settings", "S3Store"]

T = TypeVar("T")

TRANSPORTS = ("botocore", "direct")

# Credential sources kept: the environment and the two shared files. The rest
# of botocore's chain (IMDS at 169.254.169.254, ECS, SSO, credential_process,
# STS role assumption) would contact hosts nobody configured.
_CREDENTIAL_SOURCES = ("env", "shared-credentials-file", "config-file")
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# botocore errors raised while building or signing a request, before it is sent.
_BEFORE_SEND = (NoCredentialsError, PartialCredentialsError, ParamValidationError)
_CHECKSUM_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch", "InvalidChecksum"})
# botocore handlers that do nothing for the requests this store sends (no SSE-C
# keys, no user metadata, no idempotency tokens, not inside Lambda, checksum
# validation only when required; S3Settings checks the bucket name once), yet
# each is an event dispatch per request. benchmarks/s3_store.py measures them.
_IDLE_HANDLERS = frozenset(
    {
        "sse_md5",
        "validate_bucket_name",
        "validate_ascii_metadata",
        "generate_idempotent_uuid",
        "add_recursion_detection_header",
        "inject_api_version_header_if_needed",
        "_handle_request_validation_mode_member",
    }
)


@dataclass(frozen=True, slots=True)
class S3Settings:
    """Where the bucket is and how patiently to talk to it; no field ever holds a secret.

    ``endpoint_url`` and ``region`` left as None come from the AWS
    environment (``AWS_ENDPOINT_URL``, ``AWS_REGION``, the config file).
    ``credentials_file`` is a shared-credentials file (INI, as ``aws
    configure`` writes) and ``aws_profile`` the section of it to use.
    ``attempts`` bounds the retries of reads and of writes that never left.
    ``transport`` is who sends the requests: "direct" (the default),
    kept sockets (plain HTTP) or urllib3's pools (TLS, proxies) with
    botocore's signing and our own few answer parsers
    (:mod:`steadqd.s3.store.s3_direct`, about a fifth of the CPU per request), or
    "botocore"'s whole client.
    """

    bucket: str
    endpoint_url: str | None = None
    region: str | None = None
    credentials_file: str | None = None
    aws_profile: str | None = None
    addressing_style: str = "path"
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    attempts: int = 3
    max_connections: int = 16
    transport: str = "direct"

    def __post_init__(self) -> None:
        if not _BUCKET_NAME.fullmatch(self.bucket) or ".." in self.bucket:
            raise InvalidInput(
                f"bucket name {self.bucket!r} is not a valid S3 bucket name: use 3-63 lowercase letters, "
                "digits, dots and hyphens, starting and ending with a letter or digit"
            )
        if self.addressing_style not in ("path", "virtual", "auto"):
            raise InvalidInput(f"addressing_style {self.addressing_style!r}: give 'path', 'virtual' or 'auto'")
        if self.attempts < 1:
            raise InvalidInput(f"attempts {self.attempts}: at least one attempt is needed")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise InvalidInput("S3 timeouts must be positive seconds")
        if self.transport not in TRANSPORTS:
            raise InvalidInput(f"transport {self.transport!r}: give one of {', '.join(TRANSPORTS)}")


def _check_credentials_file(path: str) -> str:
    """A credentials file must be a regular file that other users cannot read (it holds a secret)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise InvalidInput(f"credentials file {path}: {exc.strerror}; name an existing file") from exc
    if not stat.S_ISREG(info.st_mode):
        raise InvalidInput(f"credentials file {path} is not a regular file")
    if info.st_mode & stat.S_IROTH:
        raise InvalidInput(
            f"credentials file {path} is readable by every user (mode {stat.S_IMODE(info.st_mode):04o}): "
            f"run chmod o-r {path}"
        )
    if not os.access(path, os.R_OK):
        # botocore skips a file it cannot read and would say "no credentials": say whose file it is instead.
        try:
            owner = pwd.getpwuid(info.st_uid).pw_name
        except KeyError:
            owner = f"uid {info.st_uid}"
        raise SteadQError(
            f"credentials file {path}: this user may not read it (it belongs to {owner}, mode "
            f"{stat.S_IMODE(info.st_mode):04o}, as the queue's daemons need it): run the command as {owner}"
            + ("" if owner == "root" else " or root"),
            ErrorKind.PERMISSION_DENIED,
        )
    return path


@functools.cache
def _data_loader() -> Any:
    """One loader per process: parsing botocore's S3 model costs ~0.3 s, and every store would redo it."""
    return botocore.loaders.create_loader()


class _HeaderParser(botocore.parsers.RestXMLParser):
    """botocore's S3 parser, reading the response headers from one plain dictionary.

    botocore looks each of an operation's header members up in a
    case-insensitive header mapping: some 60 lookups for a HEAD, each
    lowercasing and hashing a wrapper key, a tenth of a request's CPU. The
    headers are lowercased once instead; every value is still converted by
    botocore's own shape parser.
    """

    def _parse_non_payload_attrs(
        self, response: dict[str, Any], shape: Any, member_shapes: Any, final_parsed: dict[str, Any]
    ) -> None:
        headers = response["headers"]
        plain = {name.lower(): value for name, value in headers.items()}
        for name, member in member_shapes.items():
            location = member.serialization.get("location")
            if location == "header":
                value = plain.get(member.serialization.get("name", name).lower())
                if value is not None:
                    final_parsed[name] = self._parse_shape(member, value)
            elif location == "headers":
                final_parsed[name] = self._parse_header_map(member, headers)
            elif location == "statusCode":
                final_parsed[name] = self._parse_shape(member, response["status_code"])


class _ParserFactory(botocore.parsers.ResponseParserFactory):
    def create_parser(self, protocol_name: str) -> Any:
        if protocol_name == "rest-xml":
            return _HeaderParser(**self._defaults)
        return super().create_parser(protocol_name)


def _session(settings: S3Settings) -> Any:
    session = botocore.session.Session(profile=settings.aws_profile)
    session.register_component("data_loader", _data_loader())
    factory = _ParserFactory()
    factory.set_parser_defaults(timestamp_parser=parse_last_modified)
    session.register_component("response_parser_factory", factory)
    if settings.credentials_file is not None:
        session.set_config_variable("credentials_file", _check_credentials_file(settings.credentials_file))
    resolver = session.get_component("credential_provider")
    for provider in [p.METHOD for p in resolver.providers]:
        if provider not in _CREDENTIAL_SOURCES:
            resolver.remove(provider)
    return session


def _trim(client: Any) -> None:
    """Take off each request's path the work whose answer never changes for one client of one bucket.

    botocore resolves the endpoint anew for every request, walking the S3
    rule set with the call's parameters; for one endpoint, region and
    addressing style the answer depends only on the operation and the
    bucket, so it is kept per pair (botocore's provider would return the
    same object from its own cache). Not on Amazon S3 itself, whose
    region redirects botocore remembers per bucket at endpoint resolution;
    and without the private resolver (another botocore) nothing is cached,
    so the store is only slower.
    """
    for event, handler, *_ in botocore.handlers.BUILTIN_HANDLERS:
        if getattr(handler, "__name__", "") in _IDLE_HANDLERS:
            client.meta.events.unregister(event, handler)
    resolver = getattr(client, "_ruleset_resolver", None)
    host = (urllib.parse.urlsplit(client.meta.endpoint_url).hostname or "").lower()
    if resolver is None or host == "amazonaws.com" or host.endswith(".amazonaws.com"):
        return
    resolve = resolver.construct_endpoint
    known: dict[tuple[str, str | None], Any] = {}

    def construct_endpoint(operation_model: Any, call_args: Any, request_context: Any) -> Any:
        key = (operation_model.name, (call_args or {}).get("Bucket"))
        found = known.get(key)
        if found is None:
            found = known[key] = resolve(
                operation_model=operation_model, call_args=call_args, request_context=request_context
            )
        return found

    resolver.construct_endpoint = construct_endpoint


def _etag(raw: str | None) -> str:
    return (raw or "").strip('"')


def _store_time_ns(value: datetime | None, granularity_ns: int) -> int:
    if value is None:
        return 0
    ns = calendar.timegm(value.utctimetuple()) * 1_000_000_000 + value.microsecond * 1000
    return quantize(ns, granularity_ns)


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class _Retry(Exception):
    """A failure that is safe to repeat; ``error`` is what the caller gets once the attempts run out."""

    def __init__(self, error: SteadQError) -> None:
        super().__init__(error.message)
        self.error = error


def _botocore_client(session: Any, settings: S3Settings, region: str) -> Any:
    config = Config(
        connect_timeout=settings.connect_timeout_s,
        read_timeout=settings.read_timeout_s,
        retries={"mode": "standard", "total_max_attempts": 1},
        s3={"addressing_style": settings.addressing_style},
        max_pool_connections=settings.max_connections,
        # A ranged GET of a checksummed object returns the whole object's
        # checksum beside part of it; automatic validation would fail it.
        # The per-PUT SHA-256 below is explicit, and reads are re-hashed
        # by the protocol (every record carries its digest).
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        # Every parameter is built here from checked values; validating
        # them again against the model costs more than a LIST parse.
        parameter_validation=False,
        user_agent_extra="steadqd",
    )
    client = session.create_client("s3", region_name=region, endpoint_url=settings.endpoint_url, config=config)
    # botocore asks for "100 Continue" before every PUT body: a round trip
    # per write that a record of a few hundred bytes does not need.
    client.meta.events.unregister("before-call.s3", botocore.handlers.add_expect_header)
    _trim(client)
    return client


def _direct_client(session: Any, settings: S3Settings, region: str) -> Any:
    """Our own connections, signed by botocore; the endpoint found where botocore's client would find it."""
    from botocore.configprovider import ConfiguredEndpointProvider

    from steadqd.s3.store.s3_direct import DirectClient

    endpoint = settings.endpoint_url
    if endpoint is None:
        provider = ConfiguredEndpointProvider(
            full_config=session.full_config, scoped_config=session.get_scoped_config(), client_name="s3"
        )
        endpoint = provider.provide() or f"https://s3.{region}.amazonaws.com"
    return DirectClient(
        endpoint_url=endpoint,
        region=region,
        credentials=session.get_credentials(),
        addressing_style=settings.addressing_style,
        connect_timeout_s=settings.connect_timeout_s,
        read_timeout_s=settings.read_timeout_s,
        ca_bundle=session.get_config_variable("ca_bundle"),
        max_connections=settings.max_connections,
    )


class S3Store:
    """One bucket behind an S3 endpoint. Thread-safe: botocore clients are, and this holds nothing else mutable."""

    def __init__(self, settings: S3Settings, *, profile: StoreProfile = S3_GENERIC) -> None:
        self._settings = settings
        self._profile = profile
        session = _session(settings)
        if session.get_credentials() is None:
            raise InvalidInput(
                "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, "
                "or name a credentials file (never put the secret in a queue's configuration)"
            )
        region = settings.region or session.get_config_variable("region") or "us-east-1"
        self._bucket = settings.bucket
        if settings.transport == "direct":
            self._client = _direct_client(session, settings, region)
        else:
            self._client = _botocore_client(session, settings, region)
        self._location = f"s3://{settings.bucket} at {redacted(self._client.meta.endpoint_url)}"

    @property
    def profile(self) -> StoreProfile:
        return self._profile

    @property
    def location(self) -> str:
        return self._location

    @property
    def bucket(self) -> str:
        return self._bucket

    def close(self) -> None:
        self._client.close()

    # -- one request, classified --------------------------------------------------------

    def _attempts(self, call: Callable[[], T]) -> T:
        """Run ``call`` until it succeeds or fails in a way that is not safe to repeat, at most ``attempts`` times."""
        for attempt in range(self._settings.attempts):
            try:
                return call()
            except _Retry as retry:
                if attempt + 1 == self._settings.attempts:
                    raise retry.error from retry.__cause__
                time.sleep(min(1.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable: the loop returns or raises")

    def _write_error(self, exc: Exception, ticket: PendingWrite) -> Exception:
        """Sort a failed write into the outcome classes; a ``_Retry`` when it provably never left."""
        what = ticket.describe()
        if isinstance(exc, ClientError):
            status, code = _status(exc), _code(exc)
            if status == 412:
                if ticket.op == "put_if_absent":
                    return AlreadyExists(f"{ticket.key}: an object is already there")
                return PreconditionFailed(f"{ticket.key}: not at version {ticket.if_match} (or gone)")
            if status == 404 and code == "NoSuchBucket":
                return NotFound(f"bucket {self._bucket} does not exist at {redacted(self._client.meta.endpoint_url)}")
            if status == 404 and ticket.op == "put_if_match":
                return PreconditionFailed(f"{ticket.key}: no object to replace (expected version {ticket.if_match})")
            if status == 409:
                return _Retry(NotCommitted(f"{what}: a conflicting write was in progress (HTTP 409); nothing written"))
            if code in _CHECKSUM_CODES:
                return ChecksumMismatch(f"{what}: the store refused the body's SHA-256 ({code}); nothing written")
            if status == 403:
                return NotCommitted(
                    f"{what}: access denied ({code}); check the credentials' rights on the bucket",
                    ErrorKind.PERMISSION_DENIED,
                )
            if status == 501:
                return StoreProfileViolation(
                    f"the store at {self._location} does not implement {what} ({code})", primitive="conditional write"
                )
            if status >= 500:
                return OutcomeUnknown(
                    f"{what}: HTTP {status} {code} after the request was sent; re-read the key", ticket
                )
            return NotCommitted(f"{what}: refused with HTTP {status} {code}")
        if isinstance(exc, BotoConnectionError):
            return _Retry(NotCommitted(f"{what}: could not connect ({redacted(str(exc))}); nothing was sent"))
        if isinstance(exc, _BEFORE_SEND):
            return NotCommitted(f"{what}: {redacted(str(exc))}; nothing was sent")
        # Anything else (a timeout, a lost connection, an answer botocore could
        # not parse) may have come after the store applied the write.
        return OutcomeUnknown(f"{what}: {redacted(str(exc))}; re-read the key", ticket)

    def _read_error(self, exc: Exception, what: str) -> Exception:
        if isinstance(exc, ClientError):
            status, code = _status(exc), _code(exc)
            if status == 404 and code == "NoSuchBucket":
                return NotFound(f"bucket {self._bucket} does not exist at {redacted(self._client.meta.endpoint_url)}")
            if status in (404, 416):
                return NotFound(f"{what}: no such object (HTTP {status})")
            if status == 403:
                return NotCommitted(
                    f"{what}: access denied ({code}); check the credentials' rights on the bucket",
                    ErrorKind.PERMISSION_DENIED,
                )
            if status >= 500:
                return _Retry(NotCommitted(f"{what}: HTTP {status} {code}"))
            return NotCommitted(f"{what}: refused with HTTP {status} {code}")
        return _Retry(NotCommitted(f"{what}: {redacted(str(exc))}"))

    def _write(self, ticket: PendingWrite, request: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        def once() -> dict[str, Any]:
            try:
                return request()
            except (ClientError, BotoCoreError, ResponseParserError) as exc:
                raise self._write_error(exc, ticket) from exc

        return self._attempts(once)

    def _read(self, what: str, request: Callable[[], T]) -> T:
        def once() -> T:
            try:
                return request()
            except (ClientError, BotoCoreError, ResponseParserError) as exc:
                raise self._read_error(exc, what) from exc

        return self._attempts(once)

    # -- writes ----------------------------------------------------------------------

    def _put(
        self, key: str, body: bytes, sha256: bytes | None, condition: dict[str, str], ticket: PendingWrite
    ) -> Committed:
        checksum = base64.b64encode(check_sha256(sha256, body)).decode("ascii")
        answer = self._write(
            ticket,
            lambda: self._client.put_object(
                Bucket=self._bucket, Key=key, Body=body, ChecksumSHA256=checksum, **condition
            ),
        )
        return Committed(key, _etag(answer.get("ETag")))

    def put_if_absent(self, key: str, body: bytes, *, sha256: bytes | None = None) -> Committed:
        body = bytes(body)
        ticket = PendingWrite("put_if_absent", key, check_sha256(sha256, body))
        return self._put(key, body, sha256, {"IfNoneMatch": "*"}, ticket)

    def put_if_match(self, key: str, body: bytes, etag: str, *, sha256: bytes | None = None) -> Committed:
        body = bytes(body)
        check_if_match(self._profile, key, etag)
        ticket = PendingWrite("put_if_match", key, check_sha256(sha256, body), etag)
        return self._put(key, body, sha256, {"IfMatch": self._if_match(etag)}, ticket)

    def delete(self, key: str) -> None:
        def request() -> dict[str, Any]:
            try:
                return self._client.delete_object(Bucket=self._bucket, Key=key)
            except ClientError as exc:
                if _status(exc) == 404 and _code(exc) != "NoSuchBucket":
                    return {}  # S3 answers 204 for an absent key; some engines 404
                raise

        self._write(PendingWrite("delete", key, None), request)

    def _if_match(self, etag: str) -> str:
        return f'"{etag}"' if self._profile.if_match_quoted else etag

    # -- reads -----------------------------------------------------------------------

    def _meta(self, key: str, answer: dict[str, Any], size: int) -> ObjectMeta:
        return ObjectMeta(
            key,
            _etag(answer.get("ETag")),
            size,
            _store_time_ns(answer.get("LastModified"), self._profile.granularity_ns),
        )

    def get(self, key: str, byte_range: tuple[int, int] | None = None, *, max_bytes: int | None = None) -> StoredObject:
        check_max_bytes(key, byte_range, max_bytes)
        if byte_range is not None:
            start, end = byte_range
            if start < 0:
                raise InvalidInput(f"byte range of {key}: start {start} is negative")
            if start >= end:
                raise NotFound(f"{key}: the range [{start}, {end}) is empty")
        return self._read(f"get {key}", lambda: self._get_once(key, byte_range, max_bytes))

    def _get_once(
        self, key: str, byte_range: tuple[int, int] | None, max_bytes: int | None = None, **condition: str
    ) -> StoredObject:
        extra = dict(condition)
        if byte_range is not None:
            extra["Range"] = f"bytes={byte_range[0]}-{byte_range[1] - 1}"
        elif max_bytes is not None:
            # The object's head only: a clamped answer for a shorter object, at most max_bytes for a longer.
            extra["Range"] = f"bytes=0-{max_bytes - 1}"
        try:
            answer = self._client.get_object(Bucket=self._bucket, Key=key, **extra)
        except ClientError as exc:
            if max_bytes is not None and _status(exc) == 416:
                return self._empty(key)
            raise
        stream = answer["Body"]
        try:
            # A bounded read stops at max_bytes even when the engine ignored the Range and sent it all;
            # closing the stream then drops the connection instead of draining the rest.
            body = stream.read() if max_bytes is None else stream.read(max_bytes)
        finally:
            stream.close()
        if max_bytes is not None:
            return StoredObject(self._meta(key, answer, self._whole_size(answer, body)), body)
        if byte_range is None:
            return StoredObject(self._meta(key, answer, len(body)), body)
        return StoredObject(self._meta(key, answer, self._ranged_size(key, answer, byte_range, body)), body)

    def _empty(self, key: str) -> StoredObject:
        """A bounded GET answered 416: S3 has no bytes [0, n) of an empty object, which is not absence."""
        answer = self._client.head_object(Bucket=self._bucket, Key=key)
        size = int(answer.get("ContentLength", 0))
        if size:  # rewritten between the two requests: read it again
            raise _Retry(NotCommitted(f"get {key}: the object changed while it was read"))
        return StoredObject(self._meta(key, answer, 0), b"")

    def _whole_size(self, answer: dict[str, Any], body: bytes) -> int:
        """The whole object's size for a bounded read: Content-Range's total, else the 200's Content-Length."""
        content_range = answer.get("ContentRange")
        if content_range is not None:
            total = content_range.rpartition("/")[2]
            if total.isdigit():
                return int(total)
        length = answer.get("ContentLength")
        return int(length) if length is not None else len(body)

    def _ranged_size(self, key: str, answer: dict[str, Any], byte_range: tuple[int, int], body: bytes) -> int:
        """The whole object's size from Content-Range; a clamped slice is absence, an ignored Range a violation."""
        start, end = byte_range
        content_range = answer.get("ContentRange")
        if content_range is None:
            if start == 0 and len(body) == end:
                return len(body)
            raise StoreProfileViolation(
                f"{self._location} answered a GET of bytes [{start}, {end}) of {key} with the whole object",
                primitive="ranged GET",
            )
        total = content_range.rpartition("/")[2]
        if not total.isdigit():
            raise StoreProfileViolation(
                f"{self._location} sent Content-Range {content_range!r} for {key}", primitive="ranged GET"
            )
        if len(body) != end - start:
            raise NotFound(f"{key}: no bytes [{start}, {end}) in an object of {total} bytes")
        return int(total)

    def get_if_none_match(self, key: str, etag: str) -> StoredObject | None:
        def once() -> StoredObject | None:
            try:
                return self._get_once(key, None, None, IfNoneMatch=f'"{etag}"')
            except ClientError as exc:
                if _status(exc) == 304:
                    return None
                raise

        return self._read(f"get {key}", once)

    def head(self, key: str) -> ObjectMeta:
        def once() -> ObjectMeta:
            answer = self._client.head_object(Bucket=self._bucket, Key=key)
            return self._meta(key, answer, int(answer.get("ContentLength", 0)))

        return self._read(f"head {key}", once)

    def list_page(self, prefix: str, *, start_after: str | None = None, limit: int = LIST_PAGE_MAX) -> ListPage:
        limit = check_list_limit(limit)
        if limit == 0:
            return ListPage((), None)
        request: dict[str, Any] = {"Bucket": self._bucket, "Prefix": prefix, "MaxKeys": limit}
        if start_after is not None:
            request["StartAfter"] = start_after
        answer = self._read(f"list {prefix}", lambda: self._client.list_objects_v2(**request))
        items: list[ObjectMeta] = []
        last = None
        for entry in answer.get("Contents", ()):
            last = entry["Key"]
            if start_after is not None and last <= start_after:
                continue  # some engines treat StartAfter as inclusive; the contract is strictly after
            items.append(self._meta(last, entry, int(entry.get("Size", 0))))
        more = bool(answer.get("IsTruncated")) and last is not None
        return ListPage(tuple(items), last if more else None)

    # -- for tests and the demo ------------------------------------------------------------

    def create_bucket(self) -> None:
        """Create the bucket unless this account already owns it (tests, the demo; never the protocol)."""
        request_args: dict[str, Any] = {"Bucket": self._bucket}
        region = self._client.meta.region_name
        if region and region != "us-east-1":
            request_args["CreateBucketConfiguration"] = {"LocationConstraint": region}

        def request() -> dict[str, Any]:
            try:
                return self._client.create_bucket(**request_args)
            except ClientError as exc:
                if _code(exc) == "BucketAlreadyOwnedByYou":
                    return {}
                raise

        self._write(PendingWrite("create_bucket", self._bucket, None), request)
