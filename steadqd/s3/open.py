"""Queue URLs ``s3://BUCKET/PREFIX``: parse one, and open or create the bucket queue it names.

Why the endpoint and the credentials are not in the URL: a URL is printed,
logged and pasted into YAML, so anything in it is public. They come from
the standard AWS settings (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``,
``AWS_PROFILE``, the shared credentials file, or one named by
``credentials_file``), as ``steadqd.s3.store.s3`` reads them; a queue
opened by its configured name also takes ``endpoint_url`` and ``region``
from the units' environment file (``steadqd.queue_names``), never a key. Which
engine's quirks to expect is the same kind of setting: ``store_profile``
(a daemon's ``s3:`` section) or ``STEADQ_STORE_PROFILE`` in the
environment, so that every ``steadq`` command of a shell speaks to the
engine the same way; ``STEADQ_S3_TRANSPORT`` likewise picks who sends the
requests ("botocore", or "direct": ``steadqd.s3.store.s3_direct``).

The first request to a store answers the questions an operator has when a
queue will not open (is the endpoint there, are the credentials good, does
the bucket exist), so its failure is translated here into one sentence that
names the thing and what to do, instead of botocore's wording.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from steadqd.errors import (
    ErrorKind,
    InvalidInput,
    NotCommitted,
    NotFound,
    NotSupportedHere,
    SteadQError,
    StoreProfileViolation,
)
from steadqd.s3.backend import BucketBackend
from steadqd.s3.layout import DEFAULT_FORMAT, init_layout, open_layout
from steadqd.s3.store.base import CEPH_RGW, S3_GENERIC, SEAWEEDFS, StoreProfile
from steadqd.text import redacted

__all__ = ["PROFILE_VARIABLE", "SCHEME", "BucketURL", "init_bucket_queue", "open_bucket_queue", "parse_url"]

SCHEME = "s3"
PROFILE_VARIABLE = "STEADQ_STORE_PROFILE"
TRANSPORT_VARIABLE = "STEADQ_S3_TRANSPORT"
PROFILES: dict[str, StoreProfile] = {p.name: p for p in (S3_GENERIC, SEAWEEDFS, CEPH_RGW)}
# Options of the handle itself (BucketQueue and BucketBackend), passed through: the
# sweeper's retentions are the same settings, in seconds, as a filesystem handle takes.
_HANDLE_OPTIONS = (
    "floor_staleness_s",
    "monotonic",
    "sleep",
    "first_shard",
    "idle_poll_max",
    "doorbell_interval",
    "receipt_retention",
    "dead_retention",
    "temp_ttl",
)
# Filesystem options that only relax something a bucket never does (postpone
# fsyncs, accept a weak filesystem): every create is durable when answered, so they are moot.
_MOOT = ("deferred", "allow_unsupported_fs")
# Filesystem options that demand something a bucket has no such thing for: refused when set.
_FS_ONLY = ("shared", "max_clock_skew")
# botocore error codes that mean the credentials themselves were refused.
_BAD_CREDENTIALS = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"})
_CREDENTIAL_HELP = (
    "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or the credentials file named in the config)"
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BucketURL:
    """``s3://BUCKET/PREFIX``; ``prefix`` is "" (the whole bucket) or ends with "/"."""

    bucket: str
    prefix: str

    def __str__(self) -> str:
        return f"{SCHEME}://{self.bucket}/{self.prefix}".rstrip("/")


