"""The watcher's reactions to what inotify reports that a test cannot make the kernel do on demand.

A lost-events overflow needs more than fs.inotify.max_queued_events unread events
(a host-wide setting this shared machine must not lower); the folder going away
is simple but ends the watch. Both are fed to an in-process ``Watcher`` here.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from inotify_simple import Event, flags

from steadqd import Queue
from steadqd.daemon.config import parse_config
from steadqd.daemon.inbox import watch as inbox
from steadqd.daemon.journal import Log


@pytest.fixture
def watcher(queue: Queue, queue_path: str, tmp_path: Path) -> Iterator[tuple[inbox.Watcher, io.StringIO, Path]]:
    folder = tmp_path / "inbox"
    folder.mkdir()
    settings = parse_config(f"queue: {queue_path}\ninbox:\n  path: {folder}\n  settle: 1h\n", path="q.yaml", name="q")
    out = io.StringIO()
    w = inbox.Watcher(settings, Log("inbox", "q", journal=False, stream=out))
    try:
        yield w, out, folder
    finally:
        w.close()


def test_lost_events_make_every_file_wait_out_settle_again(
    watcher: tuple[inbox.Watcher, io.StringIO, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    w, out, folder = watcher
    for name in ("a", "b", ".hidden"):
        (folder / name).write_bytes(b"x")
    monkeypatch.setattr(inbox, "read_events", lambda _fd: iter([Event(-1, flags.Q_OVERFLOW, 0, "")]))
    w._read_events()
    assert sorted(w.waiting) == ["a", "b"]
    assert "inotify lost events" in out.getvalue()


def test_the_folder_going_away_ends_the_watch_and_says_so(
    watcher: tuple[inbox.Watcher, io.StringIO, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    w, out, folder = watcher
    monkeypatch.setattr(inbox, "read_events", lambda _fd: iter([Event(1, flags.DELETE_SELF, 0, "")]))
    w._read_events()
    assert w.gone
    assert f"watch folder {folder} was removed, moved or unmounted" in out.getvalue()
    role = inbox.InboxRole(w.settings, w.log)
    role._watcher = w
    assert role.status().startswith("stopped:")
    role._watcher = None


def test_a_file_changed_since_it_was_armed_waits_again(watcher: tuple[inbox.Watcher, io.StringIO, Path]) -> None:
    w, _, folder = watcher
    (folder / "a").write_bytes(b"x")
    w._arm("a")
    armed, _ = w.waiting.pop("a")
    with open(folder / "a", "ab") as f:
        f.write(b"more")
    os.utime(folder / "a", ns=(0, 10**9))
    w._take("a", armed)
    assert "a" in w.waiting  # not taken: it changed
    assert w.enqueued == 0
