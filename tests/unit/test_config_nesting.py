"""The config parser's nesting refusal reads a short prefix first (steadqd/yaml_doc.py: deep_flow_prefix).

Why: PyYAML's scanner took 0.3-1 s to reach the 33rd level of a long run of flow
collections, so every deeply nested config cost that before it was refused. The prefix
must change only the time: the same refusal, naming the same file and line, and no
refusal where the full parse has none (brackets in quotes, comments or block scalars).
"""

from __future__ import annotations

import pytest
import yaml

from steadqd import yaml_doc
from steadqd.daemon.config import parse_config
from steadqd.errors import ConfigError
from steadqd.yaml_doc import MAX_CONFIG_DEPTH

TOO_DEEP = f"YAML nesting deeper than {MAX_CONFIG_DEPTH} levels"
DEEP = MAX_CONFIG_DEPTH + 1
MANY = 5000


def _events_verdict(text: str) -> str:
    """What the event check over the whole text says: the refusal it raises, or "accepted"."""
    try:
        yaml_doc.check_events(text, "d.yaml")
    except ConfigError as e:
        return str(e)
    except yaml.YAMLError as e:
        return f"not YAML: {type(e).__name__}"
    return "accepted"


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("[" * MANY + "]" * MANY, 1),
        ("queue: " + "{a: " * MANY + "}" * MANY, 1),
        ("worker:\n  command: " + "[[" * MANY + "]]" * MANY, 2),
        ("worker:\n  env:\n" + "".join(f"    {'[' * 2}\n" for _ in range(MANY // 2)), 18),
        ("[ [x]: " + "[" * MANY + "]" * MANY + "]", 1),
    ],
    ids=["flow-sequences", "flow-mappings", "under-block-keys", "one-level-pair-per-line", "implicit-key"],
)
def test_deep_flow_is_refused_from_the_prefix_with_the_full_parse_s_line(text: str, line: int) -> None:
    prefix = yaml_doc.deep_flow_prefix(text)
    assert prefix is not None and len(prefix) < len(text) // 10, "the long run was not cut short"
    assert _events_verdict(text) == f"d.yaml:{line}: {TOO_DEEP}"  # the full parse's own verdict
    with pytest.raises(ConfigError) as refused:
        yaml_doc.refuse_deep_flow(text, "d.yaml")
    assert str(refused.value) == f"d.yaml:{line}: {TOO_DEEP}"
    with pytest.raises(ConfigError) as parsed:
        parse_config(text, path="d.yaml", name="d")
    assert str(parsed.value) == f"d.yaml:{line}: {TOO_DEEP}"


@pytest.mark.parametrize(
    "text",
    [
        "queue: '" + "[" * DEEP + "'\n",
        'queue: "\\"' + "{" * DEEP + '"\n',
        "# " + "[" * DEEP + "\nqueue: /q\n",
        "queue: /q  # " + "{" * DEEP + "\n",
    ],
    ids=["single-quoted", "double-quoted-with-escape", "comment-line", "trailing-comment"],
)
def test_brackets_in_quotes_and_comments_are_not_counted(text: str) -> None:
    assert yaml_doc.deep_flow_prefix(text) is None
    assert TOO_DEEP not in _events_verdict(text)


@pytest.mark.parametrize(
    "text",
    [
        "queue: |\n  " + "[" * DEEP + "\n",
        "queue: a" + "[" * DEEP + "\n",
        "queue: it's [" + "[" * DEEP + "\n",
    ],
    ids=["block-scalar", "inside-a-plain-scalar", "apostrophe-in-a-plain-scalar"],
)
def test_a_miscounted_bracket_leaves_the_verdict_to_the_full_parse(text: str) -> None:
    """The plain count cannot tell these brackets from collections; the parser of the prefix can."""
    yaml_doc.refuse_deep_flow(text, "d.yaml")  # returns: no refusal of its own
    with pytest.raises(ConfigError) as parsed:
        parse_config(text, path="d.yaml", name="d")
    assert TOO_DEEP not in str(parsed.value)  # refused by the schema (worker missing), not by depth


def test_the_limit_itself_is_not_refused() -> None:
    text = "queue: " + "[" * (MAX_CONFIG_DEPTH - 1) + "]" * (MAX_CONFIG_DEPTH - 1)
    assert yaml_doc.deep_flow_prefix(text) is None
    assert _events_verdict(text) == "accepted"
