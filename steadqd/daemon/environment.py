"""A job command's environment: built from the configuration and the job, nothing else.

Nothing of the daemon's environment leaks except the names listed in
``pass_environment``, and job facts travel as data in ``STEADQ_*``
variables, never as command text, so metadata cannot become shell syntax
or argv (docs/configuration.md, "Environment of every job").
"""

from __future__ import annotations

from collections.abc import Mapping

from steadqd.backend import LeaseHandle
from steadqd.daemon.config import WorkerConfig

__all__ = ["build_environment", "meta_env_name", "meta_env_value", "slot_environment"]


def meta_env_name(key: str) -> str:
    """STEADQ_META_<KEY>: metadata keys are ``[a-z0-9][a-z0-9._-]*`` (records.md)."""
    return "STEADQ_META_" + key.upper().replace(".", "_").replace("-", "_")


def meta_env_value(value: object) -> str | None:
    """The environment form of a metadata value, or None if it cannot be one (NUL)."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, bytes):
        text = value.hex()
    elif isinstance(value, str):
        text = value
    else:
        return None
    return None if "\0" in text else text


def build_environment(
    cfg: WorkerConfig,
    lease: LeaseHandle,
    *,
    queue_name: str,
    queue_path: str,
    parent_env: Mapping[str, str],
    payload_file: str | None = None,
    progress_file: str | None = None,
) -> dict[str, str]:
    """The command's whole environment, from the configuration only."""
    env: dict[str, str] = {}
    for name in cfg.pass_environment:
        try:  # ``if name in parent_env`` asks os.environ's __getitem__ too: one lookup, not two (6 calls a name)
            env[name] = parent_env[name]
        except KeyError:
            pass
    env.update(cfg.environment)
    env["STEADQ_QUEUE"] = queue_name
    env["STEADQ_QUEUE_PATH"] = queue_path
    env["STEADQ_JOB_ID"] = lease.job_id
    env["STEADQ_ATTEMPT"] = str(lease.attempt)
    env["STEADQ_MAX_ATTEMPTS"] = str(lease.max_attempts)
    env["STEADQ_CONTENT_TYPE"] = lease.content_type
    metadata = lease.metadata  # loads the extension, which also carries the producer id
    producer = lease.producer_id
    if producer and "\0" not in producer:
        env["STEADQ_PRODUCER_ID"] = producer
    for key in sorted(metadata):
        name, value = meta_env_name(key), meta_env_value(metadata[key])
        if value is not None and name not in env:  # "a.b" and "a-b" collide: the first (sorted) wins
            env[name] = value
    if payload_file is not None:
        env["STEADQ_PAYLOAD_FILE"] = payload_file
    if progress_file is not None:
        env["STEADQ_PROGRESS"] = progress_file
    return env


def slot_environment(cfg: WorkerConfig, slot: int) -> dict[str, str]:
    """STEADQ_SLOT (and STEADQ_SLOT_VALUE from ``worker.slots``) of the slot a job runs in."""
    env = {"STEADQ_SLOT": str(slot)}
    if slot < len(cfg.slots):
        env["STEADQ_SLOT_VALUE"] = cfg.slots[slot]
    return env
