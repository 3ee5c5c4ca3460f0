"""Config validation: one bad file per rule, each error naming file, line and key."""

from __future__ import annotations

import os
import textwrap

import pytest

from steadqd.daemon.config import ExitPolicy, load_config, parse_config
from steadqd.durations import format_duration, parse_duration
from steadqd.errors import ConfigError

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "steadq", "queues", "example.yaml")

GOOD = """\
queue: /var/lib/steadq/render
worker:
  command: ["/bin/echo", "hi"]
  concurrency: 3
  lease: 2m
  timeout: 1h
  exit_status:
    retry: [75, 69]
"""


def parse(text: str):
    return parse_config(textwrap.dedent(text), path="/etc/steadq/queues/render.yaml", name="render")


def test_example_file_is_valid():
    with open(EXAMPLE) as f:
        s = parse_config(f.read(), path=EXAMPLE, name="example")
    assert s.worker is not None and s.worker.command[0] == "/usr/local/bin/process-job"
    assert s.worker.renew_interval == pytest.approx(20.0)
    assert s.sweeper.receipt_retention == 7 * 86400


def test_good_config_values():
    s = parse(GOOD)
    assert s.queue == "/var/lib/steadq/render"
    w = s.worker
    assert w is not None
    assert w.command == ("/bin/echo", "hi") and w.concurrency == 3 and w.lease == 120.0 and w.timeout == 3600.0
    # a list given replaces its default; the others keep theirs (tests/unit/test_verdict.py applies them)
    assert w.exit_status == ExitPolicy(retry=frozenset({75, 69}))
    assert s.promoter.enabled and s.sweeper.interval == 30.0
    assert s.allow_unsupported_fs is False  # the file-system check stays on unless asked


def test_allow_unsupported_fs_switch():
    assert parse("queue: /q/a\nallow_unsupported_fs: true\n").allow_unsupported_fs is True
    assert parse("queue: /q/a\nallow_unsupported_fs: false\n").allow_unsupported_fs is False


