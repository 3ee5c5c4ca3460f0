"""``steadq init``: create a queue."""

from __future__ import annotations

import argparse

from steadqd.backend import init_queue
from steadqd.cli.common import CliError, Subcommands, add_command, err, error_code, error_text, int_in
from steadqd.constants import DEFAULT_SHARDS, DEFAULT_TERMINAL_WIDTH_NS, MAX_SHARDS, U64_MAX


def add_init(sub: Subcommands) -> None:
    s = add_command(sub, "init", "create a queue", "steadq init /srv/q --shards 64")
    s.add_argument("path", metavar="PATH")
    s.add_argument("--shards", type=int_in(1, MAX_SHARDS, "shard count"), default=DEFAULT_SHARDS)
    s.add_argument("--terminal-bucket-width-ns", type=int_in(0, U64_MAX, "width"), default=DEFAULT_TERMINAL_WIDTH_NS)
    s.add_argument(
        "--shared",
        action="store_true",
        help="setgid 2770 root: every user in the directory's group may produce and consume",
    )
    s.set_defaults(run=cmd_init)


def cmd_init(a: argparse.Namespace) -> int:
    try:
        q = init_queue(a.path, shards=a.shards, terminal_width_ns=a.terminal_bucket_width_ns, shared=a.shared)
        queue_id = q.queue_id
        q.close()
    except Exception as e:  # noqa: BLE001
        raise CliError(f"init failed: {error_text(e)}", error_code(e)) from e
    err(f"initialized queue at {a.path}", f"queue_id: {queue_id}", f"shards: {a.shards}")
    if a.shared:
        err("shared: group members may produce and consume (mode 2770)")
    return 0


COMMANDS = {"init": add_init}
