"""Issue 33 #9: ``steadq list`` / ``steadq status`` (what a newcomer types first) show every
configured queue with its counts and its units; ``steadq status QUEUE`` one queue.

The unit states come from ``systemctl is-active``; the tests put a stand-in ``systemctl``
first on PATH (they never ask the machine's systemd), and check the plain "systemd not
running" answer where the machine has none.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from steadqd import Queue

from .helpers import steadq


@pytest.fixture
def conf(tmp_path: Path, make_queue: object, queue_path: str) -> Path:
    """``transcode`` (a queue with jobs) and ``mail`` (whose directory does not exist)."""
    q = make_queue()  # type: ignore[operator]
    assert isinstance(q, Queue)
    dead = q.enqueue(b"d", max_attempts=1)
    lease = q.lease()
    assert lease is not None and lease.job_id == dead
    q.bury(lease, reason=1)
    q.enqueue(b"a")
    q.enqueue(b"b")
    q.enqueue(b"c", delay=600)
    assert q.lease(duration=600) is not None
    q.close()
    d = tmp_path / "queues"
    d.mkdir()
    (d / "transcode.yaml").write_text(f"queue: {queue_path}\nworker:\n  command: [/bin/true]\n")
    (d / "mail.yaml").write_text(f"queue: {tmp_path}/no-mail-queue\n")
    return d


def _systemctl(tmp_path: Path) -> dict[str, str]:
    """PATH with a stand-in systemctl that answers as a running systemd would: transcode's worker and sweeper run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "systemctl"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1" = is-active ] || exit 2\nshift\nst=0\n'
        'for u in "$@"; do case "$u" in\n'
        "  steadq-worker@transcode.service) echo active ;;\n"
        "  steadq-sweeper@transcode.service) echo active ;;\n"
        "  *) echo inactive; st=3 ;;\n"
        "esac; done\nexit $st\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_list_shows_every_configured_queue_with_counts(conf: Path, tmp_path: Path) -> None:
    r = steadq("--config-dir", conf, "list")
    assert r.code == 1, r  # mail cannot be opened: said in its row, and in the status
    header, *rows = r.out_lines[:3]
    assert header.split()[:5] == ["QUEUE", "READY", "DELAYED", "RUNNING", "DEAD"]
    mail, transcode = rows
    assert mail.split()[0] == "mail" and "no-mail-queue" in mail
    assert transcode.split()[:5] == ["transcode", "1", "1", "1", "1"]
    assert steadq("--config-dir", conf, "status").out == r.out


def test_list_json_has_the_documented_shape(conf: Path, tmp_path: Path) -> None:
    r = steadq("--config-dir", conf, "list", "--json", env=_systemctl(tmp_path))
    doc = json.loads(r.out)
    assert doc["config_dir"] == str(conf) and doc["systemd"] is True
    assert [q["name"] for q in doc["queues"]] == ["mail", "transcode"]
    t = doc["queues"][1]
    assert t["config"] == str(conf / "transcode.yaml")
    assert t["counts"] == {"ready": 1, "delayed": 1, "running": 1, "dead": 1}
    assert t["error"] is None
    assert t["units"] == {
        "steadq-worker@transcode": "active",
        "steadq-sweeper@transcode": "active",
        "steadq-promoter@transcode": "inactive",
    }
    m = doc["queues"][0]
    assert m["counts"] is None and "no-mail-queue" in m["error"]


def test_status_of_one_queue(conf: Path, tmp_path: Path) -> None:
    r = steadq("--config-dir", conf, "status", "transcode", "--json", env=_systemctl(tmp_path))
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert [q["name"] for q in doc["queues"]] == ["transcode"]
    r = steadq("--config-dir", conf, "status", "transcode", env=_systemctl(tmp_path))
    assert r.code == 0, r.err
    assert "steadq-worker@transcode: active" in r.out and "steadq-promoter@transcode: inactive" in r.out
    r = steadq("--config-dir", conf, "status", "transcod")
    assert r.code == 6 and "did you mean transcode?" in r.err


def test_without_systemd_the_units_are_said_unknown_not_failed(conf: Path) -> None:
    if os.path.isdir("/run/systemd/system"):
        pytest.skip("this machine runs systemd")
    r = steadq("--config-dir", conf, "status", "transcode")
    assert r.code == 0, r.err
    assert "units: systemd not running" in r.out
    doc = json.loads(steadq("--config-dir", conf, "status", "transcode", "--json").out)
    assert doc["systemd"] is False and doc["queues"][0]["units"] is None


def test_no_config_dir_is_said_plainly(tmp_path: Path) -> None:
    r = steadq("--config-dir", tmp_path / "none", "list")
    assert r.code == 0 and r.out == ""
    assert f"no queues configured: {tmp_path / 'none'}" in r.err


def test_list_json_has_what_a_dashboard_draws(conf: Path, tmp_path: Path) -> None:
    """Issue 34 #2: beside the counts, how long the oldest job of each counted state has waited (the
    ready one is what an alert watches) and ``paused``, reserved: null until queues can be paused."""
    doc = json.loads(steadq("--config-dir", conf, "list", "--json", env=_systemctl(tmp_path)).out)
    t = doc["queues"][1]
    assert set(t["oldest_age_seconds"]) == {"ready", "delayed", "running", "dead"}
    assert all(isinstance(t["oldest_age_seconds"][k], int) for k in ("ready", "delayed", "running", "dead"))
    assert t["paused"] is None
    m = doc["queues"][0]
    assert m["oldest_age_seconds"] is None and m["paused"] is None


def test_list_json_says_which_queue_is_paused_and_why(tmp_path: Path) -> None:
    """The dashboard's all-queues view (issue 34 #1) shows "paused (and why)" from list --json."""
    cfg = tmp_path / "queues"
    cfg.mkdir()
    for name in ("render", "transcode"):
        q = tmp_path / name
        Queue.init(str(q), shards=2).close()
        (cfg / f"{name}.yaml").write_text(f"queue: {q}\nworker:\n  command: [/bin/true]\n")
    assert steadq("pause", "transcode", "--reason", "disk <full>", "--config-dir", str(cfg)).code == 0
    doc = json.loads(steadq("list", "--json", "--config-dir", str(cfg)).out)
    by_name = {row["name"]: row for row in doc["queues"]}
    assert by_name["render"]["paused"] is None
    assert by_name["transcode"]["paused"]["reason"] == "disk <full>"  # data: JSON-encoded, never markup