BAD = [
    # (rule, text, line, key, message fragment)
    ("unknown top-level key", "queue: /q/a\nworkr: {}\n", 2, "workr", "unknown key"),
    (
        "unknown nested key",
        "queue: /q/a\nworker:\n  command: [a]\n  concurrancy: 2\n",
        4,
        "worker.concurrancy",
        "unknown key",
    ),
    ("missing queue", "worker:\n  command: [a]\n", 1, None, "missing required key `queue`"),
    ("relative queue path", "queue: var/q\n", 1, "queue", "absolute path"),
    ("system directory as queue", "queue: /etc\n", 1, "queue", "refusing /etc"),
    ("root as queue", "queue: /\n", 1, "queue", "refusing /"),
    # POSIX keeps exactly two leading slashes through normpath: //etc is /etc all the same.
    ("system directory behind //", "queue: //etc\n", 1, "queue", "refusing /etc"),
    ("root as //", "queue: //\n", 1, "queue", "refusing /"),
    ("system directory behind ///", "queue: ///usr/\n", 1, "queue", "refusing /usr"),
    ("missing command", "queue: /q/a\nworker:\n  concurrency: 2\n", 3, "worker", "missing required key `command`"),
    (
        "string command without shell",
        "queue: /q/a\nworker:\n  command: echo hi\n",
        3,
        "worker.command",
        "list of arguments",
    ),
    ("empty command", "queue: /q/a\nworker:\n  command: []\n", 3, "worker.command", "at least the program"),
    (
        "wrong type",
        "queue: /q/a\nworker:\n  command: [a]\n  concurrency: two\n",
        4,
        "worker.concurrency",
        "expected an integer",
    ),
    (
        "bool is not an int",
        "queue: /q/a\nworker:\n  command: [a]\n  concurrency: true\n",
        4,
        "worker.concurrency",
        "expected an integer",
    ),
    (
        "impossible concurrency",
        "queue: /q/a\nworker:\n  command: [a]\n  concurrency: 0\n",
        4,
        "worker.concurrency",
        "between 1 and 1024",
    ),
    (
        "bad duration",
        "queue: /q/a\nworker:\n  command: [a]\n  lease: 10 parsecs\n",
        4,
        "worker.lease",
        "invalid duration",
    ),
    ("lease too short", "queue: /q/a\nworker:\n  command: [a]\n  lease: 500ms\n", 4, "worker.lease", "between 1s"),
    (
        "renew not shorter than lease",
        "queue: /q/a\nworker:\n  command: [a]\n  lease: 30s\n  renew_every: 30s\n",
        5,
        "worker.renew_every",
        "shorter than the lease",
    ),
    (
        "bad input mode",
        "queue: /q/a\nworker:\n  command: [a]\n  input: pipe\n",
        4,
        "worker.input",
        "one of stdin, file",
    ),
    (
        "exit status out of range",
        "queue: /q/a\nworker:\n  command: [a]\n  exit_status:\n    bury: [300]\n",
        5,
        "worker.exit_status.bury[0]",
        "between 0 and 255",
    ),
    (
        "status in two lists",
        "queue: /q/a\nworker:\n  command: [a]\n  exit_status:\n    retry: [0]\n",
        5,
        "worker.exit_status.retry",
        "both ack and retry",
    ),
    (
        "backoff max below base",
        "queue: /q/a\nworker:\n  command: [a]\n  retry:\n    backoff_base: 10s\n    backoff_max: 1s\n",
        6,
        "worker.retry.backoff_max",
        "not be smaller",
    ),
    (
        "reserved env name",
        "queue: /q/a\nworker:\n  command: [a]\n  environment:\n    STEADQ_JOB_ID: x\n",
        5,
        "worker.environment.STEADQ_JOB_ID",
        "set by the worker",
    ),
    (
        "bad env name",
        "queue: /q/a\nworker:\n  command: [a]\n  environment:\n    1BAD: x\n",
        5,
        "worker.environment.1BAD",
        "letters, digits",
    ),
    (
        "relative working dir",
        "queue: /q/a\nworker:\n  command: [a]\n  working_directory: work\n",
        4,
        "worker.working_directory",
        "absolute",
    ),
    ("duplicate key", "queue: /q/a\nqueue: /q/b\n", 2, "queue", "duplicate key"),
    ("section not a mapping", "queue: /q/a\nsweeper: 5\n", 2, "sweeper", "expected a mapping"),
    ("sweeper interval zero", "queue: /q/a\nsweeper:\n  interval: 0s\n", 3, "sweeper.interval", "between 0.1s"),
    ("alias", "queue: &q /q/a\nworker:\n  command: [*q]\n", 1, None, "anchors and aliases"),
    ("custom tag", "queue: !!python/object:os.system /q/a\n", 1, None, "tags are not allowed"),
    ("broken yaml", "queue: [unclosed\n", 2, None, "not valid YAML"),
    ("empty file", "", 1, None, "file is empty"),
    (
        "unsupported-fs switch not a boolean",
        "queue: /q/a\nallow_unsupported_fs: yes please\n",
        2,
        "allow_unsupported_fs",
        "expected true or false",
    ),
    (
        "dead retention under an hour",
        "queue: /q/a\nsweeper:\n  interval: 30s\n  dead_retention: 59m\n",
        4,
        "sweeper.dead_retention",
        "between 3600s",
    ),
]


@pytest.mark.parametrize("rule,text,line,key,fragment", BAD, ids=[b[0] for b in BAD])
def test_each_rule_names_file_line_and_key(rule, text, line, key, fragment):
    with pytest.raises(ConfigError) as info:
        parse_config(text, path="/etc/steadq/queues/q.yaml", name="q")
    e = info.value
    assert e.path == "/etc/steadq/queues/q.yaml"
    assert e.line == line, str(e)
    assert e.key == key, str(e)
    assert fragment in str(e)
    assert str(e).startswith(f"/etc/steadq/queues/q.yaml:{line}: ")


def test_alias_bomb_refused_quickly():
    bomb = "a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\nd: &d [*c, *c]\nqueue: /q/a\n"
    with pytest.raises(ConfigError, match="anchors and aliases"):
        parse_config(bomb, path="p.yaml", name="q")


def test_oversized_file_refused(tmp_path):
    (tmp_path / "big.yaml").write_text("queue: /q/a\n# " + "x" * 300_000 + "\n")
    with pytest.raises(ConfigError, match="larger than"):
        load_config("big", str(tmp_path))


def test_load_from_dir_env_and_missing(tmp_path, monkeypatch):
    (tmp_path / "render.yaml").write_text(GOOD)
    monkeypatch.setenv("STEADQ_CONFIG_DIR", str(tmp_path))
    assert load_config("render").queue == "/var/lib/steadq/render"
    with pytest.raises(ConfigError, match="no configuration for queue 'nope'"):
        load_config("nope")
    with pytest.raises(ConfigError, match="invalid queue name"):
        load_config("../etc/passwd")


def test_shell_command_is_explicit():
    s = parse("queue: /q/a\nworker:\n  shell: true\n  command: 'echo $HOME'\n")
    assert s.worker is not None and s.worker.shell and s.worker.command == ("echo $HOME",)


