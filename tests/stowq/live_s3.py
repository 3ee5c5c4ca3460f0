"""What the live S3 engines of the tests (``seaweed.py``, ``ceph.py``) have in common.

Both gateways accept the one throw-away key below, and clients get it the way
an operator gives it: a shared-credentials file (mode 0600), or the standard
``AWS_*`` variables. So the settings, the store and the environment of a
server are the same code whichever engine answers; only the engine's profile
differs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from steadqd.errors import NotCommitted, NotFound
from steadqd.s3.store.base import StoreProfile
from steadqd.s3.store.s3 import S3Settings, S3Store

ACCESS_KEY = "steadqtest"
SECRET_KEY = "steadqtest-not-a-secret"  # a throw-away identity of a throw-away server
REGION = "us-east-1"
READY_PROBE_BUCKET = "steadq-ready-probe"


def write_credentials(root: Path) -> Path:
    """The test key as an AWS shared-credentials file, 0600 from its creation (the store never sees the secret)."""
    credentials = root / "aws-credentials"
    fd = os.open(credentials, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"[default]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n")
    return credentials


class Gateway:
    """How a client reaches a running test gateway; mixed into each engine's dataclass, which sets the fields."""

    endpoint: str
    credentials_file: Path
    default_profile: ClassVar[StoreProfile]

    def settings(self, bucket: str) -> S3Settings:
        return S3Settings(
            bucket=bucket,
            endpoint_url=self.endpoint,
            region=REGION,
            credentials_file=str(self.credentials_file),
            read_timeout_s=15.0,
        )

    def store(self, bucket: str, *, profile: StoreProfile | None = None, create: bool = True) -> S3Store:
        store = S3Store(self.settings(bucket), profile=profile or self.default_profile)
        if create:
            store.create_bucket()
        return store

    def environment(self) -> dict[str, str]:
        """The standard AWS variables that point any S3 client (aws CLI, steadq) at this gateway."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
        }

    def answers(self) -> bool:
        """Whether the S3 gateway serves a request now; a missing bucket is an answer, a refused or 5xx one is not."""
        probe = S3Store(self.settings(READY_PROBE_BUCKET), profile=self.default_profile)
        try:
            probe.list_page("", limit=1)
            return True
        except NotFound:
            return True
        except NotCommitted:
            return False  # not listening yet, or what is behind the gateway is not up yet
        finally:
            probe.close()


def raw_client(endpoint: str) -> Any:
    """A plain botocore client with the test key: what the engine does, without our classification in between."""
    from botocore.config import Config  # here: the fixtures import this module where botocore may be missing
    from botocore.session import Session

    return Session().create_client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": 1},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


@contextlib.contextmanager
def raw_bucket(gateway: Gateway, bucket: str) -> Iterator[Any]:
    """:func:`raw_client` on ``gateway``, with ``bucket`` made first; closed on the way out."""
    gateway.store(bucket).close()
    client = raw_client(gateway.endpoint)
    try:
        yield client
    finally:
        client.close()


def status(call: Callable[[], Any]) -> int:
    """The HTTP status a raw client call got, whether botocore returned or raised."""
    from botocore.exceptions import ClientError

    try:
        return int(call()["ResponseMetadata"]["HTTPStatusCode"])
    except ClientError as exc:
        return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
