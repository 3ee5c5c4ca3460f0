"""Per-queue YAML configuration: schema, validation, and where files live.

One file per queue, ``<config dir>/<name>.yaml`` (default /etc/steadq/queues,
overridden by ``--config-dir`` or ``STEADQ_CONFIG_DIR``), read by every
daemon role of that queue. Validation works on the YAML node tree, so every
error names the file, the line and the dotted key. Loading is deliberately
narrow: safe scalars only, no anchors/aliases (alias bombs), no tags, a size
cap, so a config file can never make the daemon do something it does not say.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from steadqd import backend
from steadqd.constants import (
    DEFAULT_BACKOFF_BASE_S,
    DEFAULT_BACKOFF_MAX_S,
    DEFAULT_MAX_CLOCK_SKEW_NS,
    MAX_MAXIMUM_ATTEMPTS,
    MIN_MAXIMUM_ATTEMPTS,
    NS_PER_SECOND,
)
from steadqd.daemon.process import DAEMON_CREDENTIAL_VARIABLES
from steadqd.durations import parse_duration
from steadqd.errors import ConfigError, SteadQError
from steadqd.queue_names import MAX_CONFIG_BYTES, config_path, did_you_mean
from steadqd.queue_names import config_dir as config_dir
from steadqd.queue_names import read_regular as _read_regular
from steadqd.text import printable

MAX_CONFIG_DEPTH = 32  # nesting levels; bounds yaml.compose recursion
DEAD_RETENTION_MIN = 3600.0  # seconds; sweeper.dead_retention's lower bound
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A queue there would put the daemon's renames and unlinks into system trees.
_FORBIDDEN_QUEUE_ROOTS = {
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib64",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var",
    "/var/lib",
    "/home",
    "/tmp",
}


@dataclass(frozen=True)
class ExitPolicy:
    """How a command's exit status settles its job (applied by steadqd.daemon.worker.policy)."""

    ack: frozenset[int] = frozenset({0})
    retry: frozenset[int] = frozenset({75})  # EX_TEMPFAIL
    bury: frozenset[int] = frozenset({100})
    other: str = "retry"  # any other status (and death by signal): "retry" or "bury"
    bury_reason: int = 0x0001  # consumer_rejected


@dataclass(frozen=True)
class RetrySettings:
    backoff_base: float = DEFAULT_BACKOFF_BASE_S
    backoff_max: float = DEFAULT_BACKOFF_MAX_S
    jitter: bool = True


@dataclass(frozen=True)
class WorkerConfig:
    command: tuple[str, ...]
    shell: bool = False
    concurrency: int = 1
    lease: float = 60.0
    renew_every: float | None = None  # default: a third of the lease
    timeout: float | None = None
    kill_grace: float = 10.0
    input: str = "stdin"  # "stdin": payload on stdin; "file": STEADQ_PAYLOAD_FILE names a read-only copy
    environment: dict[str, str] = field(default_factory=dict)
    pass_environment: tuple[str, ...] = ("PATH", "LANG", "LC_ALL", "TZ")
    working_directory: str | None = None
    user: str | None = None
    group: str | None = None
    exit_status: ExitPolicy = ExitPolicy()
    retry: RetrySettings = RetrySettings()

    @property
    def renew_interval(self) -> float:
        return self.renew_every if self.renew_every is not None else self.lease / 3


@dataclass(frozen=True)
class SweeperConfig:
    interval: float = 30.0
    receipt_retention: float = 7 * 86400.0
    temp_ttl: float = 86400.0
    # None (the default, and the reference's behaviour): dead jobs are kept
    # until an operator removes them. Deletion is permanent, hence opt-in.
    dead_retention: float | None = None
    # How far recovery trusts a wall watermark ahead of this host's clock.
    max_clock_skew: float = DEFAULT_MAX_CLOCK_SKEW_NS / NS_PER_SECOND
    budget_ops: int = 1000
    budget_ms: int = 100


@dataclass(frozen=True)
class PromoterConfig:
    enabled: bool = True
    max_sleep: float = 60.0  # re-check at least this often (wall-clock jumps, missed events)


