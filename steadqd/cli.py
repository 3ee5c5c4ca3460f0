"""Command-line entry points.

``steadqd`` is the daemon-side command. Today it has one subcommand, ``demo``;
the worker, sweeper, promoter and ``run`` roles arrive with the daemon
suite. The producer/operator command ``steadq`` arrives with the CLI issue.
"""

from __future__ import annotations

import sys


def daemon_main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: steadqd demo [--path DIR] [--jobs N] [--workers N]\n\n"
              "  demo   create a queue under ./var/, enqueue a few hundred jobs and process them")
        return 0 if args else 2
    if args[0] == "demo":
        from .demo import main

        return main(args[1:])
    print(f"steadqd: unknown command {args[0]!r} (try: steadqd --help)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(daemon_main())
