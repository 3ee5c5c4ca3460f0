"""A queue's YAML naming a bucket (``queue: s3://...``): what is accepted, what is refused, and what the roles pass on."""

from __future__ import annotations

from pathlib import Path

import pytest

from steadqd.daemon.config import QueueSettings, S3Config, open_options, parse_config
from steadqd.daemon.preflight import Account, credentials_problems
from steadqd.errors import ConfigError
from steadqd.s3.backend import BucketBackend
from steadqd.s3.layout import init_layout
from steadqd.s3.open import _split
from steadqd.s3.store.memory import MemoryStore

COMMAND = "worker:\n  command: [/bin/true]\n"


def _parse(text: str) -> QueueSettings:
    return parse_config(text, path="/etc/steadq/queues/render.yaml", name="render")


def test_a_bucket_queue_with_its_s3_settings() -> None:
    s = _parse(
        "queue: s3://render/farm/\n"
        "s3:\n  credentials_file: /etc/steadq/render.aws\n  store_profile: seaweedfs\n  idle_poll_max: 5s\n" + COMMAND
    )
    assert s.queue == "s3://render/farm" and s.bucket
    assert s.s3 == S3Config(credentials_file="/etc/steadq/render.aws", store_profile="seaweedfs", idle_poll_max=5.0)
    assert open_options(s) == {
        "certify_store": False,
        "credentials_file": "/etc/steadq/render.aws",
        "store_profile": "seaweedfs",
        "idle_poll_max": 5.0,
    }
    assert open_options(s, certify=True)["certify_store"] is True


def test_the_doorbell_interval_reaches_the_ready_watch() -> None:
    """Issue 30 B: the bound on what rings may cost is a setting the worker's watch really uses."""
    s = _parse("queue: s3://render/farm\ns3:\n  doorbell_interval: 2.5s\n" + COMMAND)
    assert s.s3 == S3Config(doorbell_interval=2.5)
    options = open_options(s)
    assert options["doorbell_interval"] == 2.5
    rest, handle = _split(dict(options))  # what open_bucket_queue passes to the handle
    assert rest == {"certify_store": False}
    layout = init_layout(MemoryStore(), "farm/", worker_id="w", certify_store=False)
    q = BucketBackend(layout, url="s3://render/farm", **handle)
    watch = q.ready_watch()
    try:
        assert watch._ring_interval == 2.5
    finally:
        watch.close()
        q.close()


def test_without_an_s3_section_everything_comes_from_the_aws_environment() -> None:
    s = _parse("queue: s3://render\n" + COMMAND)
    assert s.s3 is None and open_options(s) == {"certify_store": False}
    no_certify = _parse("queue: s3://render\ns3:\n  certify: false\n" + COMMAND)
    assert open_options(no_certify, certify=True) == {"certify_store": False}


def test_a_directory_queue_keeps_its_options() -> None:
    s = _parse("queue: /var/lib/steadq/render\nallow_unsupported_fs: true\n" + COMMAND)
    assert not s.bucket and open_options(s, certify=True) == {"allow_unsupported_fs": True}


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        ("queue: s3://render\ns3:\n  aws_secret_access_key: abc\n", "s3.aws_secret_access_key", "a secret does not"),
        ("queue: s3://render\naws_access_key_id: AKIA\n", "aws_access_key_id", "a secret does not"),
        ("queue: s3://render\ns3:\n  Password: x\n", "s3.Password", "credentials_file"),
        ("queue: s3://user:pw@render/farm\n", "queue", "never in the URL"),
        ("queue: s3://\n", "queue", "names no bucket"),
        ("queue: gs://render\n", "queue", "not supported by this version"),
        ("queue: /var/lib/steadq/r\ns3:\n  store_profile: seaweedfs\n", "s3", "configures a bucket queue"),
        ("queue: s3://render\nallow_unsupported_fs: true\n", "allow_unsupported_fs", "no filesystem"),
        ("queue: s3://render\ninbox:\n  path: /srv/in\n", "inbox", "metadata"),
        ("queue: s3://render\nsweeper:\n  max_clock_skew: 60s\n", "sweeper.max_clock_skew", "the store's"),
        ("queue: s3://render\ns3:\n  credentials_file: render.aws\n", "s3.credentials_file", "absolute path"),
        ("queue: s3://render\ns3:\n  idle_poll_max: 2h\n", "s3.idle_poll_max", "between"),
        ("queue: s3://render\ns3:\n  doorbell_interval: 10ms\n", "s3.doorbell_interval", "between"),
        ("queue: s3://render\ns3:\n  doorbell_interval: 2h\n", "s3.doorbell_interval", "between"),
        ("queue: s3://render\ns3:\n  endpoint: http://x\n", "s3.endpoint", "unknown key"),
    ],
)
def test_refused_naming_the_key_and_what_to_do(text: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        _parse(text + COMMAND)
    assert f"{key}:" in str(caught.value) or f"{key} " in str(caught.value), str(caught.value)


def test_the_credentials_file_must_be_readable_by_the_service_user_only(tmp_path: Path) -> None:
    path = tmp_path / "render.aws"
    me = Account.current()

    def problems() -> list[str]:
        s = _parse(f"queue: s3://render\ns3:\n  credentials_file: {path}\n" + COMMAND)
        return [p.text for p in credentials_problems(s, me)]

    assert "does not exist" in problems()[0] and "chmod 600" in problems()[0]
    path.write_text("[default]\naws_access_key_id = a\naws_secret_access_key = b\n")
    path.chmod(0o640)
    assert "only the service user may read it" in problems()[0] and "mode 0640" in problems()[0]
    path.chmod(0o600)
    assert problems() == []
    path.unlink()
    path.mkdir()
    assert "not a regular file" in problems()[0]


def test_a_reload_that_changes_the_s3_settings_is_refused() -> None:
    import io

    from steadqd.daemon.journal import Log
    from steadqd.daemon.service import Service

    texts = iter(
        [
            "queue: s3://render\ns3:\n  credentials_file: /etc/steadq/a.aws\n",
            "queue: s3://render\ns3:\n  credentials_file: /etc/steadq/b.aws\n",
        ]
    )
    stream = io.StringIO()
    service = Service(
        lambda: _parse(next(texts)), lambda settings, log: [], Log("run", "render", journal=False, stream=stream)
    )
    service.settings = service.load_settings()
    service._do_reload()
    assert service.settings.s3 is not None and service.settings.s3.credentials_file == "/etc/steadq/a.aws"
    text = stream.getvalue()
    assert "reload refused" in text and "`s3:` changed" in text and "restart the service" in text