@dataclass(frozen=True)
class InboxConfig:
    """A watch folder (steadqd.daemon.inbox): each completed file becomes one job."""

    path: str
    pattern: str = "*"
    settle: float = 5.0
    payload: str = "path"  # "path": the file's path, "content": its bytes
    after: str = "keep"  # "keep", "move" (to move_to) or "delete", once the job is durable
    move_to: str | None = None
    max_attempts: int = 3
    # "off", "name" (one job per file name) or "identity" (per name, size and mtime) while its job is in the queue
    unique: str = "off"


@dataclass(frozen=True)
class S3Config:
    """How the daemons reach a bucket queue's store (``s3:``). Never a secret: that lives in ``credentials_file``.

    ``None`` leaves a setting to the AWS environment (``AWS_PROFILE``, the
    default credentials chain) or to the backend's default (the idle poll cap).
    """

    credentials_file: str | None = None
    aws_profile: str | None = None
    store_profile: str | None = None
    idle_poll_max: float | None = None
    doorbell_interval: float | None = None
    certify: bool = True  # the worker certifies the store once at start


@dataclass(frozen=True)
class QueueSettings:
    """Everything one queue's daemons need, validated."""

    name: str
    source: str
    queue: str
    worker: WorkerConfig | None
    sweeper: SweeperConfig = SweeperConfig()
    promoter: PromoterConfig = PromoterConfig()
    # Skip the file-system type check (layout.md): for file systems steadq does
    # not vouch for, at the operator's risk. Off unless the file says so.
    allow_unsupported_fs: bool = False
    inbox: InboxConfig | None = None
    # A node-exporter textfile each daemon writes its counters to (steadqd.daemon.metrics).
    metrics_textfile: str | None = None
    # Only for a bucket queue (`queue: s3://...`); None there means every setting from the AWS environment.
    s3: S3Config | None = None

    @property
    def bucket(self) -> bool:
        """The queue is a bucket queue (``s3://``), not a directory."""
        return backend.is_bucket_url(self.queue)


def open_options(settings: QueueSettings, *, certify: bool = False) -> dict[str, Any]:
    """What every role passes to ``backend.open_queue`` for this queue: the one home of that mapping.

    ``certify`` asks a bucket queue's opener to certify the store first (the
    worker at start, ``check-config --open``), if ``s3.certify`` allows it.
    """
    if not settings.bucket:
        return {"allow_unsupported_fs": settings.allow_unsupported_fs}
    cfg = settings.s3 or S3Config()
    options: dict[str, Any] = {"certify_store": certify and cfg.certify}
    for name in ("credentials_file", "aws_profile", "store_profile", "idle_poll_max", "doorbell_interval"):
        value = getattr(cfg, name)
        if value is not None:
            options[name] = value
    return options


# --- YAML with positions ---------------------------------------------------------


class _Doc:
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

    def mapping(self, allowed: set[str]) -> dict[str, _Doc]:
        if not isinstance(self.node, yaml.MappingNode):
            raise self.error("expected a mapping of keys")
        out: dict[str, _Doc] = {}
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
            out[name] = _Doc(self.path, vnode, child)
        return out

    def scalar(self) -> Any:
        if not isinstance(self.node, yaml.ScalarNode):
            raise self.error("expected a single value")
        return yaml.SafeLoader("").construct_object(self.node)

    def items(self) -> list[_Doc]:
        if not isinstance(self.node, yaml.SequenceNode):
            raise self.error("expected a list")
        return [_Doc(self.path, n, f"{self.key}[{i}]") for i, n in enumerate(self.node.value)]

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


def _check_events(text: str, path: str) -> None:
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


def _deep_flow_prefix(text: str) -> str | None:
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


def _refuse_deep_flow(text: str, path: str) -> None:
    """Raise the nesting refusal when a prefix of ``text`` already nests too deep; else return."""
    prefix = _deep_flow_prefix(text)
    if prefix is None:
        return
    # A prefix holds the events of the whole text up to its end, or fewer levels (a ':' past
    # the cut can only add the mapping of a key): whatever else it meets is left to the full parse.
    try:
        _check_events(prefix, path)
    except ConfigError as e:
        if str(e).endswith(": " + _TOO_DEEP):
            raise
    except yaml.YAMLError:
        pass


def _compose(text: str, path: str) -> yaml.Node:
    """Parse with the safe loader, refusing anchors, aliases, tags and deep nesting first."""
    try:
        _refuse_deep_flow(text, path)
        _check_events(text, path)
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


# --- the schema ----------------------------------------------------------------


