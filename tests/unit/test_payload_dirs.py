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


def _filled(tmp: Path, *, readonly: bool) -> str:
    """A job's directory as the claim leaves it: its payload copy (0400) and progress file."""
    d = payload.make("ab" * 16)
    payload.make_progress(d)
    payload.write_copy(d, lambda f: f.write(b"payload"))
    if readonly:
        os.chmod(d, 0o500)  # as for a command run as another user (write_copy with an owner)
    return d


@pytest.mark.parametrize("readonly", [False, True])
def test_remove_takes_the_directory_with_its_own_files(tmp: Path, readonly: bool) -> None:
    d = _filled(tmp, readonly=readonly)
    payload.remove(d)
    assert not os.path.lexists(d)


@pytest.mark.parametrize("what", ["a file", "a tree", "progress replaced by a directory", "a symlink out"])
def test_remove_takes_whatever_the_command_left_there_too_and_nothing_outside(tmp: Path, what: str) -> None:
    """A command run as the daemon's user may write into its directory: all of it goes, nothing it points to."""
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    d = Path(_filled(tmp, readonly=False))
    if what == "a file":
        (d / "out.txt").write_text("x")
    elif what == "a tree":
        (d / "sub" / "deeper").mkdir(parents=True)
        (d / "sub" / "deeper" / "f").write_text("x")
    elif what == "progress replaced by a directory":
        (d / "progress").unlink()
        (d / "progress").mkdir()
        (d / "progress" / "f").write_text("x")
    else:
        (d / "link").symlink_to(outside)
    payload.remove(str(d))
    assert not os.path.lexists(d)
    assert (outside / "keep").read_text() == "x"


def test_remove_of_a_missing_or_empty_name_does_nothing(tmp: Path) -> None:
    payload.remove("")
    payload.remove(str(tmp / "never-made"))
    assert list(tmp.iterdir()) == []


def test_remove_of_a_directory_swapped_for_a_symlink_touches_nothing_it_points_to(tmp: Path) -> None:
    """A command that owns its directory (user: with input: file) may rename it and plant a symlink."""
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    for name in ("payload", "progress", "other"):
        (elsewhere / name).write_text("keep")
    d = payload.make("cd" * 16)
    os.rename(d, tmp / "moved")
    os.symlink(elsewhere, d)
    payload.remove(d)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["other", "payload", "progress"]
    assert oct(elsewhere.stat().st_mode & 0o777) == oct(0o755)
