"""Queue names: where a queue's configuration file lives, and which queue a name means.

Why a module of its own, below the programs: the daemons (``steadqd worker
transcode``, ``steadq-worker@transcode``) and the command line (``steadq stats
transcode``) must agree on what the name ``transcode`` means, and the two
programs may not import each other (pyproject.toml, import-linter). So the
config directory (its default, ``--config-dir``, ``$STEADQ_CONFIG_DIR``), the
rule for a queue's name, the safe read of a config file and the suggestions
for a mistyped name live here once.

The daemons validate a whole file (``steadqd.daemon.config``); the command
line reads only what opening the queue takes (:func:`read_queue_entry`), and
points at ``steadqd check-config`` for anything more.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any

import yaml

from steadqd.errors import ConfigError
from steadqd.yaml_doc import check_events, refuse_deep_flow

DEFAULT_CONFIG_DIR = "/etc/steadq/queues"
CONFIG_DIR_ENV = "STEADQ_CONFIG_DIR"
MAX_CONFIG_BYTES = 256 * 1024
QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# `s3:` settings that say how to reach the store: what a program opening the queue must pass on.
S3_ACCESS_SETTINGS = ("credentials_file", "aws_profile", "store_profile")
# Where a bucket queue's store is, from ``<config dir>/<name>.env`` (the units' ``EnvironmentFile=``,
# docs/stowq.md): the variable and the option ``backend.open_queue`` takes for it. Only these are
# read: the endpoint and region say where the daemons' requests go; anything else in the file
# (a proxy, keys) is the units' business, and a command run by a person keeps its own.
ENV_FILE_SETTINGS = {"AWS_ENDPOINT_URL": "endpoint_url", "AWS_REGION": "region"}
MAX_ENV_FILE_BYTES = 64 * 1024


def config_dir(override: str | None = None) -> str:
    """The directory of ``<queue>.yaml`` files: ``--config-dir``, else ``$STEADQ_CONFIG_DIR``, else the default."""
    return override or os.environ.get(CONFIG_DIR_ENV) or DEFAULT_CONFIG_DIR


def is_queue_name(text: str) -> bool:
    return QUEUE_NAME.fullmatch(text) is not None


def config_path(name: str, directory: str | None = None) -> str:
    """``<config dir>/<name>.yaml``; ConfigError for a word that cannot be a queue's name."""
    if not is_queue_name(name):
        raise ConfigError(f"invalid queue name {name!r}: letters, digits, '.', '_' and '-', at most 64")
    return os.path.join(config_dir(directory), f"{name}.yaml")


def configured_names(directory: str | None = None) -> list[str]:
    """The names of the queues configured in the directory, sorted (OSError if it cannot be listed)."""
    names = (f[: -len(".yaml")] for f in os.listdir(config_dir(directory)) if f.endswith(".yaml"))
    return sorted(n for n in names if is_queue_name(n))


def did_you_mean(name: str, directory: str | None = None) -> str:
    """``" (did you mean transcode?)"`` for a name close to a configured one, else ``""``.

    Why: a unit instance or a command with a mistyped name (``steadq-worker@transcod``)
    otherwise only says that a file is missing, not which one was meant."""
    try:
        known = configured_names(directory)
    except OSError:
        return ""
    close = difflib.get_close_matches(name, known, n=3)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def read_regular(path: str, limit: int) -> bytes:
    """Up to ``limit`` bytes of a regular file (a symlink to one is fine), never waiting.

    A plain open() of a FIFO blocks until a writer appears, so the daemon and
    check-config would hang; a FIFO, socket or directory is refused instead.
    FileNotFoundError is raised as it is, for the caller to say what was looked for.
    """
    refusal = ConfigError("is not a regular file; it must be the queue's YAML configuration", path=path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError:
        with contextlib.suppress(OSError):
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise refusal from None  # ENXIO: a socket, EISDIR: a directory, ...
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise refusal
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


@dataclass(frozen=True)
class QueueEntry:
    """A configured queue as a program opening it needs it."""

    name: str
    config: str  # the file it was read from
    queue: str  # a directory or an s3:// URL, as the file says
    options: dict[str, Any] = field(default_factory=dict)  # for backend.open_queue


def read_queue_entry(name: str, directory: str | None = None) -> QueueEntry:
    """The queue ``<config dir>/<name>.yaml`` names, and the options its daemons open it with.

    FileNotFoundError when there is no such file, another OSError when it
    cannot be read; ConfigError (naming the file and ``steadqd check-config``)
    when it is not a configuration with a ``queue:``. Only the keys that
    opening the queue takes are read.
    """
    path = config_path(name, directory)
    check = f"(steadqd check-config {name} says more)"
    raw = read_regular(path, MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"file is larger than {MAX_CONFIG_BYTES} bytes", path=path)
    try:
        text = raw.decode("utf-8")
        # The daemons' own refusals first (aliases, tags, deep nesting), so the two readers agree on a file.
        refuse_deep_flow(text, path)
        check_events(text, path)
        doc = yaml.safe_load(text)
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError, ConfigError):
        raise ConfigError(f"not a valid configuration {check}", path=path) from None
    queue = doc.get("queue") if isinstance(doc, dict) else None
    if not isinstance(queue, str) or not queue:
        raise ConfigError(f"no `queue:` (a directory or s3://BUCKET/PREFIX) {check}", path=path)
    options: dict[str, Any] = {}
    if queue.startswith("s3://"):
        s3 = doc.get("s3") or {}
        for key in S3_ACCESS_SETTINGS if isinstance(s3, dict) else ():
            if isinstance(s3.get(key), str):
                options[key] = s3[key]
        options.update(read_env_settings(path[: -len(".yaml")] + ".env"))
    elif doc.get("allow_unsupported_fs") is True:
        options["allow_unsupported_fs"] = True
    return QueueEntry(name, path, queue, options)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def read_env_settings(path: str) -> dict[str, str]:
    """The :data:`ENV_FILE_SETTINGS` a units' environment file sets, as open options; {} when there is none.

    The file is systemd's ``EnvironmentFile=`` format; the subset read here is what
    docs/stowq.md writes: ``KEY=VALUE`` lines, ``#`` and ``;`` comments, a value in
    matching quotes. A later line wins, as in systemd. A file that exists but
    cannot be read raises the OSError (naming it): a command that went to another
    store instead would show, and change, the wrong queue.
    """
    try:
        raw = read_regular(path, MAX_ENV_FILE_BYTES + 1)
    except FileNotFoundError:
        return {}
    if len(raw) > MAX_ENV_FILE_BYTES:
        raise ConfigError(f"file is larger than {MAX_ENV_FILE_BYTES} bytes", path=path)
    found: dict[str, str] = {}
    for line in raw.decode("utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, eq, value = line.partition("=")
        option = ENV_FILE_SETTINGS.get(key.strip())
        if eq and option is not None:
            found[option] = _unquote(value.strip())
    return {k: v for k, v in found.items() if v}