def _queue_path(d: _Doc) -> str:
    p = d.string()
    if "://" in p:
        try:
            return backend.check_queue_url(p)
        except SteadQError as e:
            raise d.error(e.message) from None
    if not os.path.isabs(p):
        raise d.error(f"must be an absolute path, got {p!r}")
    # normpath keeps exactly two leading slashes (POSIX leaves their meaning to the
    # system; Linux reads them as one), so //etc would slip past the check below.
    norm = "/" + os.path.normpath(p).lstrip("/")
    if norm in _FORBIDDEN_QUEUE_ROOTS:
        raise d.error(f"refusing {norm} as a queue directory; use a dedicated directory such as /var/lib/steadq/<name>")
    return norm


def _command(d: _Doc, shell: bool) -> tuple[str, ...]:
    if isinstance(d.node, yaml.ScalarNode):
        if not shell:
            raise d.error("must be a list of arguments (argv); a string runs through a shell only with `shell: true`")
        return (d.string(),)
    argv = tuple(item.string(allow_empty=True) for item in d.items())
    if not argv or not argv[0]:
        raise d.error("needs at least the program to run")
    if shell and len(argv) != 1:
        raise d.error("with `shell: true` give the command as one string")
    return argv


def _exit_policy(d: _Doc) -> ExitPolicy:
    m = d.mapping({"ack", "retry", "bury", "other", "bury_reason"})
    base = ExitPolicy()
    policy = ExitPolicy(
        ack=m["ack"].statuses() if "ack" in m else base.ack,
        retry=m["retry"].statuses() if "retry" in m else base.retry,
        bury=m["bury"].statuses() if "bury" in m else base.bury,
        other=m["other"].choice(("retry", "bury")) if "other" in m else base.other,
        bury_reason=m["bury_reason"].integer(0, 0xFFFF) if "bury_reason" in m else base.bury_reason,
    )
    for a, b in (("ack", "retry"), ("ack", "bury"), ("retry", "bury")):
        both = getattr(policy, a) & getattr(policy, b)
        if both:
            where = m.get(b) or m.get(a) or d  # point at the list the user wrote
            raise where.error(f"exit status {min(both)} is listed under both {a} and {b}")
    return policy


def _retry(d: _Doc) -> RetrySettings:
    m = d.mapping({"backoff_base", "backoff_max", "jitter"})
    base = RetrySettings()
    out = RetrySettings(
        backoff_base=m["backoff_base"].duration(0.001) if "backoff_base" in m else base.backoff_base,
        backoff_max=m["backoff_max"].duration(0.001) if "backoff_max" in m else base.backoff_max,
        jitter=m["jitter"].boolean() if "jitter" in m else base.jitter,
    )
    if out.backoff_max < out.backoff_base:
        raise (m.get("backoff_max") or d).error("backoff_max must not be smaller than backoff_base")
    return out


def _environment(d: _Doc) -> dict[str, str]:
    if not isinstance(d.node, yaml.MappingNode):
        raise d.error("expected a mapping of NAME: value")
    out: dict[str, str] = {}
    for knode, vnode in d.node.value:
        name = knode.value if isinstance(knode, yaml.ScalarNode) else None
        child = _Doc(d.path, vnode, f"{d.key}.{name}")
        if not name or not _ENV_NAME.fullmatch(name):
            raise child.error("environment variable names are letters, digits and _")
        if name.startswith("STEADQ_"):
            raise child.error("STEADQ_* variables are set by the worker for each job")
        v = child.scalar()
        if isinstance(v, bool) or v is None or not isinstance(v, str | int | float):
            raise child.error(f"expected a string value, {child.got(v)}")
        # A number is passed as typed: YAML 1.1 reads 010 as 8 and 0x1F as 31.
        out[name] = v if isinstance(v, str) else (child.written() or str(v))
    return out