def parse_url(target: str) -> BucketURL:
    """The bucket and prefix of a queue URL; InvalidInput naming what is wrong with it."""
    scheme, sep, rest = target.partition("://")
    if not sep or scheme != SCHEME:
        raise InvalidInput(f"{target!r} is not an {SCHEME}:// URL; write s3://BUCKET/PREFIX")
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket or ":" in bucket:
        raise InvalidInput(
            f"{target!r}: an s3:// URL names only the bucket and prefix; the endpoint goes in AWS_ENDPOINT_URL and "
            "the credentials in the AWS settings, never in the URL"
        )
    if not bucket:
        raise InvalidInput(f"{target!r} names no bucket; write s3://BUCKET/PREFIX")
    for bad in ("?", "#", "\\"):
        if bad in rest:
            raise InvalidInput(f"{target!r}: a queue URL has no {bad!r}; write s3://BUCKET/PREFIX")
    if prefix.startswith("/") or "//" in prefix:
        raise InvalidInput(f"{target!r}: the prefix has an empty segment (two slashes in a row); remove it")
    if any(part in (".", "..") for part in prefix.split("/")):
        raise InvalidInput(f"{target!r}: the prefix has a '.' or '..' segment; an object key has no such thing")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return BucketURL(bucket, prefix)


def _settings_options(options: dict[str, Any]) -> dict[str, Any]:
    for name in _MOOT:
        options.pop(name, None)
    for name in _FS_ONLY:
        if options.pop(name, None):
            raise InvalidInput(f"{name} is an option of filesystem queues; a bucket queue has no such setting")
    return {
        name: options.pop(name)
        for name in ("credentials_file", "aws_profile", "endpoint_url", "region")
        if name in options
    }


def _chosen(given: str | None, source: str, variable: str, known: Collection[str], what: str) -> str | None:
    """``given`` if not None, else ``variable`` if set and not empty; refused, naming where it came from, unless known."""
    if given is None and os.environ.get(variable):
        given, source = os.environ[variable], variable
    if given is not None and given not in known:
        raise InvalidInput(f"{source} {given!r} is not {what}; give one of {', '.join(known)}")
    return given


def _profile(options: dict[str, Any]) -> StoreProfile:
    """The option if given, else the environment's, else the generic profile."""
    name = _chosen(
        options.pop("store_profile", None), "store profile", PROFILE_VARIABLE, PROFILES, "a known store profile"
    )
    return PROFILES[S3_GENERIC.name if name is None else name]


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def _explain(exc: SteadQError, url: BucketURL, endpoint: str, profile: StoreProfile) -> SteadQError:
    """The failure of the first requests as the operator's question and its answer; other errors unchanged."""
    from botocore.exceptions import ClientError, EndpointConnectionError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    for cause in _causes(exc):
        if isinstance(cause, ClientError):
            code = str(cause.response.get("Error", {}).get("Code", ""))
            if code == "NoSuchBucket":
                return NotFound(
                    f"bucket {url.bucket} does not exist at {endpoint}: create it (aws s3 mb s3://{url.bucket}), "
                    "or check the URL and AWS_ENDPOINT_URL"
                )
            if code in _BAD_CREDENTIALS:
                return NotCommitted(
                    f"the store at {endpoint} refused the credentials ({code}): {_CREDENTIAL_HELP}",
                    ErrorKind.PERMISSION_DENIED,
                )
            if code == "AccessDenied":
                return NotCommitted(
                    f"the credentials may not use bucket {url.bucket} at {endpoint} (AccessDenied): grant them "
                    "read, write and list on it, or use others",
                    ErrorKind.PERMISSION_DENIED,
                )
        if isinstance(cause, EndpointConnectionError | BotoConnectionError):
            return NotCommitted(
                f"cannot reach the object store at {endpoint} ({redacted(str(cause))}): check AWS_ENDPOINT_URL "
                "and that the store is running",
                ErrorKind.IO_FAILURE,
            )
    if isinstance(exc, StoreProfileViolation) and profile is S3_GENERIC:
        others = ", ".join(name for name in PROFILES if name != S3_GENERIC.name)
        return StoreProfileViolation(
            f"{str(exc).removeprefix(exc.primitive + ': ')} (checked under the generic profile {S3_GENERIC.name!r}; for an engine with its own, set "
            f"{PROFILE_VARIABLE} to one of {others}, or store_profile in the daemon's s3: section)",
            primitive=exc.primitive,
        )
    return exc


