"""``steadqd``: the daemon-side command.

    steadqd [--config-dir DIR] worker QUEUE      the inotify-driven worker spawner
    steadqd [--config-dir DIR] sweeper QUEUE     periodic recovery passes
    steadqd [--config-dir DIR] promoter QUEUE    delayed -> ready when due
    steadqd [--config-dir DIR] run QUEUE         all three in one foreground process
    steadqd [--config-dir DIR] inbox QUEUE       the watch folder (`inbox:`) alone
    steadqd [--config-dir DIR] check-config [QUEUE ...]
    steadqd demo [--s3] [--path DIR] [--jobs N] [--concurrency N]

Each role reads ``<config dir>/<QUEUE>.yaml`` (default /etc/steadq/queues,
or $STEADQ_CONFIG_DIR). Exit statuses: 0 clean stop, 78 configuration error
(systemd does not restart on it), other codes as in the spec's error table.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from steadqd.completion import SHELLS, build_tree, script
from steadqd.daemon.config import QueueSettings, config_dir, load_config
from steadqd.errors import ConfigError, SteadQError
from steadqd.version import VersionAction

if TYPE_CHECKING:
    from steadqd.daemon.journal import Log

ROLES = ("worker", "sweeper", "promoter")
# The watch folder runs wherever its queue's jobs do (worker, run) when the file
# has an `inbox:` section, so the worker unit serves it; `steadqd inbox` alone.
COMMAND_ROLES = {"worker": ("worker", "inbox"), "run": (*ROLES, "inbox")}


def _role_factory(names: tuple[str, ...]) -> Callable[..., list]:
    def make(settings: QueueSettings, log: Log) -> list:
        from importlib import import_module

        # Only the roles asked for are imported: one role's module (and its
        # dependencies) must not be able to keep another role from starting.
        classes = {
            "worker": ("worker.role", "WorkerRole"),
            "sweeper": ("sweeper", "SweeperRole"),
            "promoter": ("promoter", "PromoterRole"),
            "inbox": ("inbox.watch", "InboxRole"),
        }
        roles = []
        for n in names:
            if n == "inbox" and settings.inbox is None and names == ("inbox",):
                raise ConfigError("no `inbox:` section: nothing to run", path=settings.source)
            # Beside the worker the watch role is made even without `inbox:`: a reload may add one.
            if n == "worker" and settings.worker is None:
                if settings.inbox is not None and "inbox" in names:
                    continue  # a producer-only queue: its jobs run elsewhere
                raise ConfigError("no `worker:` section: nothing to run", path=settings.source)
            if n == "promoter" and not settings.promoter.enabled:
                continue
            if n == "promoter" and settings.bucket:
                log.notice(
                    "promoter not needed on a bucket queue: a delayed or retried job becomes claimable by store "
                    "time at its claim, with nothing to move",
                    path=settings.queue,
                )
                continue
            module, cls = classes[n]
            roles.append(getattr(import_module(f"steadqd.daemon.{module}"), cls)(settings, log))
        if [r.name for r in roles] == ["inbox"]:
            roles[0].alone = True  # nothing else to run: a folder that cannot be watched fails the start
        return roles

    return make


def _serve(queue: str, directory: str | None, roles: tuple[str, ...], role_name: str) -> int:
    from steadqd.daemon.journal import Log
    from steadqd.daemon.service import Service

    log = Log(role_name, queue)
    service = Service(lambda: load_config(queue, directory), _role_factory(roles), log)
    return service.run()


def check_config(names: list[str], directory: str | None, *, open_queues: bool, user: str | None = None) -> int:
    """Validate configs without starting anything; prints one line per file (and per problem).

    With ``open_queues`` every check a start makes runs as the service's user
    (``user``, or the units' ``steadq`` when run as root), so what passes here
    also passes under systemd."""
    d = config_dir(directory)
    if not names:
        try:
            names = sorted(f[:-5] for f in os.listdir(d) if f.endswith(".yaml"))
        except OSError as e:
            print(f"steadqd: cannot list {d}: {e.strerror}", file=sys.stderr)
            return 1
        if not names:
            print(f"steadqd: no *.yaml files in {d}", file=sys.stderr)
            return 1
    failed = 0
    account = None
    if open_queues:
        from steadqd.daemon import preflight

        try:
            account = preflight.service_account(user)
        except KeyError:
            print(f"steadqd: check-config: no user {user!r} on this machine (give --user USER)", file=sys.stderr)
            return 78
    for name in names:
        try:
            settings = load_config(name, directory)
        except (ConfigError, SteadQError) as e:
            print(f"{name}: {e}", file=sys.stderr)
            failed += 1
            continue
        if account is not None:
            problems = preflight.as_account(account, functools.partial(preflight.start_problems, settings))
            for p in problems:
                print(f"{name}: {p.text}", file=sys.stderr)
            for warning in preflight.unit_path_warnings(settings):  # systemd's view: warnings, not failures
                print(f"{name}: warning: {warning}", file=sys.stderr)
            if problems:
                print(f"{name}: checked as user {account.name}", file=sys.stderr)
                failed += 1
                continue
            print(f"{name}: ok ({settings.queue}; checked as user {account.name})")
            continue
        print(f"{name}: ok ({settings.queue})")
        _warn_command(name, settings)
    return 78 if failed else 0


def _warn_command(name: str, settings: QueueSettings) -> None:
    """Without --open, still say when the command cannot be found or run (issue 33 #9): as a
    warning, checked as whoever runs check-config, since the service's user is not asked."""
    if settings.worker is None:
        return
    from steadqd.daemon import preflight

    me = preflight.Account.current()
    for p in preflight.command_problems(settings.worker, me, settings.source, os.environ):
        print(
            f"{name}: warning: {p.text} (checked as user {me.name}; --open checks as the service's user)",
            file=sys.stderr,
        )


def _spawn_path() -> str:
    from steadqd.daemon.worker.run import fastspawn  # loads the compiled module: only when asked

    return fastspawn.path()


def _claim_path() -> str:
    from steadqd.backend import claim_path  # loads the C claim core: only when asked

    return claim_path()


def daemon_main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["demo"]:
        # Imported here: a daemon start loads none of the demo (nor its SeaweedFS launcher).
        from steadqd.demo.run import main as demo_main

        return demo_main(args[1:])
    ap = argparse.ArgumentParser(prog="steadqd", description="SteadQ/1 queue daemons.", allow_abbrev=False)
    ap.add_argument(
        "--version",
        action=VersionAction,
        spawn_path=_spawn_path,
        claim_path=_claim_path,
        help="print the version, the job spawn and the claim path",
    )
    config_help = "directory of <queue>.yaml files (default $STEADQ_CONFIG_DIR or /etc/steadq/queues)"
    ap.add_argument("--config-dir", help=config_help)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND", help="a role to run, or a tool")
    for name, helptext in (
        ("worker", "run jobs of QUEUE with the configured command"),
        ("sweeper", "periodic recovery of QUEUE"),
        ("promoter", "promote delayed jobs of QUEUE when due"),
        ("run", "worker, sweeper and promoter in one foreground process"),
        ("inbox", "enqueue the files of QUEUE's watch folder (its `inbox:` section)"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("queue", metavar="QUEUE", help="the queue's name: its <config dir>/QUEUE.yaml")
    p = sub.add_parser("check-config", help="validate configuration files without starting anything")
    p.add_argument("queues", nargs="*", metavar="QUEUE", help="the queues to check (default: every *.yaml file)")
    p.add_argument(
        "--open",
        action="store_true",
        help="also open each queue and check the command, TMPDIR and permissions as the service's user",
    )
    p.add_argument("--user", help="the service's user for --open (default: steadq when run as root, else yourself)")
    p = sub.add_parser("completion", help="print a shell completion script: source <(steadqd completion bash)")
    p.add_argument("shell", choices=SHELLS, help=f"the shell to complete in: {', '.join(SHELLS)}")
    for p in sub.choices.values():  # a global option, accepted after the subcommand too
        p.add_argument("--config-dir", default=argparse.SUPPRESS, help=config_help)
    sub.add_parser("demo", help="demo queue under ./var/ (see steadqd demo --help)")
    ns = ap.parse_args(args)
    if ns.command == "completion":
        sys.stdout.write(script(ns.shell, build_tree(ap, "steadqd", queue_is_name=True, anywhere=("--config-dir",))))
        return 0
    from steadqd.daemon.process import keep_secrets

    keep_secrets()  # before any configuration or credential is loaded (steadqd.daemon.process)
    if ns.command == "check-config":
        return check_config(ns.queues, ns.config_dir, open_queues=ns.open, user=ns.user)
    roles = COMMAND_ROLES.get(ns.command, (ns.command,))
    return _serve(ns.queue, ns.config_dir, roles, ns.command)


if __name__ == "__main__":
    sys.exit(daemon_main())