def test_exit_policy_other_and_bury_reason():
    s = parse("queue: /q/a\nworker:\n  command: [a]\n  exit_status:\n    other: bury\n    bury_reason: 300\n")
    assert s.worker is not None
    assert s.worker.exit_status == ExitPolicy(other="bury", bury_reason=300)


@pytest.mark.parametrize(
    "text,seconds", [("90s", 90), ("2h", 7200), ("1d12h", 129600), ("250ms", 0.25), ("1.5m", 90), (45, 45), ("10", 10)]
)
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5x", "-1s", "s", "1h 30m", "nan", True, "inf", "\u0661s", "\u0661"])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="invalid duration|finite"):
        parse_duration(text)


def test_format_duration():
    assert [format_duration(x) for x in (5, 200, 7500, 273600)] == ["5s", "3m20s", "2h5m", "3d4h"]


def test_environment_numbers_reach_the_job_as_written():
    """YAML 1.1 reads 010 as 8 and 0x1F as 31: an unquoted number must not change on its way to the job."""
    s = parse(
        """\
        queue: /q/a
        worker:
          command: [a]
          environment:
            ZERO_PADDED: 010
            HEX: 0x1F
            GROUPED: 1_000
            DECIMAL: 1.50
            SCIENTIFIC: 6.0e3
            PLAIN: 8
            NEGATIVE: -3
            QUOTED: "010"
        """
    )
    assert s.worker is not None
    assert s.worker.environment == {
        "ZERO_PADDED": "010",
        "HEX": "0x1F",
        "GROUPED": "1_000",
        "DECIMAL": "1.50",
        "SCIENTIFIC": "6.0e3",
        "PLAIN": "8",
        "NEGATIVE": "-3",
        "QUOTED": "010",
    }


@pytest.mark.parametrize(
    "written,kind",
    [("true", "a boolean"), ("yes", "a boolean"), ("off", "a boolean"), ("8", "a number"), ("2024-01-31", "a date")],
)
def test_an_unquoted_value_yaml_reads_as_no_text_is_named_as_written_with_the_fix(written, kind):
    """`command: [true]` meaning /bin/true: the error shows what was typed and says to quote it."""
    with pytest.raises(ConfigError) as info:
        parse_config(f"queue: /q/a\nworker:\n  command: [{written}]\n", path="/etc/q.yaml", name="q")
    message = str(info.value)
    assert message.startswith("/etc/q.yaml:3: worker.command[0]: expected a non-empty string")
    assert f"got {written}, which YAML reads as {kind}" in message
    assert f'write it in quotes ("{written}")' in message


def test_an_unquoted_boolean_in_the_environment_is_named_as_written_with_the_fix():
    with pytest.raises(ConfigError) as info:
        parse("queue: /q/a\nworker:\n  command: [a]\n  environment:\n    VERBOSE: on\n")
    assert 'got on, which YAML reads as a boolean: write it in quotes ("on")' in str(info.value)
    assert str(info.value).startswith("/etc/steadq/queues/render.yaml:5: worker.environment.VERBOSE: ")


@pytest.mark.parametrize("value", ["*.mkv", "*mkv", "&later"])
def test_an_unquoted_glob_or_ampersand_says_to_quote_it(value):
    """`pattern: *.mkv` is YAML alias syntax: the error must say what to do, not only what the scanner saw."""
    with pytest.raises(ConfigError) as info:
        parse_config(f"queue: /q/a\ninbox:\n  path: /srv/in\n  pattern: {value}\n", path="/etc/q.yaml", name="q")
    message = str(info.value)
    assert message.startswith("/etc/q.yaml:4: ")
    assert 'a value that starts with * or & must be in quotes, for example pattern: "*.mkv"' in message


@pytest.mark.parametrize(
    ("value", "expected"), [("name", "name"), ("identity", "identity"), ("off", "off"), ('"off"', "off")]
)
def test_inbox_unique_is_name_identity_or_off(value, expected):
    """A bare `off` is YAML's false: it still means off, as the operator wrote it."""
    settings = parse_config(f"queue: /q/a\ninbox:\n  path: /srv/in\n  unique: {value}\n", path="/etc/q.yaml", name="q")
    assert settings.inbox is not None and settings.inbox.unique == expected


def test_inbox_unique_defaults_to_off():
    settings = parse_config("queue: /q/a\ninbox:\n  path: /srv/in\n", path="/etc/q.yaml", name="q")
    assert settings.inbox is not None and settings.inbox.unique == "off"


