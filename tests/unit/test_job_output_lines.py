"""A job's output reaches the log a line at a time, each line bounded (steadqd/daemon/worker/run/child.py).

The job is hostile input here: one endless line must not grow the daemon's
memory, and what follows the cut of that line must not be taken as a line of
its own (it could forge an entry that looks like the daemon's).
"""

from __future__ import annotations

import collections
from typing import Any

from steadqd.daemon.worker.run.child import MAX_LINE, STDERR_TAIL, Child, Stream


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def log(self, _priority: int, message: str, **fields: Any) -> None:
        self.lines.append((message, fields))


class _Feeder:
    """Just the parts of Child that cut a stream into lines."""

    _feed = Child._feed
    _emit = Child._emit

    def __init__(self) -> None:
        self.log = _Log()
        self.fields: dict[str, str] = {"job_id": "0" * 32}
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)


def test_an_endless_line_is_cut_at_max_line_and_its_rest_is_dropped_not_taken_as_lines() -> None:
    f = _Feeder()
    st = Stream("stderr", -1)
    chunk = b"A" * 65536
    for _ in range(16):  # 1 MiB without a newline, in reads as the pipe gives them
        f._feed(st, chunk)
        assert len(st.buf) <= MAX_LINE
    f._feed(st, b"AAAA STEADQ_JOB_ID=forged\nnext line\n")
    (first, fields), (second, _) = f.log.lines
    assert first == "A" * MAX_LINE and fields["truncated"] == "true" and fields["stream"] == "stderr"
    assert second == "next line"  # the forged tail of the long line never became an entry
    assert not st.buf and not st.dropping


def test_lines_split_across_reads_are_joined_and_crlf_is_trimmed() -> None:
    f = _Feeder()
    st = Stream("stdout", -1)
    f._feed(st, b"hel")
    f._feed(st, b"lo\r\nworld\n")
    assert [m for m, _ in f.log.lines] == ["hello", "world"]
    assert all(fields["truncated"] is None for _, fields in f.log.lines)
