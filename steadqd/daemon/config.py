"""Per-queue YAML configuration: the schema, validation, and where files live.

One file per queue, ``<config dir>/<name>.yaml`` (default /etc/steadq/queues,
overridden by ``--config-dir`` or ``STEADQ_CONFIG_DIR``), read by every
daemon role of that queue. Validation works on the YAML node tree, so every
error names the file, the line and the dotted key. Loading is deliberately
narrow (steadqd/yaml_doc.py: safe scalars only, no anchors or aliases, no
tags, bounded nesting, a size cap), so a config file can never make the
daemon do something it does not say. The records it fills are in
daemon/settings.py.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import yaml

from steadqd import backend
from steadqd.constants import (
    MAX_MAXIMUM_ATTEMPTS,
    MIN_MAXIMUM_ATTEMPTS,
)
from steadqd.daemon.process import DAEMON_CREDENTIAL_VARIABLES
from steadqd.daemon.settings import (
    ExitPolicy,
    InboxConfig,
    PromoterConfig,
    QueueSettings,
    RetrySettings,
    S3Config,
    SweeperConfig,
    WorkerConfig,
    open_options,
)
from steadqd.errors import ConfigError, SteadQError
from steadqd.queue_names import MAX_CONFIG_BYTES, config_path, did_you_mean
from steadqd.queue_names import config_dir as config_dir
from steadqd.queue_names import read_regular as _read_regular
from steadqd.yaml_doc import Doc, compose

# The settings are defined in daemon/settings.py; the roles import them from here, with the reader.
__all__ = [
    "ExitPolicy",
    "InboxConfig",
    "PromoterConfig",
    "QueueSettings",
    "RetrySettings",
    "S3Config",
    "SweeperConfig",
    "WorkerConfig",
    "config_dir",
    "load_config",
    "open_options",
    "parse_config",
]

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


# --- the schema ----------------------------------------------------------------


def _queue_path(d: Doc) -> str:
    p = d.string()
    if "://" in p:
        try:
            return backend.check_queue_url(p)
        except SteadQError as e:
            raise d.error(e.message) from None
    return _dedicated_dir(d, p, "a queue directory", "/var/lib/steadq/<name>")


def _dedicated_dir(d: Doc, p: str, what: str, example: str) -> str:
    """``p`` made absolute and normal, refused when it is a system directory (_FORBIDDEN_QUEUE_ROOTS)."""
    if not os.path.isabs(p):
        raise d.error(f"must be an absolute path, got {p!r}")
    # normpath keeps exactly two leading slashes (POSIX leaves their meaning to the
    # system; Linux reads them as one), so //etc would slip past the check below.
    norm = "/" + os.path.normpath(p).lstrip("/")
    if norm in _FORBIDDEN_QUEUE_ROOTS:
        raise d.error(f"refusing {norm} as {what}; use a dedicated directory such as {example}")
    return norm


def _command(d: Doc, shell: bool) -> tuple[str, ...]:
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


def _exit_policy(d: Doc) -> ExitPolicy:
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


def _retry(d: Doc) -> RetrySettings:
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


def _environment(d: Doc) -> dict[str, str]:
    if not isinstance(d.node, yaml.MappingNode):
        raise d.error("expected a mapping of NAME: value")
    out: dict[str, str] = {}
    for knode, vnode in d.node.value:
        name = knode.value if isinstance(knode, yaml.ScalarNode) else None
        child = Doc(d.path, vnode, f"{d.key}.{name}")
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


def _worker(d: Doc) -> WorkerConfig:
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
        "slots",
        "on_bury",
        "on_retry",
        "notify_timeout",
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
    concurrency = m["concurrency"].integer(1, 1024) if "concurrency" in m else 1
    return WorkerConfig(
        command=_command(m["command"], shell),
        shell=shell,
        concurrency=concurrency,
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
        slots=_slots(m["slots"], concurrency) if "slots" in m else (),
        on_bury=_command(m["on_bury"], False) if "on_bury" in m else (),
        on_retry=_command(m["on_retry"], False) if "on_retry" in m else (),
        notify_timeout=m["notify_timeout"].duration(0.1, 3600.0)
        if "notify_timeout" in m
        else WorkerConfig.notify_timeout,
    )


def _slots(d: Doc, concurrency: int) -> tuple[str, ...]:
    """One value per slot, so every running job has one; a number (a GPU index) is kept as written."""
    values: list[str] = []
    for item in d.items():
        v = item.scalar()
        if isinstance(v, int) and not isinstance(v, bool):
            values.append(item.written() or str(v))
        else:
            values.append(item.string())
    if len(values) != concurrency:
        n = f"{len(values)} value" + ("" if len(values) == 1 else "s")
        raise d.error(f"one value per slot: {n} for concurrency {concurrency}; give exactly {concurrency}")
    return tuple(values)


_SWEEPER_KEYS = {
    "interval",
    "receipt_retention",
    "temp_ttl",
    "dead_retention",
    "max_clock_skew",
    "budget_ops",
    "budget_ms",
}


def _sweeper(d: Doc) -> SweeperConfig:
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


def _promoter(d: Doc) -> PromoterConfig:
    m = d.mapping({"enabled", "max_sleep"})
    return PromoterConfig(
        enabled=m["enabled"].boolean() if "enabled" in m else True,
        max_sleep=m["max_sleep"].duration(0.1, 86400.0) if "max_sleep" in m else PromoterConfig.max_sleep,
    )


def _folder(d: Doc) -> str:
    return _dedicated_dir(d, d.string(), "a watch folder", "/srv/inbox")


def _inside(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/")


_INBOX_KEYS = {"path", "pattern", "settle", "payload", "after", "move_to", "max_attempts", "unique"}
# A unique key is "inbox:<path>/<name>" plus " size=N mtime_ns=N" (steadqd.daemon.inbox.files.unique_key),
# at most UNIQUE_KEY_MAX bytes: a name may be 255 bytes, the rest is the folder's path.
INBOX_UNIQUE_PATH_MAX = 640


def _unique(d: Doc, path: str) -> str:
    v = d.scalar()
    value = "off" if v is False else d.choice(("name", "identity", "off"))  # YAML reads a bare off as false
    if value != "off" and len(os.fsencode(path)) > INBOX_UNIQUE_PATH_MAX:
        raise d.error(
            f"needs a folder path of at most {INBOX_UNIQUE_PATH_MAX} bytes (the path is part of each file's key); "
            "use a shorter path or unique: off"
        )
    return value


def _inbox(d: Doc) -> InboxConfig:
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


def _refuse_secrets(d: Doc) -> None:
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


def _s3(d: Doc) -> S3Config:
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


_SECTIONS: dict[str, Callable[[Doc], Any]] = {
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
    root = Doc(path, compose(text, path), "")
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


def _bucket_limits(m: dict[str, Doc]) -> None:
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


def _metrics_textfile(d: Doc) -> str:
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
