"""An S3 endpoint URL with credentials in it (``http://user:pass@host``) is never shown as typed (issue 30 D).

AWS_ENDPOINT_URL may carry a userinfo part (some gateways take basic auth
there), and every message that names the store used to print it verbatim:
``steadq`` errors, the daemons' journal lines, a quarantine finding's log line.
One helper, ``steadqd.text.redacted``, hides the userinfo and secret query
parameters; these tests drive each place that shows an endpoint.
"""

from __future__ import annotations

import io
import os
import subprocess

import pytest

from steadqd.daemon.journal import Log
from steadqd.errors import InvalidInput
from steadqd.s3.store.s3 import S3Settings, S3Store
from steadqd.text import redacted
from tests.cli.helpers import STEADQ

SECRET = "s3cr3tpw"
ENDPOINT = f"http://alice:{SECRET}@127.0.0.1:9"  # port 9 (discard): nothing listens, the connection is refused


@pytest.mark.parametrize(
    ("shown", "expected"),
    [
        (f"at {ENDPOINT} (x)", "at http://***@127.0.0.1:9 (x)"),
        ('URL: "https://k:p@ss@host/b/k?x=1"', 'URL: "https://***@host/b/k?x=1"'),
        ("https://host/b/k?X-Amz-Signature=abc&y=2", "https://host/b/k?X-Amz-Signature=***&y=2"),
        (
            "https://host/?X-Amz-Credential=AKIA%2F1&X-Amz-Security-Token=t",
            "https://host/?X-Amz-Credential=***&X-Amz-Security-Token=***",
        ),
        ("http://127.0.0.1:8333 and s3://bucket/prefix", "http://127.0.0.1:8333 and s3://bucket/prefix"),
        ("no url here: user@example.com", "no url here: user@example.com"),
    ],
)
def test_redacted_hides_userinfo_and_secret_parameters_only(shown: str, expected: str) -> None:
    assert redacted(shown) == expected


@pytest.fixture
def aws_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "STEADQ_"))}
    env.update(
        AWS_ENDPOINT_URL=ENDPOINT, AWS_ACCESS_KEY_ID="AKIAEXAMPLE", AWS_SECRET_ACCESS_KEY="x", AWS_REGION="us-east-1"
    )
    return env


@pytest.mark.parametrize("transport", ["botocore", "direct"])
@pytest.mark.parametrize(
    ("argv", "stdin"),
    [
        (["stats", "s3://bucket/q"], ""),
        (["--json", "stats", "s3://bucket/q"], ""),
        (["ls", "s3://bucket/q"], ""),
        (["put", "s3://bucket/q", "-"], "payload"),
        (["doctor", "s3://bucket/q"], ""),
    ],
)
def test_steadq_errors_never_show_the_endpoints_credentials(
    aws_env: dict[str, str], transport: str, argv: list[str], stdin: str
) -> None:
    env = {**aws_env, "STEADQ_S3_TRANSPORT": transport}
    r = subprocess.run([STEADQ, *argv], input=stdin, env=env, capture_output=True, text=True, timeout=120)
    if argv[0] != "doctor":  # doctor does not reach the store; the rest fail naming it
        assert r.returncode != 0 and "127.0.0.1:9" in r.stderr, (r.stdout, r.stderr)
    assert SECRET not in r.stdout + r.stderr, r.stderr
    assert "alice" not in r.stdout + r.stderr, r.stderr


def test_a_stores_location_hides_the_credentials(aws_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """store.location is in every message naming the queue (settle, clock, quarantine's log line)."""
    for name, value in aws_env.items():
        monkeypatch.setenv(name, value)
    for transport in ("botocore", "direct"):
        store = S3Store(S3Settings(bucket="bucket", endpoint_url=ENDPOINT, transport=transport))
        try:
            assert store.location == "s3://bucket at http://***@127.0.0.1:9"
        finally:
            store.close()


def test_a_refused_endpoint_url_is_named_without_its_credentials(
    aws_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in aws_env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InvalidInput) as caught:
        S3Store(S3Settings(bucket="bucket", endpoint_url=f"ftp://alice:{SECRET}@host", transport="direct"))
    assert SECRET not in str(caught.value) and "ftp://***@host" in str(caught.value)


def test_a_daemon_log_line_never_shows_an_endpoints_credentials() -> None:
    stream = io.StringIO()
    log = Log("worker", "q", journal=False, stream=stream, timestamps=False)
    log.error(f"cannot reach the object store at {ENDPOINT}: check AWS_ENDPOINT_URL", endpoint=ENDPOINT)
    line = stream.getvalue()
    assert SECRET not in line and "http://***@127.0.0.1:9" in line, line
