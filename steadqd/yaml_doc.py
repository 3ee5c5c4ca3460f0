"""YAML read with positions: a document whose every error names the file, the line and the dotted key.

Why one home, below both programs: the daemons validate their queue files
with it (daemon/config.py), and ``steadq`` reads the same files to resolve a
queue's name (queue_names.py). Loading is deliberately narrow: safe scalars
only, no anchors or aliases (alias bombs), no tags, nesting bounded, so a
file can never make a reader do something it does not say.
"""

from __future__ import annotations

import datetime
from typing import Any

import yaml

from steadqd.durations import parse_duration
from steadqd.errors import ConfigError
from steadqd.text import printable

__all__ = ["MAX_CONFIG_DEPTH", "Doc", "check_events", "compose", "deep_flow_prefix", "refuse_deep_flow"]

MAX_CONFIG_DEPTH = 32  # nesting levels; bounds yaml.compose recursion


class Doc:
    """Access to a composed YAML node with file:line-aware errors."""

    def __init__(self, path: str, node: yaml.Node, key: str) -> None:
        self.path = path
        self.node = node
        self.key = key

    @property
    def line(self) -> int:
        return self.node.start_mark.line + 1

    def error(self, message: str) -> ConfigError:
        return ConfigError(message, path=self.path, line=self.line, key=self.key or None)

    def mapping(self, allowed: set[str]) -> dict[str, Doc]:
        if not isinstance(self.node, yaml.MappingNode):
            raise self.error("expected a mapping of keys")
        out: dict[str, Doc] = {}
        for knode, vnode in self.node.value:
            if not isinstance(knode, yaml.ScalarNode) or knode.tag != "tag:yaml.org,2002:str":
                raise ConfigError(
                    "keys must be plain strings", path=self.path, line=knode.start_mark.line + 1, key=self.key
                )
            name = knode.value
            child = f"{self.key}.{name}" if self.key else name
            if name not in allowed:
                hint = ", ".join(sorted(allowed))
                raise ConfigError(
                    f"unknown key (allowed here: {hint})", path=self.path, line=knode.start_mark.line + 1, key=child
                )
            if name in out:
                raise ConfigError("duplicate key", path=self.path, line=knode.start_mark.line + 1, key=child)
            out[name] = Doc(self.path, vnode, child)
        return out

    def scalar(self) -> Any:
        if not isinstance(self.node, yaml.ScalarNode):
            raise self.error("expected a single value")
        return yaml.SafeLoader("").construct_object(self.node)

    def items(self) -> list[Doc]:
        if not isinstance(self.node, yaml.SequenceNode):
            raise self.error("expected a list")
        return [Doc(self.path, n, f"{self.key}[{i}]") for i, n in enumerate(self.node.value)]

    def written(self) -> str | None:
        """The text of an unquoted scalar as typed (``010``, ``yes``), None for a quoted or non-scalar one."""
        if isinstance(self.node, yaml.ScalarNode) and self.node.style is None:
            return str(self.node.value)
        return None

    def got(self, v: object) -> str:
        """``got …`` for an error: an unquoted value YAML read as no text is shown as typed, with the fix.

        YAML 1.1 reads ``true``, ``yes``, ``off``, ``8`` and ``2024-01-31``
        unquoted as a boolean, a number or a date, which surprises anyone who
        meant the word (``command: [true]`` for /bin/true).
        """
        typed = self.written()
        if typed is None or isinstance(v, str) or v is None:
            return f"got {v!r}"
        if isinstance(v, bool):  # before the number test: a bool is an int
            kind = "a boolean"
        elif isinstance(v, int | float):
            kind = "a number"
        elif isinstance(v, datetime.date):
            kind = "a date"
        else:
            kind = "no text"
        shown = printable(typed)
        return f'got {shown}, which YAML reads as {kind}: write it in quotes ("{shown}")'

    # typed readers
    def string(self, *, allow_empty: bool = False) -> str:
        v = self.scalar()
        if not isinstance(v, str) or (not v and not allow_empty):
            raise self.error(f"expected a non-empty string, {self.got(v)}")
        if "\0" in v:
            raise self.error("must not contain NUL")
        return v

    def boolean(self) -> bool:
        v = self.scalar()
        if not isinstance(v, bool):
            raise self.error(f"expected true or false, got {v!r}")
        return v

    def integer(self, lo: int, hi: int) -> int:
        v = self.scalar()
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(f"expected an integer, got {v!r}")
        if not lo <= v <= hi:
            raise self.error(f"must be between {lo} and {hi}, got {v}")
        return v

    def duration(self, lo: float = 0.0, hi: float = 365 * 86400.0) -> float:
        return self._seconds(self.scalar(), lo, hi)

    def optional_duration(self, lo: float = 0.0, hi: float = 365 * 86400.0) -> float | None:
        """A duration, or ``null`` for "none" (no timeout, keep forever)."""
        v = self.scalar()
        return None if v is None else self._seconds(v, lo, hi)

    def _seconds(self, v: object, lo: float, hi: float) -> float:
        try:
            seconds = parse_duration(v if isinstance(v, str | int | float) else repr(v))
        except ValueError as e:
            raise self.error(str(e)) from None
        if not lo <= seconds <= hi:
            raise self.error(f"must be between {lo:g}s and {hi:g}s, got {seconds:g}s")
        return seconds

    def choice(self, options: tuple[str, ...]) -> str:
        v = self.scalar()
        if v not in options:
            raise self.error(f"must be one of {', '.join(options)}, got {v!r}")
        return v

    def statuses(self) -> frozenset[int]:
        return frozenset(d.integer(0, 255) for d in self.items())


