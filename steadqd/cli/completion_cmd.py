"""``steadq completion bash|zsh|fish``: a shell completion script, generated from the parser itself.

Generated rather than written by hand so that a new command or flag is
completed the moment it exists; ``main`` hands the command the parser it
parsed with (``args.parser``). The generator (``steadqd.completion``) is
shared with ``steadqd completion``.
"""

from __future__ import annotations

import argparse
import sys

from steadqd.cli.common import Subcommands, add_command
from steadqd.cli.view_cmd import LISTABLE_STATES
from steadqd.completion import SHELLS, build_tree, script


def add_completion(sub: Subcommands) -> None:
    s = add_command(sub, "completion", "print a shell completion script", "source <(steadq completion bash)")
    s.add_argument("shell", choices=SHELLS, help=f"the shell to complete in: {', '.join(SHELLS)}")
    s.set_defaults(run=cmd_completion)


def completion_script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The script for ``shell``: commands, options, ``ls`` states, and queues from the config files."""
    states = "words:" + " ".join((*LISTABLE_STATES, "all"))
    tree = build_tree(parser, "steadq", anywhere=("--json",), metavar_kinds={"STATE": states})
    return script(shell, tree)


def cmd_completion(a: argparse.Namespace) -> int:
    sys.stdout.write(completion_script(a.shell, a.parser))
    sys.stdout.flush()
    return 0


COMMANDS = {"completion": add_completion}
