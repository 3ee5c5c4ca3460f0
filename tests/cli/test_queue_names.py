"""Issue 33 #4: every ``steadq`` command takes a configured queue's name, as the units do.

``steadq stats transcode`` once said "queue root transcode does not exist" (exit 6): the
command took only paths, while everything else (the units, ``steadqd``, the journal) names
the queue. A name is resolved through the daemons' config directory (``--config-dir`` or
``$STEADQ_CONFIG_DIR``); a path still works; a word that is neither names both places looked.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from steadqd.errors import ConfigError
from steadqd.queue_names import read_queue_entry

from .helpers import steadq


@pytest.fixture
def conf(tmp_path: Path, qpath: str) -> Path:
    """A config directory with ``transcode.yaml`` naming the test's queue (and nowhere near the cwd)."""
    d = tmp_path / "queues"
    d.mkdir()
    (d / "transcode.yaml").write_text(f"queue: {qpath}\nworker:\n  command: [/bin/true]\n")
    return d


def test_a_configured_name_opens_its_queue(conf: Path, tmp_path: Path) -> None:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    r = steadq("--config-dir", conf, "put", "transcode", "-", stdin=b"frame 1", cwd=str(cwd))
    assert r.code == 0, r.err
    r = steadq("stats", "transcode", cwd=str(cwd), env={"STEADQ_CONFIG_DIR": str(conf)})
    assert r.code == 0, r.err
    assert "ready: 1" in r.out_lines[-2:] or "ready: 1" in r.out
    # the option after the command, as steadqd takes it
    r = steadq("ls", "transcode", "--config-dir", conf, cwd=str(cwd))
    assert r.code == 0, r.err
    assert len(r.out_lines) == 2 and r.out_lines[1].startswith("ready")


def test_an_unknown_name_says_both_places_it_looked(conf: Path, tmp_path: Path) -> None:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    r = steadq("--config-dir", conf, "stats", "transcod", cwd=str(cwd))
    assert r.code == 6
    assert len(r.err_lines) == 1, r.err
    assert str(cwd / "transcod") in r.err  # the path it looked for
    assert str(conf / "transcod.yaml") in r.err  # the config file it looked for
    assert "did you mean transcode?" in r.err


def test_a_path_still_wins_over_a_name(conf: Path, qpath: str) -> None:
    parent, base = os.path.split(qpath)
    # an existing directory in the cwd is a path, even where a config of that name exists
    (conf / f"{base}.yaml").write_text("queue: /nonexistent/elsewhere\n")
    r = steadq("--config-dir", conf, "stats", base, cwd=parent)
    assert r.code == 0, r.err
    r = steadq("--config-dir", conf, "stats", qpath)
    assert r.code == 0, r.err


def test_a_name_whose_queue_is_missing_says_which_config_named_it(conf: Path, tmp_path: Path) -> None:
    (conf / "mail.yaml").write_text(f"queue: {tmp_path}/no-such-queue\n")
    r = steadq("--config-dir", conf, "stats", "mail", cwd=str(tmp_path))
    assert r.code == 6
    assert f"{tmp_path}/no-such-queue" in r.err and str(conf / "mail.yaml") in r.err


def test_a_broken_config_is_one_line_pointing_at_check_config(conf: Path, tmp_path: Path) -> None:
    (conf / "broken.yaml").write_text("queue: [a, b\n")
    r = steadq("--config-dir", conf, "stats", "broken", cwd=str(tmp_path))
    assert r.code == 1
    assert len(r.err_lines) == 1 and "steadqd check-config broken" in r.err


def test_a_bucket_config_carries_its_access_settings(tmp_path: Path) -> None:
    (tmp_path / "media.yaml").write_text(
        "queue: s3://media-bucket/jobs\n"
        "s3:\n  credentials_file: /etc/steadq/media.credentials\n  aws_profile: media\n  idle_poll_max: 5s\n"
    )
    entry = read_queue_entry("media", str(tmp_path))
    assert entry.queue == "s3://media-bucket/jobs"
    assert entry.options == {"credentials_file": "/etc/steadq/media.credentials", "aws_profile": "media"}
    # The units' environment file says where the store is (docs/stowq.md): its endpoint and region only.
    (tmp_path / "media.env").write_text(
        "# EnvironmentFile=\n; another comment\nAWS_ENDPOINT_URL=http://10.0.0.5:8333\n"
        " AWS_REGION = 'eu-west-1' \nAWS_SECRET_ACCESS_KEY=never-read\nHTTPS_PROXY=http://proxy:3128\nAWS_REGION=\"us-east-1\"\n"
    )
    assert read_queue_entry("media", str(tmp_path)).options == {
        "credentials_file": "/etc/steadq/media.credentials",
        "aws_profile": "media",
        "endpoint_url": "http://10.0.0.5:8333",
        "region": "us-east-1",  # the later line wins, as in systemd
    }
    (tmp_path / "media.env").unlink()
    (tmp_path / "media.env").mkdir()
    with pytest.raises(ConfigError, match="not a regular file"):
        read_queue_entry("media", str(tmp_path))  # not silently another store
    (tmp_path / "local.env").write_text("AWS_ENDPOINT_URL=http://10.0.0.5:8333\n")
    (tmp_path / "local.yaml").write_text("queue: /srv/q\nallow_unsupported_fs: true\n")
    assert read_queue_entry("local", str(tmp_path)).options == {"allow_unsupported_fs": True}
    (tmp_path / "fifo.yaml").unlink(missing_ok=True)
    os.mkfifo(tmp_path / "fifo.yaml")
    with pytest.raises(ConfigError, match="not a regular file"):
        read_queue_entry("fifo", str(tmp_path))  # never waits for a writer


def test_the_daemon_suggests_the_config_meant(conf: Path) -> None:
    import subprocess
    import sys

    steadqd = os.path.join(os.path.dirname(sys.executable), "steadqd")
    p = subprocess.run(
        [steadqd, "--config-dir", str(conf), "check-config", "transcod"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 78
    assert "did you mean transcode?" in p.stderr, p.stderr
