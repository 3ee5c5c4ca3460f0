"""The daemon service layer: loop, sd_notify, structured log lines."""

from __future__ import annotations

import io
import os
import socket

import pytest

from steadqd.daemon.journal import Log, journal_connected
from steadqd.daemon.notify import Notifier
from steadqd.daemon.service import Loop


def test_timers_run_in_order_and_cancel():
    loop = Loop()
    seen: list[str] = []
    loop.call_later(0.02, lambda: seen.append("b"))
    loop.call_later(0.01, lambda: seen.append("a"))
    t = loop.call_later(0.015, lambda: seen.append("cancelled"))
    t.cancel()
    for _ in range(10):
        loop.run_once(0.05)
        if len(seen) == 2:
            break
    assert seen == ["a", "b"]
    loop.close()


def test_reader_and_wakeup():
    loop = Loop()
    r, w = os.pipe()
    got: list[bytes] = []
    loop.add_reader(r, lambda: got.append(os.read(r, 10)))
    os.write(w, b"hi")
    loop.run_once(1.0)
    assert got == [b"hi"]
    loop.remove_reader(r)
    loop.wake()  # must not block or raise, and run_once returns promptly
    loop.run_once(5.0)
    os.close(r)
    os.close(w)
    loop.close()


@pytest.fixture
def notify_socket(tmp_path):
    path = str(tmp_path / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(2)
    yield path, s
    s.close()


def test_notifier_messages(notify_socket):
    path, s = notify_socket
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.enabled and n.watchdog_interval is None
    n.ready("2 running")
    assert s.recv(4096) == b"READY=1\nSTATUS=2 running"
    n.watchdog()
    assert s.recv(4096) == b"WATCHDOG=1"
    n.reloading()
    msg = s.recv(4096).decode().split("\n")
    assert msg[0] == "RELOADING=1" and msg[1].startswith("MONOTONIC_USEC=") and int(msg[1].split("=")[1]) > 0
    n.stopping()
    assert s.recv(4096) == b"STOPPING=1"


def test_notifier_abstract_socket():
    name = f"steadq-test-{os.getpid()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0" + name)
    s.settimeout(2)
    try:
        Notifier({"NOTIFY_SOCKET": "@" + name}).status("x")
        assert s.recv(100) == b"STATUS=x"
    finally:
        s.close()


def test_watchdog_interval_is_half_and_pid_checked():
    assert Notifier({"WATCHDOG_USEC": "4000000"}).watchdog_interval == 2.0
    assert Notifier({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}).watchdog_interval == 2.0
    assert Notifier({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}).watchdog_interval is None
    assert not Notifier({}).enabled
    Notifier({}).ready()  # no socket: a no-op


def test_log_lines_without_journal():
    out = io.StringIO()
    log = Log("worker", "render", journal=False, stream=out)
    log.info("job finished", job_id="ab" * 16, exit_status=0, duration_ms=12, skipped=None)
    log.warning("line\nwith newline", stream="stderr")
    lines = out.getvalue().splitlines()
    assert (
        lines[0]
        == f"<6>worker[render]: job finished STEADQ_DURATION_MS=12 STEADQ_EXIT_STATUS=0 STEADQ_JOB_ID={'ab' * 16}"
    )
    assert lines[1].startswith("<4>worker[render]: line\\nwith newline")
    assert len(lines) == 2


def test_log_to_journal_uses_fields(monkeypatch):
    sent: list[tuple[str, dict]] = []
    log = Log("sweeper", "q1", journal=False)
    log._send = lambda message, **fields: sent.append((message, fields))  # the journald sink, captured
    log.notice("pass", reaped=3)
    message, fields = sent[0]
    assert message == "pass"
    assert fields == {
        "PRIORITY": "5",
        "SYSLOG_IDENTIFIER": "steadqd",
        "STEADQ_REAPED": "3",
        "STEADQ_QUEUE": "q1",
        "STEADQ_ROLE": "sweeper",
    }


def test_journal_connected_detection(tmp_path):
    st = os.fstat(2)
    assert journal_connected({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    assert not journal_connected({"JOURNAL_STREAM": "1:2"})
    assert not journal_connected({})


def test_stderr_log_lines_escape_what_a_job_prints() -> None:
    """Issue 15, item 7: in stderr mode a job's output cannot forge a line, drive the
    terminal or pass for a field of the entry."""
    import io

    from steadqd.daemon.journal import Log

    s = io.StringIO()
    log = Log("worker", "q", journal=False, stream=s)
    log.info("x\rOK\x1b[2J\u2028\x00 y", job_id="ab")
    log.info("done STEADQ_JOB_ID=forged", job_id="real")
    log.info("multi\nline", detail="v\nw")
    lines = s.getvalue().splitlines()
    assert lines == [
        "<6>worker[q]: x\\rOK\\x1b[2J\\u2028\\x00 y STEADQ_JOB_ID=ab",
        "<6>worker[q]: 'done STEADQ_JOB_ID=forged' STEADQ_JOB_ID=real",
        "<6>worker[q]: multi\\nline STEADQ_DETAIL='v\\nw'",
    ]


class _RecordingRole:
    name = "fake"

    def __init__(self) -> None:
        self.reloaded: list[str] = []

    def start(self, loop: object) -> None: ...
    def status(self) -> str:
        return "ok"

    def reload(self, settings: object) -> str:
        self.reloaded.append(settings.queue)  # type: ignore[attr-defined]
        return ""

    def drain(self) -> None: ...
    def drained(self) -> bool:
        return True

    def close(self) -> None: ...


def _service_with(configs: list[str]) -> tuple[object, _RecordingRole, io.StringIO]:
    from steadqd.daemon.config import parse_config
    from steadqd.daemon.journal import Log
    from steadqd.daemon.service import Service

    texts = iter(configs)
    role = _RecordingRole()
    stream = io.StringIO()
    service = Service(
        lambda: parse_config(next(texts), path="/etc/steadq/queues/q.yaml", name="q"),
        lambda settings, log: [role],
        Log("run", "q", journal=False, stream=stream),
    )
    service.settings = service.load_settings()
    service.roles = [role]
    return service, role, stream


def test_a_reload_that_changes_the_queue_is_refused_for_every_role() -> None:
    """Issue 15, item 6: the worker refused, the sweeper and promoter moved, and the log
    said 'reloaded configuration'. Now no role sees the new settings at all."""
    service, role, stream = _service_with(["queue: /srv/a\n", "queue: /srv/b\n"])
    service._do_reload()  # type: ignore[attr-defined]
    assert role.reloaded == []
    assert service.settings.queue == "/srv/a"  # type: ignore[attr-defined]
    text = stream.getvalue()
    assert "reload refused" in text and "/srv/a" in text and "/srv/b" in text
    assert "reloaded configuration" not in text


def test_a_reload_that_keeps_the_queue_reaches_every_role() -> None:
    service, role, stream = _service_with(["queue: /srv/a\n", "queue: /srv/a/\nsweeper:\n  interval: 7s\n"])
    service._do_reload()  # type: ignore[attr-defined]
    assert role.reloaded == ["/srv/a"]
    assert "reloaded configuration" in stream.getvalue()