def _worker(d: _Doc) -> WorkerConfig:
    keys = {
        "command",
        "shell",
        "concurrency",
        "lease",
        "renew_every",
        "timeout",
        "kill_grace",
        "input",
        "environment",
        "pass_environment",
        "working_directory",
        "user",
        "group",
        "exit_status",
        "retry",
    }
    m = d.mapping(keys)
    if "command" not in m:
        raise d.error("missing required key `command`")
    shell = m["shell"].boolean() if "shell" in m else False
    lease = m["lease"].duration(1.0, 7 * 86400.0) if "lease" in m else WorkerConfig.lease
    renew = m["renew_every"].duration(0.1, 7 * 86400.0) if "renew_every" in m else None
    if renew is not None and renew >= lease:
        raise m["renew_every"].error(
            f"must be shorter than the lease ({lease:g}s), or the lease expires between renewals"
        )
    wd = m["working_directory"].string() if "working_directory" in m else None
    if wd is not None and not os.path.isabs(wd):
        raise m["working_directory"].error("must be an absolute path")
    passed = (
        tuple(i.string() for i in m["pass_environment"].items())
        if "pass_environment" in m
        else WorkerConfig.pass_environment
    )
    for i, name in enumerate(passed):
        if not _ENV_NAME.fullmatch(name):
            raise m["pass_environment"].items()[i].error("not a valid environment variable name")
        if name in DAEMON_CREDENTIAL_VARIABLES:
            raise (
                m["pass_environment"]
                .items()[i]
                .error(
                    f"{name} is the daemon's own store credential, never a job's: remove it from pass_environment "
                    "(a job that needs the store gets credentials of its own, e.g. "
                    "environment: {AWS_SHARED_CREDENTIALS_FILE: /path/it/may/read})"
                )
            )
    return WorkerConfig(
        command=_command(m["command"], shell),
        shell=shell,
        concurrency=m["concurrency"].integer(1, 1024) if "concurrency" in m else 1,
        lease=lease,
        renew_every=renew,
        timeout=m["timeout"].optional_duration(0.001) if "timeout" in m else None,
        kill_grace=m["kill_grace"].duration(0.0, 3600.0) if "kill_grace" in m else WorkerConfig.kill_grace,
        input=m["input"].choice(("stdin", "file")) if "input" in m else "stdin",
        environment=_environment(m["environment"]) if "environment" in m else {},
        pass_environment=passed,
        working_directory=wd,
        user=m["user"].string() if "user" in m else None,
        group=m["group"].string() if "group" in m else None,
        exit_status=_exit_policy(m["exit_status"]) if "exit_status" in m else ExitPolicy(),
        retry=_retry(m["retry"]) if "retry" in m else RetrySettings(),
    )


_SWEEPER_KEYS = {
    "interval",
    "receipt_retention",
    "temp_ttl",
    "dead_retention",
    "max_clock_skew",
    "budget_ops",
    "budget_ms",
}


def _sweeper(d: _Doc) -> SweeperConfig:
    m = d.mapping(_SWEEPER_KEYS)
    base = SweeperConfig()
    return SweeperConfig(
        interval=m["interval"].duration(0.1, 86400.0) if "interval" in m else base.interval,
        receipt_retention=m["receipt_retention"].duration(60.0) if "receipt_retention" in m else base.receipt_retention,
        temp_ttl=m["temp_ttl"].duration(60.0) if "temp_ttl" in m else base.temp_ttl,
        # At least an hour: a dead letter is evidence an operator may still
        # need, and a seconds-long retention is almost certainly a typo.
        dead_retention=m["dead_retention"].optional_duration(DEAD_RETENTION_MIN)
        if "dead_retention" in m
        else base.dead_retention,
        max_clock_skew=m["max_clock_skew"].duration(1.0, 365 * 86400.0)
        if "max_clock_skew" in m
        else base.max_clock_skew,
        budget_ops=m["budget_ops"].integer(1, 10_000_000) if "budget_ops" in m else base.budget_ops,
        budget_ms=m["budget_ms"].integer(1, 3_600_000) if "budget_ms" in m else base.budget_ms,
    )


def _promoter(d: _Doc) -> PromoterConfig:
    m = d.mapping({"enabled", "max_sleep"})
    return PromoterConfig(
        enabled=m["enabled"].boolean() if "enabled" in m else True,
        max_sleep=m["max_sleep"].duration(0.1, 86400.0) if "max_sleep" in m else PromoterConfig.max_sleep,
    )


def _folder(d: _Doc) -> str:
    p = d.string()
    if not os.path.isabs(p):
        raise d.error(f"must be an absolute path, got {p!r}")
    norm = "/" + os.path.normpath(p).lstrip("/")
    if norm in _FORBIDDEN_QUEUE_ROOTS:
        raise d.error(f"refusing {norm} as a watch folder; use a dedicated directory such as /srv/inbox")
    return norm


