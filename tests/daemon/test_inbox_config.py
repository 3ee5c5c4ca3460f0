"""The `inbox:` section: every refusal names file:line and the key, and the reference documents every key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from steadqd.daemon import main
from steadqd.daemon.config import InboxConfig, parse_config
from steadqd.daemon.journal import Log
from steadqd.durations import parse_duration
from steadqd.errors import ConfigError

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def parse(inbox: str, queue: str = "/var/lib/steadq/q") -> InboxConfig | None:
    text = f"queue: {queue}\ninbox:\n" + "".join(f"  {line}\n" for line in inbox.strip().splitlines())
    return parse_config(text, path="/etc/steadq/queues/q.yaml", name="q").inbox


def test_a_minimal_section_takes_the_defaults() -> None:
    assert parse("path: /srv/in/") == InboxConfig(path="/srv/in")


def test_every_key_is_read() -> None:
    got = parse(
        "path: /srv/in\npattern: '*.mkv'\nsettle: 1m\npayload: content\nafter: move\nmove_to: /srv/done\nmax_attempts: 7"
    )
    assert got == InboxConfig("/srv/in", "*.mkv", 60.0, "content", "move", "/srv/done", 7)


def test_no_inbox_section_is_none() -> None:
    assert parse_config("queue: /var/lib/steadq/q\n", path="q.yaml", name="q").inbox is None


@pytest.mark.parametrize(
    ("body", "line", "key", "message"),
    [
        ("pattern: '*'", 3, "inbox", "missing required key `path`"),
        ("path: srv/in", 3, "inbox.path", "must be an absolute path"),
        ("path: /etc", 3, "inbox.path", "refusing /etc as a watch folder"),
        ("path: /srv/in\npattern: a/*", 4, "inbox.pattern", "cannot contain '/'"),
        ("path: /srv/in\nsettle: -1s", 4, "inbox.settle", ""),
        ("path: /srv/in\nsettle: 2d", 4, "inbox.settle", "must be between"),
        ("path: /srv/in\npayload: bytes", 4, "inbox.payload", "must be one of path, content"),
        ("path: /srv/in\nafter: trash", 4, "inbox.after", "must be one of keep, move, delete"),
        ("path: /srv/in\nafter: delete", 4, "inbox.after", "needs `payload: content`"),
        ("path: /srv/in\nafter: move", 4, "inbox.after", "needs `move_to:`"),
        ("path: /srv/in\nmove_to: /srv/done", 4, "inbox.move_to", "only with `after: move`"),
        ("path: /srv/in\nafter: move\nmove_to: /srv/in/", 5, "inbox.move_to", "another folder than `path`"),
        ("path: /srv/in\nmax_attempts: 0", 4, "inbox.max_attempts", "between 1 and 4294967295"),
        ("path: /srv/in\nwatch: yes", 4, "inbox.watch", "unknown key"),
        ("path: /var/lib/steadq/q/in", 3, "inbox.path", "must not contain one another"),
        ("path: /var/lib/steadq", 3, "inbox.path", "must not contain one another"),
    ],
)
def test_refusals_name_the_line_and_the_key(body: str, line: int, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(body)
    text = str(info.value)
    assert text.startswith(f"/etc/steadq/queues/q.yaml:{line}: {key}: "), text
    assert message in text


def _inbox_section() -> str:
    doc = DOC.read_text()
    start = doc.index("## `inbox:`")
    end = doc.find("\n## ", start + 1)
    return doc[start : end if end != -1 else len(doc)]


def test_the_reference_has_a_row_for_every_key_with_the_code_s_default() -> None:
    section = _inbox_section()
    rows = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"`\w+`", cells[0]):
            rows[cells[0].strip("`")] = cells[2]
    assert set(rows) == set(InboxConfig.__dataclass_fields__)
    defaults = InboxConfig(path="/x")
    assert rows["settle"] == f"`{defaults.settle:g}s`" and parse_duration(rows["settle"].strip("`")) == defaults.settle
    for key in ("pattern", "payload", "after", "max_attempts"):
        assert rows[key] == f"`{getattr(defaults, key)}`", key


def test_the_reference_example_is_valid() -> None:
    [block] = re.findall(r"```yaml\n(.*?)```", _inbox_section(), flags=re.S)
    assert yaml.safe_load(block)["inbox"]
    assert parse_config(block, path="configuration.md", name="doc").inbox is not None


UNITS = Path(__file__).resolve().parents[2] / "units"


def test_the_worker_unit_serves_the_watch_folder() -> None:
    """No unit of its own: the worker unit's `steadqd worker %i` runs the inbox role when configured."""
    unit = (UNITS / "steadq-worker@.service").read_text()
    assert re.search(r"^ExecStart=/usr/bin/steadqd worker %i$", unit, flags=re.M)
    assert "inbox" in main.COMMAND_ROLES["worker"] and "inbox" in main.COMMAND_ROLES["run"]
    assert not (UNITS / "steadq-inbox@.service").exists()


@pytest.mark.parametrize(
    ("sections", "roles", "expected"),
    [
        ("inbox:\n  path: /srv/in\n", ("worker", "inbox"), ["inbox"]),
        ("inbox:\n  path: /srv/in\nworker:\n  command: [x]\n", ("worker", "inbox"), ["worker", "inbox"]),
        # without `inbox:` the watch role is there all the same, idle: a reload may add the folder
        ("worker:\n  command: [x]\n", ("worker", "inbox"), ["worker", "inbox"]),
        ("inbox:\n  path: /srv/in\n", ("inbox",), ["inbox"]),
    ],
)
def test_which_roles_a_command_runs(sections: str, roles: tuple[str, ...], expected: list[str]) -> None:
    settings = parse_config("queue: /var/lib/steadq/q\n" + sections, path="q.yaml", name="q")
    made = main._role_factory(roles)(settings, Log("test", "q"))
    assert [r.name for r in made] == expected
    # A watch folder alone fails its start on a folder problem; beside a worker it does not.
    assert [getattr(r, "alone", False) for r in made] == [expected == ["inbox"]] * len(made)


@pytest.mark.parametrize(("roles", "missing"), [(("inbox",), "inbox"), (("worker", "inbox"), "worker")])
def test_nothing_to_run_is_a_configuration_error(roles: tuple[str, ...], missing: str) -> None:
    settings = parse_config("queue: /var/lib/steadq/q\n", path="q.yaml", name="q")
    with pytest.raises(ConfigError, match=f"no `{missing}:` section: nothing to run"):
        main._role_factory(roles)(settings, Log("test", "q"))