_TOO_DEEP = f"YAML nesting deeper than {MAX_CONFIG_DEPTH} levels"
_QUOTE_STAR = 'a value that starts with * or & must be in quotes, for example pattern: "*.mkv"'


def check_events(text: str, path: str) -> None:
    """Refuse anchors, aliases, tags and nesting past MAX_CONFIG_DEPTH, in the order the parser meets them."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        # yaml.compose recurses once per nesting level: refuse deep nesting
        # here (the schema needs < 10 levels) instead of hitting RecursionError.
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_CONFIG_DEPTH:
                raise ConfigError(_TOO_DEEP, path=path, line=line)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise ConfigError(f"YAML anchors and aliases are not allowed ({_QUOTE_STAR})", path=path, line=line)
        tag = getattr(event, "tag", None)
        implicit = getattr(event, "implicit", True)
        explicit = tag is not None and not (implicit is True or (isinstance(implicit, tuple) and any(implicit)))
        if explicit:
            raise ConfigError(f"YAML tags are not allowed ({tag})", path=path, line=line)


def deep_flow_prefix(text: str) -> str | None:
    """The text up to the first ``[``/``{`` that a plain count puts past MAX_CONFIG_DEPTH levels, or None.

    Why: PyYAML's scanner takes about a second to reach the 33rd level of a long run of
    flow collections (it looks far ahead for a possible key at every level), so the
    parser is given this short prefix instead, which holds the same first levels. The
    count skips quoted strings and comments only; a bracket it wrongly counts (in a
    block scalar, say) merely sends the text to the full parse.
    """
    depth = 0
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1  # the escaped character
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t\r\n"):
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline
        elif ch in "[{":
            depth += 1
            if depth > MAX_CONFIG_DEPTH:
                return text[: i + 1]
        elif ch in "]}":
            depth = max(depth - 1, 0)
        i += 1
    return None


def refuse_deep_flow(text: str, path: str) -> None:
    """Raise the nesting refusal when a prefix of ``text`` already nests too deep; else return."""
    prefix = deep_flow_prefix(text)
    if prefix is None:
        return
    # A prefix holds the events of the whole text up to its end, or fewer levels (a ':' past
    # the cut can only add the mapping of a key): whatever else it meets is left to the full parse.
    try:
        check_events(prefix, path)
    except ConfigError as e:
        if str(e).endswith(": " + _TOO_DEEP):
            raise
    except yaml.YAMLError:
        pass


def compose(text: str, path: str) -> yaml.Node:
    """Parse with the safe loader, refusing anchors, aliases, tags and deep nesting first."""
    try:
        refuse_deep_flow(text, path)
        check_events(text, path)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        # A glob (pattern: *.mkv) is alias syntax to YAML, and the scanner's own words do not say so.
        hint = f" ({_QUOTE_STAR})" if e.context in ("while scanning an alias", "while scanning an anchor") else ""
        raise ConfigError(f"not valid YAML: {e.problem or e}{hint}", path=path, line=line) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"not valid YAML: {e}", path=path) from None
    if node is None:
        raise ConfigError("file is empty", path=path, line=1)
    return node