def _inside(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/")


_INBOX_KEYS = {"path", "pattern", "settle", "payload", "after", "move_to", "max_attempts", "unique"}
# A unique key is "inbox:<path>/<name>" plus " size=N mtime_ns=N" (steadqd.daemon.inbox.files.unique_key),
# at most UNIQUE_KEY_MAX bytes: a name may be 255 bytes, the rest is the folder's path.
INBOX_UNIQUE_PATH_MAX = 640


def _unique(d: _Doc, path: str) -> str:
    v = d.scalar()
    value = "off" if v is False else d.choice(("name", "identity", "off"))  # YAML reads a bare off as false
    if value != "off" and len(os.fsencode(path)) > INBOX_UNIQUE_PATH_MAX:
        raise d.error(
            f"needs a folder path of at most {INBOX_UNIQUE_PATH_MAX} bytes (the path is part of each file's key); "
            "use a shorter path or unique: off"
        )
    return value


def _inbox(d: _Doc) -> InboxConfig:
    m = d.mapping(_INBOX_KEYS)
    if "path" not in m:
        raise d.error("missing required key `path` (the folder to watch)")
    path = _folder(m["path"])
    pattern = m["pattern"].string() if "pattern" in m else InboxConfig.pattern
    if "/" in pattern:
        raise m["pattern"].error("a pattern matches file names in the folder; it cannot contain '/'")
    payload = m["payload"].choice(("path", "content")) if "payload" in m else InboxConfig.payload
    after = m["after"].choice(("keep", "move", "delete")) if "after" in m else InboxConfig.after
    if after == "delete" and payload == "path":
        raise m["after"].error(
            "`after: delete` needs `payload: content`: with `payload: path` the job would get the path of a deleted file"
        )
    move_to = _folder(m["move_to"]) if "move_to" in m else None
    if after == "move" and move_to is None:
        raise (m.get("after") or d).error("`after: move` needs `move_to:`, the folder the files go to")
    if move_to is not None and after != "move":
        raise m["move_to"].error(f"`move_to:` is used only with `after: move` (here `after: {after}`)")
    if move_to is not None and move_to == path:
        raise m["move_to"].error("must be another folder than `path`, or every moved file would be taken again")
    return InboxConfig(
        path=path,
        pattern=pattern,
        settle=m["settle"].duration(0.0, 86400.0) if "settle" in m else InboxConfig.settle,
        payload=payload,
        after=after,
        move_to=move_to,
        max_attempts=m["max_attempts"].integer(MIN_MAXIMUM_ATTEMPTS, MAX_MAXIMUM_ATTEMPTS)
        if "max_attempts" in m
        else InboxConfig.max_attempts,
        unique=_unique(m["unique"], path) if "unique" in m else InboxConfig.unique,
    )


# Keys that would put a secret in the file (it is read by every role and often kept in version control).
_SECRET_KEYS = frozenset(
    {
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "access_key",
        "access_key_id",
        "secret",
        "secret_key",
        "secret_access_key",
        "session_token",
        "password",
    }
)
_S3_KEYS = {"credentials_file", "aws_profile", "store_profile", "idle_poll_max", "doorbell_interval", "certify"}


def _refuse_secrets(d: _Doc) -> None:
    """A key that holds a secret is refused by name, before any "unknown key" error could hide why."""
    if not isinstance(d.node, yaml.MappingNode):
        return
    for knode, _ in d.node.value:
        name = knode.value if isinstance(knode, yaml.ScalarNode) else None
        if isinstance(name, str) and name.lower() in _SECRET_KEYS:
            key = f"{d.key}.{name}" if d.key else name
            raise ConfigError(
                "a secret does not belong in a queue's YAML file: put the keys in an AWS shared-credentials "
                "file ([default] aws_access_key_id = ..., aws_secret_access_key = ...) readable only by the "
                "service user (chown steadq, chmod 600) and name it in `s3: credentials_file:`",
                path=d.path,
                line=knode.start_mark.line + 1,
                key=key,
            )


def _s3(d: _Doc) -> S3Config:
    _refuse_secrets(d)
    m = d.mapping(_S3_KEYS)
    credentials = None
    if "credentials_file" in m:
        credentials = m["credentials_file"].string()
        if not os.path.isabs(credentials):
            raise m["credentials_file"].error(f"must be an absolute path, got {credentials!r}")
    return S3Config(
        credentials_file=credentials,
        aws_profile=m["aws_profile"].string() if "aws_profile" in m else None,
        store_profile=m["store_profile"].string() if "store_profile" in m else None,
        idle_poll_max=m["idle_poll_max"].duration(0.05, 3600.0) if "idle_poll_max" in m else None,
        doorbell_interval=m["doorbell_interval"].duration(0.05, 3600.0) if "doorbell_interval" in m else None,
        certify=m["certify"].boolean() if "certify" in m else True,
    )


_SECTIONS: dict[str, Callable[[_Doc], Any]] = {
    "worker": _worker,
    "sweeper": _sweeper,
    "promoter": _promoter,
    "inbox": _inbox,
    "s3": _s3,
}


def parse_config(text: str, *, path: str, name: str) -> QueueSettings:
    """Validate one queue's config text; raises ConfigError naming file:line and key."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_CONFIG_BYTES:
        raise ConfigError(f"file is larger than {MAX_CONFIG_BYTES} bytes", path=path)
    root = _Doc(path, _compose(text, path), "")
    _refuse_secrets(root)
    m = root.mapping({"queue", "allow_unsupported_fs", "metrics_textfile", *_SECTIONS})
    if "queue" not in m:
        raise root.error("missing required key `queue` (the queue directory, or s3://BUCKET/PREFIX)")
    sections = {k: fn(m[k]) for k, fn in _SECTIONS.items() if k in m}
    queue = _queue_path(m["queue"])
    if backend.is_bucket_url(queue):
        _bucket_limits(m)
    elif "s3" in m:
        raise m["s3"].error(f"`s3:` configures a bucket queue (queue: s3://BUCKET/PREFIX); {queue} is a directory")
    inbox = sections.get("inbox")
    if inbox is not None and (_inside(inbox.path, queue) or _inside(queue, inbox.path)):
        where = m["inbox"].mapping(_INBOX_KEYS)["path"]
        raise where.error(f"the watch folder and the queue {queue} must not contain one another")
    return QueueSettings(
        name=name,
        source=path,
        queue=queue,
        worker=sections.get("worker"),
        sweeper=sections.get("sweeper", SweeperConfig()),
        promoter=sections.get("promoter", PromoterConfig()),
        allow_unsupported_fs=m["allow_unsupported_fs"].boolean() if "allow_unsupported_fs" in m else False,
        inbox=inbox,
        metrics_textfile=_metrics_textfile(m["metrics_textfile"]) if "metrics_textfile" in m else None,
        s3=sections.get("s3"),
    )


def _bucket_limits(m: dict[str, _Doc]) -> None:
    """What a bucket queue cannot honour is refused here, in one line naming the setting."""
    if "allow_unsupported_fs" in m:
        raise m["allow_unsupported_fs"].error("is a setting of directory queues; a bucket queue has no filesystem")
    if "inbox" in m:
        raise m["inbox"].error(
            "a watch folder cannot feed a bucket queue yet: its jobs carry metadata (the file's name), which "
            "StowQ/1 job records have no field for; run the inbox on a directory queue"
        )
    sweeper = m.get("sweeper")
    if sweeper is not None and isinstance(sweeper.node, yaml.MappingNode):
        given = sweeper.mapping(_SWEEPER_KEYS)
        if "max_clock_skew" in given:
            raise given["max_clock_skew"].error(
                "does not apply to a bucket queue: its clock is the store's (clock beacons), never a host's"
            )


def _metrics_textfile(d: _Doc) -> str:
    p = d.string()
    if not os.path.isabs(p) or not p.endswith(".prom") or p.endswith("/.prom"):
        raise d.error(
            f"must be an absolute path ending in .prom (node-exporter reads only *.prom), got {p!r}; "
            "e.g. /var/lib/steadq/metrics/<queue>.prom"
        )
    return os.path.normpath(p)


def load_config(name: str, directory: str | None = None) -> QueueSettings:
    """Read and validate ``<config dir>/<name>.yaml``."""
    path = config_path(name, directory)
    try:
        raw = _read_regular(path, MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(
            f"no configuration for queue {name!r} (expected {path}){did_you_mean(name, directory)}", path=path
        ) from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", path=path) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"file is larger than {MAX_CONFIG_BYTES} bytes", path=path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 (byte {e.start})", path=path) from None
    return parse_config(text, path=path, name=name)
