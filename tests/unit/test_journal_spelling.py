"""Issue 16, point 5: one spelling for booleans in journal fields, timestamps only for a person at a terminal."""

from __future__ import annotations

import io
import re

from steadqd.daemon.journal import Log, short_id


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_booleans_are_spelled_true_and_false_whatever_the_caller_passed() -> None:
    out = io.StringIO()
    log = Log("worker", "q", journal=False, stream=out)
    log.notice("stopped", forced=True, held=False, timed_out=None)
    assert out.getvalue() == "<5>worker[q]: stopped STEADQ_FORCED=true STEADQ_HELD=false\n"


def test_lines_on_a_terminal_carry_a_timestamp_and_piped_lines_do_not() -> None:
    tty, pipe = _Terminal(), io.StringIO()
    Log("run", "q", journal=False, stream=tty).info("job started")
    Log("run", "q", journal=False, stream=pipe).info("job started")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} <6>run\[q\]: job started\n", tty.getvalue())
    assert pipe.getvalue() == "<6>run[q]: job started\n"


def test_a_short_id_is_eight_hex_digits_and_escaped() -> None:
    assert short_id("3d1f6a0c" + "0" * 24) == "3d1f6a0c"
    assert short_id("\x1b[2J" + "a" * 28) == "\\x1b[2Jaaaa"
