"""parse_name's whole-name fast path against the rule-by-rule grammar (docs/performance.md).

parse_name matches a name with one regex per state and builds the JobName
without re-validating the fields (the fixed widths already bound them). This
checks that the fast path accepts exactly what names.md's parser rules accept,
yields the same values as the validating constructor, and that a rejected
name still reports which rule it broke.
"""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steadqd.constants import State
from steadqd.errors import CorruptObject
from steadqd.fs import names

_FIELDS = {
    State.READY: (".sqj", [("g", 16), ("a", 8), ("m", 8)]),
    State.LEASED: (".sqj", [("g", 16), ("a", 8), ("m", 8), ("o", 32), ("b", 16), ("w", 16), ("t", 32)]),
    State.DELAYED: (".sqj", [("g", 16), ("a", 8), ("m", 8), ("d", 16)]),
    State.DEAD: (".sqj", [("g", 16), ("a", 8), ("m", 8), ("x", 4)]),
    State.RECEIPT: (".rct", [("g", 16), ("a", 8), ("m", 8), ("t", 32)]),
}


def _hex(s: str, width: int) -> bool:
    return len(s) == width and all(c in "0123456789abcdef" for c in s)


def reference_parse(state: State, text: str) -> list[str] | None:
    """names.md "Parser rules", one at a time: the raw field strings, or None."""
    if not text.isascii() or "\0" in text:
        return None
    ext, fields = _FIELDS[state]
    if not text.endswith(ext):
        return None
    comps = text[: -len(ext)].split(".")
    if len(comps) != len(fields) + 2 or not _hex(comps[0], 32):
        return None
    out = [comps[0]]
    for comp, (prefix, width) in zip(comps[1:-1], fields, strict=True):
        if comp[:1] != prefix or not _hex(comp[1:], width):
            return None
        out.append(comp[1:])
    if comps[-1][:1] != "k" or not _hex(comps[-1][1:], 16):
        return None
    return out + [comps[-1][1:]]


def _valid(state: State, rnd: st.DrawFn) -> str:
    ext, fields = _FIELDS[state]
    hexs = st.text("0123456789abcdef", min_size=1, max_size=1)
    comps = ["".join(rnd(hexs) for _ in range(32))]
    comps += [p + "".join(rnd(hexs) for _ in range(w)) for p, w in fields]
    comps.append("k" + "".join(rnd(hexs) for _ in range(16)))
    return ".".join(comps) + ext


@st.composite
def candidate_names(draw: st.DrawFn) -> tuple[State, str]:
    state = draw(st.sampled_from(list(_FIELDS)))
    text = _valid(state, draw)
    # Mutate a valid name: replace, insert or delete a few characters (or none).
    alphabet = st.sampled_from(list("0123456789abcdefABCDEFgkmotx._\n\0é ") + list(string.ascii_lowercase))
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["replace", "insert", "delete"]))
        c = draw(alphabet)
        if op == "insert":
            text = text[:i] + c + text[i:]
        elif i < len(text):
            text = text[:i] + (c if op == "replace" else "") + text[i + 1 :]
    return state, text


@settings(max_examples=600, deadline=None)
@given(candidate_names())
def test_fast_path_accepts_exactly_the_grammar(case: tuple[State, str]) -> None:
    state, text = case
    ref = reference_parse(state, text)
    try:
        got = names.parse_name(state, text)
    except CorruptObject:
        assert ref is None, text
        return
    assert ref is not None, text
    assert got.job_id.hex() == ref[0] and got.tag is not None and got.tag.hex() == ref[-1]
    assert f"{got.generation:016x}" == ref[1] and f"{got.attempt:08x}" == ref[2] and f"{got.max_attempts:08x}" == ref[3]
    # Same object as the validating constructor would build, and it formats back to the input.
    assert names.format_name(got, got.tag) == text
    rebuilt = names.JobName(**{f: getattr(got, f) for f in got.__dataclass_fields__})
    assert rebuilt == got and hash(rebuilt) == hash(got)
    # parse_name keeps the text before the tag as the name's base; formatting the fields gives the same.
    assert rebuilt.base() == got.base()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("0" * 32 + ".g" + "0" * 16 + ".a" + "0" * 8 + ".m" + "0" * 8 + ".k" + "0" * 16 + ".rct", "extension"),
        ("0" * 32 + ".g" + "0" * 16 + ".a" + "0" * 8 + ".k" + "0" * 16 + ".sqj", "components"),
        ("0" * 31 + "A.g" + "0" * 16 + ".a" + "0" * 8 + ".m" + "0" * 8 + ".k" + "0" * 16 + ".sqj", "job id"),
        ("0" * 32 + ".g" + "0" * 15 + "G.a" + "0" * 8 + ".m" + "0" * 8 + ".k" + "0" * 16 + ".sqj", "'g'"),
        ("0" * 32 + ".g" + "0" * 16 + ".a" + "0" * 8 + ".m" + "0" * 8 + ".j" + "0" * 16 + ".sqj", "'k'"),
    ],
)
def test_a_rejected_name_still_says_which_rule_it_broke(text: str, why: str) -> None:
    with pytest.raises(CorruptObject) as e:
        names.parse_name(State.READY, text)
    assert why in str(e.value)


@settings(max_examples=300, deadline=None)
@given(candidate_names())
def test_is_name_says_whether_parse_name_accepts(case: tuple[State, str]) -> None:
    """The ready watch's check (names.is_name) accepts exactly what parse_name parses, for every state."""
    _, text = case
    for state in _FIELDS:
        try:
            names.parse_name(state, text)
            parsed = True
        except CorruptObject:
            parsed = False
        assert names.is_name(state, text) is parsed, (state, text)


@settings(max_examples=300, deadline=None)
@given(candidate_names())
def test_looks_ready_never_rejects_a_ready_name(case: tuple[State, str]) -> None:
    """The scans' cheap pre-filter: every name parse_name accepts as ready passes it,
    and no valid name of another state (same directory for leased ones) does."""
    state, text = case
    if reference_parse(State.READY, text) is not None:
        assert names.looks_ready(text), text
    elif state is not State.READY and reference_parse(state, text) is not None:
        assert not names.looks_ready(text), text
