"""The demo's queue and its configuration: created on the first run, reused on the next.

The queue has SHARDS shards and 1-second delayed buckets (retries come back
quickly); the configuration is an ordinary ``<name>.yaml``, the schema of
/etc/steadq/queues/, whose worker command is ``python -m steadqd.demo.job``.
"""

from __future__ import annotations

import json
import os
import sys

from steadqd.backend import Backend, init_queue, open_queue
from steadqd.errors import ErrorKind, SteadQError

QUEUE_NAME = "demo"
SHARDS = 16  # of a queue the demo creates (one it reuses keeps its own)
BURY_REASON = 0x0100  # the first application reason code: "the job itself is bad"
_DELAYED_WIDTH_NS = 1_000_000_000
_TERMINAL_WIDTH_NS = 3_600_000_000_000


def open_or_create(base: str, queue_path: str, *, s3: bool) -> tuple[Backend, bool]:
    """The demo's queue, and whether this run created it."""
    os.makedirs(base, exist_ok=True)
    if s3:
        try:
            return open_queue(queue_path), False
        except SteadQError as e:
            if e.kind is not ErrorKind.NOT_FOUND:  # no bucket yet, or no queue in it: create one
                raise
        return init_queue(queue_path, shards=SHARDS, delayed_width_ns=_DELAYED_WIDTH_NS,
                          terminal_width_ns=_TERMINAL_WIDTH_NS), True  # fmt: skip
    if os.path.exists(os.path.join(queue_path, "FORMAT")):
        return open_queue(queue_path), False
    q = init_queue(
        queue_path,
        shards=SHARDS,
        delayed_width_ns=_DELAYED_WIDTH_NS,
        terminal_width_ns=_TERMINAL_WIDTH_NS,
        shared=False,
    )
    return q, True


def write_config(etc: str, queue_path: str, concurrency: int, lease: str = "30s") -> str:
    """The demo's ``demo.yaml``: the same schema as /etc/steadq/queues/*.yaml."""
    os.makedirs(etc, exist_ok=True)
    path = os.path.join(etc, f"{QUEUE_NAME}.yaml")
    text = f"""\
# Written by `steadqd demo` (rewritten on every run). The same schema as
# /etc/steadq/queues/<name>.yaml: see docs/configuration.md.
queue: {json.dumps(queue_path)}

worker:
  command: {json.dumps([sys.executable, "-m", "steadqd.demo.job"])}
  concurrency: {concurrency}
  lease: {lease}
  timeout: 20s
  input: stdin
  pass_environment: [PATH, LANG, LC_ALL, TZ, PYTHONPATH]
  exit_status:
    ack: [0]        # done
    retry: [75]     # EX_TEMPFAIL: flaky jobs on their first attempt
    bury: [100]     # poison jobs
    other: retry
    bury_reason: {BURY_REASON}
  retry:
    backoff_base: 200ms
    backoff_max: 2s
    jitter: true

sweeper:
  interval: 30s

promoter:
  max_sleep: 5s
"""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path
