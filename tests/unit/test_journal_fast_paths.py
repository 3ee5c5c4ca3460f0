"""The journal's per-line work skips what cannot apply, and says the same as the full rules.

Every job logs a ``started`` and a ``finished`` line of eight fields on the worker's loop thread, and
each value used to go through two regular expressions (``steadqd.text.redacted``) and a test per
character (``journal._quote``). The shortcuts (no ``://`` and no ``=``: nothing to redact; an ASCII
value: one regular expression; an ``int``: nothing to hide) must give the same text as the rules they skip.
"""

from __future__ import annotations

import io

from hypothesis import example, given
from hypothesis import strategies as st

from steadqd.daemon import journal
from steadqd.daemon.journal import Log
from steadqd.text import _SECRET_PARAM, _USERINFO, redacted

# Text that hits the rules: URLs with userinfo, secret parameters, and the characters around them.
_URLISH = st.lists(st.sampled_from([*"ab:/@?&=#.- é\n", "://", "http://u:p@h", "?token=", "&X-Amz-Signature="])).map(
    "".join
)


def _redacted_by_the_rules(text: str) -> str:
    return _SECRET_PARAM.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


def _quoted_by_the_rule(v: str) -> str:
    return v if v and all(c.isalnum() or c in "-_./:@" for c in v) else repr(v)


@given(st.one_of(_URLISH, st.text()))
def test_redacted_equals_both_rules_applied(text: str) -> None:
    assert redacted(text) == _redacted_by_the_rules(text)


@given(st.one_of(st.text(), st.text(alphabet=st.characters(max_codepoint=127))))
def test_a_value_is_quoted_as_the_per_character_rule_says(v: str) -> None:
    assert journal._quote(v) == _quoted_by_the_rule(v)


def _line(**fields: object) -> str:
    out = io.StringIO()
    Log("worker", "q", journal=False, stream=out, timestamps=False).info("job x started", **fields)
    return out.getvalue()


@given(st.integers())
def test_an_int_field_reads_as_its_text(n: int) -> None:
    assert _line(pid=n, attempt=True) == _line(pid=str(n), attempt="true")


_FIELD_TEXT = st.one_of(
    st.text(),
    _URLISH,
    st.lists(st.sampled_from(["ab", "9.", "\x00", " ", "", "é", "\n", "=", "@"])).map("".join),
    st.integers(),
)


@example({"x": "a\x00b"})
@example({"x": "a\x00b", "pid": 1})
@example({"x": "", "pid": 1})
@given(st.dictionaries(st.sampled_from(["job_id", "attempt", "pid", "stream", "reason", "queue", "x"]), _FIELD_TEXT))
def test_a_line_shows_each_field_as_the_per_field_rule_says(fields: dict[str, object]) -> None:
    # A line whose values are all bare is checked with one regex over them all (NUL-joined, counted): a value
    # holding a NUL, a space or nothing must still be quoted, and the queue's own field stays the prefix's.
    shown = {f"STEADQ_{k.upper()}": _quoted_by_the_rule(redacted(str(v))) for k, v in fields.items() if k != "queue"}
    extra = " ".join(f"{k}={v}" for k, v in sorted(shown.items()))
    assert _line(**fields) == "<6>worker[q]: job x started" + (f" {extra}" if extra else "") + "\n"


def _message_by_the_rules(message: str) -> str:
    return repr(message) if journal._LOOKS_LIKE_FIELD.search(message) else journal.printable(message)


@example("job 1 finished: ack (exit 0)")
@example("a KEY=value")
@example("tab\there")
@example("x\u2028y")
@given(
    st.one_of(
        st.text(), st.lists(st.sampled_from(["a", " ", "K", "EY", "=", "\n", "\x1b", "\udcff", "é"])).map("".join)
    )
)
def test_a_message_is_shown_as_the_full_rules_say(message: str) -> None:
    assert journal._message_text(message) == _message_by_the_rules(message)


@example("3d1f6a0c9e")
@example("\x1b[2Jabcdef")
@example("\udcffabc")
@given(st.text())
def test_a_short_id_is_escaped_as_printable_says(job_id: str) -> None:
    assert journal.short_id(job_id) == journal.printable(job_id[:8])


@example("see http://u:p@h/x?token=s")
@given(st.one_of(_URLISH, st.text()))
def test_a_logged_message_is_redacted_then_shown_as_the_rules_say(message: str) -> None:
    out = io.StringIO()
    Log("worker", "q", journal=False, stream=out, timestamps=False).info(message)
    assert out.getvalue() == f"<6>worker[q]: {_message_by_the_rules(_redacted_by_the_rules(message))}\n"
