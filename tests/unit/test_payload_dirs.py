"""Payload copies a killed worker left in the temp directory are removed by the next one,
and nothing else is: not a live worker's, not another pid namespace's, not a stranger's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from steadqd.daemon.worker import payload


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid  # reaped: no such process (pid reuse within this test is not a concern)


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    return tmp_path


def test_make_names_the_creator_and_is_private(tmp: Path) -> None:
    d = Path(payload.make("0123456789abcdef0123456789abcdef"))
    assert d.parent == tmp
    ns = os.stat("/proc/self/ns/pid").st_ino
    assert d.name.startswith(f"steadqd-{ns}-{os.getpid()}-0123456789ab-")
    assert oct(d.stat().st_mode & 0o777) == oct(0o700)


def test_remove_stale_takes_only_dead_workers_of_this_namespace(tmp: Path) -> None:
    ns = os.stat("/proc/self/ns/pid").st_ino
    dead = tmp / f"steadqd-{ns}-{_dead_pid()}-0123456789ab-x1"
    live = tmp / f"steadqd-{ns}-{os.getppid()}-0123456789ab-x2"
    mine = Path(payload.make("ab" * 16))
    other_ns = tmp / f"steadqd-{ns + 1}-{_dead_pid()}-0123456789ab-x3"
    old_style = tmp / "steadqd-0123456789ab-x4"
    stranger = tmp / "unrelated-dir"
    for d in (dead, live, other_ns, old_style, stranger):
        d.mkdir()
    (dead / "payload").write_bytes(b"secret")
    os.chmod(dead / "payload", 0o400)
    if os.geteuid() == 0:
        os.chmod(dead, 0o500)  # as when the job ran as another user (only root removes that)
    removed = payload.remove_stale()
    assert removed == [str(dead)]
    assert not dead.exists()
    for d in (live, mine, other_ns, old_style, stranger):
        assert d.exists(), d
