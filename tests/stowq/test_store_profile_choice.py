"""Which engine's dialect a bucket queue speaks: the option, else ``STEADQ_STORE_PROFILE``, else generic S3.

No server is needed: the profile is chosen before the first request, so a
wrong name is refused without touching the network.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from steadqd.backend import open_queue
from steadqd.errors import InvalidInput
from steadqd.s3 import open as s3url
from steadqd.s3.store.base import CEPH_RGW, S3_GENERIC, SEAWEEDFS
from tests.stowq.test_cli_bucket import aws_env, run


def test_the_option_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(s3url.PROFILE_VARIABLE, "ceph-rgw")
    assert s3url._profile({"store_profile": "seaweedfs"}) is SEAWEEDFS
    assert s3url._profile({}) is CEPH_RGW
    monkeypatch.setenv(s3url.PROFILE_VARIABLE, "")
    assert s3url._profile({}) is S3_GENERIC
    monkeypatch.delenv(s3url.PROFILE_VARIABLE)
    assert s3url._profile({}) is S3_GENERIC


def test_an_unknown_profile_names_where_it_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(s3url.PROFILE_VARIABLE, "minio")
    with pytest.raises(InvalidInput, match=r"STEADQ_STORE_PROFILE 'minio' is not a known store profile.*ceph-rgw"):
        open_queue("s3://bucket/queue")
    with pytest.raises(InvalidInput, match=r"store profile 'garage' is not a known"):
        open_queue("s3://bucket/queue", store_profile="garage")


def test_the_cli_refuses_an_unknown_profile_before_any_request(tmp_path: Path) -> None:
    env = aws_env(tmp_path, AWS_ENDPOINT_URL="http://127.0.0.1:9", STEADQ_STORE_PROFILE="minio")
    done = run(env, "init", "s3://bucket/queue")
    assert done.returncode != 0
    assert "STEADQ_STORE_PROFILE 'minio' is not a known store profile" in done.stderr
    assert "cannot reach" not in done.stderr and "Traceback" not in done.stderr


def test_without_botocore_a_bucket_queue_is_refused_in_one_line() -> None:
    """An install without the s3 extra: exit 64 (systemd does not restart on it) and the pip command, no traceback."""
    code = (
        "import sys; sys.modules['botocore'] = None\n"
        "from steadqd.cli.main import main\n"
        "sys.exit(main(['stats', 's3://bucket/queue']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 64, done.stderr
    assert "pip install 'steadqd[s3]'" in done.stderr and "s3://bucket/queue" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_without_botocore_a_bucket_queues_daemon_refuses_to_start_in_one_line(tmp_path: Path) -> None:
    """The daemon's side of the same: found by the system test, whose root lacked the extra (a traceback, exit 1)."""
    (tmp_path / "render.yaml").write_text("queue: s3://render/farm/\nworker:\n  command: [/bin/true]\n")
    code = (
        "import sys; sys.modules['botocore'] = None\n"
        "from steadqd.daemon.main import daemon_main\n"
        f"sys.argv = ['steadqd', '--config-dir', {str(tmp_path)!r}, 'worker', 'render']\n"
        "sys.exit(daemon_main())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "NOTIFY_SOCKET"))}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert done.returncode == 64, done.stderr
    assert "pip install 'steadqd[s3]'" in done.stderr and "Traceback" not in done.stderr, done.stderr