def _build(target: str, options: dict[str, Any], make: Callable[[Any, BucketURL, dict[str, Any]], T]) -> T:
    try:
        from steadqd.s3.store.s3 import TRANSPORTS, S3Settings, S3Store
    except ModuleNotFoundError as exc:  # an install without the s3 extra: one line, no traceback
        raise NotSupportedHere(str(exc)) from None

    url = parse_url(target)
    chosen: dict[str, Any] = {}
    if transport := _chosen(None, TRANSPORT_VARIABLE, TRANSPORT_VARIABLE, TRANSPORTS, "an S3 transport"):
        chosen["transport"] = transport
    settings = S3Settings(bucket=url.bucket, **_settings_options(options), **chosen)
    profile = _profile(options)
    store = S3Store(settings, profile=profile)
    endpoint = store.location.partition(" at ")[2] or "the AWS default endpoint"
    try:
        return make(store, url, options)
    except SteadQError as exc:
        store.close()
        explained = _explain(exc, url, endpoint, profile)
        if explained is exc:
            raise
        raise explained from exc
    except BaseException:
        store.close()
        raise


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    handle = {name: options.pop(name) for name in _HANDLE_OPTIONS if name in options}
    return options, handle


def open_bucket_queue(target: str, *, certify_store: bool = False, **options: Any) -> BucketBackend:
    """Open the queue at ``s3://BUCKET/PREFIX``: read and check its FORMAT.

    Why the store is not certified here by default: the suite takes 6-7 s
    against SeaweedFS (races, a 4 MiB body, waiting out the time
    granularity), which every ``steadq`` command would pay, and ``init``
    already refused an engine that fails it. A long-lived process (a
    daemon at start) passes ``certify_store=True`` to check the engine
    it is about to trust for hours.
    """

    def make(store: Any, url: BucketURL, opts: dict[str, Any]) -> BucketBackend:
        layout_opts, handle = _split(opts)
        layout = open_layout(store, url.prefix, certify_store=certify_store, **layout_opts)
        return BucketBackend(layout, url=str(url), **handle)

    return _build(target, dict(options), make)


def init_bucket_queue(
    target: str,
    *,
    shards: int | None = None,
    terminal_width_ns: int | None = None,
    delayed_width_ns: int | None = None,
    **options: Any,
) -> BucketBackend:
    """Create the queue at ``s3://BUCKET/PREFIX`` (after certifying the store) and open it.

    ``shards`` and ``terminal_width_ns`` are the command line's ``init``
    flags; StowQ/1 wants a power of two for the first and a nonzero width.
    ``delayed_width_ns`` (as the filesystem's ``init`` names it) is the
    delayed bucket, to which a job's ``not_before`` is rounded up: the demo
    wants 1 s where a production queue keeps the default five minutes.
    """
    fmt = DEFAULT_FORMAT
    if shards is not None:
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1 or shards & (shards - 1):
            raise InvalidInput(f"shard count {shards!r}: a bucket queue needs a power of two (1, 2, 4, ... 65536)")
        fmt = replace(fmt, shard_count=shards)
    if terminal_width_ns is not None:
        if isinstance(terminal_width_ns, bool) or not isinstance(terminal_width_ns, int) or terminal_width_ns < 1:
            raise InvalidInput(f"terminal bucket width {terminal_width_ns!r} ns: give a positive number")
        fmt = replace(fmt, terminal_bucket_width_ns=terminal_width_ns)
    if delayed_width_ns is not None:
        if isinstance(delayed_width_ns, bool) or not isinstance(delayed_width_ns, int) or delayed_width_ns < 1:
            raise InvalidInput(f"delayed bucket width {delayed_width_ns!r} ns: give a positive number")
        fmt = replace(fmt, delayed_bucket_width_ns=delayed_width_ns)

    def make(store: Any, url: BucketURL, opts: dict[str, Any]) -> BucketBackend:
        layout_opts, handle = _split(opts)
        return BucketBackend(init_layout(store, url.prefix, fmt=fmt, **layout_opts), url=str(url), **handle)

    return _build(target, dict(options), make)
