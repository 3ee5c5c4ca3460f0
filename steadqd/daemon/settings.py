"""The daemons' settings for one queue, as the configuration file gives them (daemon/config.py reads it).

Why a module of its own: every role takes these records, and none but the
config reader needs to know how YAML becomes them. ``open_options`` is the
one home of how a queue's settings become ``backend.open_queue`` options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from steadqd import backend
from steadqd.constants import DEFAULT_BACKOFF_BASE_S, DEFAULT_BACKOFF_MAX_S, DEFAULT_MAX_CLOCK_SKEW_NS, NS_PER_SECOND


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
    # One value per slot (0 … concurrency-1), exported as STEADQ_SLOT_VALUE (a GPU id, say); () for none.
    slots: tuple[str, ...] = ()
    # Notification commands (argv), run once per buried / retried job with job data in their environment.
    on_bury: tuple[str, ...] = ()
    on_retry: tuple[str, ...] = ()
    notify_timeout: float = 30.0

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
