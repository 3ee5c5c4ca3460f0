"""Issue 34 #2: ``steadq watch --json`` streams one JSON object per line per refresh, for a
dashboard that reads a pipe; it stops cleanly on SIGTERM and when its reader goes away.

The command runs as a subprocess with stdout a pipe, as a dashboard would run it: the
test reads N lines, then sends SIGTERM (or closes its end) and checks the exit.
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import time

from steadqd import Queue
from steadqd.cli.watch_cmd import watch_interval

from .helpers import STEADQ


def _start(*args: str) -> subprocess.Popen[bytes]:
    assert STEADQ is not None
    return subprocess.Popen([STEADQ, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _line(p: subprocess.Popen[bytes], timeout: float = 20.0) -> bytes:
    """One line of the stream, waiting at most ``timeout`` (a frame that never comes fails, not hangs)."""
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    assert ready, "no frame within the timeout"
    return p.stdout.readline()


def test_watch_json_streams_one_object_per_refresh_and_stops_on_sigterm(qpath: str) -> None:
    with Queue.open(qpath) as q:
        q.enqueue(b"a")
        q.enqueue(b"b")
        assert q.lease(duration=60) is not None
        p = _start("watch", qpath, "--json", "--interval", "0.1")
        try:
            frames = [json.loads(_line(p)) for _ in range(3)]
            p.send_signal(signal.SIGTERM)
            _, err = p.communicate(timeout=20)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert p.returncode == 0 and err == b"", err
    first = frames[0]
    assert first["queue"] == qpath and first["interval_seconds"] == 0.1
    assert first["states"]["ready"]["objects"] == 1  # the rows watch shows: ready is the job waiting
    assert first["states"]["running"]["objects"] == first["running"]["objects"] == 1
    assert first["paused"] is None and first["progress"] == {}
    assert first["throughput"] is None  # nothing to compare the first frame with
    assert set(frames[2]["throughput"]) == {"acked_per_second", "dead_per_second"}
    assert frames[0]["time_ns"] < frames[1]["time_ns"] < frames[2]["time_ns"]


def test_watch_json_stops_when_its_reader_goes_away(qpath: str) -> None:
    """A dashboard that closes the pipe ends the stream at once, quietly, even with a long interval."""
    p = _start("watch", qpath, "--json", "--interval", "1h")
    try:
        json.loads(_line(p))
        assert p.stdout is not None
        p.stdout.close()
        deadline = time.monotonic() + 20
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.returncode == 0
        assert p.stderr is not None and p.stderr.read() == b""
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_watch_interval_is_bounded(qpath: str) -> None:
    """Too short an interval would spin on the tree; too long one is a typo. Both are brought within bounds."""
    p = _start("watch", qpath, "--json", "--interval", "0", "--count", "2")
    out, err = p.communicate(timeout=20)
    assert p.returncode == 0, err
    frames = [json.loads(x) for x in out.splitlines()]
    assert len(frames) == 2 and frames[0]["interval_seconds"] == 0.1
    assert b"--interval raised to 0.1s" in err
    p = _start("watch", qpath, "--json", "--interval", "30d", "--count", "1")
    out, err = p.communicate(timeout=20)
    assert p.returncode == 0 and json.loads(out)["interval_seconds"] == 3600
    assert b"--interval lowered to 1h" in err


def test_a_bucket_queue_refreshes_slower() -> None:
    """Each refresh of a bucket queue lists the bucket (billed, rate-limited requests): 2s at the shortest."""
    assert watch_interval(0.5, bucket=True) == (
        2.0,
        "watch: --interval raised to 2s (the shortest for a bucket queue: each refresh lists the bucket)",
    )
    assert watch_interval(0.5, bucket=False) == (0.5, None)
    assert watch_interval(5, bucket=True) == (5, None)