@pytest.mark.parametrize("value", ["yes", "true", "path", "1"])
def test_inbox_unique_refuses_anything_else_naming_the_line_and_the_choices(value):
    with pytest.raises(ConfigError) as info:
        parse_config(f"queue: /q/a\ninbox:\n  path: /srv/in\n  unique: {value}\n", path="/etc/q.yaml", name="q")
    message = str(info.value)
    assert message.startswith("/etc/q.yaml:4: inbox.unique: must be one of name, identity, off"), message


def test_inbox_unique_refuses_a_folder_path_too_long_for_a_key():
    long_path = "/srv/" + "d" * 700
    with pytest.raises(ConfigError) as info:
        parse_config(f"queue: /q/a\ninbox:\n  path: {long_path}\n  unique: name\n", path="/etc/q.yaml", name="q")
    assert "inbox.unique: needs a folder path of at most 640 bytes" in str(info.value)
    settings = parse_config(f"queue: /q/a\ninbox:\n  path: {long_path}\n", path="/etc/q.yaml", name="q")
    assert settings.inbox is not None and settings.inbox.unique == "off"


@pytest.mark.parametrize(
    "name", ["AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"]
)
def test_pass_environment_refuses_the_daemon_s_own_credentials(name):
    """The store's keys in the daemon's environment are the daemon's, never a job's (issue 30 C)."""
    text = f"queue: /q/a\nworker:\n  command: [a]\n  pass_environment: [PATH, {name}]\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, path="/etc/steadq/queues/q.yaml", name="q")
    e = info.value
    assert (e.line, e.key) == (4, "worker.pass_environment[1]")
    assert name in str(e) and "remove it from pass_environment" in str(e)


def _worker_of(text: str):
    w = parse_config(text, path="/etc/steadq/queues/q.yaml", name="q").worker
    assert w is not None
    return w


def test_slots_map_each_slot_to_a_value_as_written():
    """Issue 32 #3: one value per slot; a GPU id written as a number reaches the job as written."""
    w = _worker_of('queue: /q/a\nworker:\n  command: [a]\n  concurrency: 3\n  slots: [0, "GPU-1", 02]\n')
    assert w.slots == ("0", "GPU-1", "02")
    assert _worker_of("queue: /q/a\nworker:\n  command: [a]\n  concurrency: 2\n").slots == ()


@pytest.mark.parametrize(
    "slots,fragment,key",
    [
        ("[a, b, c]", "one value per slot: 3 values for concurrency 2", "worker.slots"),
        ("[a]", "one value per slot: 1 value for concurrency 2", "worker.slots"),
        ('[a, ""]', "expected a non-empty string", "worker.slots[1]"),
        ('[a, "x\\0y"]', "must not contain NUL", "worker.slots[1]"),
        ("[a, true]", "write it in quotes", "worker.slots[1]"),
        ("a", "expected a list", "worker.slots"),
    ],
)
def test_bad_slots_are_refused_with_the_rule(slots, fragment, key):
    text = f"queue: /q/a\nworker:\n  command: [a]\n  concurrency: 2\n  slots: {slots}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, path="/etc/steadq/queues/q.yaml", name="q")
    assert info.value.key == key and fragment in str(info.value), str(info.value)


def test_on_bury_and_on_retry_are_argv_lists_with_a_timeout():
    """Issue 32 #6: notification commands are argv (job data reaches them in the environment only)."""
    w = _worker_of(
        "queue: /q/a\nworker:\n  command: [a]\n  on_bury: [/usr/local/bin/tell, buried]\n"
        "  on_retry: [/usr/local/bin/tell, retried]\n  notify_timeout: 5s\n"
    )
    assert w.on_bury == ("/usr/local/bin/tell", "buried") and w.on_retry == ("/usr/local/bin/tell", "retried")
    assert w.notify_timeout == 5.0
    plain = _worker_of("queue: /q/a\nworker:\n  command: [a]\n")
    assert plain.on_bury == () and plain.on_retry == () and plain.notify_timeout == 30.0


@pytest.mark.parametrize(
    "line,fragment,key",
    [
        ("on_bury: 'curl $URL'", "must be a list of arguments", "worker.on_bury"),
        ("on_bury: []", "needs at least the program to run", "worker.on_bury"),
        ("on_retry: ['']", "needs at least the program to run", "worker.on_retry"),
        ("notify_timeout: 0s", "between", "worker.notify_timeout"),
    ],
)
def test_bad_notification_settings_are_refused(line, fragment, key):
    text = f"queue: /q/a\nworker:\n  command: [a]\n  {line}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, path="/etc/steadq/queues/q.yaml", name="q")
    assert info.value.key == key and fragment in str(info.value), str(info.value)
