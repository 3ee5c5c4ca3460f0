"""``steadq init``: create a queue."""

from __future__ import annotations

import argparse
import os

from steadqd.backend import init_queue
from steadqd.cli.common import (
    CliError,
    Subcommands,
    add_queue_command,
    err,
    failure,
    int_in,
    out,
)
from steadqd.constants import DEFAULT_SHARDS, DEFAULT_TERMINAL_WIDTH_NS, MAX_SHARDS, U64_MAX


def add_init(sub: Subcommands) -> None:
    s = add_queue_command(
        sub,
        "init",
        "create a queue",
        "Q_ID=$(steadq init /srv/q --shards 64)",
        run=cmd_init,
        existing=False,
        queue_help="the queue directory to create (its parent must exist), or a configured queue's name",
    )
    s.add_argument(
        "--shards",
        type=int_in(1, MAX_SHARDS, "shard count"),
        default=DEFAULT_SHARDS,
        help=f"ready/leased shard directories, 1..{MAX_SHARDS}; more shards, less contention between consumers",
    )
    s.add_argument(
        "--terminal-bucket-width-ns",
        type=int_in(0, U64_MAX, "width"),
        default=DEFAULT_TERMINAL_WIDTH_NS,
        metavar="NS",
        help="time span of one receipts/dead bucket directory, in nanoseconds",
    )
    s.add_argument(
        "--shared",
        action="store_true",
        help="setgid 2770 root: every user in the directory's group may produce and consume",
    )
    s.add_argument(
        "--parents",
        action="store_true",
        help="also create missing parent directories (like mkdir -p; no effect on s3://)",
    )


def cmd_init(a: argparse.Namespace) -> int:
    parent = os.path.dirname(os.path.abspath(a.path))
    # A URL (s3://BUCKET/PREFIX) has no parent directory to check.
    if not a.parents and "://" not in a.path and not os.path.isdir(parent):
        # The reference creates every missing parent; a typo in the path then
        # silently builds a tree somewhere unexpected, so we ask first.
        raise CliError(f"init failed: parent directory {parent} does not exist (create it, or give --parents)", 6)
    try:
        q = init_queue(a.path, shards=a.shards, terminal_width_ns=a.terminal_bucket_width_ns, shared=a.shared)
        queue_id = q.queue_id
        q.close()
    except Exception as e:  # noqa: BLE001
        raise failure("init failed", e) from e
    err(f"initialized queue at {a.path}", f"queue_id: {queue_id}", f"shards: {a.shards}")
    if a.shared:
        err("shared: group members may produce and consume (mode 2770)")
    out(queue_id)
    return 0


COMMANDS = {"init": add_init}
