"""The ready watch parses inotify's events itself (fewer calls an event on the worker's loop thread):
the same events, in the same order, as inotify_simple's parser, names decoded as os.fsdecode does."""

from __future__ import annotations

import struct

import inotify_simple
from hypothesis import example, given
from hypothesis import strategies as st

from steadqd.fs.ready_watch import parse_events

_NAME = st.binary(max_size=40).map(lambda b: b.replace(b"\0", b"x"))
_EVENT = st.tuples(
    st.integers(-1, 2**31 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), _NAME, st.integers(0, 9)
)


def _raw(events: list[tuple[int, int, int, bytes, int]]) -> bytes:
    out = b""
    for wd, mask, cookie, name, pad in events:
        body = name + b"\0" * (pad + 1) if name else b"\0" * pad  # NUL-terminated and padded (none: len 0)
        out += struct.pack("iIII", wd, mask, cookie, len(body)) + body
    return out


@example([(1, 0x100, 0, b"ab.sqj", 2), (2, 0x40, 7, b"", 0), (3, 0x80, 7, b"\xff\xfe", 1)])
@given(st.lists(_EVENT, max_size=8))
def test_events_are_inotify_simples_as_plain_tuples(events: list[tuple[int, int, int, bytes, int]]) -> None:
    data = _raw(events)
    assert parse_events(data) == [tuple(e) for e in inotify_simple.parse_events(data)]
