"""Property fuzzing of every parser with hypothesis (issue 10, "Fuzzing").

Two input sources per parser: arbitrary bytes/text (finds crashes on
garbage) and structured mutations of a valid vector (bit flips,
truncations, insertions, overwrites, splices), which reach the deep checks
that random bytes never get past (digests, component counts, JSON schema).
The contract lives in ``targets.py`` and is shared with the atheris
harnesses, so both fuzzers check exactly the same thing.

Budget: the whole file runs in well under 30 s on the 2-core CI machine.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz import targets

# (id, family, parser index, check) for every parser.
CHECKS = [
    (check.__name__.removeprefix("check_"), family, i, check)
    for family, checks in targets.FAMILIES.items()
    for i, check in enumerate(checks)
]
SEEDS: dict[tuple[str, int], list[bytes]] = {}
for _family, _index, _data in targets.seeds():
    SEEDS.setdefault((_family, _index), []).append(_data)

_FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def mutated(draw: st.DrawFn, base: list[bytes]) -> bytes:
    """A valid vector damaged by 1-4 edits: the inputs that probe the checks after the first one."""
    data = bytearray(draw(st.sampled_from(base)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(("flip", "truncate", "insert", "overwrite", "delete", "splice")))
        pos = draw(st.integers(0, len(data))) if data else 0
        if op == "flip" and data:
            i = min(pos, len(data) - 1)
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[pos:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "overwrite" and data:
            i = min(pos, len(data) - 1)
            data[i] = draw(st.sampled_from(b'\x00\xff.-0fgkx:[]{}"\\ \n\x80'))
        elif op == "delete" and data:
            del data[pos : pos + draw(st.integers(1, 8))]
        elif op == "splice":
            other = draw(st.sampled_from(base))
            cut = draw(st.integers(0, len(other)))
            data[pos:] = other[cut:]
    return bytes(data)


@pytest.mark.parametrize(("name", "check"), [(c[0], c[3]) for c in CHECKS], ids=[c[0] for c in CHECKS])
@_FAST
@given(data=st.binary(max_size=512))
def test_arbitrary_bytes(name: str, check: targets.Check, data: bytes) -> None:
    check(data)


@pytest.mark.parametrize(("name", "check"), [(c[0], c[3]) for c in CHECKS], ids=[c[0] for c in CHECKS])
@_FAST
@given(text=st.text(max_size=200))
def test_arbitrary_text(name: str, check: targets.Check, text: str) -> None:
    check(text.encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize(("family", "index", "check"), [(c[1], c[2], c[3]) for c in CHECKS], ids=[c[0] for c in CHECKS])
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_valid_vectors(family: str, index: int, check: targets.Check, data: st.DataObject) -> None:
    check(data.draw(mutated(SEEDS[(family, index)])))


@pytest.mark.parametrize(("family", "index", "check"), [(c[1], c[2], c[3]) for c in CHECKS], ids=[c[0] for c in CHECKS])
def test_every_seed_is_accepted(family: str, index: int, check: targets.Check) -> None:
    """The mutation bases must be valid, or the mutations only ever test the first rejection."""
    for seed in SEEDS[(family, index)]:
        check(seed)


_NESTING = st.sampled_from(("[", "{", "[[", '{"a":', "- ", "a: "))


@settings(max_examples=30, deadline=None)
@given(opener=_NESTING, depth=st.integers(500, 5000))
def test_deep_nesting_is_refused_not_a_recursion_error(opener: str, depth: int) -> None:
    """Nesting is the one input shape random bytes rarely reach at depth; every recursive parser gets it."""
    closer = {"[": "]", "{": "}", "[[": "]]", '{"a":': "}", "- ": "", "a: ": ""}[opener]
    doc = (opener * depth + "1" + closer * depth).encode()
    for check in (targets.check_handle, targets.check_ticket, targets.check_cursor, targets.check_config):
        check(doc)
